"""The question a capacity search asks of each simulation — *does this deployment at this
rate meet the SLO for ``target`` of the requests?* — and the requests that cannot meet it even
alone on an idle device. Standard library only.

A verdict needs fewer facts than the metrics: it is FAILED as soon as more requests have
missed than :func:`allowed_misses` lets miss, and PASSED once the requests still unfinished
cannot push the misses past it. A simulator that stops there (``stop=`` on
:func:`~pytest_prefill.sim.simulate`, when it has one) gives the same pass/fail as the full
run. A search stops its runs once FAILED only: a pass runs to its end, so that the figures at
the rate it reports come from a full run without running it twice
(:mod:`~pytest_prefill.plan.rate_search`).

The requests that miss alone (:func:`alone_misses`) are a lower bound on the misses of any run
of the load on those deployments, at any rate: each request's own prefill and decode under the
cost model, nothing else on the device. When more of them miss than may miss, no rate and no
device count meets the SLO, and a search need not run.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from pytest_prefill import sim as simulator
from pytest_prefill.plan.deployments import Deployment
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.sim import (
    CostModel,
    EngineProfile,
    Request,
    Trace,
    Unfit,
    in_arrival_order,
    meets,
    never_fit,
    simulate,
    slo_values,
    within,
)

# The simulator's early stop, when it has one (issue 26); else full runs, then the verdict.
StopRule: Any = getattr(simulator, "StopRule", None)

# A float lower bound loses at most a few ulps against the simulator's exact integer ticks
# (its constants round to the nearest 2**-64 s); the bound is shrunk by this much to stay below.
BOUND_SLACK = 1e-9
NAMED = 5  # requests named in a line; the rest are counted


def allowed_misses(target: float, requests: int) -> int:
    """The most of ``requests`` requests that may miss the SLO with attainment still >=
    ``target``, judged exactly as :attr:`~pytest_prefill.plan.metrics.ServingMetrics.attainment`
    is: the largest ``m`` with ``(requests - m) / requests >= target`` in floating point
    (``floor((1 - target) * requests)`` can be one off: (1 - 0.9) * 10 is 0.999…).

    Raises:
        ValueError: for a target outside (0, 1] or requests < 1.
    """
    number = isinstance(target, (int, float)) and not isinstance(target, bool)
    if not (number and 0 < target <= 1):
        raise ValueError(f"target attainment must be in (0, 1], got {target!r}")
    if isinstance(requests, bool) or not isinstance(requests, int) or requests < 1:
        raise ValueError(f"requests must be an int >= 1, got {requests!r}")
    m = min(requests, max(0, math.floor((1 - target) * requests)))
    while m < requests and (requests - m - 1) / requests >= target:
        m += 1
    while m > 0 and (requests - m) / requests < target:
        m -= 1
    return m


def _values(record: Any) -> tuple[float, float | None, float]:
    """A finished request's TTFT, TPOT (None for one token) and E2EL (``sim.slo_values``)."""
    return slo_values(record.arrival, record.first_token, record.finish, record.output_len)


def trace_misses(trace: Trace, slo: SLO) -> int:
    """The requests of a full run's ``trace`` that miss ``slo``."""
    return sum(1 for r in trace.requests.values() if not meets(slo.bounds, *_values(r)))


