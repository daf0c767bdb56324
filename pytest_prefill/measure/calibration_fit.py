"""The cost model v2 fit (DESIGN.md, "Simulation semantics"): measured points in, constants out,
each refused (recorded as 0, with the reason and the numbers) when the scatter cannot support
it; a floor under the prefill pass when short prompts need one; and the held-out error, refit
without each prompt length and predicted, which is the number a user should trust. numpy only.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence

from pytest_prefill.measure.calibration_points import (
    DECODE_KINDS,
    PREFILL_KINDS,
    FitResult,
    Floor,
    Point,
    Prediction,
    Refusal,
    predict,
)
from pytest_prefill.measure.fitting import TermFit, fit_terms
from pytest_prefill.measure.timing import Measurement
from pytest_prefill.sim import CostModel

# A prefill fit needs passes at this many prompt lengths at least. A held-out check refits
# without one length at a time, so it needs one length more (and one more for each term fitted
# beside the prefill terms: a server's request overhead): :func:`held_out_lengths`.
MIN_PREFILL_LENGTHS = 2
# A floor is tried only under at least this many prompt lengths (one point cannot show that
# anything is flat) and with at least this many left above the knee.
MIN_LENGTHS_BELOW_KNEE = 2
MIN_LENGTHS_ABOVE_KNEE = 3
# ... and kept only when it cuts the sum of squared relative errors at least this many times.
FLOOR_GAIN = 2.0


def _of(points: Sequence[Point], kinds: Sequence[str]) -> list[Point]:
    return sorted((p for p in points if p.kind in kinds), key=lambda p: (p.kind, p.x, p.context))


def refusals_of(fit: TermFit, prefix: str = "") -> list[Refusal]:
    """A :class:`Refusal` for each term ``fit`` refused, with its numbers."""
    return [
        Refusal(
            name,
            prefix + reason,
            {
                "estimate": fit.estimates.get(name, 0.0),
                "stderr": fit.stderrs.get(name, 0.0),
                "effect": fit.effects.get(name, 0.0),
                "scatter": fit.scatter,
                "points": fit.points,
            },
        )
        for name, reason in fit.refused.items()
    ]


def fit_decode(points: Sequence[Point]) -> TermFit:
    """``decode_step_base + decode_per_seq*(rows - 1) + decode_per_kv_token*K`` over every
    decode point, by relative least squares."""
    decode = _of(points, DECODE_KINDS)
    columns = {
        "decode_step_base": [1.0] * len(decode),
        "decode_per_seq": [float(p.decode_rows - 1) for p in decode],
        "decode_per_kv_token": [float(p.kv_tokens) for p in decode],
    }
    kept = {k: v for k, v in columns.items() if k == "decode_step_base" or len(set(v)) > 1}
    ys = [p.measurement.median for p in decode]
    fit = fit_terms(kept, ys, [p.measurement.iqr for p in decode], required=("decode_step_base",))
    return _with_unmeasured(fit, columns)


def _with_unmeasured(fit: TermFit, columns: Mapping[str, Sequence[float]]) -> TermFit:
    """``fit`` with every name of ``columns``; a column that never varied is refused."""
    missing = [name for name in columns if name not in fit.names]
    if not missing:
        return fit
    reason = "not measured: every point had the same value of its multiplier"
    return dataclasses.replace(
        fit,
        names=tuple(columns),
        values={**fit.values, **{m: 0.0 for m in missing}},
        stderrs={**fit.stderrs, **{m: 0.0 for m in missing}},
        effects={**fit.effects, **{m: 0.0 for m in missing}},
        refused={**fit.refused, **{m: reason for m in missing}},
    )


def prefill_columns(points: Sequence[Point]) -> dict[str, list[float]]:
    """The design of the prefill fit: per term, its multiplier at each point."""
    return {
        "prefill_pass_overhead": [1.0] * len(points),
        "prefill_per_token": [float(p.x) for p in points],
        "prefill_per_pair": [float(p.x * p.context + p.x * (p.x + 1) // 2) for p in points],
    }


def _fit_pass(points: Sequence[Point], per_kv: float) -> TermFit:
    return fit_terms(
        prefill_columns(points),
        [p.measurement.median for p in points],
        [p.measurement.iqr for p in points],
        offset=[per_kv * p.context for p in points],
    )


def _score(fit: TermFit, floor: float, points: Sequence[Point], per_kv: float) -> float:
    columns = prefill_columns(points)
    total = 0.0
    for i, p in enumerate(points):
        row = {name: column[i] for name, column in columns.items()}
        value = max(floor, fit.predict(row) + per_kv * p.context)
        total += ((value - p.measurement.median) / p.measurement.median) ** 2
    return total


def fit_prefill(points: Sequence[Point], per_kv: float) -> tuple[TermFit, Floor]:
    """The prefill terms over prefill and chunk points, and the floor if the data need one.

    Short prompts below the compute knee are memory-bound and nearly flat; a sum of terms
    drawn through them and the long prompts fits neither (and drags the overhead negative or
    inflates it). So for each k that leaves ``MIN_LENGTHS_ABOVE_KNEE`` prompt lengths above,
    the k shortest lengths are fitted by a constant (the floor) and the terms by the rest; the
    best k is kept when it cuts the sum of squared relative errors over all points by at least
    ``FLOOR_GAIN`` times against no floor.

    Raises:
        ValueError: without prefill passes at 2 or more prompt lengths.
    """
    passes = _of(points, PREFILL_KINDS)
    lengths = sorted({p.x for p in passes if p.kind == "prefill"})
    if len(lengths) < MIN_PREFILL_LENGTHS:
        raise ValueError(
            f"calibration needs prefill passes at {MIN_PREFILL_LENGTHS} or more prompt lengths"
        )
    plain = _fit_pass(passes, per_kv)
    baseline = _score(plain, 0.0, passes, per_kv)
    best = (baseline, 0, plain, 0.0)
    for k in range(MIN_LENGTHS_BELOW_KNEE, len(lengths) - MIN_LENGTHS_ABOVE_KNEE + 1):
        knee = lengths[k - 1]
        below = [p for p in passes if p.kind == "prefill" and p.x <= knee]
        above = [p for p in passes if p not in below]
        ys = [p.measurement.median for p in below]
        # the constant minimising the squared relative error over the floor points
        floor = sum(1 / y for y in ys) / sum(1 / (y * y) for y in ys)
        candidate = _fit_pass(above, per_kv)
        score = _score(candidate, floor, passes, per_kv)
        if score < best[0]:
            best = (score, knee, candidate, floor)
    score, knee, fit, floor = best
    if knee == 0 or score * FLOOR_GAIN > baseline:
        return plain, Floor(0.0, 0, "no floor: the shortest prompts lie on the fitted terms")
    return fit, Floor(
        floor,
        knee,
        f"prompts up to {knee:,} tokens are flat (memory-bound below the compute knee): a "
        f"floor under them cuts the squared relative error {baseline / score:.1f}x",
    )


def fit_fusion(points: Sequence[Point], cost: CostModel) -> TermFit:
    """``fusion_penalty`` from fused passes: measured = max(decode, compute) + penalty *
    min(decode, compute), the parts from ``cost`` (what the simulator will compute)."""
    fused = _of(points, ("fused",))
    parts = [
        (cost.decode_step(p.rows, p.kv_tokens), cost.compute_part(p.pieces, p.rows)) for p in fused
    ]
    return fit_terms(
        {"fusion_penalty": [min(d, c) for d, c in parts]},
        [p.measurement.median for p in fused],
        [p.measurement.iqr for p in fused],
        offset=[max(d, c) for d, c in parts],
    )


def decode_constants(points: Sequence[Point]) -> tuple[TermFit, dict[str, float], list[Refusal]]:
    """The decode fit over ``points``' decode steps, its constants (a refused base replaced by
    the fastest measured step) and its refusals."""
    decode = _of(points, DECODE_KINDS)
    if not decode:
        raise ValueError("calibration needs at least one decode step (decode_kv point)")
    fit = fit_decode(decode)
    values = dict(fit.values)
    refusals = refusals_of(fit)
    if values["decode_step_base"] <= 0:
        fastest = min(p.measurement.median for p in decode)
        refusals = [r for r in refusals if r.constant != "decode_step_base"]
        refusals.append(
            Refusal(
                "decode_step_base",
                f"{fit.refused.get('decode_step_base', 'not positive')}; using the fastest "
                "measured decode step",
                {"estimate": fit.estimates.get("decode_step_base", 0.0), "used": fastest},
            )
        )
        values["decode_step_base"] = fastest
    return fit, values, refusals


def _prefill_constants(
    points: Sequence[Point], per_kv: float
) -> tuple[TermFit, Floor, dict[str, float], list[Refusal]]:
    fit, floor = fit_prefill(points, per_kv)
    values = dict(fit.values)
    refusals = refusals_of(fit)
    if values["prefill_pass_overhead"] + values["prefill_per_token"] <= 0:
        # a pass must take time: keep the typical pass as its overhead and say so
        typical = statistics.median(p.measurement.median for p in _of(points, PREFILL_KINDS))
        values["prefill_pass_overhead"] = typical
        refusals = [r for r in refusals if r.constant != "prefill_pass_overhead"]
        refusals.append(
            Refusal(
                "prefill_pass_overhead",
                "every prefill term was refused; the median measured pass is recorded as the "
                "overhead so that a pass takes time",
                {"used": typical},
            )
        )
    return fit, floor, values, refusals


def fusion_constant(
    points: Sequence[Point], cost: CostModel
) -> tuple[TermFit | None, float, list[Refusal]]:
    """The fusion penalty ``points``' fused passes support against ``cost``'s parts (at most 1,
    the model's ceiling), its fit (None without fused passes) and refusals."""
    if not any(p.kind == "fused" for p in points):
        return (
            None,
            0.0,
            [
                Refusal(
                    "fusion_penalty",
                    "not measured: no fused passes (the HF forward cannot fuse a chunk with other "
                    "requests' decode rows; the packed runner can)",
                    {},
                )
            ],
        )
    fit = fit_fusion(points, cost)
    penalty = fit.values["fusion_penalty"]
    refusals = refusals_of(fit)
    if penalty > 1:
        refusals.append(
            Refusal(
                "fusion_penalty",
                f"fitted {penalty:.3g} > 1 (a fused pass costs more than its two parts one after "
                "the other); capped at 1, the model's ceiling",
                {"estimate": penalty, "used": 1.0},
            )
        )
        penalty = 1.0
    return fit, penalty, refusals


def fit_model(
    points: Sequence[Point],
    *,
    kv_bytes_per_token: float = 0.0,
    kv_capacity_tokens: float = math.inf,
) -> tuple[CostModel, dict[str, TermFit], list[Refusal], Floor]:
    """The cost model ``points`` support: decode terms first (the prefill pass reads its
    cached context at ``decode_per_kv_token``), then the prefill terms and floor (carried into
    the cost model as ``prefill_floor``), then the fusion penalty against the fitted parts.
    Refused constants are recorded as 0.

    Raises:
        ValueError: without two prefill lengths and at least one decode point.
    """
    decode_fit, decode, refusals = decode_constants(points)
    prefill_fit, floor, prefill, more = _prefill_constants(points, decode["decode_per_kv_token"])
    cost = CostModel(
        **prefill,
        **decode,
        kv_bytes_per_token=kv_bytes_per_token,
        kv_capacity_tokens=kv_capacity_tokens,
        prefill_floor=floor.value,  # the simulator floors each pass as the fit did
    )
    fusion_fit, penalty, fusion_refusals = fusion_constant(points, cost)
    fits = {"prefill": prefill_fit, "decode": decode_fit}
    if fusion_fit is not None:
        fits["fused"] = fusion_fit
    cost = dataclasses.replace(cost, fusion_penalty=penalty)
    return cost, fits, refusals + more + fusion_refusals, floor


def held_out_lengths(lengths: Iterable[int], extra_terms: int = 0) -> list[int]:
    """The prompt lengths a held-out check leaves out one at a time: every distinct length when
    the fit without any one of them keeps ``MIN_PREFILL_LENGTHS`` lengths (one more for each of
    ``extra_terms`` fitted beside the prefill terms), else none -- the one rule for
    calibrations measured here and on a server."""
    distinct = sorted(set(lengths))
    return distinct if len(distinct) - 1 >= MIN_PREFILL_LENGTHS + extra_terms else []


def held_out(points: Sequence[Point], per_kv: float) -> dict[int, float]:
    """For each prompt length T measured as a prefill pass: refit the prefill terms (and floor)
    without every point of T new tokens (prefill and chunk), and predict those points. Returns
    {index into ``points``: held-out prediction}. A length whose removal leaves fewer than 2
    prefill lengths is not held out."""
    passes = [(i, p) for i, p in enumerate(points) if p.kind in PREFILL_KINDS]
    out: dict[int, float] = {}
    for length in held_out_lengths(p.x for _, p in passes if p.kind == "prefill"):
        rest = [p for _, p in passes if p.x != length]
        fit, floor = fit_prefill(rest, per_kv)
        columns = prefill_columns([p for _, p in passes])
        for j, (i, p) in enumerate(passes):
            if p.x == length:
                row = {name: column[j] for name, column in columns.items()}
                out[i] = max(floor.value, fit.predict(row) + per_kv * p.context)
    return out


def fit_cost_model(
    points: Sequence[Point],
    *,
    kv_bytes_per_token: float = 0.0,
    kv_capacity_tokens: float = math.inf,
) -> FitResult:
    """:func:`fit_model`, and every point's fitted and held-out prediction."""
    cost, fits, refusals, floor = fit_model(
        points, kv_bytes_per_token=kv_bytes_per_token, kv_capacity_tokens=kv_capacity_tokens
    )
    ordered = list(points)
    held = held_out(ordered, cost.decode_per_kv_token)
    predictions = tuple(
        Prediction(p, predict(cost, floor, p), held.get(i)) for i, p in enumerate(ordered)
    )
    return FitResult(cost, fits, tuple(refusals), floor, predictions)


def prefill_curve(
    lengths: Sequence[int], seconds: Sequence[float], per_kv: float = 0.0
) -> tuple[TermFit, Floor, list[float], list[float]]:
    """The prefill fit on bare (prompt length, seconds) pairs -- e.g. published measurements
    of a model nobody here can run -- with its in-sample and held-out relative errors (each
    length refitted without it and predicted), in the order of ``lengths``.

    Raises:
        ValueError: for mismatched lengths, fewer than 3 distinct lengths, or bad values.
    """
    if len(lengths) != len(seconds):
        raise ValueError(f"lengths and seconds differ in size: {len(lengths)}, {len(seconds)}")
    points = [
        Point("prefill", int(t), Measurement.from_samples([float(s)]))
        for t, s in zip(lengths, seconds, strict=True)
    ]
    if not held_out_lengths(p.x for p in points):
        raise ValueError(
            f"prefill_curve needs {MIN_PREFILL_LENGTHS + 1} or more distinct prompt lengths"
        )
    fit, floor = fit_prefill(points, per_kv)
    held = held_out(points, per_kv)
    columns = prefill_columns(points)
    in_sample, out = [], []
    for i, p in enumerate(points):
        row = {name: column[i] for name, column in columns.items()}
        measured = p.measurement.median
        in_sample.append((max(floor.value, fit.predict(row)) - measured) / measured)
        out.append((held[i] - measured) / measured)
    return fit, floor, in_sample, out
