"""The prefill side of a disaggregated run: the prefill workers and the KV link (DESIGN.md,
"disaggregated"). It only feeds forward, so it runs first, on its own, and hands the decode
pool the requests in order of KV arrival."""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import NamedTuple

from .cost import attention_pairs
from .events import LINK, LogEntry
from .kv import KVReserve
from .profiles import LAB, EngineProfile
from .requests import Request
from .ticks import TickCost, to_ticks

_new_tuple = tuple.__new__  # a NamedTuple without its Python-level __new__ (hot path)


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
    """Up to ``size`` prefill workers and the link. A free prefill worker takes every waiting
    prompt that fits its KV room in one unchunked pass (FCFS; a head that fits no free worker
    waits, and so does everyone behind it); free workers keep taking until none has room for
    the head. Each finished prompt's KV crosses the link, one transfer at a time, FCFS by
    prefill end (ties: FCFS order); its reservation on the prefill worker is released when it
    has crossed. Workers are touched lowest index first, only when needed.

    Under an engine profile (DESIGN.md, "Engine semantics (v3)"): a pass takes whole prompts
    while they fit ``max_batched_tokens`` (at least one), a worker holds at most its
    ``seq_cap`` requests (in its pass or waiting for the link), and under the ``prefill``
    first-token rule the pass emits each prompt's first token at its end: a request of one
    output token is then done and its KV never crosses. Under ``prefix_caching`` (paged KV,
    unbounded memory: nothing is ever evicted) each prefill worker keeps the full blocks of the
    prompts it prefilled; a prompt's piece starts after the longest run of its leading blocks
    the worker holds (never its whole prompt), and only its other tokens count against the
    token budget."""

    def __init__(
        self,
        requests: list[Request],
        tick: TickCost,
        size: int,
        capacity: float,
        engine: EngineProfile = LAB,
    ) -> None:
        self.requests, self.tick, self.size, self.capacity = requests, tick, size, capacity
        limit = engine.max_batched_tokens
        self.token_budget: float = math.inf if limit is None else limit
        cap = engine.seq_cap
        self.seq_cap: float = math.inf if cap is None else cap
        self.prefill_first = engine.first_token == "prefill"
        self.caching = engine.prefix_caching
        self.entry_tokens = engine.prefix_block_tokens
        self.caches: list[set[object]] = []  # per prefill worker touched: blocks it holds
        self.cached: dict[str, int] = {}
        self.fcfs = {r.id: k for k, r in enumerate(requests)}
        self.pending: deque[Request] = deque()
        self.kv: list[KVReserve] = []  # per prefill worker touched so far
        self.held: list[int] = []  # requests held per prefill worker (in a pass or the link)
        self.finished: dict[str, int] = {}
        self.logs: list[list[LogEntry]] = []  # per prefill worker touched so far
        self.free: list[int] = []  # idle touched workers (a heap of indices)
        self.passes: list[tuple[int, int, list[Request]]] = []  # (end, worker, prompts): a heap
        self.link: deque[Request] = deque()  # prefilled, waiting for the link
        self.on_link: tuple[int, Request] | None = None  # (arrival, request)
        self.link_log: list[LogEntry] = []
        self.times: dict[str, PrefillTimes] = {}
        self.where: dict[str, int] = {}
        self.ready: list[tuple[int, Request]] = []
        self.busy = 0  # ticks the prefill workers computed, in all

    def run(self) -> PrefillSide:
        arrivals = [(to_ticks(r.arrival, up=True), r) for r in self.requests]
        i, n = 0, len(arrivals)
        passes, pending = self.passes, self.pending
        while True:  # each instant: passes end, a KV arrives, prompts arrive, work starts
            t = arrivals[i][0] if i < n else None
            if passes and (t is None or passes[0][0] < t):
                t = passes[0][0]
            on_link = self.on_link
            if on_link is not None and (t is None or on_link[0] < t):
                t = on_link[0]
            if t is None:
                break
            if passes and passes[0][0] == t:
                self._end_passes(t)
            if on_link is not None and on_link[0] == t:
                self._kv_arrived(on_link[1], t)
                self.on_link = None
            while i < n and arrivals[i][0] == t:
                pending.append(arrivals[i][1])
                i += 1
            if self.on_link is None and self.link:
                self._send(t)
            if pending and (self.free or len(self.kv) < self.size):
                self._start_passes(t)
        used = len(self.kv)
        return PrefillSide(
            self.ready,
            self.times,
            {rid: f"prefill{w}" for rid, w in self.where.items()},
            [f"prefill{w}" for w in range(used)] + [LINK],
            [*self.logs, self.link_log],
            self.busy,
            self.finished,
            self.cached,
        )

    def _end_passes(self, now: int) -> None:
        """End the passes that end ``now``: their prompts queue for the link, FCFS."""
        ended: list[Request] = []
        passes = self.passes
        while passes and passes[0][0] == now:
            _, w, batch = heapq.heappop(passes)
            ended.extend(batch)
            heapq.heappush(self.free, w)
        if self.prefill_first:  # each got its first token now; one token is all some need
            for r in ended:
                if r.output_len == 1:
                    self.finished[r.id] = now
                    self._release(r)
            ended = [r for r in ended if r.output_len > 1]
        ended.sort(key=lambda r: self.fcfs[r.id])
        self.link.extend(ended)

    def _release(self, r: Request) -> None:
        w = self.where[r.id]
        self.kv[w].release(r)
        self.held[w] -= 1

    def _kv_arrived(self, r: Request, now: int) -> None:
        w = self.where[r.id]
        self.kv[w].release(r)
        self.held[w] -= 1
        start, end, _ = self.times[r.id]
        self.times[r.id] = _new_tuple(PrefillTimes, (start, end, now))
        self.ready.append((now, r))

    def _send(self, now: int) -> None:
        """Put the next prefilled request's KV on the link, if it is free."""
        while self.on_link is None and self.link:
            r = self.link.popleft()
            duration = self.tick.transfer(r.prompt_len)
            if duration == 0:
                self._kv_arrived(r, now)  # a free link: the KV is usable where it was made
                continue
            self.on_link = (now + duration, r)
            self.link_log.append(
                LogEntry(
                    LINK, now, now + duration, "transfer", ((r, 0, r.prompt_len),), (), 0, 1, 0
                )
            )

    def _start_passes(self, now: int) -> None:
        """Free workers take what fits until none has room for the head; then untouched
        workers, lowest index first."""
        pending, free = self.pending, self.free
        progress = True
        while pending and progress:
            progress, full = False, []
            while pending and free:
                w = heapq.heappop(free)
                if self._take(w, now):
                    progress = True
                else:
                    full.append(w)  # no room for the head there: it stays free
            for w in full:
                heapq.heappush(free, w)
            while pending and len(self.kv) < self.size:
                self.kv.append(KVReserve(self.capacity))
                self.caches.append(set())
                self.held.append(0)
                self.logs.append([])
                progress = self._take(len(self.kv) - 1, now) or progress

    def _take(self, w: int, now: int) -> bool:
        """Worker ``w`` starts a pass over every waiting prompt that fits its KV room, its
        sequence slots and the token budget (FCFS; at least one prompt whatever its length);
        False if the head does not fit."""
        kv, pending, cap, room = self.kv[w], self.pending, self.seq_cap, self.token_budget
        held = self.held[w]
        batch: list[Request] = []
        pieces: list[tuple[Request, int, int]] = []
        tokens = pairs = context = 0
        while pending and held < cap and kv.fits(pending[0]):
            r = pending[0]
            hits = self._hits(w, r) if self.caching else 0
            n = r.prompt_len - hits
            if batch and tokens + n > room:
                break
            pending.popleft()
            kv.reserve(r)
            held += 1
            batch.append(r)
            pieces.append((r, hits, n))
            tokens += n
            pairs += attention_pairs(n, hits)
            context += hits
        if not batch:
            return False
        self.held[w] = held
        end = now + self.tick.price(tokens, pairs, context, 0, 0)
        self.busy += end - now
        times, where = self.times, self.where
        span = _new_tuple(PrefillTimes, (now, end, end))
        for r, hits, _ in pieces:
            times[r.id] = span
            where[r.id] = w
            if self.caching:  # w runs nothing else before this pass ends: enter them now
                self.cached[r.id] = hits
                self.caches[w].update(r.prefix_blocks[: r.prompt_len // self.entry_tokens])
        entry = (f"prefill{w}", now, end, "prefill", tuple(pieces), (), 0, 1, 0)
        self.logs[w].append(_new_tuple(LogEntry, entry))
        heapq.heappush(self.passes, (end, w, batch))
        return True

    def _hits(self, w: int, r: Request) -> int:
        """Prompt tokens of ``r`` worker ``w``'s cache supplies: the longest run of its leading
        full blocks there, never its whole prompt."""
        size, blocks, cache = self.entry_tokens, r.prefix_blocks, self.caches[w]
        most = min(len(blocks), (r.prompt_len - 1) // size)
        n = 0
        while n < most and blocks[n] in cache:
            n += 1
        return n * size
