"""How a fidelity run is judged: a cell (one workload, metric and statistic: simulated beside
measured), the median error over the judged cells with its interval against the thresholds, and
the counter-checks judged on the cells where a wrong scheduling predicts differently."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Any

from pytest_prefill.serve.fidelity.fidelity_interval import CellKey, Interval

METRICS = ("ttft", "tpot", "itl", "e2el")
STATS = ("median", "p90")
# The verdict: HOLDS when the median |error| over all judged cells is at most THRESHOLD and the
# median |error| of the TTFT cells at most TTFT_THRESHOLD. TTFT is where the scheduling shows
# first: the lab's first-token rule adds a decode step to every TTFT, a budget too large or too
# small changes how many passes (and their overheads) a prompt takes. Chosen from what this box
# showed (docs/fidelity.md, "Fidelity against a server"): quiet runs under the server's scheduling gave a
# TTFT error of a few percent, the same runs under a wrong first-token rule or budget 14-24%.
THRESHOLD = 0.15
TTFT_THRESHOLD = 0.10
# A cell whose measured runs spread (half their range, relative to their median) more than this
# cannot test the model: printed, not judged.
MAX_NOISE = TTFT_THRESHOLD
# A counter-check is judged on the cells where its prediction is over SEPARATION x the cell's
# threshold from the right one's: where the right one is within its threshold of the
# measurement, a prediction that far from it cannot be (2: the least that guarantees it).
SEPARATION = 2.0


@dataclasses.dataclass(frozen=True)
class Cell:
    """One (workload, metric, statistic): the simulated value and the measured runs (seconds),
    both medians over the runs (each run simulated with its own send times)."""

    workload: str
    metric: str
    stat: str
    simulated: tuple[float, ...]
    measured: tuple[float, ...]

    @property
    def simulated_value(self) -> float:
        return statistics.median(self.simulated)

    @property
    def measured_value(self) -> float:
        return statistics.median(self.measured)

    @property
    def error(self) -> float:
        m = self.measured_value
        return (self.simulated_value - m) / m if m > 0 else math.nan

    @property
    def noise(self) -> float:
        """Half the measured runs' range over their median: the run-to-run spread."""
        m = self.measured_value
        return (max(self.measured) - min(self.measured)) / 2 / m if m > 0 else math.nan

    @property
    def judged(self) -> bool:
        return math.isfinite(self.error) and self.noise <= MAX_NOISE

    @property
    def key(self) -> CellKey:
        return (self.workload, self.metric, self.stat)

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "metric": self.metric,
            "stat": self.stat,
            "simulated": self.simulated_value,
            "measured": self.measured_value,
            "measured_runs": list(self.measured),
            "error": self.error,
            "noise": self.noise,
            "judged": self.judged,
        }


def judged_error(cells: Sequence[Cell], metric: str | None = None) -> float:
    """Median |error| over the judged cells (of ``metric`` only, when given; NaN when none is
    judged)."""
    errors = [abs(c.error) for c in cells if c.judged and metric in (None, c.metric)]
    return statistics.median(errors) if errors else math.nan


