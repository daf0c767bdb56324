"""Property tests of the simulator core: every point of DESIGN.md's simulation semantics.

Expected values come from the cost model's formulas, never from an earlier run."""

from __future__ import annotations

import dataclasses
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import chunks, cost_models, loads, policies

from pytest_prefill.invariants import check_invariants, iteration_cost
from pytest_prefill.plan.workloads import lab_scenario
from pytest_prefill.scheduler import (
    LINK,
    POLICIES,
    PRESETS,
    CostModel,
    Event,
    Request,
    Trace,
    Worker,
    percentile,
    simulate,
    token_gaps,
    weighted_percentile,
)

pytestmark = pytest.mark.sim

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LAB = PRESETS["lab-laptop"].cost
FLAT = CostModel(
    prefill_pass_overhead=2e-3, prefill_per_token=2e-5, decode_step_base=1e-2, decode_per_seq=1e-4
)


def run(policy: str, load: list[Request], cost: CostModel, chunk: int = 128, **kw: int) -> Trace:
    return simulate(policy, load, cost, chunk=chunk, **kw)


def scenario(cost: CostModel, prompt_len: int = 2048, streams: int = 2) -> list[Request]:
    """The lab scenario with the prompt arriving in the middle of a decode step, and live
    streams that outlast the prompt's prefill under every policy (chunks >= 16 tokens)."""
    arrival = cost.prefill_pass(streams * 128) + 1.5 * cost.decode_step(streams, 0)
    busy = arrival + 2 * cost.prefill_pass(prompt_len) + cost.kv_transfer(prompt_len)
    outlast = max(prompt_len // 16, math.ceil(busy / cost.decode_step(streams, 0))) + 64
    return lab_scenario(
        streams=streams, prompt_len=prompt_len, arrival=arrival, stream_output_len=outlast
    )


def intervals(trace: Trace, resource: str) -> list[tuple[float, float]]:
    return sorted((e.start, e.end) for e in trace.events if e.resource == resource)


# --- invariants on random loads -------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
@SETTINGS
@given(load=loads(), cost=cost_models(), chunk=chunks, workers=st.integers(1, 3))
def test_every_invariant_holds_on_random_loads(policy, load, cost, chunk, workers):
    trace = simulate(
        policy, load, cost, chunk=chunk, prefill_workers=workers, decode_workers=workers
    )
    assert check_invariants(trace, load, cost) == []


@SETTINGS
@given(load=loads(), cost=cost_models(), policy=policies, chunk=chunks)
def test_every_request_gets_exactly_its_tokens(load, cost, policy, chunk):
    trace = run(policy, load, cost, chunk)
    for r in load:
        assert len(trace.requests[r.id].token_times) == r.output_len
    prefilled: dict[str, int] = {}
    for e in trace.events:
        if e.kind != "transfer":
            for rid, tokens in e.prefill:
                prefilled[rid] = prefilled.get(rid, 0) + tokens
    assert prefilled == {r.id: r.prompt_len for r in load}


@SETTINGS
@given(load=loads(), cost=cost_models(), policy=policies, chunk=chunks)
def test_no_resource_runs_two_things_at_once(load, cost, policy, chunk):
    trace = run(policy, load, cost, chunk, prefill_workers=2, decode_workers=2)
    for resource in trace.resources:
        spans = intervals(trace, resource)
        assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:]))


@SETTINGS
@given(load=loads(), cost=cost_models(), policy=policies, chunk=chunks)
def test_token_times_strictly_increase_and_nothing_precedes_arrival(load, cost, policy, chunk):
    trace = run(policy, load, cost, chunk)
    for r in load:
        rec = trace.requests[r.id]
        times = rec.token_times
        assert all(b > a for a, b in zip(times, times[1:]))
        assert r.arrival <= rec.prefill_start < rec.prefill_end <= rec.kv_ready < times[0]
    for e in trace.events:
        assert all(trace.requests[rid].arrival <= e.start for rid in e.request_ids)


