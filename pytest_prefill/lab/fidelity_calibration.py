"""The cost models a fidelity run simulates with, each calibrated on the engine in the setting
its policy runs in: the single worker in this process, the disaggregated workers inside their
own processes (both at once), and the KV link through the path real transfers take. torch is
imported lazily."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import statistics
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pytest_prefill.measure import calibrate as cal
from pytest_prefill.measure import sweep as sweeps
from pytest_prefill.units import ms_spread

LINK_PROMPT_LENS = (128, 512, 2048)
# Decode steps as the scenarios run them: two or more rows (the lab's two live streams decode
# together, and a new request joins them). A CPU's BLAS takes a faster path for a single row (a
# matrix-vector product) than for two or more -- here about 5.5 ms against 9 -- a step the cost
# model's line cannot draw; a fit through it would miss every step the runs take by ~20%. So the
# cache-length sweep runs two rows and the batch sweep 2 to 8 (a one-row decode, rare in these
# scenarios, is then overpredicted; the calibration's table shows by how much).
SCENARIO_ROWS = 2
FIDELITY_BATCH_SIZES = (2, 3, 4, 8)
# ... and over the cache lengths the scenarios reach (a request's prompt plus its output):
# reading a 16k-token cache is DRAM-bound on a CPU while a few thousand tokens stay in cache,
# so a slope fitted out there would not describe the runs.
FIDELITY_CACHE_LENS = (128, 512, 1024, 2048)
LINK_REPEATS = 5  # at least, per prompt length

Progress = Callable[[str], object]


@contextlib.contextmanager
def pinned(cores: Sequence[int], threads: int, *, on_cpu: bool = True) -> Iterator[None]:
    """Run the body on ``cores`` with ``threads`` torch threads (CPU), then restore both."""
    if not on_cpu:
        yield
        return
    import torch

    before = (os.sched_getaffinity(0), torch.get_num_threads())
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before[0])
        torch.set_num_threads(before[1])


def fidelity_sweep(
    prompt_lens: Sequence[int], chunk: int, *, on_cuda: bool = False
) -> dict[str, Any]:
    """``sweep.plan_sweep`` arguments covering what the scenarios run: prefill passes up to
    the longest prompt, chunks of ``chunk`` over the contexts a chunked prompt passes through,
    fused passes of a chunk (or a whole prompt, coscheduled) with a few decode rows."""
    longest = max(prompt_lens)
    defaults = sweeps.CUDA_PROMPT_LENS if on_cuda else sweeps.CPU_PROMPT_LENS
    prompts = sorted({p for p in defaults if p <= longest} | set(prompt_lens))
    contexts = sorted(
        {c for c in (chunk, longest // 2, longest - chunk) if 0 < c <= longest - chunk}
    )
    fused = [(chunk, c, rows) for c in (0, *contexts[-1:]) for rows in (1, 2, 4)]
    fused += [(max(1, chunk // 4), 0, 2), (longest, 0, 2)]
    return {
        "prompt_lens": tuple(prompts),
        "chunks": tuple((chunk, c) for c in contexts),
        "fused": tuple(dict.fromkeys(fused)),
        "kv_rows": SCENARIO_ROWS,
        "batch_sizes": FIDELITY_BATCH_SIZES,
        "cache_lens": tuple(c for c in FIDELITY_CACHE_LENS if c <= longest) or (longest,),
    }


def calibrate_engine(
    loaded: Any,
    *,
    repeats: int,
    warmup: int,
    dry_run: bool,
    sweep: dict[str, Any],
    progress: Progress | None = None,
    seed: int = 0,
    **extra: Any,
) -> Any:
    """The calibrator with the engine's packed pass as its runner, in the current core and
    thread setting; ``extra`` goes into the provenance."""
    from pytest_prefill.lab.packed import PackedRunner

    calibration = cal.calibrate(
        loaded,
        repeats=repeats,
        warmup=warmup,
        dry_run=dry_run,
        progress=progress,
        seed=seed,
        runner=PackedRunner(loaded.model, seed=seed),
        probe=False,
        **sweep,
    )
    return dataclasses.replace(calibration, provenance={**calibration.provenance, **extra})


@dataclasses.dataclass(frozen=True)
class Link:
    """The KV link measured through the run's path: latency + bytes / bandwidth, fitted over
    the seconds from a prefill's end to its KV's arrival at several prompt lengths."""

    latency: float
    bandwidth: float
    points: tuple[tuple[int, Any], ...]  # (bytes, Measurement)
    note: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "latency": self.latency,
            "bandwidth": self.bandwidth if math.isfinite(self.bandwidth) else "inf",
            "note": self.note,
            "points": [{"bytes": b, "measurement": m.to_dict()} for b, m in self.points],
        }


def fit_link(points: Sequence[tuple[int, Any]]) -> Link:
    """Latency and bandwidth from (bytes, Measurement) points; the bandwidth refused (inf,
    latency = the median time) when the times do not grow clearly with the bytes."""
    from pytest_prefill.measure.line_fit import fit_line

    fit = fit_line(
        [b for b, _ in points],
        [m.median for _, m in points],
        [m.iqr for _, m in points],
        unit="ms",
        x_unit="byte",
    )
    if fit.refused:
        latency = statistics.median(m.median for _, m in points)
        return Link(
            latency, math.inf, tuple(points), f"bandwidth refused ({fit.reason}); latency = median"
        )
    return Link(
        max(fit.intercept, 0.0),
        1.0 / fit.slope,
        tuple(points),
        f"fitted over {len(points)} prompt lengths, from each prefill's end to its KV's arrival",
    )


def measure_link(
    pool: Any, kv_bytes_per_token: int, *, prompt_lens: Sequence[int], repeats: int, warmup: int
) -> Link:
    """The link calibrated by the disaggregated workers through the run's own transfer path."""
    points = pool.link_points(
        prompt_lens, repeats=max(repeats, LINK_REPEATS), warmup=max(warmup, 1)
    )
    return fit_link([(n * kv_bytes_per_token, m) for n, m in points])


