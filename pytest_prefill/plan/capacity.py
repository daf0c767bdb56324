"""Capacity planning: for a workload, an SLO and N devices, the highest arrival rate at which
each deployment (shared, chunked, disaggregated at every prefill:decode split, in an engine
profile's own settings) keeps SLO attainment >= a target, found by bracketing and bisection over
simulations (:mod:`pytest_prefill.plan.rate_search`), and goodput per device there. Every simulation is independent, so a search runs on any
``concurrent.futures.Executor``: a local process pool by default, or a Dask cluster
(:mod:`pytest_prefill.plan.executors`). Standard library only; nothing here prints.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_prefill._io import json_safe
from pytest_prefill.plan.deployments import Deployment, default_deployments, refused_kinds
from pytest_prefill.plan.engine_commands import LaunchSettings, engine_flags, splits
from pytest_prefill.plan.executors import ShippedLoad, search_executor
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.plan.question import Progress, ServingQuestion
from pytest_prefill.plan.rate_search import (
    MAX_SCALE,
    MIN_SCALE,
    DeploymentResult,
    Probing,
    RateSearch,
    close_margin,
    probe,
)
from pytest_prefill.plan.search_loop import Problem, run_searches
from pytest_prefill.plan.verdict import (
    AloneMisses,
    alone_misses,
    fewest,
    refusals,
    refused_line,
    unreachable_line,
)
from pytest_prefill.plan.workloads import arrival_rate
from pytest_prefill.sim import (
    LAB,
    CostModel,
    EngineProfile,
    Request,
    Unfit,
    check_int,
)

if TYPE_CHECKING:
    from pytest_prefill.plan.pricing import TokenPrice

DEFAULT_TOLERANCE = 0.05  # the search stops when the highest pass and lowest miss are this close
# Below this the bisection would need rates closer than any simulation tells apart (and below
# about 1e-16, 1 + tolerance is 1.0: the bracket could never close).
MIN_TOLERANCE = 1e-4

# The rate a search tells apart from a deployment's capacity: its default tolerance's order (a
# probe whose arrivals are too short to show a backlog this much over capacity is a burst).
BURST_MARGIN = 0.1


def distinct_percentages(a: float, b: float) -> tuple[str, str]:
    """``a`` and ``b`` as percentages with the fewest decimals (1 to 6) that tell them apart:
    a rise from 99.96% to 99.98% is not "from 100.0% to 100.0%"."""
    for digits in range(1, 7):
        low, high = f"{a:.{digits}%}", f"{b:.{digits}%}"
        if low != high:
            break
    return low, high


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
    engine: EngineProfile = LAB
    alone: AloneMisses | None = None  # the deployment with the fewest requests missing alone
    # the most requests sharing one arrival instant, and how many instants there are: scaling
    # the rate spreads the instants apart, never the requests that share one
    largest_bunch: int = 1
    arrival_instants: int = 0
    # a search across device kinds: the devices of each kind its deployments may use (each
    # uses its own count: ranked per device), and each deployment's price at its answer by
    # label when --price was given (ranked by it, cheapest first)
    budget: Mapping[str, int] | None = None
    prices: Mapping[str, TokenPrice] | None = None

    @property
    def unreachable(self) -> bool:
        """Every deployment has more requests missing the SLO alone than may miss: no rate
        meets it, and nothing was simulated."""
        return all(r.misses_alone for r in self.results)

    @property
    def simulations(self) -> int:
        return sum(len(r.probes) for r in self.results)

    @property
    def headroom(self) -> float:
        """How many times the workload's own arrival rate the best deployment serves within
        the SLO (0 when none meets it; a lower bound when the best never missed)."""
        return self.ranked()[0].max_rate / self.base_rate

    def ranked(self) -> list[DeploymentResult]:
        """Deployments by goodput per device (the highest rate they serve within the SLO per
        device: DistServe's order), best first (ties keep the given order); with
        :attr:`prices`, by the price of a million tokens served, cheapest first (a deployment
        that meets the SLO nowhere last)."""
        if self.prices:
            prices = self.prices
            return sorted(
                self.results,
                key=lambda r: (prices[r.deployment.label].per_mtok, -r.goodput_per_device),
            )
        return sorted(self.results, key=lambda r: -r.goodput_per_device)

    @property
    def baseline(self) -> DeploymentResult | None:
        """What the best is measured against: the shared worker, or for an engine that has
        none the colocated deployment at the engine profile's own settings (None: neither was
        searched)."""
        chosen = baseline_deployment([r.deployment for r in self.results], self.engine)
        return next((r for r in self.results if r.deployment == chosen), None)

    def command(
        self,
        memory_fraction: float | None = None,
        model: str | None = None,
        max_model_len: Mapping[int, int] | None = None,
        fp8: tuple[bool, bool] = (False, False),
    ) -> str | None:
        """The line to type for the best deployment, in the engine's own flags (with the
        fraction of device memory it takes, the model it serves and, from ``max_model_len`` by
        its TP, the longest sequence it takes, when given, and the flags storing the weights
        and the KV cache in fp8 where ``fp8`` says so; None when no deployment meets the
        SLO)."""
        best = self.ranked()[0]
        if best.best is None:
            return None
        length = (max_model_len or {}).get(best.deployment.tp)
        settings = LaunchSettings(memory_fraction, model, length, *fp8)
        return best.deployment.command(self.engine, settings)

    def recommendation(self) -> str:
        """One line a user can act on: the deployment serving the highest request rate per
        device within the SLO, against :attr:`baseline`, and which others are within the
        search's tolerance of it."""
        ranked = self.ranked()
        best = ranked[0]
        if self.unreachable and self.alone is not None:
            return unreachable_line(self.alone)
        if best.best is None:
            return (
                f"No deployment meets {self.slo} for {self.target:.0%} of requests, even at "
                f"{min(p.rate for r in self.results for p in r.probes):.3g} req/s: the SLO is "
                "out of reach on this cost model."
            )
        margin = close_margin(self.tolerance)
        at_least = "at least " if best.status == "never missed" else ""
        basis = f">= {self.target:.0%} of requests within {self.slo}"
        per_device = f"{best.goodput_per_device:.3g}"
        most = "" if self.prices else " the most:"  # priced: the cheapest, not the most
        line = f"{best.deployment.label} serves{most} {at_least}{per_device} req/s per device"
        line += f" ({basis})"
        shared = self.baseline
        if shared is not None and shared is not best:
            name = shared.deployment.label
            if shared.deployment.policy != "shared":
                name += f" ({self.engine.name}'s defaults)"
            if shared.max_rate == 0:
                line += f"; {name} never meets the SLO"
            elif shared.goodput_per_device < best.goodput_per_device * (1 - margin):
                line = (
                    f"{best.deployment.label} serves {at_least}"
                    f"{best.goodput_per_device / shared.goodput_per_device:.2g}× the requests "
                    f"per device of "
                    f"{name} ({per_device} vs "
                    f"{shared.goodput_per_device:.3g} req/s per device, {basis})"
                )
        close = [
            r.deployment.label
            for r in ranked[1:]
            if r.max_rate > 0 and r.goodput_per_device >= best.goodput_per_device * (1 - margin)
        ]
        if close:
            line += f"; {', '.join(close)} {'is' if len(close) == 1 else 'are'} within {margin:.0%}"
        return self._cheapest(best) + line + "."

    def _cheapest(self, best: DeploymentResult) -> str:
        """With prices: the cheapest deployment's price per million tokens, input and output
        apart, before the goodput line ("" without)."""
        if not self.prices:
            return ""
        price = self.prices[best.deployment.label]
        return (
            f"{best.deployment.label} costs the least: ${price.input_per_mtok:.3g}/Mtok input, "
            f"${price.output_per_mtok:.3g}/Mtok output (${price.dollars_per_hour:.3g}/h at "
            f"{best.max_rate:.3g} req/s within the SLO). "
        )

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
                low, high = distinct_percentages(a.attainment, b.attainment)
                notes.append(
                    f"{label}: attainment is not monotone in rate (it rises from {low} "
                    f"at {a.rate:.3g} req/s to {high} at {b.rate:.3g} req/s); the "
                    "bisection assumes it falls, so read the probes or --plot."
                )
            if r.refused:
                notes.append(f"{label}: {refused_line(r.refused, self.requests)}")
            if r.status == "never missed":
                notes.append(
                    f"{label}: met the SLO up to {r.max_rate:.3g} req/s, the highest rate tried."
                )
            elif r.status == "misses alone" and not self.unreachable:
                notes.append(
                    f"{label}: {r.alone:,} requests miss the SLO even alone on it (at most "
                    f"{r.allowed:,} may): not searched."
                )
            elif r.status == "never met":
                lowest = min(r.probes, key=lambda p: p.rate)
                notes.append(
                    f"{label}: missed the SLO even at {lowest.rate:.3g} req/s "
                    f"({lowest.attainment:.1%} attainment; lower rates stopped raising it)"
                    + self._bunches()
                )
        return notes

    def _bunches(self) -> str:
        """Why lower rates stop helping when requests arrive together ('.' when none do)."""
        if self.largest_bunch < 2:
            return "."
        return (
            f": the workload has requests arriving together (up to {self.largest_bunch:,} at "
            f"one instant; {self.arrival_instants:,} distinct arrival times for "
            f"{self.requests:,} requests), and a lower rate spreads the instants apart but "
            "never the requests that share one, so those still queue behind each other."
        )

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
            "engine": engine_document(self.engine),
            "largest_bunch": self.largest_bunch,
            "arrival_instants": self.arrival_instants,
            "simulations": self.simulations,
            "alone_misses": self.alone.to_dict() if self.alone is not None else None,
            "budget": dict(self.budget) if self.budget is not None else None,
            "prices": {k: dataclasses.asdict(v) for k, v in self.prices.items()}
            if self.prices
            else None,
            "recommendation": self.recommendation(),
            "command": self.command(),
            "notes": self.notes(),
            "results": [r.to_dict() for r in self.results],
        }
        return json_safe(data, "capacity")