@SETTINGS
@given(load=loads(), cost=cost_models(), policy=policies, chunk=chunks)
def test_gpu_seconds_are_the_events_busy_time_and_follow_the_formulas(load, cost, policy, chunk):
    trace = run(policy, load, cost, chunk, prefill_workers=2, decode_workers=2)
    expected = 0.0
    for e in trace.events:
        if e.kind == "transfer":
            assert e.resource == LINK
            assert e.duration == pytest.approx(cost.kv_transfer(e.prefill_tokens))
            assert iteration_cost(e, cost) == pytest.approx(cost.kv_transfer(e.prefill_tokens))
            continue
        if e.kind == "decode":
            step = sum(
                cost.decode_step(e.decode_rows, e.kv_tokens + i * e.decode_rows)
                for i in range(e.count)
            )
        else:
            step = cost.fused_iteration(
                e.prefill_tokens, e.decode_rows, e.kv_tokens, e.context_tokens
            )
        assert e.duration == pytest.approx(step, rel=1e-9)
        assert iteration_cost(e, cost) == pytest.approx(step, rel=1e-12)
        expected += step
    assert trace.summary().gpu_seconds == pytest.approx(expected, rel=1e-9)


@SETTINGS
@given(load=loads(), cost=cost_models(), policy=policies, chunk=chunks)
def test_decode_rows_read_the_kv_their_requests_hold(load, cost, policy, chunk):
    """K of a decode step = sum over its rows of prompt + tokens already emitted."""
    trace = run(policy, load, cost, chunk)
    for e in trace.events:
        if not e.decode_rows:
            continue
        step_start = e.start
        for i in range(e.count):
            held = 0
            for rid in e.decode_ids:
                rec = trace.requests[rid]
                held += rec.prompt_len + sum(1 for t in rec.token_times if t <= step_start + 1e-12)
            assert e.kv_tokens + i * e.decode_rows == held
            step_start += cost.decode_step(e.decode_rows, e.kv_tokens + i * e.decode_rows)


@SETTINGS
@given(load=loads(), cost=cost_models(), policy=policies, chunk=chunks)
def test_same_input_gives_an_identical_trace(load, cost, policy, chunk):
    assert run(policy, load, cost, chunk) == run(policy, load, cost, chunk)


@SETTINGS
@given(load=loads(), cost=cost_models(), policy=policies, chunk=chunks, seed=st.integers(0, 99))
def test_the_order_of_the_load_list_does_not_matter(load, cost, policy, chunk, seed):
    shuffled = list(load)
    random.Random(seed).shuffle(shuffled)
    assert run(policy, shuffled, cost, chunk) == run(policy, load, cost, chunk)


@SETTINGS
@given(load=loads(), cost=cost_models(), policy=policies, chunk=chunks)
def test_idle_time_has_no_events(load, cost, policy, chunk):
    """Every compute iteration works for some request that has arrived and is not done."""
    trace = run(policy, load, cost, chunk)
    for e in trace.events:
        involved = [trace.requests[rid] for rid in e.request_ids]
        assert involved, "an event with no request"
        assert all(r.arrival <= e.start and e.end <= r.finish for r in involved)


def test_an_idle_gap_between_requests_has_no_events():
    load = [Request("a", 0.0, 64, 4), Request("b", 10.0, 64, 4)]
    for policy in POLICIES:
        trace = run(policy, load, LAB)
        a_done = trace.requests["a"].finish
        assert a_done < 10.0
        assert not [e for e in trace.events if e.end > a_done and e.start < 10.0]
        assert trace.requests["b"].prefill_start == 10.0  # an idle worker starts at once


@SETTINGS
@given(load=loads(), cost=cost_models(), policy=policies, chunk=chunks)
def test_summary_from_precomputed_gaps_equals_summary_from_records(load, cost, policy, chunk):
    trace = run(policy, load, cost, chunk, decode_workers=2)
    generic = Trace(trace.policy, trace.events, trace.requests, trace.chunk, gaps=None)
    fast, slow = trace.summary(), generic.summary()
    for name, value in fast.as_dict().items():
        other = getattr(slow, name)
        assert value == pytest.approx(other, rel=1e-9, nan_ok=True), name


# --- the first-token convention and iteration boundaries --------------------------------------


def test_first_token_is_emitted_at_the_end_of_the_first_decode_step_after_prefill():
    load = [Request("only", 0.25, 300, 3)]
    trace = run("shared", load, FLAT)
    rec = trace.requests["only"]
    assert rec.prefill_start == 0.25
    assert rec.prefill_end == pytest.approx(0.25 + FLAT.prefill_pass(300))
    step = FLAT.decode_step(1, 300)
    assert rec.token_times[0] == pytest.approx(rec.prefill_end + step)
    assert rec.ttft == pytest.approx(FLAT.prefill_pass(300) + step)


