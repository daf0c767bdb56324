"""Fidelity: run scenarios for real on the engine and in the simulator with a cost model
calibrated on that same engine, and set the simulator's error against the measured run-to-run
spread. Also tests the cost model's fused-iteration formula against measured fused passes.
Nothing here prints (progress goes to a callable); torch is imported lazily."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import os
import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from pytest_prefill.invariants import iteration_cost
from pytest_prefill.scheduler import POLICIES, CostModel, Request, simulate

KIND = "pytest-prefill/fidelity"
SCHEMA_VERSION = 1
# The benchmark fails when the median |relative error| over every (scenario, policy, metric)
# cell exceeds this.
THRESHOLD = 0.10
METRICS = ("ttft_p50", "ttft_p99", "max_stall", "makespan", "gpu_seconds")
MIN_RUNS = 3
DEFAULT_PROMPT_LENS = (256, 1024, 2048)
DEFAULT_CHUNK = 256
POISSON_COUNT = 8
POISSON_UTILIZATION = 0.5  # offered load: arrival rate x simulated service time per request
POISSON_MAX_SPAN = 2.0  # seconds: the arrival rate is raised if needed to keep runs short
AZURE_OUTPUT_SCALE = 8  # Azure conv outputs (median ~240 tokens) divided by this
LINK_PROMPT_LENS = (128, 512, 2048)
# Fused iterations measured directly: (prompt tokens, their context, decode rows); each decode
# row holds FUSED_ROW_CONTEXT cached tokens.
FUSED_GRID = tuple((t, c, n) for t in (32, 256) for c in (0, 1024) for n in (1, 4))
FUSED_ROW_CONTEXT = 256

Progress = Callable[[str], object]


def _say(progress: Progress | None, text: str) -> None:
    if progress is not None:
        progress(text)


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    load: tuple[Request, ...]
    note: str


@dataclasses.dataclass(frozen=True)
class Cell:
    """One (scenario, policy, metric): the simulated value and the measured runs (seconds)."""

    scenario: str
    policy: str
    metric: str
    simulated: float
    runs: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def minimum(self) -> float:
        return min(self.runs)

    @property
    def maximum(self) -> float:
        return max(self.runs)

    @property
    def relative_error(self) -> float:
        """(simulated - measured median) / measured median."""
        return (self.simulated - self.median) / self.median if self.median > 0 else math.nan

    @property
    def spread(self) -> float:
        """Run-to-run spread relative to the median: (max - min) / median."""
        return (self.maximum - self.minimum) / self.median if self.median > 0 else math.nan

    @property
    def within_spread(self) -> bool:
        return self.minimum <= self.simulated <= self.maximum

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "policy": self.policy,
            "metric": self.metric,
            "simulated": self.simulated,
            "measured_median": self.median,
            "measured_min": self.minimum,
            "measured_max": self.maximum,
            "runs": list(self.runs),
            "relative_error": _json(self.relative_error),
            "spread": _json(self.spread),
            "within_spread": self.within_spread,
        }


def _json(value: float) -> float | None:
    return value if math.isfinite(value) else None


def percentiles(values: Sequence[float]) -> dict[str, float | int]:
    """Median and nearest-rank 10th/90th percentiles of ``values`` (and how many)."""
    ordered = sorted(values)
    pick = lambda p: ordered[min(len(ordered) - 1, max(0, math.ceil(p * len(ordered)) - 1))]  # noqa: E731
    return {
        "median": statistics.median(ordered),
        "p10": pick(0.1),
        "p90": pick(0.9),
        "count": len(ordered),
    }


@dataclasses.dataclass(frozen=True)
class FusedPoint:
    """A fused pass (a ``tokens``-token chunk over ``context`` cached positions plus ``rows``
    decode rows reading ``kv_tokens``) measured directly, beside its two parts measured alone,
    what each combination rule predicts from those parts, and the fitted cost model's value."""

    tokens: int
    context: int
    rows: int
    kv_tokens: int
    fused: Any  # Measurement
    chunk_alone: Any
    decode_alone: Any
    predictions: Mapping[str, float]
    cost_model: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "context": self.context,
            "rows": self.rows,
            "kv_tokens": self.kv_tokens,
            "fused": self.fused.to_dict(),
            "chunk_alone": self.chunk_alone.to_dict(),
            "decode_alone": self.decode_alone.to_dict(),
            "predictions": dict(self.predictions),
            "cost_model": self.cost_model,
        }


