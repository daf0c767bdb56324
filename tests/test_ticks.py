"""Exact time (sim/ticks.py): a load shifted by a billion seconds gives the same figures."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_prefill.sim import (
    PRESETS,
    TICKS_PER_SECOND,
    Request,
    check_invariants,
    from_ticks,
    simulate,
    to_ticks,
)

pytestmark = pytest.mark.sim


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


@given(seconds=st.floats(2.0**-11, 1e12))
def test_seconds_of_a_tick_or_more_convert_exactly_and_back(seconds):
    ticks = to_ticks(seconds)
    assert ticks == int(seconds * 2**64) or seconds >= 2.0**53
    assert from_ticks(ticks) == seconds
    assert to_ticks(seconds, up=True) == ticks  # exact: no rounding up needed


def test_an_arrival_between_ticks_rounds_up_so_nothing_precedes_it():
    tiny = 0.3 / TICKS_PER_SECOND
    assert to_ticks(tiny) == 0 and to_ticks(tiny, up=True) == 1
