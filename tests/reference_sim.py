"""A deliberately naive reference simulator: DESIGN.md's "Simulation semantics" read literally,
one iteration at a time, every worker looked at every instant, in exact integer ticks.

It shares nothing with ``simulate()`` but the tick conversion of the cost model's constants
(:class:`TickCost`, so that both work on the same numbers); the tests require the two to agree
exactly on every policy. Slow on purpose: clarity over speed.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from pytest_prefill.sim import LINK, CostModel, Request, TickCost, to_ticks


@dataclass
class W:  # one compute worker
    name: str
    pending: deque = field(default_factory=deque)  # arrived, not admitted (KV)
    waiting: list = field(default_factory=list)  # [request, tokens done], admitted
    joining: list = field(default_factory=list)
    running: list = field(default_factory=list)
    reserved: int = 0
    routed: int = 0  # requests handed here and not finished
    until: int | None = None  # end of the running iteration
    current: tuple | None = None  # (pieces [(r, done, n)], rows [r], kv, start)
    batch: list = field(default_factory=list)  # a prefill worker's prompts in flight


def need(r: Request) -> int:
    return r.prompt_len + r.output_len


class Reference:
    def __init__(self, cost: CostModel, chunk=None, budget=None):
        self.k = TickCost(cost)  # constants only
        self.pen = cost.fusion_penalty.as_integer_ratio()
        self.cap = cost.kv_capacity_tokens
        self.chunk = chunk
        self.budget = None if budget is None else to_ticks(budget)
        self.events: list[tuple] = []  # (resource, start, end, kind, pieces (id, T, C), ids, K)
        self.tokens: dict[str, list[int]] = {}
        self.prefill: dict[str, list] = {}  # id -> [start, end, ready, prefill worker name]
        self.decoder: dict[str, str] = {}
        self.emitted: dict[str, int] = {}

    # -- the cost model, written out once more ------------------------------------------------
    def compute(self, pieces, rows):
        k = self.k
        tokens = sum(n for _, _, n in pieces)
        pairs = sum(n * c + n * (n + 1) // 2 for _, c, n in pieces)
        context = sum(c for _, c, _ in pieces)
        return k.overhead + k.per_token * (tokens + rows) + k.per_pair * pairs + k.per_kv * context

    def cost(self, pieces, rows, kv):
        decode = self.k.base + self.k.per_seq * (len(rows) - 1) + self.k.per_kv * kv if rows else 0
        if not pieces:
            return decode
        compute = self.compute(pieces, len(rows))
        if not rows:
            return compute
        num, den = self.pen
        return max(decode, compute) + min(decode, compute) * num // den

    # -- one worker's next iteration --------------------------------------------------------
    def compose(self, w: W, mode: str):
        w.running += w.joining
        w.joining = []
        while w.pending and w.reserved + need(w.pending[0]) <= self.cap:
            w.reserved += need(w.pending[0])
            w.waiting.append([w.pending.popleft(), 0])
        rows = list(w.running) if mode != "shared" or not w.waiting else []
        kv = sum(r.prompt_len + self.emitted[r.id] for r in rows)
        if mode == "decode" or not w.waiting:
            return ([], rows, kv) if rows else None
        total = sum(r.prompt_len - done for r, done in w.waiting)
        if mode == "shared" or (self.chunk is None and self.budget is None):
            take = total
        elif self.budget is None:
            take = min(self.chunk, total)
        else:  # the largest FCFS count within the budget, at least one token
            take = max(
                [
                    t
                    for t in range(1, total + 1)
                    if self.cost(self.pieces(w, t), rows, kv) <= self.budget
                ]
                or [1]
            )
        return self.pieces(w, take), rows, kv

    def pieces(self, w: W, take: int):
        out = []
        for r, done in w.waiting:
            n = min(r.prompt_len - done, take)
            if n <= 0:
                break
            out.append((r, done, n))
            take -= n
        return out

    def start(self, w: W, mode: str, t: int):
        plan = self.compose(w, mode)
        if plan is None:
            return
        pieces, rows, kv = plan
        w.current = (pieces, rows, kv, t)
        w.until = t + self.cost(pieces, rows, kv)
        for r, _, _ in pieces:
            self.prefill.setdefault(r.id, [t, None, None, w.name])

    def end(self, w: W, t: int):
        pieces, rows, kv, start = w.current
        kind = "decode" if not pieces else ("fused" if rows else "prefill")
        self.events.append(
            (
                w.name,
                start,
                t,
                kind,
                tuple((r.id, n, c) for r, c, n in pieces),
                tuple(r.id for r in rows),
                kv,
            )
        )
        for r, done, n in pieces:
            for entry in w.waiting:
                if entry[0] is r:
                    entry[1] += n
            if done + n == r.prompt_len:
                w.waiting = [e for e in w.waiting if e[0] is not r]
                self.prefill[r.id][1:3] = [t, t]
                w.joining.append(r)
        for r in rows:
            self.tokens[r.id].append(t)
            self.emitted[r.id] += 1
            if self.emitted[r.id] == r.output_len:
                w.running.remove(r)
                w.reserved -= need(r)
                w.routed -= 1
        w.current, w.until = None, None

    def least(self, workers, ok=lambda w: True):
        fit = [w for w in workers if ok(w)]
        return min(fit, key=lambda w: (w.routed, workers.index(w))) if fit else None

    # -- colocated policies -------------------------------------------------------------------
    def colocated(self, load, mode, replicas):
        workers = [W("worker" if replicas == 1 else f"worker{i}") for i in range(replicas)]
        arrivals = sorted(load, key=lambda r: (r.arrival, r.id))
        for r in arrivals:
            self.tokens[r.id], self.emitted[r.id] = [], 0
        times = {to_ticks(r.arrival, up=True) for r in arrivals}
        while True:
            candidates = times | {w.until for w in workers if w.until is not None}
            if not candidates:
                return workers
            t = min(candidates)
            times.discard(t)
            for w in workers:
                if w.until == t:
                    self.end(w, t)
            for r in arrivals:
                if to_ticks(r.arrival, up=True) == t:
                    w = self.least(workers)
                    w.pending.append(r)
                    w.routed += 1
                    self.decoder[r.id] = w.name
            for w in workers:
                if w.until is None:
                    self.start(w, mode, t)

    # -- disaggregation -----------------------------------------------------------------------
    def disaggregated(self, load, prefill_workers, decode_workers):
        pre = [W(f"prefill{i}") for i in range(prefill_workers)]
        dec = [W(f"decode{i}") for i in range(decode_workers)]
        arrivals = sorted(load, key=lambda r: (r.arrival, r.id))
        order = {r.id: i for i, r in enumerate(arrivals)}
        for r in arrivals:
            self.tokens[r.id], self.emitted[r.id] = [], 0
        queue, link, joins = deque(), deque(), deque()
        on_link = None  # (end, request, start)
        todo = {to_ticks(r.arrival, up=True) for r in arrivals}
        owner = {}
        while True:
            ends = [w.until for w in pre + dec if w.until is not None]
            if on_link:
                ends.append(on_link[0])
            if not todo and not ends:
                return pre, dec
            t = min(todo | set(ends))
            todo.discard(t)
            done = []
            for w in pre:
                if w.until == t:
                    self.events.append(
                        (
                            w.name,
                            w.current[3],
                            t,
                            "prefill",
                            tuple((r.id, r.prompt_len, 0) for r in w.batch),
                            (),
                            0,
                        )
                    )
                    for r in w.batch:
                        self.prefill[r.id][1] = t
                    done += w.batch
                    w.batch, w.until = [], None
            link.extend(sorted(done, key=lambda r: order[r.id]))
            for w in dec:
                if w.until == t:
                    self.end(w, t)
            if on_link and on_link[0] == t:
                r = on_link[1]
                self.events.append(
                    (LINK, on_link[2], t, "transfer", ((r.id, r.prompt_len, 0),), (), 0)
                )
                owner[r.id].reserved -= need(r)
                self.prefill[r.id][2] = t
                joins.append(r)
                on_link = None
            for r in arrivals:
                if to_ticks(r.arrival, up=True) == t:
                    queue.append(r)
            while on_link is None and link:
                r = link.popleft()
                d = self.k.latency + self.k.per_transfer * r.prompt_len
                if d == 0:  # a free link: ready where it was made
                    owner[r.id].reserved -= need(r)
                    self.prefill[r.id][2] = t
                    joins.append(r)
                else:
                    on_link = (t + d, r, t)
            while joins:
                w = self.least(dec, lambda w: w.reserved + need(joins[0]) <= self.cap)
                if w is None:
                    break
                r = joins.popleft()
                w.joining.append(r)
                w.reserved += need(r)
                w.routed += 1
                self.decoder[r.id] = w.name
            progress = True
            while queue and progress:  # free workers take what fits, until none can
                progress = False
                for w in pre:
                    if w.until is None and queue:
                        while queue and w.reserved + need(queue[0]) <= self.cap:
                            r = queue.popleft()
                            w.reserved += need(r)
                            w.batch.append(r)
                            owner[r.id] = w
                            self.prefill[r.id] = [t, None, None, w.name]
                        if w.batch:
                            progress = True
                            pieces = [(r, 0, r.prompt_len) for r in w.batch]
                            w.current = (pieces, [], 0, t)
                            w.until = t + self.compute(pieces, 0)
            for w in dec:
                if w.until is None:
                    self.start(w, "decode", t)


def reference(
    policy,
    load,
    cost,
    *,
    chunk=None,
    chunk_budget=None,
    replicas=1,
    prefill_workers=1,
    decode_workers=1,
) -> Reference:
    """Run the reference; read ``.events``, ``.tokens``, ``.prefill`` and ``.decoder``."""
    ref = Reference(
        cost, chunk if policy == "chunked" else None, chunk_budget if policy == "chunked" else None
    )
    if not math.isinf(ref.cap):
        ref.cap = int(ref.cap)
    if policy == "disaggregated":
        ref.disaggregated(load, prefill_workers, decode_workers)
    else:
        ref.colocated(load, "shared" if policy == "shared" else "chunked", replicas)
    return ref
