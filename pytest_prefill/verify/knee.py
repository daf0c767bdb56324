"""The knee of a flag set: the highest arrival rate (the workload's arrival times scaled) at
which SLO attainment stays at or above a target. Predicted by the capacity search
(``plan.capacity``) over the simulator with the server's calibration; measured on the server by
bounded probes: the predicted rate first, then steps out until the knee is bracketed, then
geometric bisection, then, while the verdict on the prediction is UNDECIDED, probes where one
decides it (DESIGN.md, "Checking the answer on a server"). How long a probe is and what it
sends: ``verify.probe_rule``. A request that fails counts as missing the SLO. Standard library
only."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from pytest_prefill._io import json_safe
from pytest_prefill.measure.quiet import QuietHost, quietly
from pytest_prefill.plan import rate_search
from pytest_prefill.plan.capacity import capacity
from pytest_prefill.plan.deployments import Deployment
from pytest_prefill.plan.executors import InlineExecutor
from pytest_prefill.plan.metrics import SLO, ServingMetrics
from pytest_prefill.plan.question import ServingQuestion
from pytest_prefill.plan.rate_search import DeploymentResult
from pytest_prefill.plan.workloads import arrival_rate
from pytest_prefill.serve.calibration.calibration_fit import RequestOverhead
from pytest_prefill.serve.calibration.server_model import ServerModel, simulate_records
from pytest_prefill.serve.load.loadgen import Bounds, Schedule, Target
from pytest_prefill.serve.load.records import BenchRun
from pytest_prefill.serve.load.server_metrics import run_counted
from pytest_prefill.sim import Request, meets, slo_values
from pytest_prefill.verify.fields import Fields
from pytest_prefill.verify.knee_interval import KneeEstimate, deciding_scale, estimate_knee
from pytest_prefill.verify.probe_rule import ProbeRule

Progress = Callable[[str], object]
# Probes a server restart cannot answer: asks the server whether it still runs (None: it does).
Alive = Callable[[], Awaitable[str | None]]
_Sent = tuple[BenchRun, list[str]]  # a probe's run and its requests' ids in the order sent
PREDICTION_TOLERANCE = 0.02  # the simulated search's bracket: finer than any probe can tell
BURST_SPAN = 1e-3  # seconds: a probe whose arrivals span less is a burst


def engine_slo(slo: SLO, overhead: RequestOverhead) -> SLO | None:
    """``slo`` as the engine must meet it: the request's overhead outside the engine (the way
    in and back, a constant) taken off TTFT and E2EL (TPOT is between tokens: unchanged). None
    when the overhead alone breaks a bound."""
    total = overhead.total if math.isfinite(overhead.total) else 0.0
    bounds: dict[str, float] = {}
    for name, seconds in slo.bounds:
        left = seconds - total if name in ("ttft", "e2el") else seconds
        if left <= 0:
            return None
        bounds[name] = left
    return SLO(**bounds)


@dataclasses.dataclass(frozen=True)
class Predicted:
    """The simulated knee: its ``rate`` (req/s; 0: none) and the search's ``status``, the SLO
    the engine was held to (None with ``reason`` when nothing could be searched), the lowest
    scale the search tried (where the first probe starts when the SLO was met nowhere), and the
    search's own document (``search``: JSON data, kept as written)."""

    rate: float
    status: str
    slo: SLO | None
    reason: str | None = None
    lowest_scale: float = 1.0
    search: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, result: DeploymentResult, slo: SLO) -> Predicted:
        """The capacity search's ``result`` for the one deployment, under ``slo``."""
        lowest = min((p.scale for p in result.probes), default=1.0)
        search = json_safe(result.to_dict(), "search")
        return cls(result.max_rate, result.status, slo, None, lowest, search)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "status": self.status,
            "reason": self.reason,
            "engine_slo": self.slo.to_dict() if self.slo is not None else None,
            "lowest_scale": self.lowest_scale,
            "search": self.search,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "predicted") -> Predicted:
        """Raises: ValueError naming the field, for one missing or of the wrong type."""
        fields = Fields(data, where)
        bounds = fields.child("engine_slo")
        slo = fields.build(SLO, **bounds.data) if bounds is not None else None
        search = fields.raw("search")
        lowest = fields.number("lowest_scale", _lowest_scale(search))
        return cls(
            fields.number("rate"),
            fields.text("status"),
            slo,
            fields.optional_text("reason"),
            lowest,
            search,
        )


