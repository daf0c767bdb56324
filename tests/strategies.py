"""Hypothesis strategies for cost models and loads, and the cost models, loads and settings the
simulator's tests share."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from pytest_prefill.plan.workloads import lab_scenario
from pytest_prefill.sim import PRESETS, CostModel, Request, Trace, simulate


def examples(n: int) -> settings:
    """Hypothesis settings: ``n`` examples, no deadline (the machine is shared)."""
    return settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.too_slow])


LAB = PRESETS["lab-laptop"].cost
FLAT = CostModel(
    prefill_pass_overhead=2e-3, prefill_per_token=2e-5, decode_step_base=1e-2, decode_per_seq=1e-4
)
V2 = CostModel(  # every cost model v2 term non-zero
    prefill_pass_overhead=2e-3,
    prefill_per_token=2e-5,
    decode_step_base=1e-2,
    decode_per_seq=1e-4,
    decode_per_kv_token=2e-8,
    prefill_per_pair=1e-9,
    fusion_penalty=0.25,
    batch_attention_per_pair=1e-9,
)


def run(policy: str, load: list[Request], cost: CostModel, chunk: int = 128, **kw: int) -> Trace:
    return simulate(policy, load, cost, chunk=chunk, **kw)


def scenario(cost: CostModel, prompt_len: int = 2048, streams: int = 2) -> list[Request]:
    """The lab scenario with the prompt arriving in the middle of a decode step, and live
    streams that outlast the prompt's prefill under every policy (chunks >= 16 tokens)."""
    arrival = cost.prefill_pass(streams * 128) + 1.5 * cost.decode_step(streams, 0)
    busy = arrival + 2 * cost.prefill_pass(prompt_len) + cost.kv_transfer(prompt_len)
    outlast = max(prompt_len // 16, math.ceil(busy / cost.decode_step(streams, 0))) + 64
    return lab_scenario(
        streams=streams, prompt_len=prompt_len, arrival=arrival, stream_output_len=outlast
    )


def seconds(low: float, high: float) -> st.SearchStrategy[float]:
    return st.floats(low, high, allow_nan=False, allow_infinity=False)


@st.composite
def cost_models(draw: st.DrawFn, *, kv: bool = True, link: bool = True) -> CostModel:
    """Cost models spanning a fused-kernel datacenter GPU to an eager laptop."""
    return CostModel(
        prefill_pass_overhead=draw(seconds(1e-4, 5e-2)),
        prefill_per_token=draw(seconds(1e-6, 1e-4)),
        decode_step_base=draw(seconds(1e-3, 5e-2)),
        decode_per_seq=draw(st.sampled_from([0.0, 1e-5, 1e-4])),
        decode_per_kv_token=draw(st.sampled_from([0.0, 1e-9, 1e-7])) if kv else 0.0,
        batch_attention_per_pair=draw(st.sampled_from([0.0, 1e-9, 1e-8])) if kv else 0.0,
        kv_bytes_per_token=draw(st.sampled_from([0.0, 1e3, 1.1e5])) if link else 0.0,
        link_bandwidth=draw(st.sampled_from([math.inf, 1e9, 25e9])) if link else math.inf,
        link_latency=draw(st.sampled_from([0.0, 1e-5, 1e-3])) if link else 0.0,
    )


@st.composite
def loads(draw: st.DrawFn, max_requests: int = 10) -> list[Request]:
    """A handful of requests: bursts (equal arrivals) and gaps (idle time) both happen."""
    count = draw(st.integers(1, max_requests))
    arrivals = draw(
        st.lists(
            st.sampled_from([0.0, 0.001, 0.05, 0.1, 0.3, 1.0, 2.5]), min_size=count, max_size=count
        )
    )
    return [
        Request(
            f"r{i}",
            arrival,
            draw(st.integers(1, 600)),
            draw(st.integers(1, 24)),
        )
        for i, arrival in enumerate(arrivals)
    ]


policies = st.sampled_from(["shared", "coscheduled", "chunked", "disaggregated"])
chunks = st.integers(1, 700)
