"""What a capacity answer rests on, in words beside it (DESIGN.md, "Every answer states its
assumptions"): the cost model's origin and held-out error, the terms it leaves at zero, the KV
capacity and where it came from, the TP rule, and which model the compute and the memory come
from when they differ."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from pytest_prefill.archive.cost_spec import CostSpec
from pytest_prefill.plan.compute.derive import Deriver, fit_percent
from pytest_prefill.plan.deployments import Deployment
from pytest_prefill.plan.hardware import Hardware
from pytest_prefill.plan.vllm_memory import rule_name
from pytest_prefill.sim import CostModel


@dataclasses.dataclass(frozen=True)
class AnswerBasis:
    """What a capacity answer prints about its deployment: ``lines`` on the model, memory and
    TP above the workload; the ``memory_fraction`` and ``model`` its command sets (None: the
    engine's default, ``MODEL``); what the ``Type:`` and ``Devices needed:`` lines rest on;
    ``max_model_len`` by TP where an instance's KV holds less than the context (the command
    sets it there); ``warning``: the line printed first, when the compute and the memory come
    from different models; ``fp8``: whether the answer stored the weights and the KV cache in
    fp8 (the command then says so)."""

    lines: tuple[str, ...] = ()
    memory_fraction: float | None = None
    model: str | None = None
    type_line: str | None = None
    needed_line: str | None = None
    max_model_len: Mapping[int, int] = dataclasses.field(default_factory=dict)
    warning: str | None = None
    fp8: tuple[bool, bool] = (False, False)


PRESET_MODEL = "qwen3-0.6b"  # both cost presets describe Qwen3-0.6B (sim/presets.py)
MEASURED_PRESETS = ("lab-laptop",)  # datacenter-illustrative is measured nowhere (sim/presets.py)
ZERO_TERMS = (
    "decode_per_seq",
    "decode_per_kv_token",
    "prefill_per_pair",
    "fusion_penalty",
    "batch_attention_per_pair",
)


def origin(spec: CostSpec) -> str:
    """``preset X: not your hardware`` or ``calibrated (file ...), held-out 4.9%``."""
    if spec.kind == "preset":
        return f"preset {spec.spec}: not your hardware"
    if spec.kind == "derived":
        return spec.label
    held = spec.trust.held_out if spec.trust is not None else None
    error = (
        f"held-out {held:.1%}"
        if held is not None and math.isfinite(held)
        else "held-out error unknown"
    )
    return f"calibrated ({spec.label}), {error}"


def basis(
    spec: CostSpec,
    cost: CostModel,
    deployment: Deployment | None,
    hardware: Hardware | None,
    measured_model: str | None,
    server: bool = False,
    decode: CostSpec | None = None,
) -> str:
    """One bracketed clause for a ``Type:`` or ``Devices needed:`` line: what the numbers behind
    ``deployment`` (its own cost model at its TP when it has one, else ``cost``) assume
    (``server``: the cost model is a server calibration, whose KV the server's flags give;
    ``decode``: ``--decode-cost``'s spec, which a split's decode pool runs on)."""
    used = deployment.cost_on(cost) if deployment is not None else cost
    own = deployment.decode_cost if decode is not None and deployment is not None else None
    parts = [pool_origins(spec, decode) if own is not None else origin(spec)]
    # the terms the cost model leaves out, whatever a deployment's TP scaling adds to them, so
    # every bracket under one answer lists the same ones
    zeros = [name for name in ZERO_TERMS if getattr(cost, name) == 0]
    if zeros:
        parts.append(f"0 (left out): {', '.join(zeros)}")
    if deployment is None and hardware is not None and hardware.device_memory is not None:
        # no deployment chosen: the KV of the model on the memory given, as the lines above say
        parts.append(f"KV by {rule_name(hardware.vllm_version)}, activation reserve estimated")
    elif math.isinf(used.kv_capacity_tokens):
        parts.append(
            "KV unbounded (the server calibration recorded no KV capacity: rerun "
            "calibrate-server with --server-flags '<the flags your server runs with>' to record "
            "it)"
            if server
            else "KV unbounded (give --model and --device-memory to size it)"
        )
    elif hardware is not None and hardware.device_memory is not None:
        parts.append(
            f"KV {used.kv_capacity_tokens:,.0f} tokens per instance "
            f"({rule_name(hardware.vllm_version)}, activation reserve estimated)"
        )
    else:
        parts.append(f"KV {used.kv_capacity_tokens:,.0f} tokens per instance (the cost model's)")
    held = own.kv_capacity_tokens if own is not None else used.kv_capacity_tokens
    if held != used.kv_capacity_tokens:
        parts.append(
            "decode instances' KV "
            + ("unbounded" if math.isinf(held) else f"{held:,.0f} tokens")
            + " (--decode-cost's)"
        )
    tp = deployment.tp if deployment is not None else 1
    if tp > 1 and hardware is not None and hardware.derived is not None:
        parts.append(
            f"TP{tp} compute derived at that TP{_fit_at(hardware, tp)}, all-reduces included"
        )
    elif tp > 1 and hardware is not None and hardware.rule is not None:
        parts.append(
            f"TP{tp} compute scaled by Vidur's {hardware.rule.gpu.upper()} profile "
            f"(work {hardware.rule.efficiency(tp):.0%} efficient, "
            f"{hardware.rule.fixed_share:.0%} of the fixed time kept) plus all-reduces"
        )
    if hardware is not None and measured_model and measured_model != hardware.model.name:
        parts.append(f"{compute_of(spec, measured_model)}, memory from {hardware.model.name}")
    return "[" + "; ".join(parts) + "]"


def _fit_at(hardware: Hardware, tp: int) -> str:
    """`` (the cost model within N% of the physics there)``: the fit at ``tp``, which the basis
    line's figure (at TP 1) does not give ("" for compute not derived by a :class:`Deriver`)."""
    deriver = hardware.derived
    if not isinstance(deriver, Deriver):
        return ""
    error = deriver.derive(tp).max_relative_error
    return f" (the cost model within {fit_percent(error)} of the physics there)"


