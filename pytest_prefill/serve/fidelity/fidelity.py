"""Fidelity against a running server: held-out workloads (``held_out``) measured on the server
and replayed in the simulator with the cost model calibrated from that server, under its
scheduling. The calibration's rounds and the workloads' runs alternate in time (A, B, A, B), so
the machine's drift hits both; TTFT, TPOT, ITL and E2EL (median and p90) are compared; the
run-to-run spread of the measured figures is the noise floor printed beside the error. The
verdict reads the median error over the judged cells with its bootstrap interval over requests
and runs (``fidelity_interval``): HOLDS when the interval is within the threshold, FAILS when it
is over, UNDECIDED when it straddles it. The same measurements are also judged under three
counter-checks — the other first-token rule, a 16x budget, another engine's profile — each on
the cells where its prediction differs from the right one's (``discriminating``: a knob that
moves a few cells is not hidden by the many it leaves alone), with its interval from the same
draws; a counter-check that does not FAIL where the server's scheduling HOLDS means the run
cannot tell that knob apart. Standard library only (the calibration's fit needs numpy)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pytest_prefill._io import json_safe
from pytest_prefill.plan.metrics import serving_metrics_of
from pytest_prefill.serve.calibration.calibration import (
    Samples,
    calibration_round,
    fit_server,
    server_provenance,
)
from pytest_prefill.serve.calibration.server_calibration import ServerCalibration, ServerSweep
from pytest_prefill.serve.calibration.server_model import (
    Scheduling,
    ServerModel,
    server_profile,
    simulate_records,
)
from pytest_prefill.serve.fidelity.fidelity_interval import (
    CellKey,
    Paired,
    interval_of,
    paired_runs,
    resample,
)
from pytest_prefill.serve.fidelity.held_out import ServerWorkload, held_out_workloads
from pytest_prefill.serve.fidelity.judgement import (
    METRICS,
    STATS,
    THRESHOLD,
    TTFT_THRESHOLD,
    Cell,
    CounterCheck,
    Judgement,
    apart,
    discriminating,
    noise_floor,
)
from pytest_prefill.serve.load.loadgen import Bounds, Target, run_load
from pytest_prefill.serve.load.records import BenchRun
from pytest_prefill.sim import PROFILES

Progress = Callable[[str], object]
DEFAULT_RUNS = 2
RIGHT = "the server's scheduling"
DEFAULT_COUNT = 16


def _value(metrics: Any, metric: str, stat: str) -> float:
    dist = getattr(metrics, metric)
    return dist.median if stat == "median" else dist.percentile(float(stat[1:]))


def replay(
    runs: dict[str, list[BenchRun]], server_model: ServerModel
) -> tuple[list[Cell], dict[str, Paired]]:
    """Every (workload, metric, statistic) of ``runs`` against its simulation under
    ``server_model``, and each workload's measured requests paired with their simulated twins
    (what the bootstrap resamples)."""
    cells, paired = [], {}
    for name, measured_runs in runs.items():
        twins = [simulate_records(run.completed, server_model) for run in measured_runs]
        measured = [run.metrics() for run in measured_runs]
        simulated = [serving_metrics_of(t) for t in twins]
        paired[name] = paired_runs(measured_runs, twins)
        for metric in METRICS:
            for stat in STATS:
                cells.append(
                    Cell(
                        name,
                        metric,
                        stat,
                        tuple(_value(m, metric, stat) for m in simulated),
                        tuple(_value(m, metric, stat) for m in measured),
                    )
                )
    return cells, paired


def cells_of(runs: dict[str, list[BenchRun]], server_model: ServerModel) -> list[Cell]:
    """Every (workload, metric, statistic) of ``runs`` against its simulation."""
    return replay(runs, server_model)[0]


@dataclasses.dataclass(frozen=True)
class ServerFidelity:
    """A fidelity run against a server: the calibration, the held-out workloads and their
    measured runs, the cells under the server's scheduling, and the judged error the same runs
    give under each wrong scheduling (``wrong``: label -> its counter-check)."""

    calibration: ServerCalibration
    scheduling: Scheduling
    workloads: tuple[ServerWorkload, ...]
    runs: dict[str, list[BenchRun]]
    cells: tuple[Cell, ...]
    judgement: Judgement
    wrong: dict[str, CounterCheck]

    @property
    def error(self) -> float:
        return self.judgement.error

    @property
    def noise(self) -> float:
        return noise_floor(self.cells)

    @property
    def verdict(self) -> str:
        return self.judgement.verdict

    def cannot_tell(self) -> list[str]:
        """The knobs this run cannot tell apart: with the server's scheduling HOLDS, those whose
        wrong setting does not FAIL either."""
        if self.verdict != "HOLDS":
            return []
        return [knob(label) for label, j in self.wrong.items() if j.verdict != "FAILS"]

    @property
    def fallback(self) -> str | None:
        """The held-out workloads' fallback warning (None: they are what they say)."""
        return next((w.fallback for w in self.workloads if w.fallback), None)

    def to_dict(self) -> dict[str, Any]:
        """Strict JSON (``_io.json_safe``: NaN, e.g. the error when no cell was judged, is
        null)."""
        return json_safe(self._document())

    def _document(self) -> dict[str, Any]:
        return {
            "kind": "pytest-prefill/server-fidelity",
            "schema_version": 2,
            "verdict": self.verdict,
            "judgement": self.judgement.to_dict(),
            "noise_floor": self.noise,
            "scheduling": self.scheduling.to_dict(),
            "wrong_scheduling": {label: c.to_dict() for label, c in self.wrong.items()},
            "cannot_tell": self.cannot_tell(),
            "workload_fallback": self.fallback,
            "cells": [c.to_dict() for c in self.cells],
            "workloads": [
                {"name": w.name, "description": w.description, "attribution": w.attribution}
                for w in self.workloads
            ],
            "runs": {
                name: [{**r.to_dict(), "records": [x.to_dict() for x in r.records]} for r in runs]
                for name, runs in self.runs.items()
            },
            "calibration": self.calibration.to_dict(),
        }


