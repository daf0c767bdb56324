"""The measured knee's estimate and interval (``verify.knee_interval``): the non-increasing fit,
the crossing by log-linear interpolation, the overdispersed parametric bootstrap, the verdict
against the goal, and the probe rule's second length (a probe long enough for an overload to show)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_prefill.plan.metrics import SLO
from pytest_prefill.sim import Request
from pytest_prefill.verify.knee_interval import (
    KneeEstimate,
    agreement,
    crossing,
    deciding_scale,
    estimate_knee,
    non_increasing,
)
from pytest_prefill.verify.probe_rule import ProbeRule, probe_load

fractions = st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8)


@given(fractions, st.data())
def test_the_fit_is_non_increasing_and_keeps_the_weighted_sum(values, data):
    weights = data.draw(st.lists(st.integers(1, 50), min_size=len(values), max_size=len(values)))
    fitted = non_increasing(values, weights)
    assert len(fitted) == len(values)
    assert all(a >= b - 1e-12 for a, b in zip(fitted, fitted[1:]))
    total = sum(v * w for v, w in zip(values, weights))
    assert sum(f * w for f, w in zip(fitted, weights)) == pytest.approx(total)
    ordered = sorted(values, reverse=True)
    assert non_increasing(ordered, weights) == pytest.approx(ordered)  # nothing to pool


def test_the_crossing_interpolates_in_log_rate_and_is_open_beyond_the_probes():
    # 1.0 at 10 req/s, 0.5 at 20: 0.9 is a fifth of the way down, in log rate
    assert crossing([10, 20], [1.0, 0.5], [1, 1], 0.9) == pytest.approx(10 * 2**0.2)
    assert crossing([10, 20], [1.0, 0.95], [1, 1], 0.9) == math.inf  # never missed
    assert crossing([10, 20], [0.8, 0.5], [1, 1], 0.9) == 0.0  # never met
    # a miss below a pass is pooled: (0.7 + 0.95) / 2 < 0.9, so the knee is below 20
    pooled = crossing([10, 20, 30], [1.0, 0.7, 0.95], [1, 1, 1], 0.9)
    assert 10 < pooled < 20


def test_clean_probes_give_a_knee_between_them_at_the_interpolated_point():
    n = 40
    probes = [(10.0, [True] * n), (20.0, [False] * n)]
    knee = estimate_knee(probes, 0.9, resamples=200)
    assert knee.rate == pytest.approx(10 * 2 ** ((1.0 - 0.9) / (1.0 - 0.0)))
    assert (knee.low, knee.high) == (10.0, 20.0)  # between two probes: where, they cannot say
    assert knee.dispersion == 1.0  # nothing pooled: no degree of freedom to see more


def _spread(n: int, rates_misses: list[tuple[float, float]]) -> list[tuple[float, list[bool]]]:
    out = []
    for rate, missed in rates_misses:
        every = round(1 / missed) if missed else 0
        out.append((rate, [not (every and i % every == 0) for i in range(n)]))
    return out


def test_noisy_probes_give_an_interval_round_the_knee_that_narrows_with_more_requests():
    curve = [(10.0, 0.0), (12.0, 0.05), (14.0, 0.15), (16.0, 0.5)]
    short, long = estimate_knee(_spread(40, curve), 0.9), estimate_knee(_spread(400, curve), 0.9)
    for knee in (short, long):
        assert knee.low <= knee.rate <= knee.high
        assert 12 <= knee.rate <= 14
    assert (long.low, long.high) == (12.0, 14.0)  # 0.95 and 0.85 at 400 requests: clear
    assert short.high / short.low > long.high / long.low  # at 40 they may swap sides


def test_probes_that_disagree_beyond_binomial_noise_widen_the_interval():
    calm = [(10.0, 0.0), (12.0, 0.05), (14.0, 0.25), (16.0, 0.25)]
    torn = [(10.0, 0.0), (12.0, 0.05), (14.0, 0.5), (16.0, 0.1)]  # 14 misses more than 16
    a, b = estimate_knee(_spread(100, calm), 0.9), estimate_knee(_spread(100, torn), 0.9)
    assert a.dispersion == 1.0 < b.dispersion  # (0.5 and 0.9 pooled: far apart for n = 100)
    assert b.high / b.low > a.high / a.low


def test_a_probe_with_no_request_or_rate_is_refused():
    with pytest.raises(ValueError, match="sent requests"):
        estimate_knee([(1.0, [True] * 4), (2.0, [])], 0.9)
    with pytest.raises(ValueError, match="positive"):
        estimate_knee([(0.0, [True] * 4)], 0.9)
    with pytest.raises(ValueError, match="at least one"):
        estimate_knee([], 0.9)


@pytest.mark.parametrize(
    "low,high,verdict",
    [
        (19.0, 21.0, "HOLDS"),  # ratio in [0.95, 1.05]
        (15.0, 17.0, "FAILS"),  # ratio in [1.18, 1.33]
        (17.0, 21.0, "UNDECIDED"),  # ratio in [0.95, 1.18]
        (19.0, math.inf, "UNDECIDED"),  # never missed: the ratio may be anything below 1.05
        (0.0, 10.0, "FAILS"),  # never met below 10: the prediction is at least twice it
    ],
)
def test_the_prediction_is_judged_against_the_measured_knees_interval(low, high, verdict):
    knee = KneeEstimate(20.0 if high > 10 else 5.0, low, high)
    judged = agreement(20.0, knee, within=0.10)
    assert judged.verdict == verdict
    assert judged.low <= judged.high
    if math.isfinite(high):
        assert judged.low == pytest.approx(20.0 / high)


def _even(n: int, attainment: float) -> list[bool]:
    """n outcomes, round(attainment x n) met, the misses spread evenly."""
    misses = n - round(attainment * n)
    return [not (misses and (i * misses) // n != ((i + 1) * misses) // n) for i in range(n)]


def _probes(n: int, points: list[tuple[float, float]]) -> list[tuple[float, list[bool]]]:
    return [(rate, _even(n, attainment)) for rate, attainment in points]


# (probes' rates and attainments, requests each, the predicted knee): each UNDECIDED
OPEN_ABOVE = ([(5.72, 0.82), (4.77, 0.98), (5.22, 0.93), (5.47, 0.98)], 250, 5.72)  # run V
RISING = ([(3.41, 0.98), (3.57, 0.61), (3.73, 0.31), (4.09, 0.77)], 150, 3.41)  # run T
PAST_ABOVE = ([(10.0, 1.0), (13.0, 0.2)], 100, 9.5)
PAST_BELOW = ([(9.0, 1.0), (12.0, 0.1)], 100, 11.5)
PAST_BOUND = ([(3.48, 0.59), (2.9, 0.98), (3.18, 0.7), (3.04, 0.95)], 150, 3.48)  # run X
NEAR_BOUND = ([(10.0, 1.0), (10.5, 0.88), (13.0, 0.2)], 100, 9.5)  # 10.5: 0.5% under 9.5 / 0.9


@pytest.mark.parametrize(
    "case,where",
    [
        (OPEN_ABOVE, 5.72 * 1.05),  # a step past the highest probe: the interval is open
        (RISING, 4.09),  # the higher of the pair that rose (equal requests): again
        (PAST_ABOVE, 9.5 / 0.9),  # no probe near the bound the interval reaches past
        (PAST_BELOW, 11.5 / 1.1),
        (NEAR_BOUND, 9.5 / 0.9),  # a probe half a percent off the bound does not decide it
        (PAST_BOUND, 3.48 / 1.1),  # not a step under 3.18, missed: a pass there decides nothing
    ],
)
def test_one_more_probe_goes_where_it_decides_an_undecided_verdict(case, where):
    points, n, judged = case
    probes = _probes(n, points)
    assert agreement(judged, estimate_knee(probes, 0.9)).verdict == "UNDECIDED"
    assert deciding_scale(probes, 0.9, judged, step=1.05) == pytest.approx(where)


def test_the_deciding_probe_stops_once_decided_and_steps_past_a_bound_probe_that_points_on():
    points, n, judged = OPEN_ABOVE
    closed = _probes(n, [*points, (5.72 * 1.05, 0.3)])
    assert agreement(judged, estimate_knee(closed, 0.9)).verdict == "HOLDS"
    assert deciding_scale(closed, 0.9, judged) is None
    assert deciding_scale(_probes(n, points), 0.9, judged, highest=5.72) is None  # a burst
    for points, n, judged in (PAST_ABOVE, PAST_BELOW):
        bound = deciding_scale(_probes(n, points), 0.9, judged, step=1.05)
        assert bound is not None
        near, far = (0.5, 1.0) if bound > judged else (1.0, 0.5)  # the bound's near side first
        held = _probes(n, [*points, (bound, near)])
        assert agreement(judged, estimate_knee(held, 0.9)).verdict == "HOLDS"
        past = _probes(n, [*points, (bound, far)])  # the other side: only a step past decides
        beyond = bound * 1.05**0.5 if bound > judged else bound / 1.05**0.5
        assert deciding_scale(past, 0.9, judged, step=1.05) == pytest.approx(beyond)
        fails = _probes(n, [*points, (bound, far), (beyond, far)])
        assert agreement(judged, estimate_knee(fails, 0.9)).verdict == "FAILS"
        assert deciding_scale(fails, 0.9, judged) is None
    rose = [(1.0, 1.0), (1.05, 0.99), (1.1, 0.86), (1.16, 0.9), (1.3, 0.2)]  # 1.16 met more
    assert deciding_scale(_probes(200, rose), 0.9, 1.0) == 1.16  # equal requests: the higher
    again = _probes(200, [*rose, (1.16, 0.9)])  # now the higher has twice the requests
    assert agreement(1.0, estimate_knee(again, 0.9)).verdict == "UNDECIDED"
    assert deciding_scale(again, 0.9, 1.0) == 1.1


def test_a_deciding_probe_is_refused_a_bad_prediction_or_step():
    probes = _probes(100, PAST_ABOVE[0])
    for bad in (0.0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="judged"):
            deciding_scale(probes, 0.9, bad)
    with pytest.raises(ValueError, match="step"):
        deciding_scale(probes, 0.9, 9.5, step=1.0)


def test_a_probe_is_long_enough_for_an_overload_to_build_a_queue_of_one_ttft_bound():
    rule = ProbeRule(margin=0.05, tolerance=0.1)
    slo = SLO(ttft=1.0, tpot=0.1)
    assert rule.requests_at(20.0, slo) == math.ceil(20.0 * 1.0 / 0.1) > rule.requests
    assert rule.requests_at(1.0, slo) == rule.requests  # slow: the binomial rule is longer
    assert rule.requests_at(20.0, SLO(tpot=0.1)) == rule.requests  # no queue bound to build
    assert rule.requests_at(20.0, SLO(e2el=2.0)) == math.ceil(20.0 * 2.0 / 0.1)
    off = ProbeRule(margin=0.05, tolerance=0.1, sustained=False)
    assert off.requests_at(20.0, slo) == off.requests
    assert "TTFT / 0.1" in rule.sentence() and "TTFT /" not in off.sentence()


def test_probes_take_the_rules_count_or_the_whole_workload_when_it_is_shorter():
    rule = ProbeRule(margin=0.1)
    load = [Request(f"r{i}", i * 0.1, 64, 8) for i in range(50)]
    assert len(probe_load(load, rule, 30)) == 30
    assert len(probe_load(load, rule, 500)) == 50
    assert len(probe_load(load, rule, 1)) == rule.requests  # never under rule 1