def _lowest_scale(search: Any) -> float:
    """The lowest scale a search document's probes tried (1: none), for documents written
    before ``lowest_scale`` was."""
    probes = search.get("probes") if isinstance(search, Mapping) else None
    scales = [p.get("scale") for p in probes or [] if isinstance(p, Mapping)]
    return min((float(s) for s in scales if isinstance(s, (int, float))), default=1.0)


def predict_knee(
    load: Sequence[Request],
    server_model: ServerModel,
    slo: SLO,
    target: float,
) -> Predicted:
    """The capacity search for one colocated deployment at the server's budget and sequence
    cap, under its engine profile and KV cache, with the request's overhead taken off the SLO
    (:func:`engine_slo`)."""
    held = engine_slo(slo, server_model.overhead)
    if held is None:
        why = f"the request's overhead {server_model.overhead.total:.3g} s breaks {slo}"
        return Predicted(0.0, "never met", None, why)
    question = ServingQuestion(
        list(load),
        server_model.simulated_cost,
        held,
        target,
        server_model.scheduling.profile,
        executor=InlineExecutor(),
    )
    deployments = [_deployment(server_model)]
    result = capacity(question, 1, deployments=deployments, tolerance=PREDICTION_TOLERANCE)
    return Predicted.of(result.results[0], held)


def _deployment(server_model: ServerModel) -> Deployment:
    """The one colocated deployment at the server's budget and cap."""
    profile = server_model.scheduling.profile
    return Deployment(
        "chunked", 1, max_batched_tokens=profile.max_batched_tokens, max_seqs=profile.max_seqs
    )


def simulated_attainment(
    load: Sequence[Request],
    server_model: ServerModel,
    slo: SLO,
    rate: float,
) -> float:
    """The simulated attainment of ``load`` with its arrivals scaled to ``rate`` req/s, as
    :func:`predict_knee` simulates each rate (0 when the overhead alone breaks the SLO).

    Raises:
        ValueError: for a rate that is not a positive number, or a load with no rate.
    """
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be a positive number, got {rate!r}")
    base = arrival_rate(load)
    if not math.isfinite(base):
        raise ValueError("the load's requests arrive at once: no rate to scale")
    held = engine_slo(slo, server_model.overhead)
    if held is None:
        return 0.0
    profile = server_model.scheduling.profile
    probing = rate_search.Probing(load, server_model.simulated_cost, held, profile, base)
    found = rate_search.probe(probing, _deployment(server_model), rate / base)
    return found.attainment


@dataclasses.dataclass(frozen=True)
class MeasuredProbe:
    """One probe on the server: the workload at ``scale`` x its rate (``rate`` req/s offered),
    ``sent`` requests, ``good`` of them within the SLO, ``failed`` with no answer; the metrics
    of the completed ones and the run itself (its records); ``outcomes``: per request in the
    order sent, whether it met the SLO (empty: not kept; ``good`` of ``sent`` then stands)."""

    scale: float
    rate: float
    sent: int
    good: int
    failed: int
    metrics: ServingMetrics | None = dataclasses.field(compare=False)  # of run, under the SLO
    run: BenchRun
    outcomes: tuple[bool, ...] = ()

    @property
    def per_request(self) -> tuple[bool, ...]:
        """``outcomes``, or ``good`` met then the rest missed when they were not kept."""
        return self.outcomes or (True,) * self.good + (False,) * (self.sent - self.good)

    @property
    def attainment(self) -> float:
        return self.good / self.sent if self.sent else 0.0

    @property
    def standard_error(self) -> float:
        a = self.attainment
        return math.sqrt(a * (1 - a) / max(self.sent, 1))

    def to_dict(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "rate": self.rate,
            "sent": self.sent,
            "good": self.good,
            "failed": self.failed,
            "attainment": self.attainment,
            "standard_error": self.standard_error,
            "outcomes": "".join("1" if o else "0" for o in self.outcomes),
            "metrics": self.metrics.to_dict() if self.metrics is not None else None,
            "run": self.run.to_dict(),
            "records": [r.to_dict() for r in self.run.records],
        }

    @classmethod
    def from_dict(cls, data: Any, slo: SLO, where: str = "probe") -> MeasuredProbe:
        """The probe :meth:`to_dict` wrote; its metrics recomputed from its records under
        ``slo`` (None: a slim document, without records).

        Raises:
            ValueError: naming the field, for one missing or of the wrong type.
        """
        fields = Fields(data, where)
        run = BenchRun.from_dict(
            fields.raw("run"), fields.items("records"), f"{where}.run", f"{where}.records"
        )
        outcomes = fields.text("outcomes", "")
        if set(outcomes) - {"0", "1"}:
            raise fields.fail("outcomes", "a string of 0s and 1s", outcomes)
        return cls(
            fields.number("scale"),
            fields.number("rate"),
            fields.integer("sent"),
            fields.integer("good"),
            fields.integer("failed"),
            run.metrics(slo=slo) if run.completed else None,
            run,
            tuple(o == "1" for o in outcomes),
        )


