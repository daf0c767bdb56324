"""Disaggregation's prefill side (sim/prefill_pool.py): prefill workers take every waiting prompt,
the link is a resource, and decode stalls do not see prompts."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import FLAT, LAB, cost_models, examples, run, scenario

from pytest_prefill.sim import (
    LINK,
    CostModel,
    EngineProfile,
    Request,
    check_invariants,
    simulate,
)

pytestmark = pytest.mark.sim


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


def test_gpu_seconds_exclude_the_link():
    load = scenario(LAB)
    trace = run("disaggregated", load, LAB)
    link = trace.busy_time(LINK)
    assert link > 0
    assert trace.summary().gpu_seconds == pytest.approx(trace.busy_time())
    assert trace.busy_time() == pytest.approx(sum(e.duration for e in trace.events) - link)


@examples(60)
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


@examples(60)
@given(cost=cost_models(kv=False), short=st.integers(64, 1024), long=st.integers(2048, 16384))
def test_disaggregated_decode_stall_does_not_depend_on_the_prompt_length(cost, short, long):
    """With no per-KV-token cost: the prompt never enters a decode step's cost."""
    stall = [
        run("disaggregated", scenario(cost, p), cost).summary().max_stall for p in (short, long)
    ]
    assert stall[0] == pytest.approx(stall[1], rel=1e-9)
    assert stall[0] == pytest.approx(max(cost.decode_step(3, 0), cost.decode_step(2, 0)))


@examples(60)
@given(cost=cost_models(), prompt_len=st.integers(64, 8192))
def test_disaggregation_never_spends_fewer_gpu_seconds_than_the_shared_worker(cost, prompt_len):
    # Equal when the prompts batch alike on both (they do here, the live streams arriving
    # together); disaggregation saves no compute, it only moves it off the decode worker.
    load = scenario(cost, prompt_len)
    shared = run("shared", load, cost).summary().gpu_seconds
    assert run("disaggregated", load, cost).summary().gpu_seconds >= shared * (1 - 1e-12)


# --- under an engine profile ------------------------------------------------------------------

BURST = [Request(f"p{i}", 0.0, 18_000, 64) for i in range(16)]  # bunched: one instant, 288k


def test_a_bunched_burst_needs_a_token_budget_for_more_prefill_workers_to_help():
    # the lab's prefill worker takes every waiting prompt in one pass: more workers change
    # nothing; under vLLM's budget (2048) each pass takes one 18k prompt, and workers share them
    def worst_ttft(engine, workers):
        trace = simulate("disaggregated", BURST, FLAT, engine=engine, prefill_workers=workers)
        return max(rec.ttft for rec in trace.requests.values())

    lab = [worst_ttft("lab", p) for p in (1, 4, 7)]
    assert lab[0] == lab[1] == lab[2]
    vllm = [worst_ttft("vllm", p) for p in (1, 4, 7)]
    assert vllm[0] > vllm[1] > vllm[2]
    one_pass = FLAT.prefill_pass(18_000)  # the vllm TTFT is whole passes of one prompt each
    assert vllm[0] == pytest.approx(16 * one_pass)
    assert vllm[2] == pytest.approx(math.ceil(16 / 7) * one_pass)


def test_under_the_prefill_rule_a_one_token_request_never_crosses_the_link():
    cost = CostModel(
        prefill_pass_overhead=1e-3,
        prefill_per_token=1e-6,
        decode_step_base=1e-2,
        kv_bytes_per_token=1e6,
        link_bandwidth=1e9,
    )
    load = [Request("one", 0.0, 100, 1), Request("two", 0.0, 100, 2)]
    rule = EngineProfile("prefill-rule", first_token="prefill")
    trace = simulate("disaggregated", load, cost, engine=rule)
    transfers = [e.request_ids for e in trace.events if e.kind == "transfer"]
    assert transfers == [("two",)]
    one, two = trace.requests["one"], trace.requests["two"]
    assert one.token_times == (one.prefill_end,) and one.kv_ready == one.prefill_end
    assert one.decode_resource == one.prefill_resource == "prefill0"
    assert two.token_times[0] == two.prefill_end < two.kv_ready < two.token_times[1]
    assert check_invariants(trace, load, cost) == []


def test_a_prefill_worker_holds_at_most_its_sequence_cap_until_the_kv_leaves():
    load = [Request(f"r{i}", 0.0, 100, 2) for i in range(5)]
    capped = EngineProfile("capped", max_seqs=2)
    trace = simulate("disaggregated", load, FLAT, engine=capped)
    passes = [e.request_ids for e in trace.events if e.kind == "prefill"]
    assert passes == [("r0", "r1"), ("r2", "r3"), ("r4",)]
    assert check_invariants(trace, load, FLAT) == []


def test_a_prefill_pass_takes_whole_prompts_within_the_budget_at_least_one():
    load = [Request("a", 0.0, 60, 2), Request("b", 0.0, 50, 2), Request("c", 0.0, 300, 2)]
    trace = simulate("disaggregated", load, FLAT, engine=EngineProfile("b", max_batched_tokens=100))
    passes = [e.request_ids for e in trace.events if e.kind == "prefill"]
    assert passes == [("a",), ("b",), ("c",)]  # 60 + 50 > 100; c alone though over it
