"""How sure a fidelity verdict is: a bootstrap over requests and runs. Each resample
(``resample``) draws, per held-out workload, its runs with replacement and within each drawn
run its requests with replacement — the same draw for the measured requests and their
simulated twins, and for every scheduling judged — and recomputes every judged cell's |error|
(median over the drawn runs of each run's median or p90). ``interval_of`` takes the median
|error| over a set of those cells in each resample — every judged cell, the TTFT ones, or a
counter-check's — and gives the middle ``LEVEL`` of those medians. Standard library only."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_prefill.serve.load.records import BenchRun
from pytest_prefill.sim import linear_percentile
from pytest_prefill.sim.percentiles import linear_rank

RESAMPLES = 300
LEVEL = 0.90  # 5th to 95th percentile of the resampled errors
SEED = 0


@dataclasses.dataclass(frozen=True)
class Interval:
    """The middle ``level`` of the resampled errors: [``low``, ``high``]."""

    low: float
    high: float
    level: float = LEVEL
    resamples: int = RESAMPLES

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Values:
    """One request's figures: TTFT, TPOT (None: one token), E2EL and its gaps."""

    ttft: float
    tpot: float | None
    e2el: float
    gaps: tuple[float, ...]

    @classmethod
    def of(cls, arrival: float, times: Sequence[float]) -> Values:
        tpot = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None
        gaps = tuple(b - a for a, b in zip(times, times[1:]))
        return cls(times[0] - arrival, tpot, times[-1] - arrival, gaps)


# One workload's runs: per run, its requests' (measured, simulated) values, in the same order.
Paired = Sequence[Sequence[tuple[Values, Values]]]


def paired_runs(runs: Sequence[BenchRun], simulated: Sequence[Sequence[Any]]) -> Paired:
    """Each run's completed requests beside their simulated twins (``simulate_records``'s
    output for that run, in the same order)."""
    out = []
    for run, twins in zip(runs, simulated):
        out.append(
            [
                (Values.of(r.arrival, r.token_times), Values.of(s.arrival, s.token_times))
                for r, s in zip(run.completed, twins)
            ]
        )
    return out


def _sorted(requests: Sequence[Values], metric: str) -> list[float]:
    if metric == "itl":
        return sorted(g for v in requests for g in v.gaps)
    return sorted(x for v in requests if (x := getattr(v, metric)) is not None)


def _at(ordered: Sequence[float], p: float) -> float:
    """The linear ``p``-th percentile of sorted values (``sim.linear_rank``'s rule)."""
    if not ordered:
        return math.nan
    rank, fraction = linear_rank(p, len(ordered))
    low = ordered[rank - 1]
    return low if fraction == 0 else low + (ordered[rank] - low) * fraction


def _errors(
    draw: Sequence[Sequence[tuple[Values, Values]]], metric: str, stats: Sequence[str]
) -> dict[str, float]:
    """Each statistic's error over one draw of a workload's runs: the median over the drawn
    runs of each run's simulated and measured statistic."""
    measured = [_sorted([m for m, _ in run], metric) for run in draw]
    simulated = [_sorted([s for _, s in run], metric) for run in draw]
    out = {}
    for stat in stats:
        p = 50.0 if stat == "median" else float(stat[1:])
        m = statistics.median(_at(v, p) for v in measured)
        sim = statistics.median(_at(v, p) for v in simulated)
        out[stat] = (sim - m) / m if m > 0 else math.nan
    return out


def _draw(paired: Paired, rng: random.Random) -> list[list[tuple[Values, Values]]]:
    runs = [paired[rng.randrange(len(paired))] for _ in paired]
    return [[run[rng.randrange(len(run))] for _ in run] for run in runs if run]


CellKey = tuple[str, str, str]  # (workload, metric, stat)
# Per scheduling label, per resample: each judged cell's |error| on that resample's draw.
Resampled = dict[str, list[dict[CellKey, float]]]


def resample(
    schedulings: Mapping[str, Mapping[str, Paired]],
    judged: Sequence[CellKey],
    *,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> Resampled:
    """Per scheduling label, ``resamples`` draws of every judged cell's |error| — the same
    draw of runs and requests for every scheduling. ``schedulings``: label -> workload ->
    paired runs; ``judged``: the (workload, metric, stat) cells to recompute."""
    out: Resampled = {k: [] for k in schedulings}
    rng = random.Random(seed)
    workloads = sorted({w for w, _, _ in judged})
    groups: dict[tuple[str, str], list[str]] = {}
    for w, metric, stat in judged:
        groups.setdefault((w, metric), []).append(stat)
    for _ in range(resamples):
        state = rng.getstate()
        for label, by_workload in schedulings.items():
            rng.setstate(state)  # the same draw for every scheduling
            draws = {w: _draw(by_workload[w], rng) for w in workloads}
            cells = {}
            for (w, metric), stats in groups.items():
                if draws[w]:
                    found = _errors(draws[w], metric, stats)
                    cells.update({(w, metric, stat): abs(found[stat]) for stat in stats})
            out[label].append(cells)
    return out


def interval_of(
    draws: Sequence[Mapping[CellKey, float]], cells: Sequence[CellKey], level: float = LEVEL
) -> Interval:
    """The middle ``level`` of the median |error| over ``cells`` across the resamples (NaN
    bounds when no cell is finite in any)."""
    medians = []
    for draw in draws:
        found = [e for c in cells if math.isfinite(e := draw.get(c, math.nan))]
        medians.append(statistics.median(found) if found else math.nan)
    return _interval(medians, (1 - level) / 2 * 100, level, len(draws))


def _interval(values: Sequence[float], tail: float, level: float, resamples: int) -> Interval:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return Interval(math.nan, math.nan, level, resamples)
    return Interval(
        linear_percentile(finite, tail), linear_percentile(finite, 100 - tail), level, resamples
    )
