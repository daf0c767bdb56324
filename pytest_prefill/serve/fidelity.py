"""Fidelity against a running server: held-out workloads measured on the server and replayed in
the simulator with the cost model calibrated from that server, under its scheduling. The
calibration's rounds and the workloads' runs alternate in time (A, B, A, B), so the machine's
drift hits both; TTFT, TPOT, ITL and E2EL (median and p90) are compared; the run-to-run spread of
the measured figures is the noise floor printed beside the error; the run HOLDS when the median
error over the judged cells is within the threshold. The same measurements are also judged
under the server's engine profile with a wrong first-token rule or a wrong budget: the threshold
is only worth something if those FAIL. Standard library only (the calibration's fit needs numpy)."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from pytest_prefill._io import json_safe
from pytest_prefill.plan.workloads import AZURE_ATTRIBUTION, azure_trace_path, load_azure
from pytest_prefill.serve.calibration import (
    Samples,
    ServerCalibration,
    ServerSweep,
    calibration_round,
    fit_server,
    server_provenance,
)
from pytest_prefill.serve.calibration_fit import ttft_alone
from pytest_prefill.serve.loadgen import Bounds, Target, run_load
from pytest_prefill.serve.records import BenchRun
from pytest_prefill.serve.simulated import Scheduling, simulated_metrics
from pytest_prefill.sim import Request

Progress = Callable[[str], object]
METRICS = ("ttft", "tpot", "itl", "e2el")
STATS = ("median", "p90")
# The verdict: HOLDS when the median |error| over all judged cells is at most THRESHOLD and the
# median |error| of the TTFT cells at most TTFT_THRESHOLD. TTFT is where the scheduling shows
# first: the lab's first-token rule adds a decode step to every TTFT, a budget too large or too
# small changes how many passes (and their overheads) a prompt takes. Chosen from what this box
# showed (docs/fidelity.md, "Fidelity against a server"): quiet runs under the server's scheduling gave a
# TTFT error of a few percent, the same runs under a wrong first-token rule or budget 14-24%.
THRESHOLD = 0.15
TTFT_THRESHOLD = 0.10
# A cell whose measured runs spread (half their range, relative to their median) more than this
# cannot test the model: printed, not judged.
MAX_NOISE = TTFT_THRESHOLD
DEFAULT_RUNS = 2
DEFAULT_COUNT = 16
PROMPT_SCALE = 4  # Azure conv prompts (median ~1,000 tokens) divided by this
OUTPUT_SCALE = 8  # and its outputs (median ~130)
MIN_OUTPUT = 4
LOADS = (0.5, 1.0)  # Poisson rates, in requests per mean service time of one request alone


@dataclasses.dataclass(frozen=True)
class ServerWorkload:
    name: str
    requests: tuple[Request, ...]
    description: str
    attribution: str | None = None


def _lengths(
    path: str | None, max_prompt: int, count: int, seed: int
) -> tuple[list[tuple[int, int]], str]:
    """(prompt, output) pairs from the Azure conv trace scaled down, or a fixed mix without it."""
    if path is not None:
        rows = load_azure(path, limit=4000)
        pairs = [
            (
                min(max(r.prompt_len // PROMPT_SCALE, 16), max_prompt),
                max(r.output_len // OUTPUT_SCALE, MIN_OUTPUT),
            )
            for r in rows
        ]
        source = f"Azure conv lengths / {PROMPT_SCALE} (prompts) and / {OUTPUT_SCALE} (outputs)"
    else:
        pairs = [(p, o) for p in (64, 128, 256, 512) for o in (8, 16, 32)]
        source = "prompts 64-512, outputs 8-32 (no Azure trace here)"
    rng = random.Random(seed)
    return [rng.choice(pairs) for _ in range(count)], source


def service_time(calibration: ServerCalibration, pairs: Sequence[tuple[int, int]]) -> float:
    """Mean seconds one request of ``pairs`` takes alone, by the calibration."""
    cost, budget = calibration.cost, calibration.sweep.budget
    times = [
        ttft_alone(cost, calibration.overhead.total, p, budget)
        + (o - 1) * cost.decode_step(1, p + o // 2)
        for p, o in pairs
    ]
    return statistics.mean(times)


def held_out_workloads(
    calibration: ServerCalibration,
    *,
    count: int = DEFAULT_COUNT,
    seed: int = 7,
    max_prompt: int = 2048,
) -> list[ServerWorkload]:
    """Poisson arrivals at ``LOADS`` (requests per mean service time) and a window of the
    Azure conv trace's own arrival times rescaled to the higher load, with Azure conv lengths
    scaled down; none of them is a request the calibration sent."""
    path = azure_trace_path("conv")
    pairs, source = _lengths(path, max_prompt, count, seed)
    service = service_time(calibration, pairs)
    workloads = []
    for load in LOADS:
        rate = load / service
        rng = random.Random(seed + int(load * 100))
        t, requests = 0.0, []
        for i, (p, o) in enumerate(pairs):
            requests.append(Request(f"poisson{load:g}-{i}", t, p, o))
            t += rng.expovariate(rate)
        workloads.append(
            ServerWorkload(
                f"poisson x{load:g}",
                tuple(requests),
                f"{count} Poisson arrivals at {rate:.2f} req/s; {source}",
            )
        )
    if path is not None:
        window = load_azure(path, start=600.0, limit=count)
        span = window[-1].arrival - window[0].arrival
        scale = (len(window) - 1) / span / (max(LOADS) / service) if span > 0 else 1.0
        requests = [
            Request(f"azure-{r.id}", (r.arrival - window[0].arrival) * scale, *pair)
            for r, pair in zip(window, _scaled(window, max_prompt))
        ]
        workloads.append(
            ServerWorkload(
                "azure-conv window",
                tuple(requests),
                f"{count} requests from 600 s into azure-conv, its arrival times rescaled to "
                f"{max(LOADS) / service:.2f} req/s, lengths scaled as above",
                AZURE_ATTRIBUTION,
            )
        )
    return workloads


def _scaled(rows: Sequence[Request], max_prompt: int) -> list[tuple[int, int]]:
    return [
        (
            min(max(r.prompt_len // PROMPT_SCALE, 16), max_prompt),
            max(r.output_len // OUTPUT_SCALE, MIN_OUTPUT),
        )
        for r in rows
    ]


@dataclasses.dataclass(frozen=True)
class Cell:
    """One (workload, metric, statistic): the simulated value and the measured runs (seconds),
    both medians over the runs (each run simulated with its own send times)."""

    workload: str
    metric: str
    stat: str
    simulated: tuple[float, ...]
    measured: tuple[float, ...]

    @property
    def simulated_value(self) -> float:
        return statistics.median(self.simulated)

    @property
    def measured_value(self) -> float:
        return statistics.median(self.measured)

    @property
    def error(self) -> float:
        m = self.measured_value
        return (self.simulated_value - m) / m if m > 0 else math.nan

    @property
    def noise(self) -> float:
        """Half the measured runs' range over their median: the run-to-run spread."""
        m = self.measured_value
        return (max(self.measured) - min(self.measured)) / 2 / m if m > 0 else math.nan

    @property
    def judged(self) -> bool:
        return math.isfinite(self.error) and self.noise <= MAX_NOISE

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "metric": self.metric,
            "stat": self.stat,
            "simulated": self.simulated_value,
            "measured": self.measured_value,
            "measured_runs": list(self.measured),
            "error": self.error,
            "noise": self.noise,
            "judged": self.judged,
        }


