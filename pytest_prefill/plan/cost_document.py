"""Where a cost model comes from: a preset name, or a JSON file (a bare cost model, a
calibration, or an archived run). Standard library only."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from pytest_prefill._io import read_json
from pytest_prefill.plan.advice import Trust
from pytest_prefill.sim import PRESETS, CostModel, get_preset

RUN_KIND = "pytest-prefill/run"
CALIBRATION_KIND = "pytest-prefill/calibration"
# The newest schema version of each document kind this version reads (it reads 1 .. newest).
SCHEMA_VERSIONS = {RUN_KIND: 1, CALIBRATION_KIND: 2}  # calibration 2: cost model v2 fits
# The range a cost read from a document may take (docs/simulator.md, "Costs a document may
# hold"): a pass (a decode step, a one-token prefill) of at least a picosecond, and no term
# (a pass's, a token's, a sequence's or an attention pair's share) over an hour. Outside it
# no device is described, and the times derived from it are beyond what a report can print.
SHORTEST_PASS = 1e-12
LONGEST_TERM = 3600.0
SECONDS_TERMS = (
    "prefill_pass_overhead",
    "prefill_per_token",
    "decode_step_base",
    "decode_per_seq",
    "decode_per_kv_token",
    "link_latency",
    "prefill_per_pair",
    "batch_attention_per_pair",
    "prefill_floor",
)


def check_schema(data: Any, origin: str) -> None:
    """ValueError naming ``origin`` when ``data`` is a run or calibration document whose
    ``schema_version`` is not an integer this version reads (a bool is not an integer; a run
    must have one, a calibration without one is read as version 1)."""
    if not isinstance(data, Mapping) or not isinstance(data.get("kind"), str):
        return
    if data["kind"] not in SCHEMA_VERSIONS:
        return
    newest = SCHEMA_VERSIONS[data["kind"]]
    if data["kind"] == CALIBRATION_KIND and "schema_version" not in data:
        return  # a calibration written by hand, or inside a run: read as version 1
    version = data.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= newest:
        raise ValueError(
            f"{origin}: schema_version {version!r} of a {data['kind']} document is not one this "
            f"version reads (an integer, 1..{newest})"
        )


def check_calibration(data: Mapping[str, Any], origin: str) -> None:
    """ValueError naming ``origin`` and the field when a calibration's ``fits``, ``refusals``
    or ``measurements`` (each optional) do not have the shape calibrate writes."""
    fits = data.get("fits")
    if fits is not None and not (
        isinstance(fits, Mapping) and all(isinstance(f, Mapping) for f in fits.values())
    ):
        raise ValueError(
            f"{origin}: calibration 'fits' must be an object of fits, got {fits!r:.80}"
        )
    refusals = data.get("refusals")
    if refusals is not None and not (
        isinstance(refusals, list)
        and all(isinstance(r, Mapping) and isinstance(r.get("constant"), str) for r in refusals)
    ):
        raise ValueError(
            f"{origin}: calibration 'refusals' must be a list of objects naming a 'constant', "
            f"got {refusals!r:.80}"
        )
    measurements = data.get("measurements")
    if measurements is not None and not isinstance(measurements, list):
        raise ValueError(
            f"{origin}: calibration 'measurements' must be a list, got {measurements!r:.80}"
        )


def check_cost_range(cost: CostModel, origin: str) -> CostModel:
    """``cost``, where each term lies in the range a document's cost may take
    (:data:`SHORTEST_PASS` to :data:`LONGEST_TERM`).

    Raises:
        ValueError: in one line naming ``origin`` (where not ""), the field, its value and
            the range.
    """
    where = f"{origin}: " if origin else ""
    for name in SECONDS_TERMS:
        value = getattr(cost, name)
        if value > LONGEST_TERM:
            raise ValueError(
                f"{where}cost_model.{name} is {value:.3g} s, over {LONGEST_TERM:g} s (an "
                f"hour): a cost term is 0 or at most an hour"
            )
    passes = {
        "decode_step_base": cost.decode_step_base,
        "prefill_pass_overhead + prefill_per_token": cost.prefill_pass_overhead
        + cost.prefill_per_token,
    }
    for name, value in passes.items():
        if value < SHORTEST_PASS:
            raise ValueError(
                f"{where}cost_model.{name} is {value:.3g} s, under {SHORTEST_PASS:g} s (a "
                "picosecond): a pass lasts at least that"
            )
    return cost


def cost_from_json(data: Any, origin: str) -> CostModel:
    """The cost model inside a parsed JSON document: a bare cost model, an object with a
    ``cost_model`` key (a calibration), or one with ``calibration.cost_model`` (an archived run).

    Raises:
        ValueError: naming ``origin``, when there is no valid cost model there, a run or
            calibration has a schema version this version does not read, a calibration's
            fits or refusals are malformed, or a cost term is out of range
            (:func:`check_cost_range`).
    """
    check_schema(data, origin)
    if isinstance(data, Mapping):
        if isinstance(data.get("calibration"), Mapping):
            data = data["calibration"]
            check_schema(data, origin)
        if isinstance(data.get("cost_model"), Mapping):
            check_calibration(data, origin)
            data = data["cost_model"]
    try:
        cost = CostModel.from_dict(data)
    except (ValueError, OverflowError) as err:  # an int too large for a float overflows
        raise ValueError(f"{origin}: not a cost model, calibration or run file ({err})") from None
    return check_cost_range(cost, origin)


def load_cost(spec: str) -> tuple[CostModel, str]:
    """Resolve ``spec`` (a preset name or a JSON path) to a cost model and a line saying where
    it came from.

    Raises:
        ValueError: for an unknown preset; or naming the file, when it is missing, not a regular
            file, too large, not UTF-8 JSON, or holds no cost model.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"cost must be a preset name ({', '.join(PRESETS)}) or a JSON path")
    if spec in PRESETS:
        preset = get_preset(spec)
        # as the plugin's summary says it: never read as a measurement of this machine
        return preset.cost, f"preset '{preset.name}' [not measured here]: {preset.source}"
    if spec.endswith(".json") or os.path.sep in spec:
        return cost_from_json(read_json(spec, "cost file"), spec), f"file {spec}"
    raise ValueError(
        f"unknown cost {spec!r}: give a preset ({', '.join(PRESETS)}) or a path to a JSON file"
    )


def trust_in(document: Any) -> Trust | None:
    """How far the calibration inside a parsed calibration or run document may be trusted: its
    held-out error, whether the machine was busy, how many measurements were unstable (None for
    a bare cost model, a preset, or anything that is not a calibration)."""
    if not isinstance(document, Mapping):
        return None
    calibration = document.get("calibration", document)
    if not isinstance(calibration, Mapping) or "cost_model" not in calibration:
        return None
    if "provenance" not in calibration and "measurements" not in calibration:
        return None  # a bare cost model
    held = calibration.get("held_out_median_error")
    provenance = calibration.get("provenance")
    quiet = provenance.get("quiet") if isinstance(provenance, Mapping) else None
    busy = quiet.get("quiet") if isinstance(quiet, Mapping) else None
    measurements = calibration.get("measurements")
    unstable = sum(
        1
        for m in (measurements if isinstance(measurements, list) else [])
        if isinstance(m, Mapping)
        and isinstance(m.get("measurement"), Mapping)
        and m["measurement"].get("warning")
    )
    return Trust(
        float(held) if isinstance(held, (int, float)) and not isinstance(held, bool) else None,
        (not busy) if isinstance(busy, bool) else None,
        unstable,
    )
