"""Cost model v2 and the simulator's new semantics (DESIGN.md, "Simulation semantics"): the pair
term and fused-pass overlap, C* by context, KV capacity, replicas, chunk budgets, exact time and
the gap multiset. Expected values come from the formulas, never from an earlier run."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_prefill.invariants import check_invariants, iteration_cost
from pytest_prefill.scheduler import (
    PRESETS,
    CostModel,
    GapMultiset,
    Request,
    simulate,
)

pytestmark = pytest.mark.sim

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
V2 = CostModel(
    prefill_pass_overhead=2e-3,
    prefill_per_token=2e-5,
    decode_step_base=1e-2,
    decode_per_seq=1e-4,
    decode_per_kv_token=2e-8,
    prefill_per_pair=1e-9,
    fusion_penalty=0.25,
)
terms = st.floats(0, 0.05, allow_nan=False)
small = st.floats(0, 1e-8, allow_nan=False)


@st.composite
def v2_models(draw: st.DrawFn) -> CostModel:
    return CostModel(
        prefill_pass_overhead=draw(terms),
        prefill_per_token=draw(st.floats(1e-7, 1e-4)),
        decode_step_base=draw(st.floats(1e-4, 0.05)),
        decode_per_seq=draw(st.floats(0, 1e-3)),
        decode_per_kv_token=draw(small),
        prefill_per_pair=draw(small),
        fusion_penalty=draw(st.floats(0, 1)),
    )


# --- the cost model ---------------------------------------------------------------------------


@SETTINGS
@given(
    cost=v2_models(),
    pieces=st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 50000)), min_size=1, max_size=4),
    rows=st.integers(0, 64),
    kv=st.integers(0, 10**6),
)
def test_an_iteration_costs_what_design_says(cost, pieces, rows, kv):
    prefill = (
        cost.prefill_pass_overhead
        + cost.prefill_per_token * sum(t for t, _ in pieces)
        + cost.prefill_per_pair * sum(t * c + t * (t + 1) / 2 for t, c in pieces)
        + cost.decode_per_kv_token * sum(c for _, c in pieces)
    )
    assert cost.prefill_pieces(pieces) == pytest.approx(prefill, rel=1e-12)
    if rows == 0:
        assert cost.iteration(pieces) == pytest.approx(prefill, rel=1e-12)
        return
    decode = (
        cost.decode_step_base + cost.decode_per_seq * (rows - 1) + cost.decode_per_kv_token * kv
    )
    compute = prefill + cost.prefill_per_token * rows
    assert cost.compute_part(pieces, rows) == pytest.approx(compute, rel=1e-12)
    fused = max(decode, compute) + cost.fusion_penalty * min(decode, compute)
    assert cost.iteration(pieces, rows, kv) == pytest.approx(fused, rel=1e-12)
    assert cost.iteration((), rows, kv) == pytest.approx(decode, rel=1e-12)


@SETTINGS
@given(
    cost=st.builds(CostModel, terms, st.floats(1e-7, 1e-4), st.floats(1e-4, 0.05)),
    t=st.integers(1, 5000),
    c=st.integers(0, 5000),
    n=st.integers(1, 64),
    k=st.integers(0, 10**5),
)
def test_with_the_new_terms_at_zero_the_fused_rule_is_the_labs(cost, t, c, n, k):
    lab_rule = max(cost.decode_step(n, k), cost.prefill_pass(t + n, c))
    assert cost.fused_iteration(t, n, k, c) == pytest.approx(lab_rule, rel=1e-12)


def test_the_pair_term_makes_a_chunk_dearer_the_later_it_comes():
    early, late = V2.prefill_pass(512, 0), V2.prefill_pass(512, 8192)
    assert late - early == pytest.approx(
        V2.prefill_per_pair * 512 * 8192 + V2.decode_per_kv_token * 8192
    )
    whole = V2.prefill_pass(1024)
    halves = V2.prefill_pass(512) + V2.prefill_pass(512, 512)
    # two halves pay a second overhead but the same attention pairs in all
    assert halves - whole == pytest.approx(V2.prefill_pass_overhead + V2.decode_per_kv_token * 512)


def test_chunk_star_without_arguments_is_the_labs_formula_exactly():
    for preset in PRESETS.values():
        c = preset.cost
        assert (
            c.chunk_star() == (c.decode_step_base - c.prefill_pass_overhead) / c.prefill_per_token
        )
    assert round(PRESETS["lab-laptop"].cost.chunk_star()) == 121


@SETTINGS
@given(
    cost=v2_models(),
    context=st.integers(0, 50000),
    rows=st.integers(0, 32),
    kv=st.integers(0, 10**5),
)
def test_chunk_star_is_the_largest_chunk_whose_compute_part_fits_the_decode_step(
    cost, context, rows, kv
):
    star = cost.chunk_star(context, rows, kv)
    decode = cost.decode_step(max(rows, 1), kv)
    if not math.isfinite(star) or star < 1 or star > 1e7:
        return
    fits = cost.compute_part([(math.floor(star), context)], rows)
    over = cost.compute_part([(math.floor(star) + 1, context)], rows)
    assert fits <= decode * (1 + 1e-9)
    assert over >= decode * (1 - 1e-9)


@SETTINGS
@given(cost=v2_models(), context=st.integers(0, 40000))
def test_chunk_star_falls_as_the_prompt_proceeds_with_a_pair_term(cost, context):
    if cost.prefill_per_pair == 0 and cost.decode_per_kv_token == 0:
        return
    if cost.chunk_star(context + 1000) > 0:  # (below 0 it is a diagnosis, not a chunk)
        assert cost.chunk_star(context + 1000) <= cost.chunk_star(context)


def test_cost_model_v2_round_trips_and_old_json_loads_with_the_defaults():
    capped = dataclasses.replace(V2, kv_capacity_tokens=4096)
    for cost in (V2, capped):
        assert CostModel.from_dict(cost.to_dict()) == cost
    old = {
        k: v
        for k, v in V2.to_dict().items()
        if k not in ("prefill_per_pair", "fusion_penalty", "kv_capacity_tokens")
    }
    loaded = CostModel.from_dict(old)
    assert (loaded.prefill_per_pair, loaded.fusion_penalty) == (0.0, 0.0)
    assert math.isinf(loaded.kv_capacity_tokens)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("fusion_penalty", 1.5),
        ("fusion_penalty", -0.1),
        ("prefill_per_pair", -1e-9),
        ("prefill_per_pair", math.nan),
        ("kv_capacity_tokens", 0),
        ("kv_capacity_tokens", 10.5),
        ("kv_capacity_tokens", -5),
        ("kv_capacity_tokens", 10**400),
    ],
)
def test_bad_v2_terms_are_named(field, value):
    with pytest.raises(ValueError, match=field):
        CostModel.from_dict({**V2.to_dict(), field: value})


def test_a_transfer_time_per_token_that_overflows_is_named():
    with pytest.raises(ValueError, match="kv_bytes_per_token / link_bandwidth"):
        dataclasses.replace(V2, kv_bytes_per_token=1e300, link_bandwidth=1e-300)


# --- simulate's new arguments -----------------------------------------------------------------

LOAD = [Request("a", 0.0, 300, 20), Request("b", 0.0, 200, 40), Request("c", 0.01, 100, 10)]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"chunk": 64, "chunk_budget": 0.01}, "chunk_budget"),
        ({"chunk_budget": 0.0}, "chunk_budget"),
        ({"chunk_budget": -1.0}, "chunk_budget"),
        ({"chunk_budget": math.inf}, "chunk_budget"),
        ({"chunk": 64, "replicas": 0}, "replicas"),
        ({"chunk": 64, "replicas": 1.5}, "replicas"),
    ],
)
def test_bad_new_arguments_are_named(kwargs, field):
    with pytest.raises(ValueError, match=field):
        simulate("chunked", LOAD, V2, **kwargs)


def test_replicas_do_not_apply_to_disaggregation():
    with pytest.raises(ValueError, match="replicas"):
        simulate("disaggregated", LOAD, V2, replicas=2)


@pytest.mark.parametrize("policy", ["shared", "chunked", "disaggregated"])
def test_a_request_that_can_never_fit_the_kv_capacity_is_named(policy):
    small_device = dataclasses.replace(V2, kv_capacity_tokens=300)
    with pytest.raises(ValueError, match="'a'.*kv_capacity_tokens"):
        simulate(policy, LOAD, small_device, chunk=64)


def test_kv_capacity_admits_strictly_in_arrival_order():
    # a needs 320, b 240, c 110: with room for 450, a is admitted, b does not fit and c,
    # which would, waits behind it; when a finishes, both go.
    cost = dataclasses.replace(V2, kv_capacity_tokens=450, fusion_penalty=0.0)
    load = [Request("a", 0.0, 300, 20), Request("b", 0.0, 200, 40), Request("c", 0.0, 100, 10)]
    trace = simulate("shared", load, cost)
    a, b, c = (trace.requests[r] for r in "abc")
    assert a.prefill_start == 0.0
    assert b.prefill_start == c.prefill_start == a.finish
    assert check_invariants(trace, load, cost) == []
    roomier = dataclasses.replace(cost, kv_capacity_tokens=560)  # a and b fit, c (+110) not
    trace = simulate("shared", load, roomier)
    assert trace.requests["b"].prefill_start == 0.0
    assert trace.requests["c"].prefill_start == trace.requests["a"].finish


def test_one_token_short_of_room_waits():
    cost = dataclasses.replace(V2, kv_capacity_tokens=320 + 240 - 1)
    load = [Request("a", 0.0, 300, 20), Request("b", 0.0, 200, 40)]
    trace = simulate("shared", load, cost)
    assert trace.requests["b"].prefill_start == trace.requests["a"].finish


def test_a_decode_worker_without_room_makes_the_request_wait_for_one():
    cost = dataclasses.replace(V2, kv_capacity_tokens=400)
    load = [Request("a", 0.0, 300, 50), Request("b", 0.0, 300, 5)]
    trace = simulate("disaggregated", load, cost, prefill_workers=2, decode_workers=1)
    a, b = trace.requests["a"], trace.requests["b"]
    # one worker cannot hold both prompts' reservations (350 + 305 > 400): b goes to the second
    assert (a.prefill_resource, b.prefill_resource) == ("prefill0", "prefill1")
    assert b.first_token > a.finish  # b's KV waited for a to leave the decode worker
    assert check_invariants(trace, load, cost) == []


def test_replicas_route_to_the_fewest_unfinished_lowest_index_first():
    load = [Request(f"r{i}", 0.0, 100, 10 + i) for i in range(5)]
    trace = simulate("coscheduled", load, V2, replicas=3)
    where = {rid: rec.decode_resource for rid, rec in trace.requests.items()}
    assert where == {
        "r0": "worker0",
        "r1": "worker1",
        "r2": "worker2",
        "r3": "worker0",
        "r4": "worker1",
    }
    later = [*load, Request("late", 100.0, 100, 5)]  # everyone has finished: worker0 again
    assert simulate("coscheduled", later, V2, replicas=3).requests["late"].decode_resource == (
        "worker0"
    )


@SETTINGS
@given(n=st.integers(1, 6), prompt=st.integers(1, 2000), out=st.integers(1, 50))
def test_a_replica_each_serves_a_burst_as_one_worker_serves_one_request(n, prompt, out):
    burst = [Request(f"r{i}", 0.0, prompt, out) for i in range(n)]
    alone = simulate("chunked", burst[:1], V2, chunk=256).requests["r0"]
    trace = simulate("chunked", burst, V2, chunk=256, replicas=n)
    for rec in trace.requests.values():
        assert rec.token_times == alone.token_times


@SETTINGS
@given(budget=st.sampled_from([2e-3, 5e-3, 1.2e-2, 3e-2]), seed=st.integers(0, 100))
def test_a_chunk_budget_bounds_every_iteration_that_takes_more_than_one_token(budget, seed):
    rng = random.Random(seed)
    load = [
        Request(f"r{i}", rng.random(), rng.randint(1, 3000), rng.randint(1, 60)) for i in range(8)
    ]
    trace = simulate("chunked", load, V2, chunk_budget=budget)
    assert check_invariants(trace, load, V2) == []
    for e in trace.events:
        if e.kind in ("prefill", "fused") and e.prefill_tokens > 1:
            assert iteration_cost(e, V2) <= budget * (1 + 1e-12)


def test_a_chunk_budget_shrinks_chunks_as_the_context_grows():
    cost = dataclasses.replace(V2, prefill_per_pair=2e-8, decode_per_kv_token=0.0)
    load = [Request("live", 0.0, 64, 400), Request("long", 0.05, 20000, 4)]
    trace = simulate("chunked", load, cost, chunk_budget=0.03)
    chunks = [e.prefill_tokens for e in trace.events if e.prefill and e.prefill[0][0] == "long"]
    assert len(chunks) > 3
    assert chunks[1:-1] == sorted(chunks[1:-1], reverse=True)  # each later chunk no larger
    assert chunks[1] > chunks[-2]


# --- exact time -----------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["shared", "coscheduled", "chunked", "disaggregated"])
def test_the_same_load_a_billion_seconds_later_gives_the_same_summary(policy):
    rng = random.Random(7)
    # arrivals on a 1/1024 s grid stay exact floats when shifted by 1e9 s
    base = [
        Request(f"r{i}", rng.randint(0, 4096) / 1024, rng.randint(1, 900), rng.randint(1, 80))
        for i in range(40)
    ]
    shifted = [dataclasses.replace(r, arrival=r.arrival + 1e9) for r in base]
    cost = dataclasses.replace(
        PRESETS["datacenter-illustrative"].cost, decode_per_seq=5e-5, decode_per_kv_token=2e-8
    )
    a = simulate(policy, base, cost, chunk=256).summary()
    b = simulate(policy, shifted, cost, chunk=256).summary()
    assert a == b
    assert check_invariants(simulate(policy, shifted, cost, chunk=256), shifted, cost) == []


def test_a_thousand_requests_a_thousand_seconds_apart_keep_every_invariant():
    load = [Request(f"r{i}", 1000.0 * i, 500, 50) for i in range(1000)]
    cost = PRESETS["datacenter-illustrative"].cost
    for policy in ("shared", "chunked", "disaggregated"):
        trace = simulate(policy, load, cost, chunk=256)
        assert check_invariants(trace, load, cost) == []
        # each request decodes alone: every gap is one decode step of one row (the preset
        # reads cached tokens for free), however late in the trace
        assert trace.summary().tbt_p50 == pytest.approx(cost.decode_step(1, 0), rel=1e-9)


def test_a_long_decode_run_grows_by_exactly_the_kv_read_each_step():
    trace = simulate("shared", [Request("a", 0.0, 100, 1000)], V2)
    gaps = trace.token_gaps()
    # each step reads one more cached token than the one before: 999 distinct gaps, the k-th
    # smallest exactly (k - 1) KV reads longer than the first, never drifting
    assert len(gaps) == 999 and len(gaps.items()) == 999
    first = V2.decode_step(1, 101)
    for k in (1, 2, 500, 999):
        assert gaps.kth(k) == pytest.approx(first + (k - 1) * V2.decode_per_kv_token, rel=1e-14)
    assert [e.count for e in trace.events if e.kind == "decode"] == [1000]


def test_a_million_decode_workers_cost_nothing_until_used():
    trace = simulate(
        "disaggregated",
        [Request("a", 0.0, 100, 10)],
        V2,
        decode_workers=10**6,
        prefill_workers=10**6,
    )
    assert trace.resources == ("prefill0", "decode0")


def test_a_thousand_requests_on_ten_thousand_workers():
    load = [Request(f"r{i}", i * 0.001, 200, 20) for i in range(1000)]
    trace = simulate("disaggregated", load, V2, decode_workers=10**4)
    used = {r.decode_resource for r in trace.requests.values()}
    # untouched workers never show; those used are the lowest-numbered ones
    assert trace.resources == ("prefill0", *(f"decode{i}" for i in range(len(used))))
    assert check_invariants(trace, load, V2) == []


# --- the gap multiset -------------------------------------------------------------------------


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