def probe_of(
    run: BenchRun, slo: SLO, scale: float, rate: float, order: Sequence[str] = ()
) -> MeasuredProbe:
    """A run's attainment: requests meeting every bound over requests sent; ``order``: the
    request ids in the order sent, for the per-request outcomes (a request missing or failed
    missed)."""
    completed = run.completed
    metrics = run.metrics(slo=slo) if completed else None
    good = metrics.good if metrics is not None else 0
    met = {r.id: _meets(slo, r.token_times, r.arrival) for r in completed}
    outcomes = tuple(met.get(i, False) for i in order)
    sent = len(run.records)
    return MeasuredProbe(scale, rate, sent, good, len(run.failed), metrics, run, outcomes)


def replayed_attainment(
    probe: MeasuredProbe,
    server_model: ServerModel,
    slo: SLO,
) -> float:
    """The simulator's attainment on a probe's completed requests replayed at their measured
    arrivals (``serve.calibration.server_model``): beside the measured attainment, it says whether a miss is
    the model's (the replay meets the target where the server did not) or the search's (both
    agree); NaN when nothing completed."""
    completed = probe.run.completed
    if not completed:
        return math.nan
    replayed = simulate_records(completed, server_model)
    good = sum(_meets(slo, r.token_times, r.arrival) for r in replayed if r.token_times)
    return good / len(completed)


def _meets(slo: SLO, times: Sequence[float], arrival: float) -> bool:
    """One request against the SLO, as ``plan.metrics`` counts it."""
    return meets(slo.bounds, *slo_values(arrival, times[0], times[-1], len(times)))


@dataclasses.dataclass(frozen=True)
class MeasuredKnee:
    """What the probes found: each probe in the order run; ``low`` the highest rate that met
    the target, ``high`` the lowest above it that missed; ``ended`` the one line saying why the
    server stopped the search (None when it did not); ``estimate``: the knee interpolated
    where attainment crosses the target, with its bootstrap interval (``knee_interval``)."""

    probes: tuple[MeasuredProbe, ...]
    low: MeasuredProbe | None
    high: MeasuredProbe | None
    tolerance: float
    ended: str | None = None
    estimate: KneeEstimate | None = None

    @property
    def rate(self) -> float:
        """The highest rate that met the target (0: none did)."""
        return self.low.rate if self.low is not None else 0.0

    @property
    def knee(self) -> float:
        """The measured knee: the estimate where it is bracketed, else the highest rate that
        met the target."""
        e = self.estimate
        return e.rate if e is not None and 0 < e.rate < math.inf else self.rate

    @property
    def status(self) -> str:
        if self.ended is not None:
            return "ended"
        if self.low is None:
            return "never met" if self.probes else "not measured"
        if self.high is None:
            return "never missed"
        close = self.high.scale <= self.low.scale * (1 + self.tolerance) + 1e-12
        return "found" if close else "bracketed"

    @property
    def at_first(self) -> MeasuredProbe | None:
        """The first probe: the one at the predicted rate."""
        return self.probes[0] if self.probes else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "knee": self.knee,
            "estimate": self.estimate.to_dict() if self.estimate is not None else None,
            "status": self.status,
            "high": self.high.rate if self.high is not None else None,
            "ended": self.ended,
            "low_probe": _index(self.probes, self.low),
            "high_probe": _index(self.probes, self.high),
            "tolerance": self.tolerance,
            "probes": [p.to_dict() for p in self.probes],
        }

    @classmethod
    def from_dict(
        cls, data: Any, slo: SLO, tolerance: float, where: str = "measured"
    ) -> MeasuredKnee:
        """The search :meth:`to_dict` wrote (``slo`` and ``tolerance``: the run's, for a
        document written without its own).

        Raises:
            ValueError: naming the field, for one missing or of the wrong type.
        """
        fields = Fields(data, where)
        probes = tuple(
            MeasuredProbe.from_dict(p.data, slo, p.where)
            for p in fields.children("probes")
            if p is not None
        )
        low = _probe_at(fields, "low_probe", probes, fields.number("rate", 0.0))
        high_rate = fields.raw("high")
        high = _probe_at(fields, "high_probe", probes, fields.number("high") if high_rate else 0.0)
        estimate = fields.child("estimate")
        return cls(
            probes,
            low,
            high,
            fields.number("tolerance", tolerance),
            fields.optional_text("ended"),
            KneeEstimate.from_dict(estimate) if estimate is not None else None,
        )


