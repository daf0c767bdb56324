"""The scheduling rules: what the next iteration on a worker holds (DESIGN.md, "Simulation
semantics", the policies). :class:`BaseWorker` is what every worker's rules share (queues,
token book, log, the engine profile); :meth:`Worker.compose` is the whole decision under the
reservation rule, in one place (paged KV: :mod:`.paged_worker`; disaggregation's prefill
side: :mod:`.prefill_worker`). The simulator times what a worker composes
(:mod:`.fastpath`), the lab's engine runs it for real."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from .checks import check_whole_or_inf
from .cost import Piece, attention_pairs
from .events import LogEntry
from .kv import KVReserve
from .profiles import LAB, EngineProfile
from .requests import Request
from .tokens import TokenBook
from .trace import RequestRecord

MODES = ("shared", "coscheduled", "chunked", "decode")
_new_tuple = tuple.__new__  # a NamedTuple without its Python-level __new__ (one per iteration)


class Plan(NamedTuple):
    """What one iteration does, decided at its start by :meth:`Worker.compose`: prompt pieces
    ``(request, tokens done before, tokens now)`` taken FCFS, the ids of the decode rows (each
    emits one token; the same tuple while the rows do not change), the KV tokens the rows read
    (K), the earlier context the pieces attend to (sum of C), and the requests whose prompt the
    iteration completes.

    Immutable, built by the worker and not validated; a named tuple rather than a frozen
    dataclass because the simulator builds one per iteration (with ``tuple.__new__``: all
    five fields given).
    """

    prefill: tuple[tuple[Request, int, int], ...]
    decode_ids: tuple[str, ...]
    kv_tokens: int = 0
    context_tokens: int = 0
    completed: tuple[Request, ...] = ()

    @property
    def kind(self) -> str:
        if self.prefill:
            return "fused" if self.decode_ids else "prefill"
        return "decode"

    @property
    def prefill_tokens(self) -> int:
        return sum(n for _, _, n in self.prefill)

    @property
    def decode_rows(self) -> int:
        return len(self.decode_ids)

    def prefill_ids(self) -> tuple[tuple[str, int], ...]:
        """The prompt pieces as an :class:`Event` lists them: (request id, tokens now)."""
        return tuple([(r.id, n) for r, _, n in self.prefill])

    def pieces(self) -> tuple[Piece, ...]:
        """The prompt pieces as the cost model takes them: (tokens now, tokens done before)."""
        return tuple([(n, done) for _, done, n in self.prefill])

    def contexts(self) -> tuple[int, ...]:
        """Each piece's earlier context, as :attr:`Event.contexts` lists it."""
        return tuple([done for _, done, _ in self.prefill])


Price = Callable[[int, int, int, int, int], Any]  # (tokens, pairs, context, rows, kv) -> cost


def takes_whole(tokens: int, room: float, taken: bool, rows: int, limit: float) -> bool:
    """Whether a whole prompt (``tokens`` to compute) joins an iteration with ``room`` tokens
    of its budget ``limit`` left, prompts taken FCFS: while it fits; when it does not, only
    alone — nothing taken yet and it would never fit beside the ``rows`` decode rows (there
    are none, or it is longer than the budget); the rows then wait. The one home of the rule
    (the reserve and paged workers, the prefill workers)."""
    return tokens <= room or (not taken and (not rows or tokens > limit))