def other_engine(engine: str) -> str:
    """The engine whose profile is the third counter-check: llama.cpp's (4 slots, budget
    2,048), or vLLM's for a llama.cpp server."""
    return "vllm" if engine == "llama.cpp" else "llama.cpp"


def wrong_schedulings(scheduling: Scheduling) -> dict[str, Scheduling]:
    """The mistakes the verdict must catch: the server's profile with one knob replaced (the
    other first-token rule, the lab's for a server; a 16x budget), and another engine's profile
    as it ships (its own budget and sequence cap) on the same KV cache."""
    other = "decode" if scheduling.profile.first_token == "prefill" else "prefill"
    budget = scheduling.budget * 16
    engine = other_engine(scheduling.profile.name)
    shipped = PROFILES[engine]
    profile = server_profile(engine, int(shipped.max_batched_tokens or 2048), shipped.max_seqs)
    return {
        f"first token at {other}": scheduling.replace(first_token=other),
        f"budget {budget:,}": scheduling.replace(max_batched_tokens=budget),
        f"{engine}'s profile": dataclasses.replace(scheduling, profile=profile),
    }


def knob(label: str) -> str:
    """What a wrong scheduling's label changes, in words."""
    if label.startswith("first token"):
        return "the first-token rule"
    if label.startswith("budget"):
        return "the token budget"
    return "the engine profile"


async def run_server_fidelity(
    target: Target,
    sweep: ServerSweep,
    scheduling: Scheduling,
    *,
    runs: int = DEFAULT_RUNS,
    count: int = DEFAULT_COUNT,
    workload: str | None = None,
    progress: Progress | None = None,
    **provenance: Any,
) -> ServerFidelity:
    """Calibration rounds and workload runs alternated ``runs`` times (A, B, A, B, …), then
    the comparison. ``workload``: the held-out lengths' source (``held_out.SOURCES``; None:
    the Azure trace where found, else the fixed mix, loudly).

    Raises:
        ValueError: for ``runs`` < 2 (one run has no spread).
        ServerError: for a failed calibration request.
    """
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise ValueError(f"runs must be an integer >= 2 (the spread needs two), got {runs!r}")
    samples = Samples()
    measured: dict[str, list[BenchRun]] = {}
    workloads: list[ServerWorkload] = []
    first = dataclasses.replace(sweep, repeats=1)
    for index in range(runs):
        await calibration_round(target, sweep, samples, index, progress, rounds=runs)
        if not workloads:
            workloads = held_out_workloads(
                fit_server(samples, first, {}), count=count, source=workload
            )
        for w in workloads:
            renamed = [dataclasses.replace(r, id=f"run{index}-{r.id}") for r in w.requests]
            run = await run_load(target, renamed, bounds=Bounds(warmup=0))
            measured.setdefault(w.name, []).append(run)
            if progress is not None:
                progress(f"run {index + 1}/{runs}: {w.name} ({len(run.completed)} completed)")
    calibration = fit_server(
        samples,
        dataclasses.replace(sweep, repeats=runs),
        server_provenance(target, sweep, **provenance),
    )
    return judge(calibration, scheduling, workloads, measured)