def _index(probes: Sequence[MeasuredProbe], probe: MeasuredProbe | None) -> int | None:
    return next((i for i, p in enumerate(probes) if p is probe), None)


def _probe_at(
    fields: Fields, key: str, probes: Sequence[MeasuredProbe], rate: float
) -> MeasuredProbe | None:
    """The probe a document names by index, else (an older document) the first at ``rate``
    (None: 0, no such probe)."""
    index = fields.optional_integer(key)
    if index is not None:
        if not 0 <= index < len(probes):
            raise fields.fail(key, f"an index into the {len(probes)} probes", index)
        return probes[index]
    return next((p for p in probes if rate > 0 and p.rate == rate), None)


class KneeSearch:
    """The measured search, one probe at a time: ``start`` first; while every probe passes,
    ``step`` x the highest; while every probe misses, the lowest / ``step``; then the geometric
    midpoint of the bracket until it is within ``tolerance``; then, with probes left, an
    anchor on each side whose nearest probe is not clear of the target by the ``margin``
    (``tolerance`` below the highest pass, or above the lowest miss), so that the knee's
    interval has a probe that clearly met it and one that clearly missed it; then, given the
    ``judged`` scale (the predicted knee's), while its verdict against the measured knee is
    UNDECIDED, a probe where it decides (:func:`deciding_scale`): the probes' noise, not their
    number, then leaves it undecided; never more than ``max_probes``; never above ``max_scale``
    (where the probe's requests all arrive at once: a burst, which a higher rate cannot make
    heavier)."""

    def __init__(
        self,
        rule: ProbeRule,
        start: float,
        max_scale: float = math.inf,
        judged: float | None = None,
    ) -> None:
        if not (math.isfinite(start) and start > 0):
            raise ValueError(f"start scale must be a positive number, got {start!r}")
        if judged is not None and not (math.isfinite(judged) and judged > 0):
            raise ValueError(f"judged scale must be a positive number, got {judged!r}")
        self.rule, self.start, self.max_scale = rule, min(start, max_scale), max_scale
        self.judged = judged
        self.probes: list[MeasuredProbe] = []
        self.low: MeasuredProbe | None = None
        self.high: MeasuredProbe | None = None

    def next_scale(self) -> float | None:
        if not self.probes:
            return self.start
        if len(self.probes) >= self.rule.max_probes:
            return None
        low, high = self.low, self.high
        if high is None:
            assert low is not None
            if low.scale >= self.max_scale:
                return None  # it met the target as a burst: no rate is heavier
            return min(low.scale * self.rule.step, self.max_scale)
        if low is None:
            return high.scale / self.rule.step
        if high.scale <= low.scale * (1 + self.rule.tolerance) + 1e-12:
            anchor = self._anchor()
            return anchor if anchor is not None else self._decide()
        return math.sqrt(low.scale * high.scale)

    def _anchor(self) -> float | None:
        """Below the highest pass when no probe clearly met the target, else above the lowest
        miss when none clearly missed it (None: both sides are clear)."""
        rule, step = self.rule, 1 + self.rule.tolerance
        clear_met = any(p.attainment >= rule.target + rule.margin for p in self.probes)
        clear_missed = any(p.attainment <= rule.target - rule.margin for p in self.probes)
        if not clear_met and self.low is not None:
            return min(p.scale for p in self.probes) / step
        if not clear_missed and self.high is not None:
            return min(max(p.scale for p in self.probes) * step, self.max_scale)
        return None

    def _decide(self) -> float | None:
        sent = [(p.scale, p.per_request) for p in self.probes if p.sent]
        if self.judged is None or not sent:
            return None  # nothing to judge, or nothing measured to judge it on
        rule, step = self.rule, 1 + self.rule.tolerance
        return deciding_scale(
            sent, rule.target, self.judged, within=rule.within, step=step, highest=self.max_scale
        )

    def observe(self, probe: MeasuredProbe) -> None:
        self.probes.append(probe)
        if probe.attainment >= self.rule.target:
            if self.low is None or probe.scale > self.low.scale:
                self.low = probe
        elif self.high is None or probe.scale < self.high.scale:
            self.high = probe

    def result(self, ended: str | None = None) -> MeasuredKnee:
        """What the probes found; ``ended``: why the server cut the search short (no knee is
        estimated from a search the server did not finish)."""
        probes = [(p.rate, p.per_request) for p in self.probes if p.sent and p.rate > 0]
        estimate = estimate_knee(probes, self.rule.target) if probes and ended is None else None
        low, high, tolerance = self.low, self.high, self.rule.tolerance
        return MeasuredKnee(tuple(self.probes), low, high, tolerance, ended, estimate)