@dataclasses.dataclass(frozen=True)
class Judgement:
    """The two figures the verdict reads: the median |error| over all judged cells and over
    the judged TTFT cells, each with its bootstrap interval (``fidelity_interval``; None: not
    resampled). With intervals: HOLDS when both intervals' tops are within their thresholds,
    FAILS when either's bottom is over its threshold, UNDECIDED otherwise; without, the point
    figures decide HOLDS or FAILS. No judged cell FAILS, and so does no judged TTFT cell unless
    ``ttft_required`` is False (a counter-check's cells): then the one figure decides."""

    error: float
    ttft_error: float
    threshold: float = THRESHOLD
    ttft_threshold: float = TTFT_THRESHOLD
    interval: Interval | None = None
    ttft_interval: Interval | None = None
    ttft_required: bool = True

    @classmethod
    def of(
        cls,
        cells: Sequence[Cell],
        threshold: float = THRESHOLD,
        ttft_threshold: float = TTFT_THRESHOLD,
        intervals: tuple[Interval, Interval] | None = None,
    ) -> Judgement:
        every, ttft = intervals if intervals is not None else (None, None)
        return cls(
            judged_error(cells),
            judged_error(cells, "ttft"),
            threshold,
            ttft_threshold,
            every,
            ttft,
        )

    @property
    def verdict(self) -> str:
        if not math.isfinite(self.error):
            return "FAILS"  # no cell judged: nothing supports the claim
        figures = [(self.error, self.interval, self.threshold)]
        if math.isfinite(self.ttft_error):
            figures.append((self.ttft_error, self.ttft_interval, self.ttft_threshold))
        elif self.ttft_required:
            return "FAILS"  # no TTFT cell judged
        if any(i is None for _, i, _ in figures):
            return "HOLDS" if all(e <= limit for e, _, limit in figures) else "FAILS"
        if any(i is not None and i.low > limit for _, i, limit in figures):
            return "FAILS"
        if all(i is not None and i.high <= limit for _, i, limit in figures):
            return "HOLDS"
        return "UNDECIDED"

    def to_dict(self) -> dict[str, Any]:
        out = {
            k: v
            for k, v in dataclasses.asdict(self).items()
            if "interval" not in k and k != "ttft_required"
        }
        for name in ("interval", "ttft_interval"):
            value = getattr(self, name)
            out[name] = value.to_dict() if value is not None else None
        return {**out, "verdict": self.verdict}


def noise_floor(cells: Sequence[Cell]) -> float:
    """Median run-to-run spread over the cells."""
    spreads = [c.noise for c in cells if math.isfinite(c.noise)]
    return statistics.median(spreads) if spreads else math.nan


def apart(right: Cell, other: Cell) -> float:
    """How far ``other``'s simulated value is from ``right``'s, relative to ``right``'s: the
    two predictions only, never the measurement (NaN where ``right`` predicts 0)."""
    r = right.simulated_value
    return abs(other.simulated_value - r) / r if r > 0 else math.nan


def discriminating(
    right: Sequence[Cell],
    other: Sequence[Cell],
    *,
    threshold: float = THRESHOLD,
    ttft_threshold: float = TTFT_THRESHOLD,
) -> list[CellKey]:
    """The cells judged under ``right`` where ``other`` predicts differently: over
    ``SEPARATION`` x the cell's threshold apart (``apart``), so that where the right
    prediction is within its threshold of the measurement the other cannot be. Which cells
    these are depends on the two simulations and on which cells are judged (the measured runs'
    spread), never on either's error."""
    return [
        r.key
        for r, o in zip(right, other)
        if r.judged
        and apart(r, o) > SEPARATION * (ttft_threshold if r.metric == "ttft" else threshold)
    ]  # NaN is never over


@dataclasses.dataclass(frozen=True)
class CounterCheck:
    """A wrong scheduling judged where it predicts differently from the right one: on its
    ``discriminating`` cells, its median |error| with its interval (``judgement``) and the
    right scheduling's on the same cells and draws (``right``); both None without such a cell.
    ``apart``: the largest difference of the two predictions over the judged cells;
    ``overall``: its judgement over every judged cell, for context only."""

    overall: Judgement
    cells: tuple[CellKey, ...]
    apart: float
    judgement: Judgement | None = None
    right: Judgement | None = None

    @property
    def verdict(self) -> str:
        """The judgement's verdict; UNDECIDED where no cell tells the two apart."""
        return self.judgement.verdict if self.judgement is not None else "UNDECIDED"

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "cells": [list(c) for c in self.cells],
            "apart": self.apart,
            "judgement": self.judgement.to_dict() if self.judgement is not None else None,
            "right": self.right.to_dict() if self.right is not None else None,
            "overall": self.overall.to_dict(),
        }
