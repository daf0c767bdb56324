"""A simulation's results, compact and in ticks: what the workers and the prefill side kept.
:class:`Trace` reads them (events, records and token times built on first access; the summary
and the gap statistics never need them)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .events import LINK, Event, LogEntry
from .gaps import GapMultiset, GapRun
from .paged_worker import PagedWorker
from .prefill_pool import PrefillSide
from .requests import Request
from .rules import Worker
from .stop import Watch
from .ticks import from_ticks, to_ticks
from .trace import RequestRecord, Summary

Decoder = Worker | PagedWorker  # the rules of a worker that decodes


class SimResults:
    """The results of one simulation: its requests, the worker that decoded each one
    (``owner``), the decoding workers' rules (what they did), the ticks every compute worker
    was busy as the fast path counted them, and, under disaggregation, the prefill side."""

    def __init__(
        self,
        requests: list[Request],
        owner: Mapping[str, Decoder],
        workers: Sequence[Decoder],
        busy: int,
        prefill: PrefillSide | None = None,
    ) -> None:
        self.requests, self.owner, self.workers, self.prefill = requests, owner, workers, prefill
        names, logs = [w.name for w in workers], [w.log for w in workers]
        if prefill is not None:
            names, logs = prefill.resources + names, prefill.logs + logs
        self.names, self.logs = names, logs  # every resource and its log, in order
        # Busy ticks as the fast path counted them (not from the log: the oracle compares both).
        self.busy = busy
        self.stopped: str | None = None  # the verdict a run stopped on (see judged)
        self.misses = 0
        self._gaps: GapMultiset | None = None
        latest = max((log[-1].end for log in logs if log), default=0)  # each log by start
        try:
            from_ticks(latest)
        except OverflowError:
            raise ValueError(
                "the simulated run lasts beyond the float range (1.8e308 s): the cost model's "
                "terms or the arrivals are too large"
            ) from None

    def judged(self, watch: Watch | None, stopped: bool) -> SimResults:
        """These results, with the verdict ``watch`` reached (when the run ``stopped`` on it
        before every request finished) and the misses it knew then."""
        if watch is not None:
            self.misses = watch.missed
            if stopped and not watch.finished:
                self.stopped = watch.verdict
        return self

    def resources(self) -> tuple[str, ...]:
        return tuple(name for name, log in zip(self.names, self.logs) if log)

    def busy_time(self, resource: str | None = None) -> float:
        if resource is None:
            chosen = [log for name, log in zip(self.names, self.logs) if name != LINK]
        else:
            chosen = [log for name, log in zip(self.names, self.logs) if name == resource]
        return from_ticks(sum(e.end - e.start for log in chosen for e in log))

    def gaps(self) -> GapMultiset:
        """Every worker's token gaps, in one multiset."""
        if self._gaps is None:
            books = [w.tokens for w in self.workers]
            points: dict[int, int] = dict(books[0].gaps) if books else {}
            runs: list[GapRun] = []
            for book in books[1:]:
                for gap, k in book.gaps.items():
                    points[gap] = points.get(gap, 0) + k
            for book in books:
                runs += book.gap_runs
            self._gaps = GapMultiset(points, runs, owned=True)
        return self._gaps

    def summary(self) -> Summary:
        requests = self.requests
        arrival = {r.id: to_ticks(r.arrival, up=True) for r in requests}
        owner = self.owner
        if self.prefill is None or not self.prefill.finished:  # every request has an owner
            ttfts = [owner[r.id].tokens.first_token[r.id] - arrival[r.id] for r in requests]
            last = max((owner[r.id].tokens.finish[r.id] for r in requests), default=0)
        else:
            ttfts = [self.first_token(r) - arrival[r.id] for r in requests]
            last = max(self.finish(r) for r in requests)
        side = self.prefill
        return Summary.of(
            ttfts,
            self.gaps(),
            output_tokens=sum(r.output_len for r in requests),
            prefill_tokens=sum(r.prompt_len for r in requests),
            gpu_seconds=from_ticks(self.busy),
            makespan=from_ticks(last - min(arrival.values(), default=0)),
            cached_tokens=sum(sum(w.cached.values()) for w in self.workers)
            + (sum(side.cached.values()) if side else 0),
            preemptions=sum(len(v) for w in self.workers for v in w.preempted_at.values()),
            seconds=from_ticks,
        )

    def first_token(self, r: Request) -> int:
        """When ``r``'s first token came (ticks)."""
        w = self.owner.get(r.id)
        if w is None:  # done on the prefill side: its one token came from its pass
            assert self.prefill is not None
            return self.prefill.times[r.id].end
        return w.tokens.first_token[r.id]

    def finish(self, r: Request) -> int:
        """When ``r``'s last token came (ticks)."""
        w = self.owner.get(r.id)
        if w is None:
            assert self.prefill is not None
            return self.prefill.finished[r.id]
        return w.tokens.finish[r.id]

    def done(self, r: Request, w: Decoder | None) -> bool:
        """Whether ``r`` (decoded by ``w``, if any yet) has finished."""
        if w is None:
            return self.prefill is not None and r.id in self.prefill.finished
        return r.id in w.tokens.finish

    def entries(self) -> Iterator[LogEntry]:
        """The log by resource (in order), then by start."""
        return itertools.chain.from_iterable(self.logs)

    def events(self) -> tuple[Event, ...]:
        return tuple([entry.event() for entry in self.entries()])

    def steps(self) -> Iterator[Event]:
        """Every iteration as an event of its own, each step's times exact to the float."""
        for entry in self.entries():
            yield from entry.each_step()

    def records(self) -> dict[str, RequestRecord]:
        f = from_ticks
        out = {}
        side = self.prefill
        for r in self.requests:
            w = self.owner.get(r.id)
            if self.stopped is not None and not self.done(r, w):
                continue  # a run stopped early: its unfinished requests have no record
            if side is None:
                assert w is not None
                start, end = w.prefill_start[r.id], w.prefill_end[r.id]
                ready, where = end, w.name
            else:
                start, end, ready = side.times[r.id]
                where = side.names[r.id]
            if w is None:  # one token, from its prefill pass: it never left its prefill worker
                times: Any = (f(end),)
            else:
                times = lambda w=w, r=r: tuple([f(t) for t in w.token_times(r)])  # noqa: E731
            out[r.id] = RequestRecord(
                r.id,
                r.arrival,
                r.prompt_len,
                r.output_len,
                f(start),
                f(end),
                f(ready),
                where if w is None else w.name,
                times,
                where,
                first_token=f(self.first_token(r)),
                finish=f(self.finish(r)),
                **_paging(w, side, r.id),
            )
        return out


def _paging(worker: Decoder | None, side: PrefillSide | None, rid: str) -> dict[str, Any]:
    """A record's prefix-cache hits (on its prefill worker under disaggregation) and its
    preemption times (paged KV)."""
    out: dict[str, Any] = {}
    if worker is not None and rid in worker.preempted_at:
        out["preempted_at"] = tuple([from_ticks(t) for t in worker.preempted_at[rid]])
    cached = (side.cached if side is not None else worker.cached if worker else {}).get(rid)
    if cached is not None:
        out["cached_tokens"] = cached
    return out
