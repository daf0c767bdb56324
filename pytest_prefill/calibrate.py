"""Calibration: time the model's passes on this machine, fit a ``CostModel`` that refuses what
the noise cannot support, and say what C* and the recommendation are. Tables are in
``calibration_tables``; nothing here prints (progress goes to a callable)."""

from __future__ import annotations

import dataclasses
import datetime
import math
import platform
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pytest_prefill.advice import (  # re-exported: the one recommendation rule lives there
    DISAGGREGATE_OVERHEAD_FRACTION as DISAGGREGATE_OVERHEAD_FRACTION,
)
from pytest_prefill.advice import MIN_USEFUL_CHUNK as MIN_USEFUL_CHUNK
from pytest_prefill.advice import Recommendation, chunk_star_text, recommend
from pytest_prefill.scheduler import CostModel
from pytest_prefill.timing import Fit, Measurement, fit_from_dict, fit_line

KIND = "pytest-prefill/calibration"
SCHEMA_VERSION = 1

DEFAULT_PROMPT_LENS = (256, 512, 1024, 2048)
DEFAULT_CACHE_LENS = (128, 1024, 4096, 16384)
DEFAULT_BATCH_SIZES = (1, 2, 4, 8)
BATCH_CACHE_LEN = 128  # cached tokens per sequence in the batch sweep
DEFAULT_REPEATS = 10
DEFAULT_WARMUP = 3
DRY_RUN_REPEATS = 3  # --dry-run caps repeats and warmup here; it never shortens a prompt
DRY_RUN_WARMUP = 1

POINT_KINDS = ("prefill", "decode_kv", "decode_batch")
Progress = Callable[[str], object]


@dataclasses.dataclass(frozen=True, slots=True)
class Point:
    """One measured operation: ``kind`` is ``prefill`` (x = prompt tokens), ``decode_kv``
    (x = cached tokens, batch 1) or ``decode_batch`` (x = batch size, ``context`` cached tokens
    per sequence)."""

    kind: str
    x: int
    measurement: Measurement
    context: int = 0

    def __post_init__(self) -> None:
        if self.kind not in POINT_KINDS:
            raise ValueError(
                f"point kind must be one of {', '.join(POINT_KINDS)}, got {self.kind!r}"
            )
        if isinstance(self.x, bool) or not isinstance(self.x, int) or self.x < 1:
            raise ValueError(f"point x must be an integer >= 1, got {self.x!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "x": self.x,
            "context": self.context,
            "measurement": self.measurement.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Any) -> Point:
        if not isinstance(data, Mapping):
            raise ValueError(f"a measurement point must be an object, got {data!r:.60}")
        kind: Any = data.get("kind")  # checked by __post_init__
        x: Any = data.get("x")
        return cls(
            kind,
            x,
            Measurement.from_dict(data.get("measurement")),
            int(data.get("context", 0)),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """A cost-model constant the measurements could not support, recorded as 0."""

    constant: str
    reason: str
    numbers: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"constant": self.constant, "reason": self.reason, "numbers": dict(self.numbers)}

    @classmethod
    def from_dict(cls, data: Any) -> Refusal:
        if not isinstance(data, Mapping) or not isinstance(data.get("constant"), str):
            raise ValueError(f"a refusal must be an object with 'constant', got {data!r:.60}")
        numbers = data.get("numbers", {})
        if not isinstance(numbers, Mapping):
            raise ValueError("a refusal's 'numbers' must be an object")
        return cls(data["constant"], str(data.get("reason", "")), dict(numbers))


def _ms(seconds: float) -> str:
    value = seconds * 1e3
    return f"{value:.2f}" if abs(value) >= 1 or value == 0 else f"{value:.3g}"