def calibrate_workers(
    loaded: Any,
    pool: Any,
    *,
    repeats: int,
    warmup: int,
    dry_run: bool,
    sweep: dict[str, Any],
    link: Link,
    seed: int = 0,
    progress: Progress | None = None,
) -> Any:
    """The disaggregated workers' cost model: the calibrator's sweeps run by the workers
    themselves, both at once (prefill and chunk passes on the prefill worker, decode steps on
    the decode worker), fitted by the calibrator, with the ``link``."""
    timing = {"repeats": repeats, "warmup": warmup, "seed": seed}
    plan = sweeps.plan_sweep(
        loaded,
        prompt_lens=sweep["prompt_lens"],
        chunks=sweep["chunks"],
        kv_rows=sweep["kv_rows"],
        batch_sizes=sweep["batch_sizes"],
        cache_lens=sweep["cache_lens"],
    )
    spec = {
        "prompt_lens": plan.prompt_lens,
        "chunks": plan.chunks,
        "budget": plan.budget,
        "cache_lens": plan.cache_lens,
        "kv_rows": plan.kv_rows,
        "batch_sizes": plan.batch_sizes,
        "batch_context": plan.batch_context,
        **timing,
    }
    points = pool.calibration_points(spec)
    for p in points:
        m = p.measurement
        if progress is not None:
            progress(f"worker {p.label()}: {ms_spread(m.median, m.minimum, m.maximum)}")
    fit = cal.fit_cost_model(points, kv_bytes_per_token=loaded.kv_bytes_per_token)
    cost = dataclasses.replace(fit.cost, link_latency=link.latency, link_bandwidth=link.bandwidth)
    info = cal.provenance(
        loaded,
        **timing,
        dry_run=dry_run,
        runner="engine packed pass, inside the disaggregated worker processes, both at once",
        setup=pool.setup,
        sweep=dataclasses.replace(plan, fused=()).to_dict(),
        max_context=loaded.max_context,
        link=f"measured through the run's path: {link.note}",
    )
    return cal.Calibration.from_fit(dataclasses.replace(fit, cost=cost), info, points)
