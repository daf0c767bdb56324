"""Calibration: time the model's passes on this machine, fit the cost model v2 (constants the
noise cannot support are refused), hold each prompt length out to say how far to trust the fit,
and record the KV capacity. Nothing here prints (progress goes to a callable); the tables are
``calibration_tables``'s, the recommendation ``recommendation``'s."""

from __future__ import annotations

import datetime
import math
import platform
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from pytest_prefill.machine import cpu_model
from pytest_prefill.measure.calibration_document import (
    Calibration,
)
from pytest_prefill.measure.calibration_fit import fit_cost_model
from pytest_prefill.measure.calibration_points import Point, Refusal
from pytest_prefill.measure.quiet import settle
from pytest_prefill.measure.sweep import measure_sweep, plan_sweep, say
from pytest_prefill.measure.timing import DEFAULT_REPEATS, DEFAULT_WARMUP
from pytest_prefill.plan.advice import (
    chunk_star_text,
    recommend,
)
from pytest_prefill.sim import check_int

__all__ = [
    "Calibration",
    "Point",
    "Refusal",
    "calibrate",
    "chunk_star_text",
    "fit_cost_model",
    "recommend",
]


DRY_RUN_REPEATS = 3  # --dry-run caps repeats and warmup here; it never shortens a prompt
DRY_RUN_WARMUP = 1
# On CUDA the KV capacity is the free memory after the weights, less this fraction of the
# device kept for activations and the allocator (vLLM's default gpu_memory_utilization 0.9).
KV_HEADROOM_FRACTION = 0.10
NO_LINK = "not measured: infinite bandwidth, zero latency (state your own for disaggregation)"

Progress = Callable[[str], object]

# A calibration is host-bound when the median timed pass spends at least this share of its
# synchronized wall time enqueueing (the device then waits on the host's Python dispatch).
HOST_BOUND_SHARE = 0.9


def host_share_summary(points: Sequence[Point], device: Any) -> dict[str, Any]:
    """The host's share of the timed passes (each point's enqueue time over its synchronized
    wall time): the median over every point and per kind, whether the calibration is
    host-bound (median >= ``HOST_BOUND_SHARE``) and a line saying what that means."""
    shares = {p.label(): p.measurement.host_share for p in points}
    known = [(p, s) for p, s in zip(points, shares.values()) if s is not None]  # noqa: B905
    if not known:
        return {"median": None, "host_bound": None, "line": "host share not recorded"}
    median = statistics.median(s for _, s in known)
    by_kind = {
        kind: statistics.median(s for p, s in known if p.kind == kind)
        for kind in sorted({p.kind for p, _ in known})
    }
    bound = median >= HOST_BOUND_SHARE
    on_cpu = not getattr(device, "type", str(device)).startswith("cuda")
    if bound:
        line = (
            f"HOST-BOUND: the median pass spends {median:.0%} of its wall time being enqueued "
            f"(>= {HOST_BOUND_SHARE:.0%}): the device waits on the host's Python dispatch, so "
            "this measures the eager engine on this host, not what the device could do"
            + (" (on the CPU the host is the device: every pass is host time)" if on_cpu else "")
        )
    else:
        line = (
            f"device-bound: the median pass spends {median:.0%} of its wall time being "
            "enqueued; the timings are the device's"
        )
    return {
        "median": median,
        "max": max(s for _, s in known),
        "by_kind": by_kind,
        "host_bound": bound,
        "threshold": HOST_BOUND_SHARE,
        "line": line,
    }


def peak_device_memory(device: Any, *, reset: bool = False) -> int | None:
    """Bytes the device's allocator held at most since the last reset (CUDA; ``reset``
    starts a new count), else None -- also for a device faked in tests, or gone."""
    if not getattr(device, "type", str(device)).startswith("cuda"):
        return None
    import torch

    try:
        if reset:
            torch.cuda.reset_peak_memory_stats(device)
        return int(torch.cuda.max_memory_allocated(device))
    except (AssertionError, RuntimeError, AttributeError):
        return None


def device_name(device: Any) -> str:
    """The accelerator's name (CUDA), else the CPU's model name and thread count."""
    import torch

    if getattr(device, "type", str(device)).startswith("cuda"):
        return str(torch.cuda.get_device_name(device))
    return f"{cpu_model()} (CPU, {torch.get_num_threads()} torch threads)"


def device_memory(device: Any) -> int | None:
    """The accelerator's total memory in bytes (CUDA; what ``--device-memory`` defaults to
    when capacity runs on this calibration), None elsewhere."""
    if getattr(device, "type", str(device)) != "cuda":
        return None
    import torch

    try:
        return int(torch.cuda.get_device_properties(device).total_memory)
    except (AssertionError, RuntimeError):  # a device faked in tests, or gone: not recorded
        return None


def provenance(
    loaded: Any, *, repeats: int, warmup: int, dry_run: bool, **extra: Any
) -> dict[str, Any]:
    """Where a figure comes from: device, model, dtype, library versions, repeats, date."""
    import numpy
    import torch
    import transformers

    from pytest_prefill import __version__

    return {
        "device": str(loaded.device),
        "device_name": device_name(loaded.device),
        "device_memory_bytes": device_memory(loaded.device),
        "model": loaded.name,
        "model_source": loaded.source,
        "dtype": loaded.dtype_name,
        "attention": str(getattr(loaded.config, "_attn_implementation", None) or "default"),
        "torch_threads": torch.get_num_threads(),
        "kv_bytes_per_token": loaded.kv_bytes_per_token,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "python": platform.python_version(),
        "pytest_prefill": __version__,
        "repeats": repeats,
        "warmup": warmup,
        "dry_run": dry_run,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }


