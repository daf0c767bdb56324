"""Tables a person reads for a calibration (tabulate): provenance, the raw measurements with
their spread and stability warnings, the fitted constants and the refusals. Milliseconds here,
seconds everywhere else."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tabulate import tabulate

from pytest_prefill.timing import Measurement

if TYPE_CHECKING:
    from pytest_prefill.calibrate import Calibration, Point

PROVENANCE_KEYS = (
    "device_name",
    "device",
    "model",
    "model_source",
    "dtype",
    "attention",
    "torch",
    "transformers",
    "repeats",
    "warmup",
    "dry_run",
    "date",
)


def ms(seconds: float) -> str:
    """Seconds as a milliseconds cell with 3+ significant digits."""
    value = seconds * 1e3
    if not math.isfinite(value):
        return "-"
    return f"{value:,.2f}" if abs(value) >= 1 else f"{value:.3g}"


def spread(m: Measurement) -> str:
    return f"[{ms(m.minimum)}, {ms(m.maximum)}]"


def _table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    return tabulate(
        rows,
        headers=headers,
        tablefmt="simple",
        disable_numparse=True,
        colalign=("left",) + ("right",) * (len(headers) - 1),
    )


def _flag(m: Measurement) -> str:
    return "!" if m.warning else ""


def provenance_table(provenance: dict[str, Any]) -> str:
    rows = [(k, provenance[k]) for k in PROVENANCE_KEYS if k in provenance]
    return tabulate(rows, tablefmt="plain", disable_numparse=True)


def prefill_table(points: Sequence[Point], fit: Any = None) -> str:
    """Prefill pass per prompt length; ``fit`` (a ``timing.Fit``) adds the fitted line."""
    headers = ["prompt tokens", "prefill ms", "[min, max] ms", "IQR ms", "per token us"]
    if fit is not None:
        headers.append("fit ms")
    rows = []
    for p in sorted(points, key=lambda p: p.x):
        m = p.measurement
        row = [
            f"{p.x:,}",
            ms(m.median) + _flag(m),
            spread(m),
            ms(m.iqr),
            f"{m.median / p.x * 1e6:.1f}",
        ]
        if fit is not None:
            row.append(ms(fit.intercept + fit.slope * p.x))
        rows.append(row)
    return _table(rows, headers)


def kv_table(points: Sequence[Point]) -> str:
    """The decode step (batch 1) per cached-token count, and its ratio to the shortest cache."""
    ordered = sorted(points, key=lambda p: p.x)
    if not ordered:
        return "(no decode measurements)"
    first = ordered[0].measurement.median
    rows = [
        (
            f"{p.x:,}",
            ms(p.measurement.median) + _flag(p.measurement),
            spread(p.measurement),
            ms(p.measurement.iqr),
            f"{p.measurement.median / first:.2f}x",
        )
        for p in ordered
    ]
    return _table(
        rows,
        [
            "cached tokens",
            "decode step ms",
            "[min, max] ms",
            "IQR ms",
            f"x {ordered[0].x:,} cached",
        ],
    )


def batch_table(points: Sequence[Point]) -> str:
    """The decode step per batch size (each sequence holding the same cache length)."""
    ordered = sorted(points, key=lambda p: p.x)
    if not ordered:
        return "(no batch sweep in this run)"
    first = ordered[0].measurement.median
    rows = [
        (
            str(p.x),
            f"{p.context:,}",
            ms(p.measurement.median) + _flag(p.measurement),
            spread(p.measurement),
            ms(p.measurement.iqr),
            f"{p.measurement.median / first:.2f}x",
        )
        for p in ordered
    ]
    return _table(
        rows,
        [
            "batch",
            "cached each",
            "decode step ms",
            "[min, max] ms",
            "IQR ms",
            f"x batch {ordered[0].x}",
        ],
    )


def constants_table(calibration: Calibration) -> str:
    """The cost model's constants, their uncertainty from the fits, and which were refused."""
    cost, fits = calibration.cost, calibration.fits
    refused = {r.constant for r in calibration.refusals}

    def status(name: str) -> str:
        return "REFUSED (0)" if name in refused else "fitted"

    def plus_minus(fit_name: str, attr: str, scale: float, fmt: str) -> str:
        fit = fits.get(fit_name)
        return f"+/- {getattr(fit, attr) * scale:{fmt}}" if fit is not None else ""

    prefill = fits.get("prefill")
    overhead_note = (
        plus_minus("prefill", "intercept_stderr", 1e3, ".3g") + " ms"
        if prefill is not None and not prefill.refused
        else ""
    )
    rows = [
        (
            "prefill_pass_overhead",
            f"{ms(cost.prefill_pass_overhead)} ms",
            overhead_note,
            status("prefill_pass_overhead"),
        ),
        (
            "prefill_per_token",
            f"{cost.prefill_per_token * 1e6:.3g} us",
            plus_minus("prefill", "slope_stderr", 1e6, ".2g") + " us",
            status("prefill_per_token"),
        ),
        (
            "decode_step_base",
            f"{ms(cost.decode_step_base)} ms",
            plus_minus("decode_kv", "intercept_stderr", 1e3, ".3g") + " ms"
            if "decode_kv" in fits
            else "",
            status("decode_step_base"),
        ),
        (
            "decode_per_kv_token",
            f"{cost.decode_per_kv_token * 1e9:.3g} ns",
            plus_minus("decode_kv", "slope_stderr", 1e9, ".2g") + " ns"
            if "decode_kv" in fits
            else "",
            status("decode_per_kv_token"),
        ),
        (
            "decode_per_seq",
            f"{ms(cost.decode_per_seq)} ms",
            plus_minus("decode_batch", "slope_stderr", 1e3, ".2g") + " ms"
            if "decode_batch" in fits
            else "",
            status("decode_per_seq"),
        ),
        ("kv_bytes_per_token", f"{cost.kv_bytes_per_token:,.0f} B", "", "from the config"),
    ]
    return _table(rows, ["constant", "value", "uncertainty", "status"])


