"""The cost a planning command (``capacity``, ``simulate``, ``timeline``) runs on: derived from
``--model`` on ``--gpu``, else ``--cost``'s; the model a cost spec was measured on; and the
flags such a command takes. Apart from ``_deploy_args`` so that a command deriving compute
without a ``--cost`` to resolve (``verify --gpu``) does not import the cost flags' resolution."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from pytest_prefill.archive.cost_spec import CostSpec
from pytest_prefill.commands._compute_args import cost_document
from pytest_prefill.commands._deploy_args import (
    MODEL_HELP,
    Deploying,
    add_deploy_arguments,
    deployed_cost,
    derived_spec,
)
from pytest_prefill.commands._measure_args import (
    add_model_arguments,
    add_threads_argument,
    add_timing_arguments,
    resolve_cost_args,
)
from pytest_prefill.report.assumptions import PRESET_MODEL


def add_planning_arguments(parser: argparse.ArgumentParser) -> None:
    """What a command that simulates a deployment takes: ``--model`` (the deployment's, and
    what ``--cost measure`` calibrates), the deployment's devices (:func:`add_deploy_arguments`)
    and the flags ``--cost measure`` times the model with."""
    add_model_arguments(parser, deploy_help=MODEL_HELP)
    add_deploy_arguments(parser)
    add_timing_arguments(parser)
    add_threads_argument(parser)


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


def instance_spec(
    args: argparse.Namespace,
    deploying: Deploying,
    requests: Callable[[], Sequence[Any]],
    sep: str = "; ",
) -> tuple[Deploying, CostSpec]:
    """:func:`planning_cost`'s spec with its cost for one instance of --model at TP 1 and its
    source saying so (the model's and memory's lines after it, ``sep`` between them); and the
    ``deploying`` planning_cost leaves."""
    deploying, spec = planning_cost(args, deploying, requests)
    assert spec.cost is not None  # measured by resolve_cost_args
    hardware, profile = deploying.hardware, deploying.profile
    if hardware is None:
        return deploying, spec
    cost = deployed_cost(hardware, spec.cost, profile)
    lines = hardware.lines([1], profile.kv_block_tokens)
    return deploying, dataclasses.replace(spec, cost=cost, source=sep.join([spec.source, *lines]))


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
