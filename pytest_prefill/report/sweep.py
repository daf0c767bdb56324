"""The chunk sweep as a person reads it (tabulate) and as JSON, and the KV-transfer table printed
beside it. Milliseconds here, seconds everywhere else; the rows come from
:mod:`pytest_prefill.plan.sweep`."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tabulate import tabulate

from pytest_prefill._io import json_number
from pytest_prefill.plan.sweep import SweepRow
from pytest_prefill.report.text_table import text_table
from pytest_prefill.units import ms


def times(ratio: float) -> str:
    return "-" if math.isnan(ratio) else f"{ratio:.2f}x"


# What the tables' and the timeline's "GPU-s" is, said where it is printed.
GPU_SECONDS = "GPU-s = seconds the devices were busy, summed over every worker (what a run costs)"

SWEEP_HEADERS = (
    "policy",
    "chunk",
    "TTFT p99 ms",
    "max stall ms",
    "TTFT cost",
    "stall gain",
    "GPU-s",
)


def sweep_table(rows: Sequence[SweepRow]) -> str:
    """The chunk sweep: one row per policy/chunk, shared first (the baseline of the ratios);
    the prefix cache's hit rate and the preemptions when any run had them."""
    body: list[tuple[object, ...]] = [
        (
            r.policy,
            r.chunk if r.chunk is not None else "-",
            ms(r.summary.ttft_p99, 1),
            ms(r.summary.max_stall, 1),
            times(r.ttft_cost),
            times(r.stall_gain),
            f"{r.summary.gpu_seconds:.3f}",
        )
        for r in rows
    ]
    headers: tuple[str, ...] = SWEEP_HEADERS
    if any(r.summary.cached_tokens or r.summary.preemptions for r in rows):
        headers += ("hit rate", "preempted")
        body = [
            (*row, f"{r.summary.hit_rate:.1%}", f"{r.summary.preemptions:,}")
            for row, r in zip(body, rows)
        ]
    return text_table(body, headers)


def sweep_rows_json(rows: Sequence[SweepRow]) -> list[dict[str, object]]:
    """The sweep as JSON-safe dicts (the package's one convention: NaN null, inf "inf")."""
    return [
        {
            "policy": r.policy,
            "chunk": r.chunk,
            "ttft_cost": json_number(r.ttft_cost),
            "stall_gain": json_number(r.stall_gain),
            **{k: json_number(v) for k, v in r.summary.to_dict().items()},
        }
        for r in rows
    ]


# Links for the KV-transfer table: stated assumptions, never measurements.
ASSUMED_LINKS = (("PCIe 4.0 x16", 25e9), ("NVLink-class", 300e9))


def kv_size_table(
    kv_bytes_per_token: float,
    prompt_lens: Sequence[int],
    links: Sequence[tuple[str, float]] = ASSUMED_LINKS,
) -> str:
    """KV cache size per prompt and its transfer time over each (assumed) link bandwidth."""
    headers = (
        "prompt tokens",
        "KV MiB",
        *(f"{name} ms (assumed {bw / 1e9:g} GB/s)" for name, bw in links),
    )
    body = [
        (
            f"{n:,}",
            f"{n * kv_bytes_per_token / 2**20:,.1f}",
            *(ms(n * kv_bytes_per_token / bw, 1) for _, bw in links),
        )
        for n in prompt_lens
    ]
    return tabulate(
        body,
        headers=headers,
        tablefmt="simple",
        disable_numparse=True,
        colalign=("right",) * len(headers),
    )
