"""``simulate()`` (sim/simulation.py) on random loads: every point of DESIGN.md's simulation
semantics, and numbers that overflow a run refused, never a traceback or a trace with tokens
missing."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import LAB, chunks, cost_models, examples, loads, policies, run

from pytest_prefill.cli import main
from pytest_prefill.plan.workloads import lab_scenario
from pytest_prefill.sim import (
    LINK,
    POLICIES,
    PROFILES,
    CostModel,
    EngineProfile,
    Request,
    Trace,
    check_invariants,
    iteration_cost,
    simulate,
)

pytestmark = pytest.mark.sim


def intervals(trace: Trace, resource: str) -> list[tuple[float, float]]:
    return sorted((e.start, e.end) for e in trace.events if e.resource == resource)


def huge(decode_step_base: float) -> CostModel:
    return CostModel(
        prefill_pass_overhead=0.01, prefill_per_token=1e-5, decode_step_base=decode_step_base
    )


def complete_or_refused(policy, load, cost):
    """Either a ValueError, or a trace in which every request got all its tokens, at finite,
    non-decreasing times."""
    try:
        trace = simulate(policy, load, cost, chunk=64)
    except ValueError:
        return
    for r in load:
        times = trace.requests[r.id].token_times
        assert len(times) == r.output_len, f"{policy}: {r.id} got {len(times)} of {r.output_len}"
        assert all(math.isfinite(t) for t in times) and list(times) == sorted(times)
    trace.summary()


@pytest.mark.parametrize("policy", POLICIES)
@examples(60)
@given(load=loads(), cost=cost_models(), chunk=chunks, workers=st.integers(1, 3))
def test_every_invariant_holds_on_random_loads(policy, load, cost, chunk, workers):
    trace = simulate(
        policy, load, cost, chunk=chunk, prefill_workers=workers, decode_workers=workers
    )
    assert check_invariants(trace, load, cost) == []


@examples(60)
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


@examples(60)
@given(load=loads(), cost=cost_models(), policy=policies, chunk=chunks)
def test_no_resource_runs_two_things_at_once(load, cost, policy, chunk):
    trace = run(policy, load, cost, chunk, prefill_workers=2, decode_workers=2)
    for resource in trace.resources:
        spans = intervals(trace, resource)
        assert all(b[0] >= a[1] for a, b in zip(spans, spans[1:]))


@examples(60)
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


@examples(60)
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


@examples(60)
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


@examples(60)
@given(load=loads(), cost=cost_models(), policy=policies, chunk=chunks)
def test_same_input_gives_an_identical_trace(load, cost, policy, chunk):
    assert run(policy, load, cost, chunk) == run(policy, load, cost, chunk)


@examples(60)
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


@pytest.mark.parametrize("policy", POLICIES)
def test_a_decode_step_of_6e307_gives_every_token_or_an_error(policy):
    complete_or_refused(policy, [Request("a", 0.0, 10, 3)], huge(6e307))


@pytest.mark.parametrize("policy", POLICIES)
def test_a_decode_step_of_1e308_gives_every_token_or_an_error(policy):
    complete_or_refused(policy, lab_scenario(), huge(1e308))


@pytest.mark.parametrize("command", [["simulate"], ["timeline", "--text"]])
def test_the_commands_give_one_line_for_a_cost_that_would_overflow(command, tmp_path, capsys):
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(huge(1e308).to_dict()))
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--cost", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1  # refused at load: the file and field
    assert str(path) in err[0] and "decode_step_base" in err[0]


@pytest.mark.parametrize("engine", sorted(PROFILES))
@examples(40)
@given(load=loads(), cost=cost_models(), policy=policies, workers=st.integers(1, 3))
def test_every_invariant_holds_under_every_engine_profile(engine, load, cost, policy, workers):
    options = {"chunk": 64} if policy == "chunked" and engine in ("lab", "distserve") else {}
    if policy == "disaggregated":
        options.update(prefill_workers=workers, decode_workers=workers)
    else:
        options["replicas"] = workers
    trace = simulate(policy, load, cost, engine=engine, **options)
    assert trace.engine is PROFILES[engine]
    assert check_invariants(trace, load, cost) == []


@examples(60)
@given(
    load=loads(),
    cost=cost_models(),
    policy=policies,
    budget=st.integers(1, 700),
    seqs=st.integers(1, 6),
    rule=st.sampled_from(["prefill", "decode"]),
)
def test_every_invariant_holds_with_every_knob_drawn(load, cost, policy, budget, seqs, rule):
    engine = EngineProfile("drawn", first_token=rule, max_batched_tokens=budget, max_seqs=seqs)
    trace = simulate(policy, load, cost, engine=engine, prefill_workers=2, decode_workers=2)
    assert check_invariants(trace, load, cost) == []
    for rec in trace.requests.values():  # output_len tokens under either rule
        assert len(rec.token_times) == rec.output_len
