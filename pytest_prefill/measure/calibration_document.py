"""A calibration as a value and as a JSON document: the measured cost model with everything
needed to trust it or not (provenance, raw measurements, fits, refusals, the prefill floor, the
held-out predictions), written and read back (schema 2; schema 1 still reads)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_prefill._io import json_number
from pytest_prefill.measure.calibration_points import (
    NO_FLOOR,
    FitResult,
    Floor,
    Point,
    Prediction,
    Refusal,
)
from pytest_prefill.measure.fitting import TermFit
from pytest_prefill.plan.advice import (
    FittedCost,
    Recommendation,
    Trust,
    chunk_star_text,
    recommend,
    star_contexts,
)
from pytest_prefill.plan.cost_document import CALIBRATION_KIND, SCHEMA_VERSIONS, check_cost_range
from pytest_prefill.sim import CostModel

KIND = CALIBRATION_KIND
SCHEMA_VERSION = SCHEMA_VERSIONS[CALIBRATION_KIND]  # 2: cost model v2 (fits, held-out error)
READABLE_SCHEMAS = tuple(range(1, SCHEMA_VERSION + 1))  # 1 (linear): cost model and points kept


@dataclasses.dataclass(frozen=True)
class Calibration:
    """A measured cost model and everything needed to trust it or not: provenance, every raw
    measurement (median and spread), the fits, the refused constants with their reasons, the
    prefill floor, and each point's fitted and held-out prediction."""

    cost: CostModel
    provenance: Mapping[str, Any]
    measurements: tuple[Point, ...]
    fits: Mapping[str, TermFit]
    refusals: tuple[Refusal, ...]
    floor: Floor = NO_FLOOR
    predictions: tuple[Prediction, ...] = ()

    @classmethod
    def from_fit(
        cls, fit: FitResult, provenance: Mapping[str, Any], points: Sequence[Point]
    ) -> Calibration:
        return cls(
            fit.cost,
            dict(provenance),
            tuple(points),
            dict(fit.fits),
            fit.refusals,
            fit.floor,
            fit.predictions,
        )

    def points(self, kind: str) -> list[Point]:
        return [p for p in self.measurements if p.kind == kind]

    def refused(self) -> set[str]:
        """Names of the constants this calibration refused."""
        return {r.constant for r in self.refusals}

    @property
    def contexts(self) -> tuple[int, ...]:
        """The contexts C* is reported at (within the model's context)."""
        return star_contexts(self.provenance.get("max_context"))

    def trust(self) -> Trust:
        """The trust figures of this fit: held-out error, a busy machine, unstable points."""
        held = self.held_out_median
        quiet = self.provenance.get("quiet")
        said = quiet.get("quiet") if isinstance(quiet, Mapping) else None
        return Trust(
            held if math.isfinite(held) else None,
            (not said) if isinstance(said, bool) else None,
            sum(1 for p in self.measurements if p.measurement.warning),
        )

    def fitted(self) -> FittedCost:
        """The cost model with what this calibration said of it."""
        return FittedCost(self.cost, frozenset(self.refused()), self.contexts, self.trust())

    def recommendation(self) -> Recommendation:
        return recommend(self.fitted())

    def chunk_star_text(self) -> str:
        return chunk_star_text(self.fitted())

    def _fit(self) -> FitResult:
        return FitResult(self.cost, self.fits, self.refusals, self.floor, self.predictions)

    @property
    def held_out_median(self) -> float:
        """Median |relative error| of each prefill/chunk point predicted by a fit made without
        its prompt length: the number to trust (nan when not computed)."""
        return self._fit().held_out_median

    @property
    def in_sample_median(self) -> float:
        """Median |relative error| of the fit itself over the prefill/chunk points."""
        return self._fit().in_sample_median

    def to_dict(self) -> dict[str, Any]:
        advice = self.recommendation()
        return {
            "kind": KIND,
            "schema_version": SCHEMA_VERSION,
            "cost_model": self.cost.to_dict(),
            "chunk_star": json_number(self.cost.chunk_star()),
            "chunk_star_by_context": {
                str(c): json_number(self.cost.chunk_star(context=c)) for c in self.contexts
            },
            "recommendation": advice.policy,
            "recommended_chunk": advice.chunk,
            "held_out_median_error": json_number(self.held_out_median),
            "trust": self.trust().to_dict(),
            "in_sample_median_error": json_number(self.in_sample_median),
            "floor": self.floor.to_dict(),
            "provenance": dict(self.provenance),
            "measurements": [p.to_dict() for p in self.measurements],
            "fits": {name: fit.to_dict() for name, fit in self.fits.items()},
            "refusals": [r.to_dict() for r in self.refusals],
            "predictions": [p.to_dict() for p in self.predictions],
        }

    @classmethod
    def from_dict(cls, data: Any) -> Calibration:
        """Inverse of :meth:`to_dict`; a schema-1 calibration loads with its cost model,
        measurements and refusals (and no fits or held-out predictions).

        Raises:
            ValueError: for anything that is not a pytest-prefill calibration.
        """
        if not isinstance(data, Mapping) or data.get("kind") != KIND:
            kind = data.get("kind") if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(
                f"not a pytest-prefill calibration: kind is {kind!r}, expected {KIND!r}"
            )
        version = data.get("schema_version")
        if version not in READABLE_SCHEMAS:
            raise ValueError(
                f"calibration schema_version must be one of {READABLE_SCHEMAS}, got {version!r}"
            )
        try:
            return _from_document(data, version)
        except (KeyError, TypeError, AttributeError, ValueError) as err:
            raise ValueError(f"corrupt pytest-prefill calibration: {err!s}") from None


def _from_document(data: Mapping[str, Any], version: int) -> Calibration:
    cost = check_cost_range(CostModel.from_dict(data["cost_model"]), "")
    provenance = data["provenance"]
    if not isinstance(provenance, Mapping):
        raise ValueError("provenance must be an object")
    points = tuple(Point.from_dict(p) for p in data["measurements"])
    refusals = tuple(Refusal.from_dict(r) for r in data["refusals"])
    if version == 1:
        return Calibration(cost, dict(provenance), points, {}, refusals)
    fits = {str(k): _term_fit(v) for k, v in data["fits"].items()}
    by_label: dict[tuple[str, str], Point] = {}
    for p in points:
        by_label.setdefault((p.label(), p.kind), p)
    predictions = tuple(
        Prediction(by_label[(d["label"], d["kind"])], float(d["fitted"]), d.get("held_out"))
        for d in data.get("predictions", [])
    )
    floor = Floor.from_dict(data.get("floor"))
    return Calibration(cost, dict(provenance), points, fits, refusals, floor, predictions)


def _term_fit(data: Any) -> TermFit:
    if not isinstance(data, Mapping):
        raise ValueError(f"a fit must be an object, got {data!r:.60}")
    names = tuple(str(n) for n in data["names"])
    floats = {
        key: {str(k): float(v) for k, v in data[key].items()}
        for key in ("values", "stderrs", "estimates", "effects")
    }
    return TermFit(
        names,
        floats["values"],
        floats["stderrs"],
        floats["estimates"],
        floats["effects"],
        {str(k): str(v) for k, v in data["refused"].items()},
        float(data["scatter"]),
        float(data["residual_sd"]),
        int(data["points"]),
    )
