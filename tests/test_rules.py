"""The scheduling rules (sim/rules.py): what each iteration holds under each policy, the worker one
iteration at a time (what the engine runs), the lab scenario's stalls, chunk budgets. Expected
values come from the cost model's formulas, never from an earlier run."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import FLAT, V2, cost_models, examples, run, scenario

from pytest_prefill.plan.workloads import lab_scenario
from pytest_prefill.sim import (
    EngineProfile,
    Request,
    Worker,
    check_invariants,
    iteration_cost,
    simulate,
)

pytestmark = pytest.mark.sim


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


@examples(60)
@given(cost=cost_models(kv=False, link=False), prompt_len=st.integers(256, 4096))
def test_shared_worst_stall_is_one_prefill_pass_plus_one_decode_step(cost, prompt_len):
    trace = run("shared", scenario(cost, prompt_len), cost)
    expected = cost.prefill_pass(prompt_len) + cost.decode_step(3, 0)
    assert trace.summary().max_stall == pytest.approx(expected)


@examples(60)
@given(cost=cost_models(), prompt_len=st.integers(256, 4096), chunk=st.integers(16, 1024))
def test_chunked_worst_stall_is_at_most_the_costliest_fused_iteration(cost, prompt_len, chunk):
    trace = run("chunked", scenario(cost, prompt_len), cost, chunk)
    costliest = max(e.duration for e in trace.steps())
    assert trace.summary().max_stall <= costliest * (1 + 1e-9)


@examples(60)
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


@examples(60)
@given(cost=cost_models(kv=False, link=False), exponent=st.integers(9, 12))
def test_chunked_ttft_never_increases_as_the_chunk_grows(cost, exponent):
    """Over chunks that divide the prompt (powers of two of a 2^k prompt). With uneven pieces
    it can increase: max(d, a + p*c) summed over pieces is not monotone in c in general."""
    prompt_len = 2**exponent
    load = scenario(cost, prompt_len)
    ttfts = [run("chunked", load, cost, 2**k).requests["long"].ttft for k in range(4, exponent + 2)]
    assert all(b <= a * (1 + 1e-12) for a, b in zip(ttfts, ttfts[1:]))


@examples(60)
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


@examples(80)
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


# --- the engine knobs (DESIGN.md, "Engine semantics (v3)") -----------------------------------


def test_under_a_token_budget_the_rows_go_first_and_prompt_tokens_fill_the_rest():
    worker = Worker("w", "chunked", engine=EngineProfile("knobs", max_batched_tokens=50))
    live, long = Request("live", 0.0, 10, 5), Request("long", 0.0, 200, 2)
    worker.admit(live)
    plan = worker.compose(0.0)
    worker.finish_at(1.0)
    worker.admit(long)
    plan = worker.compose(1.0)  # one row (live): 49 prompt tokens of long ride with it
    assert plan is not None and plan.decode_ids == ("live",)
    assert plan.prefill == ((long, 0, 49),)
    worker.finish_at(2.0)
    plan = worker.compose(2.0)
    assert plan is not None and plan.prefill == ((long, 49, 49),)
    assert plan.prefill_tokens + plan.decode_rows == 50


def test_a_chunk_smaller_than_the_budget_still_bounds_the_prompt_tokens():
    worker = Worker("w", "chunked", chunk=16, engine=EngineProfile("knobs", max_batched_tokens=50))
    worker.admit(Request("a", 0.0, 100, 1))
    plan = worker.compose(0.0)
    assert plan is not None and plan.prefill_tokens == 16


def test_coscheduled_under_a_budget_takes_whole_prompts_and_a_longer_one_runs_alone():
    worker = Worker("w", "coscheduled", engine=EngineProfile("knobs", max_batched_tokens=100))
    a, b, c = Request("a", 0.0, 60, 3), Request("b", 0.0, 50, 3), Request("c", 0.0, 500, 2)
    for r in (a, b, c):
        worker.admit(r)
    plan = worker.compose(0.0)  # a fits, b does not beside it: whole prompts only
    assert plan is not None and plan.prefill == ((a, 0, 60),)
    worker.finish_at(1.0)
    plan = worker.compose(1.0)  # a's row and b's 50 tokens: 51 <= 100
    assert plan is not None and plan.decode_ids == ("a",) and plan.prefill == ((b, 0, 50),)
    worker.finish_at(2.0)
    plan = worker.compose(2.0)  # c (500) can never fit 100: it runs alone, the rows wait
    assert plan is not None and plan.kind == "prefill" and plan.prefill == ((c, 0, 500),)


def test_coscheduled_under_a_budget_decodes_while_the_head_waits_for_room():
    worker = Worker("w", "coscheduled", engine=EngineProfile("knobs", max_batched_tokens=100))
    a, b = Request("a", 0.0, 90, 2), Request("b", 0.0, 100, 1)
    worker.admit(a)
    worker.compose(0.0)
    worker.finish_at(1.0)
    worker.admit(b)
    plan = worker.compose(1.0)  # 1 row + 100 > 100 but 100 <= 100: b waits for a to leave
    assert plan is not None and plan.kind == "decode" and plan.decode_ids == ("a",)


def test_shared_under_a_budget_takes_whole_prompts_within_it_at_least_one():
    worker = Worker("w", "shared", engine=EngineProfile("knobs", max_batched_tokens=100))
    a, b, c = Request("a", 0.0, 40, 1), Request("b", 0.0, 50, 1), Request("c", 0.0, 30, 1)
    for r in (a, b, c):
        worker.admit(r)
    plan = worker.compose(0.0)
    assert plan is not None and plan.prefill == ((a, 0, 40), (b, 0, 50))
    alone = Worker("w", "shared", engine=EngineProfile("knobs", max_batched_tokens=10))
    alone.admit(a)
    alone.admit(c)
    plan = alone.compose(0.0)
    assert plan is not None and plan.prefill == ((a, 0, 40),)


@pytest.mark.parametrize(
    ("max_seqs", "budget", "admitted"), [(2, None, 2), (5, 3, 3), (None, 2, 2)]
)
def test_a_worker_admits_at_most_its_sequence_cap(max_seqs, budget, admitted):
    worker = Worker(
        "w",
        "chunked",
        chunk=1000,
        engine=EngineProfile("knobs", max_seqs=max_seqs, max_batched_tokens=budget),
    )
    load = [Request(f"r{i}", 0.0, 1, 3) for i in range(6)]
    for r in load:
        worker.admit(r)
    plan = worker.compose(0.0)
    assert plan is not None and [r for r, _, _ in plan.prefill] == load[:admitted]
    assert worker.admitted == admitted and len(worker.pending) == 6 - admitted


def test_under_the_prefill_rule_the_pass_completing_a_prompt_emits_its_first_token():
    worker = Worker("w", "shared", engine=EngineProfile("knobs", first_token="prefill"))
    a, one = Request("a", 0.0, 10, 3), Request("one", 0.0, 5, 1)
    worker.admit(a)
    worker.admit(one)
    worker.compose(0.0)
    worker.finish_at(1.0)  # both prompts: first tokens at 1.0; "one" is done
    assert worker.tokens.first_token == {"a": 1.0, "one": 1.0}
    assert worker.record(one, 0.0, 1.0, 1.0).token_times == (1.0,)
    plan = worker.compose(1.0)  # a's first row reads its prompt and the token it has
    assert plan is not None and plan.decode_ids == ("a",) and plan.kv_tokens == 11
    worker.finish_at(2.0)
    worker.compose(2.0)
    worker.finish_at(3.0)
    assert worker.compose(3.0) is None  # a has its 3 tokens: one from the pass, two rows
    assert worker.record(a, 0.0, 1.0, 1.0).token_times == (1.0, 2.0, 3.0)
    assert worker.unfinished == 0 and worker.admitted == 0 and worker.kv.reserved == 0


def test_a_worker_takes_the_engine_profile_as_itself():
    profile = EngineProfile("knobs", first_token="prefill", max_seqs=8, max_batched_tokens=4)
    worker = Worker("w", "chunked", engine=profile)
    assert worker.engine is profile and worker.prefill_first
    assert worker.max_seqs == profile.seq_cap == 4  # each admitted request takes a row
    with pytest.raises(ValueError, match="budget"):
        Worker("w", "shared", budget=1.0, price=lambda *_: 0.0)  # a budget is chunked's


def test_the_prefill_rule_makes_ttft_one_prefill_pass_for_a_lone_request():
    load = [Request("only", 0.25, 300, 3)]
    rule = EngineProfile("prefill-rule", first_token="prefill")
    rec = simulate("shared", load, FLAT, engine=rule).requests["only"]
    assert rec.ttft == pytest.approx(FLAT.prefill_pass(300))
    # the second token: one decode step reading the prompt and the first token
    assert rec.token_times[1] - rec.token_times[0] == pytest.approx(FLAT.decode_step(1, 301))
    lab = simulate("shared", load, FLAT).requests["only"]
    assert lab.ttft == pytest.approx(FLAT.prefill_pass(300) + FLAT.decode_step(1, 300))
