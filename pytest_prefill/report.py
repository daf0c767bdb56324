"""Tables a person can read (tabulate), built from the simulator's and the calibrator's
results. Times are printed in milliseconds; every table says where its numbers come from."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tabulate import tabulate

from pytest_prefill.whatif import SweepRow


def ms(seconds: float) -> str:
    """Seconds as milliseconds for a table cell ("-" for NaN)."""
    return "-" if math.isnan(seconds) else f"{seconds * 1e3:,.1f}"


def times(ratio: float) -> str:
    return "-" if math.isnan(ratio) else f"{ratio:.2f}x"


SWEEP_HEADERS = ("policy", "chunk", "TTFT p99 ms", "max stall ms", "TTFT cost", "stall gain",
                 "GPU-s")


def sweep_table(rows: Sequence[SweepRow]) -> str:
    """The chunk sweep: one row per policy/chunk, shared first (the baseline of the ratios)."""
    body = [
        (r.policy, r.chunk if r.chunk is not None else "-", ms(r.summary.ttft_p99),
         ms(r.summary.max_stall), times(r.ttft_cost), times(r.stall_gain),
         f"{r.summary.gpu_seconds:.3f}")
        for r in rows
    ]
    return tabulate(body, headers=SWEEP_HEADERS, tablefmt="simple", disable_numparse=True,
                    colalign=("left",) + ("right",) * (len(SWEEP_HEADERS) - 1))


def sweep_rows_json(rows: Sequence[SweepRow]) -> list[dict[str, object]]:
    """The sweep as JSON-safe dicts (NaN becomes null)."""

    def clean(value: float) -> float | None:
        return None if isinstance(value, float) and not math.isfinite(value) else value

    return [
        {"policy": r.policy, "chunk": r.chunk, "ttft_cost": clean(r.ttft_cost),
         "stall_gain": clean(r.stall_gain),
         **{k: clean(v) for k, v in r.summary.as_dict().items()}}  # type: ignore[arg-type]
        for r in rows
    ]
