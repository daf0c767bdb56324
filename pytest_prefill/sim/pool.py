"""Workers driven through time together (the fast path's loop): at each instant, end the
iterations that end then, hand out what arrives, then start every idle worker that has work."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence

from .fastpath import TimedWorker
from .requests import Request
from .router import LeastLoaded, PrefixRouter


class Pool:
    """Workers driven through time together: at each instant, end the iterations that end then,
    hand out what arrives, then start every idle worker that has work."""

    def __init__(
        self, size: int, make: Callable[[int], TimedWorker], *, prefix: bool = False
    ) -> None:
        self.make = make
        self.workers: list[TimedWorker] = []
        self.router: LeastLoaded | PrefixRouter = (
            PrefixRouter(size) if prefix else LeastLoaded(size)
        )
        self._heap: list[tuple[int, int]] = []  # (end, worker index); stale when it moved
        self._ready: list[TimedWorker] = []

    def _run_one(
        self,
        arrivals: Sequence[tuple[int, Request]],
        place: Callable[[Request, int], None],
        retry: Callable[[int], None] | None,
    ) -> None:
        """:meth:`run` for a pool of one worker: no heap, no router to keep."""
        ready = self._ready
        i, n = 0, len(arrivals)
        w: TimedWorker | None = None
        while True:
            end = None if w is None else w.busy_until
            if end is not None and (i >= n or end <= arrivals[i][0]):
                t = end
                w.end(t)  # type: ignore[union-attr]
                if retry is not None:
                    retry(t)
            elif i < n:
                t = arrivals[i][0]
            else:
                return
            while i < n and arrivals[i][0] == t:
                place(arrivals[i][1], t)  # cuts a running decode run short if need be
                i += 1
            ready.clear()
            w = self.workers[0]
            if w.busy_until is None:
                w.start(t)

    def get(self, i: int) -> TimedWorker:
        while i >= len(self.workers):
            self.workers.append(self.make(len(self.workers)))
        return self.workers[i]

    def give(self, worker: TimedWorker, now: int) -> None:
        """``worker`` was handed a request at ``now``: start it, or cut its decode run."""
        self.router.set(worker.index, worker.unfinished)
        if worker.busy_until is None:
            self._ready.append(worker)
        elif worker.truncate(now):
            heapq.heappush(self._heap, (worker.busy_until, worker.index))

    def run(
        self,
        arrivals: Sequence[tuple[int, Request]],
        place: Callable[[Request, int], None],
        retry: Callable[[int], None] | None = None,
    ) -> None:
        """Drive the workers until every arrival is placed and no worker has work: at each
        instant end the iterations that end, ``retry`` (requests waiting for room), ``place``
        what arrives, then start the idle workers that have work."""
        if self.router.size == 1:
            self._run_one(arrivals, place, retry)
            return
        heap, ready, workers, router = self._heap, self._ready, self.workers, self.router
        i, n = 0, len(arrivals)
        while True:
            while heap and workers[heap[0][1]].busy_until != heap[0][0]:
                heapq.heappop(heap)  # a run that was cut short
            if heap:
                t = heap[0][0]
                if i < n and arrivals[i][0] < t:
                    t = arrivals[i][0]
            elif i < n:
                t = arrivals[i][0]
            else:
                return
            while heap and heap[0][0] == t:
                w = workers[heapq.heappop(heap)[1]]
                if w.busy_until == t:
                    before = w.unfinished
                    w.end(t)
                    if w.unfinished != before:
                        router.set(w.index, w.unfinished)
                    ready.append(w)
            if retry is not None:
                retry(t)
            while i < n and arrivals[i][0] == t:
                place(arrivals[i][1], t)
                i += 1
            for w in ready:
                if w.busy_until is None:
                    end = w.start(t)
                    if end is not None:
                        heapq.heappush(heap, (end, w.index))
            ready.clear()
