"""The prefill side of a disaggregated run, assembled: the prefill workers' rules and the link
(:mod:`.prefill_worker`), timed (:mod:`.fastpath`) and driven by the one loop (:mod:`.pool`).
It only feeds forward, so it runs first, on its own, and hands the decode pool the requests in
order of KV arrival."""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from .dispatch import Dispatcher
from .events import LINK, LogEntry
from .fastpath import TimedLink, TimedWorker
from .pool import Pool
from .prefill_worker import Link, PrefillWorker, take_in_order
from .profiles import LAB, EngineProfile
from .requests import Request
from .ticks import TickCost, to_ticks

_new_tuple = tuple.__new__  # a NamedTuple without its Python-level __new__ (one per request)


class PrefillTimes(NamedTuple):
    """When a request's prefill started and ended, and when its KV was ready on the decode
    side (ticks)."""

    start: int
    end: int
    kv_ready: int


class PrefillSide(NamedTuple):
    """What the prefill pool and the link did: the requests in order of KV arrival with its
    time, each request's times and prefill worker, the resources used (prefill workers, then
    the link) with their iterations and transfers (``logs``, aligned with ``resources``), the
    ticks the prefill workers computed in all, and (under the ``prefill`` first-token rule)
    the requests of one output token, done when their pass ended (never on the link)."""

    ready: list[tuple[int, Request]]
    times: dict[str, PrefillTimes]
    names: dict[str, str]
    resources: list[str]
    logs: list[list[LogEntry]]
    busy: int
    finished: dict[str, int]
    cached: dict[str, int] = {}  # noqa: RUF012  # prompt tokens the prefix cache supplied


class PrefillPool:
    """Up to ``size`` prefill workers (KV room ``capacity`` tokens each) and the link, under
    ``engine``'s rules (:mod:`.prefill_worker`), timed by ``tick``."""

    def __init__(
        self,
        requests: list[Request],
        tick: TickCost,
        size: int,
        capacity: float,
        engine: EngineProfile = LAB,
    ) -> None:
        self.requests, self.tick, self.size, self.capacity = requests, tick, size, capacity
        self.engine = engine

    def run(self) -> PrefillSide:
        if self.engine.prefill_dispatch != "shared" and self.size > 1:
            return self._run_dispatched()
        tick, size = self.tick, self.size
        queue: deque[Request] = deque()
        link = Link({r.id: k for k, r in enumerate(self.requests)})
        rules: list[PrefillWorker] = []

        def make(i: int) -> TimedWorker:
            rules.append(PrefillWorker(f"prefill{i}", self.engine, self.capacity, queue, link))
            return TimedWorker(i, rules[-1], tick)

        pool = Pool(size, make)
        timed_link = pool.add(lambda i: TimedLink(i, link, tick))

        def place(r: Request, now: int) -> None:
            queue.append(r)

        def dispatch(now: int) -> None:
            if link.ended:  # passes ended at this instant (arrivals never touch the link)
                link.queue_ended()
            if link.queue and timed_link.busy_until is None:
                pool.start(timed_link, now)
            if not queue:
                return
            workers = pool.workers
            if size == 1:  # one worker: no order to choose (take_in_order's, for one)
                w = workers[0] if workers else pool.get(0)
                if w.busy_until is None:
                    pool.start(w, now)
                return
            idle = [w for w in workers if w.busy_until is None]
            if idle or len(workers) < size:  # else every worker is busy: none takes
                take = lambda w: pool.start(w, now) is not None  # noqa: E731
                take_in_order(queue, idle, take, untouched)

        def untouched() -> TimedWorker | None:
            touched = len(pool.workers)
            return pool.get(touched) if touched < size else None

        arrivals = [(to_ticks(r.arrival, up=True), r) for r in self.requests]
        pool.run(arrivals, place, dispatch=dispatch)
        return self._side(link, rules, sum(w.busy for w in pool.workers))

    def _run_dispatched(self) -> PrefillSide:
        """Each worker its own queue (:mod:`.dispatch` picks it at arrival); a free worker
        takes from its own queue only."""
        tick, size = self.tick, self.size
        link = Link({r.id: k for k, r in enumerate(self.requests)})
        queues: list[deque[Request]] = [deque() for _ in range(size)]
        rules: list[PrefillWorker] = []

        def make(i: int) -> TimedWorker:
            rules.append(PrefillWorker(f"prefill{i}", self.engine, self.capacity, queues[i], link))
            return TimedWorker(i, rules[-1], tick)

        pool = Pool(size, make)
        timed_link = pool.add(lambda i: TimedLink(i, link, tick))
        workers = [pool.get(i) for i in range(size)]
        choose = Dispatcher(self.engine.prefill_dispatch, queues, rules)

        def place(r: Request, now: int) -> None:
            queues[choose.pick()].append(r)

        def dispatch(now: int) -> None:
            if link.ended:
                link.queue_ended()
            if link.queue and timed_link.busy_until is None:
                pool.start(timed_link, now)
            for i, w in enumerate(workers):
                if queues[i] and w.busy_until is None:
                    pool.start(w, now)

        arrivals = [(to_ticks(r.arrival, up=True), r) for r in self.requests]
        pool.run(arrivals, place, dispatch=dispatch)
        return self._side(link, rules, sum(w.busy for w in pool.workers))

    def _side(self, link: Link, rules: list[PrefillWorker], busy: int) -> PrefillSide:
        times: dict[str, PrefillTimes] = {}
        names: dict[str, str] = {}
        finished, cached = {}, {}
        ready = link.kv_ready
        for w in rules:
            ends = w.prefill_end
            for rid, start in w.prefill_start.items():
                end = ends[rid]
                times[rid] = _new_tuple(PrefillTimes, (start, end, ready.get(rid, end)))
            names.update(dict.fromkeys(w.prefill_start, w.name))
            finished.update(w.finished)
            cached.update(w.cached)
        return PrefillSide(
            link.ready,
            times,
            names,
            [w.name for w in rules] + [LINK],
            [*(w.log for w in rules), link.log],
            busy,
            finished,
            cached,
        )