def test_a_request_arriving_mid_iteration_waits_for_the_boundary():
    first = Request("first", 0.0, 1000, 2)
    late = Request("late", FLAT.prefill_pass(1000) / 2, 10, 2)
    trace = run("shared", [first, late], FLAT)
    assert trace.requests["late"].prefill_start == pytest.approx(FLAT.prefill_pass(1000))


@pytest.mark.parametrize("policy", ["shared", "coscheduled", "chunked"])
def test_simultaneous_prompts_share_one_pass_fcfs_by_id(policy):
    load = [Request("b", 0.0, 30, 2), Request("a", 0.0, 20, 2)]
    trace = run(policy, load, FLAT, chunk=1000)
    first = trace.events[0]
    assert first.prefill == (("a", 20), ("b", 30))
    assert first.duration == pytest.approx(FLAT.prefill_pass(50))


# --- the worker, one iteration at a time (what the engine runs) -----------------------------


def test_a_chunked_worker_takes_fcfs_pieces_under_the_chunk_and_decodes_a_prompt_next():
    worker = Worker("w", "chunked", chunk=100)
    a, b = Request("a", 0.0, 60, 2), Request("b", 0.0, 80, 1)
    worker.admit(a)
    worker.admit(b)
    plan = worker.compose(0.0)
    assert plan is not None and plan.kind == "prefill"
    assert plan.prefill == ((a, 0, 60), (b, 0, 40)) and plan.prefill_tokens == 100
    assert plan.decode_ids == () and plan.context_tokens == 0 and plan.completed == (a,)
    assert worker.finish_at(1.0) == (a,)
    plan = worker.compose(1.0)  # a joins the decode rows; the rest of b rides along
    assert plan is not None and plan.kind == "fused"
    assert plan.prefill == ((b, 40, 40),) and plan.context_tokens == 40
    assert plan.decode_ids == ("a",) and plan.kv_tokens == 60 and plan.completed == (b,)
    assert plan.prefill_ids() == (("b", 40),)
    worker.finish_at(2.0)
    plan = worker.compose(2.0)  # a holds its prompt and one token, b its prompt
    assert plan is not None and plan.kind == "decode"
    assert plan.decode_ids == ("a", "b") and plan.decode_rows == 2 and plan.prefill == ()
    assert plan.kv_tokens == 61 + 80
    worker.finish_at(3.0)
    assert worker.compose(3.0) is None  # a has its 2 tokens, b its 1
    assert worker.record(a, 0.0, 1.0, 1.0).token_times == (2.0, 3.0)
    assert worker.record(b, 0.0, 2.0, 2.0).token_times == (3.0,)
    assert (worker.prefill_end["a"], worker.prefill_end["b"]) == (1.0, 2.0)


def test_a_shared_worker_holds_up_every_decode_row_while_prompts_wait():
    worker = Worker("w", "shared")
    a, b, c = Request("a", 0.0, 10, 3), Request("b", 0.5, 30, 1), Request("c", 0.5, 5, 1)
    worker.admit(a)
    worker.compose(0.0)
    worker.finish_at(0.25)
    worker.compose(0.25)
    worker.finish_at(0.5)
    worker.admit(b)
    worker.admit(c)
    plan = worker.compose(0.5)
    assert plan is not None and plan.kind == "prefill" and plan.decode_ids == ()
    assert plan.prefill == ((b, 0, 30), (c, 0, 5)) and plan.completed == (b, c)


def test_a_decode_worker_takes_prefilled_requests_only():
    worker = Worker("d", "decode")
    with pytest.raises(ValueError, match="join"):
        worker.admit(Request("a", 0.0, 10, 1))
    worker.join(Request("a", 0.0, 10, 1))
    assert worker.load == 1
    plan = worker.compose(0.0)
    assert plan is not None and plan.kind == "decode" and plan.kv_tokens == 10


