"""Named cost models for ``-m sim`` without hardware, each labelled with where its numbers
come from (DESIGN.md, "Cost-model presets"; never presented as measured here)."""

from __future__ import annotations

import dataclasses

from .cost import CostModel


@dataclasses.dataclass(frozen=True, slots=True)
class Preset:
    """A named cost model and where its numbers come from (never measured on this machine)."""

    name: str
    cost: CostModel
    source: str


_QWEN3_06B_KV_BYTES = 28 * 8 * 128 * 2 * 2  # layers x KV heads x head dim x (K, V) x bf16 bytes

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "lab-laptop",
            CostModel(
                prefill_pass_overhead=29.03e-3,
                prefill_per_token=55.2e-6,
                decode_step_base=35.73e-3,
                kv_bytes_per_token=_QWEN3_06B_KV_BYTES,
                link_bandwidth=25e9,
                link_latency=20e-6,
            ),
            "published calibration of the lab's RTX 3080 Ti Laptop 16 GB, Qwen3-0.6B bf16, eager "
            "PyTorch, batch 1; decode cost per cached token refused there (flat within noise "
            "from 128 to 16,384 cached tokens) and recorded as 0. Link: an assumed PCIe 4.0 x16 "
            "(25 GB/s, 20 us), not measured.",
        ),
        Preset(
            "datacenter-illustrative",
            CostModel(
                prefill_pass_overhead=1.0e-3,
                prefill_per_token=10.0e-6,
                decode_step_base=10.0e-3,
                kv_bytes_per_token=_QWEN3_06B_KV_BYTES,
                link_bandwidth=300e9,
                link_latency=10e-6,
            ),
            "ILLUSTRATIVE, measured nowhere: a datacenter GPU with fused kernels (~1 ms pass "
            "overhead, ~10 us per prompt token, ~10 ms decode step; C* ~ 900, the order of "
            "vLLM's defaults). KV bytes for Qwen3-0.6B bf16; link an assumed NVLink-class "
            "300 GB/s, 10 us.",
        ),
    )
}


def get_preset(name: str) -> Preset:
    """The preset called ``name``; ValueError listing the known names otherwise."""
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown cost preset {name!r}; known: {', '.join(PRESETS)}") from None