def effective_repeats(repeats: int | None, warmup: int | None, dry_run: bool) -> tuple[int, int]:
    """The repeats and warmup a run uses: the defaults, capped by ``--dry-run``.

    Raises:
        ValueError: for repeats < 1 or warmup < 0.
    """
    repeats = DEFAULT_REPEATS if repeats is None else repeats
    warmup = DEFAULT_WARMUP if warmup is None else warmup
    check_int("repeats", repeats)
    check_int("warmup", warmup, minimum=0)
    if dry_run:
        return min(repeats, DRY_RUN_REPEATS), min(warmup, DRY_RUN_WARMUP)
    return repeats, warmup


def device_kv_tokens(
    device: Any,
    kv_bytes_per_token: float,
    *,
    memory: Callable[[], tuple[int, int]] | None = None,
) -> tuple[float, str]:
    """Tokens of KV cache one worker holds, and a sentence saying how that was found.

    On CUDA: the free device memory after the weights (``memory`` returns (free, total) bytes;
    default ``torch.cuda.mem_get_info``), less ``KV_HEADROOM_FRACTION`` of the device kept for
    activations, divided by ``kv_bytes_per_token``. Elsewhere: inf (none recorded).
    """
    if not getattr(device, "type", str(device)).startswith("cuda"):
        return math.inf, (
            "not recorded on CPU (inf): host memory is not the limit the simulator models"
        )
    if not kv_bytes_per_token > 0:
        return math.inf, "not recorded (inf): the model's KV bytes per token are unknown"
    if memory is None:
        import torch

        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(device)
    else:
        free, total = memory()
    headroom = KV_HEADROOM_FRACTION * total
    tokens = math.floor((free - headroom) / kv_bytes_per_token)
    gib = 2.0**30
    where = (
        f"{free / gib:.1f} GiB free after the weights of {total / gib:.1f} GiB; "
        f"{headroom / gib:.1f} GiB ({KV_HEADROOM_FRACTION:.0%} of the device) kept as headroom "
        "for activations"
    )
    if tokens < 1:
        return math.inf, f"not recorded (inf): no room for KV left ({where})"
    return float(tokens), f"{tokens:,} tokens of {kv_bytes_per_token:,.0f} bytes: {where}"


def calibrate(
    loaded: Any,
    *,
    repeats: int | None = None,
    warmup: int | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
    seed: int = 0,
    runner: Any = None,
    memory: Callable[[], tuple[int, int]] | None = None,
    probe: bool = True,
    **sweep: Any,
) -> Calibration:
    """Measure ``loaded`` (a ``models.LoadedModel``) on its device and fit the cost model v2.

    Args:
        repeats, warmup: per measurement; default ``DEFAULT_REPEATS``/``DEFAULT_WARMUP``,
            capped at ``DRY_RUN_REPEATS``/``DRY_RUN_WARMUP`` by ``dry_run``.
        dry_run: fewer repeats and warmup; prompt and cache lengths are unchanged.
        progress: called with one line per finished measurement (for stderr).
        seed: seeds every input token.
        runner: what times the passes (``time_prefill``, ``time_chunk``, ``time_decode``;
            ``time_fused`` for the fusion penalty); default ``runner.ModelRunner`` (the HF
            forward, which cannot fuse); ``packed.calibration_runner`` gives the packed pass.
        memory: returns (free, total) device bytes, for :func:`device_kv_tokens` (tests fake it).
        probe: probe how quiet the machine is first (:func:`quiet.quiet_probe`).
        sweep: :func:`plan_sweep`'s arguments (prompt_lens, chunks, cache_lens, kv_rows,
            batch_sizes, batch_context, fused, budget); an empty one skips that sweep.

    Raises:
        ValueError: for bad repeats, warmup, lengths or sweep arguments.
    """
    repeats, warmup = effective_repeats(repeats, warmup, dry_run)
    plan = plan_sweep(loaded, **sweep)
    capacity, capacity_note = device_kv_tokens(
        loaded.device, loaded.kv_bytes_per_token, memory=memory
    )
    if runner is None:
        from pytest_prefill.measure.runner import ModelRunner

        runner = ModelRunner(loaded, seed=seed)
    peak_device_memory(loaded.device, reset=True)
    quiet = settle() if probe else None
    say(progress, quiet.warning if quiet is not None and quiet.warning else "")
    say(
        progress,
        f"calibrating {loaded.name} on {loaded.device} ({loaded.dtype_name}) with the "
        f"{getattr(runner, 'name', 'hf forward')}, {repeats} repeats after {warmup} warmup",
    )
    points, skipped = measure_sweep(runner, plan, repeats=repeats, warmup=warmup, progress=progress)
    host = host_share_summary(points, loaded.device)
    say(progress, host["line"])
    fit = fit_cost_model(
        points, kv_bytes_per_token=loaded.kv_bytes_per_token, kv_capacity_tokens=capacity
    )
    info = provenance(
        loaded,
        repeats=repeats,
        warmup=warmup,
        dry_run=dry_run,
        seed=seed,
        sweep=plan.to_dict(),
        skipped=skipped,
        max_context=loaded.max_context,
        kv_capacity=capacity_note,
        quiet=quiet.to_dict() if quiet is not None else None,
        link=NO_LINK,
        runner=getattr(runner, "name", "hf forward"),
        host_share=host,
        peak_device_memory_bytes=peak_device_memory(loaded.device),
    )
    return Calibration.from_fit(fit, info, points)