MAX_RULE = "max of parts (cost model's rule)"
SUM_RULE = "sum of parts (unfused)"
ONE_OVERHEAD_RULE = "sum - one pass overhead"


def fused_rules(chunk: float, decode: float, overhead: float) -> dict[str, float]:
    """What a fused pass costs by each combination rule, from its parts measured alone.

    ``overhead`` is the cost of the emptiest pass (one decode row over one cached token): what
    fusing two passes into one saves at most."""
    return {
        MAX_RULE: max(chunk, decode),
        SUM_RULE: chunk + decode,
        ONE_OVERHEAD_RULE: max(chunk, decode, chunk + decode - overhead),
    }


def measure_fused(
    runner: Any,
    cost: CostModel,
    *,
    repeats: int,
    warmup: int,
    grid: Sequence[tuple[int, int, int]] = FUSED_GRID,
    row_context: int = FUSED_ROW_CONTEXT,
    progress: Progress | None = None,
) -> list[FusedPoint]:
    """Time fused chunk + decode-row passes on the engine, and each part alone, so that the
    combination rule is tested on measurements rather than on the fitted constants."""
    empty = runner.time_decode([1], repeats=repeats, warmup=warmup).median
    points = []
    for tokens, context, rows in grid:
        caches = [row_context] * rows
        fused = runner.time_fused(tokens, context, caches, repeats=repeats, warmup=warmup)
        chunk = runner.time_chunk(tokens, context, repeats=repeats, warmup=warmup)
        decode = runner.time_decode(caches, repeats=repeats, warmup=warmup)
        kv = row_context * rows
        _say(
            progress,
            f"fused {tokens} tokens over {context} + {rows} decode rows: "
            f"{fused.median * 1e3:.2f} ms (chunk alone {chunk.median * 1e3:.2f}, "
            f"decode alone {decode.median * 1e3:.2f})",
        )
        points.append(
            FusedPoint(
                tokens,
                context,
                rows,
                kv,
                fused,
                chunk,
                decode,
                fused_rules(chunk.median, decode.median, empty),
                cost.fused_iteration(tokens, rows, kv, context),
            )
        )
    return points


def fused_errors(points: Sequence[FusedPoint]) -> dict[str, float]:
    """Median |relative error| of each rule (and of the fitted cost model) over the points."""
    if not points:
        return {}
    names = list(points[0].predictions)
    errors = {
        name: statistics.median(
            abs(p.predictions[name] - p.fused.median) / p.fused.median for p in points
        )
        for name in names
    }
    errors["fitted cost model"] = statistics.median(
        abs(p.cost_model - p.fused.median) / p.fused.median for p in points
    )
    return errors


def prefill_shape(calibration: Any) -> list[tuple[int, float, float, float]]:
    """For each prefill length the calibration measured: (tokens, measured median, the fitted
    cost model's pass, a least-squares fit of overhead + a*T + b*T^2). The T^2 term is
    attention within the prompt, which the cost model does not have."""
    import numpy as np

    points = sorted(calibration.points("prefill"), key=lambda p: p.x)
    xs = np.array([p.x for p in points], dtype=float)
    ys = np.array([p.measurement.median for p in points])
    design = np.stack([np.ones_like(xs), xs, xs * xs], axis=1)
    coef, *_ = np.linalg.lstsq(design, ys, rcond=None)
    cost = calibration.cost
    return [
        (int(x), float(y), cost.prefill_pass(int(x)), float(coef @ [1.0, x, x * x]))
        for x, y in zip(xs, ys)  # noqa: B905
    ]


def iteration_errors(trace: Any, cost: CostModel) -> dict[str, list[float]]:
    """Per iteration kind, (measured - predicted) / predicted for every iteration of a real
    run, the prediction being the cost model's for that exact composition: separates the cost
    model's error from the scheduling's (which the fake-clock engine shows to be exact)."""
    out: dict[str, list[float]] = {}
    for e in trace.events:
        predicted = iteration_cost(e, cost)
        if predicted > 0:
            out.setdefault(e.kind, []).append((e.duration - predicted) / predicted)
    return out


