"""Disaggregation under bounded paged KV (sim/paged_decode.py; DESIGN.md, "Engine semantics
(v3)", KV memory): each pool's blocks bounded by its workers' memory, the prefill pool holding a
prompt until its KV has crossed and the decode pool from its arrival, preemption by recompute on
the decode workers; the oracle's invariants hold (blocks in use never above a worker's pool)."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import V2, examples, loads

from pytest_prefill.sim import (
    EngineProfile,
    Request,
    check_invariants,
    simulate,
)
from pytest_prefill.sim.paged_decode import PromptBlocks

pytestmark = pytest.mark.sim

PAGED = EngineProfile(
    "paged",
    first_token="prefill",
    kv="paged",
    kv_block_tokens=16,
    prefix_caching=True,
    prefix_block_tokens=64,
)


def poisson(n: int, rate: float, seed: int, prefixes: bool = False) -> list[Request]:
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        prompt = rng.randint(20, 700)
        blocks = tuple(range(rng.randint(0, 2) * 100, prompt // 64)) if prefixes else ()
        out.append(Request(f"r{i}", t, prompt, rng.randint(1, 120), blocks))
    return out


def most_need(load: list[Request]) -> int:
    return max(r.prompt_len + r.output_len for r in load)


@given(
    loads(12),
    st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 3)]),
    st.sampled_from(["prefill", "decode"]),
    st.booleans(),
    st.integers(1, 4),
)
@examples(40)
def test_bounded_paged_disaggregation_keeps_every_invariant(load, split, first, caching, room):
    engine = dataclasses.replace(PAGED, first_token=first, prefix_caching=caching)
    cost = dataclasses.replace(V2, kv_capacity_tokens=float(room * (most_need(load) + 16)))
    trace = simulate(
        "disaggregated",
        load,
        cost,
        engine=engine,
        prefill_workers=split[0],
        decode_workers=split[1],
    )
    assert check_invariants(trace, load, cost) == []


@pytest.mark.parametrize("split", [(1, 1), (2, 2)])
def test_tight_decode_memory_preempts_and_every_request_still_gets_its_tokens(split):
    load = poisson(150, 40.0, seed=3, prefixes=True)
    cost = dataclasses.replace(V2, kv_capacity_tokens=float(most_need(load) + 64))
    trace = simulate(
        "disaggregated", load, cost, engine=PAGED, prefill_workers=split[0], decode_workers=split[1]
    )
    assert trace.summary().preemptions > 0
    assert check_invariants(trace, load, cost) == []
    assert all(len(trace.requests[r.id].token_times) == r.output_len for r in load)
    # preemptions happen on the decode workers only: the prefill pool never grows a prompt
    for rec in trace.requests.values():
        assert not rec.preempted_at or rec.decode_resource.startswith("decode")


def test_memory_for_every_request_at_once_is_the_unbounded_run_exactly():
    load = poisson(60, 30.0, seed=5, prefixes=True)
    ample = dataclasses.replace(
        V2, kv_capacity_tokens=float(16 * sum(r.prompt_len + r.output_len + 32 for r in load))
    )
    bounded = simulate("disaggregated", load, ample, engine=PAGED, decode_workers=2)
    unbounded = simulate("disaggregated", load, V2, engine=PAGED, decode_workers=2)
    assert bounded.summary().preemptions == 0
    for rid, rec in unbounded.requests.items():
        assert bounded.requests[rid].token_times == rec.token_times


def test_the_prefill_pool_holds_prompts_only_and_the_decode_pool_prompts_and_outputs():
    # one prompt's blocks fit a worker twice over, but not with its output: each prompt
    # waits for its predecessor's KV to have crossed on neither pool, and a second request
    # joins a decode worker only once the first has finished
    block = PAGED.kv_block_tokens
    a, b = Request("a", 0.0, 16 * block, 20 * block), Request("b", 0.0, 16 * block, 20 * block)
    cost = dataclasses.replace(V2, kv_capacity_tokens=float(40 * block))
    engine = dataclasses.replace(PAGED, prefix_caching=False)
    trace = simulate("disaggregated", [a, b], cost, engine=engine)
    ra, rb = trace.requests["a"], trace.requests["b"]
    assert ra.prefill_start == rb.prefill_start  # both prompts fit the prefill worker at once
    first, second = sorted((ra, rb), key=lambda rec: rec.finish)
    assert second.preempted_at or second.token_times[1] > first.finish
    assert check_invariants(trace, [a, b], cost) == []


def test_prompt_blocks_take_the_uncached_tokens_and_evict_the_least_recent_entry():
    kv = PromptBlocks(12.0, PAGED)  # 12 blocks of 16; a cache entry of 64 tokens is 4
    first = Request("x", 0.0, 128, 2, (1, 2))
    assert kv.fits(first) and kv.reserve(first) == 0 and kv.own["x"] == 8
    kv.cache(first)
    kv.release(first)  # its two entries stay cached, evictable
    again = Request("y", 0.0, 130, 2, (1, 2))
    assert kv.hit_blocks(again) == 2
    assert kv.reserve(again) == 128 and kv.own["y"] == 1  # 2 tokens beyond the hit
    kv.release(again)
    other = Request("z", 0.0, 128, 2, (7, 8))  # 8 blocks: 4 free, one entry evicted
    assert kv.fits(other) and kv.reserve(other) == 0
    assert set(kv.pool.refs) == {1}  # a request's tail block is evicted first (vLLM's order)
    assert not kv.fits(Request("w", 0.0, 80, 2))  # 5 blocks; 4 at most to be had


def test_bounded_kv_keeps_every_split_in_the_search():
    from pytest_prefill.plan.deployments import default_deployments
    from pytest_prefill.sim import PROFILES

    vllm = PROFILES["vllm"]
    assert vllm.kv == "paged"
    unbounded = default_deployments(V2, 4, None, vllm)
    bounded = default_deployments(dataclasses.replace(V2, kv_capacity_tokens=1e5), 4, None, vllm)
    splits = [d for d in unbounded if d.policy == "disaggregated"]
    assert splits and splits == [d for d in bounded if d.policy == "disaggregated"]


def test_grouping_holds_on_a_busy_poisson_load_with_preemptions():
    load = poisson(150, 40.0, seed=3)
    grouped_and_stepwise(load, (2, 2), 2, preempting=True)


@given(loads(12), st.sampled_from([(1, 1), (2, 2)]), st.integers(1, 3))
@examples(25)
def test_what_the_decode_pool_decides_never_depends_on_how_decode_steps_are_grouped(
    load, split, room
):
    grouped_and_stepwise(load, split, room)


def grouped_and_stepwise(load, split, room, preempting=False):
    """The fast path times whole runs of decode steps at once; one step at a time (every
    boundary visited, as the reference simulators run) gives the same trace."""
    from pytest_prefill.sim.paged_decode import PagedDecodeWorker

    cost = dataclasses.replace(V2, kv_capacity_tokens=float(room * (most_need(load) + 16)))
    options = {"engine": PAGED, "prefill_workers": split[0], "decode_workers": split[1]}
    grouped = simulate("disaggregated", load, cost, **options)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PagedDecodeWorker, "steady_steps", lambda self: 1)
        stepwise = simulate("disaggregated", load, cost, **options)
    for rid, rec in stepwise.requests.items():
        assert grouped.requests[rid].token_times == pytest.approx(rec.token_times, rel=1e-12)
        assert grouped.requests[rid].preempted_at == pytest.approx(rec.preempted_at, rel=1e-12)
    assert not preempting or (
        grouped.summary().preemptions > 0 and any(e.count > 1 for e in grouped.events)
    )


@given(loads(10), st.sampled_from([(1, 1), (2, 1), (1, 2)]), st.integers(1, 3), st.integers(1, 3))
@examples(30)
def test_the_oracle_bounds_each_pools_blocks_by_its_own_devices(load, split, rooms, decode_rooms):
    """A split whose pools have memories of their own: the oracle passes the run against both
    cost models, and catches it against a decode pool one block smaller than what its busiest
    decode worker held (or a prefill pool likewise), naming that worker."""
    block = PAGED.kv_block_tokens
    room = most_need(load) + block
    prefill = dataclasses.replace(V2, kv_capacity_tokens=float(rooms * room))
    decode = dataclasses.replace(
        V2, decode_step_base=2e-2, kv_capacity_tokens=float(decode_rooms * room)
    )
    options = {"engine": PAGED, "prefill_workers": split[0], "decode_workers": split[1]}
    trace = simulate("disaggregated", load, prefill, decode_cost=decode, **options)
    assert check_invariants(trace, load, prefill, decode_cost=decode) == []
    # the durations tell the pools apart: one cost model for both is caught where decoding ran
    decoded = any(e.decode_ids and e.resource.startswith("decode") for e in trace.events)
    assert not decoded or any(
        "cost model says" in p for p in check_invariants(trace, load, prefill)
    )
    for name, pool in (("decode", decode), ("prefill", prefill)):
        peak = _peak_blocks(trace, load, name)
        if peak <= 1:  # no pool of fewer blocks exists (or that pool held none)
            continue
        smaller = dataclasses.replace(pool, kv_capacity_tokens=float((peak - 1) * block))
        costs = (prefill, smaller) if name == "decode" else (smaller, decode)
        problems = check_invariants(trace, load, costs[0], decode_cost=costs[1])
        assert any(p.startswith(name) and "KV blocks" in p for p in problems)


def _peak_blocks(trace, load, pool: str) -> int:
    """The most blocks a worker of ``pool`` held, as the oracle counts them: the least
    capacity it passes with (found by asking it, from one block up)."""
    from pytest_prefill.sim.oracle_paged import blocks_in_use

    requests = {r.id: r for r in load}
    workers = {e.resource for e in trace.events if e.resource.startswith(pool)}
    if not workers:
        return 0
    block = PAGED.kv_block_tokens
    for blocks in range(1, 10_000):
        pools = dict.fromkeys(workers, float(blocks * block))
        found = blocks_in_use(trace.events, trace.requests, requests, PAGED, float("inf"), pools)
        if not found:
            return blocks
    raise AssertionError("no capacity holds the trace")
