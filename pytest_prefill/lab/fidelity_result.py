"""What a fidelity run found, and how it is judged: each (scenario, policy, metric) cell, the
simulated value against the measured runs and their spread, and the run's median error against
``THRESHOLD``; the real iterations' errors against the cost model. No torch."""

from __future__ import annotations

import dataclasses
import datetime
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_prefill._io import json_number
from pytest_prefill.sim import CostModel, Request, iteration_cost, percentile

KIND = "pytest-prefill/fidelity"
SCHEMA_VERSION = 2
# The benchmark fails when the median |relative error| over the judged cells (every
# (scenario, policy, metric) but the max stalls the policy does not cause; see ``judged``)
# exceeds this.
THRESHOLD = 0.10
METRICS = ("ttft_p50", "ttft_p99", "max_stall", "makespan", "gpu_seconds")
# Max stall is judged only where the simulator says the policy causes a stall: at least this
# many times its own median token gap. Elsewhere the simulated stall is one more decode step,
# and the measured one is the largest of hundreds of noisy gaps: the machine's jitter (a
# preemption, a page fault), which the cost model does not claim to predict.
STALL_JUDGED_RATIO = 2.0


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    load: tuple[Request, ...]
    note: str


@dataclasses.dataclass(frozen=True)
class Cell:
    """One (scenario, policy, metric): the simulated value and the measured runs (seconds);
    ``judged`` is False for a value reported but not held against the model."""

    scenario: str
    policy: str
    metric: str
    simulated: float
    runs: tuple[float, ...]
    judged: bool = True

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def minimum(self) -> float:
        return min(self.runs)

    @property
    def maximum(self) -> float:
        return max(self.runs)

    @property
    def relative_error(self) -> float:
        """(simulated - measured median) / measured median."""
        return (self.simulated - self.median) / self.median if self.median > 0 else math.nan

    @property
    def spread(self) -> float:
        """Run-to-run spread relative to the median: (max - min) / median."""
        return (self.maximum - self.minimum) / self.median if self.median > 0 else math.nan

    @property
    def within_spread(self) -> bool:
        return self.minimum <= self.simulated <= self.maximum

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "policy": self.policy,
            "metric": self.metric,
            "simulated": self.simulated,
            "measured_median": self.median,
            "measured_min": self.minimum,
            "measured_max": self.maximum,
            "runs": list(self.runs),
            "relative_error": json_number(self.relative_error),
            "spread": json_number(self.spread),
            "within_spread": self.within_spread,
            "judged": self.judged,
        }


def judged(metric: str, simulated: Any) -> bool:
    """Whether a cell of ``metric`` is held against the model, given the simulated summary
    (see ``STALL_JUDGED_RATIO``)."""
    if metric != "max_stall":
        return True
    return simulated.max_stall >= STALL_JUDGED_RATIO * simulated.tbt_p50


def percentiles(values: Sequence[float]) -> dict[str, float | int]:
    """Median and nearest-rank 10th/90th percentiles of ``values`` (and how many)."""
    return {
        "median": statistics.median(values),
        "p10": percentile(values, 10),
        "p90": percentile(values, 90),
        "count": len(values),
    }


def iteration_errors(trace: Any, cost: CostModel) -> dict[str, list[float]]:
    """Per iteration kind, (measured - predicted) / predicted for every iteration of a real
    run, the prediction being the cost model's for that exact composition: separates the cost
    model's error from the scheduling's (which the fake-clock engine shows to be exact)."""
    out: dict[str, list[float]] = {}
    for e in trace.events:
        predicted = iteration_cost(e, cost)
        if predicted > 0:
            out.setdefault(e.kind, []).append((e.duration - predicted) / predicted)
    return out


@dataclasses.dataclass(frozen=True)
class FidelityResult:
    """Everything a fidelity run measured and predicted. ``calibrations``: "single worker"
    (and "disaggregated worker" when that policy ran) -> ``calibrate.Calibration``; ``link``
    the measured KV link (None when disaggregation did not run); ``not_run``: policy -> the
    reason; ``quiet``: the quiet-machine probe (``quiet.Quietness``) taken before timing;
    ``iterations``: policy -> iteration kind -> relative error of every real iteration."""

    cells: tuple[Cell, ...]
    scenarios: tuple[Scenario, ...]
    skipped: tuple[str, ...]
    not_run: Mapping[str, str]
    calibrations: Mapping[str, Any]
    link: Any
    transfers: tuple[float, ...]
    setups: Mapping[str, str]
    chunk: int
    runs: int
    provenance: Mapping[str, Any]
    iterations: Mapping[str, Mapping[str, tuple[float, ...]]]
    quiet: Any

    def _errors(self, cells: Sequence[Cell]) -> list[float]:
        return [abs(c.relative_error) for c in cells if math.isfinite(c.relative_error)]

    @property
    def median_abs_error(self) -> float:
        """Median |relative error| over the judged cells: the figure the threshold applies to."""
        errors = self._errors([c for c in self.cells if c.judged])
        return statistics.median(errors) if errors else math.nan

    @property
    def median_abs_error_all(self) -> float:
        """The same over every cell, judged or not (reported beside it)."""
        errors = self._errors(self.cells)
        return statistics.median(errors) if errors else math.nan

    @property
    def passed(self) -> bool:
        return self.median_abs_error <= THRESHOLD

    def by(self, field: str, *, only_judged: bool = True) -> dict[str, float]:
        """Median |relative error| grouped by ``field`` (scenario, policy or metric)."""
        groups: dict[str, list[float]] = {}
        for c in self.cells:
            if math.isfinite(c.relative_error) and (c.judged or not only_judged):
                groups.setdefault(getattr(c, field), []).append(abs(c.relative_error))
        return {k: statistics.median(v) for k, v in groups.items()}

    def weakest(self, n: int = 5) -> list[Cell]:
        finite = [c for c in self.cells if c.judged and math.isfinite(c.relative_error)]
        return sorted(finite, key=lambda c: -abs(c.relative_error))[:n]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "schema_version": SCHEMA_VERSION,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "threshold": THRESHOLD,
            "median_abs_relative_error": json_number(self.median_abs_error),
            "median_abs_relative_error_all_cells": json_number(self.median_abs_error_all),
            "passed": self.passed,
            "quiet": self.quiet.to_dict() if self.quiet is not None else None,
            "chunk": self.chunk,
            "runs": self.runs,
            "provenance": dict(self.provenance),
            "setups": dict(self.setups),
            "not_run": dict(self.not_run),
            "scenarios": [
                {
                    "name": s.name,
                    "note": s.note,
                    "requests": [dataclasses.asdict(r) for r in s.load],
                }
                for s in self.scenarios
            ],
            "skipped": list(self.skipped),
            "cells": [c.to_dict() for c in self.cells],
            "error_by_policy": self.by("policy"),
            "error_by_metric": self.by("metric"),
            "error_by_metric_all_cells": self.by("metric", only_judged=False),
            "error_by_scenario": self.by("scenario"),
            "calibrations": {k: v.to_dict() for k, v in self.calibrations.items()},
            "link": self.link.to_dict() if self.link is not None else None,
            "transfers": list(self.transfers),
            "iteration_errors": {
                policy: {kind: percentiles(v) for kind, v in kinds.items()}
                for policy, kinds in self.iterations.items()
            },
        }