@dataclasses.dataclass(frozen=True)
class Link:
    """The KV link measured: copies into shared memory, fitted as latency + bytes / bandwidth."""

    latency: float
    bandwidth: float
    points: tuple[tuple[int, Any], ...]  # (bytes, Measurement)
    note: str


def measure_link(
    packed: Any, *, repeats: int, warmup: int, prompt_lens: Sequence[int] = LINK_PROMPT_LENS
) -> Link:
    """Time what the disaggregated engine's link does: copy a prompt's KV cache into a buffer
    in shared memory. Fit latency and bandwidth over several prompt lengths."""
    from pytest_prefill.timing import fit_line, measure

    points = []
    for n in prompt_lens:
        src = packed.new_cache(n)
        src.length = n
        src.data.normal_()
        dst = packed.new_cache(n + 1, shared=True).data

        def copy(source: Any = src, target: Any = dst, tokens: int = n) -> None:
            target[:, :, :, :tokens].copy_(source.filled())

        m = measure(copy, repeats=repeats, warmup=warmup)
        points.append((n * packed.kv_bytes_per_token, m))
    fit = fit_line(
        [b for b, _ in points],
        [m.median for _, m in points],
        [m.iqr for _, m in points],
        unit="ms",
        x_unit="byte",
    )
    if fit.refused or fit.slope <= 0:
        latency = statistics.median(m.median for _, m in points)
        return Link(
            latency,
            math.inf,
            tuple(points),
            f"bandwidth refused ({fit.reason}); latency = median copy time",
        )
    latency = max(fit.intercept, 0.0)
    return Link(
        latency, 1.0 / fit.slope, tuple(points), f"fitted over prompt lengths {list(prompt_lens)}"
    )


@contextlib.contextmanager
def pinned(cores: Sequence[int], threads: int) -> Iterator[None]:
    """Run the body on ``cores`` with ``threads`` torch threads (CPU), then restore both."""
    import torch

    before = (os.sched_getaffinity(0), torch.get_num_threads())
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before[0])
        torch.set_num_threads(before[1])


def scenarios(
    cost: CostModel,
    *,
    prompt_lens: Sequence[int] = DEFAULT_PROMPT_LENS,
    azure: bool = True,
    seed: int = 0,
    count: int = POISSON_COUNT,
) -> tuple[list[Scenario], list[str]]:
    """The lab scenario at each prompt length, and a Poisson load with Azure conv lengths.
    Returns the scenarios and the reasons for any that were skipped."""
    from pytest_prefill.workloads import azure_trace_path, lab_scenario, load_azure, poisson

    out = [
        Scenario(
            f"lab {n}",
            tuple(lab_scenario(prompt_len=n)),
            f"2 live streams (128-token prompts, 256 tokens each) decoding; a {n}-token "
            "prompt (32 tokens out) arrives at 100 ms",
        )
        for n in prompt_lens
    ]
    skipped = []
    path = azure_trace_path("conv") if azure else None
    if not azure:
        skipped.append("Poisson/Azure scenario not asked for")
    elif path is None:
        skipped.append(
            "Poisson/Azure scenario skipped: the Azure conv trace is not in "
            "shared/data/azure-llm-inference-2023 (set PYTEST_PREFILL_AZURE_DIR)"
        )
    else:
        top = max(prompt_lens)
        trace = load_azure(path, limit=2000)
        prompts = [min(r.prompt_len, top) for r in trace]
        outputs = [max(1, round(r.output_len / AZURE_OUTPUT_SCALE)) for r in trace]
        service = statistics.mean(
            cost.prefill_pass(p) + o * cost.decode_step_base
            for p, o in zip(prompts, outputs)  # noqa: B905
        )
        rate = max(POISSON_UTILIZATION / service, count / POISSON_MAX_SPAN)
        load = poisson(rate, count, prompt_len=prompts, output_len=outputs, seed=seed)
        out.append(
            Scenario(
                "poisson azure",
                tuple(load),
                f"{count} Poisson arrivals at {rate:.2f}/s ({rate * service:.0%} offered load "
                f"by the simulator: {POISSON_UTILIZATION:.0%}, or more to keep the arrivals within "
                f"{POISSON_MAX_SPAN:.0f} s); prompt and output lengths drawn from the first "
                f"2,000 Azure conv "
                f"requests, prompts capped at {top}, outputs divided by {AZURE_OUTPUT_SCALE}",
            )
        )
    return out, skipped