def bound_misses(trace: Trace, slo: SLO) -> tuple[tuple[str, int], ...]:
    """Per bound of ``slo``, the requests of ``trace`` (those finished, for a run stopped early)
    that miss it."""
    counts = dict.fromkeys((name for name, _ in slo.bounds), 0)
    for r in trace.requests.values():
        if not (math.isfinite(r.first_token) and math.isfinite(r.finish)):
            continue
        ttft, tpot, e2el = _values(r)
        values = {"ttft": ttft, "tpot": tpot, "e2el": e2el}
        for name, bound in slo.bounds:
            counts[name] += not within(values[name], bound)
    return tuple(counts.items())


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """Whether a run met the SLO for the target: ``misses`` (all of them for a full run; at
    least that many, more than ``allowed``, for one stopped FAILED; those so far for one
    stopped PASSED) of ``requests``, and ``stopped``: None (ran to the end), ``"failed"`` or
    ``"passed"`` (stopped once the verdict was fixed)."""

    passed: bool
    misses: int
    requests: int
    allowed: int
    stopped: str | None = None
    bound_misses: tuple[tuple[str, int], ...] = ()  # per bound, of the requests finished
    refused: int = 0  # of the misses, requests the engine refused (their KV never fits)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def refusals(
    policy: str, load: Sequence[Request], cost: CostModel, options: dict[str, Any]
) -> tuple[Unfit, ...]:
    """The requests of ``load`` an engine refuses under ``policy`` on ``cost`` (``options``
    are :func:`simulate`'s keywords): their KV never fits one worker of a pool."""
    engine = options.get("engine", simulator.LAB)
    split = policy == "disaggregated"
    return never_fit(load, cost, engine, options.get("decode_cost"), split)


def served(load: Sequence[Request], refused: Sequence[Unfit]) -> list[Request]:
    """``load`` less the requests ``refused``."""
    gone = {u.id for u in refused}
    return [r for r in load if r.id not in gone]


_WORKER_OF = {"worker": "worker", "prefill": "prefill worker", "decode": "decode worker"}


def refused_line(refused: Sequence[Unfit], requests: int) -> str:
    """One line: how many requests an engine refuses on a deployment, which pool they never
    fit, and why."""
    pools = " or ".join(dict.fromkeys(_WORKER_OF[u.pool] for u in refused))
    longest = max(refused, key=lambda u: u.need)
    return (
        f"{len(refused):,} of {requests:,} requests can never fit one {pools}'s KV "
        f"({longest.have:,} tokens; {longest.id} needs {longest.need:,}, its prompt and "
        "output): an engine refuses them (vLLM serves no sequence longer than its KV "
        "cache), so each counts as a miss."
    )


def run_verdict(
    policy: str,
    load: Sequence[Request],
    cost: CostModel,
    options: dict[str, Any],
    slo: SLO,
    target: float,
    stop: bool = True,
    on_pass: bool = False,
) -> tuple[Trace | None, Verdict]:
    """Simulate ``load`` under ``policy`` (``options`` are :func:`simulate`'s keywords) and
    judge it against ``slo`` for ``target`` of the requests; with ``stop``, stopping once it
    has FAILED when the simulator can (with ``on_pass``, once it has PASSED too). The trace is
    partial when the verdict says ``stopped``.

    The requests the engine refuses (:func:`refusals`) are not simulated: each is a miss. When
    more are refused than may miss, the verdict is FAILED at once (stopped, no trace); else
    the rest are run with that many fewer misses allowed.

    A run that passes goes to its end by default: a stop on PASSED saves at most the last
    ``allowed`` requests' finishing, and the pass may be the search's answer, whose figures
    would then take a second, full run."""
    allowed = allowed_misses(target, len(load))
    refused = refusals(policy, load, cost, options)
    count = len(refused)
    if count:
        load = served(load, refused)
        if count > allowed or not load:
            return None, Verdict(False, count, len(load) + count, allowed, "failed", (), count)
    total = len(load) + count
    if stop and StopRule is not None:
        rule = StopRule(
            ttft=slo.ttft,
            tpot=slo.tpot,
            e2el=slo.e2el,
            allowed_misses=allowed - count,
            on_pass=on_pass,
        )
        stopping: Any = simulate  # the keyword is newer than this module's type checking
        trace = stopping(policy, load, cost, stop=rule, **options)
        decided: Any = trace
        stopped, misses = decided.stopped, decided.misses + count
        passed = stopped == "passed" or (stopped is None and misses <= allowed)
        each = bound_misses(trace, slo) if stopped is not None else ()
        return trace, Verdict(passed, misses, total, allowed, stopped, each, count)
    trace = simulate(policy, load, cost, **options)  # the fallback: the full run, then judged
    misses = trace_misses(trace, slo) + count
    return trace, Verdict(misses <= allowed, misses, total, allowed, refused=count)


