"""The fast path: a worker's rules timed by the cost model in exact ticks, a decode-only
iteration planned as a whole run of steps up to the next finish and advanced in O(1) (its step
costs form an arithmetic progression: K grows by the rows each step), and the KV link timed
the same way. Nothing here decides what an iteration holds: that is the rules (:mod:`.rules`,
:mod:`.paged_worker`, :mod:`.prefill_worker`), checked against ``tests/reference_sim.py``."""

from __future__ import annotations

import math

from .cost import attention_pairs, run_step_start
from .prefill_worker import Link
from .requests import Request
from .rules import BaseWorker
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


class TimedWorker:
    """A worker's rules (``rules``: a :class:`~.rules.BaseWorker`) timed by the cost model in
    ticks. :meth:`start` has the rules compose the next iteration and says when it ends (a
    decode-only one: a whole run of the steps the rules would repeat unchanged); a request
    handed to the worker mid-run cuts the run at the first step boundary after it
    (:meth:`truncate`); :meth:`end` has the rules complete it. ``index``: its place in its
    pool; ``busy``: the ticks it computed."""

    __slots__ = (
        "index",
        "rules",
        "tick",
        "busy",
        "busy_until",
        "started",
        "_decode",
        "_compose",
        "_steady",
        "_complete",
    )

    def __init__(self, index: int, rules: BaseWorker, tick: TickCost) -> None:
        self.index, self.rules, self.tick = index, rules, tick
        # the rules' three calls, bound once (each iteration makes two of them)
        self._compose, self._steady = rules.compose, rules.steady_steps
        self._complete = rules.complete
        self.busy = 0  # ticks
        self.busy_until: int | None = None
        self.started = 0
        self._decode: tuple[int, int, int] | None = None  # a run's (first, growth, steps)

    def start(self, now: int) -> int | None:
        """Begin the next iteration at ``now`` if there is work and return when it ends; else
        stay idle (None)."""
        plan = self._compose(now)
        if plan is None:
            return None
        prefill, ids, kv, context, _ = plan
        rows = len(ids)
        tick = self.tick
        self.started = now
        if prefill:
            tokens = pairs = 0
            for _, done, n in prefill:
                tokens += n
                pairs += attention_pairs(n, done)
            end = now + tick.price(tokens, pairs, context, rows, kv)
            self._decode = None
            self.busy_until = end
            return end
        first = tick.decode(rows, kv)
        growth = tick.per_kv * rows
        steps = self._steady()  # a run up to the next finish
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
            self._complete(now, steps, first, growth)
        else:
            self._complete(now, 1, now - self.started, 0)


class TimedLink:
    """The KV link's rules (``link``: a :class:`~.prefill_worker.Link`) timed by the cost
    model: one transfer at a time, each lasting the cost model's transfer time for its prompt
    (none at all: the KV arrives at once, where it was made)."""

    __slots__ = ("index", "link", "tick", "busy_until", "_sending")

    def __init__(self, index: int, link: Link, tick: TickCost) -> None:
        self.index, self.link, self.tick = index, link, tick
        self.busy_until: int | None = None
        self._sending: Request | None = None

    def start(self, now: int) -> int | None:
        """Put the next prefilled request's KV on the link; return when it arrives (None:
        nothing to send)."""
        link = self.link
        while link.queue:
            r = link.queue.popleft()
            duration = self.tick.transfer(r.prompt_len)
            if duration == 0:
                link.arrived(r, now)  # a free link: the KV is usable where it was made
                continue
            self._sending = r
            self.busy_until = end = now + duration
            link.sent(r, now, end)
            return end
        return None

    def truncate(self, horizon: int) -> bool:
        return False

    def end(self, now: int) -> None:
        r = self._sending
        assert r is not None, "end a transfer only after starting it"
        self._sending = self.busy_until = None
        self.link.arrived(r, now)
