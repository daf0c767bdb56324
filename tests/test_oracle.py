"""The oracle (sim/oracle.py) can fail: real traces, corrupted one way each, must be named by
check_invariants (and the untouched trace passes); iteration_cost refuses an unknown kind."""

from __future__ import annotations

import dataclasses

import pytest
from corrupt import with_record

from pytest_prefill.sim import (
    CostModel,
    EngineProfile,
    Event,
    Request,
    Trace,
    check_invariants,
    iteration_cost,
    simulate,
)

pytestmark = pytest.mark.sim

COST = CostModel(
    prefill_pass_overhead=2e-3,
    prefill_per_token=2e-5,
    decode_step_base=1e-2,
    decode_per_seq=1e-4,
    decode_per_kv_token=2e-8,
    kv_bytes_per_token=1e5,
    link_bandwidth=1e9,
    link_latency=1e-5,
    prefill_per_pair=1e-9,
    fusion_penalty=0.25,
    kv_capacity_tokens=2000,
)
LOAD = [
    Request("a", 0.0, 300, 40),
    Request("b", 0.002, 500, 30),
    Request("c", 0.05, 700, 20),
    Request("d", 0.051, 90, 60),
]


def real(policy: str = "chunked", **kw) -> Trace:
    trace = simulate(policy, LOAD, COST, chunk=128, **kw)
    return Trace(trace.policy, trace.events, dict(trace.requests), trace.chunk)


def with_events(trace: Trace, events) -> Trace:
    return Trace(trace.policy, tuple(events), trace.requests, trace.chunk, engine=trace.engine)


def problems(trace: Trace, cost: CostModel | None = COST) -> str:
    return "\n".join(check_invariants(trace, LOAD, cost))


@pytest.mark.parametrize("policy", ["shared", "coscheduled", "chunked", "disaggregated"])
def test_the_real_traces_pass(policy):
    assert problems(real(policy)) == ""


def test_overlapping_events_are_named():
    trace = real()
    events = list(trace.events)
    i = next(i for i in range(1, len(events)) if events[i].resource == events[i - 1].resource)
    events[i] = dataclasses.replace(events[i], start=events[i - 1].end - 1e-4)
    assert "runs two things at once" in problems(with_events(trace, events), None)


def test_a_missing_token_is_named():
    trace = real()
    times = trace.requests["a"].token_times
    assert "a got 39 tokens, expected 40" in problems(
        with_record(trace, "a", token_times=times[:-1])
    )


def test_an_extra_token_is_named():
    trace = real()
    times = trace.requests["d"].token_times
    found = problems(with_record(trace, "d", token_times=(*times, times[-1] + 0.01)))
    assert "d got 61 tokens, expected 60" in found
    assert "not the ends of the steps that list it" in found


def test_a_token_not_at_the_end_of_a_step_is_named():
    trace = real()
    times = list(trace.requests["b"].token_times)
    times[5] += 1e-6  # still between its neighbours
    found = problems(with_record(trace, "b", token_times=tuple(times)))
    assert "b's token times are not the ends of the steps that list it" in found


def test_token_times_that_do_not_increase_are_named():
    trace = real()
    times = list(trace.requests["c"].token_times)
    times[2], times[3] = times[3], times[2]
    assert "c's token times do not strictly increase" in problems(
        with_record(trace, "c", token_times=tuple(times))
    )


def test_busy_time_that_differs_from_the_events_is_named():
    trace = simulate("chunked", LOAD, COST, chunk=128)
    busy = trace.summary().gpu_seconds

    class Misreported(Trace):
        def summary(self):
            return dataclasses.replace(super().summary(), gpu_seconds=busy * 1.01)

    broken = Misreported(trace.policy, trace.events, trace.requests, trace.chunk)
    assert "differs from the summary's gpu_seconds" in problems(broken, None)


def test_an_event_longer_than_the_cost_model_says_is_named():
    trace = real()
    events = list(trace.events)
    last = events[-1]
    events[-1] = dataclasses.replace(last, end=last.end + 1e-3)
    assert "cost model says" in problems(with_events(trace, events))


def test_kv_over_capacity_is_named():
    trace = real("shared")
    tighter = dataclasses.replace(COST, kv_capacity_tokens=800)
    assert "KV tokens at" in problems(trace, tighter)


def test_a_wrong_kv_read_is_named():
    trace = real()
    events = list(trace.events)
    i = next(i for i, e in enumerate(events) if e.kind == "decode")
    events[i] = dataclasses.replace(events[i], kv_tokens=events[i].kv_tokens + 1)
    assert "reads" in problems(with_events(trace, events), None)


def test_a_wrong_piece_context_is_named():
    trace = real()
    events = list(trace.events)
    i = next(i for i, e in enumerate(events) if e.contexts and e.contexts[0] > 0)
    bad = (events[i].contexts[0] - 1, *events[i].contexts[1:])
    events[i] = dataclasses.replace(events[i], contexts=bad)
    assert "has context" in problems(with_events(trace, events), None)


def test_a_prompt_prefilled_short_is_named():
    trace = real("shared")
    events = list(trace.events)
    i = next(i for i, e in enumerate(events) if e.kind == "prefill")
    (rid, tokens), *rest = events[i].prefill
    events[i] = dataclasses.replace(events[i], prefill=((rid, tokens - 1), *rest))
    assert f"{rid} prefilled {tokens - 1 + 0} tokens" in problems(with_events(trace, events), None)