def baseline_deployment(
    deployments: Sequence[Deployment], engine: EngineProfile
) -> Deployment | None:
    """What a recommendation compares the best with: the first shared deployment, else the
    colocated one at the engine profile's own settings (None: neither is among them)."""
    shared = [d for d in deployments if d.policy == "shared"]
    if shared:
        return shared[0]
    own = engine.max_batched_tokens
    return next(
        (
            d
            for d in deployments
            if d.policy == "chunked"
            and d.chunk is None
            and d.chunk_budget is None
            and d.max_batched_tokens == own
            and d.max_seqs is None
        ),
        None,
    )


def engine_document(engine: EngineProfile) -> dict[str, Any]:
    """An engine profile as a search's document records it: its name, the line a report
    prints, its knobs and the flags they are typed as."""
    return {
        "name": engine.name,
        "label": engine.label(),
        "first_token": engine.first_token,
        "max_batched_tokens": engine.max_batched_tokens,
        "max_seqs": engine.max_seqs,
        "kv": engine.kv,
        "prefix_caching": engine.prefix_caching,
        "flags": engine_flags(engine),
    }


def _check_search(
    cost: CostModel,
    devices: Any,
    tolerance: Any,
    deployments: Sequence[Deployment] | None,
    engine: EngineProfile = LAB,
    up_to: bool = False,
) -> None:
    check_int("devices", devices)
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
        if d.devices > devices if up_to else d.devices != devices:
            raise ValueError(
                f"deployment {d.label} uses {d.devices} devices; this search compares {devices}"
            )
        if d.policy == "disaggregated" and not splits(engine):
            raise ValueError(
                f"deployment {d.label}: engine {engine.name!r} runs no prefill:decode split"
            )
        for reason in refused_kinds([d], engine, cost).values():
            raise ValueError(f"deployment {d.label}: {reason}")
    labels = [d.label for d in deployments]
    if len(set(labels)) != len(labels):
        raise ValueError(f"deployments are repeated: {labels}")