# -- the requests that miss alone ------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class AloneMiss:
    """A request that misses the SLO even alone on an idle device: its lower bounds (seconds)
    on TTFT, TPOT (None: one output token) and E2EL, under the deployment that does best."""

    id: str
    prompt_len: int
    output_len: int
    ttft: float
    tpot: float | None
    e2el: float

    def label(self) -> str:
        return f"{self.id} ({self.prompt_len:,} + {self.output_len:,} tokens)"


@dataclasses.dataclass(frozen=True, slots=True)
class AloneMisses:
    """The requests of a load (``requests`` in all) that miss ``slo`` even alone, and the most that may miss (``allowed``, for
    ``target``) on ``deployment`` (its label). ``unreachable``: more miss alone than may
    miss, so no rate meets the SLO on it."""

    deployment: str
    slo: SLO
    target: float
    requests: int
    allowed: int
    misses: tuple[AloneMiss, ...]

    @property
    def count(self) -> int:
        return len(self.misses)

    @property
    def unreachable(self) -> bool:
        return self.count > self.allowed

    def named(self, first: int = NAMED) -> str:
        """The first ``first`` requests that miss alone, then how many more."""
        shown = ", ".join(m.label() for m in self.misses[:first])
        more = self.count - first
        return shown + (f" and {more:,} more" if more > 0 else "")

    def line(self) -> str:
        """One line: how many miss alone, against how many may miss; which ones."""
        if not self.misses:
            return f"Requests that miss {self.slo} even alone: none."
        share = f"{self.count:,} of {self.requests:,} requests ({self.count / self.requests:.1%})"
        may = f"at most {self.allowed:,} may miss for {self.target:.0%}"
        on = f"even alone on an idle device ({self.deployment}, the fewest)"
        return f"Requests that miss {self.slo} {on}: {share}; {may}: {self.named()}."

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment,
            "requests": self.requests,
            "allowed": self.allowed,
            "count": self.count,
            "unreachable": self.unreachable,
            "misses": [dataclasses.asdict(m) for m in self.misses],
        }


