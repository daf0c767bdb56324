"""The oracle's checks of paged KV and the prefix cache (DESIGN.md, "Engine semantics (v3)",
Invariants), from the trace alone: each prefill attempt of a request (its first, and one after
each preemption) starts at a context the cache could supply and covers exactly its prompt plus
the tokens emitted before it; cached tokens are never computed; the blocks the admitted
requests hold never exceed a worker's pool."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from .events import LINK, Event
from .paged import block_capacity, blocks_for
from .profiles import EngineProfile
from .requests import Request
from .trace import RequestRecord


class Attempts:
    """Each request's prefill attempts, walked in time order: ``target`` (prompt plus the
    tokens emitted before the attempt), ``done`` (its tokens so far; None: not started),
    ``emitted`` (tokens so far), and the problems found."""

    def __init__(
        self, records: dict[str, RequestRecord], requests: dict[str, Request], engine: EngineProfile
    ) -> None:
        self.records, self.requests, self.engine = records, requests, engine
        self.target = {rid: r.prompt_len for rid, r in requests.items()}
        self.done: dict[str, int | None] = {rid: None for rid in requests}
        self.preempted = {rid: list(rec.preempted_at) for rid, rec in records.items()}
        self.attempts = {rid: 0 for rid in requests}
        self.cached_on: dict[str, set[object]] = {}  # worker -> full blocks of prompts done
        self.problems: list[str] = []

    def before(self, rid: str, start: float, emitted: int) -> None:
        """Apply the preemptions of ``rid`` at or before ``start``: a new attempt follows."""
        times = self.preempted.get(rid)
        while times and times[0] <= start:
            times.pop(0)
            self.target[rid] = self.requests[rid].prompt_len + emitted
            self.done[rid] = None

    def row(self, rid: str, start: float, emitted: int) -> None:
        """A decode row of ``rid`` at ``start``: its latest prefill attempt must be complete."""
        self.before(rid, start, emitted)
        if self.done[rid] != self.target[rid]:
            self.problems.append(f"{rid} decodes at {start} before its prefill completed")

    def piece(self, e: Event, rid: str, tokens: int, context: int | None) -> bool:
        """A prompt piece of ``rid``; returns True if it completes the attempt."""
        r, done = self.requests[rid], self.done[rid]
        if done is None:  # a fresh attempt: its context is what the cache supplied
            done = self._start(e, r, context)
        elif context is not None and context != done:
            self.problems.append(f"{rid}'s piece at {e.start} has context {context}, not {done}")
        done += tokens
        self.done[rid] = done
        if done > self.target[rid]:
            self.problems.append(
                f"{rid} prefilled {done} tokens in an attempt of {self.target[rid]} (its prompt "
                "and the tokens emitted before it)"
            )
        if done == self.target[rid]:
            blocks = r.prefix_blocks[: r.prompt_len // self.engine.prefix_block_tokens]
            self.cached_on.setdefault(e.resource, set()).update(blocks)
            return True
        return False

    def _start(self, e: Event, r: Request, context: int | None) -> int:
        hits = context or 0
        size = self.engine.prefix_block_tokens
        first = self.attempts[r.id] == 0
        self.attempts[r.id] += 1
        rec = self.records.get(r.id)
        if first and rec is not None and hits != rec.cached_tokens:
            self.problems.append(
                f"{r.id} starts at context {hits} but its record says {rec.cached_tokens} "
                "tokens were cached"
            )
        if not hits:
            return 0
        blocks = r.prefix_blocks[: hits // size]
        held = self.cached_on.get(e.resource, set())
        if (
            not self.engine.prefix_caching
            or hits % size
            or hits >= self.target[r.id]
            or len(blocks) * size != hits
            or not all(b in held for b in blocks)
        ):
            self.problems.append(
                f"{r.id}'s attempt at {e.start} skips {hits} tokens that no cache on "
                f"{e.resource} held (cached tokens must be whole blocks a completed prompt there "
                "entered, fewer than the attempt's tokens)"
            )
        return hits

    def finish(self) -> list[str]:
        for rid in self.requests:
            if rid not in self.records:
                continue
            if self.preempted[rid]:
                self.problems.append(f"{rid} has a preemption after its last iteration")
            if self.done[rid] != self.target[rid]:
                self.problems.append(
                    f"{rid}'s last attempt prefilled {self.done[rid] or 0} tokens, expected "
                    f"{self.target[rid]} (its prompt and the tokens emitted before it)"
                )
            if self.records[rid].preemptions != len(self.records[rid].preempted_at):
                self.problems.append(f"{rid}'s preemption count is not its preemption times")
        return self.problems


def blocks_in_use(
    events: Iterable[Event],
    records: dict[str, RequestRecord],
    requests: dict[str, Request],
    engine: EngineProfile,
    capacity_tokens: float,
    pools: Mapping[str, float] | None = None,
) -> list[str]:
    """No worker's admitted requests hold more blocks than its pool, counted as the least
    they can be: each request's tokens held by then in ``kv_block_tokens`` blocks, its full
    prompt blocks once per worker (they may be shared through the cache); under
    disaggregation a prefill worker holds a prompt until its KV has crossed. Each worker's
    pool is ``capacity_tokens`` of KV, or its own in ``pools`` (worker -> KV tokens: a
    disaggregated run's decode workers on devices of their own)."""
    pool_of = {} if pools is None else pools
    if math.isinf(capacity_tokens) and all(math.isinf(c) for c in pool_of.values()):
        return []
    size, entry = engine.kv_block_tokens, engine.prefix_block_tokens
    by_worker: dict[str, list[Event]] = {}
    for e in events:
        if e.resource != LINK:
            by_worker.setdefault(e.resource, []).append(e)
    problems = []
    for worker, evs in by_worker.items():
        capacity = block_capacity(pool_of.get(worker, capacity_tokens), engine.kv_block_tokens)
        if math.isinf(capacity):
            continue
        held: dict[str, int] = {}  # request -> tokens held
        emitted: dict[str, int] = {}
        last: dict[str, float] = {}  # request -> start of the latest event it was in
        for e in sorted(evs, key=lambda e: e.start):
            for rid in list(held):
                rec, seen = records[rid], last[rid]
                # a prefill worker of its own lets it go when its KV has crossed
                sent = rec.prefill_resource == worker != rec.decode_resource
                until = rec.kv_ready if sent else rec.finish
                if until <= e.start or any(seen < t <= e.start for t in rec.preempted_at):
                    del held[rid]
            for rid in e.request_ids:
                last[rid] = e.start
            for rid, tokens in e.prefill:
                k = e.prefill.index((rid, tokens))
                context = e.contexts[k] if k < len(e.contexts) else 0
                held[rid] = context + tokens
            for rid in e.decode_ids:
                r = requests.get(rid)
                if r is not None:
                    held[rid] = r.prompt_len + emitted.get(rid, 0) + e.count - 1
            for rid in e.decode_ids:
                emitted[rid] = emitted.get(rid, 0) + e.count
            shared: set[object] = set()
            own = 0
            for rid, tokens in held.items():
                r = requests[rid]
                full = min(len(r.prefix_blocks), tokens // entry, r.prompt_len // entry)
                shared.update(r.prefix_blocks[:full])
                own += blocks_for(tokens - full * entry, size)
            used = own + len(shared) * (entry // size if entry % size == 0 else 1)
            if used > capacity:
                problems.append(
                    f"{worker} holds at least {used} KV blocks at {e.start}, over its {capacity}"
                )
                break
    return problems