@pytest.mark.parametrize(
    ("mode", "chunk", "field"),
    [
        ("fifo", math.inf, "mode"),
        ("chunked", 0, "chunk"),
        ("chunked", 1.5, "chunk"),
        ("chunked", math.nan, "chunk"),
        ("chunked", "64", "chunk"),
        ("chunked", True, "chunk"),
    ],
)
def test_a_worker_refuses_a_bad_mode_or_chunk_naming_it(mode, chunk, field):
    with pytest.raises(ValueError, match=field):
        Worker("w", mode, chunk)


def test_iteration_cost_refuses_an_unknown_kind():
    with pytest.raises(ValueError, match="kind"):
        iteration_cost(Event("w", 0.0, 1.0, "nap"), FLAT)


# --- the lab scenario -----------------------------------------------------------------------


@SETTINGS
@given(cost=cost_models(kv=False, link=False), prompt_len=st.integers(256, 4096))
def test_shared_worst_stall_is_one_prefill_pass_plus_one_decode_step(cost, prompt_len):
    trace = run("shared", scenario(cost, prompt_len), cost)
    expected = cost.prefill_pass(prompt_len) + cost.decode_step(3, 0)
    assert trace.summary().max_stall == pytest.approx(expected)


@SETTINGS
@given(cost=cost_models(), prompt_len=st.integers(256, 4096), chunk=st.integers(16, 1024))
def test_chunked_worst_stall_is_at_most_the_costliest_fused_iteration(cost, prompt_len, chunk):
    trace = run("chunked", scenario(cost, prompt_len), cost, chunk)
    costliest = max(e.duration for e in trace.steps())
    assert trace.summary().max_stall <= costliest * (1 + 1e-9)


@SETTINGS
@given(
    cost=cost_models(kv=False, link=False),
    prompt_len=st.integers(256, 4096),
    sizes=st.lists(st.integers(16, 4096), min_size=2, max_size=5, unique=True),
)
def test_chunked_worst_stall_never_decreases_as_the_chunk_grows(cost, prompt_len, sizes):
    """With no per-KV-token cost (with one, later decode steps read more and can be the worst)."""
    load = scenario(cost, prompt_len)
    stalls = [run("chunked", load, cost, c).summary().max_stall for c in sorted(sizes)]
    assert all(b >= a * (1 - 1e-12) for a, b in zip(stalls, stalls[1:]))


@SETTINGS
@given(cost=cost_models(kv=False, link=False), exponent=st.integers(9, 12))
def test_chunked_ttft_never_increases_as_the_chunk_grows(cost, exponent):
    """Over chunks that divide the prompt (powers of two of a 2^k prompt). With uneven pieces
    it can increase: max(d, a + p*c) summed over pieces is not monotone in c in general."""
    prompt_len = 2**exponent
    load = scenario(cost, prompt_len)
    ttfts = [run("chunked", load, cost, 2**k).requests["long"].ttft for k in range(4, exponent + 2)]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(ttfts, ttfts[1:]))


@SETTINGS
@given(cost=cost_models(), prompt_len=st.integers(64, 4096), extra=st.integers(0, 4096))
def test_a_chunk_at_least_the_prompt_reproduces_coscheduled(cost, prompt_len, extra):
    load = lab_scenario(streams=2, prompt_len=prompt_len, arrival=0.1, stream_prompt_len=64)
    # the live streams' prompts arrive together: the chunk must cover both of them too
    chunk = max(prompt_len, 128) + extra
    chunked, cosched = run("chunked", load, cost, chunk), run("coscheduled", load, cost)
    assert chunked.events == cosched.events
    assert dict(chunked.requests) == dict(cosched.requests)


def test_coscheduled_fuses_the_prompt_with_the_decodes_and_shared_does_not():
    load = scenario(FLAT)
    shared, cosched = run("shared", load, FLAT), run("coscheduled", load, FLAT)
    shared_pass = next(e for e in shared.events if e.prefill and e.prefill[0][0] == "long")
    cosched_pass = next(e for e in cosched.events if e.prefill and e.prefill[0][0] == "long")
    assert (shared_pass.kind, shared_pass.decode_rows) == ("prefill", 0)
    assert (cosched_pass.kind, set(cosched_pass.decode_ids)) == ("fused", {"live0", "live1"})
    assert cosched_pass.duration == pytest.approx(FLAT.fused_iteration(2048, 2, 0, 0))
    assert shared.summary().max_stall == pytest.approx(
        FLAT.prefill_pass(2048) + FLAT.decode_step(3, 0)
    )
    assert cosched.summary().max_stall == pytest.approx(
        max(FLAT.fused_iteration(2048, 2), FLAT.decode_step(3, 0))
    )