def pool_origins(spec: CostSpec, decode: CostSpec | None) -> str:
    """``prefill (--cost): <origin>; decode (--decode-cost): <origin>``: which cost each pool of
    a split ran on, where the decode pool has its own; ``spec``'s origin alone otherwise."""
    if decode is None:
        return origin(spec)
    return f"prefill (--cost): {origin(spec)}; decode (--decode-cost): {origin(decode)}"


def pool_sources(source: str, decode: CostSpec | None) -> str:
    """The ``Cost model:`` header's text: ``source`` (``--cost``'s), and where the decode pool
    runs on its own (``--decode-cost``), which cost each pool ran on, the KV link on
    ``--cost``'s."""
    if decode is None:
        return source
    return (
        f"prefill pool and the KV link (--cost): {source}\n"
        f"  decode pool (--decode-cost): {decode.source}"
    )


def compute_of(spec: CostSpec, measured_model: str) -> str:
    """``compute measured on X`` or, for a preset measured nowhere, ``compute illustrative, for
    X`` (the preset's own words: it was never measured)."""
    if spec.kind == "preset" and spec.spec not in MEASURED_PRESETS:
        return f"compute illustrative (measured nowhere), for {measured_model}"
    return f"compute measured on {measured_model}"


def mixed_models(
    spec: CostSpec, hardware: Hardware | None, measured_model: str | None
) -> str | None:
    """The warning an answer prints first when its compute and its memory come from different
    models (a preset's or a calibration's compute with ``--model`` another): the rates are the
    first model's speed, not the served model's; ``--gpu`` derives the compute for it. None when
    they agree or the cost model names no model."""
    if hardware is None or hardware.derived is not None or not measured_model:
        return None
    served = hardware.model.name
    if measured_model == served:
        return None
    illustrative = spec.kind == "preset" and spec.spec not in MEASURED_PRESETS
    what = "illustrative, measured nowhere" if illustrative else "measured on it"
    return (
        f"WARNING: compute and memory come from different models: every rate below is the "
        f"speed of {measured_model} (the cost model's compute, {what}) with the KV cache of "
        f"{served}; it is not how fast {served} runs. To price {served}'s compute, derive it: "
        f"--gpu NAME (e.g. --gpu h100) with --model and no --cost, or calibrate a server "
        f"serving {served} (prefill-bench calibrate-server)."
    )


def header_source(source: str, spec: CostSpec, hardware: Hardware | None) -> str:
    """The ``Cost model:`` header's text, saying where a preset's own KV bytes are replaced by
    ``--model``'s (the preset's words name Qwen3-0.6B's)."""
    if hardware is None or spec.kind != "preset":
        return source
    return f"{source} (Here the KV bytes and capacity are {hardware.model.name}'s: see Model:.)"
