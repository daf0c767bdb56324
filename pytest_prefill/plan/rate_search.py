"""One deployment's search for the highest arrival rate that keeps SLO attainment >= a target:
a probe (one simulation at a rate), the bracketing and geometric bisection that choose the next
rate, and what the search found. :mod:`pytest_prefill.plan.capacity` runs many at once.
Standard library only."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any

from pytest_prefill.plan.deployments import Deployment
from pytest_prefill.plan.executors import ExecutorLost
from pytest_prefill.plan.metrics import SLO, ServingMetrics, serving_metrics
from pytest_prefill.plan.verdict import Verdict, refusals, run_verdict, served
from pytest_prefill.plan.workloads import scale_rate
from pytest_prefill.sim import CostModel, EngineProfile, Request, Unfit, simulate

PERCENTILE = 90.0  # the latency percentile a search computes always (a target's is added)
MAX_SCALE = 4096.0  # the search gives up above this multiple of the workload's own rate
MIN_SCALE = 1 / 4096
CLOSE = 0.05  # deployments within this of the best (or the tolerance, if wider) are named


def close_margin(tolerance: float) -> float:
    """How close to the best rate a deployment is named beside it: the search's tolerance,
    at least 5% (rates are known no better than that)."""
    return max(tolerance, CLOSE)


def target_percentile(target: float) -> float:
    """The latency percentile a target attainment names: 0.99 of requests within the SLO is
    the p99 (rounded, so 0.57 is p57, not p56.99999999999999)."""
    return round(100.0 * target, 6)


@dataclasses.dataclass(frozen=True, slots=True)
class Probe:
    """One simulation of a search: a deployment with the workload's arrival rate × ``scale``
    (``rate`` requests/s offered), its verdict against the target (None: judged from the
    metrics) and its serving metrics under the SLO (None when the run stopped early, once its
    verdict was fixed: :mod:`~pytest_prefill.plan.verdict`)."""

    scale: float
    rate: float
    metrics: ServingMetrics | None
    verdict: Verdict | None = None
    seconds: float = 0.0  # the simulation's wall time, where it ran

    @property
    def stopped(self) -> str | None:
        """``"failed"`` or ``"passed"`` when the run stopped early; None when it ran to the end."""
        return self.verdict.stopped if self.verdict is not None else None

    @property
    def attainment(self) -> float:
        """The fraction of requests meeting the SLO; for a run stopped early, the fraction
        not known to miss by then (an upper bound)."""
        if self.metrics is not None:
            return self.metrics.attainment
        assert self.verdict is not None
        return (self.verdict.requests - self.verdict.misses) / self.verdict.requests

    @property
    def completed(self) -> int:
        """Requests the attainment is over."""
        if self.metrics is not None:
            return self.metrics.completed
        return self.verdict.requests if self.verdict is not None else 0

    def passed(self, target: float) -> bool:
        """Whether the run met ``target`` (its verdict, else its attainment against it)."""
        if self.verdict is not None:
            return self.verdict.passed
        return self.attainment >= target

    def to_dict(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "rate": self.rate,
            "metrics": self.metrics.to_dict() if self.metrics is not None else None,
            "verdict": self.verdict.to_dict() if self.verdict is not None else None,
        }  # not its seconds: a search's document is the same wherever it ran


@dataclasses.dataclass(frozen=True)
class Probing:
    """What every probe of a load simulates, whatever the deployment and the rate: the
    ``load`` at its own arrival rate (``base_rate`` requests/s), the device's ``cost``, the
    ``slo`` and the ``engine`` profile."""

    load: Sequence[Request]
    cost: CostModel
    slo: SLO
    engine: EngineProfile
    base_rate: float


def probe(
    probing: Probing,
    deployment: Deployment,
    scale: float,
    percentile: float = PERCENTILE,
    target: float | None = None,
    stop: bool = False,
) -> Probe:
    """Simulate ``deployment`` on ``probing``'s load at ``scale`` times its arrival rate and
    measure it against the SLO, with the latency ``percentile`` the search reports (its
    target's) beside p50, p90 and p99; with a ``target``, judge it too (with ``stop``,
    stopping once the verdict is fixed, where the simulator can: the probe then has no
    metrics). Module-level, so executors can ship it."""
    began = time.perf_counter()
    slo, base_rate = probing.slo, probing.base_rate
    options = deployment.simulate_options(probing.engine)
    device = deployment.cost_on(probing.cost)  # its own at its TP on its hardware, if any
    scaled = scale_rate(probing.load, scale)
    verdict: Verdict | None = None
    if target is None:
        unfit = refusals(deployment.policy, scaled, device, options)
        trace = simulate(deployment.policy, served(scaled, unfit), device, **options)
        refused = len(unfit)
    else:
        run, verdict = run_verdict(deployment.policy, scaled, device, options, slo, target, stop)
        if verdict.stopped is not None or run is None:
            return Probe(scale, base_rate * scale, None, verdict, time.perf_counter() - began)
        trace, refused = run, verdict.refused
    percentiles = tuple(sorted({50.0, PERCENTILE, 99.0, percentile}))
    measured = serving_metrics(trace, slo=slo, percentiles=percentiles)
    metrics = dataclasses.replace(measured, refused=refused)
    return Probe(scale, base_rate * scale, metrics, verdict, time.perf_counter() - began)


@dataclasses.dataclass(frozen=True, slots=True)
class DeploymentResult:
    """What the search found for one deployment: every probe in the order it ran; ``best``,
    the highest-rate probe meeting the target; ``miss``, the lowest-rate probe missing it above
    ``best`` (within the search's tolerance of it). ``status`` is ``found``, ``never met`` (not
    even at the lowest rate tried), ``never missed`` (not even at the highest), ``misses
    alone`` (not searched: more requests miss alone than may miss) or ``pruned`` (not bisected
    to the end: it cannot come within the recommendation's margin of the best found; its rate
    is below ``miss``'s)."""

    deployment: Deployment
    target: float
    probes: tuple[Probe, ...]
    best: Probe | None
    miss: Probe | None
    alone: int = 0  # requests that miss the SLO even alone on this deployment
    allowed: int | None = None  # the most that may miss for the target (None: not counted)
    pruned: bool = False
    refused: tuple[Unfit, ...] = ()  # requests whose KV never fits a pool's worker: missed

    @property
    def misses_alone(self) -> bool:
        """More requests miss the SLO alone on this deployment than may miss: it was not
        searched (no rate meets the SLO)."""
        return self.allowed is not None and self.alone > self.allowed and not self.probes

    @property
    def status(self) -> str:
        if self.misses_alone:
            return "misses alone"
        if self.pruned:
            return "pruned"
        if self.best is None:
            return "never met"
        return "found" if self.miss is not None else "never missed"

    @property
    def max_rate(self) -> float:
        """Requests/s offered at ``best`` (0 when the SLO was never met)."""
        return self.best.rate if self.best is not None else 0.0

    @property
    def goodput_per_device(self) -> float:
        """DistServe's per-device goodput: the highest rate served within the SLO attainment
        target, divided by the deployment's devices (0 when never met). vLLM's goodput at that
        rate (``best.metrics.goodput``) is lower: its duration includes draining the queue."""
        return self.max_rate / self.deployment.devices

    @property
    def binding(self) -> str:
        """The SLO bound(s) that fail first: at ``miss``, those met by the fewest requests
        (``+``-joined on a tie; for a run stopped once it failed, those missed by the most of
        the requests finished by then); ``-`` when nothing was missed."""
        miss = self.miss
        if miss is None or self.pruned:
            return "-"
        if miss.metrics is not None:
            fractions = [(name, -f) for name, f in miss.metrics.bound_attainment()]
        elif miss.verdict is not None and miss.verdict.bound_misses:
            fractions = [(name, float(n)) for name, n in miss.verdict.bound_misses]
        else:
            return "-"
        most = max(f for _, f in fractions)
        return "+".join(name for name, f in fractions if f == most)

    def rises(self) -> tuple[tuple[Probe, Probe], ...]:
        """Neighbouring probes (by rate) where attainment rises with the rate by more than its
        sampling error (:func:`rises_beyond_noise`): where the bisection's assumption,
        attainment falls as rate grows, does not hold. (A rise from 11.6% to 11.9% of a few
        hundred requests is one request's luck, not a shape.)"""
        ordered = sorted((p for p in self.probes if p.metrics is not None), key=lambda p: p.scale)
        return tuple((a, b) for a, b in zip(ordered, ordered[1:]) if rises_beyond_noise(a, b))

    @property
    def monotone(self) -> bool:
        return not self.rises()

    @property
    def crossing(self) -> bool:
        """A probe meets the target at a higher rate than one that misses it: the answer is the
        highest rate below the first miss, not necessarily the highest rate that passes."""
        passes = [p for p in self.probes if p.passed(self.target)]
        misses = [p for p in self.probes if not p.passed(self.target)]
        return any(
            hit.scale > miss.scale and rises_beyond_noise(miss, hit)
            for hit in passes
            for miss in misses
        )

    def to_dict(self) -> dict[str, Any]:
        best = self.best
        return {
            "deployment": self.deployment.to_dict(),
            "status": self.status,
            "alone_misses": self.alone,
            "refused": [u._asdict() for u in self.refused],
            "pruned": self.pruned,
            "max_rate": self.max_rate,
            "scale": best.scale if best else None,
            "goodput_per_device": self.goodput_per_device,
            "attainment": best.attainment if best else None,
            "binding": self.binding,
            "monotone": self.monotone,
            "crossing": self.crossing,
            "best": best.to_dict() if best else None,
            "miss": self.miss.to_dict() if self.miss else None,
            "probes": [p.to_dict() for p in self.probes],
        }


def rises_beyond_noise(low: Probe, high: Probe) -> bool:
    """Whether attainment at ``high`` exceeds that at ``low`` by more than twice the standard
    error of the difference of two attainments (binomial: p(1-p)/n each, n the requests run;
    at least one request's worth)."""
    a, b = low.attainment, high.attainment
    n_a, n_b = max(low.completed, 1), max(high.completed, 1)
    error = math.sqrt(a * (1 - a) / n_a + b * (1 - b) / n_b)
    return b - a > max(2 * error, 1 / min(n_a, n_b))


def _stopped_helping(misses: Sequence[Probe]) -> bool:
    """Whether two more halvings of the rate (probes in falling order) changed nothing: no
    attainment gained and no bounded latency's mean down by 1% or more. Requests then barely
    interact, so no lower rate meets the SLO. (Under overload attainment can sit at 0 while
    halving, but the latencies fall.)"""
    if len(misses) < 3 or any(p.metrics is None for p in misses[-3:]):
        return False
    first, last = misses[-3], misses[-1]
    if not last.attainment <= misses[-2].attainment <= first.attainment:
        return False
    assert first.metrics is not None and last.metrics is not None
    slo = last.metrics.slo
    names = [name for name, _ in slo.bounds] if slo is not None else []
    means = [(getattr(first.metrics, n).mean, getattr(last.metrics, n).mean) for n in names]
    return bool(means) and all(after >= 0.99 * before for before, after in means)


def lattice_step(tolerance: float) -> float:
    """The search's finest step, in doublings of the rate: the largest ``2**-j`` (j >= 0) with
    ``2**(2**-j) <= 1 + tolerance`` (1/16 for 5%). Every rate probed is ``start`` times a whole
    number of steps, so the answer does not depend on the path that found it (below)."""
    step = 1.0
    while 2.0**step > 1 + tolerance:
        step /= 2
    return step


class RateSearch:
    """One deployment's search, one probe at a time, over a lattice of rates: ``start`` ×
    2**(k × :func:`lattice_step`) for whole k. From ``seed`` (a lattice index: where another
    deployment ended, or an estimate) or ``start``: grow while it passes (from a seed by 1, 2,
    4 … steps; else ×4 while no request missed, ×2 otherwise) until a miss, or fall until a pass
    (from a seed by 1, 2, 4 … steps, no lower than ``start``; from ``start`` ÷2, giving up
    when two halvings raise attainment not at all); then bisect
    until the highest pass and the lowest miss are neighbours on the lattice (within
    ``tolerance`` of each other); then, with ``verify``, probe twice the miss once, to catch
    attainment that rises again.

    When attainment falls as rate grows, the answer is the one lattice rate that passes with
    its neighbour above failing, whatever the path: a seed, a bracket or a pruned neighbour
    changes how many simulations find it, never which rate it is. (Old searches took
    geometric midpoints of ×2 and ×4 brackets from ``start``: the same lattice.)"""

    def __init__(
        self,
        deployment: Deployment,
        target: float,
        tolerance: float,
        start: float,
        verify: bool,
        seed: int | None = None,
    ) -> None:
        self.deployment, self.target, self.start, self.verify = deployment, target, start, verify
        self.step = lattice_step(tolerance)
        self.seed = seed
        self.probes: list[Probe] = []
        self.low: int | None = None  # the lattice index of the highest pass
        self.high: int | None = None  # and of the lowest miss
        self.at: dict[int, Probe] = {}
        self.gap = 1  # a seeded search's next stride, in steps
        self.pruned = False
        self.floor: float | None = None  # pruned once the most it may serve is below this
        self._verifying = False
        self.top = self._bound(MAX_SCALE, math.floor)
        self.bottom = self._bound(MIN_SCALE, math.ceil)

    def _bound(self, scale: float, rounding: Any) -> int:
        """The lattice index nearest ``scale`` on its side (``rounding``: floor or ceil)."""
        k = int(rounding(math.log2(scale / self.start) / self.step))
        while self.scale(k) > MAX_SCALE:
            k -= 1
        while self.scale(k) < MIN_SCALE:
            k += 1
        return k

    def scale(self, k: int) -> float:
        """The rate multiple at lattice index ``k``."""
        return self.start * 2.0 ** (k * self.step)

    def index(self, scale: float) -> int:
        """The lattice index of a probed ``scale``."""
        return round(math.log2(scale / self.start) / self.step)

    def next_scale(self) -> float | None:
        k = self._next_index()
        return self.scale(k) if k is not None else None

    def _next_index(self) -> int | None:
        low, high = self.low, self.high
        if self.pruned:
            return None
        if not self.probes:
            return self.seed if self.seed is not None else 0
        if high is None:
            assert low is not None
            k = low + self._stride(up=True)
            return min(k, self.top) if low < self.top else None
        if low is None and high > 0 and self.seed is not None:
            return max(high - self._stride(up=False), 0)  # falling from a seed to the start
        if low is None:  # at or below the start with no pass: halve, as from the start
            below = [p for p in self.probes if self.index(p.scale) <= 0]
            if _stopped_helping(below):
                return None  # the SLO is out of reach, however light the load
            k = high - round(1 / self.step)
            return max(k, self.bottom) if high > self.bottom else None
        if high - low > 1:
            return (low + high) // 2
        if self.verify and not self._verifying:
            self._verifying = True
            return high + round(1 / self.step)  # twice the lowest miss
        return None

    def _stride(self, up: bool) -> int:
        """How far the next probe goes while only passes (``up``) or only misses are known."""
        if self.seed is not None:
            stride, self.gap = self.gap, self.gap * 2
            return stride
        doublings = 2 if up and self._clean(self.at[self.low]) else 1  # type: ignore[index]
        return round(doublings / self.step)

    @staticmethod
    def _clean(probe: Probe) -> bool:
        """No request missed (so far, for a run stopped early)."""
        if probe.verdict is not None:
            return probe.verdict.misses == 0
        return probe.attainment == 1.0

    def wants_full_run(self) -> bool:
        """Whether the next probe must run to the end: while halving from ``start`` with no
        pass, whose give-up rule reads the latencies of full runs."""
        return self.low is None and self.high is not None and self.high <= 0

    def observe(self, result: Probe) -> None:
        self.probes.append(result)
        if self._verifying:
            return  # a check above the bracket: recorded, never moves it
        k = self.index(result.scale)
        self.at[k] = result
        if result.passed(self.target):
            if self.low is None or k > self.low:
                self.low = k
        elif self.high is None or k < self.high:
            self.high = k

    def replace_best(self, full: Probe) -> None:
        """The full run at the highest pass, in place of a run stopped early there."""
        assert self.low is not None
        self.probes.append(full)
        self.at[self.low] = full

    def upper(self) -> float | None:
        """The highest scale this deployment may still meet the target at: the lattice rate
        below its lowest miss (None: no miss yet)."""
        return self.scale(self.high - 1) if self.high is not None else None

    def result(self) -> DeploymentResult:
        best = self.at[self.low] if self.low is not None else None
        miss = self.at[self.high] if self.high is not None else None
        return DeploymentResult(
            self.deployment, self.target, tuple(self.probes), best, miss, pruned=self.pruned
        )


def probe_result(future: concurrent.futures.Future[Probe]) -> Probe:
    """The probe, or :class:`ExecutorLost` when the pool that ran it broke (a worker died)."""
    try:
        return future.result()
    except concurrent.futures.BrokenExecutor as err:
        raise ExecutorLost(
            f"the process pool running the search broke: a worker died ({err or type(err).__name__})"
        ) from None
