"""Paged KV and the prefix cache (sim/paged.py, sim/paged_worker.py; DESIGN.md, "Engine
semantics (v3)"): hits equal the shared leading blocks and TTFT falls by the priced cost of the
skipped tokens; tight memory preempts and every request still gets its tokens; with memory to
spare and nothing to share, paged KV is the reservation rule exactly; the oracle catches a
trace that breaks each new invariant."""

from __future__ import annotations

import dataclasses
import math

import pytest
from corrupt import with_record
from hypothesis import given
from hypothesis import strategies as st
from strategies import V2, examples, loads

from pytest_prefill.sim import (
    BlockPool,
    EngineProfile,
    Request,
    Trace,
    check_invariants,
    simulate,
)

pytestmark = pytest.mark.sim

BLOCK = 64  # prefix block tokens in these tests
PAGED = EngineProfile(
    "paged",
    first_token="prefill",
    kv="paged",
    kv_block_tokens=16,
    prefix_caching=True,
    prefix_block_tokens=BLOCK,
)


def conversation(turns: int, first: int = 300, growth: int = 200, gap: float = 50.0):
    """Turns far apart (each runs alone); turn i's prompt is turn i-1's plus ``growth``
    tokens, and its hash ids keep turn i-1's full blocks."""
    out, blocks, prompt, fresh = [], [], first, 1000
    for i in range(turns):
        need = -(-prompt // BLOCK)
        blocks = blocks[: (prompt - growth) // BLOCK if i else 0]
        blocks += list(range(fresh, fresh + need - len(blocks)))
        fresh += need
        out.append(Request(f"t{i}", i * gap, prompt, 4, tuple(blocks)))
        prompt += growth
    return out


def shared_leading(a: Request, b: Request) -> int:
    """Full blocks of ``a``'s prompt that lead ``b``'s, in tokens, short of ``b``'s whole
    prompt (one token at least is computed)."""
    full = a.prompt_len // BLOCK
    n = 0
    while n < min(full, len(b.prefix_blocks)) and a.prefix_blocks[n] == b.prefix_blocks[n]:
        n += 1
    return min(n, (b.prompt_len - 1) // BLOCK) * BLOCK


@pytest.mark.parametrize("policy", ["shared", "coscheduled", "chunked"])
def test_hits_are_the_shared_leading_blocks_and_ttft_falls_by_their_priced_cost(policy):
    load = conversation(4)
    on = simulate(policy, load, V2, chunk=4096, engine=PAGED)
    off = simulate(
        policy, load, V2, chunk=4096, engine=dataclasses.replace(PAGED, prefix_caching=False)
    )
    assert check_invariants(on, load, V2) == [] and check_invariants(off, load, V2) == []
    hits = [0] + [shared_leading(a, b) for a, b in zip(load, load[1:])]
    assert [on.cached_tokens(r.id) for r in load] == hits and all(hits[1:])
    assert on.hit_rate == sum(hits) / sum(r.prompt_len for r in load)
    assert off.hit_rate == 0.0
    for r, h in zip(load, hits):  # alone: TTFT is the one pass over what is not cached
        skipped = V2.prefill_pass(r.prompt_len) - V2.prefill_pass(r.prompt_len - h, context=h)
        ttft_on, ttft_off = on.requests[r.id].ttft, off.requests[r.id].ttft
        assert ttft_off == pytest.approx(V2.prefill_pass(r.prompt_len), rel=1e-9)
        assert ttft_off - ttft_on == pytest.approx(skipped, rel=1e-6, abs=1e-12)
    assert on.summary().ttft_p50 < off.summary().ttft_p50


def test_under_disaggregation_the_prefill_worker_caches_and_ttft_falls_by_the_priced_cost():
    load = conversation(3)
    on = simulate("disaggregated", load, V2, engine=PAGED)
    off = simulate(
        "disaggregated", load, V2, engine=dataclasses.replace(PAGED, prefix_caching=False)
    )
    hits = [0] + [shared_leading(a, b) for a, b in zip(load, load[1:])]
    assert [on.cached_tokens(r.id) for r in load] == hits and on.summary().cached_tokens
    assert check_invariants(on, load, V2) == []
    for r, h in zip(load, hits):  # the first token comes from the prefill pass
        skipped = V2.prefill_pass(r.prompt_len) - V2.prefill_pass(r.prompt_len - h, context=h)
        diff = off.requests[r.id].ttft - on.requests[r.id].ttft
        assert diff == pytest.approx(skipped, rel=1e-6, abs=1e-12)


def test_a_prompt_is_never_wholly_cached():
    a = Request("a", 0.0, 2 * BLOCK, 2, (1, 2))
    b = Request("b", 10.0, 2 * BLOCK, 2, (1, 2))  # the same prompt: one block is recomputed
    trace = simulate("shared", [a, b], V2, engine=PAGED)
    assert trace.cached_tokens("b") == BLOCK and check_invariants(trace, [a, b], V2) == []


def tight(requests_wide: int, prompt: int = 200, output: int = 120) -> float:
    return float(requests_wide * (prompt + output))


@pytest.mark.parametrize("policy", ["shared", "coscheduled", "chunked"])
@pytest.mark.parametrize("first_token", ["prefill", "decode"])
def test_memory_a_few_requests_wide_preempts_and_every_request_completes(policy, first_token):
    load = [Request(f"r{i}", 0.001 * i, 200, 120) for i in range(8)]
    cost = dataclasses.replace(V2, kv_capacity_tokens=tight(3))
    engine = dataclasses.replace(PAGED, first_token=first_token, prefix_caching=False)
    trace = simulate(policy, load, cost, chunk=128, engine=engine)
    assert trace.preemptions > 0 and trace.summary().preemptions == trace.preemptions
    assert all(len(trace.requests[r.id].token_times) == r.output_len for r in load)
    assert check_invariants(trace, load, cost) == []
    assert "preemptions" in str(trace.summary())


def test_a_request_that_can_never_run_is_named():
    cost = dataclasses.replace(V2, kv_capacity_tokens=160.0)  # 10 blocks of 16
    with pytest.raises(ValueError, match="request 'big' needs 11 KV blocks"):
        simulate("shared", [Request("big", 0.0, 150, 12)], cost, engine=PAGED)
    simulate("shared", [Request("fits", 0.0, 150, 11)], cost, engine=PAGED)  # 160 tokens
    odd = dataclasses.replace(PAGED, prefix_block_tokens=40)
    with pytest.raises(ValueError, match="prefix_block_tokens .* multiple of kv_block_tokens"):
        simulate("shared", [Request("a", 0.0, 10, 1)], V2, engine=odd)


@examples(40)
@given(load=loads(), policy=st.sampled_from(["shared", "coscheduled", "chunked"]))
def test_with_memory_to_spare_and_nothing_to_share_paged_is_the_reservation_rule(load, policy):
    """The paged worker itself (hash ids all distinct: it runs, finds nothing to share)
    against the reservation rule's worker, which simulate() runs in its place when no request
    carries hash ids."""
    paged = dataclasses.replace(PAGED, max_batched_tokens=256, max_seqs=5)
    reserve = dataclasses.replace(paged, kv="reserve", prefix_caching=False)
    distinct = [dataclasses.replace(r, prefix_blocks=(f"only-{r.id}",)) for r in load]
    a = simulate(policy, distinct, V2, chunk=64, engine=paged)
    assert a.hit_rate == 0.0
    b = simulate(policy, load, V2, chunk=64, engine=reserve)
    assert list(a.steps()) == list(b.steps())
    assert {k: r.token_times for k, r in a.requests.items()} == {
        k: r.token_times for k, r in b.requests.items()
    }


@examples(30)
@given(load=loads(), policy=st.sampled_from(["shared", "coscheduled", "chunked"]))
def test_prefix_blocks_change_nothing_under_the_reservation_rule(load, policy):
    shared = [dataclasses.replace(r, prefix_blocks=(0, 1)) for r in load]
    cost = dataclasses.replace(V2, kv_capacity_tokens=2000.0)
    assert simulate(policy, shared, cost, chunk=64) == simulate(policy, load, cost, chunk=64)


def test_the_block_pool_evicts_the_least_recently_used_block_no_request_shares():
    pool = BlockPool(10, entry_blocks=2)
    assert pool.take(6)
    for block in ("a", "b"):
        assert pool.insert(block)  # a prompt's blocks move from its own to the cache
    assert (pool.owned, pool.used) == (2, 6)
    pool.unshare(["a", "b"])  # its request left: b first out, then a
    assert list(pool.lru) == ["b", "a"] and pool.room() == 8
    assert pool.take(5) and "b" not in pool.refs and "a" in pool.refs
    assert not pool.take(4) and pool.used == 9


# -- the oracle catches each new invariant broken ------------------------------------------


def _preempting():
    load = [Request(f"r{i}", 0.001 * i, 200, 120) for i in range(8)]
    cost = dataclasses.replace(V2, kv_capacity_tokens=tight(3))
    engine = dataclasses.replace(PAGED, prefix_caching=False)
    return load, cost, simulate("chunked", load, cost, chunk=128, engine=engine)


def test_cached_tokens_the_record_claims_but_the_trace_computed_are_named():
    load = conversation(2)
    trace = simulate("shared", load, V2, engine=PAGED)
    bad = with_record(trace, "t1", cached_tokens=0)
    assert any("cached" in p for p in check_invariants(bad, load, V2))


def test_a_hit_no_cache_could_have_supplied_is_named():
    load = conversation(2)
    trace = simulate("shared", load, V2, engine=PAGED)
    events = list(trace.events)
    k = next(i for i, e in enumerate(events) if e.prefill and e.prefill[0][0] == "t0")
    e = events[k]
    (rid, n), c = e.prefill[0], e.contexts[0]
    events[k] = dataclasses.replace(e, prefill=((rid, n - BLOCK),), contexts=(c + BLOCK,))
    bad = Trace(trace.policy, events, trace.requests, engine=trace.engine)
    bad = with_record(bad, "t0", cached_tokens=BLOCK)
    assert any("no cache" in p for p in check_invariants(bad, load))


def test_a_re_prefill_short_of_prompt_and_emitted_tokens_is_named():
    load, cost, trace = _preempting()
    victim = next(r for r in trace.requests.values() if r.preemptions)
    events = list(trace.events)
    k = max(i for i, e in enumerate(events) if any(rid == victim.id for rid, _ in e.prefill))
    assert events[k].start > victim.preempted_at[-1]  # the last attempt's last piece
    e = events[k]
    pieces = tuple((rid, n - 1 if rid == victim.id else n) for rid, n in e.prefill)
    events[k] = dataclasses.replace(e, prefill=pieces)
    bad = Trace(trace.policy, events, trace.requests, engine=trace.engine)
    problems = check_invariants(bad, load)
    assert any(victim.id in p and "prefill" in p for p in problems)


def test_a_preemption_the_trace_does_not_show_is_named():
    load, cost, trace = _preempting()
    victim = next(r for r in trace.requests.values() if r.preemptions)
    bad = with_record(trace, victim.id, preempted_at=())
    assert check_invariants(bad, load) != []


def test_blocks_over_the_pool_are_named():
    load, cost, trace = _preempting()
    smaller = dataclasses.replace(cost, kv_capacity_tokens=cost.kv_capacity_tokens / 2)
    assert any("KV blocks" in p for p in check_invariants(trace, load, smaller))
    assert check_invariants(trace, load, cost) == []


def test_capacity_in_blocks_is_whole_blocks():
    assert math.isinf(BlockPool(math.inf).room())


def test_the_prefix_router_sends_a_turn_to_the_replica_holding_its_prefix():
    a0, a1 = conversation(2)  # a1 continues a0; a0 and c go to worker0, b to worker1
    b = Request("b", a0.arrival + 0.001, 300, 50, (7000, 7001, 7002))
    c = Request("c", a0.arrival + 0.002, 300, 1000, (8000, 8001, 8002))
    load = [a0, b, c, dataclasses.replace(a1, arrival=a0.arrival + 5.0)]  # c still runs then
    least = simulate("chunked", load, V2, chunk=512, engine=PAGED, replicas=2)
    prefix = simulate("chunked", load, V2, chunk=512, engine=PAGED, replicas=2, router="prefix")
    for trace in (least, prefix):
        assert check_invariants(trace, load, V2) == []
        assert trace.requests["t0"].decode_resource == trace.requests["c"].decode_resource
    held = prefix.requests["t0"].decode_resource
    assert prefix.requests["t1"].decode_resource == held  # busier, but it holds the prefix
    assert least.requests["t1"].decode_resource != held  # the idle one
    assert prefix.cached_tokens("t1") == shared_leading(a0, a1) > 0 == least.cached_tokens("t1")
    with pytest.raises(ValueError, match="router must be one of"):
        simulate("chunked", load, V2, chunk=512, engine=PAGED, router="random")
    with pytest.raises(ValueError, match="router='prefix' needs"):
        simulate("chunked", load, V2, chunk=512, router="prefix")


@pytest.mark.parametrize("policy", ["chunked", "shared"])
def test_the_mooncake_shaped_trace_under_vllm_with_tight_kv_keeps_every_invariant(policy):
    """The shipped SYNTHETIC trace (tests/data), its 512-token hash ids as prefix blocks,
    under the vllm profile with 200,000 tokens of KV: hits, evictions and preemptions all
    happen, and the oracle finds nothing."""
    import json
    from pathlib import Path

    from pytest_prefill.sim import PRESETS, get_profile

    text = (Path(__file__).parent / "data" / "mooncake-shaped.jsonl").read_text()
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    load = [
        Request(
            f"m{i}",
            row["timestamp"] / 1e3,
            row["input_length"],
            row["output_length"],
            tuple(row["hash_ids"]),
        )
        for i, row in enumerate(rows)
    ]
    cost = dataclasses.replace(
        PRESETS["datacenter-illustrative"].cost, kv_capacity_tokens=200_000.0
    )
    engine = dataclasses.replace(get_profile("vllm"), prefix_block_tokens=512)
    trace = simulate(policy, load, cost, engine=engine)
    assert trace.hit_rate > 0
    assert check_invariants(trace, load, cost) == []
    assert all(len(trace.requests[r.id].token_times) == r.output_len for r in load)