def start_scale(predicted: Predicted, load: Sequence[Request]) -> float:
    """The first probe's scale: the predicted knee's, else the lowest rate the prediction
    tried (it met the SLO nowhere)."""
    if predicted.rate > 0:
        return predicted.rate / arrival_rate(load)
    return predicted.lowest_scale


async def measure_knee(
    target: Target,
    load: Sequence[Request],
    slo: SLO,
    rule: ProbeRule,
    start: float,
    *,
    alive: Alive,
    progress: Progress | None = None,
    tag: str = "",
    judged: float | None = None,
    quiet: QuietHost | None = None,
    stopped: Callable[[], str | None] | None = None,
) -> MeasuredKnee:
    """Probe ``target`` with ``load`` (:func:`probe_load`) at ``start`` x its rate, then as
    :class:`KneeSearch` says (``judged``: the predicted knee's scale, probed until decided;
    ``quiet``: each probe run on a quiet host, ``measure.quiet``). After a probe with
    failed requests ``alive`` is asked: a server that is gone or not answering ends the
    search with one line, keeping the probes run. A cancellation (a signal,
    ``verify.interrupt``) ends it the same way, with ``stopped``'s line, keeping the probes
    that finished (the one cut short is not kept: neither met nor missed); where ``stopped``
    says nothing (None, or no ``stopped``) it is raised again."""
    base = arrival_rate(load)
    span = max(r.arrival for r in load) - min(r.arrival for r in load)
    search = KneeSearch(rule, start, span / BURST_SPAN, judged)
    try:
        return await _search(search, target, load, slo, base, alive, progress, tag, quiet)
    except asyncio.CancelledError:
        why = stopped() if stopped is not None else None
        if why is None:
            raise
        scale = search.next_scale()
        cut = f" at {base * scale:.3g} req/s" if scale is not None else ""
        return search.result(
            f"{why} during probe {len(search.probes) + 1}{cut} (cut short: not counted)"
        )


async def _search(
    search: KneeSearch,
    target: Target,
    load: Sequence[Request],
    slo: SLO,
    base: float,
    alive: Alive,
    progress: Progress | None,
    tag: str,
    quiet: QuietHost | None,
) -> MeasuredKnee:
    """:func:`measure_knee`'s probes, one at a time as ``search`` says."""
    while (scale := search.next_scale()) is not None:
        index = len(search.probes)
        named = f"{tag}p{index}"

        async def once(attempt: int, scale: float = scale, named: str = named) -> _Sent:
            again = f"r{attempt}" if attempt else ""  # each probe, and each redo, starts cold
            renamed = [dataclasses.replace(r, id=f"{named}{again}-{r.id}") for r in load]
            run = await run_counted(
                dataclasses.replace(target, salt=f"{target.salt}-{named}{again}"),
                renamed,
                schedule=Schedule("trace", rate_scale=scale),
                bounds=Bounds(warmup=0),
            )
            return run, [r.id for r in renamed]

        (run, order), host = await quietly(quiet, once, f"probe {index + 1}", progress)
        run = dataclasses.replace(run, host=host)
        probe = probe_of(run, slo, scale, base * scale, order)
        if progress is not None:
            progress(
                f"probe {index + 1}: {probe.rate:.3g} req/s, attainment {probe.attainment:.0%} "
                f"({probe.good}/{probe.sent}{f', {probe.failed} failed' if probe.failed else ''})"
                + (f", host steal {host.text()}" if host is not None else "")
            )
        if probe.failed and (why := await alive()) is not None:
            search.probes.append(
                probe
            )  # kept for the record, but cut short: neither met nor missed
            first = next((r.error for r in run.failed if r.error), "")
            line = f"{why} during the probe at {probe.rate:.3g} req/s"
            line += f" ({probe.failed} of {probe.sent} requests failed: {first[:120]})"
            return search.result(line)
        search.observe(probe)
    return search.result()