def calibrate_engine(
    loaded: Any,
    *,
    repeats: int,
    warmup: int,
    dry_run: bool,
    progress: Progress | None = None,
    prompt_lens: Sequence[int] | None = None,
    link: Link | None = None,
    seed: int = 0,
    **extra: Any,
) -> Any:
    """The calibrator (``calibrate.calibrate``: its sweeps, fits and refusals) with the
    engine's packed pass as its runner, in the current core and thread setting. The cost model
    also carries the measured ``link`` when given; ``extra`` goes into the provenance."""
    from pytest_prefill.calibrate import calibrate
    from pytest_prefill.packed import PackedRunner

    calibration = calibrate(
        loaded,
        repeats=repeats,
        warmup=warmup,
        dry_run=dry_run,
        progress=progress,
        prompt_lens=prompt_lens,
        seed=seed,
        runner=PackedRunner(loaded.model, seed=seed),
    )
    cost, info = calibration.cost, {**calibration.provenance, **extra}
    if link is not None:
        cost = dataclasses.replace(cost, link_latency=link.latency, link_bandwidth=link.bandwidth)
        info["link"] = f"measured shared-memory copy: {link.note}"
    return dataclasses.replace(calibration, cost=cost, provenance=info)


def calibrate_workers(
    loaded: Any,
    pool: Any,
    *,
    repeats: int,
    warmup: int,
    dry_run: bool,
    link: Link,
    prompt_lens: Sequence[int],
    seed: int = 0,
    progress: Progress | None = None,
) -> Any:
    """The disaggregated workers' cost model: the calibrator's sweeps run by the workers
    themselves (prefill passes on the prefill worker, decode steps on the decode worker, both
    at once, each on its own cores), fitted by the calibrator, plus the measured ``link``."""
    from pytest_prefill import calibrate as cal

    caches = tuple(sorted({min(n, loaded.max_context - 1) for n in cal.DEFAULT_CACHE_LENS}))
    points = pool.calibration_points(
        prompt_lens=prompt_lens,
        cache_lens=caches,
        batch_sizes=cal.DEFAULT_BATCH_SIZES,
        batch_context=cal.BATCH_CACHE_LEN,
        repeats=repeats,
        warmup=warmup,
        seed=seed,
    )
    for p in points:
        m = p.measurement
        _say(
            progress,
            f"worker {p.kind} x={p.x}: {m.median * 1e3:.2f} ms "
            f"[{m.minimum * 1e3:.2f}, {m.maximum * 1e3:.2f}]",
        )
    cost, fits, refusals = cal.fit_cost_model(points, kv_bytes_per_token=loaded.kv_bytes_per_token)
    cost = dataclasses.replace(cost, link_latency=link.latency, link_bandwidth=link.bandwidth)
    info = cal.provenance(
        loaded,
        repeats=repeats,
        warmup=warmup,
        dry_run=dry_run,
        seed=seed,
        runner="engine packed pass, inside the disaggregated worker processes",
        setup=pool.setup,
        prompt_lens=list(prompt_lens),
        cache_lens=list(caches),
        batch_sizes=list(cal.DEFAULT_BATCH_SIZES),
        batch_context=cal.BATCH_CACHE_LEN,
        link=f"measured shared-memory copy: {link.note}",
    )
    return cal.Calibration(cost, info, tuple(points), fits, tuple(refusals))