def test_work_before_arrival_is_named():
    trace = real("shared")
    late = [dataclasses.replace(r, arrival=r.arrival + 0.001) if r.id == "a" else r for r in LOAD]
    found = "\n".join(check_invariants(trace, late, None))
    assert "a is worked on at" in found and "before it arrives" in found


def test_a_first_token_before_the_kv_arrived_is_named():
    trace = real("disaggregated")
    rec = trace.requests["c"]
    found = problems(with_record(trace, "c", kv_ready=rec.token_times[0]), None)
    assert "first token is not after its KV cache was ready" in found


def test_a_token_on_a_worker_that_did_not_decode_the_request_is_named():
    trace = real("coscheduled", replicas=2)
    rec = trace.requests["a"]
    other = "worker1" if rec.decode_resource == "worker0" else "worker0"
    found = problems(with_record(trace, "a", decode_resource=other), None)
    assert f"a has a token on {rec.decode_resource}, decoded by {other}" in found


def test_an_unknown_kind_and_an_empty_event_are_named():
    trace = real()
    events = list(trace.events)
    events[0] = dataclasses.replace(events[0], kind="nap")
    events[1] = dataclasses.replace(events[1], end=events[1].start)
    found = problems(with_events(trace, events), None)
    assert "'nap' is not one of" in found and "has no duration" in found


def test_the_wrong_set_of_requests_is_named():
    trace = real()
    requests = {k: v for k, v in trace.requests.items() if k != "d"}
    broken = Trace(trace.policy, trace.events, requests, trace.chunk)
    assert "the trace's requests are not the load's requests" in problems(broken, None)


def test_iteration_cost_refuses_an_unknown_kind():
    with pytest.raises(ValueError, match="kind"):
        iteration_cost(Event("w", 0.0, 1.0, "nap"), COST)


# --- the engine knobs' invariants (DESIGN.md, "Engine semantics (v3)") -----------------------

VLLM_LIKE = EngineProfile("like-vllm", first_token="prefill", max_batched_tokens=256, max_seqs=3)


def labelled(trace: Trace, engine: EngineProfile) -> Trace:
    """The same trace claiming to come from ``engine``."""
    return Trace(trace.policy, trace.events, dict(trace.requests), trace.chunk, engine=engine)


@pytest.mark.parametrize("policy", ["shared", "coscheduled", "chunked", "disaggregated"])
def test_real_traces_under_an_engine_profile_pass(policy):
    trace = simulate(policy, LOAD, COST, chunk=128, engine=VLLM_LIKE)
    assert trace.engine is VLLM_LIKE
    assert problems(trace) == ""


def test_an_iteration_over_the_token_budget_is_named():
    trace = real("coscheduled")  # a's and b's whole prompts (800 tokens) in one pass
    found = problems(labelled(trace, dataclasses.replace(VLLM_LIKE, first_token="decode")))
    assert "tokens, over the budget of 256" in found
    within = simulate("chunked", LOAD, COST, chunk=128, engine=VLLM_LIKE)
    tighter = dataclasses.replace(VLLM_LIKE, max_batched_tokens=100, max_seqs=None)
    assert "over the budget of 100" in problems(labelled(within, tighter))


def test_a_lone_whole_prompt_longer_than_the_budget_is_allowed_and_nothing_else():
    engine = EngineProfile("tiny", max_batched_tokens=50)  # every prompt here is longer
    trace = simulate("shared", LOAD, COST, engine=engine)
    assert all(len(e.prefill) <= 1 for e in trace.events if e.kind == "prefill")
    assert problems(trace) == ""
    events = list(trace.events)
    i = next(i for i, e in enumerate(events) if e.kind == "prefill")
    rid, tokens = events[i].prefill[0]
    events[i] = dataclasses.replace(events[i], prefill=((rid, tokens - 1),))  # no longer whole
    assert "over the budget of 50" in problems(with_events(trace, events), None)


def test_more_requests_in_progress_than_the_sequence_cap_are_named():
    trace = real("coscheduled")  # a, b, c and d decode together
    capped = EngineProfile("capped", max_seqs=2)
    assert "requests in progress" in problems(labelled(trace, capped))
    assert "over 2" in problems(labelled(trace, capped))
    assert problems(simulate("coscheduled", LOAD, COST, engine=capped)) == ""


def test_a_trace_of_the_prefill_rule_checked_as_the_decode_rule_is_named():
    trace = simulate("shared", LOAD, COST, engine=VLLM_LIKE)
    found = problems(labelled(trace, dataclasses.replace(VLLM_LIKE, first_token="decode")))
    assert "first token is not after its KV cache was ready" in found
    assert "token times are not the ends of the steps that list it" in found


def test_a_trace_of_the_decode_rule_checked_as_the_prefill_rule_is_named():
    trace = real("shared")
    found = problems(labelled(trace, EngineProfile("prefill-rule", first_token="prefill")))
    assert "first token is not at the end of the pass completing it" in found


def test_a_first_token_moved_off_its_prefill_pass_is_named():
    trace = simulate("disaggregated", LOAD, COST, engine=VLLM_LIKE)
    trace = labelled(trace, VLLM_LIKE)
    times = list(trace.requests["b"].token_times)
    times[0] = (times[0] + times[1]) / 2  # still before the second token
    found = problems(with_record(trace, "b", token_times=tuple(times)))
    assert "first token is not at the end of the pass completing it" in found