@dataclasses.dataclass(frozen=True)
class Calibration:
    """A measured cost model and everything needed to trust it or not: provenance, every raw
    measurement (median and spread), the fits, and the refused constants with their reasons."""

    cost: CostModel
    provenance: Mapping[str, Any]
    measurements: tuple[Point, ...]
    fits: Mapping[str, Fit]
    refusals: tuple[Refusal, ...]

    def points(self, kind: str) -> list[Point]:
        return [p for p in self.measurements if p.kind == kind]

    def refused(self) -> set[str]:
        """Names of the constants this calibration refused."""
        return {r.constant for r in self.refusals}

    def chunk_star_text(self) -> str:
        return chunk_star_text(self.cost, self.refused())

    def recommendation(self) -> Recommendation:
        return recommend(self.cost, self.refused())

    def tables(self) -> dict[str, str]:
        """Named table texts: provenance, prefill, kv, batch, constants."""
        from pytest_prefill.calibration_tables import calibration_tables

        return calibration_tables(self)

    def report(self) -> str:
        """The whole printed report: tables, refusals, stability warnings, C* derivation."""
        from pytest_prefill.calibration_tables import calibration_report

        return calibration_report(self)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "schema_version": SCHEMA_VERSION,
            "cost_model": self.cost.to_dict(),
            "chunk_star": _json_number(self.cost.chunk_star()),
            "recommendation": self.recommendation().policy,
            "provenance": dict(self.provenance),
            "measurements": [p.to_dict() for p in self.measurements],
            "fits": {name: fit.to_dict() for name, fit in self.fits.items()},
            "refusals": [r.to_dict() for r in self.refusals],
        }

    @classmethod
    def from_dict(cls, data: Any) -> Calibration:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: for anything that is not a schema-1 pytest-prefill calibration.
        """
        if not isinstance(data, Mapping) or data.get("kind") != KIND:
            kind = data.get("kind") if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(
                f"not a pytest-prefill calibration: kind is {kind!r}, expected {KIND!r}"
            )
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(
                f"calibration schema_version must be {SCHEMA_VERSION}, got "
                f"{data.get('schema_version')!r}"
            )
        try:
            cost = CostModel.from_dict(data["cost_model"])
            provenance = data["provenance"]
            if not isinstance(provenance, Mapping):
                raise ValueError("provenance must be an object")
            measurements = tuple(Point.from_dict(p) for p in data["measurements"])
            fits = {str(k): fit_from_dict(v) for k, v in data["fits"].items()}
            refusals = tuple(Refusal.from_dict(r) for r in data["refusals"])
        except (KeyError, TypeError, AttributeError, ValueError) as err:
            raise ValueError(f"corrupt pytest-prefill calibration: {err!s}") from None
        return cls(cost, dict(provenance), measurements, fits, refusals)


def _json_number(value: float) -> float | str:
    return value if math.isfinite(value) else ("inf" if value > 0 else "-inf")


def device_name(device: Any) -> str:
    """The accelerator's name (CUDA), else the CPU's model name and thread count."""
    import torch

    if getattr(device, "type", str(device)).startswith("cuda"):
        return str(torch.cuda.get_device_name(device))
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    name = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{name} (CPU, {torch.get_num_threads()} torch threads)"


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
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be an integer >= 0, got {warmup!r}")
    if dry_run:
        return min(repeats, DRY_RUN_REPEATS), min(warmup, DRY_RUN_WARMUP)
    return repeats, warmup


def _lengths(field: str, values: Sequence[int], limit: int) -> tuple[int, ...]:
    checked = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{field} must be positive integers, got {v!r}")
        checked.append(min(v, limit))
    return tuple(sorted(set(checked)))


def _say(progress: Progress | None, text: str) -> None:
    if progress is not None:
        progress(text)


def _summary(m: Measurement) -> str:
    return f"{_ms(m.median)} ms [{_ms(m.minimum)}, {_ms(m.maximum)}]"


def measure_prefill(
    runner: Any,
    prompt_lens: Sequence[int],
    *,
    repeats: int,
    warmup: int,
    progress: Progress | None = None,
) -> list[Point]:
    """Prefill passes into a fresh cache at each prompt length."""
    points = []
    for tokens in prompt_lens:
        m = runner.time_prefill(tokens, repeats=repeats, warmup=warmup)
        _say(progress, f"prefill {tokens:>6} tokens: {_summary(m)}")
        points.append(Point("prefill", tokens, m))
    return points


def measure_decode_kv(
    runner: Any,
    cache_lens: Sequence[int],
    *,
    repeats: int,
    warmup: int,
    progress: Progress | None = None,
) -> list[Point]:
    """Batch-1 decode steps over a cache of each length."""
    points = []
    for cached in cache_lens:
        m = runner.time_decode([cached], repeats=repeats, warmup=warmup)
        _say(progress, f"decode, {cached:>6} cached tokens: {_summary(m)}")
        points.append(Point("decode_kv", cached, m))
    return points


def measure_decode_batch(
    runner: Any,
    batch_sizes: Sequence[int],
    *,
    context: int,
    repeats: int,
    warmup: int,
    progress: Progress | None = None,
) -> list[Point]:
    """Decode steps of each batch size, every sequence holding ``context`` cached tokens."""
    points = []
    for batch in batch_sizes:
        m = runner.time_decode([context] * batch, repeats=repeats, warmup=warmup)
        _say(progress, f"decode, batch {batch:>3} x {context} cached: {_summary(m)}")
        points.append(Point("decode_batch", batch, m, context=context))
    return points


_X_UNITS = {"prefill": "prompt token", "decode_kv": "cached token", "decode_batch": "sequence"}


def _fit(points: Sequence[Point], shift: Callable[[Point], float] = lambda p: 0.0) -> Fit:
    return fit_line(
        [p.x for p in points],
        [p.measurement.median - shift(p) for p in points],
        [p.measurement.iqr for p in points],
        unit="ms",
        x_unit=_X_UNITS[points[0].kind],
    )


def _refusal(constant: str, fit: Fit, reason: str | None = None) -> Refusal:
    numbers = {k: v for k, v in fit.to_dict().items() if k not in ("refused", "reason")}
    return Refusal(constant, reason or fit.reason, numbers)


def fit_cost_model(
    points: Sequence[Point], *, kv_bytes_per_token: float = 0.0
) -> tuple[CostModel, dict[str, Fit], list[Refusal]]:
    """The cost model the points support, the fits, and the constants refused (recorded as 0).

    - prefill (x = prompt tokens): slope -> ``prefill_per_token``, intercept ->
      ``prefill_pass_overhead``. An intercept that is negative or within 2 standard errors of
      zero is refused; the per-token cost is then refitted through the origin.
    - decode_kv (x = cached tokens): slope -> ``decode_per_kv_token``, intercept (the mean when
      the slope is refused) -> ``decode_step_base``.
    - decode_batch (x = batch size): after removing ``decode_per_kv_token`` x cached tokens,
      slope -> ``decode_per_seq``.

    Raises:
        ValueError: without two prefill lengths and at least one decode point.
    """
    fits: dict[str, Fit] = {}
    refusals: list[Refusal] = []
    prefill = sorted((p for p in points if p.kind == "prefill"), key=lambda p: p.x)
    kv = sorted((p for p in points if p.kind == "decode_kv"), key=lambda p: p.x)
    batch = sorted((p for p in points if p.kind == "decode_batch"), key=lambda p: p.x)
    if len({p.x for p in prefill}) < 2:
        raise ValueError("calibration needs prefill passes at 2 or more prompt lengths")
    if not kv:
        raise ValueError("calibration needs at least one decode step (decode_kv point)")

    fits["prefill"] = fit = _fit(prefill)
    per_token, overhead = fit.recorded_slope, fit.level
    if fit.refused:
        refusals.append(_refusal("prefill_per_token", fit))
    elif fit.intercept <= 0 or fit.intercept <= 2 * fit.intercept_stderr:
        sign = "negative" if fit.intercept < 0 else "not distinguishable from zero"
        refusals.append(
            _refusal(
                "prefill_pass_overhead",
                fit,
                f"intercept {fit.intercept * 1e3:.3g} ms +/- {fit.intercept_stderr * 1e3:.2g} ms is "
                f"{sign}; per-token cost refitted through the origin",
            )
        )
        xs = [p.x for p in prefill]
        ys = [p.measurement.median for p in prefill]
        per_token = sum(x * y for x, y in zip(xs, ys, strict=True)) / sum(x * x for x in xs)
        overhead = 0.0

    per_kv = 0.0
    if len({p.x for p in kv}) >= 2:
        fits["decode_kv"] = fit = _fit(kv)
        per_kv, base = fit.recorded_slope, fit.level
        if fit.refused:
            refusals.append(_refusal("decode_per_kv_token", fit))
    else:
        base = kv[0].measurement.median
        refusals.append(
            Refusal(
                "decode_per_kv_token",
                "measured at one cache length only; a slope needs two",
                {"cache_lens": [p.x for p in kv]},
            )
        )
    if base <= 0:
        smallest = min(p.measurement.median for p in kv)
        refusals.append(
            Refusal(
                "decode_step_base",
                f"fitted intercept {base * 1e3:.3g} ms is "
                "not positive; using the fastest measured decode step",
                {"intercept": base, "used": smallest},
            )
        )
        base = smallest

    per_seq = 0.0
    if len({p.x for p in batch}) >= 2:
        fits["decode_batch"] = fit = _fit(batch, lambda p: per_kv * p.x * p.context)
        # slope against rows = slope against extra rows (n - 1), the cost model's term
        per_seq = fit.recorded_slope
        if fit.refused:
            refusals.append(_refusal("decode_per_seq", fit))
    else:
        refusals.append(
            Refusal(
                "decode_per_seq",
                "not measured (no batch sweep in this run)",
                {"batch_sizes": [p.x for p in batch]},
            )
        )

    cost = CostModel(
        prefill_pass_overhead=max(overhead, 0.0),
        prefill_per_token=max(per_token, 0.0),
        decode_step_base=base,
        decode_per_seq=per_seq,
        decode_per_kv_token=per_kv,
        kv_bytes_per_token=kv_bytes_per_token,
    )
    return cost, fits, refusals


def calibrate(
    loaded: Any,
    *,
    repeats: int | None = None,
    warmup: int | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
    prompt_lens: Sequence[int] | None = None,
    cache_lens: Sequence[int] | None = None,
    batch_sizes: Sequence[int] | None = None,
    batch_context: int | None = None,
    seed: int = 0,
    runner: Any = None,
) -> Calibration:
    """Measure ``loaded`` (a ``models.LoadedModel``) on its device and fit a cost model.

    Args:
        repeats, warmup: per measurement; default ``DEFAULT_REPEATS``/``DEFAULT_WARMUP``,
            capped at ``DRY_RUN_REPEATS``/``DRY_RUN_WARMUP`` by ``dry_run``.
        dry_run: fewer repeats and warmup; prompt and cache lengths are unchanged.
        progress: called with one line per finished measurement (for stderr).
        prompt_lens: prefill lengths, 4 or more distinct, each within the model's context
            (default ``DEFAULT_PROMPT_LENS``).
        cache_lens: decode cache lengths, capped at the model's context (default
            ``DEFAULT_CACHE_LENS``).
        batch_sizes: decode batch sizes for ``decode_per_seq`` (default
            ``DEFAULT_BATCH_SIZES``); empty skips that sweep (the constant is then recorded as
            0, "not measured").
        batch_context: cached tokens per sequence in the batch sweep (``BATCH_CACHE_LEN``).
        seed: seeds every input token.
        runner: what times the passes (``time_prefill``, ``time_decode``); default a
            ``runner.ModelRunner`` (the HF model's own forward). The engine passes a
            ``packed.PackedRunner`` to calibrate its packed pass.

    Raises:
        ValueError: for bad repeats, warmup or lengths.
    """
    from pytest_prefill.runner import ModelRunner

    repeats, warmup = effective_repeats(repeats, warmup, dry_run)
    limit = loaded.max_context - 1  # room for the token a decode step appends
    # defaults are read at call time, so a caller (or a test) may change the module constants
    prompt_lens = DEFAULT_PROMPT_LENS if prompt_lens is None else prompt_lens
    cache_lens = DEFAULT_CACHE_LENS if cache_lens is None else cache_lens
    batch_sizes = DEFAULT_BATCH_SIZES if batch_sizes is None else batch_sizes
    batch_context = BATCH_CACHE_LEN if batch_context is None else batch_context
    prompts = _lengths("prompt_lens", prompt_lens, loaded.max_context)
    if len(prompts) < 4:
        raise ValueError(
            f"prompt_lens must hold 4 or more distinct lengths within the model's "
            f"context ({loaded.max_context}), got {list(prompt_lens)!r}"
        )
    caches = _lengths("cache_lens", cache_lens, limit)
    if not caches:
        raise ValueError("cache_lens must hold at least one length")
    batches = _lengths("batch_sizes", batch_sizes, 2**31)
    context = _lengths("batch_context", [batch_context], limit)[0]
    runner = ModelRunner(loaded, seed=seed) if runner is None else runner
    _say(
        progress,
        f"calibrating {loaded.name} on {loaded.device} ({loaded.dtype_name}), "
        f"{repeats} repeats after {warmup} warmup",
    )
    points = measure_prefill(runner, prompts, repeats=repeats, warmup=warmup, progress=progress)
    points += measure_decode_kv(runner, caches, repeats=repeats, warmup=warmup, progress=progress)
    if batches:
        points += measure_decode_batch(
            runner, batches, context=context, repeats=repeats, warmup=warmup, progress=progress
        )
    cost, fits, refusals = fit_cost_model(points, kv_bytes_per_token=loaded.kv_bytes_per_token)
    info = provenance(
        loaded,
        repeats=repeats,
        warmup=warmup,
        dry_run=dry_run,
        seed=seed,
        prompt_lens=list(prompts),
        cache_lens=list(caches),
        batch_sizes=list(batches),
        batch_context=context,
        link="not measured: infinite bandwidth, zero latency (state your own for disaggregation)",
        runner=getattr(runner, "name", "hf forward"),
    )
    return Calibration(cost, info, tuple(points), fits, tuple(refusals))
