"""A deliberately naive reference simulator: DESIGN.md's "Simulation semantics" and "Engine
semantics (v3)" read literally, one iteration at a time, every worker looked at every instant,
in exact integer ticks.

It shares nothing with ``simulate()`` but the tick conversion of the cost model's constants
(:class:`TickCost`, so that both work on the same numbers) and the profile's knob values; the
tests require the two to agree exactly on every policy. Slow on purpose: clarity over speed.

The engine knobs, as written here:
- first_token "prefill": the iteration that completes a prompt emits its first token at its
  end; "decode": the first token ends the first decode step after the prefill.
- max_batched_tokens B: an iteration's decode rows (one token each) plus its prompt tokens stay
  within B. shared: a pass of whole prompts within B; coscheduled: the rows, then whole prompts
  within what is left; chunked: the rows, then FCFS prompt tokens up to min(chunk, B - rows).
  A whole prompt longer than B runs alone (one piece, no rows), when nothing else can go.
- max_seqs S: at most min(S, B) requests admitted on a worker (in its pass, waiting or
  running; on a prefill worker, until its KV has left).
- kv "paged" (:class:`Paged`, colocated policies): blocks of b tokens, capacity // b of them.
  At each boundary: the rows (not in shared while a prompt is scheduled) each get the blocks
  their step reads, FCFS; short of blocks (even after evicting the least recently freed
  cached block no one shares), the latest admitted request is preempted (blocks freed, head of
  the queue, it prefills prompt + emitted again). Then admitted prompts' pieces, the same way;
  then, unless someone was preempted now, new requests while a slot, the budget and their
  blocks fit, starting at the cached run of their leading blocks (never the whole prompt). A
  completed prompt's full blocks enter the cache.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from pytest_prefill.sim import LAB, LINK, CostModel, Request, TickCost, to_ticks


@dataclass
class W:  # one compute worker
    name: str
    pending: deque = field(default_factory=deque)  # arrived, not admitted (KV, slots)
    waiting: list = field(default_factory=list)  # [request, tokens done], admitted
    joining: list = field(default_factory=list)
    running: list = field(default_factory=list)
    reserved: int = 0
    admitted: int = 0  # requests holding a slot here
    routed: int = 0  # requests handed here and not finished
    until: int | None = None  # end of the running iteration
    current: tuple | None = None  # (pieces [(r, done, n)], rows [r], kv, start)
    batch: list = field(default_factory=list)  # a prefill worker's prompts in flight
    adm: dict = field(default_factory=dict)  # paged: admitted id -> own blocks, shared, seq
    cache: dict = field(default_factory=dict)  # paged: cached block -> [sharers, freed at]
    now_preempted: bool = False


def need(r: Request) -> int:
    return r.prompt_len + r.output_len


class Reference:
    def __init__(self, cost: CostModel, chunk=None, budget=None, engine=LAB):
        self.k = TickCost(cost)  # constants only
        self.pen = cost.fusion_penalty.as_integer_ratio()
        self.cap = cost.kv_capacity_tokens
        self.chunk = chunk
        self.budget = None if budget is None else to_ticks(budget)
        self.prefill_first = engine.first_token == "prefill"
        self.B = engine.max_batched_tokens if engine.max_batched_tokens is not None else math.inf
        seqs = engine.max_seqs if engine.max_seqs is not None else math.inf
        self.S = min(seqs, self.B)
        self.events: list[tuple] = []  # (resource, start, end, kind, pieces (id, T, C), ids, K)
        self.tokens: dict[str, list[int]] = {}
        self.prefill: dict[str, list] = {}  # id -> [start, end, ready, prefill worker name]
        self.decoder: dict[str, str] = {}
        self.emitted: dict[str, int] = {}
        self.caching, self.E = engine.prefix_caching, engine.prefix_block_tokens
        self.cached: dict[str, int] = {}
        self.preempted: dict[str, list[int]] = {}
        self.by_prefix = False  # router="prefix"

    def prefill_hits(self, w: W, r: Request) -> int:
        """Disaggregation's prefix cache (unbounded): the leading full blocks the prefill
        worker prefilled before, never the whole prompt."""
        if not self.caching:
            return 0
        hits = 0
        while hits < min(len(r.prefix_blocks), (r.prompt_len - 1) // self.E):
            if r.prefix_blocks[hits] not in w.cache:
                break
            hits += 1
        return hits * self.E

    # -- the cost model, written out once more ------------------------------------------------
    def compute(self, pieces, rows, kv=0):
        k = self.k
        tokens = sum(n for _, _, n in pieces)
        pairs = sum(n * c + n * (n + 1) // 2 for _, c, n in pieces)
        context = sum(c for _, c, _ in pieces)
        # each new token also attends over the decode rows' kv cached tokens (batch attention)
        batch = k.batch_pair * tokens * kv
        terms = (
            k.overhead
            + k.per_token * (tokens + rows)
            + k.per_pair * pairs
            + k.per_kv * context
            + batch
        )
        return max(k.floor, terms)  # a pass with prompt tokens costs at least the floor

    def cost(self, pieces, rows, kv):
        decode = self.k.base + self.k.per_seq * (len(rows) - 1) + self.k.per_kv * kv if rows else 0
        if not pieces:
            return decode
        compute = self.compute(pieces, len(rows), kv if rows else 0)
        if not rows:
            return compute
        num, den = self.pen
        return max(decode, compute) + min(decode, compute) * num // den

    # -- one worker's next iteration --------------------------------------------------------
    def fits(self, w: W, r: Request) -> bool:
        return w.reserved + need(r) <= self.cap and w.admitted < self.S

    def compose(self, w: W, mode: str):
        w.running += w.joining
        w.joining = []
        while w.pending and self.fits(w, w.pending[0]):
            w.reserved += need(w.pending[0])
            w.admitted += 1
            w.waiting.append([w.pending.popleft(), 0])
        rows = list(w.running) if mode != "shared" or not w.waiting else []
        kv = sum(r.prompt_len + self.emitted[r.id] for r in rows)
        if mode == "decode" or not w.waiting:
            return ([], rows, kv) if rows else None
        if mode in ("shared", "coscheduled"):
            return self.whole_prompts(w, rows, kv)
        total = sum(r.prompt_len - done for r, done in w.waiting)
        most = min(total, self.B - len(rows))
        if self.chunk is not None:
            most = min(most, self.chunk)
        if self.budget is None:
            take = most
        else:  # the largest FCFS count within the time budget, at least one token
            take = max(
                [
                    t
                    for t in range(1, most + 1)
                    if self.cost(self.pieces(w, t), rows, kv) <= self.budget
                ]
                or [1]
            )
        return self.pieces(w, take), rows, kv

    def whole_prompts(self, w: W, rows, kv):
        """Whole prompts FCFS while rows plus prompts stay within B; a prompt longer than B
        runs alone; one that fits B but not beside the rows waits for them to leave."""
        pieces, used = [], len(rows)
        for r, _ in w.waiting:
            if used + r.prompt_len > self.B:
                break
            pieces.append((r, 0, r.prompt_len))
            used += r.prompt_len
        if pieces:
            return pieces, rows, kv
        head = w.waiting[0][0]
        if rows and head.prompt_len <= self.B:
            return [], rows, kv
        return [(head, 0, head.prompt_len)], [], 0

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

    def emit(self, r: Request, t: int) -> bool:
        """``r`` emits a token at ``t``; True if that was its last."""
        self.tokens[r.id].append(t)
        self.emitted[r.id] += 1
        return self.emitted[r.id] == r.output_len

    def leave(self, w: W, r: Request):
        w.reserved -= need(r)
        w.admitted -= 1
        w.routed -= 1

    def log_iteration(self, w: W, t: int):
        """The iteration ``w`` ran, ending at ``t``, as an event; returns its pieces and rows."""
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
        return pieces, rows

    def end(self, w: W, t: int):
        pieces, rows = self.log_iteration(w, t)
        for r, done, n in pieces:
            for entry in w.waiting:
                if entry[0] is r:
                    entry[1] += n
            if done + n == r.prompt_len:
                w.waiting = [e for e in w.waiting if e[0] is not r]
                self.prefill[r.id][1:3] = [t, t]
                if self.prefill_first and self.emit(r, t):
                    self.leave(w, r)
                else:
                    w.joining.append(r)
        for r in rows:
            if self.emit(r, t):
                w.running.remove(r)
                self.leave(w, r)
        w.current, w.until = None, None

    def route(self, workers, r):
        if not self.by_prefix:
            return self.least(workers)

        def cached_run(w):  # leading blocks held, as admission would count them
            most = min(len(r.prefix_blocks), r.prompt_len // self.E, (r.prompt_len - 1) // self.E)
            n = 0
            while n < most and r.prefix_blocks[n] in w.cache:
                n += 1
            return n

        return max(workers, key=lambda w: (cached_run(w), -w.routed, -workers.index(w)))

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
                    w = self.route(workers, r)
                    w.pending.append(r)
                    w.routed += 1
                    self.decoder[r.id] = w.name
            for w in workers:
                if w.until is None:
                    self.start(w, mode, t)

    # -- disaggregation -----------------------------------------------------------------------
    # What each pool's memory does (tests/reference_split.py: bounded paged KV instead)
    def prompt_fits(self, w: W, r: Request) -> bool:
        return self.fits(w, r)

    def hold_prompt(self, w: W, r: Request):
        w.reserved += need(r)
        w.admitted += 1

    def prefilled(self, w: W, r: Request):
        for k in r.prefix_blocks[: r.prompt_len // self.E]:
            w.cache[k] = True  # the prefix cache of this prefill worker

    def sent(self, w: W, r: Request):  # its KV crossed (or it is done): the prompt leaves
        w.reserved -= need(r)
        w.admitted -= 1

    def decode_fits(self, w: W, r: Request) -> bool:
        return self.fits(w, r)

    def join(self, w: W, r: Request):
        w.joining.append(r)
        w.reserved += need(r)
        w.admitted += 1

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
                            tuple((r.id, n, c) for r, c, n in w.current[0]),
                            (),
                            0,
                        )
                    )
                    for r in w.batch:
                        self.prefilled(w, r)
                        self.prefill[r.id][1] = t
                        if self.prefill_first and self.emit(r, t):  # done: its one token
                            self.prefill[r.id][2] = t
                            self.decoder[r.id] = w.name
                            self.sent(w, r)
                        else:
                            done.append(r)
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
                self.sent(owner[r.id], r)
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
                    self.sent(owner[r.id], r)
                    self.prefill[r.id][2] = t
                    joins.append(r)
                else:
                    on_link = (t + d, r, t)
            while joins:
                w = self.least(dec, lambda w: self.decode_fits(w, joins[0]))
                if w is None:
                    break
                r = joins.popleft()
                self.join(w, r)
                w.routed += 1
                self.decoder[r.id] = w.name
            progress = True
            while queue and progress:  # free workers take what fits, until none can
                progress = False
                for w in pre:
                    if w.until is None and queue:
                        tokens, pieces = 0, []
                        while queue and self.prompt_fits(w, queue[0]):
                            hits = self.prefill_hits(w, queue[0])
                            if w.batch and tokens + queue[0].prompt_len - hits > self.B:
                                break  # at least one prompt, whatever its length
                            r = queue.popleft()
                            self.hold_prompt(w, r)
                            tokens += r.prompt_len - hits
                            w.batch.append(r)
                            pieces.append((r, hits, r.prompt_len - hits))
                            owner[r.id] = w
                            self.prefill[r.id] = [t, None, None, w.name]
                            if self.caching:
                                self.cached[r.id] = hits
                        if w.batch:
                            progress = True
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
    engine=LAB,
    router="least-loaded",
    decode_cost=None,
) -> Reference:
    """Run the reference; read ``.events``, ``.tokens``, ``.prefill`` and ``.decoder``.
    ``decode_cost``: the decode pool's devices (paged KV under disaggregation only)."""
    if engine.kv == "paged" and policy == "disaggregated":
        from reference_split import PagedSplit

        split = PagedSplit(cost, engine, decode_cost)
        split.cap = blocks_of(cost.kv_capacity_tokens, engine)
        split.decode_cap = blocks_of((decode_cost or cost).kv_capacity_tokens, engine)
        split.disaggregated(load, prefill_workers, decode_workers)
        return split
    if engine.kv == "paged" and policy != "disaggregated":
        from reference_paged import Paged

        ref = Paged(cost, chunk if policy == "chunked" else None, engine)
        ref.by_prefix = router == "prefix"
        if not math.isinf(ref.cap):
            ref.cap = int(ref.cap) // engine.kv_block_tokens
        ref.colocated(load, policy, replicas)
        return ref
    ref = Reference(
        cost,
        chunk if policy == "chunked" else None,
        chunk_budget if policy == "chunked" else None,
        engine,
    )
    if not math.isinf(ref.cap):
        ref.cap = int(ref.cap)
    if policy == "disaggregated":
        ref.disaggregated(load, prefill_workers, decode_workers)
    else:
        ref.colocated(load, policy, replicas)
    return ref


def blocks_of(tokens, engine):
    """A worker's KV blocks under paged KV (inf: no limit)."""
    return tokens if math.isinf(tokens) else int(tokens) // engine.kv_block_tokens
