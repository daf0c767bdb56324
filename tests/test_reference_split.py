"""``simulate()`` against the reference simulator (tests/reference_split.py) on disaggregated
runs under bounded paged KV: each pool's blocks bounded by its own devices (often a request or
two wide, so prompts wait on the prefill workers, KV waits on the decode workers and decode
workers preempt by recompute), the prefix cache on the prefill workers, the decode pool on
devices of its own or not. Both work in exact integer ticks: they must agree exactly (the same
iterations, token times, cached tokens and preemption times), and the oracle must pass."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_reference import assert_paged_agrees, engines, v2_costs, v2_loads

from pytest_prefill.sim import CostModel, EngineProfile, Request, simulate

pytestmark = pytest.mark.sim

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def with_blocks(cost: CostModel, blocks: int, block: int) -> CostModel:
    return CostModel.from_dict({**cost.to_dict(), "kv_capacity_tokens": blocks * block})


@st.composite
def split_setups(draw: st.DrawFn):
    """Bounded paged KV on both pools (each from the blocks the largest request needs to a
    few more), shared prefixes, and a decode pool of its own devices half the time."""
    block = draw(st.sampled_from([1, 4, 16]))
    entry = block * draw(st.sampled_from([1, 2, 8]))
    engine = dataclasses.replace(
        draw(engines()),
        name="drawn-split",
        kv="paged",
        kv_block_tokens=block,
        prefix_caching=draw(st.booleans()),
        prefix_block_tokens=entry,
    )
    chains = [[f"c{k}-{i}" for i in range(60)] for k in range(2)]
    load = []
    for r in draw(v2_loads()):
        chain = chains[draw(st.integers(0, 1))]
        ids = chain[: draw(st.integers(0, 59))] + [f"{r.id}-{i}" for i in range(60)]
        load.append(dataclasses.replace(r, prefix_blocks=tuple(ids[: -(-r.prompt_len // entry)])))
    largest = max(-(-(r.prompt_len + r.output_len - 1) // block) for r in load)
    extras = st.sampled_from([0, 1, 5, 40])
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
    load = [
        Request(f"r{i}", 0.013 * i * (i % 3), 37 * i + 5, 150 + 40 * (i % 4), (0, 1, i))
        for i in range(12)
    ]
    cost = CostModel(
        prefill_pass_overhead=2e-3,
        prefill_per_token=1.5e-5,
        decode_step_base=1e-2,
        decode_per_seq=1e-4,
        decode_per_kv_token=2e-8,
        kv_bytes_per_token=1.1e5,
        link_bandwidth=25e9,
        link_latency=1e-5,
        prefill_per_pair=1e-9,
        fusion_penalty=0.3,
        kv_capacity_tokens=1200,
    )
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
