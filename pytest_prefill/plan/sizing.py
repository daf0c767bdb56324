"""How many devices a workload needs: the smallest device count at which some deployment
meets the SLO (attainment >= the target) at the workload's own arrival rate. A search over
device counts (doubling until one meets, then bisecting), one simulation per deployment per
count, on the same executors as the capacity search. Standard library only; nothing prints."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from pytest_prefill.plan.capacity import CapacityResult
from pytest_prefill.plan.deployments import Deployment
from pytest_prefill.plan.executors import ShippedLoad, local_executor
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.plan.question import ServingQuestion
from pytest_prefill.plan.rate_search import Probe, Probing, probe, probe_result
from pytest_prefill.plan.search_loop import Shortcuts
from pytest_prefill.plan.verdict import AloneMisses, alone_misses, fewest
from pytest_prefill.plan.workloads import arrival_rate
from pytest_prefill.sim import check_int

DEFAULT_MAX_DEVICES = 64  # the search's bound unless told otherwise
DeploymentsAt = Callable[[int], Sequence[Deployment]]


@dataclasses.dataclass(frozen=True, slots=True)
class DeviceCount:
    """What one device count gave at the workload's own rate: the deployment with the highest
    attainment among those simulated (``best``, None when no deployment fits that count) and
    whether it meets the target. The check stops at the first deployment (in the order given)
    that meets it, so a count that meets names a deployment that meets, not necessarily the
    best one."""

    devices: int
    best: Deployment | None
    attainment: float
    meets: bool
    simulations: int
    seconds: float
    figures: int = 0  # a full run more, for the attainment of a check that stopped or inferred
    named: bool = True  # False: it meets, but the first deployment in order that meets is unknown

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": self.devices,
            "best": self.best.label if self.best is not None else None,
            "attainment": None if math.isnan(self.attainment) else self.attainment,
            "meets": self.meets,
            "simulations": self.simulations,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class DevicesNeeded:
    """The answer: ``devices``, the smallest count that meets the SLO at the workload's own
    rate (None: none up to ``max_devices``), and every count checked, in the order checked.
    Counts between two checked ones are not simulated: the search assumes a count that meets
    keeps meeting with more devices (more replicas or more splits to choose from)."""

    devices: int | None
    max_devices: int
    rate: float
    target: float
    slo: SLO
    checks: tuple[DeviceCount, ...]
    engine: str = "lab"
    alone: AloneMisses | None = None  # set when requests miss alone on every deployment

    @property
    def unreachable(self) -> bool:
        """On ``max_devices`` devices, every deployment has more requests missing the SLO
        alone than may miss: no count was searched."""
        return self.alone is not None and self.alone.unreachable

    @property
    def simulations(self) -> int:
        return sum(c.simulations + c.figures for c in self.checks)

    @property
    def deployment(self) -> Deployment | None:
        """A deployment that meets the SLO at :attr:`devices` (None when none was found)."""
        found = [c for c in self.checks if c.devices == self.devices and c.meets]
        return found[0].best if found else None

    def to_dict(self) -> dict[str, Any]:
        deployment = self.deployment
        return {
            "devices": self.devices,
            "deployment": deployment.to_dict() if deployment is not None else None,
            "max_devices": self.max_devices,
            "rate": self.rate,
            "target": self.target,
            "slo": self.slo.to_dict(),
            "engine": self.engine,
            "simulations": self.simulations,
            "alone_misses": self.alone.to_dict() if self.alone is not None else None,
            "checks": [c.to_dict() for c in self.checks],
        }


def _check_count(
    pool: concurrent.futures.Executor,
    probing: Probing,
    devices: int,
    deployments: Sequence[Deployment],
    target: float,
    stop: bool = True,
) -> DeviceCount:
    """Every deployment of ``devices`` at the workload's own rate (scale 1), at once, each run
    stopped once its verdict is fixed (with ``stop``); done once one meets ``target`` and every deployment
    before it (in the given order) has answered: the first in order that meets is named (the
    ones after it are cancelled, and on a local pool those not yet sent are never sent: it
    holds one per process, sent in order), so the answer does not depend on which simulation
    finished first; else the highest attainment (ties: the first; a run stopped early counts
    what it had not missed)."""
    began = time.perf_counter()
    width = getattr(pool, "workers", None)  # a local pool's processes: no more sent at once
    queued = iter(enumerate(deployments))
    pending: dict[concurrent.futures.Future[Probe], int] = {}

    def send() -> None:
        while width is None or len(pending) < width:
            i, d = next(queued, (-1, None))
            if d is None:
                return
            pending[pool.submit(probe, probing, d, 1.0, target=target, stop=stop)] = i

    answered: dict[int, Probe] = {}
    try:
        send()
        while pending and _first_meeting(answered, target) is None:
            done, _ = concurrent.futures.wait(
                pending, return_when=concurrent.futures.FIRST_COMPLETED
            )
            for future in done:
                answered[pending.pop(future)] = probe_result(future)
            if _first_meeting(answered, target) is None:
                send()  # in order: the first that meets is known once those before it answer
    finally:
        for future in pending:
            future.cancel()
    seconds = time.perf_counter() - began
    if not answered:
        return DeviceCount(devices, None, 0.0, False, 0, seconds)
    chosen = _first_meeting(answered, target)
    if chosen is None:
        chosen = max(sorted(answered), key=lambda i: answered[i].attainment)
    run = answered[chosen]
    return DeviceCount(
        devices,
        deployments[chosen],
        _exact(run),
        run.passed(target),
        len(answered),
        seconds,
    )


def _exact(run: Probe) -> float:
    """A run's attainment when it ran to the end; NaN when it stopped once decided."""
    return run.metrics.attainment if run.metrics is not None else math.nan


