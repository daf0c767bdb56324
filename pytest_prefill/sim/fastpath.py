"""The fast path: a :class:`Worker` timed by the cost model in exact ticks, a decode-only
iteration planned as a whole run of steps up to the next finish and advanced in O(1) (its step
costs form an arithmetic progression: K grows by the rows each step). Nothing here decides what
an iteration holds: that is :mod:`.rules`, checked against ``tests/reference_sim.py``."""

from __future__ import annotations

import math

from .cost import attention_pairs, run_step_start
from .profiles import LAB, EngineProfile
from .rules import Worker
from .ticks import TickCost


def steps_before(start: int, first: int, growth: int, horizon: int) -> int:
    """How many steps of a run starting at ``start`` (step j lasts ``first + j * growth``)
    start before ``horizon`` (> start): the least j >= 1 with j*first + growth*j*(j-1)/2 >=
    horizon - start."""
    span = horizon - start
    if not growth:
        return -(-span // first)
    b = 2 * first - growth  # > 0: a step reads at least one cached token per row

    def short(j: int) -> bool:  # step j starts before the horizon
        return growth * j * j + b * j < 2 * span

    j = max(1, (math.isqrt(b * b + 8 * growth * span) - b) // (2 * growth))
    while short(j):
        j += 1
    while j > 1 and not short(j - 1):
        j -= 1
    return j


class TimedWorker(Worker):
    """A :class:`Worker` timed by the cost model in ticks. :meth:`start` begins the next
    iteration and says when it ends; a request handed to the worker mid-run cuts a decode run
    at the first step boundary after it (:meth:`truncate`); :meth:`end` ends it."""

    __slots__ = ("index", "tick", "busy", "busy_until", "_decode")

    def __init__(
        self,
        index: int,
        name: str,
        mode: str,
        tick: TickCost,
        chunk: float = math.inf,
        capacity: float = math.inf,
        budget: int | None = None,
        engine: EngineProfile = LAB,
    ) -> None:
        price = tick.price if budget is not None else None
        super().__init__(
            name,
            mode,
            chunk,
            capacity=capacity,
            budget=budget,
            price=price,
            first_token=engine.first_token,
            max_batched_tokens=engine.max_batched_tokens,
            max_seqs=engine.max_seqs,
        )
        self.index, self.tick = index, tick
        self.busy = 0  # ticks
        self.busy_until: int | None = None
        self._decode: tuple[int, int, int] | None = None  # a run's (first, growth, steps)

    def start(self, now: int) -> int | None:
        """Begin the next iteration at ``now`` if there is work and return when it ends; else
        stay idle (None)."""
        if self.waiting or self.pending or self.joining:
            plan = self.compose(now)
        elif self.row_ids:  # decode rows only, as compose would say, without its checks
            self.started = now
            plan = self.current = self.decode_plan()
        else:
            plan = self.current = None
        if plan is None:
            return None
        rows = len(plan.decode_ids)
        tick = self.tick
        if plan.prefill:
            tokens = pairs = 0
            for _, done, n in plan.prefill:
                tokens += n
                pairs += attention_pairs(n, done)
            end = now + tick.price(tokens, pairs, plan.context_tokens, rows, plan.kv_tokens)
            self._decode = None
            self.busy_until = end
            return end
        first = tick.decode(rows, plan.kv_tokens)
        growth = tick.per_kv * rows
        steps = self.tokens.next_finish()  # a run up to the next finish
        end = run_step_start(now, first, growth, steps)
        self._decode = (first, growth, steps)
        self.busy_until = end
        return end

    def truncate(self, horizon: int) -> bool:
        """Cut a running decode run after its last step that starts before ``horizon``; True
        if its end moved."""
        run, start = self._decode, self.started
        if run is None or self.busy_until is None or horizon >= self.busy_until:
            return False
        first, growth, steps = run
        keep = steps_before(start, first, growth, horizon)
        if keep >= steps:
            return False
        self._decode = (first, growth, keep)
        self.busy_until = run_step_start(start, first, growth, keep)
        return True

    def end(self, now: int) -> None:
        """End the running iteration (or run) at ``now``."""
        self.busy += now - self.started
        self.busy_until = None
        run = self._decode
        if run is not None:
            first, growth, steps = run
            self.complete(now, steps, first, growth)
        else:
            self.complete(now, 1, now - self.started, 0)