def _value(metrics: Any, metric: str, stat: str) -> float:
    dist = getattr(metrics, metric)
    return dist.median if stat == "median" else dist.percentile(float(stat[1:]))


def cells_of(
    runs: dict[str, list[BenchRun]], calibration: ServerCalibration, scheduling: Scheduling
) -> list[Cell]:
    """Every (workload, metric, statistic) of ``runs`` against its simulation."""
    cells = []
    for name, measured_runs in runs.items():
        measured = [run.metrics() for run in measured_runs]
        simulated = [
            simulated_metrics(run.completed, calibration.cost, calibration.overhead, scheduling)
            for run in measured_runs
        ]
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
    return cells


def judged_error(cells: Sequence[Cell], metric: str | None = None) -> float:
    """Median |error| over the judged cells (of ``metric`` only, when given; NaN when none is
    judged)."""
    errors = [abs(c.error) for c in cells if c.judged and metric in (None, c.metric)]
    return statistics.median(errors) if errors else math.nan


@dataclasses.dataclass(frozen=True)
class Judgement:
    """The two figures the verdict reads: the median |error| over all judged cells and over
    the judged TTFT cells."""

    error: float
    ttft_error: float
    threshold: float = THRESHOLD
    ttft_threshold: float = TTFT_THRESHOLD

    @classmethod
    def of(
        cls,
        cells: Sequence[Cell],
        threshold: float = THRESHOLD,
        ttft_threshold: float = TTFT_THRESHOLD,
    ) -> Judgement:
        return cls(judged_error(cells), judged_error(cells, "ttft"), threshold, ttft_threshold)

    @property
    def verdict(self) -> str:
        ok = self.error <= self.threshold and self.ttft_error <= self.ttft_threshold
        return "HOLDS" if ok else "FAILS"

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "verdict": self.verdict}