def _first_meeting(answered: dict[int, Probe], target: float) -> int | None:
    """The lowest index that meets ``target`` with every index below it answered."""
    for i in range(len(answered) + 1):
        if i not in answered:
            return None
        if answered[i].passed(target):
            return i
    return None


def _known_count(result: CapacityResult) -> DeviceCount | None:
    """The capacity search's own probes as a checked count at the workload's rate (scale 1): a
    deployment meets there when it passed at that rate or above, and misses when it missed
    there or below (attainment falls with rate, as the search assumes); a deployment not
    searched misses. Named as :func:`_check_count` names one (the first in order that meets)
    when the probes tell for every deployment before it; else ``named`` is False (it meets,
    the deployment named may not be the first). None when they tell nothing of a count that
    may miss."""
    target = result.target
    told: list[tuple[Deployment, bool | None, Probe | None]] = []
    for r in result.results:
        runs = [p for p in r.probes if p.scale == 1.0 and p.metrics is not None]
        if r.misses_alone or runs:
            run = runs[-1] if runs else None
            told.append((r.deployment, run is not None and run.passed(target), run))
        elif any(p.passed(target) and p.scale >= 1.0 for p in r.probes):
            told.append((r.deployment, True, None))
        elif any(not p.passed(target) and p.scale <= 1.0 for p in r.probes):
            told.append((r.deployment, False, None))
        else:
            told.append((r.deployment, None, None))
    meeting = [i for i, (_, meets, _) in enumerate(told) if meets]
    if meeting:
        deployment, _, run = told[meeting[0]]
        named = all(meets is not None for _, meets, _ in told[: meeting[0]])
        attainment = _exact(run) if run is not None else math.nan
        return DeviceCount(result.devices, deployment, attainment, True, 0, 0.0, named=named)
    if not told or any(meets is None for _, meets, _ in told):
        return None
    known = [i for i, (_, _, run) in enumerate(told) if run is not None]  # none meets
    chosen = max(known, key=lambda i: _exact(told[i][2]), default=0)  # type: ignore[arg-type]
    deployment, _, run = told[chosen]
    attainment = _exact(run) if run is not None else math.nan
    return DeviceCount(result.devices, deployment, attainment, False, 0, 0.0)


def _guess(known: CapacityResult | None) -> int | None:
    """The devices a capacity search suggests: its devices over the headroom its best found
    (the workload's rate against the most the best serves), rounded up; None without one."""
    if known is None or not known.headroom > 0:
        return None
    return max(1, math.ceil(known.devices / known.headroom))


def _named(
    pool: concurrent.futures.Executor,
    probing: Probing,
    count: DeviceCount,
    deployments_at: DeploymentsAt,
    target: float,
    shortcuts: Shortcuts,
) -> DeviceCount:
    """The answer's count as it is printed: checked again when the deployment it names may not
    be the first in order that meets (a count inferred from a search), with the attainment
    from a full run."""
    if not count.named:
        devices = count.devices
        count = _check_count(
            pool, probing, devices, deployments_at(devices), target, shortcuts.stop
        )
    return _full_answer(pool, probing, count)


def _full_answer(
    pool: concurrent.futures.Executor,
    probing: Probing,
    count: DeviceCount,
) -> DeviceCount:
    """``count`` with its named deployment's attainment from a full run at the workload's
    rate, when what named it stopped early (or was inferred): the answer's figure."""
    if count.best is None or not math.isnan(count.attainment):
        return count
    run = probe_result(pool.submit(probe, probing, count.best, 1.0))
    return dataclasses.replace(count, attainment=_exact(run), figures=1)