@SETTINGS
@given(cost=cost_models(kv=False), short=st.integers(64, 1024), long=st.integers(2048, 16384))
def test_disaggregated_decode_stall_does_not_depend_on_the_prompt_length(cost, short, long):
    """With no per-KV-token cost: the prompt never enters a decode step's cost."""
    stall = [
        run("disaggregated", scenario(cost, p), cost).summary().max_stall for p in (short, long)
    ]
    assert stall[0] == pytest.approx(stall[1], rel=1e-9)
    assert stall[0] == pytest.approx(max(cost.decode_step(3, 0), cost.decode_step(2, 0)))


@SETTINGS
@given(cost=cost_models(), prompt_len=st.integers(64, 8192))
def test_disaggregation_never_spends_fewer_gpu_seconds_than_the_shared_worker(cost, prompt_len):
    # Equal when the prompts batch alike on both (they do here, the live streams arriving
    # together); disaggregation saves no compute, it only moves it off the decode worker.
    load = scenario(cost, prompt_len)
    shared = run("shared", load, cost).summary().gpu_seconds
    assert run("disaggregated", load, cost).summary().gpu_seconds >= shared * (1 - 1e-12)


@SETTINGS
@given(cost=cost_models(), prompt_len=st.integers(64, 8192))
def test_a_free_link_removes_the_transfer_from_ttft(cost, prompt_len):
    free = dataclasses.replace(cost, link_bandwidth=math.inf, link_latency=0.0)
    load = scenario(free, prompt_len)
    trace = run("disaggregated", load, free)
    assert not [e for e in trace.events if e.kind == "transfer"]
    rec = trace.requests["long"]
    assert rec.kv_ready == rec.prefill_end
    # its first token ends the first decode step that starts once its KV is ready
    steps = [(e.start, e.end) for e in trace.steps() if e.resource == rec.decode_resource]
    after = [(begin, end) for begin, end in steps if begin >= rec.kv_ready]
    # Time is exact inside: a step that starts a few ticks (< a float's resolution) before
    # the KV is ready shows the same float start; then the next step is the first one.
    allowed = {after[0][1]} | ({after[1][1]} if after[0][0] == rec.kv_ready else set())
    assert rec.token_times[0] in allowed


def test_the_link_is_a_resource_transfers_queue():
    cost = CostModel(
        prefill_pass_overhead=1e-3,
        prefill_per_token=1e-6,
        decode_step_base=1e-2,
        kv_bytes_per_token=1e6,
        link_bandwidth=1e9,
    )  # 1 ms per KV token
    load = [Request("a", 0.0, 100, 2), Request("b", 0.0, 100, 2)]
    trace = run("disaggregated", load, cost, prefill_workers=2)
    transfers = [e for e in trace.events if e.kind == "transfer"]
    assert [e.request_ids for e in transfers] == [("a",), ("b",)]
    assert transfers[1].start == pytest.approx(transfers[0].end)  # b waited for a
    assert all(e.duration == pytest.approx(cost.kv_transfer(100)) for e in transfers)
    # one batched pass over both prompts (they wait together), then two transfers in turn
    both = cost.prefill_pieces([(100, 0), (100, 0)])
    assert trace.requests["b"].kv_ready == pytest.approx(both + 2 * 0.1)


def test_prompts_go_to_the_first_free_prefill_worker_which_takes_every_waiting_one():
    one = FLAT.prefill_pass(500)
    arrivals = {"r0": 0.0, "r1": one / 4, "r2": one / 2, "r3": one / 2, "r4": 3 * one}
    load = [Request(rid, t, 500, 2) for rid, t in arrivals.items()]
    trace = run("disaggregated", load, FLAT, prefill_workers=2)
    passes = [(e.resource, e.request_ids) for e in trace.events if e.kind == "prefill"]
    # r0 and r1 each find a free worker; r2 and r3 wait for the first one free (prefill0, at
    # the end of r0's pass) and share one pass; r4 finds both free and takes the lowest.
    assert sorted(passes) == [
        ("prefill0", ("r0",)),
        ("prefill0", ("r2", "r3")),
        ("prefill0", ("r4",)),
        ("prefill1", ("r1",)),
    ]
    assert trace.requests["r2"].prefill_start == pytest.approx(one)
    assert trace.requests["r3"].prefill_end == pytest.approx(
        one + FLAT.prefill_pieces([(500, 0)] * 2)
    )