class BaseWorker:
    """What every worker's rules share: a request's queues, the log of its iterations, and
    the engine profile's knobs. A subclass says what the next iteration holds
    (:meth:`compose`), what its end does (:meth:`complete`), and how many decode steps the
    rows would repeat unchanged from a boundary (:meth:`steady_steps`: what lets a caller time
    a whole run of them at once).

    A request moves through the queues ``pending`` (arrived, waiting for KV room and a
    sequence slot) -> ``waiting`` (admitted, its prompt in progress, FCFS) -> ``joining``
    (prefilled, joins the rows at the next boundary) -> ``running`` (the decode rows).
    ``cached``: prompt tokens the prefix cache supplied at a request's first admission;
    ``preempted_at``: when a request was preempted by recompute (both empty without paged KV);
    ``leaving``, when a caller sets it: the requests finished here, appended as they finish.

    Raises:
        ValueError: for an unknown mode, or a chunk that is not a whole number >= 1 or inf.
    """

    __slots__ = (
        "name",
        "mode",
        "chunk",
        "engine",
        "prefill_first",
        "max_batched_tokens",
        "max_seqs",
        "admitted",
        "unfinished",
        "pending",
        "waiting",
        "joining",
        "running",
        "row_ids",
        "prefill_start",
        "prefill_end",
        "cached",
        "preempted_at",
        "log",
        "started",
        "current",
        "leaving",
    )

    def __init__(
        self, name: str, mode: str, chunk: float = math.inf, engine: EngineProfile = LAB
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
        tokens = check_whole_or_inf("chunk", chunk)
        self.name, self.mode, self.engine = name, mode, engine
        self.chunk = tokens if mode == "chunked" else math.inf  # prompt tokens per pass
        self.prefill_first = engine.first_token == "prefill"
        self.max_batched_tokens = engine.max_batched_tokens
        cap = engine.seq_cap
        self.max_seqs: float = math.inf if cap is None else cap  # every row is a token too
        self.admitted = 0  # requests admitted here (past pending) and not finished
        self.unfinished = 0  # requests handed to this worker and not finished
        self.pending: deque[Request] = deque()  # arrived, waiting for KV room
        self.waiting: deque[list[Any]] = deque()  # [request, prompt tokens done, ...]
        self.joining: list[Request] = []  # prefilled, join the decode rows at the next boundary
        self.running: list[Request] = []
        self.row_ids: tuple[str, ...] = ()  # their ids, rebuilt on change: events key on identity
        self.prefill_start: dict[str, Any] = {}
        self.prefill_end: dict[str, Any] = {}
        self.cached: dict[str, int] = {}
        self.preempted_at: dict[str, list[Any]] = {}
        self.log: list[LogEntry] = []  # every iteration, in order
        self.started: Any = None  # when the running iteration started
        self.current: Plan | None = None  # the running iteration's plan
        self.leaving: list[Request] | None = None  # given: every request finished, appended

    def admit(self, request: Request) -> None:
        """A request arrives: its prompt waits here for KV room, then for prefill (FCFS)."""
        if self.mode == "decode":
            raise ValueError(f"{self.name} only decodes: hand it prefilled requests with join()")
        self.pending.append(request)
        self.unfinished += 1

    @property
    def load(self) -> int:
        return len(self.running) + len(self.joining)

    def compose(self, now: Any) -> Plan | None:
        """The iteration that starts at ``now`` (None: nothing to do). Call :meth:`complete`
        (or :meth:`finish_at`) before composing again."""
        raise NotImplementedError

    def steady_steps(self) -> int:
        """How many decode steps, the composed one first, the rows would take unchanged from
        here if nothing arrived: up to the next finish (>= 1)."""
        raise NotImplementedError

    def complete(self, end: Any, steps: int, first: Any, growth: Any) -> tuple[Request, ...]:
        """End the composed iteration at ``end`` as ``steps`` decode steps (more than one: a
        run of unchanging decode steps), the first lasting ``first``, each next one ``growth``
        longer; return the requests whose prompt it completed."""
        raise NotImplementedError

    def finish_at(self, end: Any) -> tuple[Request, ...]:
        """End the composed iteration at ``end``; return the requests whose prompt it completed
        (they join the decode rows at the next boundary)."""
        return self.complete(end, 1, end - self.started, 0)

    def logged(self, plan: Plan, end: Any, steps: int, growth: Any) -> LogEntry:
        """Log the composed iteration (``plan``, done with) as ending at ``end`` (``steps``
        decode steps, each ``growth`` longer than the one before)."""
        self.current = None
        prefill, ids, kv, _, _ = plan
        kind = ("fused" if ids else "prefill") if prefill else "decode"
        entry = (self.name, self.started, end, kind, prefill, ids, kv, steps, growth)
        self.log.append(entry := _new_tuple(LogEntry, entry))
        return entry


class Worker(BaseWorker):
    """The scheduling rules of one compute resource under the reservation rule (:mod:`.kv`),
    one iteration at a time: at a boundary :meth:`compose` says what the next iteration does,
    the caller runs it, :meth:`finish_at` ends it. The simulator times iterations with the
    cost model (whole runs of decode steps at once: :mod:`.fastpath`); the lab's engine runs
    them for real. Times are whatever the caller counts in.

    Modes: ``shared`` (a prefill pass of every admitted prompt first, else a decode step),
    ``coscheduled`` (decode rows fused with every admitted prompt, whole), ``chunked`` (decode
    rows fused with up to ``chunk`` prompt tokens, FCFS, prompts split; inf: every waiting
    token; or, with ``budget`` and ``price``, the largest FCFS token count whose iteration
    ``price`` keeps within ``budget``, at least one token), ``decode`` (decode only: prefilled
    requests come in through :meth:`join`). A prompt completed here joins this worker's decode
    rows at the next boundary.

    The engine profile's knobs (DESIGN.md, "Engine semantics (v3)"): ``first_token``
    ``"decode"`` (the lab's: a request's first token ends its first decode step) or
    ``"prefill"`` (the iteration completing its prompt emits it; ``output_len - 1`` decode rows
    follow); with ``max_batched_tokens`` every iteration holds at most that many tokens, decode
    rows first (one each), prompt tokens filling the rest (``shared`` and ``coscheduled`` take
    whole prompts while they fit, and a prompt longer than the budget runs alone); its
    ``seq_cap`` admits at most that many requests at once. A request waits in ``pending`` for
    KV room (``capacity`` tokens reserved at admission) and a sequence slot. Its tokens are kept
    by ``tokens`` (:class:`TokenBook`); every iteration is in ``log``.

    Raises:
        ValueError: for an unknown mode, a chunk that is not a whole number >= 1 or inf, or a
            budget without a price or outside ``chunked``.
    """

    __slots__ = ("budget", "price", "kv", "tokens")

    tokens: TokenBook

    def __init__(
        self,
        name: str,
        mode: str,
        chunk: float = math.inf,
        *,
        capacity: float = math.inf,
        budget: Any = None,
        price: Price | None = None,
        engine: EngineProfile = LAB,
    ) -> None:
        super().__init__(name, mode, chunk, engine)
        if budget is not None and (mode != "chunked" or price is None):
            raise ValueError("a chunk budget needs mode 'chunked' and a price function")
        self.budget, self.price = budget, price
        self.kv = KVReserve(capacity)
        self.tokens = TokenBook(self.prefill_first)

    def has_room(self, request: Request) -> bool:
        """Whether ``request`` could be admitted now: a sequence slot and KV room for it."""
        return self.admitted < self.max_seqs and self.kv.fits(request)

    def join(self, request: Request, first_token: Any = None) -> None:
        """A request prefilled elsewhere joins the decode rows at the next boundary (under the
        ``prefill`` rule, with the time of the first token its prefill emitted)."""
        self.kv.reserve(request)
        self.admitted += 1
        self.joining.append(request)
        self.unfinished += 1
        if self.prefill_first:
            self.tokens.first_token[request.id] = first_token

    def _admit_pending(self) -> None:
        pending, kv, cap = self.pending, self.kv, self.max_seqs
        # strict FCFS: a head without room waits, and so does everyone behind it
        while pending and self.admitted < cap and kv.fits(pending[0]):
            request = pending.popleft()
            kv.reserve(request)
            self.admitted += 1
            self.waiting.append([request, 0])

    def _admit_joining(self) -> None:
        self.tokens.enter(self.joining)
        self.running.extend(self.joining)
        self.joining = []
        self.row_ids = tuple([r.id for r in self.running])

    def compose(self, now: Any) -> Plan | None:
        """Admit the requests joining at this boundary and what fits in KV memory, and compose
        the iteration that starts at ``now`` (None: nothing to do). Call :meth:`finish_at`
        before composing again."""
        if self.joining:
            self._admit_joining()
        if self.pending:
            self._admit_pending()
        self.started = now
        if not self.waiting:  # decode rows only (always so in decode mode): decode_plan's
            ids = self.row_ids
            plan = _new_tuple(Plan, ((), ids, self.tokens.kv_tokens, 0, ())) if ids else None
        elif self.max_batched_tokens is None or self.mode == "chunked":
            plan = self._compose_prefill(now)
        else:
            plan = self._compose_whole(now)
        self.current = plan
        return plan

    def steady_steps(self) -> int:
        return self.tokens.next_finish()

    def decode_plan(self) -> Plan:
        """A decode step of every running request (the plan of a boundary with no prompt
        waiting)."""
        return _new_tuple(Plan, ((), self.row_ids, self.tokens.kv_tokens, 0, ()))

    def _compose_prefill(self, now: Any) -> Plan:
        """Prompt tokens FCFS: every waiting prompt (``shared``: alone, ahead of the rows;
        ``coscheduled``: with the rows), or up to ``chunk`` tokens (under a token budget B, up
        to ``min(chunk, B - rows)``: the rows go first), or what ``budget`` buys within that.
        (One loop that also does :meth:`_plan`'s bookkeeping: the lab's path, kept lean.)"""
        ids = () if self.mode == "shared" else self.row_ids  # shared: the pass holds up the rows
        take = self._budget_take(len(ids)) if self.budget is not None else None
        chunk = self.chunk  # tokens; >= 1, so at least one prompt piece
        if self.max_batched_tokens is not None:  # >= 1 left: admitted <= B, one is waiting
            chunk = min(chunk, self.max_batched_tokens - len(ids))
        prefill: list[tuple[Request, int, int]] = []
        completed: list[Request] = []
        context = 0
        starts = self.prefill_start
        for entry in self.waiting:
            request, done = entry
            left = request.prompt_len - done
            n = left if left <= chunk else int(chunk)
            if take is not None:
                n = take(len(prefill), request, done, n)
                if n <= 0:
                    break
            chunk -= n
            prefill.append((request, done, n))
            context += done
            if request.id not in starts:
                starts[request.id] = now
            if n < left:
                entry[1] = done + n
                break
            completed.append(request)
            if chunk <= 0:
                break
        for _ in completed:
            self.waiting.popleft()
        kv = self.tokens.kv_tokens if ids else 0
        return _new_tuple(Plan, (tuple(prefill), ids, kv, context, tuple(completed)))

    def _compose_whole(self, now: Any) -> Plan:
        """``shared`` and ``coscheduled`` under a token budget B: whole prompts FCFS while they
        fit beside the rows (``shared``: a pass with no rows). When none does, a prompt longer
        than B runs alone; a shorter one waits for rows to leave while the rows decode."""
        limit = self.max_batched_tokens
        assert limit is not None
        ids = () if self.mode == "shared" else self.row_ids
        room = limit - len(ids)
        prefill: list[tuple[Request, int, int]] = []
        for request, _ in self.waiting:  # whole prompts (they are never split here)
            n = request.prompt_len
            if not takes_whole(n, room, bool(prefill), len(ids), limit):
                break
            if n > room:
                ids = ()  # longer than B, or no rows to wait for: it runs alone
            prefill.append((request, 0, n))
            room -= n
        if not prefill:
            return self.decode_plan()  # the head fits once rows have left: the rows go on
        return self._plan(now, ids, prefill)

    def _plan(self, now: Any, ids: tuple[str, ...], prefill: list[Any]) -> Plan:
        """The plan of whole-prompt ``prefill`` pieces (an FCFS prefix of ``waiting``) with
        the rows ``ids``: record prefill starts, and pop the prompts."""
        starts, waiting = self.prefill_start, self.waiting
        for request, _, _ in prefill:
            if request.id not in starts:
                starts[request.id] = now
            waiting.popleft()
        kv = self.tokens.kv_tokens if ids else 0
        completed = tuple([r for r, _, _ in prefill])
        return _new_tuple(Plan, (tuple(prefill), ids, kv, 0, completed))

    def _budget_take(self, rows: int) -> Callable[[int, Request, int, int], int]:
        """The chunk_budget rule: the largest FCFS token count whose iteration costs <= the
        budget (at least one token). Returns how much of the next piece to take, at most
        ``most`` tokens of it."""
        price, budget, kv = self.price, self.budget, self.tokens.kv_tokens
        assert price is not None
        sums = [0, 0, 0]  # tokens, pairs, context of the pieces taken so far

        def fits(take: int, done: int) -> bool:
            tokens, pairs, context = sums
            pairs += attention_pairs(take, done)
            return price(tokens + take, pairs, context + done, rows, kv) <= budget

        def take_of(pieces_so_far: int, request: Request, done: int, most: int) -> int:
            if fits(most, done):
                take = most
            else:  # bisect: fits(lo) or lo == 0, not fits(hi)
                lo, hi = 0, most
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if fits(mid, done):
                        lo = mid
                    else:
                        hi = mid
                take = lo if lo or pieces_so_far else 1  # prompts always progress
            sums[0] += take
            sums[1] += attention_pairs(take, done)
            sums[2] += done
            return take

        return take_of

    def complete(self, end: Any, steps: int, first: Any, growth: Any) -> tuple[Request, ...]:
        """End the composed iteration at ``end`` as ``steps`` decode steps (more than one: a
        run of unchanging decode steps), the first lasting ``first``, each next one ``growth``
        longer; log it, and return the requests whose prompt it completed."""
        plan = self.current
        assert plan is not None, "finish an iteration only after composing it"
        entry = self.logged(plan, end, steps, growth)
        completed = plan.completed
        if completed:
            prefill_end = self.prefill_end
            for r in completed:
                prefill_end[r.id] = end
            if self.prefill_first:
                self._emit_first_tokens(completed, end)
            else:
                self.joining.extend(completed)
        if entry.decode_ids:
            done = self.tokens.emit(entry, first)
            if done is not None:
                self._leave(done)
        return completed

    def _emit_first_tokens(self, completed: tuple[Request, ...], end: Any) -> None:
        """The ``prefill`` rule: the iteration that completed these prompts emitted their first
        tokens at ``end``; a request of one token is done, the others join the rows."""
        book = self.tokens
        done = []
        for r in completed:
            book.first_token[r.id] = end
            if r.output_len == 1:
                book.finish[r.id] = end
                done.append(r)
            else:
                self.joining.append(r)
        for r in done:
            self.kv.release(r)
        self.admitted -= len(done)
        self.unfinished -= len(done)
        if self.leaving is not None:
            self.leaving.extend(done)

    def _leave(self, done: list[Request]) -> None:
        """``done`` emitted their last tokens: they leave the rows and free their KV."""
        gone = set()
        kv = self.kv
        for r in done:
            gone.add(r.id)
            kv.release(r)
        self.admitted -= len(done)
        self.unfinished -= len(done)
        if self.leaving is not None:
            self.leaving.extend(done)
        self.running = [r for r in self.running if r.id not in gone]
        self.row_ids = tuple([r.id for r in self.running])

    def token_times(self, request: Request) -> list[Any]:
        """Every token time of ``request``, decoded here."""
        return self.tokens.token_times(request)

    def record(
        self, r: Request, start: Any, end: Any, ready: Any, prefill_resource: str | None = None
    ) -> RequestRecord:
        """What happened to ``r``, decoded here, given its prefill start and end, KV ready and
        where it was prefilled (default: here). The engine's records: times are the caller's."""
        times = tuple(self.token_times(r))
        return RequestRecord(
            r.id,
            r.arrival,
            r.prompt_len,
            r.output_len,
            start,
            end,
            ready,
            self.name,
            times,
            prefill_resource,
        )
