"""A prefix cache checked on a server: a run whose requests carry hash ids (sent as shared
leading blocks, ``loadgen.Target.prefix_block_tokens``) set beside the simulator's replay of the
same requests at the same send times: the hit rate the server's ``/metrics`` counted (prefix
tokens hit over tokens queried) against the simulated one (prompt tokens the cache supplied over
prompt tokens), preemptions, and TTFT measured and simulated. Standard library only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from pytest_prefill.plan.metrics import serving_metrics, serving_metrics_of
from pytest_prefill.serve.calibration.server_calibration import ServerCalibration
from pytest_prefill.serve.calibration.server_model import Scheduling, ServerModel, simulate_run
from pytest_prefill.serve.load.records import BenchRun
from pytest_prefill.sim import Request


@dataclasses.dataclass(frozen=True)
class PrefixCheck:
    """Server and simulator side by side (NaN / None where a side has no figure)."""

    server_hit_rate: float
    simulated_hit_rate: float
    server_preemptions: float | None
    simulated_preemptions: int | None
    measured_ttft: tuple[float, float]  # median, p90 (seconds)
    simulated_ttft: tuple[float, float]
    requests: int

    @property
    def hit_rate_gap(self) -> float:
        """Simulated minus server hit rate, in points of a fraction (NaN without both)."""
        return self.simulated_hit_rate - self.server_hit_rate

    def line(self) -> str:
        def pct(v: float) -> str:
            return f"{v:.1%}" if math.isfinite(v) else "-"

        m, s = self.measured_ttft, self.simulated_ttft
        return (
            f"{self.requests} requests: prefix-cache hit rate server {pct(self.server_hit_rate)} "
            f"(/metrics), simulated {pct(self.simulated_hit_rate)}; preemptions server "
            f"{'-' if self.server_preemptions is None else f'{self.server_preemptions:.0f}'}, "
            f"simulated {'-' if self.simulated_preemptions is None else self.simulated_preemptions}"
            f"; TTFT median/p90 measured {m[0] * 1e3:.0f}/{m[1] * 1e3:.0f} ms, simulated "
            f"{s[0] * 1e3:.0f}/{s[1] * 1e3:.0f} ms"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "hit_rate_gap": self.hit_rate_gap}


def prefix_check(
    run: BenchRun,
    load: Sequence[Request],
    calibration: ServerCalibration,
    scheduling: Scheduling,
) -> PrefixCheck:
    """``run`` (of ``load``'s requests, by id) against its replay under ``scheduling`` with
    ``load``'s hash ids (the profile's prefix cache at the trace's block size)."""
    blocks = {r.id: r.prefix_blocks for r in load if r.prefix_blocks}
    completed = run.completed
    twins, trace = simulate_run(completed, ServerModel.of(calibration, scheduling), blocks)
    simulated = serving_metrics(trace)
    measured = serving_metrics_of(completed)
    twin_metrics = serving_metrics_of(twins)
    counters = run.server_counters
    return PrefixCheck(
        counters.hit_rate if counters is not None else math.nan,
        simulated.hit_rate,
        counters.delta("preemptions") if counters is not None else None,
        simulated.preemptions,
        (measured.ttft.median, measured.ttft.percentile(90.0)),
        (twin_metrics.ttft.median, twin_metrics.ttft.percentile(90.0)),
        len(completed),
    )
