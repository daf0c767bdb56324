"""Where a cost model comes from: a preset name, or a JSON file (a bare cost model, a
calibration, or an archived run). Standard library only."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from pytest_prefill.scheduler import PRESETS, CostModel, get_preset


def cost_from_json(data: Any, origin: str) -> CostModel:
    """The cost model inside a parsed JSON document: a bare cost model, an object with a
    ``cost_model`` key (a calibration), or one with ``calibration.cost_model`` (an archived run)."""
    if isinstance(data, Mapping):
        if isinstance(data.get("calibration"), Mapping):
            data = data["calibration"]
        if isinstance(data.get("cost_model"), Mapping):
            data = data["cost_model"]
    try:
        return CostModel.from_dict(data)
    except ValueError as err:
        raise ValueError(f"{origin}: not a cost model, calibration or run file ({err})") from None


def load_cost(spec: str) -> tuple[CostModel, str]:
    """Resolve ``spec`` (a preset name or a JSON path) to a cost model and a line saying where
    it came from.

    Raises:
        ValueError: for an unknown preset, a missing file, or a file that holds no cost model.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"cost must be a preset name ({', '.join(PRESETS)}) or a JSON path")
    if spec in PRESETS:
        preset = get_preset(spec)
        return preset.cost, f"preset '{preset.name}': {preset.source}"
    if spec.endswith(".json") or os.path.sep in spec:
        if not os.path.isfile(spec):
            raise ValueError(f"cost file {spec!r} does not exist")
        try:
            with open(spec, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"cost file {spec!r} cannot be read as JSON ({err})") from None
        return cost_from_json(data, spec), f"file {spec}"
    raise ValueError(
        f"unknown cost {spec!r}: give a preset ({', '.join(PRESETS)}) or a path to a JSON file"
    )