@dataclasses.dataclass(frozen=True)
class FidelityResult:
    """Everything a fidelity run measured and predicted."""

    cells: tuple[Cell, ...]
    scenarios: tuple[Scenario, ...]
    skipped: tuple[str, ...]
    calibrations: Mapping[str, Any]  # "single worker", "disaggregated worker" -> Calibration
    link: Link
    fused: tuple[FusedPoint, ...]
    transfers: tuple[float, ...]  # every measured KV transfer, seconds
    setups: Mapping[str, str]  # policy -> how the machine was used
    chunk: int
    runs: int
    provenance: Mapping[str, Any]
    iterations: Mapping[str, Mapping[str, tuple[float, ...]]] = dataclasses.field(
        default_factory=dict
    )  # policy -> iteration kind -> relative error of every real iteration vs. the cost model

    @property
    def median_abs_error(self) -> float:
        errors = [abs(c.relative_error) for c in self.cells if math.isfinite(c.relative_error)]
        return statistics.median(errors) if errors else math.nan

    @property
    def passed(self) -> bool:
        return self.median_abs_error <= THRESHOLD

    def by(self, field: str) -> dict[str, float]:
        """Median |relative error| grouped by ``field`` (scenario, policy or metric)."""
        groups: dict[str, list[float]] = {}
        for c in self.cells:
            if math.isfinite(c.relative_error):
                groups.setdefault(getattr(c, field), []).append(abs(c.relative_error))
        return {k: statistics.median(v) for k, v in groups.items()}

    def weakest(self, n: int = 5) -> list[Cell]:
        finite = [c for c in self.cells if math.isfinite(c.relative_error)]
        return sorted(finite, key=lambda c: -abs(c.relative_error))[:n]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "schema_version": SCHEMA_VERSION,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "threshold": THRESHOLD,
            "median_abs_relative_error": _json(self.median_abs_error),
            "passed": self.passed,
            "chunk": self.chunk,
            "runs": self.runs,
            "provenance": dict(self.provenance),
            "setups": dict(self.setups),
            "scenarios": [
                {
                    "name": s.name,
                    "note": s.note,
                    "requests": [dataclasses.asdict(r) for r in s.load],
                }
                for s in self.scenarios
            ],
            "skipped": list(self.skipped),
            "cells": [c.to_dict() for c in self.cells],
            "error_by_policy": self.by("policy"),
            "error_by_metric": self.by("metric"),
            "error_by_scenario": self.by("scenario"),
            "calibrations": {k: v.to_dict() for k, v in self.calibrations.items()},
            "link": {
                "latency": self.link.latency,
                "bandwidth": _json(self.link.bandwidth),
                "note": self.link.note,
                "points": [{"bytes": b, "measurement": m.to_dict()} for b, m in self.link.points],
            },
            "transfers": list(self.transfers),
            "iteration_errors": {
                policy: {kind: percentiles(v) for kind, v in kinds.items()}
                for policy, kinds in self.iterations.items()
            },
            "fused": [p.to_dict() for p in self.fused],
            "fused_formula_errors": fused_errors(self.fused),
            "prefill_shape": {
                name: [
                    {"tokens": t, "measured": m, "cost_model": lin, "with_t_squared": quad}
                    for t, m, lin, quad in prefill_shape(c)
                ]
                for name, c in self.calibrations.items()
            },
        }


