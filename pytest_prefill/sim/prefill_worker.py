"""The prefill side of a disaggregated run, its rules (DESIGN.md, "disaggregated"): prefill
workers that take whole prompts from one shared queue, which free worker takes next, and the
KV link. The fast path times them (:mod:`.fastpath`) and the one loop drives them
(:mod:`.pool`, assembled by :mod:`.prefill_pool`).

A free prefill worker takes every waiting prompt that fits its KV room in one unchunked pass
(FCFS; a head that fits no free worker waits, and so does everyone behind it); free workers
keep taking until none has room for the head, then untouched workers do, lowest index first.
Each finished prompt's KV crosses the link, one transfer at a time, FCFS by prefill end (ties:
FCFS order); its reservation on the prefill worker is released when it has crossed.

Under an engine profile (DESIGN.md, "Engine semantics (v3)"): a pass takes whole prompts
while they fit ``max_batched_tokens`` (at least one), a worker holds at most its ``seq_cap``
requests (in its pass or waiting for the link), and under the ``prefill`` first-token rule the
pass emits each prompt's first token at its end: a request of one output token is then done
and its KV never crosses. Under ``prefix_caching`` (paged KV) each prefill worker keeps the full blocks of the prompts it prefilled; a prompt's piece
starts after the longest run of its leading blocks the worker holds (never its whole prompt),
and only its other tokens count against the token budget. Under paged KV with bounded memory
(:class:`~.paged_decode.PromptBlocks`) a prompt holds the blocks of its uncached tokens from
admission until its KV has crossed, and the cache's blocks no prompt shares are evicted, least
recently used first, when a prompt needs room."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from .events import LINK, LogEntry
from .kv import KVReserve
from .paged_decode import PromptBlocks
from .profiles import EngineProfile
from .requests import Request
from .rules import BaseWorker, Plan, takes_whole

_new_tuple = tuple.__new__  # a NamedTuple without its Python-level __new__ (hot path)
T = TypeVar("T")


class Link:
    """The KV link's rules and what the prefill side did: prompts whose pass ended wait in
    ``queue`` (those of one instant enter it together, FCFS by ``order``), one transfer at a
    time; a KV that has crossed frees its reservation on the prefill worker that made it and
    the request is ``ready`` for the decode pool (with its time)."""

    __slots__ = ("order", "queue", "ended", "where", "kv_ready", "ready", "log")

    def __init__(self, order: dict[str, int]) -> None:
        self.order = order  # request id -> FCFS position
        self.queue: deque[Request] = deque()  # prefilled, waiting for the link
        self.ended: list[Request] = []  # prefilled at this instant, not queued yet
        self.where: dict[str, PrefillWorker] = {}
        self.kv_ready: dict[str, int] = {}
        self.ready: list[tuple[int, Request]] = []
        self.log: list[LogEntry] = []

    def queue_ended(self) -> None:
        """The prompts whose passes ended at this instant join the queue, FCFS."""
        ended = self.ended
        if len(ended) > 1:
            ended.sort(key=lambda r: self.order[r.id])
        self.queue.extend(ended)
        ended.clear()

    def sent(self, r: Request, start: Any, end: Any) -> None:
        """``r``'s KV is on the link from ``start`` to ``end``."""
        entry = (LINK, start, end, "transfer", ((r, 0, r.prompt_len),), (), 0, 1, 0)
        self.log.append(_new_tuple(LogEntry, entry))

    def arrived(self, r: Request, now: Any) -> None:
        """``r``'s KV arrived at ``now``: its prefill worker lets it go."""
        self.where[r.id].release(r)
        self.kv_ready[r.id] = now
        self.ready.append((now, r))


