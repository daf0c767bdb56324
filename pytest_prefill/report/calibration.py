"""Tables a person reads for a calibration (tabulate): provenance, the raw measurements with
their spread, stability warnings and the fitted model's value (in-sample and held out), the
constants with their uncertainty and refusals, and the C* block. Milliseconds here, seconds
everywhere else. The report layer over ``calibrate``."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from tabulate import tabulate

from pytest_prefill.measure.calibration_document import Calibration
from pytest_prefill.measure.calibration_points import Point, Prediction
from pytest_prefill.measure.timing import Measurement
from pytest_prefill.report.text_table import text_table
from pytest_prefill.units import ms, readable

PROVENANCE_KEYS = (
    "device_name",
    "device",
    "model",
    "model_source",
    "dtype",
    "attention",
    "runner",
    "torch",
    "transformers",
    "repeats",
    "warmup",
    "dry_run",
    "kv_capacity",
    "date",
)


def pct(value: float | None) -> str:
    return f"{value:+.1%}" if value is not None and math.isfinite(value) else "-"


def spread(m: Measurement) -> str:
    return f"[{ms(m.minimum)}, {ms(m.maximum)}]"


def _flag(m: Measurement) -> str:
    return "!" if m.warning else ""


def _measured(m: Measurement) -> list[str]:
    return [ms(m.median) + _flag(m), spread(m)]


def _model(prediction: Prediction | None, held_out: bool = False) -> list[str]:
    if prediction is None:
        return ["-"] * (2 if held_out else 1)
    cells = [f"{ms(prediction.fitted)} ({pct(prediction.error)})"]
    if held_out:
        value = prediction.held_out
        cells.append("-" if value is None else f"{ms(value)} ({pct(prediction.held_out_error)})")
    return cells


def provenance_table(provenance: dict[str, Any]) -> str:
    rows = [(k, provenance[k]) for k in PROVENANCE_KEYS if k in provenance]
    return tabulate(rows, tablefmt="plain", disable_numparse=True)


def _lookup(calibration: Calibration) -> dict[Point, Prediction]:
    return {p.point: p for p in calibration.predictions}


def prefill_table(calibration: Calibration) -> str:
    """Prefill passes into a fresh cache, then chunks over cached context: measured, the fit,
    and the prediction of a fit made without that prompt length (held out)."""
    model = _lookup(calibration)
    rows = []
    for p in calibration.points("prefill") + calibration.points("chunk"):
        rows.append(
            [
                f"{p.x:,}",
                f"{p.context:,}",
                *_measured(p.measurement),
                f"{p.measurement.median / p.x * 1e6:.1f}",
                *_model(model.get(p), held_out=True),
            ]
        )
    headers = ["new tokens", "context", "pass ms", "[min, max] ms", "per token us"]
    return text_table(rows, [*headers, "fit ms (error)", "held out ms (error)"])


def decode_table(points: Sequence[Point], calibration: Calibration | None = None) -> str:
    """Decode steps (batch 1 per cached-token count, or per batch size): measured, the ratio
    to the first, and the fit."""
    ordered = sorted(points, key=lambda p: p.x)
    if not ordered:
        return "(not measured in this run)"
    model = _lookup(calibration) if calibration is not None else {}
    first = ordered[0].measurement.median
    rows = [
        [
            f"{p.x:,}",
            f"{p.kv_tokens:,}",
            *_measured(p.measurement),
            ms(p.measurement.iqr),
            f"{p.measurement.median / first:.2f}x",
            *_model(model.get(p)),
        ]
        for p in ordered
    ]
    what = "cached tokens" if ordered[0].kind == "decode_kv" else "batch"
    return text_table(
        rows, [what, "KV read", "step ms", "[min, max] ms", "IQR ms", "x first", "fit ms (error)"]
    )


def kv_table(points: Sequence[Point]) -> str:
    """The decode step (batch 1) per cached-token count (for the falsifier's printout)."""
    return decode_table(points)


def fused_table(calibration: Calibration) -> str:
    """Fused passes (a chunk and decode rows in one pass) against the model's fused rule."""
    points = calibration.points("fused")
    if not points:
        return "(no fused passes: this runner cannot fuse)"
    model = _lookup(calibration)
    cost = calibration.cost
    rows = []
    for p in points:
        decode = cost.decode_step(p.rows, p.kv_tokens)
        compute = cost.compute_part(p.pieces, p.rows)
        rows.append(
            [
                f"{p.x:,}",
                f"{p.context:,}",
                f"{p.rows} x {p.row_context:,}",
                *_measured(p.measurement),
                ms(decode),
                ms(compute),
                *_model(model.get(p)),
            ]
        )
    headers = ["chunk", "context", "rows x cached", "pass ms", "[min, max] ms"]
    return text_table(rows, [*headers, "decode part", "compute part", "model ms (error)"])


def _stderr(calibration: Calibration, name: str) -> float | None:
    for fit in calibration.fits.values():
        if name in fit.names and name not in fit.refused:
            return fit.stderrs[name]
    return None


CONSTANT_UNITS = (
    ("prefill_pass_overhead", "ms", 1e3),
    ("prefill_per_token", "us", 1e6),
    ("prefill_per_pair", "ns", 1e9),
    ("decode_step_base", "ms", 1e3),
    ("decode_per_seq", "ms", 1e3),
    ("decode_per_kv_token", "ns", 1e9),
    ("fusion_penalty", "", 1.0),
    ("batch_attention_per_pair", "ns", 1e9),
)


def _constant(value: float, unit: str, digits: int) -> str:
    """A constant as a person reads it: a time in the unit that suits it (23.2 µs, not
    2.317e+04 ns), a ratio as a number."""
    return readable(value, digits) if unit else f"{value:.{digits}g}"


def constants_table(calibration: Calibration) -> str:
    """The cost model's constants (v2), their uncertainty, and which were refused."""
    cost = calibration.cost
    refused, capped = calibration.refused(), _capped(calibration)
    rows = []
    for name, unit, _ in CONSTANT_UNITS:
        error = _stderr(calibration, name)
        value = getattr(cost, name)
        stderr = "" if error is None else f"+/- {_constant(error, unit, 2)}"
        status = "REFUSED (0)" if name in refused and value == 0 else "fitted"
        if name in refused and value != 0:
            status = f"capped at {value:g}" if name in capped else "see note"
        rows.append((name, _constant(value, unit, 3), stderr, status))
    floor = calibration.floor
    floor_value = f"{ms(floor.value)} ms up to {floor.knee:,} tokens" if floor.knee else "none"
    rows.append(("prefill floor", floor_value, "", "fitted" if floor.knee else "not needed"))
    capacity = cost.kv_capacity_tokens
    rows.append(
        (
            "kv_capacity_tokens",
            f"{capacity:,.0f}" if math.isfinite(capacity) else "inf",
            "",
            "measured" if math.isfinite(capacity) else "not recorded",
        )
    )
    rows.append(("kv_bytes_per_token", f"{cost.kv_bytes_per_token:,.0f} B", "", "from the config"))
    return text_table(rows, ["constant", "value", "uncertainty", "status"])


def held_out_text(calibration: Calibration) -> str:
    """The held-out error line: the number to trust. A pass whose refit predicts no time at all
    (the fit without its length crosses zero there, clamped to 0 ms: -100%) says nothing about
    how far off a prediction is, so it is named apart from the worst, and counted in the median
    (which it cannot move past the middle)."""
    held = [p for p in calibration.predictions if p.held_out is not None]
    if not held:
        return "Held-out error: not computed (needs 3 or more prompt lengths)."
    errors = [abs(p.held_out_error or 0.0) for p in held]
    nothing = [p for p in held if not p.held_out]
    worst = max((abs(p.held_out_error or 0.0) for p in held if p.held_out), default=None)
    text = (
        f"Held-out error (each prompt length refitted without it, then predicted): median "
        f"{statistics.median(errors):.1%}"
    )
    if worst is not None:
        text += f", worst {worst:.1%}"
    text += f" over {len(errors)} passes"
    if nothing:
        lengths = ", ".join(f"{t:,}" for t in sorted({p.point.x for p in nothing}))
        text += (
            f" ({len(nothing)} predicted 0 ms, at {lengths} tokens: the fit without that length "
            "crosses zero there, an extrapolation the worst leaves out)"
        )
    return (
        f"{text}; in-sample median {calibration.in_sample_median:.1%}. Trust the held-out figure."
    )


def _capped(calibration: Calibration) -> dict[str, float]:
    """The constants kept at a bound rather than refused (a fusion penalty fitted above 1)."""
    return {
        r.constant: float(r.numbers["used"])
        for r in calibration.refusals
        if isinstance(r.numbers.get("used"), (int, float)) and r.numbers["used"] != 0
    }


def refusals_text(calibration: Calibration) -> str:
    if not calibration.refusals:
        return "No constant refused."
    capped = _capped(calibration)
    return "\n".join(
        f"CAPPED {r.constant} at {capped[r.constant]:g}: {r.reason}"
        if r.constant in capped
        else f"REFUSED {r.constant} (recorded as 0 unless noted): {r.reason}"
        for r in calibration.refusals
    )


def warnings_text(points: Sequence[Point]) -> str:
    """pyperf-style stability warnings, one line per flagged measurement ('' when none)."""
    lines = [
        f"WARNING ({p.label()}): {p.measurement.warning}" for p in points if p.measurement.warning
    ]
    return "\n".join(lines)


def quiet_text(calibration: Calibration) -> str:
    quiet = calibration.provenance.get("quiet")
    if not isinstance(quiet, dict):
        return ""
    return str(quiet.get("warning") or "")


def calibration_tables(calibration: Calibration) -> dict[str, str]:
    """Named table texts: provenance, prefill, kv, batch, fused, constants."""
    return {
        "provenance": provenance_table(dict(calibration.provenance)),
        "prefill": prefill_table(calibration),
        "kv": decode_table(calibration.points("decode_kv"), calibration),
        "batch": decode_table(calibration.points("decode_batch"), calibration),
        "fused": fused_table(calibration),
        "constants": constants_table(calibration),
    }


def calibration_report(calibration: Calibration) -> str:
    """Everything a calibration prints, in order, as one text."""
    tables = calibration_tables(calibration)
    info = calibration.provenance
    sections = [
        "Calibration (provenance)\n" + tables["provenance"],
        f"Prefill and chunk passes (median of {info.get('repeats')} after {info.get('warmup')} "
        "warmup; fit = the cost model, held out = a fit without that prompt length)\n"
        + tables["prefill"],
        "Decode step, batch 1, per cached-token count\n" + tables["kv"],
        "Decode step per batch size\n" + tables["batch"],
        "Fused passes: max(decode, compute) + fusion_penalty x min(decode, compute)\n"
        + tables["fused"],
        "Cost model\n" + tables["constants"] + "\n\n" + refusals_text(calibration),
        held_out_text(calibration),
    ]
    skipped = info.get("skipped") or []
    if skipped:
        sections.append("Not measured:\n" + "\n".join(f"  {s}" for s in skipped))
    warnings = warnings_text(calibration.measurements)
    if warnings:
        sections.append(warnings + "\n(! marks an unstable measurement: read its spread.)")
    loud = quiet_text(calibration)
    if loud:
        sections.insert(0, loud)
        sections.append(loud)
    sections.append(calibration.chunk_star_text())
    return "\n\n".join(sections)
