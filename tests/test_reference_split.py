"""``simulate()`` against the reference simulator (tests/reference_split.py) on disaggregated
runs under bounded paged KV: each pool's blocks bounded by its own devices (often a request or
two wide, so prompts wait on the prefill workers, KV waits on the decode workers and decode
workers preempt by recompute), the prefix cache on the prefill workers, the decode pool on
devices of its own or not. Both work in exact integer ticks: they must agree exactly (the same
iterations, token times, cached tokens and preemption times), and the oracle must pass."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_reference import assert_paged_agrees, few_wide, paged_loads, v2_costs

from pytest_prefill.sim import CostModel, EngineProfile, simulate

pytestmark = pytest.mark.sim

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def with_blocks(cost: CostModel, blocks: float, block: int) -> CostModel:
    return CostModel.from_dict({**cost.to_dict(), "kv_capacity_tokens": blocks * block})


@st.composite
def split_setups(draw: st.DrawFn):
    """Bounded paged KV on both pools (each from the blocks the largest request needs to a
    few more, or unbounded), shared prefixes, and a decode pool of its own devices half the
    time."""
    engine, load = draw(paged_loads("drawn-split"))
    block = engine.kv_block_tokens
    largest = max(-(-(r.prompt_len + r.output_len - 1) // block) for r in load)
    extras = st.sampled_from([0, 1, 5, 40, math.inf])  # inf: that pool unbounded
    cost = with_blocks(draw(v2_costs()), largest + draw(extras), block)
    options: dict = {
        "engine": engine,
        "prefill_workers": draw(st.integers(1, 2)),
        "decode_workers": draw(st.integers(1, 2)),
    }
    if draw(st.booleans()):
        options["decode_cost"] = with_blocks(draw(v2_costs()), largest + draw(extras), block)
    return "disaggregated", load, cost, options


@SETTINGS
@given(setup=split_setups())
def test_simulate_is_the_reference_on_a_bounded_paged_split(setup):
    assert_paged_agrees(*setup)


@pytest.mark.parametrize("first", ["prefill", "decode"])
@pytest.mark.parametrize("split", [(1, 1), (2, 2)])
def test_a_tight_split_waits_and_preempts_as_the_reference_does(first, split):
    load, cost = few_wide(1200)
    engine = EngineProfile(
        "tight-split",
        first_token=first,
        kv="paged",
        kv_block_tokens=16,
        prefix_caching=True,
        prefix_block_tokens=16,
    )
    options = {"engine": engine, "prefill_workers": split[0], "decode_workers": split[1]}
    assert simulate("disaggregated", load, cost, **options).preemptions > 0
    assert_paged_agrees("disaggregated", load, cost, options)
