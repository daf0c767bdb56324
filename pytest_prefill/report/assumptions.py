"""What a capacity answer rests on, in words beside it (DESIGN.md, "Every answer states its
assumptions"): the cost model's origin and held-out error, the terms it leaves at zero, the KV
capacity and where it came from, the TP rule, and which model the compute and the memory come
from when they differ."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from pytest_prefill.archive.cost_spec import CostSpec
from pytest_prefill.plan.deployments import Deployment
from pytest_prefill.plan.hardware import Hardware
from pytest_prefill.sim import CostModel


@dataclasses.dataclass(frozen=True)
class AnswerBasis:
    """What a capacity answer prints about its deployment: ``lines`` on the model, memory and
    TP above the workload; the ``memory_fraction`` and ``model`` its command sets (None: the
    engine's default, ``MODEL``); what the ``Type:`` and ``Devices needed:`` lines rest on;
    ``max_model_len`` by TP where an instance's KV holds less than the context (the command
    sets it there)."""

    lines: tuple[str, ...] = ()
    memory_fraction: float | None = None
    model: str | None = None
    type_line: str | None = None
    needed_line: str | None = None
    max_model_len: Mapping[int, int] = dataclasses.field(default_factory=dict)


PRESET_MODEL = "qwen3-0.6b"  # both cost presets describe Qwen3-0.6B (sim/presets.py)
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
) -> str:
    """One bracketed clause for a ``Type:`` or ``Devices needed:`` line: what the numbers behind
    ``deployment`` (its own cost model at its TP when it has one, else ``cost``) assume."""
    used = deployment.cost_on(cost) if deployment is not None else cost
    parts = [origin(spec)]
    zeros = [name for name in ZERO_TERMS if getattr(used, name) == 0]
    if zeros:
        parts.append(f"0 (left out): {', '.join(zeros)}")
    if math.isinf(used.kv_capacity_tokens):
        parts.append("KV unbounded (give --model and --device-memory to size it)")
    elif hardware is not None and hardware.device_memory is not None:
        parts.append(
            f"KV {used.kv_capacity_tokens:,.0f} tokens per instance (vLLM "
            f"{hardware.vllm_version}'s rule, activation reserve estimated)"
        )
    else:
        parts.append(f"KV {used.kv_capacity_tokens:,.0f} tokens per instance (the cost model's)")
    tp = deployment.tp if deployment is not None else 1
    if tp > 1 and hardware is not None and hardware.derived is not None:
        parts.append(f"TP{tp} compute derived at that TP, all-reduces included")
    elif tp > 1 and hardware is not None and hardware.rule is not None:
        parts.append(
            f"TP{tp} compute scaled by Vidur's {hardware.rule.gpu.upper()} profile "
            f"(work {hardware.rule.efficiency(tp):.0%} efficient, "
            f"{hardware.rule.fixed_share:.0%} of the fixed time kept) plus all-reduces"
        )
    if hardware is not None and measured_model and measured_model != hardware.model.name:
        parts.append(f"compute measured on {measured_model}, memory from {hardware.model.name}")
    return "[" + "; ".join(parts) + "]"
