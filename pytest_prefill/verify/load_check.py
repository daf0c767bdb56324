"""The server's speed under load against its calibration's: the requests the probes skip, sent
at the predicted knee, replayed in the simulator with every cost scaled by a factor k, and k
fitted so that the simulated mean latency is the measured one, with a bootstrap interval. A
factor whose interval holds 1 is refused (the calibration's speed stands); one that does not
scales the cost model the knee is predicted with.

Why: a calibration times passes and steps with a few streams live. Under a probe's load the
server does more beside them (vLLM's CPU build: its API server, its engine loop and the load
generator share one core, and each step waits on that core), and on this box its knee came
out 8-35% below the one predicted from the calibration alone while the same calibration
predicted the probes' requests' latencies within 2-9% at light load. Standard library only."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from pytest_prefill.measure.quiet import QuietHost, quietly
from pytest_prefill.serve.calibration.server_model import ServerModel, simulate_records
from pytest_prefill.serve.load.loadgen import Bounds, Schedule, Target
from pytest_prefill.serve.load.records import BenchRun, ServerRecord
from pytest_prefill.serve.load.server_metrics import run_counted
from pytest_prefill.sim import Request
from pytest_prefill.sim.checks import check_int
from pytest_prefill.verify.fields import Fields, written

FACTORS = tuple(round(0.5 + 0.02 * i, 2) for i in range(101))  # 0.5 .. 2.5, the fitted range
MIN_REQUESTS = 30  # fewer completed requests than this: no factor is fitted
BLOCK = 20  # requests a resampled block: requests queued together move together


def latencies(records: Sequence[Any]) -> list[float]:
    """Each request's latency, arrival to last token (seconds): a measured run's records or
    their simulated twins (anything with ``arrival`` and ``token_times``)."""
    return [r.token_times[-1] - r.arrival for r in records]


@dataclasses.dataclass(frozen=True)
class LoadFactor:
    """The factor k on the calibration's costs that puts the simulated mean latency of
    measured runs' requests at the measured one: ``estimate`` with its ``low``-``high``
    bootstrap interval at ``level`` (``resamples`` resamplings of blocks of requests);
    ``kept`` when the interval leaves out 1, else ``factor`` is 1 and ``reason`` says why;
    the measured and simulated (k = 1) mean latencies, seconds, over ``requests``."""

    estimate: float
    low: float
    high: float
    level: float
    resamples: int
    measured_latency: float
    simulated_latency: float
    requests: int
    reason: str = ""

    @property
    def kept(self) -> bool:
        return not self.reason

    @property
    def factor(self) -> float:
        return self.estimate if self.kept else 1.0

    def sentence(self) -> str:
        head = (
            f"mean latency {self.measured_latency:.3g} s measured, "
            f"{self.simulated_latency:.3g} s simulated on {self.requests} requests"
        )
        if math.isnan(self.estimate):
            return f"{head}; no factor: {self.reason}"
        fitted = (
            f"the server ran at x{self.estimate:.2f} [{self.low:.2f}, {self.high:.2f}] the "
            "calibration's cost"
        )
        return f"{head}: {fitted}, " + ("kept" if self.kept else f"refused: {self.reason}")

    def to_dict(self) -> dict[str, Any]:
        return written(self, kept=self.kept, factor=self.factor, sentence=self.sentence())

    @classmethod
    def from_dict(cls, fields: Fields) -> LoadFactor:
        """Raises: ValueError naming the field, for one missing or of the wrong type."""
        return fields.values_of(cls)


def fit_load_factor(
    runs: Sequence[Sequence[ServerRecord]],
    server_model: ServerModel,
    *,
    level: float = 0.9,
    resamples: int = 1000,
    seed: int = 0,
) -> LoadFactor:
    """The factor on ``server_model``'s cost that makes the simulator's mean latency of the requests of
    ``runs`` (each the records of one measured run, replayed at their measured arrivals:
    ``serve.calibration.server_model``; failed ones left out) the measured mean, searched over
    :data:`FACTORS`. Its interval resamples blocks of :data:`BLOCK` requests in the order
    sent (a request's simulated latency at each factor kept with it): requests queued together
    are not independent. It cannot see a server whose speed moves between runs.

    Raises:
        ValueError: for a level outside (0, 1) or resamples below 100.
    """
    if not (isinstance(level, float) and 0 < level < 1):
        raise ValueError(f"level must be a number in (0, 1), got {level!r}")
    check_int("resamples", resamples, minimum=100)
    done = [sorted((r for r in run if r.ok), key=lambda r: r.arrival) for run in runs]
    measured = [x for run in done for x in latencies(run)]
    if len(measured) < MIN_REQUESTS:
        mean = statistics.fmean(measured) if measured else math.nan
        why = f"{len(measured)} completed requests, fewer than {MIN_REQUESTS}"
        count = len(measured)
        return LoadFactor(math.nan, math.nan, math.nan, level, 0, mean, math.nan, count, why)
    simulated = [
        [x for run in done for x in latencies(simulate_records(run, server_model.scaled(k)))]
        for k in FACTORS
    ]
    everyone = list(range(len(measured)))
    blocks, start = [], 0
    for run in done:
        blocks += [
            everyone[i : min(i + BLOCK, start + len(run))]
            for i in range(start, start + len(run), BLOCK)
        ]
        start += len(run)
    estimate = _crossing(simulated, measured, everyone)
    rng = random.Random(seed)
    draws = sorted(
        _crossing(simulated, measured, [i for b in rng.choices(blocks, k=len(blocks)) for i in b])
        for _ in range(resamples)
    )
    tail = (1 - level) / 2
    low, high = draws[int(tail * (resamples - 1))], draws[int((1 - tail) * (resamples - 1))]
    mean, at_one = statistics.fmean(measured), statistics.fmean(simulated[FACTORS.index(1.0)])
    fit = LoadFactor(estimate, low, high, level, resamples, mean, at_one, len(measured))
    return dataclasses.replace(fit, reason=_refusal(fit))


def _refusal(fit: LoadFactor) -> str:
    edge = f"outside the factors searched ({FACTORS[0]:g}-{FACTORS[-1]:g})"
    if fit.estimate <= FACTORS[0] or fit.estimate >= FACTORS[-1]:
        return f"{edge}: the server's speed under load is not a scaled calibration"
    if fit.low <= 1 <= fit.high:
        return "its interval holds 1: the calibration's speed stands"
    return ""


def _crossing(
    simulated: Sequence[Sequence[float]], measured: Sequence[float], pick: Sequence[int]
) -> float:
    """Where the mean over ``pick`` of the simulated latencies (one list per factor, in the
    order of :data:`FACTORS`) crosses the measured mean: interpolated between neighbouring
    factors, found by bisection (the mean grows with the factor, as every cost does); the
    first or last factor when it never crosses."""

    target = _mean_at(measured, pick)

    def gap(j: int) -> float:
        return _mean_at(simulated[j], pick) - target

    lo, hi = 0, len(FACTORS) - 1
    if gap(lo) >= 0:
        return FACTORS[lo]
    if gap(hi) <= 0:
        return FACTORS[hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if gap(mid) < 0 else (lo, mid)
    below, above = gap(lo), gap(hi)
    return FACTORS[lo] + (FACTORS[hi] - FACTORS[lo]) * (-below / (above - below))


def _mean_at(values: Sequence[float], pick: Sequence[int]) -> float:
    return math.fsum(values[i] for i in pick) / len(pick)


@dataclasses.dataclass(frozen=True)
class LoadRun:
    """One run of the load check: its requests sent at ``rate`` req/s, and the factor fitted
    on them."""

    rate: float
    fit: LoadFactor
    run: BenchRun

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "fit": self.fit.to_dict(),
            "run": self.run.to_dict(),
            "records": [r.to_dict() for r in self.run.records],
        }

    @classmethod
    def from_dict(cls, fields: Fields) -> LoadRun:
        """Raises: ValueError naming the field, for one missing or of the wrong type."""
        fit = fields.child("fit")
        if fit is None:
            raise ValueError(f"{fields.where}: missing 'fit'")
        where = fields.where
        run = BenchRun.from_dict(
            fields.raw("run"), fields.items("records"), f"{where}.run", f"{where}.records"
        )
        return cls(fields.number("rate"), LoadFactor.from_dict(fit), run)


@dataclasses.dataclass(frozen=True)
class LoadCheck:
    """What the load check found: the knee predicted from the calibration alone
    (``predicted_before``, req/s), each run (at that knee, then at the knee the runs settled
    on while that moved by more than the probes' tolerance), and the ``factor`` the knee is
    predicted with (the runs' at the knee they settle on; 1 where refused)."""

    predicted_before: float
    runs: tuple[LoadRun, ...]
    factor: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor > 0):
            raise ValueError(f"factor must be a positive number, got {self.factor!r}")

    def sentence(self) -> str:
        parts = [f"at {r.rate:.3g} req/s{_steal(r.run)}: {r.fit.sentence()}" for r in self.runs]
        head = "; then ".join(parts) or "not run"
        return f"{head}; the knee predicted with x{self.factor:.2f}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "predicted_before": self.predicted_before,
            "factor": self.factor,
            "runs": [r.to_dict() for r in self.runs],
            "sentence": self.sentence(),
        }

    @classmethod
    def from_dict(cls, fields: Fields) -> LoadCheck:
        """Raises: ValueError naming the field, for one missing or of the wrong type."""
        runs = tuple(LoadRun.from_dict(r) for r in fields.children("runs") if r is not None)
        before = fields.number("predicted_before")
        return fields.build(cls, before, runs, fields.number("factor", 1.0))


def _steal(run: BenchRun | None) -> str:
    host = run.host if run is not None else None
    return f" (host steal {host.text()})" if host is not None else ""


def run_speeds(runs: Sequence[BenchRun], server_model: ServerModel) -> tuple[LoadFactor, ...]:
    """Each run's own factor on ``server_model``'s cost (:func:`fit_load_factor` on its records alone, 200
    resamples): how fast the server ran in each probe against the calibration. Their spread is
    what one factor cannot fit: the server's speed moving between runs, or a cost that grows
    with the load otherwise than the model's."""
    return tuple(fit_load_factor([run.records], server_model, resamples=200) for run in runs)


def speed_range(speeds: Sequence[LoadFactor]) -> tuple[float, float] | None:
    """The lowest and highest fitted factor of ``speeds`` (None: no run had one)."""
    found = [s.estimate for s in speeds if math.isfinite(s.estimate)]
    return (min(found), max(found)) if found else None


def factor_at(runs: Sequence[LoadRun], rate: float) -> float:
    """The load factor at ``rate`` req/s: each run's (1 where refused), linear in log rate
    between the runs either side, the nearest run's beyond them."""
    points = sorted((r.rate, r.fit.factor) for r in runs if not math.isnan(r.fit.estimate))
    if not points:
        return 1.0
    if rate <= points[0][0]:
        return points[0][1]
    for (r0, k0), (r1, k1) in zip(points, points[1:]):
        if rate <= r1:
            return k0 + (k1 - k0) * math.log(rate / r0) / math.log(r1 / r0)
    return points[-1][1]


async def run_load_check(
    target: Target,
    requests: Sequence[Request],
    rate: float,
    server_model: ServerModel,
    tag: str,
    quiet: QuietHost | None = None,
    progress: Callable[[str], object] | None = None,
) -> LoadRun:
    """``requests`` sent at ``rate`` req/s (their arrivals scaled, salted afresh: a cold prefix
    cache), and the factor fitted on them (:func:`fit_load_factor`); ``quiet``: run on a
    quiet host (``measure.quiet``).

    Raises:
        ValueError: for a rate that is not a positive number, or requests with no rate.
    """
    from pytest_prefill.plan.workloads import arrival_rate

    base = arrival_rate(requests)
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a positive number, got {rate!r}")
    if not math.isfinite(base) or base <= 0:
        raise ValueError("the load check's requests arrive at once: no rate to scale")

    async def once(attempt: int) -> BenchRun:
        named = f"{tag}r{attempt}" if attempt else tag  # each redo salted afresh too
        return await run_counted(
            dataclasses.replace(target, salt=f"{target.salt}-{named}"),
            [dataclasses.replace(r, id=f"{named}{r.id}") for r in requests],
            schedule=Schedule("trace", rate_scale=rate / base),
            bounds=Bounds(warmup=0),
        )

    run, host = await quietly(quiet, once, f"load check at {rate:.3g} req/s", progress)
    run = dataclasses.replace(run, host=host)
    return LoadRun(rate, fit_load_factor([run.records], server_model), run)