def devices_needed(
    question: ServingQuestion,
    deployments_at: DeploymentsAt,
    *,
    start: int = 1,
    max_devices: int = DEFAULT_MAX_DEVICES,
    known: CapacityResult | None = None,
) -> DevicesNeeded:
    """The smallest device count, up to ``max_devices``, at which one of
    ``deployments_at(count)`` meets the question's SLO for its target of the requests at the
    workload's own arrival rate: from ``start``, double until a count meets, then bisect between
    the highest count that misses and the lowest that meets.

    Args:
        question: the workload (at the rate to serve), the device's cost model, the SLO, the
            target, the engine profile the simulations run under, and how the search runs (its
            executor by default a process pool, one process per core; its progress hears one
            line per count checked).
        deployments_at: the deployments to try on a given number of devices
            (e.g. :func:`~pytest_prefill.plan.deployments.default_deployments` bound to a cost
            model, an SLO and an engine).
        start: the first count checked (a capacity search's devices).
        max_devices: the largest count checked.
        known: a capacity search on ``start`` devices whose probes at the workload's own rate
            answer that count without simulating it again.

    Raises:
        ValueError: naming the argument, for a question that is not a ServingQuestion, counts
            < 1, ``start`` above ``max_devices``, or a workload without an arrival rate.
    """
    if not isinstance(question, ServingQuestion):
        raise ValueError(f"question must be a ServingQuestion, got {type(question).__name__}")
    requests, _, _ = question.requests()
    load = ShippedLoad(requests)  # pickled once for all the simulations sent to processes
    profile = question.profile()
    check_int("start", start)
    check_int("max_devices", max_devices)
    if start > max_devices:
        raise ValueError(f"start ({start}) must not be above max_devices ({max_devices})")
    cost, slo, target, shortcuts = question.cost, question.slo, question.target, question.shortcuts
    executor, progress = question.executor, question.progress
    base_rate = arrival_rate(load)
    widest = [(d, d.cost_on(cost)) for d in deployments_at(max_devices)]
    alone = alone_misses(load, slo, target, widest, profile) if widest and shortcuts.alone else ()
    if alone and all(a.unreachable for a in alone):  # no count of these deployments meets it
        return DevicesNeeded(
            None, max_devices, base_rate, float(target), slo, (), profile.name, fewest(alone)
        )
    probing = Probing(load, cost, slo, profile, base_rate)
    checked: dict[int, DeviceCount] = {}
    order: list[DeviceCount] = []
    same = known is not None and known.devices == start and known.engine == profile
    reuse = _known_count(known) if known is not None and same else None
    with contextlib.ExitStack() as stack:
        pool = executor if executor is not None else stack.enter_context(local_executor())

        def meets(devices: int) -> bool:
            if devices not in checked:
                if reuse is not None and devices == reuse.devices:
                    count = reuse
                else:
                    count = _check_count(
                        pool, probing, devices, deployments_at(devices), target, shortcuts.stop
                    )
                checked[devices] = count
                order.append(count)
                if progress is not None:
                    progress(_progress_line(count, target))
            return checked[devices].meets

        found = smallest_count(meets, start, max_devices, _guess(known) if same else None)
        if found is not None:
            answer = _named(pool, probing, checked[found], deployments_at, target, shortcuts)
            order = [answer if c is checked[found] else c for c in order]
    return DevicesNeeded(
        found, max_devices, base_rate, float(target), slo, tuple(order), profile.name
    )


def smallest_count(
    meets: Callable[[int], bool], start: int, limit: int, guess: int | None = None
) -> int | None:
    """The smallest count in [1, limit] that meets, assuming meeting is monotone in the count:
    double from ``start`` to a count that meets (or ``limit``), then bisect. With a ``guess``
    below a ``start`` that meets, double from the guess up to ``start`` first: the same count
    (meeting is monotone), found in fewer checks when the guess is close."""
    low, high = 0, start  # low: a count known to miss (0: none); high: the count to try
    while not meets(high):
        if high >= limit:
            return None
        low, high = high, min(2 * high, limit)
    if guess is not None and low < guess < high:
        count = guess
        while count < high and not meets(count):
            low, count = count, 2 * count
        if count == guess and low < guess - 1 and not meets(guess - 1):
            low = guess - 1  # the guess was right: the count below misses
        high = min(count, high)
    while high - low > 1:
        middle = (low + high) // 2
        if meets(middle):
            high = middle
        else:
            low = middle
    return high


def _progress_line(count: DeviceCount, target: float) -> str:
    verdict = "meets" if count.meets else "misses"
    if count.best is None:
        return f"devices needed: {count.devices}: no deployment fits {count.devices} device(s)"
    work = f"{count.simulations} simulations, {count.seconds:.1f} s" if count.simulations else ""
    figure = "" if math.isnan(count.attainment) else f" {count.attainment:.1%}"
    return (
        f"devices needed: {count.devices}: {count.best.label}{figure} at the "
        f"workload's rate ({verdict} {target:.0%}){f'; {work}' if work else ''}"
    )