def capacity(
    question: ServingQuestion,
    devices: int,
    *,
    deployments: Sequence[Deployment] | None = None,
    tolerance: float = DEFAULT_TOLERANCE,
    start: float = 1.0,
    verify: bool = True,
    budget: Mapping[str, int] | None = None,
) -> CapacityResult:
    """For each deployment of ``devices`` devices, the highest arrival rate (the workload's
    arrival times scaled) at which at least the question's target of the requests meet its SLO.

    Args:
        question: the workload, the device's cost model, the SLO, the target, the engine
            profile every simulation runs under (the default deployments are its own settings)
            and how the search runs; its executor by default runs one process per core when more
            than :data:`~pytest_prefill.plan.executors.FEW_SEARCHES` deployments are searched,
            else inline (:func:`~pytest_prefill.plan.executors.search_executor`), and its
            progress hears one line per finished deployment.
        devices: how many devices every deployment uses.
        deployments: what to compare (default :func:`default_deployments`).
        tolerance: stop when the highest pass and the lowest miss differ by at most this
            fraction of the rate.
        start: the first rate tried, as a multiple of the workload's own.
        verify: after bisecting, probe twice the lowest miss once to catch non-monotonicity.
        budget: a search across device kinds (:mod:`~pytest_prefill.plan.kinds`): the devices
            of each kind; each deployment then uses its own count, at most ``devices`` in all.

    Raises:
        ValueError: naming the argument: a question that is not a ServingQuestion, devices < 1,
            a tolerance outside (0, 1], an empty workload or one with no rate, no/repeated
            deployments or one for another device count, an unknown engine or a split it does
            not run.
    """
    if not isinstance(question, ServingQuestion):
        raise ValueError(f"question must be a ServingQuestion, got {type(question).__name__}")
    load, name, attribution = question.requests()
    profile = question.profile()
    cost, slo, target, shortcuts = question.cost, question.slo, question.target, question.shortcuts
    _check_search(cost, devices, tolerance, deployments, profile, budget is not None)
    chosen = (
        tuple(deployments)
        if deployments is not None
        else default_deployments(cost, devices, slo, profile)
    )
    if not (isinstance(start, (int, float)) and MIN_SCALE <= start <= MAX_SCALE):
        raise ValueError(
            f"start must be a rate multiple in [{MIN_SCALE:g}, {MAX_SCALE:g}], got {start!r}"
        )
    if budget is not None:  # pruning compares rates, not rates per device: not across kinds
        shortcuts = dataclasses.replace(shortcuts, prune=False)
    base_rate = arrival_rate(load)
    alone = alone_misses(load, slo, target, [(d, d.cost_on(cost)) for d in chosen], profile)
    shipped = ShippedLoad(load)  # pickled once for all the simulations sent to processes
    margin = close_margin(tolerance)
    probing = Probing(shipped, cost, slo, profile, base_rate)
    problem = Problem(probing, float(target), margin, shortcuts)
    how = (tolerance, start, verify)
    results = _search(chosen, alone, problem, how, question.executor, question.progress)
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
        profile,
        fewest(alone),
        *arrival_bunches(load),
        dict(budget) if budget is not None else None,
    )


