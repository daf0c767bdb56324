"""Capacity planning: for a workload, an SLO and N devices, the highest arrival rate at which
each deployment (shared, chunked, disaggregated at every prefill:decode split) keeps SLO
attainment >= a target, found by bracketing and bisection over simulations, and goodput per
device there. Every simulation is independent, so a search runs on any
``concurrent.futures.Executor``: a local process pool by default, or a Dask cluster
(:mod:`pytest_prefill.plan.executors`). Standard library only; nothing here prints.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from pytest_prefill._io import json_safe
from pytest_prefill.plan.deployments import Deployment, default_deployments
from pytest_prefill.plan.executors import ExecutorLost, local_executor
from pytest_prefill.plan.metrics import SLO, ServingMetrics, serving_metrics
from pytest_prefill.plan.workloads import Workload, arrival_rate, scale_rate
from pytest_prefill.sim import CostModel, Request, check_int, simulate

DEFAULT_TARGET = 0.9  # DistServe's attainment target
DEFAULT_TOLERANCE = 0.05  # the search stops when the highest pass and lowest miss are this close
# Below this the bisection would need rates closer than any simulation tells apart (and below
# about 1e-16, 1 + tolerance is 1.0: the bracket could never close).
MIN_TOLERANCE = 1e-4
PROGRESS_EVERY = 10.0  # seconds between progress lines while no deployment finishes
PERCENTILE = 90.0  # the latency percentile a search reports at its answer
MAX_SCALE = 4096.0  # the search gives up above this multiple of the workload's own rate
MIN_SCALE = 1 / 4096
Progress = Callable[[str], None]


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
        return {"scale": self.scale, "rate": self.rate, "metrics": self.metrics.as_dict()}


def probe(
    load: Sequence[Request],
    cost: CostModel,
    slo: SLO,
    deployment: Deployment,
    scale: float,
    base_rate: float,
) -> Probe:
    """Simulate ``deployment`` on ``load`` at ``scale`` times its arrival rate (``base_rate``
    requests/s at scale 1) and measure it against ``slo``. Module-level, so executors can ship it."""
    trace = simulate(
        deployment.policy, scale_rate(load, scale), cost, **deployment.simulate_options()
    )
    metrics = serving_metrics(trace, slo=slo, percentiles=(50.0, PERCENTILE, 99.0))
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

    @property
    def status(self) -> str:
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


class _Search:
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


@dataclasses.dataclass(frozen=True)
class CapacityResult:
    """A whole search: what was searched and one :class:`DeploymentResult` per deployment, in
    the order the deployments were given. Simulated from a cost model, not measured."""

    workload: str
    attribution: str | None
    requests: int
    base_rate: float
    cost: CostModel
    slo: SLO
    devices: int
    target: float
    tolerance: float
    results: tuple[DeploymentResult, ...]

    @property
    def simulations(self) -> int:
        return sum(len(r.probes) for r in self.results)

    @property
    def headroom(self) -> float:
        """How many times the workload's own arrival rate the best deployment serves within
        the SLO (0 when none meets it; a lower bound when the best never missed)."""
        return self.ranked()[0].max_rate / self.base_rate

    def ranked(self) -> list[DeploymentResult]:
        """Deployments by the highest rate they serve within the SLO, best first (ties keep
        the given order). Every deployment has the same devices, so this is DistServe's
        per-device goodput order."""
        return sorted(self.results, key=lambda r: -r.max_rate)

    def recommendation(self) -> str:
        """One line a user can act on: the deployment serving the highest request rate per
        device within the SLO, against shared, and which others are within the search's
        tolerance of it."""
        ranked = self.ranked()
        best = ranked[0]
        if best.best is None:
            return (
                f"No deployment meets {self.slo} for {self.target:.0%} of requests, even at "
                f"{min(p.rate for r in self.results for p in r.probes):.3g} req/s: the SLO is "
                "out of reach on this cost model."
            )
        margin = max(self.tolerance, 0.05)
        at_least = "at least " if best.status == "never missed" else ""
        basis = f">= {self.target:.0%} of requests within {self.slo}"
        per_device = f"{best.goodput_per_device:.3g}"
        line = f"{best.deployment.label} serves the most: {at_least}{per_device} req/s per device"
        line += f" ({basis})"
        shared = next((r for r in self.results if r.deployment.policy == "shared"), None)
        if shared is not None and shared is not best:
            if shared.max_rate == 0:
                line += f"; {shared.deployment.label} never meets the SLO"
            elif shared.max_rate < best.max_rate * (1 - margin):
                line = (
                    f"{best.deployment.label} serves {at_least}"
                    f"{best.max_rate / shared.max_rate:.2g}× the requests per device of "
                    f"{shared.deployment.label} ({per_device} vs "
                    f"{shared.goodput_per_device:.3g} req/s per device, {basis})"
                )
        close = [
            r.deployment.label
            for r in ranked[1:]
            if r.max_rate > 0 and r.max_rate >= best.max_rate * (1 - margin)
        ]
        if close:
            line += f"; {', '.join(close)} {'is' if len(close) == 1 else 'are'} within {margin:.0%}"
        return line + "."

    def notes(self) -> list[str]:
        """Caveats a reader must see: attainment that is not monotone in rate, searches that
        never met or never missed the SLO."""
        notes = []
        for r in self.results:
            label = r.deployment.label
            if r.crossing:
                notes.append(
                    f"{label}: attainment is NOT monotone in rate: it meets the target again above "
                    "a rate that misses it; the reported rate is the highest pass below the first "
                    "miss the search found (see the probes or --plot)."
                )
            elif not r.monotone:
                (a, b), *_ = r.rises()
                notes.append(
                    f"{label}: attainment is not monotone in rate (it rises from {a.attainment:.1%} "
                    f"at {a.rate:.3g} req/s to {b.attainment:.1%} at {b.rate:.3g} req/s); the "
                    "bisection assumes it falls, so read the probes or --plot."
                )
            if r.status == "never missed":
                notes.append(
                    f"{label}: met the SLO up to {r.max_rate:.3g} req/s, the highest rate tried."
                )
            elif r.status == "never met":
                lowest = min(r.probes, key=lambda p: p.rate)
                notes.append(
                    f"{label}: missed the SLO even at {lowest.rate:.3g} req/s "
                    f"({lowest.attainment:.1%} attainment; lower rates stopped raising it)."
                )
        return notes

    def to_dict(self) -> dict[str, Any]:
        """The whole search, JSON-safe (NaN and infinities become null)."""
        data = {
            "workload": self.workload,
            "attribution": self.attribution,
            "requests": self.requests,
            "base_rate": self.base_rate,
            "cost_model": self.cost.to_dict(),
            "slo": self.slo.to_dict(),
            "devices": self.devices,
            "target": self.target,
            "tolerance": self.tolerance,
            "simulations": self.simulations,
            "recommendation": self.recommendation(),
            "notes": self.notes(),
            "results": [r.to_dict() for r in self.results],
        }
        return json_safe(data, "capacity")


def workload_requests(
    workload: Workload | Sequence[Request],
) -> tuple[tuple[Request, ...], str, str | None]:
    """The requests, the description and the attribution of ``workload``.

    Raises:
        ValueError: for no request, something that is not a Request, or arrivals all at once
            (no arrival rate to scale).
    """
    if isinstance(workload, Workload):
        load, name, attribution = workload.requests, workload.description, workload.attribution
    else:
        load, name, attribution = tuple(workload), f"{len(workload)} requests", None
    if not load:
        raise ValueError("workload has no request: a search needs at least two arrivals")
    if not all(isinstance(r, Request) for r in load):
        raise ValueError("workload must be a Workload or a sequence of Request")
    arrivals = [r.arrival for r in load]
    if max(arrivals) == min(arrivals):
        raise ValueError("workload's requests all arrive at once: it has no arrival rate to scale")
    return load, name, attribution


def _check_search(
    cost: Any,
    slo: Any,
    devices: Any,
    target: Any,
    tolerance: Any,
    deployments: Sequence[Deployment] | None,
) -> None:
    if not isinstance(cost, CostModel):
        raise ValueError(f"cost must be a CostModel, got {type(cost).__name__}")
    if not isinstance(slo, SLO):
        raise ValueError(f"slo must be an SLO (SLO.parse('ttft:1s,tpot:100ms')), got {slo!r}")
    check_int("devices", devices)
    number = isinstance(target, (int, float)) and not isinstance(target, bool)
    if not (number and 0 < target <= 1):
        raise ValueError(f"target attainment must be in (0, 1], got {target!r}")
    number = isinstance(tolerance, (int, float)) and not isinstance(tolerance, bool)
    if not (number and MIN_TOLERANCE <= tolerance <= 1):
        raise ValueError(
            f"tolerance must be in [{MIN_TOLERANCE:g}, 1] (relative), got {tolerance!r}"
        )
    if deployments is None:
        return
    if not deployments:
        raise ValueError("deployments must name at least one deployment")
    for d in deployments:
        if not isinstance(d, Deployment):
            raise ValueError(f"deployments must be Deployment values, got {d!r}")
        if d.devices != devices:
            raise ValueError(
                f"deployment {d.label} uses {d.devices} devices; this search compares {devices}"
            )
    labels = [d.label for d in deployments]
    if len(set(labels)) != len(labels):
        raise ValueError(f"deployments are repeated: {labels}")


def capacity(
    workload: Workload | Sequence[Request],
    cost: CostModel,
    slo: SLO,
    devices: int,
    *,
    target: float = DEFAULT_TARGET,
    deployments: Sequence[Deployment] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    executor: concurrent.futures.Executor | None = None,
    progress: Progress | None = None,
    start: float = 1.0,
    verify: bool = True,
) -> CapacityResult:
    """For each deployment of ``devices`` devices, the highest arrival rate (the workload's
    arrival times scaled) at which at least ``target`` of the requests meet ``slo``.

    Args:
        workload: the requests (a :class:`~pytest_prefill.plan.workloads.Workload` names itself).
        cost: the device's cost model.
        slo: the bounds a request must meet.
        devices: how many devices every deployment uses.
        target: the attainment to keep, in (0, 1].
        deployments: what to compare (default :func:`default_deployments`).
        tolerance: stop when the highest pass and the lowest miss differ by at most this
            fraction of the rate.
        executor: where simulations run (default: a process pool, one process per core).
        progress: called with one line per finished deployment.
        start: the first rate tried, as a multiple of the workload's own.
        verify: after bisecting, probe twice the lowest miss once to catch non-monotonicity.

    Raises:
        ValueError: naming the argument: a bad cost or SLO, devices < 1, a target or tolerance
            outside (0, 1], an empty workload or one with no rate, no/repeated deployments or one
            for another device count.
    """
    load, name, attribution = workload_requests(workload)
    _check_search(cost, slo, devices, target, tolerance, deployments)
    chosen = (
        tuple(deployments) if deployments is not None else default_deployments(cost, devices, slo)
    )
    if not (isinstance(start, (int, float)) and MIN_SCALE <= start <= MAX_SCALE):
        raise ValueError(
            f"start must be a rate multiple in [{MIN_SCALE:g}, {MAX_SCALE:g}], got {start!r}"
        )
    base_rate = arrival_rate(load)
    searches = [_Search(d, float(target), float(tolerance), float(start), verify) for d in chosen]
    with contextlib.ExitStack() as stack:
        pool = executor if executor is not None else stack.enter_context(local_executor())
        _drive(pool, searches, (load, cost, slo), base_rate, progress)
    results = tuple(s.result() for s in searches)
    return CapacityResult(
        name,
        attribution,
        len(load),
        base_rate,
        cost,
        slo,
        devices,
        float(target),
        float(tolerance),
        results,
    )


def _drive(
    pool: concurrent.futures.Executor,
    searches: Sequence[_Search],
    problem: tuple[tuple[Request, ...], CostModel, SLO],
    base_rate: float,
    progress: Progress | None,
) -> None:
    """Keep one probe of every unfinished search in flight until each search is done."""
    load, cost, slo = problem
    pending: dict[concurrent.futures.Future[Probe], _Search] = {}
    began = {id(s): time.perf_counter() for s in searches}

    def advance(search: _Search) -> None:
        scale = search.next_scale()
        if scale is not None:
            pending[pool.submit(probe, load, cost, slo, search.deployment, scale, base_rate)] = (
                search
            )
        elif progress is not None:
            r = search.result()
            seconds = time.perf_counter() - began[id(search)]
            progress(
                f"{r.deployment.label}: {r.status}, {r.max_rate:.3g} req/s "
                f"({len(r.probes)} simulations, {seconds:.1f} s)"
            )

    said = time.perf_counter()
    try:
        for search in searches:
            advance(search)
        while pending:
            done, _ = concurrent.futures.wait(
                pending, timeout=PROGRESS_EVERY, return_when=concurrent.futures.FIRST_COMPLETED
            )
            for future in done:
                search = pending.pop(future)
                search.observe(probe_result(future))
                advance(search)
            if progress is not None and time.perf_counter() - said >= PROGRESS_EVERY:
                said = time.perf_counter()
                finished = len(searches) - len(set(map(id, pending.values())))
                simulations = sum(len(s.probes) for s in searches)
                progress(
                    f"{simulations} simulations done; {finished} of {len(searches)} "
                    f"deployments finished ({said - min(began.values()):.0f} s)"
                )
    finally:
        for future in pending:
            future.cancel()


def probe_result(future: concurrent.futures.Future[Probe]) -> Probe:
    """The probe, or :class:`ExecutorLost` when the pool that ran it broke (a worker died)."""
    try:
        return future.result()
    except concurrent.futures.BrokenExecutor as err:
        raise ExecutorLost(
            f"the process pool running the search broke: a worker died ({err or type(err).__name__})"
        ) from None
