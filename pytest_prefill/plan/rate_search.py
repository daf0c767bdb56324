"""One deployment's search for the highest arrival rate that keeps SLO attainment >= a target:
a probe (one simulation at a rate), the bracketing and geometric bisection that choose the next
rate, and what the search found. :mod:`pytest_prefill.plan.capacity` runs many at once.
Standard library only."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from pytest_prefill.plan.deployments import Deployment
from pytest_prefill.plan.executors import ExecutorLost
from pytest_prefill.plan.metrics import SLO, ServingMetrics, serving_metrics
from pytest_prefill.plan.workloads import scale_rate
from pytest_prefill.sim import LAB, CostModel, EngineProfile, Request, simulate

PERCENTILE = 90.0  # the latency percentile a search computes always (a target's is added)
MAX_SCALE = 4096.0  # the search gives up above this multiple of the workload's own rate
MIN_SCALE = 1 / 4096


def target_percentile(target: float) -> float:
    """The latency percentile a target attainment names: 0.99 of requests within the SLO is
    the p99 (rounded, so 0.57 is p57, not p56.99999999999999)."""
    return round(100.0 * target, 6)


@dataclasses.dataclass(frozen=True, slots=True)
class Probe:
    """One simulation of a search: a deployment with the workload's arrival rate × ``scale``
    (``rate`` requests/s offered), and its serving metrics under the SLO."""

    scale: float
    rate: float
    metrics: ServingMetrics

    @property
    def attainment(self) -> float:
        return self.metrics.attainment

    def to_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "rate": self.rate, "metrics": self.metrics.to_dict()}


def probe(
    load: Sequence[Request],
    cost: CostModel,
    slo: SLO,
    deployment: Deployment,
    scale: float,
    base_rate: float,
    engine: EngineProfile = LAB,
    percentile: float = PERCENTILE,
) -> Probe:
    """Simulate ``deployment`` under ``engine`` on ``load`` at ``scale`` times its arrival rate
    (``base_rate`` requests/s at scale 1) and measure it against ``slo``, with the latency
    ``percentile`` the search reports (its target's) beside p50, p90 and p99. Module-level, so
    executors can ship it."""
    options = deployment.simulate_options(engine)
    device = deployment.cost_on(cost)  # its own at its TP on its hardware, when it has one
    trace = simulate(deployment.policy, scale_rate(load, scale), device, **options)
    percentiles = tuple(sorted({50.0, PERCENTILE, 99.0, percentile}))
    metrics = serving_metrics(trace, slo=slo, percentiles=percentiles)
    return Probe(scale, base_rate * scale, metrics)


@dataclasses.dataclass(frozen=True, slots=True)
class DeploymentResult:
    """What the search found for one deployment: every probe in the order it ran; ``best``,
    the highest-rate probe meeting the target; ``miss``, the lowest-rate probe missing it above
    ``best`` (within the search's tolerance of it). ``status`` is ``found``, ``never met`` (not
    even at the lowest rate tried) or ``never missed`` (not even at the highest)."""

    deployment: Deployment
    target: float
    probes: tuple[Probe, ...]
    best: Probe | None
    miss: Probe | None
    alone: int = 0  # requests that miss the SLO even alone on this deployment
    allowed: int | None = None  # the most that may miss for the target (None: not counted)

    @property
    def misses_alone(self) -> bool:
        """More requests miss the SLO alone on this deployment than may miss: it was not
        searched (no rate meets the SLO)."""
        return self.allowed is not None and self.alone > self.allowed

    @property
    def status(self) -> str:
        if self.misses_alone:
            return "misses alone"
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
        (``+``-joined on a tie); ``-`` when nothing was missed."""
        if self.miss is None:
            return "-"
        fractions = self.miss.metrics.bound_attainment()
        lowest = min(f for _, f in fractions)
        return "+".join(name for name, f in fractions if f == lowest)

    def rises(self) -> tuple[tuple[Probe, Probe], ...]:
        """Neighbouring probes (by rate) where attainment rises with the rate by more than its
        sampling error (:func:`rises_beyond_noise`): where the bisection's assumption,
        attainment falls as rate grows, does not hold. (A rise from 11.6% to 11.9% of a few
        hundred requests is one request's luck, not a shape.)"""
        ordered = sorted(self.probes, key=lambda p: p.scale)
        return tuple((a, b) for a, b in zip(ordered, ordered[1:]) if rises_beyond_noise(a, b))

    @property
    def monotone(self) -> bool:
        return not self.rises()

    @property
    def crossing(self) -> bool:
        """A probe meets the target at a higher rate than one that misses it: the answer is the
        highest rate below the first miss, not necessarily the highest rate that passes."""
        passes = [p for p in self.probes if p.attainment >= self.target]
        misses = [p for p in self.probes if p.attainment < self.target]
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
    n_a, n_b = max(low.metrics.completed, 1), max(high.metrics.completed, 1)
    error = math.sqrt(a * (1 - a) / n_a + b * (1 - b) / n_b)
    return b - a > max(2 * error, 1 / min(n_a, n_b))


def _stopped_helping(misses: Sequence[Probe]) -> bool:
    """Whether two more halvings of the rate (probes in falling order) changed nothing: no
    attainment gained and no bounded latency's mean down by 1% or more. Requests then barely
    interact, so no lower rate meets the SLO. (Under overload attainment can sit at 0 while
    halving, but the latencies fall.)"""
    if len(misses) < 3:
        return False
    first, last = misses[-3], misses[-1]
    if not last.attainment <= misses[-2].attainment <= first.attainment:
        return False
    slo = last.metrics.slo
    names = [name for name, _ in slo.bounds] if slo is not None else []
    means = [(getattr(first.metrics, n).mean, getattr(last.metrics, n).mean) for n in names]
    return bool(means) and all(after >= 0.99 * before for before, after in means)


class RateSearch:
    """One deployment's search, one probe at a time: from ``start``, grow the rate (×4 while
    every request meets the SLO, else ×2) until a miss, or halve it until a pass (giving up when
    two halvings raise attainment not at all); then bisect
    (geometric midpoints) until the highest pass and the lowest miss are within ``tolerance``;
    then, with ``verify``, probe twice the miss once, to catch attainment that rises again."""

    def __init__(
        self, deployment: Deployment, target: float, tolerance: float, start: float, verify: bool
    ) -> None:
        self.deployment, self.target, self.tolerance, self.start = (
            deployment,
            target,
            tolerance,
            start,
        )
        self.probes: list[Probe] = []
        self.low: Probe | None = None  # the highest pass
        self.high: Probe | None = None  # the lowest miss
        self.verify = verify
        self._verifying = False

    def next_scale(self) -> float | None:
        low, high = self.low, self.high
        if not self.probes:
            return self.start
        if high is None:
            assert low is not None
            scale = low.scale * (4.0 if low.attainment == 1.0 else 2.0)
            return scale if scale <= MAX_SCALE else None
        if low is None:
            if _stopped_helping(self.probes):
                return None  # the SLO is out of reach, however light the load
            scale = high.scale / 2
            return scale if scale >= MIN_SCALE else None
        middle = math.sqrt(low.scale * high.scale)
        if high.scale > low.scale * (1 + self.tolerance) and low.scale < middle < high.scale:
            return middle
        if self.verify and not self._verifying:
            self._verifying = True
            return high.scale * 2
        return None

    def observe(self, result: Probe) -> None:
        self.probes.append(result)
        if self._verifying:
            return  # a check above the bracket: recorded, never moves it
        if result.attainment >= self.target:
            if self.low is None or result.scale > self.low.scale:
                self.low = result
        elif self.high is None or result.scale < self.high.scale:
            self.high = result

    def result(self) -> DeploymentResult:
        return DeploymentResult(
            self.deployment, self.target, tuple(self.probes), self.low, self.high
        )


def probe_result(future: concurrent.futures.Future[Probe]) -> Probe:
    """The probe, or :class:`ExecutorLost` when the pool that ran it broke (a worker died)."""
    try:
        return future.result()
    except concurrent.futures.BrokenExecutor as err:
        raise ExecutorLost(
            f"the process pool running the search broke: a worker died ({err or type(err).__name__})"
        ) from None