class PrefillWorker(BaseWorker):
    """One prefill worker's rules: when free, a pass over the waiting prompts of the shared
    ``queue`` that fit its KV room (``capacity`` tokens, reserved until the KV has crossed the
    link), its sequence slots and the token budget (see the module's docstring). ``finished``:
    the requests of one output token its passes completed (the ``prefill`` rule), and when."""

    __slots__ = ("kv", "blocks", "link", "caching", "finished")

    def __init__(
        self,
        name: str,
        engine: EngineProfile,
        capacity: float,
        queue: deque[Request],
        link: Link,
    ) -> None:
        super().__init__(name, "shared", math.inf, engine)
        self.pending = queue  # shared by the prefill workers
        # Paged KV: ``capacity`` is in blocks, held by prompts and the prefix cache.
        self.blocks = PromptBlocks(capacity, engine) if engine.kv == "paged" else None
        self.kv = KVReserve(capacity if self.blocks is None else math.inf)
        self.link = link
        self.caching = engine.prefix_caching
        self.finished: dict[str, Any] = {}

    def compose(self, now: Any) -> Plan | None:
        """A pass over the waiting prompts that fit here, whole, FCFS (at least one whatever
        its length); None if the head does not fit."""
        queue, kv, cap = self.pending, self.kv, self.max_seqs
        limit = math.inf if self.max_batched_tokens is None else self.max_batched_tokens
        room = limit
        pieces: list[tuple[Request, int, int]] = []
        context = 0
        caching, starts, where, admitted = self.caching, self.prefill_start, self.link.where, 0
        blocks = self.blocks
        while queue and self.admitted + admitted < cap:
            r = queue[0]
            if not (kv.fits(r) if blocks is None else blocks.fits(r)):
                break
            hits = blocks.hit_blocks(r) * blocks.entry_tokens if blocks is not None else 0
            n = r.prompt_len - hits
            if not takes_whole(n, room, bool(pieces), 0, limit):
                break
            queue.popleft()
            if blocks is None:
                kv.reserve(r)
            else:
                blocks.reserve(r)
            admitted += 1
            pieces.append((r, hits, n))
            room -= n
            context += hits
            starts[r.id] = now
            where[r.id] = self
            if caching:
                self.cached[r.id] = hits
        self.admitted += admitted
        self.started = now
        plan = None
        if pieces:
            completed = tuple([r for r, _, _ in pieces])
            plan = _new_tuple(Plan, (tuple(pieces), (), 0, context, completed))
        self.current = plan
        return plan

    def steady_steps(self) -> int:
        return 1  # a prefill worker never decodes

    def complete(self, end: Any, steps: int, first: Any, growth: Any) -> tuple[Request, ...]:
        """The pass ended: its prompts' blocks enter the cache; under the ``prefill`` rule
        each got its first token now, and one token is all some need; the others' KV queues
        for the link."""
        plan = self.current
        assert plan is not None, "finish an iteration only after composing it"
        self.logged(plan, end, steps, growth)
        for r in plan.completed:
            self.prefill_end[r.id] = end
            if self.caching and self.blocks is not None:
                self.blocks.cache(r)
            if self.prefill_first and r.output_len == 1:
                self.finished[r.id] = end
                self.release(r)
            else:
                self.link.ended.append(r)
        return plan.completed

    def release(self, r: Request) -> None:
        """``r`` leaves this worker (its KV crossed, or it is done): its reservation and its
        slot are free."""
        if self.blocks is None:
            self.kv.release(r)
        else:
            self.blocks.release(r)
        self.admitted -= 1


def take_in_order(
    queue: deque[Request],
    idle: list[T],
    take: Callable[[T], bool],
    untouched: Callable[[], T | None],
) -> None:
    """Which prefill workers take from ``queue`` at an instant: the ``idle`` ones (touched,
    free), lowest index first, each taking what fits (``take``: False if the head does not
    fit there); then ``untouched()`` ones (None: no more), lowest index first; again while
    anyone took and prompts wait."""
    progress = True
    while queue and progress:
        progress, left = False, []
        for k, w in enumerate(idle):
            if not queue:
                left.extend(idle[k:])
                break
            if take(w):
                progress = True
            else:
                left.append(w)  # no room for the head there: it stays free
        idle = left
        while queue:
            new = untouched()
            if new is None:
                break
            progress = take(new) or progress
