"""A server calibration on this machine's CPU carried to another model on the same CPU: the CPU
as a device (its peaks as ``measure/device_probe`` measured them, recorded in the calibration's
provenance), the CPU's efficiencies set by the calibration's own terms, and the host's cost (what
the calibration measured beyond the derived device part) carried per layer (DESIGN.md, "Compute
from the model and the device"; docs/compute.md, "A calibration carried to another model").
Standard library only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from pytest_prefill.plan.compute.cpu_serve import serve_decode_step
from pytest_prefill.plan.compute.derive import (
    DecodeStepRule,
    DerivedCost,
    HostCost,
    TokenRange,
    derive_cost,
)
from pytest_prefill.plan.compute.devices import Device
from pytest_prefill.plan.compute.efficiency import Efficiency, EfficiencyChoice
from pytest_prefill.plan.model_spec import ModelSpec
from pytest_prefill.sim import CostModel

CPU_KEY = "cpu"
PROBE_FIELD = "device_probe"  # where a calibration's provenance records the CPU's probe
DEVICE_FIELDS = (
    "key",
    "name",
    "architecture",
    "peak_flops",
    "memory_bandwidth",
    "memory_bytes",
    "link_bandwidth",
    "link_latency",
    "source",
)
# The dtype a model runs in on a CPU, by the peak the probe measured for it.
DTYPE_PEAKS = {"float32": "fp32", "bfloat16": "bf16", "float16": "bf16"}
# The cost-model term each efficiency is set by: the terms that are device work alone (a token
# through the GEMMs, a pair of attention, a cached token read), one efficiency each.
SET_BY = {
    "compute": "prefill_per_token",
    "attention_compute": "prefill_per_pair",
    "attention_memory": "decode_per_kv_token",
}
# How a serving engine runs a decode step on a CPU, where it differs from the physics' own (an
# engine not named here: the physics' decode step). transformers serve packs the rows and runs
# SDPA dense under a mask over copies of their caches (plan/compute/cpu_serve).
ENGINE_STEPS: Mapping[str, DecodeStepRule] = {"transformers": serve_decode_step}
LOW_EFFICIENCY = 1e-4
SOLVE_STEPS = 60  # regula falsi steps, at most
SWEEPS = 20  # rounds of the three solves (each term moves a little with the others), at most
TOLERANCE = 1e-12  # relative: far below any term's noise
# The measured error of this transfer (benchmarks/test_compute_server_transfer.py: transformers
# serve, `small` -> `medium` on this 2-core box, calibrated quiet): the median relative error
# over the cost-model terms and over the larger model's own calibration passes.
MEASURED_ERROR = "small -> medium under transformers serve on a 2-core CPU: {}"
MEASURED_FIGURES = (
    "prefill passes (TTFT) 2.9%, decode steps 12.5% median (batches of 3-5 rows under by "
    "13-22%), on quiet calibrations held out"
)


def device_from_fields(fields: Any, where: str) -> Device:
    """The ``Device`` a probe record's ``device`` block describes.

    Raises:
        ValueError: naming ``where`` and the field, for a block missing a field or malformed.
    """
    if not isinstance(fields, Mapping):
        raise ValueError(f"{where}: 'device' must be an object")
    missing = [name for name in DEVICE_FIELDS if name not in fields]
    if missing:
        raise ValueError(f"{where}: device.{missing[0]} is missing")
    for name in ("key", "name", "architecture", "source"):
        if not isinstance(fields[name], str):
            raise ValueError(f"{where}: device.{name} must be a string")
    if not isinstance(fields["peak_flops"], Mapping):
        raise ValueError(f"{where}: device.peak_flops must be an object")
    values = {name: fields[name] for name in DEVICE_FIELDS}
    try:
        return Device(**{**values, "peak_flops": dict(fields["peak_flops"])})
    except (TypeError, ValueError) as err:
        raise ValueError(f"{where}: {err}") from None


def probed_device(provenance: Any, where: str) -> Device:
    """The CPU a calibration's provenance records as probed (``calibrate-server
    --device-probe``): never probed again here, so a transfer reads the peaks the calibration
    ran beside.

    Raises:
        ValueError: in one line naming the field, for a provenance without a probe or with a
            malformed one.
    """
    if not isinstance(provenance, Mapping):
        raise ValueError(f"{where}: the calibration has no provenance object")
    record = provenance.get(PROBE_FIELD)
    if record is None:
        raise ValueError(
            f"{where}: provenance.{PROBE_FIELD} is missing: the CPU's peaks were not recorded "
            "(calibrate-server --device-probe PROBE.json records them)"
        )
    if not isinstance(record, Mapping):
        raise ValueError(f"{where}: provenance.{PROBE_FIELD} must be an object")
    return device_from_fields(record.get("device"), f"{where}: provenance.{PROBE_FIELD}")


def linear_device(device: Device, dtype: str) -> Device:
    """``device`` with the peak of ``dtype`` (the dtype the model runs in) where the physics
    reads its linear layers' peak (``bf16``): a CPU runs the presets in fp32.

    Raises:
        ValueError: for a dtype the device has no peak for.
    """
    peak = device.peak(DTYPE_PEAKS.get(dtype, dtype))
    return dataclasses.replace(device, peak_flops={**device.peak_flops, "bf16": peak})


def cpu_efficiency(
    device: Device,
    efficiencies: Mapping[str, float] | None = None,
    error_class: str = "a CPU at its probed peaks",
) -> EfficiencyChoice:
    """A CPU's efficiency table: the fractions of its probed peaks its kernels reach
    (``efficiencies`` by ``SET_BY``'s names; one absent: 1, the probe's own GEMM and stream
    rates), no per-kernel launch cost (the host's cost is apart); ``error_class``: where the
    fractions came from and how far they are trusted."""
    etas = {**dict.fromkeys(SET_BY, 1.0), **(efficiencies or {})}
    table = Efficiency(
        device=device.key,
        engine="the server's kernels on this CPU",
        gemm_t0=0.0,
        compute_bins=((math.inf, etas["compute"]),),
        memory_efficiency=1.0,
        attention_compute_efficiency=etas["attention_compute"],
        attention_memory_efficiency=etas["attention_memory"],
        allreduce_latency=0.0,
        allreduce_bandwidth=device.link_bandwidth,
        held_out_error=0.0,
        source=f"the probe's peaks ({device.source.split(';')[0]})",
    )
    return EfficiencyChoice(table, None, error_class)


@dataclasses.dataclass(frozen=True, slots=True)
class Carried:
    """What a calibration of one model says of the CPU and the server's host: the efficiencies
    its device terms imply (``efficiencies`` by name, ``clamped``: those the measurement put
    above the probed peak, held at 1), the host's cost per layer, and where from."""

    efficiencies: Mapping[str, float]
    clamped: tuple[str, ...]
    host: HostCost
    source: str

    def choice(self, device: Device, error_class: str) -> EfficiencyChoice:
        return cpu_efficiency(device, self.efficiencies, error_class)


def _solve(term: Callable[[float], float], target: float) -> tuple[float, bool]:
    """The efficiency in (0, 1] at which the derived ``term`` equals ``target`` (it grows with
    the efficiency's inverse, nearly in proportion: regula falsi, Illinois' variant, on that
    inverse); (1, True) when even the probed peak is slower than measured, (1, False) for a
    term the calibration refused (0)."""
    if target <= 0:
        return 1.0, False
    low, f_low = 1.0, term(1.0) - target
    if f_low >= 0:
        return 1.0, True
    high = min(1 / LOW_EFFICIENCY, 2 * target / (f_low + target))
    f_high = term(1 / high) - target
    while f_high < 0 and high < 1 / LOW_EFFICIENCY:
        low, f_low, high = high, f_high, min(1 / LOW_EFFICIENCY, 2 * high)
        f_high = term(1 / high) - target
    if f_high < 0:
        return LOW_EFFICIENCY, False
    side = 0
    for _ in range(SOLVE_STEPS):
        x = high - f_high * (high - low) / (f_high - f_low)
        f_x = term(1 / x) - target
        if abs(f_x) <= TOLERANCE * target:
            return 1 / x, False
        if f_x > 0:
            high, f_high = x, f_x
            f_low, side = (f_low / 2, side) if side == 1 else (f_low, 1)
        else:
            low, f_low = x, f_x
            f_high, side = (f_high / 2, side) if side == -1 else (f_high, -1)
    return 2 / (low + high), False


def engine_step(engine: str | None) -> DecodeStepRule | None:
    """The decode step ``engine`` runs on a CPU (``ENGINE_STEPS``; None: the physics')."""
    return ENGINE_STEPS.get(engine or "")


def carry(
    measured: CostModel,
    model: ModelSpec,
    device: Device,
    span: TokenRange,
    source: str,
    step: DecodeStepRule | None = None,
) -> Carried:
    """Read a calibration of ``model`` on the CPU ``device``: each efficiency set so the derived
    device term equals the measured one (``SET_BY``; a term the calibration refused, 0, leaves
    the peak; decode steps as ``step`` runs them, None: the physics'), then the host's cost:
    what the measured decode step's base and per-sequence terms exceed the derived device part
    by, per layer (eager PyTorch serving spends its host time in the layers' Python: module
    calls, and per request its attention call; never below 0).

    Raises:
        ValueError: for a model whose dtype the device has no peak for.
    """
    cpu = linear_device(device, model.dtype)
    found = dict.fromkeys(SET_BY, 1.0)

    def derived(etas: Mapping[str, float]) -> CostModel:
        return derive_cost(model, cpu, cpu_efficiency(cpu, etas), span, step=step).cost

    def term_of(name: str) -> Callable[[float], float]:
        return lambda eta: float(getattr(derived({**found, name: eta}), SET_BY[name]))

    clamped: list[str] = []
    for _ in range(SWEEPS):
        before, clamped = dict(found), []
        for name, term in SET_BY.items():
            found[name], above = _solve(term_of(name), getattr(measured, term))
            clamped += [name] if above else []
        if all(abs(found[n] / before[n] - 1) <= TOLERANCE for n in SET_BY):
            break
    part = derived(found)
    layers = model.layers
    host = HostCost(
        per_layer=max(0.0, measured.decode_step_base - part.decode_step_base) / layers,
        per_request_layer=max(0.0, measured.decode_per_seq - part.decode_per_seq) / layers,
        source=f"from {source}: its decode step beyond the derived device part, per layer: "
        "a transfer",
    )
    return Carried(dict(found), tuple(clamped), host, source)


Transferred = tuple[Device, EfficiencyChoice, HostCost, DecodeStepRule | None]
PROMPT_KINDS = ("prefill", "chunk")
DECODE_KINDS = ("decode_kv", "decode_batch")


def calibration_span(points: Any, where: str) -> TokenRange:
    """The token range a calibration's own points cover (its ``measurements``: prompts and
    chunks, decode steps by rows and cached tokens), the range its terms were fitted over.

    Raises:
        ValueError: naming ``where``, for points that are not a list of measured points or hold
            no prompt or no decode step.
    """
    if not isinstance(points, list):
        raise ValueError(f"{where}: measurements must be a list of points")
    prompts, rows, contexts = [], [1], []
    try:
        for point in points:
            kind, x, context = point["kind"], int(point["x"]), int(point.get("context", 0))
            if kind in PROMPT_KINDS:
                prompts.append(x + context)
            elif kind == "decode_kv":
                contexts.append(x)
            elif kind == "decode_batch":
                rows.append(x)
                contexts.append(context)
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"{where}: a malformed measurement ({err!s})") from None
    if not prompts or not contexts:
        raise ValueError(f"{where}: measurements hold no prompt or no decode step")
    longest = max(max(prompts), max(contexts))
    return TokenRange(max(1, min(prompts)), max(prompts), longest, max(rows))


