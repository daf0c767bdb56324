"""A decode worker whose steps read at most ``decode_max_kv_tokens`` KV tokens (the engine
profile's knob; DESIGN.md, "Engine semantics (v3)"): DistServe's simulator caps a decode batch
at 50,000 tokens of context (``simdistserve/base/worker.py`` ``_enter_decodes``). Its rows wait
in one queue: a step takes rows from the head while the KV they read (each row's prompt and the
tokens it emitted) stays within the cap, at least one; the rows that stepped and go on rejoin
the tail, behind the requests that arrived meanwhile. The rows a step leaves out make the book
keep each row's tokens explicitly (:class:`RowTimes`), one step per iteration."""

from __future__ import annotations

from collections import deque
from typing import Any

from .gaps import GapRun
from .profiles import EngineProfile
from .requests import Request
from .rules import Plan, Worker

_new_tuple = tuple.__new__


class RowTimes:
    """Every token time of the requests decoding on one worker, kept per request (first and
    last token, the gaps between tokens as a multiset), as :class:`~.tokens.TokenBook` keeps
    them for rows that all step together."""

    __slots__ = ("first_token", "finish", "times", "gaps", "gap_runs")

    def __init__(self) -> None:
        self.first_token: dict[str, Any] = {}
        self.finish: dict[str, Any] = {}
        self.times: dict[str, list[Any]] = {}
        self.gaps: dict[Any, int] = {}  # token gap -> how many tokens followed such a gap
        self.gap_runs: list[GapRun] = []  # never any: one step per iteration

    def add(self, rid: str, t: Any) -> None:
        """``rid`` emitted a token at ``t``."""
        times = self.times.setdefault(rid, [])
        if times:
            gap = t - times[-1]
            self.gaps[gap] = self.gaps.get(gap, 0) + 1
        else:
            self.first_token.setdefault(rid, t)
        times.append(t)

    def token_times(self, request: Request) -> list[Any]:
        return list(self.times[request.id])


class CappedDecodeWorker(Worker):
    """A disaggregated run's decode worker under ``engine.decode_max_kv_tokens`` and the
    reservation rule (see the module's docstring)."""

    __slots__ = ("cap", "queue", "emitted", "stepping")

    tokens: RowTimes  # type: ignore[assignment]

    def __init__(self, name: str, capacity: float, engine: EngineProfile) -> None:
        super().__init__(name, "decode", capacity=capacity, engine=engine)
        assert engine.decode_max_kv_tokens is not None
        self.cap = engine.decode_max_kv_tokens
        self.tokens = RowTimes()
        self.queue: deque[Request] = deque()  # the rows, in turn
        self.emitted: dict[str, int] = {}
        self.stepping: list[Request] = []

    def join(self, request: Request, first_token: Any = None) -> None:
        """``request``'s KV arrived: it queues for its turn (under the ``prefill`` rule with
        its first token, emitted by its prefill)."""
        self.kv.reserve(request)
        self.admitted += 1
        self.unfinished += 1
        self.emitted[request.id] = 0
        if self.prefill_first:
            self.tokens.add(request.id, first_token)
            self.emitted[request.id] = 1
        self.queue.append(request)
        self.running.append(request)

    def compose(self, now: Any) -> Plan | None:
        """One decode step of the rows at the queue's head whose KV fits the cap."""
        self.started = now
        queue, emitted, kv = self.queue, self.emitted, 0
        rows: list[Request] = []
        while queue:
            read = queue[0].prompt_len + emitted[queue[0].id]
            if rows and kv + read > self.cap:
                break
            rows.append(queue.popleft())
            kv += read
        self.stepping = rows
        plan = _new_tuple(Plan, ((), tuple([r.id for r in rows]), kv, 0, ())) if rows else None
        self.current = plan
        return plan

    def steady_steps(self) -> int:
        return 1  # the rows may change at every step

    def complete(self, end: Any, steps: int, first: Any, growth: Any) -> tuple[Request, ...]:
        """The step ended at ``end``: each row emitted a token; those done leave, the others
        rejoin the queue's tail."""
        plan = self.current
        assert plan is not None and steps == 1, "finish one composed step at a time"
        self.logged(plan, end, steps, growth)
        done: list[Request] = []
        going: list[Request] = []
        for r in self.stepping:
            self.tokens.add(r.id, end)
            self.emitted[r.id] += 1
            (done if self.emitted[r.id] >= r.output_len else going).append(r)
        self.queue.extend(going)
        self.stepping = []
        if done:
            for r in done:
                self.tokens.finish[r.id] = end
            self._leave(done)
        return ()

    def token_times(self, request: Request) -> list[Any]:
        return self.tokens.token_times(request)
