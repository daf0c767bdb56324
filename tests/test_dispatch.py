"""Prefill dispatch (sim/dispatch.py; the engine profile's ``prefill_dispatch``): per-worker
prefill queues filled at arrival by the least-loaded rule (DistServe's scheduler) or in turn,
beside the shared queue; every invariant holds under each."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import V2, examples, loads

from pytest_prefill.sim import PROFILES, EngineProfile, Request, check_invariants, simulate

pytestmark = pytest.mark.sim

BASE = EngineProfile("dispatch", first_token="prefill")


def run(load, rule, prefill=2, decode=1, cost=V2, engine=BASE):
    eng = dataclasses.replace(engine, prefill_dispatch=rule)
    return simulate(
        "disaggregated", load, cost, engine=eng, prefill_workers=prefill, decode_workers=decode
    )


@given(
    loads(12),
    st.sampled_from(["shared", "least-loaded", "round-robin"]),
    st.integers(1, 3),
    st.sampled_from([None, 2]),
)
@examples(40)
def test_every_dispatch_keeps_every_invariant(load, rule, prefill, bounded):
    cost = V2
    engine = BASE
    if bounded:  # paged KV on both pools, bounded
        need = max(r.prompt_len + r.output_len for r in load)
        cost = dataclasses.replace(V2, kv_capacity_tokens=float(bounded * (need + 16)))
        engine = dataclasses.replace(BASE, kv="paged")
    trace = run(load, rule, prefill, 2, cost, engine)
    assert check_invariants(trace, load, cost) == []


@given(loads(10), st.sampled_from(["least-loaded", "round-robin"]))
@examples(20)
def test_one_prefill_worker_has_nothing_to_dispatch(load, rule):
    one, shared = run(load, rule, prefill=1), run(load, "shared", prefill=1)
    assert one.requests == shared.requests


def test_simultaneous_arrivals_spread_one_a_worker_where_a_shared_queue_batches_them():
    load = [Request(f"r{i}", 0.0, 100, 4) for i in range(3)]
    spread = run(load, "least-loaded", prefill=3)
    assert sorted(rec.prefill_resource for rec in spread.requests.values()) == [
        "prefill0",
        "prefill1",
        "prefill2",
    ]
    shared = run(load, "shared", prefill=3)
    assert {rec.prefill_resource for rec in shared.requests.values()} == {"prefill0"}


def test_least_loaded_counts_the_pass_in_progress_and_the_queue():
    pass_time = V2.prefill_pass(200)
    load = [Request(f"r{i}", 0.0, 100, 4) for i in range(3)]  # r0, r2 -> prefill0; r1 -> 1
    load.append(Request("late", pass_time / 4, 100, 4))  # loads 2 and 1: prefill1
    trace = run(load, "least-loaded")
    where = {rid: rec.prefill_resource for rid, rec in trace.requests.items()}
    assert where == {"r0": "prefill0", "r1": "prefill1", "r2": "prefill0", "late": "prefill1"}


def test_round_robin_goes_to_each_worker_in_turn_whatever_the_load():
    load = [Request(f"r{i}", i * 1e-4, 50 + 500 * (i % 2), 2) for i in range(6)]
    trace = run(load, "round-robin", prefill=3)
    for i in range(6):
        assert trace.requests[f"r{i}"].prefill_resource == f"prefill{i % 3}"


def test_distserves_profile_dispatches_to_the_least_loaded_and_a_bad_rule_is_named():
    assert PROFILES["distserve"].prefill_dispatch == "least-loaded"
    assert PROFILES["vllm"].prefill_dispatch == "shared"
    with pytest.raises(ValueError, match="prefill_dispatch must be one of shared, least-loaded"):
        EngineProfile("x", prefill_dispatch="random")
