"""Two calibrations side by side: every cost-model constant, its relative difference, and
whether the difference is beyond both runs' recorded spread; then each side's C* and
recommendation. Standard library and tabulate only (no torch, no numpy).

A constant's spread is the half-width the calibration's own numbers support. A calibration of
cost model v2 records each constant's standard error, and the spread is 2 of them. An older one
recorded straight-line fits: for a slope, the larger of 2 standard errors and the fit's scatter
spread over its x range; for an intercept (pass overhead, decode step), the larger of 2 standard
errors and the scatter. Two values differ *beyond spread* when ``|a - b| > spread_a +
spread_b``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tabulate import tabulate

from pytest_prefill._io import read_json
from pytest_prefill.archive.cost_spec import contexts_in, refusals_in
from pytest_prefill.archive.runs import (
    RUN_ID,
    Warn,
    find_run,
    latest_run,
    machines,
    run_from_document,
)
from pytest_prefill.machine import KEY_PATTERN
from pytest_prefill.plan.advice import FittedCost, chunk_star_text
from pytest_prefill.plan.cost_document import CALIBRATION_KIND, cost_from_json, trust_in
from pytest_prefill.sim import CostModel


def _ignore(_: str) -> None:
    pass


# constant -> (fit name, term, unit label, scale to print)
CONSTANTS: dict[str, tuple[str | None, str | None, str, float]] = {
    "prefill_pass_overhead": ("prefill", "intercept", "ms", 1e3),
    "prefill_per_token": ("prefill", "slope", "us/token", 1e6),
    "decode_step_base": ("decode_kv", "intercept", "ms", 1e3),
    "decode_per_seq": ("decode_batch", "slope", "us/row", 1e6),
    "decode_per_kv_token": ("decode_kv", "slope", "ns/token", 1e9),
    "prefill_per_pair": ("prefill", "slope", "ns/pair", 1e9),
    "fusion_penalty": ("fused", "value", "fraction", 1.0),
    "batch_attention_per_pair": (None, None, "ns/pair", 1e9),
    "kv_bytes_per_token": (None, "exact", "bytes", 1.0),
    "kv_capacity_tokens": (None, "exact", "tokens", 1.0),
    "link_bandwidth": (None, None, "GB/s", 1e-9),
    "link_latency": (None, None, "us", 1e6),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Side:
    """One side of a comparison: a label, its cost model, and its calibration (if any)."""

    label: str
    origin: str
    cost: CostModel
    calibration: Mapping[str, Any] | None

    def refused(self, constant: str) -> bool:
        refusals = (self.calibration or {}).get("refusals")
        return isinstance(refusals, list) and any(
            isinstance(r, Mapping) and r.get("constant") == constant for r in refusals
        )

    def spread(self, constant: str) -> float | None:
        """The half-width this side's calibration supports for ``constant`` (seconds, tokens
        or bytes like the constant); None when it recorded none."""
        fit_name, term, _, _ = CONSTANTS[constant]
        if term == "exact":
            return 0.0
        if self.calibration is None or fit_name is None:
            return None
        fits = self.calibration.get("fits")
        stderr = _v2_stderr(fits, constant)
        if stderr is not None:
            return 2 * stderr
        fit = fits.get(fit_name) if isinstance(fits, Mapping) else None
        if not isinstance(fit, Mapping):
            if constant == "decode_step_base":
                return _single_point_spread(self.calibration, "decode_kv")
            return None
        try:
            scatter = float(fit["scatter"])
            if term == "slope":
                x_range = float(fit["x_range"])
                return max(
                    2 * float(fit["slope_stderr"]), scatter / x_range if x_range > 0 else math.inf
                )
            if fit.get("refused"):  # the constant is the mean level of the points
                return scatter
            return max(2 * float(fit["intercept_stderr"]), scatter)
        except (KeyError, TypeError, ValueError, OverflowError):
            return None


def _v2_stderr(fits: Any, constant: str) -> float | None:
    """``constant``'s standard error in a cost model v2 calibration's fits (groups of terms,
    each with ``stderrs`` by name), or None when these fits are not of that shape."""
    if not isinstance(fits, Mapping):
        return None
    for group in fits.values():
        stderrs = group.get("stderrs") if isinstance(group, Mapping) else None
        if isinstance(stderrs, Mapping) and constant in stderrs:
            try:
                value = float(stderrs[constant])
            except (TypeError, ValueError, OverflowError):
                return None
            return value if math.isfinite(value) and value >= 0 else None
    return None


def _single_point_spread(calibration: Mapping[str, Any], kind: str) -> float | None:
    measurements = calibration.get("measurements")
    points = [
        p
        for p in (measurements if isinstance(measurements, list) else [])
        if isinstance(p, Mapping) and p.get("kind") == kind
    ]
    if len(points) != 1:
        return None
    measurement = points[0].get("measurement")
    iqr = measurement.get("iqr") if isinstance(measurement, Mapping) else None
    if isinstance(iqr, bool) or not isinstance(iqr, (int, float)):
        return None
    try:
        return float(iqr)
    except OverflowError:
        return None


def side_from_document(data: Mapping[str, Any], label: str, origin: str) -> Side:
    """A side from a parsed run file or calibration file.

    Raises:
        ValueError: when the document holds no cost model.
    """
    calibration = None
    if data.get("kind") == CALIBRATION_KIND:
        calibration = data
    elif isinstance(data.get("calibration"), Mapping):
        calibration = data["calibration"]
    if calibration is not None:
        return Side(label, origin, cost_from_json(calibration, origin), calibration)
    cost = data.get("cost")
    if isinstance(cost, Mapping) and isinstance(cost.get("cost_model"), Mapping):
        source = cost.get("source", "unknown source")
        return Side(
            label,
            f"{origin} (not measured in that run; its cost model: {source})",
            cost_from_json(cost["cost_model"], origin),
            None,
        )
    raise ValueError(f"{origin}: holds no calibration and no cost model")


def load_side(
    ref: str,
    results: str | os.PathLike[str],
    label: str,
    *,
    warn: Warn = _ignore,
    machine: str | None = None,
) -> Side:
    """A side named by ``ref``: a run id (``0001`` -- a run of ``machine`` -- or
    ``KEY/0001``, as ``prefill-bench runs`` lists them), a run file, a calibration file, or a
    machine key (its latest run with a calibration, under ``results``).

    Raises:
        ValueError: naming ``ref``, when it is none of those or holds nothing to compare.
    """
    numbered = RUN_ID.match(ref)
    if numbered and not os.path.isfile(ref):
        key = numbered.group(1) or machine
        if key is None:
            raise ValueError(f"{ref!r}: a bare run number needs a machine (give KEY/{ref})")
        found = find_run(results, key, int(numbered.group(2)), warn=warn)
        return side_from_document(found.data, label, str(found.path))
    if ref.endswith(".json") or os.sep in ref or os.path.exists(ref):
        data = read_json(ref, "file")
        if isinstance(data, Mapping) and data.get("kind") == CALIBRATION_KIND:
            return side_from_document(data, label, ref)
        run = run_from_document(ref, data)
        return side_from_document(run.data, label, str(run.path))
    if not KEY_PATTERN.match(ref):
        raise ValueError(f"{ref!r} is neither a JSON file nor a machine key")
    latest = latest_run(results, ref, warn=warn, with_calibration=True)
    if latest is None:
        raise ValueError(
            f"no calibrated run archived for machine {ref!r} in {Path(results) / ref} "
            f"(machines under {results}: {', '.join(machines(results)) or 'none'})"
        )
    return side_from_document(latest.data, label, str(latest.path))


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One constant on both sides."""

    constant: str
    unit: str
    a: float
    b: float
    spread_a: float | None
    spread_b: float | None
    refused_a: bool
    refused_b: bool

    @property
    def relative(self) -> float:
        """(b - a) / a; NaN when a is 0 (or both are infinite)."""
        if self.a == self.b:
            return 0.0
        if self.a == 0 or math.isinf(self.a):
            return math.nan
        return (self.b - self.a) / self.a

    @property
    def beyond(self) -> str:
        """yes / no / 'unknown' (a side recorded no spread) / 'assumed' (not a measurement)."""
        if CONSTANTS[self.constant][1] is None:
            return "assumed"
        if self.spread_a is None or self.spread_b is None:
            return "unknown"
        return "yes" if abs(self.b - self.a) > self.spread_a + self.spread_b else "no"