def judged_on(
    cells: Sequence[Cell],
    draws: Sequence[Mapping[CellKey, float]],
    *,
    required: bool = True,
    threshold: float = THRESHOLD,
    ttft_threshold: float = TTFT_THRESHOLD,
) -> Judgement:
    """The judgement over ``cells`` (their judged ones), its intervals from ``draws`` (one
    scheduling's resampled cell errors, ``fidelity_interval.resample``); ``required``: whether
    a TTFT cell must be among them."""
    keys = [c.key for c in cells if c.judged]
    ttft = [k for k in keys if k[1] == "ttft"]
    intervals = (interval_of(draws, keys), interval_of(draws, ttft))
    found = Judgement.of(cells, threshold, ttft_threshold, intervals)
    return dataclasses.replace(found, ttft_required=required)


def counter_check(
    right: Sequence[Cell],
    other: Sequence[Cell],
    right_draws: Sequence[Mapping[CellKey, float]],
    other_draws: Sequence[Mapping[CellKey, float]],
    *,
    threshold: float = THRESHOLD,
    ttft_threshold: float = TTFT_THRESHOLD,
) -> CounterCheck:
    """``other`` (the same cells under a wrong scheduling) judged on the cells where it
    predicts differently from ``right`` (``discriminating``), beside ``right`` on the same
    cells; ``*_draws``: each one's resampled cell errors, from the same draws."""
    keys = set(discriminating(right, other, threshold=threshold, ttft_threshold=ttft_threshold))
    gaps = [g for r, o in zip(right, other) if r.judged and math.isfinite(g := apart(r, o))]
    check = CounterCheck(
        judged_on(other, other_draws, threshold=threshold, ttft_threshold=ttft_threshold),
        tuple(c.key for c in right if c.key in keys),
        max(gaps, default=0.0),
    )
    if not keys:
        return check

    def on(cells: Sequence[Cell], draws: Sequence[Mapping[CellKey, float]]) -> Judgement:
        chosen = [c for c in cells if c.key in keys]
        return judged_on(
            chosen, draws, required=False, threshold=threshold, ttft_threshold=ttft_threshold
        )

    return dataclasses.replace(
        check, judgement=on(other, other_draws), right=on(right, right_draws)
    )


def judge(
    calibration: ServerCalibration,
    scheduling: Scheduling,
    workloads: Sequence[ServerWorkload],
    measured: dict[str, list[BenchRun]],
    *,
    threshold: float = THRESHOLD,
    ttft_threshold: float = TTFT_THRESHOLD,
) -> ServerFidelity:
    """The cells of ``measured`` under ``scheduling`` and the verdict, with its bootstrap
    interval over the judged cells; then each wrong scheduling's counter-check on the cells
    where it predicts differently, its interval and the right one's from the same draws."""
    server_model = ServerModel.of(calibration, scheduling)
    cells, paired = replay(measured, server_model)
    others = {
        label: replay(measured, dataclasses.replace(server_model, scheduling=other))
        for label, other in wrong_schedulings(scheduling).items()
    }
    judged = [c.key for c in cells if c.judged]
    drawn = resample({RIGHT: paired, **{label: p for label, (_, p) in others.items()}}, judged)
    wrong = {
        label: counter_check(
            cells,
            other,
            drawn[RIGHT],
            drawn[label],
            threshold=threshold,
            ttft_threshold=ttft_threshold,
        )
        for label, (other, _) in others.items()
    }
    judgement = judged_on(cells, drawn[RIGHT], threshold=threshold, ttft_threshold=ttft_threshold)
    return ServerFidelity(
        calibration, scheduling, tuple(workloads), measured, tuple(cells), judgement, wrong
    )