def refusals_text(calibration: Calibration) -> str:
    if not calibration.refusals:
        return "No constant refused."
    return "\n".join(
        f"REFUSED {r.constant} (recorded as 0 unless noted): {r.reason}"
        for r in calibration.refusals
    )


def warnings_text(points: Sequence[Point]) -> str:
    """pyperf-style stability warnings, one line per flagged measurement ('' when none)."""
    names = {
        "prefill": "prefill {x} tokens",
        "decode_kv": "decode, {x} cached tokens",
        "decode_batch": "decode, batch {x}",
    }
    lines = [
        f"WARNING ({names[p.kind].format(x=f'{p.x:,}')}): {p.measurement.warning}"
        for p in points
        if p.measurement.warning
    ]
    return "\n".join(lines)


def calibration_tables(calibration: Calibration) -> dict[str, str]:
    return {
        "provenance": provenance_table(dict(calibration.provenance)),
        "prefill": prefill_table(calibration.points("prefill"), calibration.fits.get("prefill")),
        "kv": kv_table(calibration.points("decode_kv")),
        "batch": batch_table(calibration.points("decode_batch")),
        "constants": constants_table(calibration),
    }


def calibration_report(calibration: Calibration) -> str:
    """Everything a calibration prints, in order, as one text."""
    tables = calibration.tables()
    repeats = calibration.provenance.get("repeats")
    warmup = calibration.provenance.get("warmup")
    sections = [
        "Calibration (provenance)\n" + tables["provenance"],
        f"Prefill pass into a fresh cache (median of {repeats} after {warmup} warmup)\n"
        + tables["prefill"],
        "Decode step, batch 1, per cached-token count\n" + tables["kv"],
        "Decode step per batch size\n" + tables["batch"],
        "Cost model\n" + tables["constants"] + "\n\n" + refusals_text(calibration),
    ]
    warnings = warnings_text(calibration.measurements)
    if warnings:
        sections.append(warnings + "\n(! marks an unstable measurement: read its spread.)")
    sections.append(calibration.chunk_star_text())
    return "\n\n".join(sections)
