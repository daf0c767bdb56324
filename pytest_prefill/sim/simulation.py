"""``simulate()``: a load replayed under a policy on devices described by a cost model. The
colocated policies run one pool of workers; disaggregation runs the prefill side first (it only
feeds forward), then the decode pool."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .capped_decode import CappedDecodeWorker
from .checks import check_int
from .cost import CostModel
from .events import Event, LogEntry
from .fastpath import TimedWorker
from .kv import kv_capacity
from .paged import check_paged
from .paged_decode import PagedDecodeWorker
from .paged_worker import PagedWorker
from .policies import check_options, worker_mode
from .pool import Pool
from .prefill_pool import PrefillPool, PrefillSide, PrefillTimes
from .profiles import LAB, EngineProfile, resolve_engine
from .requests import Request, validate_load
from .results import SimResults
from .router import ROUTERS, LeastLoaded, PrefixRouter
from .rules import Worker
from .stop import StopRule, Watch
from .ticks import TickCost, from_ticks, to_ticks
from .trace import Trace, no_collection


def colocated(
    requests: list[Request],
    tick: TickCost,
    policy: str,
    chunk: int | None,
    chunk_budget: float | None,
    replicas: int,
    capacity: float,
    engine: EngineProfile = LAB,
    router: str = "least-loaded",
    watch: Watch | None = None,
) -> SimResults:
    """``shared``, ``coscheduled`` or ``chunked`` on ``replicas`` workers; each request goes at
    arrival to the one with the fewest unfinished requests routed to it (ties: lowest index),
    or (``router="prefix"``, paged KV) the one whose cache holds its longest prefix. With
    ``watch``, the run stops once its verdict is fixed."""
    mode, tokens = worker_mode(policy, chunk)
    budget = to_ticks(chunk_budget) if policy == "chunked" and chunk_budget is not None else None

    # Paged KV with unbounded memory and nothing to share is the reservation rule exactly
    # (a test holds the two to it): the reserve worker's token book is faster.
    shares = engine.prefix_caching and any(r.prefix_blocks for r in requests)
    paged = engine.kv == "paged" and (shares or not math.isinf(capacity) or router == "prefix")

    decoders: list[Worker | PagedWorker] = []
    cached_runs: list[PagedWorker] = []  # what a prefix router reads

    def make(i: int) -> TimedWorker:
        name = "worker" if replicas == 1 else f"worker{i}"
        rules: Worker | PagedWorker
        if paged:
            rules = PagedWorker(name, mode, tokens, capacity, engine, router == "prefix")
            cached_runs.append(rules)
        else:
            price = tick.price if budget is not None else None
            rules = Worker(
                name, mode, tokens, capacity=capacity, budget=budget, price=price, engine=engine
            )
        decoders.append(rules)
        if watch is not None:
            rules.leaving = watch.leaving
        return TimedWorker(i, rules, tick)

    chooser = PrefixRouter(replicas) if router == "prefix" else LeastLoaded(replicas)
    pool = Pool(replicas, make, chooser if replicas > 1 else None)
    owner: dict[str, Worker | PagedWorker] = {}

    def pick(r: Request) -> int:
        if replicas == 1:
            return 0
        if isinstance(chooser, PrefixRouter):
            return chooser.pick_by(lambda i: cached_runs[i].cached_run(r))
        i = chooser.pick()
        assert i is not None  # no fits: always one
        return i

    def place(r: Request, now: int) -> None:
        w = pool.get(pick(r))
        owner[r.id] = decoders[w.index]
        decoders[w.index].admit(r)
        pool.give(w, now)

    stop = None if watch is None else _watching(watch, pool, owner)
    stopped = pool.run([(to_ticks(r.arrival, up=True), r) for r in requests], place, stop=stop)
    results = SimResults(requests, owner, decoders, sum(w.busy for w in pool.workers))
    return results.judged(watch, stopped)


def disaggregated(
    requests: list[Request],
    tick: TickCost,
    prefill_workers: int,
    decode_workers: int,
    capacity: float,
    engine: EngineProfile = LAB,
    watch: Watch | None = None,
    decode_tick: TickCost | None = None,
    decode_capacity: float | None = None,
) -> SimResults:
    """Prefill pool and link first (they only feed forward), then the decode pool: a request
    whose KV has arrived joins the decode worker with the fewest running plus joining requests
    among those with room (KV and a sequence slot; ties: lowest index), or waits, FCFS, until
    one has room. With ``watch``, the decode pool stops once the verdict is fixed. The decode
    pool's devices may differ from the prefill pool's: ``decode_tick`` and ``decode_capacity``
    (default: the prefill pool's)."""
    side = PrefillPool(requests, tick, prefill_workers, capacity, engine).run()
    mode = worker_mode("disaggregated").mode
    decoders: list[Worker | PagedDecodeWorker] = []
    if decode_tick is not None:
        tick = decode_tick
    if decode_capacity is not None:
        capacity = decode_capacity
    paged = engine.kv == "paged" and not math.isinf(capacity)  # else the reserve rule exactly

    def make(i: int) -> TimedWorker:
        name = f"decode{i}"
        if paged:
            decoders.append(PagedDecodeWorker(name, capacity, engine))
        elif engine.decode_max_kv_tokens is not None:
            decoders.append(CappedDecodeWorker(name, capacity, engine))
        else:
            decoders.append(Worker(name, mode, capacity=capacity, engine=engine))
        if watch is not None:
            decoders[-1].leaving = watch.leaving
        return TimedWorker(i, decoders[-1], tick)

    chooser = LeastLoaded(decode_workers)
    pool = Pool(decode_workers, make, chooser)
    owner: dict[str, Worker | PagedDecodeWorker] = {}
    waiting: deque[Request] = deque()
    bounded = not math.isinf(capacity) or engine.seq_cap is not None
    times = side.times if engine.first_token == "prefill" else None  # where first tokens are

    def assign(r: Request, now: int) -> bool:
        fits = (lambda i: decoders[i].has_room(r)) if bounded else None
        i = chooser.pick(fits)
        if i is None:
            return False
        w = pool.get(i)
        owner[r.id] = decoders[i]
        decoders[i].join(r, None if times is None else times[r.id].end)
        pool.give(w, now)
        return True

    def place(r: Request, now: int) -> None:
        if waiting or not assign(r, now):
            waiting.append(r)

    def retry(now: int) -> None:
        while waiting and assign(waiting[0], now):
            waiting.popleft()

    prefill_first = engine.first_token == "prefill"
    stop = None if watch is None else _watching(watch, pool, owner, side, prefill_first)
    stopped = pool.run(side.ready, place, retry if bounded else None, stop=stop)
    busy = side.busy + sum(w.busy for w in pool.workers)
    return SimResults(requests, owner, decoders, busy, side).judged(watch, stopped)


def _watching(
    watch: Watch,
    pool: Pool,
    owner: Mapping[str, Worker | PagedWorker],
    side: PrefillSide | None = None,
    prefill_first: bool = False,
) -> Callable[[int], bool]:
    """``watch``'s view of a run: each request's token times from the worker that decoded it,
    and the earliest start of an iteration in flight (no token it emits comes before it).
    Under disaggregation the prefill side has run: the requests done there are judged at
    once, and under the ``prefill`` rule so is every TTFT (each first token came from a
    prefill pass)."""
    ends = side.times if side is not None and prefill_first else None
    if side is not None:
        for r in watch.order:
            if r.id in side.finished:
                watch.judge(r, side.times[r.id].end, side.finished[r.id])
            elif ends is not None:
                watch.first_known(r, ends[r.id].end)

    def times(r: Request) -> tuple[int, int]:
        book = owner[r.id].tokens
        return book.first_token[r.id], book.finish[r.id]

    def first_token(r: Request) -> int | None:
        if ends is not None:
            return ends[r.id].end
        w = owner.get(r.id)
        return None if w is None else w.tokens.first_token.get(r.id)

    def floor(now: int) -> int:
        return min([w.started for w in pool.workers if w.busy_until is not None], default=now)

    watch.times, watch.first_token, watch.floor = times, first_token, floor
    return watch.check


def disaggregated_prefill(
    load: Iterable[Request], cost: CostModel, *, prefill_workers: int = 1, engine: Any = "lab"
) -> tuple[list[tuple[int, Request]], dict[str, tuple[float, float, float]], tuple[Event, ...]]:
    """The prefill pool and the link of a disaggregated run, as ``simulate`` runs them: the
    requests in order of KV arrival with its time in exact ticks (so a replay meets the
    boundaries the simulator meets), each request's (prefill start, prefill end, KV ready) in
    seconds, and the prefill and transfer events. For an engine that decodes for real."""
    check_int("prefill_workers", prefill_workers)
    profile = simulated_engine(engine)
    requests = validate_load(load)
    tick, capacity = TickCost(cost), cost.kv_capacity_tokens
    side = PrefillPool(requests, tick, prefill_workers, capacity, profile).run()
    entries: list[LogEntry] = [e for log in side.logs for e in log]
    return (
        list(side.ready),
        {rid: _seconds(times) for rid, times in side.times.items()},
        tuple([e.event() for e in entries]),
    )


def _seconds(times: PrefillTimes) -> tuple[float, float, float]:
    return from_ticks(times.start), from_ticks(times.end), from_ticks(times.kv_ready)


def simulate(
    policy: str,
    load: Iterable[Request],
    cost: CostModel,
    *,
    chunk: int | None = None,
    chunk_budget: float | None = None,
    replicas: int = 1,
    prefill_workers: int = 1,
    decode_workers: int = 1,
    engine: str | EngineProfile = "lab",
    router: str = "least-loaded",
    stop: StopRule | None = None,
    decode_cost: CostModel | None = None,
) -> Trace:
    """Replay ``load`` under ``policy`` on devices described by ``cost``.

    Args:
        policy: one of ``POLICIES``.
        load: the requests; their order does not matter (FCFS by arrival, then id).
        cost: the cost model (its ``kv_capacity_tokens`` bounds each worker's KV memory).
        chunk: prompt tokens per iteration for ``chunked`` (ignored by the other policies).
        chunk_budget: instead of ``chunk``, seconds per iteration for ``chunked``: each
            iteration takes the largest FCFS token count whose fused cost fits (at least one).
        replicas: independent workers of a colocated policy; a request goes at arrival to the
            one with the fewest unfinished requests routed to it (ties: lowest index).
        prefill_workers, decode_workers: pool sizes for ``disaggregated``.
        engine: the engine profile whose rules to run (a name from ``PROFILES`` or an
            :class:`EngineProfile`; default ``"lab"``, the lab's loop): its first-token rule,
            token budget (under which ``chunked`` needs no ``chunk``), sequence cap, KV
            rule and prefix cache.
        router: how replicas share requests: ``"least-loaded"`` (the fewest unfinished),
            or ``"prefix"`` (paged KV with prefix caching: the replica whose cache holds the
            longest run of the request's leading blocks; ties by fewest unfinished, then
            lowest index).
        stop: stop once the run's verdict against this SLO is fixed (:class:`StopRule`): the
            trace then says ``stopped`` (``"failed"``: more than ``allowed_misses`` requests
            missed; ``"passed"``: the unfinished can no longer push them past that) and
            ``misses`` (those known then), and holds the records of the requests finished by
            then only (its summary refuses). None (the default): run to the end.
        decode_cost: ``disaggregated`` only: the decode pool's own devices (another kind or
            TP: its terms time the decode steps, its ``kv_capacity_tokens`` bounds each decode
            worker); ``cost`` then describes the prefill pool and the KV link. None (the
            default): one cost model for both pools.

    Raises:
        ValueError: naming the field, for an unknown policy or engine, a missing or
            non-positive chunk or budget (or both), counts < 1, a non-Request or duplicate id
            in the load, a bad cost model, a request that can never fit the KV capacity, a
            knob not simulated yet, or a run whose times leave the float range.
    """
    profile = simulated_engine(engine)
    check_options(
        policy,
        chunk,
        chunk_budget,
        replicas,
        prefill_workers,
        decode_workers,
        max_batched_tokens=profile.max_batched_tokens,
    )
    if not isinstance(cost, CostModel):
        raise ValueError(f"cost must be a CostModel, got {type(cost).__name__}")
    _check_decode_cost(decode_cost, policy)
    with no_collection():
        requests = validate_load(load)
        _check_paged_options(profile, policy, chunk_budget, cost.kv_capacity_tokens)
        _check_router(router, profile)
        capacity = _capacity(requests, profile, cost)
        tick = TickCost(cost)
        watch = None if stop is None else Watch(_check_stop(stop), requests)
        if policy == "disaggregated":
            decode = _decode_pool(requests, profile, decode_cost)
            results = disaggregated(
                requests, tick, prefill_workers, decode_workers, capacity, profile, watch, *decode
            )
        else:
            results = colocated(
                requests,
                tick,
                policy,
                chunk,
                chunk_budget,
                replicas,
                capacity,
                profile,
                router,
                watch,
            )
    return Trace.of_run(policy, chunk, results, profile, results.stopped, results.misses)


def _capacity(requests: list[Request], profile: EngineProfile, cost: CostModel) -> float:
    """A worker's KV on ``cost``'s devices: blocks under paged KV, else tokens (inf: no
    limit); ValueError naming a request that can never fit."""
    if profile.kv == "paged":
        return check_paged(requests, profile, cost.kv_capacity_tokens)
    return kv_capacity(requests, cost)


def _decode_pool(
    requests: list[Request], profile: EngineProfile, decode_cost: CostModel | None
) -> tuple[TickCost | None, float | None]:
    """The decode pool's ticks and KV capacity on its own devices (None: the prefill pool's)."""
    if decode_cost is None:
        return None, None
    return TickCost(decode_cost), _capacity(requests, profile, decode_cost)


def _check_decode_cost(decode_cost: Any, policy: str) -> None:
    """ValueError naming ``decode_cost`` unless it is None, or a CostModel under
    ``disaggregated``."""
    if decode_cost is None:
        return
    if not isinstance(decode_cost, CostModel):
        raise ValueError(
            f"decode_cost must be a CostModel or None, got {type(decode_cost).__name__}"
        )
    if policy != "disaggregated":
        raise ValueError(
            f"decode_cost is the decode pool's cost model: policy 'disaggregated' only (got "
            f"{policy!r})"
        )


def _check_stop(stop: Any) -> StopRule:
    if not isinstance(stop, StopRule):
        raise ValueError(f"stop must be a StopRule or None, got {type(stop).__name__}")
    return stop


def simulated_engine(engine: Any) -> EngineProfile:
    """``engine`` as a profile the simulator runs (a name or an :class:`EngineProfile`).

    Raises:
        ValueError: for an unknown profile (listing the allowed ones), or prefix caching
            without paged KV, naming the knobs.
    """
    profile = resolve_engine(engine)
    if profile.prefix_caching and profile.kv != "paged":
        raise ValueError(
            f"prefix_caching=True needs kv='paged' (the cache holds KV blocks); engine "
            f"{profile.name!r} has kv={profile.kv!r}"
        )
    return profile


def _check_router(router: Any, profile: EngineProfile) -> None:
    """ValueError naming ``router`` for an unknown one, or ``"prefix"`` without a cache."""
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {', '.join(ROUTERS)}; got {router!r}")
    if router == "prefix" and not (profile.kv == "paged" and profile.prefix_caching):
        raise ValueError(
            f"router='prefix' needs kv='paged' and prefix_caching=True (engine {profile.name!r})"
        )


def _check_paged_options(
    profile: EngineProfile,
    policy: str,
    chunk_budget: Any,
    capacity: float,
) -> None:
    """What paged KV does not simulate yet, named (ValueError)."""
    if profile.kv != "paged":
        return
    if profile.decode_max_kv_tokens is not None:
        raise ValueError(
            f"decode_max_kv_tokens is simulated under kv='reserve' only (engine "
            f"{profile.name!r} has kv='paged')"
        )
    if chunk_budget is not None:
        raise ValueError(
            f"chunk_budget is not simulated under kv='paged' yet (engine {profile.name!r}); "
            "give chunk or a token budget (max_batched_tokens)"
        )