def noise_floor(cells: Sequence[Cell]) -> float:
    """Median run-to-run spread over the cells."""
    spreads = [c.noise for c in cells if math.isfinite(c.noise)]
    return statistics.median(spreads) if spreads else math.nan


@dataclasses.dataclass(frozen=True)
class ServerFidelity:
    """A fidelity run against a server: the calibration, the held-out workloads and their
    measured runs, the cells under the server's scheduling, and the judged error the same runs
    give under each wrong scheduling (``wrong``: label -> error)."""

    calibration: ServerCalibration
    scheduling: Scheduling
    workloads: tuple[ServerWorkload, ...]
    runs: dict[str, list[BenchRun]]
    cells: tuple[Cell, ...]
    judgement: Judgement
    wrong: dict[str, Judgement]

    @property
    def error(self) -> float:
        return self.judgement.error

    @property
    def noise(self) -> float:
        return noise_floor(self.cells)

    @property
    def verdict(self) -> str:
        return self.judgement.verdict

    def to_dict(self) -> dict[str, Any]:
        """Strict JSON (``_io.json_safe``: NaN, e.g. the error when no cell was judged, is
        null)."""
        return json_safe(self._document())

    def _document(self) -> dict[str, Any]:
        return {
            "kind": "pytest-prefill/server-fidelity",
            "schema_version": 1,
            "verdict": self.verdict,
            "judgement": self.judgement.to_dict(),
            "noise_floor": self.noise,
            "scheduling": self.scheduling.to_dict(),
            "wrong_scheduling": {label: j.to_dict() for label, j in self.wrong.items()},
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


def wrong_schedulings(scheduling: Scheduling) -> dict[str, Scheduling]:
    """The mistakes the verdict must catch, as the server's profile with one knob replaced:
    the other first-token rule (the lab's, for a server), a 16x budget."""
    other = "decode" if scheduling.profile.first_token == "prefill" else "prefill"
    budget = scheduling.budget * 16
    return {
        f"first token at {other}": scheduling.replace(first_token=other),
        f"budget {budget:,}": scheduling.replace(max_batched_tokens=budget),
    }


async def run_server_fidelity(
    target: Target,
    sweep: ServerSweep,
    scheduling: Scheduling,
    *,
    runs: int = DEFAULT_RUNS,
    count: int = DEFAULT_COUNT,
    progress: Progress | None = None,
    **provenance: Any,
) -> ServerFidelity:
    """Calibration rounds and workload runs alternated ``runs`` times (A, B, A, B, …), then
    the comparison.

    Raises:
        ValueError: for ``runs`` < 2 (one run has no spread) or a failed calibration request.
    """
    if isinstance(runs, bool) or not isinstance(runs, int) or runs < 2:
        raise ValueError(f"runs must be an integer >= 2 (the spread needs two), got {runs!r}")
    samples = Samples()
    measured: dict[str, list[BenchRun]] = {}
    workloads: list[ServerWorkload] = []
    first = dataclasses.replace(sweep, repeats=1)
    for index in range(runs):
        await calibration_round(target, sweep, samples, index, progress)
        if not workloads:
            workloads = held_out_workloads(fit_server(samples, first, {}), count=count)
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


def judge(
    calibration: ServerCalibration,
    scheduling: Scheduling,
    workloads: Sequence[ServerWorkload],
    measured: dict[str, list[BenchRun]],
    *,
    threshold: float = THRESHOLD,
    ttft_threshold: float = TTFT_THRESHOLD,
) -> ServerFidelity:
    """The cells of ``measured`` under ``scheduling`` and the verdicts, also under each wrong
    scheduling."""
    cells = cells_of(measured, calibration, scheduling)
    wrong = {
        label: Judgement.of(cells_of(measured, calibration, other), threshold, ttft_threshold)
        for label, other in wrong_schedulings(scheduling).items()
    }
    judgement = Judgement.of(cells, threshold, ttft_threshold)
    return ServerFidelity(
        calibration, scheduling, tuple(workloads), measured, tuple(cells), judgement, wrong
    )