def compare(a: Side, b: Side) -> list[Row]:
    """Every cost-model constant of ``a`` and ``b``."""
    return [
        Row(
            name,
            CONSTANTS[name][2],
            getattr(a.cost, name),
            getattr(b.cost, name),
            a.spread(name),
            b.spread(name),
            a.refused(name),
            b.refused(name),
        )
        for name in CONSTANTS
    ]


def _number(value: float, digits: int) -> str:
    """Plain digits for a table: ``digits`` significant figures, never an exponent above 1."""
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0 or abs(value) >= 10 ** (digits - 1):
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:,.{digits - 1 - int(math.floor(math.log10(abs(value))))}f}"
    return f"{value:.{digits}g}"


def _show(value: float, scale: float, refused: bool) -> str:
    text = _number(value * scale, 4)
    return f"{text} (refused)" if refused else text


def _plus_minus(spread: float | None, scale: float) -> str:
    return "-" if spread is None else "±" + _number(spread * scale, 2)


def compare_table(a: Side, b: Side, rows: list[Row] | None = None) -> str:
    """The side-by-side table: value and spread on each side, relative difference, verdict."""
    rows = compare(a, b) if rows is None else rows
    body = []
    for r in rows:
        scale = CONSTANTS[r.constant][3]
        relative = "-" if math.isnan(r.relative) else f"{r.relative:+.1%}"
        body.append(
            (
                r.constant,
                r.unit,
                _show(r.a, scale, r.refused_a),
                _plus_minus(r.spread_a, scale),
                _show(r.b, scale, r.refused_b),
                _plus_minus(r.spread_b, scale),
                relative,
                r.beyond,
            )
        )
    headers = ("constant", "unit", a.label, "spread", b.label, "spread", "B vs A", "beyond spread?")
    return tabulate(
        body,
        headers=headers,
        tablefmt="simple",
        disable_numparse=True,
        colalign=("left", "left", "right", "right", "right", "right", "right", "left"),
    )


