"""``--gpu`` and ``--host-from`` on the commands that plan: the compute derived from
``--model``'s shapes on a catalog device (DESIGN.md, "Compute from the model and the device"),
a calibration's host cost carried into it, and the facts a cost document records of the server
it measured."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
from collections.abc import Callable, Sequence
from typing import Any

from pytest_prefill.archive.cost_spec import CostSpec, resolve_cost
from pytest_prefill.plan.compute.derive import (
    Deriver,
    HostCost,
    TokenRange,
    derive_cost,
    fit_percent,
    host_from_calibration,
)
from pytest_prefill.plan.compute.devices import CATALOG, Device, device_named
from pytest_prefill.plan.compute.efficiency import EfficiencyChoice, efficiency_for
from pytest_prefill.plan.compute.host import tabled_host
from pytest_prefill.plan.compute.transfer import (
    CPU_KEY,
    Transferred,
    calibration_span,
    probed_device,
    transferred,
)
from pytest_prefill.plan.device_memory import default_max_num_seqs
from pytest_prefill.plan.hardware import Hardware
from pytest_prefill.plan.model_spec import ModelSpec, load_model_spec
from pytest_prefill.serve.client.identity import ServerFacts
from pytest_prefill.sim import CostModel

EACH_TP = "each deployment's cost model derived at its own TP"  # a search's several TPs


def probed_cpu(args: argparse.Namespace) -> Device:
    """``--gpu cpu``: this machine's CPU, as the --host-from calibration recorded its probe."""
    path = getattr(args, "host_from", None)
    if not path:
        raise ValueError(
            "cpu: this machine's CPU has no datasheet: its peaks come from the calibration that "
            "recorded them; give --host-from CALIBRATION.json (made by calibrate-server "
            "--device-probe PROBE.json)"
        )
    return probed_device(provenance_at(path), f"--host-from {path}")


def calibration_at(path: str) -> tuple[CostModel, dict[str, Any]]:
    """The cost model of the calibration at ``path`` and its document (a provenance in it).

    Raises:
        ValueError: in one line, for a file that is not a calibration with a provenance.
    """
    if not os.path.isfile(path):
        raise ValueError(
            f"--host-from {path}: no such file (give the JSON calibrate or calibrate-server wrote)"
        )
    try:
        spec = resolve_cost(path)
    except ValueError as err:
        raise ValueError(f"--host-from {path}: not a calibration ({err})") from None
    document = cost_document(spec)
    calibration = document.get("calibration", document) if isinstance(document, dict) else None
    provenance = calibration.get("provenance") if isinstance(calibration, dict) else None
    if spec.cost is None or not isinstance(calibration, dict) or not isinstance(provenance, dict):
        raise ValueError(f"--host-from {path}: not a calibration with a provenance")
    return spec.cost, calibration


def provenance_at(path: str) -> dict[str, Any]:
    return dict(calibration_at(path)[1]["provenance"])


def efficiency_of(device: Device, engine: str) -> EfficiencyChoice:
    """The efficiency table for ``device`` under ``engine``, else vLLM's (the engine with the
    public per-op data), saying so in its error class.

    Raises:
        ValueError: in one line, when no shipped table can stand for the device.
    """
    try:
        return efficiency_for(device, engine)
    except ValueError as err:
        if engine == "vllm" or "has no efficiency table" not in str(err):
            raise ValueError(f"--gpu {device.key}: {err}") from None
    try:
        choice = efficiency_for(device, "vllm")
    except ValueError as err:
        raise ValueError(f"--gpu {device.key}: {err}") from None
    return dataclasses.replace(
        choice, error_class=f"{choice.error_class}; vLLM's kernels standing for {engine}'s"
    )


def derive_on(
    hardware: Hardware,
    device: Device,
    engine: str,
    prompts: Sequence[int],
    outputs: Sequence[int],
    host: Callable[[TokenRange], HostCost] | None = None,
    carried: Callable[[TokenRange], Transferred] | None = None,
) -> tuple[Hardware, CostSpec]:
    """``hardware`` deriving its cost at every TP from its model on ``device`` under
    ``engine``'s efficiency table, over the token range of ``prompts`` and ``outputs``, and the
    cost spec of one instance at TP 1 (its label names the device, the table and its error
    class); ``host(span)``: the host cost (default the engine's tabled one, :func:`tabled_host`); ``carried(span)``: the device, its
    efficiencies and the host's cost a calibration carries instead (a CPU's)."""
    rows = hardware.max_num_seqs or default_max_num_seqs(hardware.device_memory or 0.0)
    try:
        span = TokenRange.of(prompts, outputs, rows)
    except ValueError as err:
        raise ValueError(f"--gpu: the workload's token range: {err}") from None
    step = None
    if carried is not None:
        device, choice, found, step = carried(span)
    else:
        choice, found = efficiency_of(device, engine), host(span) if host else tabled_host(engine)
    deriver = Deriver(hardware.model, device, choice, span, found, step)
    one = deriver.derive(1)
    label = (
        f"derived for {device.name} from {hardware.model.name}'s shapes, efficiency "
        f"{choice.table.engine}: {choice.error_class}; the cost model within "
        f"{fit_percent(one.max_relative_error)} of the physics over {span.describe()}"
    )
    spec = CostSpec(
        f"derived:{device.key}",
        "derived",
        one.cost,
        f"{one.basis}; {EACH_TP}",
        label,
        tuple(sorted(one.refused)),
    )
    return dataclasses.replace(hardware, derived=deriver), spec


