"""This machine's CPU as a device whose efficiencies are fitted on its own calibrations: the
measured prefill passes (through the per-op physics, plan/compute/physics) and decode steps (as
the packed pass runs them on a CPU, plan/compute/cpu_decode) of some model sizes fit the
device's efficiencies (eta_c by GEMM rows, eta_m, attention), the seconds per page the kernel
maps fresh, and the host's cost per torch call; the fit then predicts another size's measured
passes. Beside the per-op physics, a prefill pass pays what eager PyTorch does on a CPU: its
MLP buffers' pages faulted in afresh each layer, a chunk's causal masks materialised per call,
the softmax's bytes over every score and the key blocks the diagonal crosses. Standard library
only."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pytest_prefill.plan.compute.cpu_decode import (
    DecodeStep,
    KernelTerms,
    churned_pages,
    decode_working_set,
    mlp_fresh_pages,
)
from pytest_prefill.plan.compute.devices import Device
from pytest_prefill.plan.compute.efficiency import Efficiency
from pytest_prefill.plan.compute.physics import Physics
from pytest_prefill.plan.compute.transfer import linear_device
from pytest_prefill.plan.cost_document import CALIBRATION_KIND
from pytest_prefill.plan.model_spec import ModelSpec, load_model_spec

# The GEMM row counts eta_c is fitted by: decode rows, short prompts, long prompts.
COMPUTE_BOUNDS = (16.0, 256.0, math.inf)
# The fitted values, in the order of the parameter vector: fractions (in (0, 1)) first, then
# positive numbers (seconds, and the widths at which a kernel reaches half its efficiency).
FRACTIONS = (
    *(f"eta_c[m<={b:g}]" for b in COMPUTE_BOUNDS),
    "eta_m",
    "attention_eta_c",
    "attention_eta_m",
)
POSITIVES = (
    "gemm_k0",
    "sweep_k0",
    "host_per_call",
    "fault_seconds",
)
# The probe's figures are measurements, not ceilings: a pass whose data sit in a cache, or a
# kernel a busy probe timed slow, runs above them. The efficiencies are fractions of the
# probe's figures times this headroom (so up to 4 times the probed rates).
HEADROOM = 4.0
START = (0.075, 0.15, 0.2, 0.125, 0.125, 0.125, 32.0, 256.0, 5e-6, 2e-6)
# Relative errors beyond this weigh linearly, not quadratically: one noisy point on a shared
# machine does not pull the whole fit (a soft-L1 loss on log(predicted / measured)).
LOSS_SCALE = 0.1
POINT_KINDS = {
    "prefill": "prefill",
    "chunk": "prefill",
    "decode_kv": "decode",
    "decode_batch": "decode",
}
STATISTICS = ("median", "min")
# A GEMM's fixed time beyond its torch call: none. Timed cold, a matrix-vector sweep's time is
# its bytes' and the call's; and a fixed time per GEMM and one per call both come once per
# layer, so a fit on passes of any depth finds only their sum: the call's holds it.
GEMM_T0 = 0.0
# A GEMM's memory and compute time add on one core (q = 1 in the roofline): the thread that
# packs the weights' panels is the one that multiplies them, so neither hides the other.
SERIAL = 1.0


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    """One measured pass of ``model``: ``kind`` ``prefill`` (its ``pieces``: (new tokens,
    cached tokens)) or ``decode`` (``rows`` sequences reading ``kv_tokens`` cached tokens in
    all); ``seconds`` the measured median; ``label`` as the calibration names the point."""

    model: ModelSpec
    kind: str
    seconds: float
    label: str
    pieces: tuple[tuple[int, int], ...] = ()
    rows: int = 0
    kv_tokens: int = 0
    point: str = ""  # the calibration's kind of point (prefill, chunk, decode_kv, decode_batch)

    def __post_init__(self) -> None:
        if self.kind not in ("prefill", "decode"):
            raise ValueError(f"sample kind must be prefill or decode, got {self.kind!r}")
        if not (math.isfinite(self.seconds) and self.seconds > 0):
            raise ValueError(f"sample seconds must be a positive number, got {self.seconds!r}")
        if self.kind == "decode" and self.rows < 1:
            raise ValueError(f"a decode sample needs rows >= 1, got {self.rows!r}")
        if self.kind == "prefill" and not self.pieces:
            raise ValueError("a prefill sample needs at least one piece")

    @property
    def sequences(self) -> int:
        """Sequences in the pass (the packed pass attends per sequence, layer by layer)."""
        return len(self.pieces) if self.kind == "prefill" else self.rows

    @property
    def working_set(self) -> float:
        """Bytes the pass touches that a repeat of it finds again: every weight, and the
        cached K and V it reads (a decode step: and their gathered copy)."""
        if self.kind == "decode":
            return decode_working_set(self.model, self.rows, self.kv_tokens)
        cached = sum(c for _, c in self.pieces)
        return float(self.model.weight_bytes + cached * self.model.kv_bytes_per_token)


def samples_of(document: Mapping[str, Any], statistic: str = "median") -> list[Sample]:
    """The prefill, chunk and decode points of a calibration document (``calibrate --json``)
    of an architecture preset, in the dtype it ran in (fused passes are left out), each timed
    by its ``statistic``: ``median`` (the measurement), or ``min`` (the fastest repeat: on a
    shared machine, the nearest to the hardware's own time).

    Raises:
        ValueError: for a statistic not in STATISTICS, a document that is not a calibration, of
            a model that is not a preset, or a malformed point.
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {', '.join(STATISTICS)}, got {statistic!r}")
    if not isinstance(document, Mapping) or document.get("kind") != CALIBRATION_KIND:
        raise ValueError(f"not a pytest-prefill calibration (kind must be {CALIBRATION_KIND!r})")
    provenance = document.get("provenance")
    if not isinstance(provenance, Mapping):
        raise ValueError("calibration provenance must be an object")
    spec = load_model_spec(str(provenance.get("model")))
    model = dataclasses.replace(spec, dtype=str(provenance.get("dtype", spec.dtype)))
    try:
        return [
            sample
            for point in document["measurements"]
            if (sample := _sample(model, point, statistic)) is not None
        ]
    except (KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"calibration of {model.name}: malformed measurement ({err!s})") from None


def _sample(model: ModelSpec, point: Mapping[str, Any], statistic: str) -> Sample | None:
    kind = POINT_KINDS.get(point["kind"])
    if kind is None:
        return None
    x, context, rows = int(point["x"]), int(point["context"]), int(point["rows"])
    seconds = float(point["measurement"][statistic])
    label = f"{model.name} {point['kind']} {x}/{context}/{rows}"
    named = str(point["kind"])
    if kind == "prefill":
        return Sample(model, kind, seconds, label, pieces=((x, context),), point=named)
    if named == "decode_kv":
        rows = max(1, rows)
        return Sample(model, kind, seconds, label, rows=rows, kv_tokens=x * rows, point=named)
    return Sample(model, kind, seconds, label, rows=x, kv_tokens=x * context, point=named)


@dataclasses.dataclass(frozen=True, slots=True)
class Cache:
    """The CPU's last-level cache as the probe measured it: ``size`` bytes, and the bandwidth
    of a stream whose arrays fit in it. A pass repeated (as a calibration times it, and as a
    server runs step after step) sweeps its working set in the same order each time: one that
    fits is found in the cache, one larger than it evicts each line before its next use (the
    cache keeps the most recently used lines), so its bytes all move at the memory's rate."""

    size: float
    bandwidth: float

    def __post_init__(self) -> None:
        for name in ("size", "bandwidth"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"cache {name} must be a positive number, got {value!r}")

    def bandwidth_for(self, working_set: float, memory: float) -> float:
        """The bandwidth a pass touching ``working_set`` bytes sees, beside ``memory``'s."""
        return self.bandwidth if working_set <= self.size else memory


def device_for(device: Device, sample: Sample, cache: Cache | None) -> Device:
    """``device`` as ``sample``'s pass sees it, at ``HEADROOM`` times the probe's figures: the
    peak of the dtype its model ran in, and the memory bandwidth its working set finds
    (``cache`` None: the stream's, DRAM)."""
    linear = linear_device(device, sample.model.dtype)
    bandwidth = device.memory_bandwidth
    if cache is not None:
        bandwidth = cache.bandwidth_for(sample.working_set, bandwidth)
    peaks = {k: v * HEADROOM for k, v in linear.peak_flops.items()}
    return dataclasses.replace(linear, peak_flops=peaks, memory_bandwidth=bandwidth * HEADROOM)


# The torch calls the packed pass (lab/packed.py, over Qwen3's modules) makes from Python,
# counted with a TorchFunctionMode: the same for every preset, whatever its widths. A prefill
# pass: PREFILL_CALLS[0] + pieces x [1] + layers x ([2] + pieces x [3]); a decode step:
# DECODE_CALLS[0] + rows x [1] + layers x [2] (the rows attend together, layer by layer).
PREFILL_CALLS = (35, 9, 69, 18)
DECODE_CALLS = (56, 12, 81)


# A chunk over a cache (fewer rows than keys) attends under SDPA's lower-right causal bias, which
# the CPU cannot pass to its kernel as is: each call materialises it, per (row, key) position
# a bool of ones, their lower triangle, its negation and the -inf/0 float mask the kernel adds
# to every head's scores. A whole prompt (rows == keys) runs SDPA's own causal path, no mask.
MASK_WRITTEN = 1 + 1 + 1 + 4  # bytes per position the four buffers hold (fresh each call)
MASK_READ = 1 + 1 + 1  # bytes per position the triangle, the negation and the float mask read
MASK_FLOAT = 4  # bytes per position per head the kernel reads of the float mask


def mask_positions(pieces: Sequence[tuple[int, int]]) -> list[int]:
    """Per prompt piece ``(new, cached)`` that attends over a cache, the positions of its
    materialised mask: ``new x (cached + new)``; a whole prompt has none."""
    return [t * (t + c) for t, c in pieces if c > 0]


def mask_seconds(
    model: ModelSpec, pieces: Sequence[tuple[int, int]], physics: Physics, fault: float
) -> float:
    """Every layer's materialised causal masks of a prefill pass: their bytes written and read,
    the kernel's read of the float mask per head, at the pass's memory efficiency and
    bandwidth; and their pages faulted in afresh each call (:func:`churned_pages`)."""
    eff, bandwidth = physics.efficiency, physics.device.memory_bandwidth
    per_layer = 0.0
    for positions in mask_positions(pieces):
        moved = positions * (MASK_WRITTEN + MASK_READ + MASK_FLOAT * model.attention_heads)
        per_layer += moved / (eff.memory_efficiency * bandwidth)
        per_layer += churned_pages(positions * MASK_WRITTEN) * fault
    return model.layers * per_layer


# The CPU's flash kernel takes each (query, key) score of a head through its softmax in fp32,
# in a tile the cache holds: the QK product writes it, the scaling and running max read and
# write it, the exponent and running sum read and write it, the PV product reads it.
SCORE_BYTES = 4 * (1 + 2 + 2 + 1)
# The kernel takes the keys in blocks of 512 (torch's CPU flash attention, kv_split_size): on a
# causal prompt it skips the blocks wholly above the diagonal and computes those it crosses whole.
KEY_BLOCK = 512


def scored_positions(pieces: Sequence[tuple[int, int]]) -> int:
    """The (query, key) scores per head the kernel computes in a prefill pass: a whole prompt's
    causal triangle and half a key block a row beside it (the blocks the diagonal crosses);
    a chunk over a cache every position of its mask (a materialised mask lets it skip none)."""
    return sum(t * (t + c) if c > 0 else causal_scores(t) for t, c in pieces)


def causal_scores(tokens: int) -> int:
    """Scores per head of a whole prompt of ``tokens``: its causal triangle, and the blocks the
    diagonal crosses computed whole (half a block of ``KEY_BLOCK`` keys a row)."""
    return tokens * (tokens + 1) // 2 + tokens * min(KEY_BLOCK, tokens) // 2


def diagonal_seconds(
    model: ModelSpec, pieces: Sequence[tuple[int, int]], physics: Physics
) -> float:
    """Every layer's QK and PV products over the scores the per-op physics leaves out (the
    whole prompts' blocks past the diagonal), at attention's compute efficiency."""
    extra = sum(causal_scores(t) - t * (t + 1) // 2 for t, c in pieces if c == 0)
    flops = 4.0 * model.attention_heads * model.head_dim * extra * model.layers
    peak = physics.device.peak("bf16")
    return flops / (physics.efficiency.attention_compute_efficiency * peak)


def score_seconds(model: ModelSpec, pieces: Sequence[tuple[int, int]], bandwidth: float) -> float:
    """Every layer's softmax passes over its heads' scores, ``SCORE_BYTES`` each at
    ``bandwidth`` (the cache's, at the pass's memory efficiency): the part of attention that
    does not grow with the head dim."""
    scores = scored_positions(pieces) * model.attention_heads * model.layers
    return scores * SCORE_BYTES / bandwidth


@dataclasses.dataclass(frozen=True, slots=True)
class HostCost:
    """The host's share of a pass: ``per_call`` seconds for each torch call the packed pass
    makes from Python (the interpreter and the dispatcher; on a CPU the host is the device, so
    this time is spent, not overlapped)."""

    per_call: float

    def prefill(self, layers: int, pieces: int) -> float:
        """A prefill pass of ``pieces`` prompt pieces."""
        base, piece, layer, piece_layer = PREFILL_CALLS
        return self.per_call * (base + pieces * piece + layers * (layer + pieces * piece_layer))

    def decode(self, layers: int, rows: int) -> float:
        """A decode step of ``rows`` rows."""
        base, row, layer = DECODE_CALLS
        return self.per_call * (base + rows * row + layers * layer)


@dataclasses.dataclass(frozen=True, slots=True)
class CpuTerms:
    """What a fit finds. The device's efficiencies at full width: ``compute`` (eta_c per
    ``COMPUTE_BOUNDS``), ``memory``, ``attention_compute``, ``attention_memory``; how a narrow
    kernel falls short of them: a GEMM of inner dimension k reaches ``k / (k + gemm_k0)`` of its
    eta_c (a SIMD kernel needs width to fill its registers), a matrix-vector sweep
    ``k / (k + sweep_k0)`` of its bandwidth (plan/compute/cpu_decode); ``gemm_t0`` per GEMM
    (``GEMM_T0``, not fitted);
    the host's costs; and ``fault``, seconds per page the kernel maps fresh. Attention's work
    that does not scale with the head dim, the softmax over each score, is priced by its bytes
    (:func:`score_seconds`), not fitted."""

    compute: tuple[float, ...]
    memory: float
    attention_compute: float
    attention_memory: float
    gemm_t0: float
    gemm_k0: float
    sweep_k0: float
    host: HostCost
    fault: float

    @classmethod
    def from_vector(cls, vector: Sequence[float]) -> CpuTerms:
        n = len(FRACTIONS)
        fractions = [1.0 / (1.0 + math.exp(-v)) for v in vector[:n]]
        k0, sweep, per_call, fault = (math.exp(v) for v in vector[n:])
        bins = len(COMPUTE_BOUNDS)
        memory, attention_c, attention_m = fractions[bins:]
        host = HostCost(per_call)
        compute = tuple(fractions[:bins])
        return cls(compute, memory, attention_c, attention_m, GEMM_T0, k0, sweep, host, fault)

    @property
    def kernel(self) -> KernelTerms:
        """The decode step's library terms (a matrix-vector sweep ramps with the row width at
        its own ``sweep_k0``: a cost per output row read from memory, not the GEMM's registers)."""
        return KernelTerms(self.sweep_k0, self.fault)

    def values(self) -> dict[str, float]:
        """Every fitted value by name (``FRACTIONS`` then ``POSITIVES``)."""
        numbers = (
            *self.compute,
            self.memory,
            self.attention_compute,
            self.attention_memory,
            self.gemm_k0,
            self.sweep_k0,
            self.host.per_call,
            self.fault,
        )
        return dict(zip((*FRACTIONS, *POSITIVES), numbers))  # noqa: B905

    def efficiency(self, device: Device, model: ModelSpec) -> Efficiency:
        """The efficiency table of ``device`` for ``model``'s widths (B's ``Efficiency``: the
        attention host terms stay 0, ``host`` holds them)."""
        gemm = model.hidden_size / (model.hidden_size + self.gemm_k0)
        return Efficiency(
            device=device.key,
            engine="pytest-prefill packed pass (torch, eager)",
            gemm_t0=self.gemm_t0,
            compute_bins=tuple((b, e * gemm) for b, e in zip(COMPUTE_BOUNDS, self.compute)),  # noqa: B905
            memory_efficiency=self.memory,
            gemm_sharpness=SERIAL,
            attention_compute_efficiency=self.attention_compute,
            attention_memory_efficiency=self.attention_memory,
            allreduce_latency=0.0,
            allreduce_bandwidth=device.link_bandwidth,
            held_out_error=0.0,
            source=f"fitted on this machine's calibrations; peaks {device.source}",
        )


def _vector(values: Sequence[float]) -> list[float]:
    n = len(FRACTIONS)
    return [math.log(v / (1.0 - v)) for v in values[:n]] + [math.log(v) for v in values[n:]]


@dataclasses.dataclass(frozen=True, slots=True)
class CpuFit:
    """The CPU's fitted terms, the models they were fitted on and the fit's median error."""

    device: Device
    terms: CpuTerms
    fitted_on: tuple[str, ...]
    in_sample_median: float
    cache: Cache | None = None

    def predict(self, sample: Sample) -> float:
        return predict(self.device, self.terms, sample, self.cache)


def cache_bandwidth(device: Device, cache: Cache | None) -> float:
    """The bandwidth of data the cache holds whatever the pass's working set (a kernel's own
    tile), at ``HEADROOM`` times the probe's figure (``cache`` None: the stream's)."""
    return HEADROOM * (device.memory_bandwidth if cache is None else cache.bandwidth)


def _seconds(physics: Physics, terms: CpuTerms, sample: Sample, tile_bandwidth: float) -> float:
    """A prefill pass by the per-op physics, with the CPU's own costs beside it (the MLP's and
    the masks' fresh pages, the masks' and the softmax's bytes; the scores' tile at
    ``tile_bandwidth``); a decode step as the packed pass runs it on a CPU
    (plan/compute/cpu_decode); each with the host's share."""
    layers = sample.model.layers
    if sample.kind == "prefill":
        tokens = sum(t for t, _ in sample.pieces)
        faults = layers * mlp_fresh_pages(sample.model, tokens) * terms.fault
        masks = mask_seconds(sample.model, sample.pieces, physics, terms.fault)
        bandwidth = terms.memory * tile_bandwidth
        scores = score_seconds(sample.model, sample.pieces, bandwidth)
        scores += diagonal_seconds(sample.model, sample.pieces, physics)
        host = terms.host.prefill(layers, sample.sequences)
        return physics.prefill_pass(sample.pieces) + faults + masks + scores + host
    step = DecodeStep(sample.model, physics.device, physics.efficiency, terms.kernel)
    return step.seconds(sample.rows, sample.kv_tokens) + terms.host.decode(layers, sample.rows)


def predict(device: Device, terms: CpuTerms, sample: Sample, cache: Cache | None = None) -> float:
    """Seconds the physics and the host costs give ``sample``'s pass on ``device`` (its memory
    bandwidth as ``cache`` leaves it for the pass's working set)."""
    efficiency = terms.efficiency(device, sample.model)
    physics = Physics(sample.model, device_for(device, sample, cache), efficiency)
    return _seconds(physics, terms, sample, cache_bandwidth(device, cache))


def _loss(
    device: Device, samples: Sequence[Sample], cache: Cache | None
) -> Callable[[Sequence[float]], float]:
    devices = [device_for(device, s, cache) for s in samples]
    models = {s.model.name: s.model for s in samples}
    tile = cache_bandwidth(device, cache)

    def loss(vector: Sequence[float]) -> float:
        if any(abs(v) > 40 for v in vector):
            return math.inf
        terms = CpuTerms.from_vector(vector)
        tables = {name: terms.efficiency(device, model) for name, model in models.items()}
        total = 0.0
        for s, seen in zip(samples, devices):  # noqa: B905
            physics = Physics(s.model, seen, tables[s.model.name])
            r = math.log(_seconds(physics, terms, s, tile) / s.seconds) / LOSS_SCALE
            total += math.sqrt(1.0 + r * r) - 1.0
        return total

    return loss


def nelder_mead(
    f: Callable[[Sequence[float]], float], start: Sequence[float], *, step: float, rounds: int
) -> list[float]:
    """A minimum of ``f`` near ``start`` by Nelder and Mead's simplex (standard coefficients),
    ``rounds`` iterations per restart, restarted from the best point until it stops improving."""
    best = list(start)
    best_value = f(best)
    for _ in range(8):
        simplex = [best] + [
            [v + (step if i == j else 0.0) for j, v in enumerate(best)] for i in range(len(best))
        ]
        values = [f(p) for p in simplex]
        for _ in range(rounds):
            order = sorted(range(len(simplex)), key=values.__getitem__)
            simplex, values = [simplex[i] for i in order], [values[i] for i in order]
            simplex, values = _simplex_step(f, simplex, values)
        point, value = min(zip(simplex, values), key=lambda pv: pv[1])  # noqa: B905
        improved = value < best_value - 1e-9 * max(1.0, abs(best_value))
        if value < best_value:
            best, best_value = point, value
        if not improved:
            break
    return best


def _simplex_step(
    f: Callable[[Sequence[float]], float], simplex: list[list[float]], values: list[float]
) -> tuple[list[list[float]], list[float]]:
    n = len(simplex) - 1
    centre = [sum(p[j] for p in simplex[:-1]) / n for j in range(n)]

    def towards(t: float) -> list[float]:
        return [c + t * (w - c) for c, w in zip(centre, simplex[-1])]  # noqa: B905

    reflected = towards(-1.0)
    r = f(reflected)
    if r < values[0]:
        expanded = towards(-2.0)
        e = f(expanded)
        simplex[-1], values[-1] = (expanded, e) if e < r else (reflected, r)
    elif r < values[-2]:
        simplex[-1], values[-1] = reflected, r
    else:
        contracted = towards(0.5 if r >= values[-1] else -0.5)
        c = f(contracted)
        if c < min(r, values[-1]):
            simplex[-1], values[-1] = contracted, c
        else:  # shrink towards the best point
            best = simplex[0]
            simplex = [best] + [[b + 0.5 * (v - b) for b, v in zip(best, p)] for p in simplex[1:]]  # noqa: B905
            values = [values[0]] + [f(p) for p in simplex[1:]]
    return simplex, values


def fit_cpu(
    device: Device, samples: Sequence[Sample], *, rounds: int = 800, cache: Cache | None = None
) -> CpuFit:
    """Fit ``device``'s efficiencies and the host costs on ``samples`` (relative errors, soft
    L1 on their logarithm), memory read through ``cache`` (None: all at the stream's rate).

    Raises:
        ValueError: for fewer samples than fitted values.
    """
    count = len(FRACTIONS) + len(POSITIVES)
    if len(samples) < count:
        raise ValueError(f"samples must hold at least {count} passes to fit, got {len(samples)}")
    loss = _loss(device, samples, cache)
    vector = nelder_mead(loss, _vector(START), step=0.7, rounds=rounds)
    terms = CpuTerms.from_vector(vector)
    errors = [abs(predict(device, terms, s, cache) / s.seconds - 1) for s in samples]
    names = tuple(dict.fromkeys(s.model.name for s in samples))
    return CpuFit(device, terms, names, statistics.median(errors), cache)


@dataclasses.dataclass(frozen=True, slots=True)
class Transfer:
    """A held-out model's measured passes beside a fit on the other models' (relative errors,
    predicted / measured - 1, by kind)."""

    held_out: str
    fitted_on: tuple[str, ...]
    errors: Mapping[str, tuple[float, ...]]
    fit: CpuFit
    by_point: Mapping[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)

    def median(self, kind: str) -> float:
        return statistics.median(abs(e) for e in self.errors[kind])

    def worst(self, kind: str) -> float:
        return max(abs(e) for e in self.errors[kind])

    def p90(self, kind: str) -> float:
        """The 90th percentile of |error| of ``kind`` (a pass kind, or a calibration's kind of
        point), by nearest rank."""
        errors = sorted(abs(e) for e in self.errors.get(kind, self.by_point.get(kind, ())))
        if not errors:
            raise ValueError(f"no {kind} passes in the held-out model's calibration")
        return errors[min(len(errors) - 1, math.ceil(0.9 * len(errors)) - 1)]


def transfers(
    device: Device, samples: Sequence[Sample], *, rounds: int = 800, cache: Cache | None = None
) -> list[Transfer]:
    """Every way round: for each model in ``samples``, fit on the others, predict it (memory
    through ``cache``, as :func:`fit_cpu`).

    Raises:
        ValueError: for fewer than two models.
    """
    models = list(dict.fromkeys(s.model.name for s in samples))
    if len(models) < 2:
        raise ValueError(f"a transfer needs samples of 2 or more models, got {models}")
    out = []
    for held in models:
        kept = [s for s in samples if s.model.name != held]
        fit = fit_cpu(device, kept, rounds=rounds, cache=cache)
        errors: dict[str, list[float]] = {"prefill": [], "decode": []}
        points: dict[str, list[float]] = {}
        for s in samples:
            if s.model.name == held:
                error = fit.predict(s) / s.seconds - 1
                errors[s.kind].append(error)
                points.setdefault(s.point or s.kind, []).append(error)
        by_kind = {k: tuple(v) for k, v in errors.items() if v}
        by_point = {k: tuple(v) for k, v in points.items()}
        out.append(Transfer(held, fit.fitted_on, by_kind, fit, by_point))
    return out