def test_a_prefilled_request_joins_the_decode_worker_with_fewest_requests():
    load = [Request("a", 0.0, 10, 50), Request("b", 0.001, 10, 50), Request("c", 0.002, 10, 50)]
    trace = run("disaggregated", load, FLAT, decode_workers=2)
    where = {rid: rec.decode_resource for rid, rec in trace.requests.items()}
    assert where == {"a": "decode0", "b": "decode1", "c": "decode0"}


def test_gpu_seconds_exclude_the_link():
    load = scenario(LAB)
    trace = run("disaggregated", load, LAB)
    link = trace.busy_time(LINK)
    assert link > 0
    assert trace.summary().gpu_seconds == pytest.approx(trace.busy_time())
    assert trace.busy_time() == pytest.approx(sum(e.duration for e in trace.events) - link)


# --- summary ---------------------------------------------------------------------------------


@given(
    values=st.lists(st.floats(0, 1e3), min_size=1, max_size=200),
    p=st.sampled_from([1, 50, 99, 100]),
)
def test_percentiles_are_nearest_rank(values, p):
    ordered = sorted(values)
    assert percentile(values, p) == ordered[math.ceil(p / 100 * len(values)) - 1]
    assert weighted_percentile([(v, 2) for v in values], p) == percentile(values + values, p)


def test_summary_max_stall_is_the_longest_gap_between_a_requests_tokens():
    trace = run("shared", scenario(LAB), LAB)
    gaps = [g for g, _ in token_gaps(trace.requests.values())]
    assert trace.summary().max_stall == pytest.approx(max(gaps), rel=1e-12)


def test_an_empty_load_gives_an_empty_trace_whose_summary_says_so():
    for policy in POLICIES:
        trace = simulate(policy, [], LAB, chunk=64)
        s = trace.summary()
        assert trace.events == () and dict(trace.requests) == {}
        assert s.empty and s.requests == 0 and s.gpu_seconds == 0.0
        assert math.isnan(s.ttft_p99)
        assert "empty" in str(s)


# --- the cost model --------------------------------------------------------------------------


@given(
    cost=cost_models(),
    t=st.integers(0, 10**5),
    n=st.integers(1, 512),
    k=st.integers(0, 10**6),
    c=st.integers(0, 10**5),
)
def test_cost_model_formulas(cost, t, n, k, c):
    assert cost.prefill_pass(t, c) == pytest.approx(
        cost.prefill_pass_overhead + cost.prefill_per_token * t + cost.decode_per_kv_token * c
    )
    assert cost.decode_step(n, k) == pytest.approx(
        cost.decode_step_base + cost.decode_per_seq * (n - 1) + cost.decode_per_kv_token * k
    )
    fused = cost.fused_iteration(t, n, k, c)
    assert fused >= cost.decode_step(n, k)
    if t:
        assert fused >= cost.prefill_pass(t, c)
        assert fused == pytest.approx(max(cost.decode_step(n, k), cost.prefill_pass(t + n, c)))
    assert cost.kv_transfer(t) == pytest.approx(
        cost.link_latency + t * cost.kv_bytes_per_token / cost.link_bandwidth
    )


def test_chunk_star_is_the_formula_and_may_be_a_negative_diagnosis():
    assert LAB.chunk_star() == pytest.approx((35.73e-3 - 29.03e-3) / 55.2e-6)
    assert round(LAB.chunk_star()) == 121  # DESIGN.md's published figure for the lab laptop
    overhead_bound = CostModel(
        prefill_pass_overhead=0.05, prefill_per_token=1e-5, decode_step_base=0.01
    )
    assert overhead_bound.chunk_star() < 0


def test_presets_say_where_their_numbers_come_from():
    for preset in PRESETS.values():
        assert preset.name and len(preset.source) > 40
    assert "published calibration" in PRESETS["lab-laptop"].source
    assert "ILLUSTRATIVE" in PRESETS["datacenter-illustrative"].source
    assert PRESETS["lab-laptop"].cost.kv_bytes_per_token == 28 * 8 * 128 * 2 * 2


