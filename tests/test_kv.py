"""KV memory (sim/kv.py): strict FCFS admission by reservation, requests that never fit."""

from __future__ import annotations

import dataclasses

import pytest
from strategies import V2

from pytest_prefill.sim import (
    KVReserve,
    Request,
    check_invariants,
    kv_need,
    simulate,
)

pytestmark = pytest.mark.sim

LOAD = [Request("a", 0.0, 300, 20), Request("b", 0.0, 200, 40), Request("c", 0.01, 100, 10)]


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


def test_a_reservation_is_the_prompt_and_every_output_token():
    kv = KVReserve(capacity=100)
    a, b = Request("a", 0.0, 40, 20), Request("b", 0.0, 30, 11)
    assert kv_need(a) == 60 and kv.fits(a)
    kv.reserve(a)
    assert kv.reserved == 60 and not kv.fits(b)  # 60 + 41 > 100
    kv.release(a)
    assert kv.reserved == 0 and kv.fits(b)