def host_from_cost(path: str, engine: str, span: TokenRange) -> HostCost:
    """The host cost --host-from's calibration at ``path`` implies: its measured decode terms
    less the compute derived (with ``engine``'s efficiencies) for the model and device its
    provenance names (at its TP).

    Raises:
        ValueError: in one line, for a file that is not a calibration, or a model or device
            its provenance does not name in a form read here.
    """
    measured, calibration = calibration_at(path)
    provenance = calibration["provenance"]
    facts = server_facts_of(resolve_cost(path))
    if provenance.get("device_probe") is not None:
        raise ValueError(
            f"--host-from {path}: a calibration on this machine's CPU (it recorded the CPU's "
            "probe) carries to --gpu cpu, not to a catalog device"
        )
    try:
        model = load_model_spec(str(provenance.get("model")))
    except ValueError as err:
        raise ValueError(f"--host-from {path}: its provenance: {err}") from None
    name = str(provenance.get("device_name"))
    try:
        device = device_named(name)
    except ValueError:
        raise ValueError(
            f"--host-from {path}: its provenance names the device {name!r}, which is not in "
            f"the catalog ({', '.join(CATALOG)}): the host cost carries from a calibration on "
            "a catalog GPU (one on this machine's CPU, with its probe, to --gpu cpu)"
        ) from None
    tp = facts.tp if facts is not None else 1
    part = derive_cost(model, device, efficiency_of(device, engine), span, tp=tp)
    return host_from_calibration(
        measured,
        part.cost,
        f"--host-from {path} ({model.name} on {device.key}, TP {tp}): a transfer",
    )


def cpu_transfer(path: str, model: ModelSpec, cpu: Device, _span: TokenRange) -> Transferred:
    """--host-from's calibration (at ``path``) of a model on this CPU carried to ``model`` on
    it (``cpu``, as probed): the CPU's efficiencies and the host's cost per layer that
    calibration implies, read over the calibration's own range (the deriver fits --model over
    the workload's, ``_span``), with the decode step of the engine it measured.

    Raises:
        ValueError: in one line, for a calibration whose provenance names no model read here.
    """
    measured, calibration = calibration_at(path)
    try:
        source = load_model_spec(str(calibration["provenance"].get("model")))
    except ValueError as err:
        raise ValueError(f"--host-from {path}: its provenance.model: {err}") from None
    measured_span = calibration_span(calibration.get("measurements"), f"--host-from {path}")
    return transferred(
        measured,
        source,
        model,
        cpu,
        measured_span,
        f"--host-from {path}",
        served_by(calibration["provenance"]),
    )


def served_by(provenance: Any) -> str | None:
    """The engine a server calibration's provenance names (``server.engine``; None: none)."""
    server = provenance.get("server") if isinstance(provenance, dict) else None
    engine = server.get("engine") if isinstance(server, dict) else None
    return engine if isinstance(engine, str) else None


def carried_by(
    path: str | None, engine: str, model: ModelSpec, device: Device
) -> tuple[Callable[[TokenRange], HostCost] | None, Callable[[TokenRange], Transferred] | None]:
    """What --host-from's calibration at ``path`` carries into ``model``'s derivation on
    ``device`` under ``engine`` (:func:`derive_on`'s ``host`` and ``carried``): its host cost,
    and on this CPU (its probe) the CPU's efficiencies too; nothing without ``path``."""
    if not path:
        return None, None
    host = functools.partial(host_from_cost, path, engine)
    on_cpu = device.key == CPU_KEY
    return host, functools.partial(cpu_transfer, path, model, device) if on_cpu else None


def server_facts_of(spec: CostSpec) -> ServerFacts | None:
    """The facts a server calibration recorded of the server it measured (None: not one)."""
    document = cost_document(spec)
    calibration = document.get("calibration", document) if isinstance(document, dict) else None
    provenance = calibration.get("provenance") if isinstance(calibration, dict) else None
    if not isinstance(provenance, dict) or provenance.get("source") != "server":
        return None
    return ServerFacts.from_dict(provenance.get("deployment"))


def cost_document(spec: CostSpec) -> Any:
    if spec.kind != "file":
        return None
    try:
        with open(spec.spec, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError, RecursionError):
        return None