def _search(
    chosen: Sequence[Deployment],
    alone: Sequence[AloneMisses],
    problem: Problem,
    how: tuple[float, float, bool],
    executor: concurrent.futures.Executor | None,
    progress: Progress | None,
) -> tuple[DeploymentResult, ...]:
    """Every deployment's result: searched (on ``executor``, default
    :func:`~pytest_prefill.plan.executors.search_executor`), or not (more requests miss alone
    than may miss)."""
    tolerance, start, verify = how
    target = problem.target
    refused = [_refused(d, problem) for d in chosen]
    searches = {
        d.label: RateSearch(d, target, float(tolerance), float(start), verify)
        for d, a, unfit in zip(chosen, alone, refused)
        # no rate meets the SLO on it
        if not (problem.shortcuts.alone and (a.unreachable or len(unfit) > a.allowed))
    }
    if searches:
        with contextlib.ExitStack() as stack:
            default = search_executor(len(searches))[0]
            pool = executor if executor is not None else stack.enter_context(default)
            baseline = baseline_deployment(chosen, problem.probing.engine)
            run_searches(pool, list(searches.values()), problem, baseline, probe, progress)
    return tuple(
        dataclasses.replace(
            searches[d.label].result() if d.label in searches else no_search(d, target),
            alone=len({m.id for m in a.misses} | {u.id for u in unfit}),
            allowed=a.allowed,
            refused=unfit,
        )
        for d, a, unfit in zip(chosen, alone, refused)
    )


