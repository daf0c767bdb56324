"""What a calibration measured and what its fit says of it: the measured points, the terms
refused with their numbers, the floor under short prompts, each point's fitted and held-out
prediction, and the fit's result. The fits themselves are :mod:`.calibration_fit`'s."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping
from typing import Any

from pytest_prefill.measure.fitting import TermFit
from pytest_prefill.measure.timing import Measurement
from pytest_prefill.sim import CostModel, check_int

POINT_KINDS = ("prefill", "chunk", "decode_kv", "decode_batch", "fused")
PREFILL_KINDS = ("prefill", "chunk")
DECODE_KINDS = ("decode_kv", "decode_batch")
PREFILL_TERMS = ("prefill_pass_overhead", "prefill_per_token", "prefill_per_pair")
DECODE_TERMS = ("decode_step_base", "decode_per_seq", "decode_per_kv_token")


def _whole(field: str, value: Any, minimum: int) -> int:
    return check_int(f"point {field}", value, minimum=minimum)


@dataclasses.dataclass(frozen=True, slots=True)
class Point:
    """One measured operation.

    ``kind``: ``prefill`` (x = prompt tokens into a fresh cache), ``chunk`` (x new tokens over
    ``context`` cached tokens of the same prompt), ``decode_kv`` (x = cached tokens of each of
    ``rows`` rows, 1 when 0),
    ``decode_batch`` (x rows, each with ``context`` cached tokens) or ``fused`` (x prompt tokens
    over ``context`` cached ones, plus ``rows`` decode rows of ``row_context`` cached tokens
    each, in one pass).
    """

    kind: str
    x: int
    measurement: Measurement
    context: int = 0
    rows: int = 0
    row_context: int = 0

    def __post_init__(self) -> None:
        if self.kind not in POINT_KINDS:
            raise ValueError(
                f"point kind must be one of {', '.join(POINT_KINDS)}, got {self.kind!r}"
            )
        _whole("x", self.x, 1)
        _whole("context", self.context, 0)
        _whole("rows", self.rows, 1 if self.kind == "fused" else 0)
        _whole("row_context", self.row_context, 0)

    @property
    def pieces(self) -> tuple[tuple[int, int], ...]:
        """The prompt pieces (new tokens, context) the pass holds."""
        return ((self.x, self.context),) if self.kind in ("prefill", "chunk", "fused") else ()

    @property
    def decode_rows(self) -> int:
        if self.kind == "decode_kv":
            return max(1, self.rows)
        return {"decode_batch": self.x, "fused": self.rows}.get(self.kind, 0)

    @property
    def kv_tokens(self) -> int:
        """Cached tokens the decode rows read in all."""
        if self.kind == "decode_kv":
            return self.x * self.decode_rows
        if self.kind == "decode_batch":
            return self.x * self.context
        return self.rows * self.row_context if self.kind == "fused" else 0

    def label(self) -> str:
        if self.kind == "prefill":
            return f"prefill {self.x:,}"
        if self.kind == "chunk":
            return f"chunk {self.x:,} over {self.context:,}"
        if self.kind == "decode_kv":
            rows = f"{self.rows} x " if self.rows > 1 else ""
            return f"decode, {rows}{self.x:,} cached"
        if self.kind == "decode_batch":
            return f"decode, batch {self.x} x {self.context:,} cached"
        return f"fused {self.x:,} over {self.context:,} + {self.rows} rows"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "x": self.x,
            "context": self.context,
            "rows": self.rows,
            "row_context": self.row_context,
            "measurement": self.measurement.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Any) -> Point:
        if not isinstance(data, Mapping):
            raise ValueError(f"a measurement point must be an object, got {data!r:.60}")
        numbers: dict[str, Any] = {k: data.get(k, 0) for k in ("context", "rows", "row_context")}
        return cls(
            data.get("kind"),  # type: ignore[arg-type]  # checked by __post_init__
            data.get("x"),  # type: ignore[arg-type]
            Measurement.from_dict(data.get("measurement")),
            **numbers,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """A cost-model constant the measurements could not support, recorded as 0."""

    constant: str
    reason: str
    numbers: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"constant": self.constant, "reason": self.reason, "numbers": dict(self.numbers)}

    @classmethod
    def from_dict(cls, data: Any) -> Refusal:
        if not isinstance(data, Mapping) or not isinstance(data.get("constant"), str):
            raise ValueError(f"a refusal must be an object with 'constant', got {data!r:.60}")
        numbers = data.get("numbers", {})
        if not isinstance(numbers, Mapping):
            raise ValueError("a refusal's 'numbers' must be an object")
        return cls(data["constant"], str(data.get("reason", "")), dict(numbers))


@dataclasses.dataclass(frozen=True, slots=True)
class Floor:
    """The prefill floor: below the compute knee a pass costs about ``value`` seconds whatever
    its length (memory-bound). ``knee`` is the longest prompt the floor was fitted on (0: no
    floor, ``value`` 0); ``reason`` says why there is one or not."""

    value: float
    knee: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "knee": self.knee, "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Any) -> Floor:
        if not isinstance(data, Mapping):
            return NO_FLOOR
        return cls(float(data.get("value", 0.0)), int(data.get("knee", 0)), str(data.get("reason")))


NO_FLOOR = Floor(0.0, 0, "no floor")


@dataclasses.dataclass(frozen=True, slots=True)
class Prediction:
    """A measured point beside the fitted model's value for it, in-sample and held out (None
    when the point was not held out: only prefill and chunk points are)."""

    point: Point
    fitted: float
    held_out: float | None

    @property
    def measured(self) -> float:
        return self.point.measurement.median

    @property
    def error(self) -> float:
        return (self.fitted - self.measured) / self.measured

    @property
    def held_out_error(self) -> float | None:
        if self.held_out is None:
            return None
        return (self.held_out - self.measured) / self.measured

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.point.label(),
            "kind": self.point.kind,
            "x": self.point.x,
            "context": self.point.context,
            "measured": self.measured,
            "fitted": self.fitted,
            "error": self.error,
            "held_out": self.held_out,
            "held_out_error": self.held_out_error,
        }


def predict(cost: CostModel, floor: Floor, point: Point) -> float:
    """The model's time for ``point``: the cost model's iteration, and the floor under a
    prefill pass."""
    value = cost.iteration(point.pieces, point.decode_rows, point.kv_tokens)
    if point.kind in PREFILL_KINDS:
        return max(value, floor.value)
    return value


@dataclasses.dataclass(frozen=True)
class FitResult:
    """What :func:`fit_cost_model` found."""

    cost: CostModel
    fits: Mapping[str, TermFit]
    refusals: tuple[Refusal, ...]
    floor: Floor
    predictions: tuple[Prediction, ...]

    @property
    def held_out_errors(self) -> list[float]:
        return [p.held_out_error for p in self.predictions if p.held_out_error is not None]

    @property
    def held_out_median(self) -> float:
        """Median |held-out relative error| over the prefill and chunk points (nan if none)."""
        errors = [abs(e) for e in self.held_out_errors]
        return statistics.median(errors) if errors else math.nan

    @property
    def in_sample_median(self) -> float:
        """Median |relative error| of the fit over the prefill and chunk points."""
        errors = [abs(p.error) for p in self.predictions if p.point.kind in PREFILL_KINDS]
        return statistics.median(errors) if errors else math.nan