def gate(rows: Sequence[Row], percent: float) -> tuple[list[Row], list[Row]]:
    """(the constants that differ beyond both spreads *and* by more than ``percent`` %, the
    constants that could not be judged: a side recorded no spread, or refused the constant).
    Link constants are stated, not measured, and never gate."""
    if not (isinstance(percent, (int, float)) and math.isfinite(percent) and percent >= 0):
        raise ValueError(f"percent must be a finite number >= 0, got {percent!r}")
    failed, unjudged = [], []
    for r in rows:
        if r.beyond == "assumed":
            continue
        if r.refused_a or r.refused_b or r.beyond == "unknown":
            unjudged.append(r)
        elif r.beyond == "yes" and not abs(r.relative) <= percent / 100:
            failed.append(r)  # NaN relative (A is 0) counts as beyond any percentage
    return failed, unjudged


def gate_lines(rows: Sequence[Row], percent: float) -> tuple[bool, list[str]]:
    """(whether the gate passed, the lines that say so)."""
    failed, unjudged = gate(rows, percent)
    lines = []
    for r in failed:
        relative = "from 0" if math.isnan(r.relative) else f"{r.relative:+.1%}"
        lines.append(f"  {r.constant}: {relative}, beyond both spreads")
    if unjudged:
        names = ", ".join(r.constant for r in unjudged)
        lines.append(f"  not judged (a side refused it or recorded no spread): {names}")
    head = (
        f"--fail-above {percent:g}%: FAIL, {len(failed)} constant(s) differ beyond both "
        f"spreads and by more than {percent:g}%"
        if failed
        else f"--fail-above {percent:g}%: pass, no constant differs beyond both spreads and "
        f"by more than {percent:g}%"
    )
    return not failed, [head, *lines]


def verdict_lines(side: Side) -> list[str]:
    """C* and the recommendation for one side, in the words calibrate prints (its own
    calibration's refusals included: a refused per-token cost means no recommendation)."""
    basis = side.calibration
    fitted = FittedCost(
        side.cost, frozenset(refusals_in(basis)), contexts_in(basis), trust_in(basis)
    )
    return chunk_star_text(fitted).splitlines()


def measured_setup(side: Side) -> dict[str, str]:
    """What a side's calibration measured (model, dtype, runner), as it recorded it."""
    info = (side.calibration or {}).get("provenance")
    if not isinstance(info, Mapping):
        return {}
    return {k: str(info[k]) for k in ("model", "dtype", "runner") if info.get(k) is not None}


def setup_note(a: Side, b: Side) -> str:
    """A loud line when the two sides measured different models (or dtypes): their constants
    then differ by construction, and a gate's FAIL says nothing about the hardware."""
    left, right = measured_setup(a), measured_setup(b)
    differ = [k for k in left if k in right and left[k] != right[k]]
    if not differ:
        return ""
    pairs = ", ".join(f"{k} {left[k]} vs {right[k]}" for k in differ)
    return (
        f"NOTE: the two sides measured different setups ({pairs}): their constants differ "
        "by construction, not only by hardware."
    )


def comparison_report(a: Side, b: Side) -> str:
    """The whole printed comparison."""
    note = setup_note(a, b)
    lines = [
        f"{a.label}: {a.origin}",
        f"{b.label}: {b.origin}",
        *([note] if note else []),
        "",
        compare_table(a, b),
        "",
        "spread: the half-width each calibration's own fits support (2 standard errors or "
        "the measured scatter, whichever is larger);",
        "beyond spread? yes when |B - A| > spread A + spread B; 'assumed' marks link "
        "constants, which are stated, not measured.",
        "",
    ]
    for side in (a, b):
        lines.append(f"{side.label}:")
        lines += [f"  {line}" if line else "" for line in verdict_lines(side)]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