def _refused(deployment: Deployment, problem: Problem) -> tuple[Unfit, ...]:
    """The requests of ``problem``'s load an engine refuses on ``deployment``."""
    probing = problem.probing
    options = deployment.simulate_options(probing.engine)
    return refusals(deployment.policy, probing.load, deployment.cost_on(probing.cost), options)


def arrival_bunches(load: Sequence[Request]) -> tuple[int, int]:
    """The most requests sharing one arrival time, and how many distinct arrival times."""
    counts = collections.Counter(r.arrival for r in load)
    return max(counts.values(), default=1), len(counts)


def no_search(deployment: Deployment, target: float) -> DeploymentResult:
    """A deployment that was not searched: no probe, no answer."""
    return DeploymentResult(deployment, float(target), (), None, None)


def queueing_horizon(slo: SLO, mean_output: float) -> float:
    """How long a request may take within ``slo`` before queueing shows as a miss: the TTFT
    bound (else the end-to-end bound; with TPOT alone, its bound over the mean output)."""
    if slo.ttft is not None:
        return slo.ttft
    if slo.e2el is not None:
        return slo.e2el
    assert slo.tpot is not None  # an SLO has at least one bound
    return slo.tpot * max(1.0, mean_output)


def burst_warning(
    arrivals: Sequence[float], outputs: Sequence[int], slo: SLO, base_rate: float, rate: float
) -> str | None:
    """A warning when a probe at ``rate`` (the load's own is ``base_rate``) measured a burst:
    its ``arrivals`` (seconds, at the load's own rate) span less than the time queueing needs
    to show. At a rate ``1 + m`` times what a deployment serves, its backlog grows by about
    ``m`` of the arrival span, and a request misses once the backlog passes the SLO's
    :func:`queueing_horizon`; to tell a rate the search's ±10% from the one it serves, the
    arrivals must span ``horizon ÷ 0.1``. None when they do (or no rate was found)."""
    if rate <= 0 or base_rate <= 0 or len(arrivals) < 2:
        return None
    horizon = queueing_horizon(slo, sum(outputs) / max(1, len(outputs)))
    span = (max(arrivals) - min(arrivals)) * base_rate / rate
    needed_span = horizon / BURST_MARGIN
    if span >= needed_span:
        return None
    prompts = math.ceil(needed_span * rate) + 1
    return (
        f"  warning: at {rate:.3g} req/s the {len(arrivals):,} requests arrive within "
        f"{span:.3g} s, under the {needed_span:.3g} s a backlog needs to pass the SLO's "
        f"{horizon:.3g} s when the rate is {BURST_MARGIN:.0%} over what a deployment serves: "
        f"the probe measured one burst draining, not queueing; about {prompts:,} prompts "
        "(--num-prompts) would show it at that rate (fewer if the knee is lower)"
    )
