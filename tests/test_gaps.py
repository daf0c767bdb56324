"""Order statistics (sim/gaps.py): nearest-rank percentiles and the token-gap multiset against
the expanded gaps."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import LAB, V2, run, scenario

from pytest_prefill.sim import (
    GapMultiset,
    Request,
    nearest_rank,
    percentile,
    simulate,
    token_gaps,
    weighted_percentile,
)

pytestmark = pytest.mark.sim


@st.composite
def multisets(draw: st.DrawFn):
    points = draw(st.dictionaries(st.integers(1, 10**6), st.integers(1, 5), max_size=40))
    runs = draw(
        st.lists(
            st.tuples(
                st.integers(1, 10**6), st.integers(0, 5000), st.integers(1, 300), st.integers(1, 4)
            ),
            max_size=20,
        )
    )
    return points, runs


@given(
    values=st.lists(st.floats(0, 1e3), min_size=1, max_size=200),
    p=st.sampled_from([1, 50, 99, 100]),
)
def test_percentiles_are_nearest_rank(values, p):
    ordered = sorted(values)
    assert percentile(values, p) == ordered[math.ceil(p / 100 * len(values)) - 1]
    assert weighted_percentile([(v, 2) for v in values], p) == percentile(values + values, p)


@settings(max_examples=150, deadline=None)
@given(data=multisets(), p=st.sampled_from([1, 10, 50, 90, 99, 99.9, 100]))
def test_gap_order_statistics_and_moments_equal_the_expanded_multiset(data, p):
    points, runs = data
    values = [v for v, c in points.items() for _ in range(c)]
    values += [a + j * g for a, g, k, w in runs for j in range(k) for _ in range(w)]
    gaps = GapMultiset(points, runs)
    assert len(gaps) == len(values)
    if not values:
        assert math.isnan(gaps.percentile(50)) and math.isnan(gaps.max())
        return
    values.sort()
    seconds = [v / 2**64 for v in values]
    rank = max(1, math.ceil(p / 100 * len(values)))
    assert gaps.percentile(p) == seconds[rank - 1]
    assert gaps.max() == seconds[-1]
    position = (len(values) - 1) * p / 100
    lo = math.floor(position)
    hi = min(lo + 1, len(values) - 1)
    linear = seconds[lo] + (seconds[hi] - seconds[lo]) * (position - lo)
    assert gaps.linear_percentile(p) == pytest.approx(linear, rel=1e-12)
    mean = sum(values) / len(values)
    assert gaps.mean() == pytest.approx(mean / 2**64, rel=1e-12)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    assert gaps.std() == pytest.approx(std / 2**64, rel=1e-9, abs=1e-30)
    assert gaps.items() == [(v / 2**64, values.count(v)) for v in sorted(set(values))]


def test_a_traces_gap_multiset_is_its_token_times_gaps():
    load = [Request(f"r{i}", 0.01 * i, 50 * i + 10, 30 + i) for i in range(10)]
    trace = simulate("chunked", load, V2, chunk=64)
    direct = sorted(
        b - a for r in trace.requests.values() for a, b in zip(r.token_times, r.token_times[1:])
    )
    gaps = trace.token_gaps()
    assert len(gaps) == len(direct)
    assert gaps.max() == pytest.approx(direct[-1], rel=1e-12)
    for p in (50, 90, 99):
        rank = max(1, math.ceil(p / 100 * len(direct)))
        assert gaps.percentile(p) == pytest.approx(direct[rank - 1], rel=1e-9)


def test_summary_max_stall_is_the_longest_gap_between_a_requests_tokens():
    trace = run("shared", scenario(LAB), LAB)
    gaps = [g for g, _ in token_gaps(trace.requests.values())]
    assert trace.summary().max_stall == pytest.approx(max(gaps), rel=1e-12)


@given(count=st.integers(0, 10**6), p=st.integers(1, 100))
def test_the_nearest_rank_is_the_least_rank_covering_p_percent(count, p):
    rank = nearest_rank(p, count)
    assert rank >= 1
    if count:  # the least r with r / count >= p / 100, in integers
        assert rank * 100 >= p * count and (rank - 1) * 100 < p * count


@pytest.mark.parametrize("p", [0, -1, 100.5, math.nan])
def test_a_percentile_outside_0_to_100_is_refused(p):
    with pytest.raises(ValueError, match="percentile p"):
        nearest_rank(p, 10)
    with pytest.raises(ValueError, match="percentile p"):
        percentile([1.0, 2.0], p)