@given(cost=cost_models())
def test_cost_model_survives_a_json_round_trip(cost):
    import json

    assert CostModel.from_dict(json.loads(json.dumps(cost.to_dict()))) == cost


# --- bad input -------------------------------------------------------------------------------

GOOD = dict(prefill_pass_overhead=1e-3, prefill_per_token=1e-5, decode_step_base=1e-2)


@pytest.mark.parametrize(
    "field",
    [
        *GOOD,
        "decode_per_seq",
        "decode_per_kv_token",
        "kv_bytes_per_token",
        "link_latency",
        "link_bandwidth",
    ],
)
@pytest.mark.parametrize("value", [-1.0, math.nan, -math.inf, "fast", None])
def test_bad_costs_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        CostModel(**{**GOOD, field: value})


@pytest.mark.parametrize("field", [*GOOD, "decode_per_seq", "link_latency"])
def test_infinite_costs_are_refused(field):
    with pytest.raises(ValueError, match=field):
        CostModel(**{**GOOD, field: math.inf})


def test_a_cost_model_must_make_time_pass():
    with pytest.raises(ValueError, match="decode_step_base"):
        CostModel(**{**GOOD, "decode_step_base": 0.0})
    with pytest.raises(ValueError, match="prefill_pass_overhead"):
        CostModel(**{**GOOD, "prefill_pass_overhead": 0.0, "prefill_per_token": 0.0})
    with pytest.raises(ValueError, match="link_bandwidth"):
        CostModel(**{**GOOD, "link_bandwidth": 0.0})


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(arrival=-0.1), "arrival"),
        (dict(arrival=math.nan), "arrival"),
        (dict(arrival=math.inf), "arrival"),
        (dict(prompt_len=0), "prompt_len"),
        (dict(prompt_len=-5), "prompt_len"),
        (dict(prompt_len=2.5), "prompt_len"),
        (dict(output_len=0), "output_len"),
        (dict(id=""), "id"),
        (dict(id=7), "id"),
    ],
)
def test_bad_requests_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Request(**{**dict(id="r", arrival=0.0, prompt_len=10, output_len=5), **kwargs})


def test_duplicate_ids_are_refused():
    with pytest.raises(ValueError, match=r"load\[1\]\.id 'x' is a duplicate"):
        simulate("shared", [Request("x", 0, 1, 1), Request("x", 1, 1, 1)], LAB)


def test_an_unknown_policy_lists_the_valid_ones():
    with pytest.raises(ValueError, match="shared, coscheduled, chunked, disaggregated"):
        simulate("fifo", [], LAB)


@pytest.mark.parametrize("chunk", [None, 0, -4, 1.5])
def test_chunked_needs_a_positive_chunk(chunk):
    with pytest.raises(ValueError, match="chunk"):
        simulate("chunked", [Request("a", 0, 10, 1)], LAB, chunk=chunk)


@pytest.mark.parametrize("field", ["prefill_workers", "decode_workers"])
@pytest.mark.parametrize("value", [0, -1, 1.0])
def test_workers_must_be_at_least_one(field, value):
    with pytest.raises(ValueError, match=field):
        simulate("disaggregated", [Request("a", 0, 10, 1)], LAB, **{field: value})


def test_a_load_of_non_requests_is_refused():
    with pytest.raises(ValueError, match=r"load\[0\] must be a Request"):
        simulate("shared", [("a", 0, 10, 1)], LAB)  # type: ignore[list-item]


# --- copy-and-run, and the light import ------------------------------------------------------

ROOT = Path(__file__).resolve().parents[1]


def test_scheduler_runs_alone_with_the_standard_library(tmp_path):
    copy = tmp_path / "scheduler.py"
    copy.write_text((ROOT / "pytest_prefill" / "scheduler.py").read_text())
    out = subprocess.run(
        [sys.executable, "-I", "-S", str(copy)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=True,
    ).stdout
    for policy in POLICIES:
        assert policy in out
    assert "C* = " in out


def test_importing_the_package_loads_no_heavy_library():
    code = (
        "import sys, pytest_prefill, pytest_prefill.plugin, pytest_prefill.cli; "
        "print(sorted(m for m in ('torch', 'numpy', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    ).stdout
    assert out.strip() == "[]"
