"""A colocated worker under paged KV (DESIGN.md, "Engine semantics (v3)", KV memory and prefix
caching), as vLLM V1's scheduler runs it (vllm/v1/core/sched/scheduler.py, commit 99d7eb5):
blocks allocated as tokens are scheduled, the running requests first, then new ones while
their blocks fit; a running request that cannot get its next block preempts the most recently
admitted one by recompute. The rules are :meth:`PagedWorker.compose` and
:meth:`PagedWorker.complete`, with :meth:`PagedWorker.steady_steps` saying how far the rows may
decode unchanged (up to the next finish, and where the blocks they need would run out); the
fast path times what they decide as it times any worker's. ``tests/reference_paged.py`` writes
the same rules out literally.

At each boundary, in this order:

1. The rows (the requests decoding; not in ``shared`` while a prompt is scheduled): FCFS, each
   gets the block its step's KV needs (its prompt and the tokens it emitted); when none is
   left, even after evicting cached blocks no request shares (least recently used first), the
   most recently admitted request is preempted: its blocks are freed, it goes to the head of
   the queue, and later it prefills its prompt and emitted tokens again.
2. Prompt pieces of admitted requests, FCFS (``chunked``: up to ``chunk`` tokens and what the
   token budget leaves; ``shared``/``coscheduled``: whole prompts while they fit), each with its
   blocks, preempting the same way.
3. Unless a request was preempted at this boundary (vLLM schedules no new request then), new
   requests FCFS while a sequence slot, the token budget and their blocks fit: the prefix
   cache supplies the longest run of their leading blocks it holds (never the whole prompt:
   one token at least is computed, as vLLM's ``get_computed_blocks``), and their first piece
   starts with that context. A head that does not fit waits, and so does everyone behind it.

When a prompt completes, its full blocks enter the cache (shared by it until it finishes or is
preempted). Token times are kept implicit (:class:`~.tokens.RowBook`): a row's emitted tokens
are counted by the worker's decode steps since it joined, and a row is visited only when it
joins, finishes, is preempted, or (bounded KV) needs a block.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Hashable
from typing import Any

from .paged import BlockPool, blocks_for, cache_prompt, prefix_hits
from .profiles import EngineProfile
from .requests import Request
from .rules import BaseWorker, Plan, takes_whole
from .tokens import RowBook

_new_tuple = tuple.__new__


class PagedWorker(BaseWorker):
    """The rules of a colocated worker under ``kv="paged"`` with ``blocks`` KV blocks of the
    profile's ``kv_block_tokens`` (inf: no limit) and, under ``prefix_caching``, a prefix cache
    of ``prefix_block_tokens``-token blocks (see the module's docstring for the rules).
    ``routed_by_prefix``: a prefix router reads this worker's cache at every arrival."""

    __slots__ = (
        "pool",
        "block_tokens",
        "entry_tokens",
        "caching",
        "emitted",
        "owned",
        "shared",
        "order",
        "counter",
        "entries",
        "preempted_now",
        "rows_now",
        "holds",
        "routed_by_prefix",
        "unbounded",
        "kv_running",
        "tokens",
        "offset",
        "finishing",
        "seq",
        "joins",
    )

    tokens: RowBook

    def __init__(
        self,
        name: str,
        mode: str,
        chunk: float,
        blocks: float,
        engine: EngineProfile,
        routed_by_prefix: bool = False,
    ) -> None:
        super().__init__(name, mode, chunk, engine)
        self.routed_by_prefix = routed_by_prefix  # the router reads the cache mid-run
        self.block_tokens = engine.kv_block_tokens
        self.entry_tokens = engine.prefix_block_tokens
        self.caching = engine.prefix_caching
        self.pool = BlockPool(blocks, self.entry_tokens // self.block_tokens)
        self.unbounded = math.isinf(blocks)
        self.kv_running = 0  # the KV the running rows' next step reads
        self.tokens = RowBook()
        self.emitted: dict[str, int] = {}  # not a row: tokens emitted so far
        self.offset: dict[str, int] = {}  # a row: tokens emitted less the book's steps
        self.finishing: list[tuple[int, int, Request]] = []  # (step it finishes at, seq, row)
        self.seq: dict[str, int] = {}  # a row -> when it joined (the rows' order)
        self.joins = 0
        self.owned: dict[str, int] = {}  # admitted -> its own blocks
        self.holds: dict[str, int] = {}  # admitted -> tokens its blocks (own, shared) hold
        self.shared: dict[str, list[Hashable]] = {}  # admitted -> cached blocks it shares
        self.order: dict[str, int] = {}  # admitted -> admission number (the latest: largest)
        self.counter = 0
        self.entries: dict[str, list[Any]] = {}  # waiting: id -> [request, done, target]
        self.preempted_now = False
        self.rows_now: list[Request] = []  # the rows of the iteration composed

    # -- blocks ----------------------------------------------------------------------------
    def _need(self, r: Request, tokens: int) -> int:
        """Blocks ``r`` must add to hold ``tokens`` tokens of KV (its own blocks and the cached
        ones it shares hold ``holds[r.id]``; a cached block is a whole number of blocks)."""
        more = tokens - self.holds[r.id]
        return -(-more // self.block_tokens) if more > 0 else 0

    def _grab(self, r: Request, tokens: int) -> bool:
        more = tokens - self.holds[r.id]
        if more <= 0:
            return True
        need = -(-more // self.block_tokens)
        if self.pool.take(need):
            self.owned[r.id] += need
            self.holds[r.id] += need * self.block_tokens
            return True
        return False

    def _release(self, r: Request) -> None:
        del self.holds[r.id]
        self.pool.owned -= self.owned.pop(r.id)
        self.pool.unshare(self.shared.pop(r.id))
        del self.order[r.id]
        self.admitted -= 1

    def _preempt(self, now: int) -> Request:
        """Preempt the most recently admitted request by recompute."""
        rid = max(self.order, key=self.order.__getitem__)
        entry = self.entries.pop(rid, None)
        if entry is not None:
            r = entry[0]
            self.waiting.remove(entry)
        else:
            r = next(x for x in self.running if x.id == rid)
            self.running.remove(r)
            self.kv_running -= r.prompt_len + self._unrow(r)
        self._release(r)
        self.pending.appendleft(r)
        self.preempted_at.setdefault(rid, []).append(now)
        self.preempted_now = True
        return r

    def _row(self, r: Request) -> int:
        """``r`` joins the rows: its tokens are counted by the book's steps from here on, and
        it finishes at a known step. Returns the tokens it emitted before."""
        done = self.emitted[r.id]
        steps = self.tokens.steps
        self.offset[r.id] = done - steps
        self.joins += 1
        self.seq[r.id] = self.joins
        heapq.heappush(self.finishing, (steps + r.output_len - done, self.joins, r))
        self.tokens.enter(r.id)
        return done

    def _unrow(self, r: Request) -> int:
        """``r`` leaves the rows (finished, or preempted); returns the tokens it emitted."""
        done = self.emitted[r.id] = self.offset.pop(r.id) + self.tokens.steps
        del self.seq[r.id]
        self.tokens.leave(r.id)
        return done

    def _emitted(self, r: Request) -> int:
        """The tokens row ``r`` has emitted."""
        return self.offset[r.id] + self.tokens.steps

    def _next_finish(self) -> int:
        """The step at which the next row finishes (stale entries, of rows preempted since
        they joined, dropped)."""
        heap, seq = self.finishing, self.seq
        while seq.get(heap[0][2].id) != heap[0][1]:
            heapq.heappop(heap)
        return heap[0][0]

    # -- what the next iteration holds -------------------------------------------------------
    def compose(self, now: Any) -> Plan | None:
        if self.joining:
            for r in self.joining:
                self.kv_running += r.prompt_len + self._row(r)
            self.running.extend(self.joining)
            self.joining = []
            self.row_ids = tuple([r.id for r in self.running])
        self.started = now
        self.preempted_now = False
        rows: list[Request] = [] if self.mode == "shared" else self._rows(now)
        pieces = self._pieces(now, rows)
        if self.mode == "shared" and not pieces:
            rows = self._rows(now)
        if self.preempted_now:
            self.row_ids = tuple([r.id for r in self.running])
        if not pieces and not rows:
            assert not self.waiting and not self.pending, "paged KV: work left, none planned"
            self.current = None
            return None
        completed = []
        for r, done, n in pieces:
            entry = self.entries[r.id]
            entry[1] = done + n
            if done + n == entry[2]:
                completed.append(r)
                del self.entries[r.id]
                self.waiting.remove(entry)
        self.rows_now = rows
        if len(rows) == len(self.running):  # every row steps (the rows are the running)
            ids, kv = self.row_ids, self.kv_running
        else:
            ids = tuple([r.id for r in rows])
            kv = sum([r.prompt_len + self._emitted(r) for r in rows])
        context = sum([done for _, done, _ in pieces])
        plan = _new_tuple(Plan, (tuple(pieces), ids, kv, context, tuple(completed)))
        self.current = plan
        return plan

    def _rows(self, now: int) -> list[Request]:
        """Step 1: every row gets its step's block, FCFS, preempting the latest admitted."""
        rows = list(self.running)
        if self.unbounded:  # every block is had: nothing to allocate, no one to preempt
            return rows
        i = 0
        while i < len(rows):
            r = rows[i]
            if self._grab(r, r.prompt_len + self._emitted(r)):
                i += 1
                continue
            victim = self._preempt(now)
            if victim in rows:
                if rows.index(victim) < i:
                    i -= 1
                rows.remove(victim)
        return rows

    def _pieces(self, now: int, rows: list[Request]) -> list[tuple[Request, int, int]]:
        """Steps 2 and 3: prompt pieces of admitted requests (only ``chunked`` has any left
        at a boundary: a whole prompt is scheduled when it is admitted), then new ones."""
        whole = self.mode != "chunked"
        limit = math.inf if self.max_batched_tokens is None else self.max_batched_tokens
        room = limit - len(rows)
        if not whole:
            room = min(room, self.chunk)
        pieces: list[tuple[Request, int, int]] = []
        for entry in list(self.waiting):
            r, done, target = entry
            if room <= 0:
                break
            if r.id not in self.entries:  # preempted for an earlier piece
                continue
            n = int(min(target - done, room))
            if self._piece_blocks(now, r, done + n, rows, pieces):
                pieces.append((r, done, n))
                room -= n
        if not self.preempted_now:
            self._admit(now, pieces, rows, room, whole, limit)
        return pieces

    def _piece_blocks(
        self, now: int, r: Request, tokens: int, rows: list[Request], pieces: list[Any]
    ) -> bool:
        """Blocks for an admitted request's piece, preempting the latest admitted until they
        fit; False if ``r`` itself was preempted."""
        while not self._grab(r, tokens):
            victim = self._preempt(now)
            if victim in rows:
                rows.remove(victim)
            pieces[:] = [p for p in pieces if p[0] is not victim]
            if victim is r:
                return False
        return True

    def _admit(
        self,
        now: int,
        pieces: list[Any],
        rows: list[Request],
        room: float,
        whole: bool,
        limit: float,
    ) -> None:
        """Step 3: new requests FCFS while a slot, the budget and their blocks fit. A whole
        prompt longer than the budget left waits, unless nothing else is scheduled and it
        would never fit beside the rows: then it runs alone (the rows wait; their blocks stay
        allocated)."""
        pending, pool, size = self.pending, self.pool, self.block_tokens
        while pending and room > 0 and self._slot_for(pending[0]):
            r = pending[0]
            target = r.prompt_len + self.emitted.get(r.id, 0)
            hits = self._hits(r, target)
            done = hits * self.entry_tokens
            n = target - done if whole else int(min(target - done, room))
            if not takes_whole(n, room, bool(pieces), len(rows), limit):
                break
            alone = n > room  # it runs alone: the rows wait
            blocks = r.prefix_blocks[:hits]
            keep = sum(1 for b in blocks if pool.refs[b] == 0)
            if pool.room(keep) < blocks_for(n, size):
                break
            pending.popleft()
            pool.share(blocks)
            pool.take(blocks_for(n, size))
            self._admitted(r, done, target, list(blocks), blocks_for(n, size), now)
            pieces.append((r, done, n))
            room -= n
            if alone:
                rows.clear()
                break

    def _slot_for(self, r: Request) -> bool:
        """Whether ``r`` may be admitted as far as sequence slots go (a free one)."""
        return self.admitted < self.max_seqs

    def _admitted(
        self, r: Request, done: int, target: int, blocks: list[Hashable], own: int, now: int
    ) -> None:
        entry = [r, done, target]
        self.entries[r.id] = entry
        self.waiting.append(entry)
        self.owned[r.id], self.shared[r.id] = own, blocks
        self.holds[r.id] = own * self.block_tokens + len(blocks) * self.entry_tokens
        self.counter += 1
        self.order[r.id] = self.counter
        self.admitted += 1
        self.emitted.setdefault(r.id, 0)
        if r.id not in self.prefill_start:  # its first admission: the prompt tokens cached
            self.prefill_start[r.id] = now
            self.cached[r.id] = done

    def cached_run(self, r: Request) -> int:
        """The leading blocks of ``r`` this worker's cache holds, as admission would count
        them (what a prefix router compares)."""
        return self._hits(r, r.prompt_len)

    def _hits(self, r: Request, target: int) -> int:
        """Leading blocks of ``r`` the cache holds (full prompt blocks, never all ``target``
        tokens)."""
        if not self.caching:
            return 0
        return prefix_hits(self.pool, r, target, self.entry_tokens)

    # -- the end of an iteration ------------------------------------------------------------
    def complete(self, end: Any, steps: int, first: Any, growth: Any) -> tuple[Request, ...]:
        """End the composed iteration (``steps`` decode steps, the first lasting ``first``,
        each next one ``growth`` longer): the prompts it completed enter the cache (and, under
        the ``prefill`` rule, emit a token), every row emits a token per step."""
        plan = self.current
        assert plan is not None, "finish an iteration only after composing it"
        self.logged(plan, end, steps, growth)
        for r in plan.completed:
            self.prefill_end.setdefault(r.id, end)
            if self.caching:
                self._cache_prompt(r)
            if self.prefill_first and self._emit(r, end):
                continue
            self.joining.append(r)
        if plan.decode_ids:
            self._emit_rows(plan, end, steps, first, growth)
        return plan.completed

    def _cache_prompt(self, r: Request) -> None:
        """``r``'s prompt completed: its full blocks enter the cache (shared by it)."""
        entered = cache_prompt(self.pool, r, self.shared[r.id], self.entry_tokens)
        self.owned[r.id] -= entered * self.pool.entry_blocks

    def _emit(self, r: Request, t: int) -> bool:
        """``r`` emits a token at ``t``; True (and it leaves) if that was its last."""
        self.tokens.add(r.id, t)
        self.emitted[r.id] += 1
        if self.emitted[r.id] < r.output_len:
            return False
        self.tokens.finish[r.id] = t
        self._release(r)
        self.unfinished -= 1
        if self.leaving is not None:
            self.leaving.append(r)
        return True

    def _emit_rows(self, plan: Plan, end: int, steps: int, first: int, growth: int) -> None:
        """Each row emits a token at the end of each step (a run ends at the next finish at
        the latest); a run's later steps take the blocks they fill (planned to fit), row by
        row, a finished row's blocks freed before the next row's are taken."""
        rows, book = self.rows_now, self.tokens
        book.emit(self.started, end, steps, first, growth, len(rows))
        self.kv_running += len(rows) * steps
        heap, seq, now, gone = self.finishing, self.seq, book.steps, []
        while heap and heap[0][0] <= now:
            _, k, r = heapq.heappop(heap)
            if seq.get(r.id) == k:  # else preempted since: stale
                gone.append(r)
        if steps > 1 and not self.unbounded:
            leaving = {r.id for r in gone}
            for r in rows:
                before = self.offset[r.id] + now - steps
                taken = self._grab(r, r.prompt_len + before + steps - 1)
                assert taken, "a decode run outgrew its blocks"
                if r.id in leaving:
                    self._finished(r, end)
        else:
            for r in gone:
                self._finished(r, end)
        if gone:
            self.unfinished -= len(gone)
            if self.leaving is not None:
                self.leaving.extend(gone)
            ids = {r.id for r in gone}
            self.running = [x for x in self.running if x.id not in ids]
            self.row_ids = tuple([x.id for x in self.running])
            self.kv_running -= sum([r.prompt_len + r.output_len for r in gone])

    def _finished(self, r: Request, end: int) -> None:
        """Row ``r`` emitted its last token at ``end``: it leaves, its blocks freed."""
        self.tokens.finish[r.id] = end
        self._unrow(r)
        self._release(r)

    # -- how far the rows may decode unchanged ---------------------------------------------
    def steady_steps(self) -> int:
        """Decode steps up to the next finish, cut where the rows' next blocks would not fit
        (one step only when a request was preempted at this boundary: new ones may be admitted
        at the next)."""
        return 1 if self.preempted_now else self._run_steps()

    def _run_steps(self) -> int:
        """Decode steps up to the next finish, as many as the rows' blocks allow (at each
        step the rules would admit no one new: their room only shrinks)."""
        rows = self.running
        most = self._next_finish() - self.tokens.steps
        if math.isinf(self.pool.capacity) or most == 1:
            return most
        pool = self.pool
        # A request waiting to be admitted may find room once a cached block it would hit
        # is evicted (its piece then starts earlier and may need fewer blocks than the hit's
        # room allowed): evict nothing inside a run while one waits.
        # So is a prefix router, which reads the cache at every arrival.
        still = (self.pending and self.caching) or self.routed_by_prefix
        room = pool.capacity - pool.used if still else pool.room()

        def extra(steps: int) -> int:
            now = self.tokens.steps + steps - 1
            return sum(self._need(r, r.prompt_len + self.offset[r.id] + now) for r in rows)

        if extra(most) <= room:
            return most
        lo, hi = 1, most  # extra(lo) <= room < extra(hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if extra(mid) <= room:
                lo = mid
            else:
                hi = mid
        return lo

    def token_times(self, request: Request) -> list[Any]:
        """Every token time of ``request``, decoded here."""
        return self.tokens.token_times(request)
