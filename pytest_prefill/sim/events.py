"""What a run did, one entry per iteration or KV transfer: :class:`Event` (seconds, the API's
form), :class:`LogEntry` (the simulator's own log, in ticks), and :class:`EventLog`, which
coalesces an engine's back-to-back decode steps as the simulator does."""

from __future__ import annotations

import dataclasses
import itertools
import operator
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from .cost import Piece, run_first_step, run_step_start
from .ticks import from_ticks

if TYPE_CHECKING:
    from .requests import Request

KINDS = ("prefill", "decode", "fused", "transfer")
LINK = "link"  # the resource name of the KV link; every other resource is a compute worker


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """One iteration on a compute resource, or one KV transfer on the link.

    ``prefill`` lists (request id, prompt tokens) processed in the pass, and ``contexts`` each
    piece's earlier context C_i (aligned with ``prefill``; empty in events recorded before cost
    model v2, where ``context_tokens`` is the only context known); for a transfer, the request
    whose KV moved and its prompt length. ``context_tokens`` is the sum of the contexts,
    ``kv_tokens`` what the decode rows read (K).

    ``count`` > 1 stands for that many back-to-back decode steps of the same rows; the i-th of
    them (from 0) reads ``kv_tokens + i * decode_rows`` cached tokens and lasts ``growth``
    seconds longer than the one before it (``growth`` = decode_per_kv_token * rows; 0 when a
    cached token costs nothing to read). :meth:`step_start` gives each step's start.
    """

    resource: str
    start: float
    end: float
    kind: str
    prefill: tuple[tuple[str, int], ...] = ()
    decode_ids: tuple[str, ...] = ()
    kv_tokens: int = 0
    context_tokens: int = 0
    count: int = 1
    contexts: tuple[int, ...] = ()
    growth: float = 0.0

    @property
    def prefill_tokens(self) -> int:
        return sum(tokens for _, tokens in self.prefill)

    @property
    def pieces(self) -> tuple[Piece, ...]:
        """The prompt pieces as the cost model takes them: (new tokens, context) each."""
        if len(self.contexts) == len(self.prefill):
            return tuple((t, c) for (_, t), c in zip(self.prefill, self.contexts))
        return ((self.prefill_tokens, self.context_tokens),) if self.prefill else ()

    @property
    def decode_rows(self) -> int:
        return len(self.decode_ids)

    @property
    def request_ids(self) -> tuple[str, ...]:
        return tuple(rid for rid, _ in self.prefill) + self.decode_ids

    @property
    def duration(self) -> float:
        """Busy time of the whole event (all ``count`` iterations)."""
        return self.end - self.start

    def step_start(self, i: int) -> float:
        """When step ``i`` (0..count) of the event starts; ``step_start(count)`` is its end."""
        if i >= self.count:
            return self.end
        first = run_first_step(self.duration, self.growth, self.count)
        return run_step_start(self.start, first, self.growth, i)


class LogEntry(NamedTuple):
    """One iteration (or transfer) as the simulator logs it, in ticks: its resource, start and
    end, kind, prompt pieces ``(request, tokens done before, tokens now)``, decode row ids, the
    KV the first step's rows read, how many back-to-back decode steps it stands for
    (``steps``; 1 for anything but a decode run) and how much longer each step lasts than the
    one before (``growth``). :meth:`event` is the same in seconds."""

    resource: str
    start: int
    end: int
    kind: str
    pieces: tuple[tuple[Request, int, int], ...]
    decode_ids: tuple[str, ...]
    kv_tokens: int
    steps: int
    growth: int

    def first_step(self) -> int:
        """How long the first step lasts (exact: step j lasts ``first + j * growth``)."""
        return run_first_step(self.end - self.start, self.growth, self.steps)

    def event(self) -> Event:
        f = from_ticks
        pieces = self.pieces
        contexts = tuple([done for _, done, _ in pieces])
        return Event(
            self.resource,
            f(self.start),
            f(self.end),
            self.kind,
            tuple([(r.id, n) for r, _, n in pieces]),
            self.decode_ids,
            self.kv_tokens,
            sum(contexts),
            self.steps,
            contexts,
            f(self.growth),
        )

    def each_step(self) -> Iterable[Event]:
        """Every step as an event of its own, each step's times exact to the float."""
        if self.steps == 1:
            yield self.event()
            return
        f, ids, growth = from_ticks, self.decode_ids, self.growth
        start, first = self.start, self.first_step()
        for i in range(self.steps):
            stop = start + first + i * growth
            yield Event(
                self.resource,
                f(start),
                f(stop),
                "decode",
                (),
                ids,
                self.kv_tokens + i * len(ids),
                0,
                1,
                (),
                f(growth),
            )
            start = stop


class EventLog:
    """Collects events as a run makes them, coalescing back-to-back decode steps of the same
    rows into one event (the engine's log; the simulator coalesces whole runs itself)."""

    def __init__(self) -> None:
        self.done: list[Event] = []
        self._open: dict[str, list[Any]] = {}  # resource -> [start, end, step, ids, kv, count]

    def add(
        self,
        resource: str,
        start: float,
        end: float,
        kind: str,
        prefill: tuple[tuple[str, int], ...] = (),
        decode_ids: tuple[str, ...] = (),
        kv_tokens: int = 0,
        context_tokens: int = 0,
        count: int = 1,
        step: float = 0.0,
        contexts: tuple[int, ...] = (),
    ) -> None:
        """Record one iteration, or ``count`` decode steps of ``step`` seconds each."""
        if kind != "decode":
            self._close(resource)
            self.done.append(
                Event(
                    resource,
                    start,
                    end,
                    kind,
                    prefill,
                    decode_ids,
                    kv_tokens,
                    context_tokens,
                    1,
                    contexts,
                )
            )
            return
        step = step or end - start
        run = self._open.get(resource)
        if (
            run is not None
            and run[1] == start
            and run[2] == step
            and run[3] is decode_ids
            and kv_tokens == run[4] + run[5] * len(decode_ids)
        ):
            run[1] = end
            run[5] += count
            return
        self._close(resource)
        self._open[resource] = [start, end, step, decode_ids, kv_tokens, count]

    def _close(self, resource: str) -> None:
        run = self._open.pop(resource, None)
        if run is not None:
            start, end, _, ids, kv, count = run
            self.done.append(Event(resource, start, end, "decode", (), ids, kv, 0, count))

    def finish(self, order: Sequence[str]) -> tuple[Event, ...]:
        for resource in list(self._open):
            self._close(resource)
        return events_by_resource(self.done, order)


def events_by_resource(events: Iterable[Event], order: Sequence[str]) -> tuple[Event, ...]:
    """Events by resource in ``order``, then by start (grouping first spares a key call each)."""
    groups: dict[str, list[Event]] = {name: [] for name in order}
    for e in events:
        groups[e.resource].append(e)
    start = operator.attrgetter("start")
    return tuple(itertools.chain.from_iterable(sorted(g, key=start) for g in groups.values()))
