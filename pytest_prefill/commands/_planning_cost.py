"""The cost a planning command (``capacity``, ``simulate``, ``timeline``) runs on: derived from
``--model`` on ``--gpu``, else ``--cost``'s; and the model a cost spec was measured on. Apart
from ``_deploy_args`` so that a command deriving compute without a ``--cost`` to resolve
(``verify --gpu``) does not import the cost flags' resolution."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from pytest_prefill.archive.cost_spec import CostSpec
from pytest_prefill.commands._compute_args import cost_document
from pytest_prefill.commands._deploy_args import Deploying, derived_spec
from pytest_prefill.commands._measure_args import resolve_cost_args
from pytest_prefill.report.assumptions import PRESET_MODEL


def planning_cost(
    args: argparse.Namespace, deploying: Deploying, requests: Callable[[], Sequence[Any]]
) -> tuple[Deploying, CostSpec]:
    """The cost spec a planning command runs on: derived from --model on --gpu over the token
    range of ``requests()`` (called only then) when ``deploying.derive``, else --cost's (its
    default when unset); and ``deploying`` with the hardware a derivation leaves."""
    if not deploying.derive:
        return deploying, resolve_cost_args(args, deploying.cost)
    load = requests()
    return derived_spec(args, deploying, [r.prompt_len for r in load], [r.output_len for r in load])


def measured_model(spec: CostSpec) -> str | None:
    """The model a cost spec's numbers were measured on (None: it does not say): the presets'
    Qwen3-0.6B, a calibration file's provenance."""
    if spec.kind == "preset":
        return PRESET_MODEL
    document = cost_document(spec)
    calibration = document.get("calibration", document) if isinstance(document, dict) else None
    provenance = calibration.get("provenance") if isinstance(calibration, dict) else None
    model = provenance.get("model") if isinstance(provenance, dict) else None
    return str(model) if model else None