def run_fidelity(
    loaded: Any,
    *,
    runs: int = MIN_RUNS,
    chunk: int = DEFAULT_CHUNK,
    prompt_lens: Sequence[int] = DEFAULT_PROMPT_LENS,
    repeats: int | None = None,
    warmup: int | None = None,
    dry_run: bool = False,
    azure: bool = True,
    cores: Sequence[int] | None = None,
    threads: int | None = None,
    seed: int = 0,
    progress: Progress | None = None,
) -> FidelityResult:
    """Calibrate on the engine, run every scenario under every policy ``runs`` times for real,
    simulate each with the engine-calibrated cost model, and compare.

    Equal total resources: single-worker policies may use all ``cores`` (default: every core
    this process may use) with ``threads`` torch threads (default 1: on a small shared CPU,
    intra-op threads over a tiny model's matrices stall whenever another process holds a core;
    pass ``threads=len(cores)`` to use them) and are simulated with a cost model calibrated
    that way; disaggregation runs its two processes on disjoint halves of the cores, one
    thread per core, and is simulated with a cost model the two worker processes calibrate
    themselves (prefill passes on one, decode steps on the other) just before the runs.

    Raises:
        ValueError: for runs < 3, a non-positive chunk or prompt length, a model the packed
            pass does not support, a non-CPU device (disaggregation runs on CPU here), or fewer
            than two cores.
    """
    from pytest_prefill import calibrate as cal
    from pytest_prefill.disagg import DisaggregatedWorkers, split_cores
    from pytest_prefill.engine import execute
    from pytest_prefill.packed import PackedModel, PackedRunner

    if isinstance(runs, bool) or not isinstance(runs, int) or runs < MIN_RUNS:
        raise ValueError(f"runs must be an integer >= {MIN_RUNS}, got {runs!r}")
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"chunk must be a positive integer, got {chunk!r}")
    for n in prompt_lens:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"prompt_lens must be positive integers, got {n!r}")
    packed = PackedModel(loaded.model)
    if packed.device.type != "cpu":
        raise ValueError(
            f"fidelity runs on CPU in this build (device {packed.device}): real disaggregation "
            "needs two devices and ships KV through host shared memory; use --device cpu"
        )
    repeats, warmup = cal.effective_repeats(repeats, warmup, dry_run)
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    threads = threads or 1
    half, _ = split_cores(cores)
    calibration_lens = tuple(sorted(set(cal.DEFAULT_PROMPT_LENS) | set(prompt_lens)))

    _say(progress, f"calibrating the engine: single worker, cores {cores}, {threads} thread(s)")
    with pinned(cores, threads):
        single = calibrate_engine(
            loaded,
            repeats=repeats,
            warmup=warmup,
            dry_run=dry_run,
            progress=progress,
            prompt_lens=calibration_lens,
            seed=seed,
            cores=cores,
            threads=threads,
        )
        fused = measure_fused(
            PackedRunner(loaded.model, seed=seed),
            single.cost,
            repeats=repeats,
            warmup=warmup,
            progress=progress,
        )
    measured: dict[tuple[str, str], list[Any]] = {}
    setups: dict[str, str] = {}
    transfers: list[float] = []
    iterations: dict[str, dict[str, list[float]]] = {}
    _say(progress, "starting the prefill and decode worker processes")
    with DisaggregatedWorkers(loaded.model, cores=cores) as pool:
        _say(
            progress,
            "calibrating the engine inside the two worker processes, on their cores, one at a time",
        )
        with pinned(half, len(half)):
            link = measure_link(packed, repeats=max(repeats, 5), warmup=max(warmup, 1))
        worker = calibrate_workers(
            loaded,
            pool,
            repeats=repeats,
            warmup=warmup,
            dry_run=dry_run,
            link=link,
            prompt_lens=calibration_lens,
            seed=seed,
            progress=progress,
        )
        costs = {"single worker": single.cost, "disaggregated worker": worker.cost}
        chosen, skipped = scenarios(single.cost, prompt_lens=prompt_lens, azure=azure, seed=seed)
        for run in range(runs):
            for scenario in chosen:
                for policy in POLICIES:
                    result = execute(
                        policy,
                        scenario.load,
                        loaded.model,
                        chunk=chunk,
                        seed=seed + run,
                        cores=cores,
                        threads=threads,
                        workers=pool,
                    )
                    measured.setdefault((scenario.name, policy), []).append(result.trace.summary())
                    setups[policy] = result.setup
                    cost = costs[
                        "disaggregated worker" if policy == "disaggregated" else "single worker"
                    ]
                    for kind, errs in iteration_errors(result.trace, cost).items():
                        iterations.setdefault(policy, {}).setdefault(kind, []).extend(errs)
                    transfers += [e.duration for e in result.trace.events if e.kind == "transfer"]
                    _say(
                        progress,
                        f"run {run + 1}/{runs} {scenario.name} {policy}: {result.trace.summary()}",
                    )
    cells = []
    for scenario in chosen:
        for policy in POLICIES:
            cost = costs["disaggregated worker" if policy == "disaggregated" else "single worker"]
            predicted = simulate(policy, scenario.load, cost, chunk=chunk).summary()
            for metric in METRICS:
                cells.append(
                    Cell(
                        scenario.name,
                        policy,
                        metric,
                        getattr(predicted, metric),
                        tuple(getattr(s, metric) for s in measured[(scenario.name, policy)]),
                    )
                )
    info = cal.provenance(
        loaded,
        repeats=repeats,
        warmup=warmup,
        dry_run=dry_run,
        seed=seed,
        runs=runs,
        chunk=chunk,
        cores=cores,
        threads=threads,
        prompt_lens=list(prompt_lens),
    )
    return FidelityResult(
        tuple(cells),
        tuple(chosen),
        tuple(skipped),
        {"single worker": single, "disaggregated worker": worker},
        link,
        tuple(fused),
        tuple(transfers),
        setups,
        chunk,
        runs,
        info,
        {p: {k: tuple(v) for k, v in kinds.items()} for p, kinds in iterations.items()},
    )
