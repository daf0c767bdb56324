"""Which prefill worker an arrival goes to when each has a queue of its own (the engine
profile's ``prefill_dispatch``; DESIGN.md, "Engine semantics (v3)"): the least loaded (the
requests in its pass plus its queue, ties to the lowest index: DistServe's scheduler), or each
in turn."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from .prefill_worker import PrefillWorker
from .requests import Request

DISPATCHERS = ("least-loaded", "round-robin")


class Dispatcher:
    """Picks a prefill worker for each arrival under ``rule`` (one of :data:`DISPATCHERS`)
    from the workers' ``queues`` and their rules (``workers``, made so far: one not made yet
    has nothing in progress).

    Raises:
        ValueError: for an unknown rule, naming the allowed ones.
    """

    def __init__(
        self, rule: str, queues: Sequence[deque[Request]], workers: Sequence[PrefillWorker]
    ) -> None:
        if rule not in DISPATCHERS:
            raise ValueError(f"prefill_dispatch must be one of {', '.join(DISPATCHERS)}")
        self.rule, self.queues, self.workers = rule, queues, workers
        self.turn = 0

    def load(self, i: int) -> int:
        """Worker ``i``'s requests in its pass in progress plus its queue."""
        plan = self.workers[i].current if i < len(self.workers) else None
        return len(self.queues[i]) + (len(plan.completed) if plan is not None else 0)

    def pick(self) -> int:
        """The worker the next arrival goes to."""
        if self.rule == "round-robin":
            i = self.turn
            self.turn = (i + 1) % len(self.queues)
            return i
        return min(range(len(self.queues)), key=self.load)
