"""The one loop that drives timed resources through time (the fast path's loop): at each
instant, end what ends then, let the caller retry what waits for room and hand out what
arrives, then start what is idle and has work. Every run goes through it: a colocated pool, a
disaggregated run's prefill side (its workers and the KV link) and its decode pool."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Protocol

from .fastpath import TimedWorker
from .requests import Request
from .router import LeastLoaded, PrefixRouter


class Timed(Protocol):
    """A resource the loop drives: its place (``index``, unique in a run), when its current
    work ends (None: idle), and how to start, cut short and end that work."""

    index: int
    busy_until: int | None

    def start(self, now: int) -> int | None: ...

    def truncate(self, horizon: int) -> bool: ...

    def end(self, now: int) -> None: ...


class Pool:
    """Up to ``size`` timed workers, made on first use by ``make(index)``, any other timed
    resource the run adds (:meth:`add`: the KV link, indexed from ``size`` on), and (colocated
    and decode pools) the ``router`` whose counts they keep: each worker's unfinished
    requests."""

    def __init__(
        self,
        size: int,
        make: Callable[[int], TimedWorker],
        router: LeastLoaded | PrefixRouter | None = None,
    ) -> None:
        self.size, self.make, self.router = size, make, router
        self.workers: list[TimedWorker] = []
        self.others = 0  # other resources: indexed from size on
        self._at: dict[int, Timed] = {}  # every resource by index
        self._heap: list[tuple[int, int]] = []  # (end, resource index); stale when it moved
        self._ready: list[Timed] = []
        self._one = False  # driven by _run_one: no heap

    def add(self, make: Callable[[int], Timed]) -> Timed:
        """Another timed resource, ``make(index)``: its index follows the workers'."""
        resource = self._at[self.size + self.others] = make(self.size + self.others)
        self.others += 1
        return resource

    def get(self, i: int) -> TimedWorker:
        while i >= len(self.workers):
            worker = self.make(len(self.workers))
            self.workers.append(worker)
            self._at[worker.index] = worker
        return self.workers[i]

    def give(self, worker: TimedWorker, now: int) -> None:
        """``worker`` was handed a request at ``now``: start it, or cut its decode run."""
        if self.router is not None:
            self.router.set(worker.index, worker.rules.unfinished)
        if worker.busy_until is None:
            self._ready.append(worker)
        elif worker.truncate(now) and not self._one:
            heapq.heappush(self._heap, (worker.busy_until, worker.index))

    def start(self, resource: Timed, now: int) -> int | None:
        """Start ``resource``'s next work at ``now``; when it ends (None: it stays idle)."""
        end = resource.start(now)
        if end is not None:
            heapq.heappush(self._heap, (end, resource.index))
        return end

    def run(
        self,
        arrivals: Sequence[tuple[int, Request]],
        place: Callable[[Request, int], None],
        retry: Callable[[int], None] | None = None,
        dispatch: Callable[[int], None] | None = None,
        stop: Callable[[int], bool] | None = None,
    ) -> bool:
        """Drive the resources until every arrival is placed and none has work: at each
        instant end what ends, ``retry`` (requests waiting for room), ``place`` what arrives,
        then start the idle workers that have work — or, given ``dispatch``, let it start
        what it chooses (a shared queue's order). ``stop(now)``, asked once what ends at an
        instant has ended: True stops the run there. Returns whether it stopped so."""
        if self.size == 1 and not self.others and dispatch is None:
            self._one = True
            return self._run_one(arrivals, place, retry, stop)
        heap, ready, router, workers, at = (
            self._heap,
            self._ready,
            self.router,
            self.workers,
            self._at,
        )
        push, pop = heapq.heappush, heapq.heappop
        keep = dispatch is None  # the ready list: dispatch chooses whom to start itself
        i, n = 0, len(arrivals)
        while True:
            # A run cut short left its old end in the heap: popped at that instant, it ends
            # nothing, and the instant does nothing else (no arrival, nothing freed or ready).
            if heap:
                t = heap[0][0]
                if i < n and arrivals[i][0] < t:
                    t = arrivals[i][0]
            elif i < n:
                t = arrivals[i][0]
            else:
                return False
            while heap and heap[0][0] == t:
                w = at[pop(heap)[1]]
                if w.busy_until != t:
                    continue
                if router is None:
                    w.end(t)
                else:  # a worker: the router counts its unfinished requests
                    rules = workers[w.index].rules
                    before = rules.unfinished
                    w.end(t)
                    if rules.unfinished != before:
                        router.set(w.index, rules.unfinished)
                if keep:
                    ready.append(w)
            if stop is not None and stop(t):
                return True
            if retry is not None:
                retry(t)
            while i < n and arrivals[i][0] == t:
                place(arrivals[i][1], t)
                i += 1
            if dispatch is not None:
                dispatch(t)
            elif ready:
                for w in ready:
                    if w.busy_until is None:
                        until = w.start(t)
                        if until is not None:
                            push(heap, (until, w.index))
                ready.clear()

    def _run_one(
        self,
        arrivals: Sequence[tuple[int, Request]],
        place: Callable[[Request, int], None],
        retry: Callable[[int], None] | None,
        stop: Callable[[int], bool] | None,
    ) -> bool:
        """:meth:`run` for a pool of one worker and nothing else: its end is the only one to
        wait for (no heap; a run cut short just moved it), and a router of one has no choice
        to keep counts for."""
        ready = self._ready
        i, n = 0, len(arrivals)
        w: TimedWorker | None = None
        while True:
            end = None if w is None else w.busy_until
            if end is not None and (i >= n or end <= arrivals[i][0]):
                t = end
                w.end(t)  # type: ignore[union-attr]
                kick = True
            elif i < n:
                t, kick = arrivals[i][0], False
            else:
                return False
            if stop is not None and stop(t):
                return True
            if retry is not None:
                retry(t)
            while i < n and arrivals[i][0] == t:
                place(arrivals[i][1], t)  # cuts a running decode run short if need be
                i += 1
            if ready:  # handed a request while idle
                kick = True
                ready.clear()
            if w is None:
                if not self.workers:
                    continue
                w = self.workers[0]
            if kick and w.busy_until is None:
                w.start(t)