def shared_prefix_tokens(load: Sequence[Request], block_tokens: int) -> dict[str, int]:
    """Per request id, the most prompt tokens a prefix cache could ever supply it: the leading
    run of its prefix blocks (at most its whole blocks) whose ids some other request also
    carries. The simulator's cache holds only blocks some request prefilled, and hits a run of
    leading ids; a request's own earlier attempt (before a preemption) saves it nothing, as
    those tokens were computed once already."""
    holders: Counter[int | str] = Counter()
    for r in load:
        holders.update(set(r.prefix_blocks))
    out = {}
    for r in load:
        whole = min(len(r.prefix_blocks), r.prompt_len // block_tokens)
        run = 0
        while run < whole and holders[r.prefix_blocks[run]] >= 2:
            run += 1
        out[r.id] = run * block_tokens
    return out


def prefill_passes(deployment: Deployment, engine: EngineProfile, tokens: int) -> int:
    """The fewest prefill passes ``tokens`` prompt tokens of one request take under
    ``deployment``: a chunked deployment's passes hold at most its chunk (or its token budget)
    of them; any other (and a time budget, which admits at least a token) may take a whole
    prompt in one pass."""
    return _passes(pass_tokens(deployment, engine), tokens)


def pass_tokens(deployment: Deployment, engine: EngineProfile) -> int | None:
    """The most prompt tokens of one request a prefill pass of ``deployment`` holds (None: a
    whole prompt): a chunked deployment's chunk or token budget, the lesser."""
    if deployment.policy != "chunked" or deployment.chunk_budget is not None:
        return None
    sizes = [s for s in (deployment.chunk, deployment.engine(engine).max_batched_tokens) if s]
    return min(sizes) if sizes else None


def _passes(size: int | None, tokens: int) -> int:
    return math.ceil(tokens / size) if size is not None and tokens > 0 else 1


def alone_bounds(
    request: Request, cost: CostModel, passes: int, cached: int
) -> tuple[float, float | None, float]:
    """Lower bounds on ``request``'s TTFT, TPOT (None for one output token) and E2EL, alone:
    its prompt less ``cached`` tokens in ``passes`` prefill passes (each pays the pass overhead;
    chunking never lowers the per-token and pair terms, and the KV-read term, >= 0, is left
    out), then a decode step (at least ``decode_step_base``) for each further token. Any run
    with other requests only adds to each: every cost term is >= 0, and a fused pass costs at
    least its prefill or its decode part."""
    computed = request.prompt_len - cached
    pairs = computed * cached + computed * (computed + 1) // 2
    prefill = (
        passes * cost.prefill_pass_overhead
        + cost.prefill_per_token * computed
        + cost.prefill_per_pair * pairs
    )
    ttft = prefill * (1 - BOUND_SLACK)
    gaps = request.output_len - 1
    step = cost.decode_step_base * (1 - BOUND_SLACK)
    tpot = step if gaps > 0 else None
    return ttft, tpot, ttft + gaps * step


def alone_misses(
    load: Sequence[Request],
    slo: SLO,
    target: float,
    deployments: Iterable[tuple[Deployment, CostModel]],
    engine: EngineProfile,
) -> tuple[AloneMisses, ...]:
    """Per deployment (each with the cost model it runs on: one of another parallelism may
    have its own), the requests of ``load`` that miss ``slo`` alone on it, in arrival order.
    With ``engine``'s prefix cache on, a request is credited every token other requests could
    have cached for it (:func:`shared_prefix_tokens`).

    Raises:
        ValueError: for an empty load or a target outside (0, 1].
    """
    if not load:
        raise ValueError("alone_misses needs at least one request")
    allowed = allowed_misses(target, len(load))
    block = engine.prefix_block_tokens
    cached = shared_prefix_tokens(load, block) if engine.prefix_caching and block else {}
    ordered = in_arrival_order(load)
    found: dict[tuple[int | None, CostModel], tuple[AloneMiss, ...]] = {}  # same bounds, once
    out = []
    for deployment, cost in deployments:
        key = (pass_tokens(deployment, engine), cost)
        if key not in found:
            found[key] = _alone(ordered, slo, cost, key[0], cached)
        out.append(
            AloneMisses(deployment.label, slo, float(target), len(load), allowed, found[key])
        )
    return tuple(out)


def _alone(
    ordered: Sequence[Request], slo: SLO, cost: CostModel, size: int | None, cached: dict[str, int]
) -> tuple[AloneMiss, ...]:
    """The requests of ``ordered`` that miss ``slo`` alone with passes of ``size`` tokens."""
    out, stated = [], slo.bounds
    for r in ordered:
        hit = cached.get(r.id, 0)
        bounds = alone_bounds(r, cost, _passes(size, r.prompt_len - hit), hit)
        if not simulator.meets(stated, *bounds):
            out.append(AloneMiss(r.id, r.prompt_len, r.output_len, *bounds))
    return tuple(out)


def fewest(counted: Sequence[AloneMisses]) -> AloneMisses | None:
    """The deployment with the fewest requests missing alone (the first on a tie): the bound
    a search over all of them is held to (None: no deployment)."""
    return min(counted, key=lambda a: a.count) if counted else None


def unreachable_line(alone: AloneMisses) -> str:
    """The answer when no deployment can meet the SLO: how many requests miss it alone."""
    return (
        f"Unreachable: {alone.count:,} requests miss {alone.slo} even alone on an idle device "
        f"(on {alone.deployment}, the deployment where fewest do), more than the "
        f"{alone.allowed:,} of {alone.requests:,} that may miss for {alone.target:.0%}: "
        f"{alone.named()}. No rate on these deployments meets it; "
        "loosen the SLO or the target, or shorten those prompts."
    )
