"""A cost model derived from a model's shapes and a device, measured nowhere: the physics' passes
synthesised over the token range a workload uses, the cost model's own terms fitted to them in
relative error (a term the passes do not support refused and recorded), the host's cost added
apart (DESIGN.md, "Compute from the model and the device"). Standard library only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType

from pytest_prefill.plan.compute.devices import Device
from pytest_prefill.plan.compute.efficiency import EfficiencyChoice
from pytest_prefill.plan.compute.fit import Fit, fit_terms
from pytest_prefill.plan.compute.physics import Physics
from pytest_prefill.plan.model_spec import ModelSpec
from pytest_prefill.sim import CostModel
from pytest_prefill.sim.cost import attention_pairs

POINTS = 12  # samples along each axis of the synthetic grid
CHUNKS = (512, 2048, 8192)  # chunk sizes a chunked prefill's pieces take over a cached context
HALF_PERCENT = 0.005  # a fit error below it rounds to "0%": printed "under 1%"
# A decode step's device seconds by an engine's own way of running it: (physics, rows, cached
# tokens in all) -> seconds (None: the physics' own, ``Physics.decode_step``).
DecodeStepRule = Callable[[Physics, int, int], float]


def _whole(name: str, value: object, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class TokenRange:
    """The token counts a workload puts through a pass: prompts from ``prompt_min`` to
    ``prompt_max`` tokens, sequences up to ``context_max`` tokens (prompt + output), decode
    batches up to ``max_rows`` rows.

    Raises:
        ValueError: naming the field, for a count that is not a whole number >= 1 or bounds
            out of order.
    """

    prompt_min: int
    prompt_max: int
    context_max: int
    max_rows: int

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _whole(f.name, getattr(self, f.name))
        if self.prompt_max < self.prompt_min:
            raise ValueError(
                f"prompt_max ({self.prompt_max}) is below prompt_min ({self.prompt_min})"
            )
        if self.context_max < self.prompt_max:
            raise ValueError(
                f"context_max ({self.context_max}) is below prompt_max ({self.prompt_max})"
            )

    @classmethod
    def of(cls, prompts: Sequence[int], outputs: Sequence[int], max_rows: int) -> TokenRange:
        """The range of a workload's prompt and output lengths."""
        if not prompts or len(prompts) != len(outputs):
            raise ValueError("a token range needs each request's prompt and output length")
        longest = max(p + o for p, o in zip(prompts, outputs, strict=True))
        return cls(max(1, min(prompts)), max(prompts), longest, max_rows)

    def describe(self) -> str:
        return (
            f"prompts {self.prompt_min:,}-{self.prompt_max:,} tokens, contexts to "
            f"{self.context_max:,}, up to {self.max_rows} decode rows"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class HostCost:
    """The serving engine's host side, apart from the device: seconds per step (every
    iteration), per layer per step, per request in a step, and per request and layer (an eager
    engine's per-request attention call, layer by layer); ``source`` says where from."""

    per_step: float = 0.0
    per_layer: float = 0.0
    per_request: float = 0.0
    source: str = "none tabled: device time only (optimistic by the engine's host overhead)"
    per_request_layer: float = 0.0

    def __post_init__(self) -> None:
        for name in ("per_step", "per_layer", "per_request", "per_request_layer"):
            value = getattr(self, name)
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not (ok and math.isfinite(value) and value >= 0):
                raise ValueError(f"host cost {name} must be >= 0 seconds, got {value!r}")

    def step(self, layers: int) -> float:
        return self.per_step + self.per_layer * layers

    def request(self, layers: int) -> float:
        return self.per_request + self.per_request_layer * layers


def host_from_calibration(measured: CostModel, device_part: CostModel, source: str) -> HostCost:
    """The host's cost a calibration implies: what its measured decode step's base and
    per-sequence terms exceed the derived device part by (for the same model, device and TP),
    never below 0."""
    return HostCost(
        per_step=max(0.0, measured.decode_step_base - device_part.decode_step_base),
        per_request=max(0.0, measured.decode_per_seq - device_part.decode_per_seq),
        source=f"from {source} (its decode step less the derived device part)",
    )


@dataclasses.dataclass(frozen=True, slots=True)
class DerivedCost:
    """A derived cost model: ``cost`` (device part fitted to the physics plus the host's),
    the ``basis`` line an answer prints, the fit's largest relative error against the physics
    over ``token_range`` (prefill passes and decode steps apart) and the terms it refused."""

    cost: CostModel
    basis: str
    prefill_error: float
    decode_error: float
    refused: Mapping[str, str]
    device: Device
    choice: EfficiencyChoice
    tp: int
    token_range: TokenRange
    host: HostCost

    @property
    def max_relative_error(self) -> float:
        return max(self.prefill_error, self.decode_error)


def geometric(low: int, high: int, points: int = POINTS) -> list[int]:
    """Up to ``points`` whole numbers from ``low`` to ``high`` evenly spaced in log."""
    if high <= low:
        return [low]
    ratio = (high / low) ** (1 / (points - 1))
    return sorted({round(low * ratio**i) for i in range(points)} | {high})


def decode_samples(
    physics: Physics, span: TokenRange, step: DecodeStepRule | None = None
) -> tuple[dict[str, list[float]], list[float]]:
    """Decode steps over the range: rows from 1 to ``max_rows``, each row's cached context
    from the shortest prompt to the longest sequence, timed by ``step`` (None: the physics')."""
    features: dict[str, list[float]] = {
        "decode_step_base": [],
        "decode_per_seq": [],
        "decode_per_kv_token": [],
    }
    targets: list[float] = []
    for rows in geometric(1, span.max_rows):
        for context in geometric(span.prompt_min, span.context_max, 6):
            kv = rows * context
            features["decode_step_base"].append(1.0)
            features["decode_per_seq"].append(float(rows - 1))
            features["decode_per_kv_token"].append(float(kv))
            targets.append(step(physics, rows, kv) if step else physics.decode_step(rows, kv))
    return features, targets


def prefill_samples(
    physics: Physics, span: TokenRange, per_kv_token: float
) -> tuple[dict[str, list[float]], list[float]]:
    """Prefill passes over the range: whole prompts from the shortest to the longest, and
    chunks over a cached context (the cached tokens' read at the decode's fitted price taken
    off, since the cost model charges it with that term)."""
    pieces = [(t, 0) for t in geometric(span.prompt_min, span.prompt_max)]
    for chunk in CHUNKS:
        if chunk < span.prompt_max:
            pieces += [(chunk, c) for c in geometric(chunk, span.prompt_max - chunk, 4)]
    features: dict[str, list[float]] = {
        "prefill_pass_overhead": [],
        "prefill_per_token": [],
        "prefill_per_pair": [],
    }
    targets: list[float] = []
    for tokens, context in pieces:
        seconds = physics.prefill_pass([(tokens, context)]) - per_kv_token * context
        features["prefill_pass_overhead"].append(1.0)
        features["prefill_per_token"].append(float(tokens))
        features["prefill_per_pair"].append(float(attention_pairs(tokens, context)))
        targets.append(max(seconds, 1e-9))
    return features, targets


def derive_cost(
    model: ModelSpec,
    device: Device,
    choice: EfficiencyChoice,
    span: TokenRange,
    *,
    tp: int = 1,
    host: HostCost | None = None,
    step: DecodeStepRule | None = None,
) -> DerivedCost:
    """The cost model of ``model`` on ``device`` at ``tp`` with ``choice``'s efficiencies,
    fitted on the physics' passes over ``span`` (its decode steps as ``step`` runs them; None:
    the physics' own), plus ``host`` (default: none tabled).

    Raises:
        ValueError: in one line, for a TP that does not divide the heads, fp8 weights on a
            device without fp8, or a range the fit cannot support.
    """
    host = host or HostCost()
    physics = Physics(model, device, choice.table, tp)
    decode: Fit = fit_terms(*decode_samples(physics, span, step))
    per_kv = decode.coefficients["decode_per_kv_token"]
    prefill: Fit = fit_terms(*prefill_samples(physics, span, per_kv))
    fixed = host.step(model.layers)
    terms = {**decode.coefficients, **prefill.coefficients}
    if (
        terms["decode_step_base"] + fixed <= 0
        or terms["prefill_pass_overhead"] + terms["prefill_per_token"] + fixed <= 0
    ):
        raise ValueError(f"the physics of {model.name} on {device.name} gives no step time to fit")
    cost = CostModel(
        prefill_pass_overhead=terms["prefill_pass_overhead"] + fixed,
        prefill_per_token=terms["prefill_per_token"],
        prefill_per_pair=terms["prefill_per_pair"],
        decode_step_base=terms["decode_step_base"] + fixed,
        decode_per_seq=terms["decode_per_seq"] + host.request(model.layers),
        decode_per_kv_token=per_kv,
        kv_bytes_per_token=float(model.kv_bytes_per_token),
        link_bandwidth=device.link_bandwidth,
        link_latency=device.link_latency,
    )
    refused = MappingProxyType({**decode.refused, **prefill.refused})
    worst = max(prefill.max_relative_error, decode.max_relative_error)
    return DerivedCost(
        cost,
        basis_line(device, choice, tp, worst, host),
        prefill.max_relative_error,
        decode.max_relative_error,
        refused,
        device,
        choice,
        tp,
        span,
        host,
    )


def fit_percent(error: float) -> str:
    """A fit's relative error as a whole percent, "under 1%" where it would round to 0%."""
    return "under 1%" if error < HALF_PERCENT else f"{max(error, 0.01):.0%}"


def basis_line(
    device: Device, choice: EfficiencyChoice, tp: int, fit_error: float, host: HostCost
) -> str:
    """``derived: NVIDIA H100 SXM5 80GB (datasheet …), TP 1, efficiency vllm-… from …;
    <error class>; the cost model within N% of the physics; host: …``."""
    table = choice.table
    borrowed = f" (borrowed from {choice.transferred_from})" if choice.transferred_from else ""
    return (
        f"derived: {device.name} ({device.source.split(';')[0]}), TP {tp}, efficiency "
        f"{table.engine}{borrowed} from {table.source}; {choice.error_class}; the cost model "
        f"within {fit_percent(fit_error)} of the physics over the range; host: {host.source}"
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Deriver:
    """``model`` on ``device`` with ``choice``'s efficiencies over ``span``: called with a TP,
    the cost model derived at that TP (a plain value, so a search can ship it to workers)."""

    model: ModelSpec
    device: Device
    choice: EfficiencyChoice
    span: TokenRange
    host: HostCost = HostCost()
    step: DecodeStepRule | None = None

    def derive(self, tp: int) -> DerivedCost:
        return derive_cost(
            self.model, self.device, self.choice, self.span, tp=tp, host=self.host, step=self.step
        )

    def __call__(self, tp: int) -> CostModel:
        return self.derive(tp).cost
