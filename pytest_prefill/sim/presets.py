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

_LAB_LAPTOP_SOURCE = (
    "published calibration of the lab's RTX 3080 Ti Laptop 16 GB, Qwen3-0.6B bf16, eager "
    "PyTorch, batch 1; decode cost per cached token refused there (flat within noise "
    "from 128 to 16,384 cached tokens) and recorded as 0. Link: an assumed PCIe 4.0 x16 "
    "(25 GB/s, 20 us), not measured."
)
_DATACENTER_SOURCE = (
    "ILLUSTRATIVE, measured nowhere: a datacenter GPU with fused kernels (~1 ms pass "
    "overhead, ~10 us per prompt token, ~10 ms decode step; C* ~ 900, the order of "
    "vLLM's defaults). KV bytes for Qwen3-0.6B bf16; link an assumed NVLink-class "
    "300 GB/s, 10 us."
)

# One row a preset, all for Qwen3-0.6B bf16's KV bytes: its name, its CostModel figures in
# _COLUMNS' order (seconds, bytes/s), and where the numbers come from.
_COLUMNS = (
    "prefill_pass_overhead",
    "prefill_per_token",
    "decode_step_base",
    "link_bandwidth",
    "link_latency",
)
_ROWS = (
    ("lab-laptop", (29.03e-3, 55.2e-6, 35.73e-3, 25e9, 20e-6), _LAB_LAPTOP_SOURCE),
    ("datacenter-illustrative", (1.0e-3, 10.0e-6, 10.0e-3, 300e9, 10e-6), _DATACENTER_SOURCE),
)


def _preset(row: tuple[str, tuple[float, ...], str]) -> Preset:
    name, figures, source = row
    cost = CostModel(kv_bytes_per_token=_QWEN3_06B_KV_BYTES, **dict(zip(_COLUMNS, figures)))
    return Preset(name, cost, source)


PRESETS: dict[str, Preset] = {p.name: p for p in map(_preset, _ROWS)}


def get_preset(name: str) -> Preset:
    """The preset called ``name``; ValueError listing the known names otherwise."""
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown cost preset {name!r}; known: {', '.join(PRESETS)}") from None