def transferred(
    measured: CostModel,
    source_model: ModelSpec,
    target: ModelSpec,
    device: Device,
    measured_span: TokenRange,
    source: str,
    engine: str | None = None,
) -> Transferred:
    """What ``target``'s derivation on the CPU ``device`` takes from a calibration of
    ``source_model`` on it (over ``measured_span``, the range its terms were fitted on): the
    device at the peak of ``target``'s dtype, the efficiencies and the per-layer host cost the
    calibration implies (:func:`carry`), the choice's error class saying it is a transfer and
    how far one was measured to hold, and the decode step the calibration's ``engine`` runs
    (:func:`engine_step`).

    Raises:
        ValueError: for a model whose dtype the device has no peak for.
    """
    step = engine_step(engine)
    carried = carry(measured, source_model, device, measured_span, source, step)
    cpu = linear_device(device, target.dtype)
    said = (
        f"a transfer from {source_model.name}'s calibration on this CPU (efficiencies "
        f"{_etas(carried)}; measured error class: {MEASURED_ERROR.format(MEASURED_FIGURES)})"
    )
    return cpu, carried.choice(cpu, said), carried.host, step


def transfer(
    measured: CostModel,
    source_model: ModelSpec,
    target: ModelSpec,
    device: Device,
    spans: tuple[TokenRange, TokenRange],
    source: str,
    engine: str | None = None,
) -> DerivedCost:
    """``target``'s cost model on the CPU ``device`` from a calibration of ``source_model`` on
    it (:func:`transferred`; ``spans``: the calibration's range, then the range ``target``'s
    cost model is fitted over; ``engine``: the server the calibration measured).

    Raises:
        ValueError: for a model whose dtype the device has no peak for.
    """
    cpu, choice, host, step = transferred(
        measured, source_model, target, device, spans[0], source, engine
    )
    return derive_cost(target, cpu, choice, spans[1], host=host, step=step)


def _etas(carried: Carried) -> str:
    return ", ".join(
        f"{name} {eta:.2f}{' (held at the peak)' if name in carried.clamped else ''}"
        for name, eta in carried.efficiencies.items()
    )
