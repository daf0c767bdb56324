"""Token bookkeeping of one worker: which decode-bearing iteration emits each request's tokens,
the gaps between them, first tokens and finishes. Token times are kept implicit (an index into
the worker's iterations) and read off on demand; the scheduling rules (:mod:`.rules`) only
tell the book who joined the decode rows and which iteration just ended."""

from __future__ import annotations

import bisect
import heapq
from typing import Any, Protocol

from .cost import run_step_start
from .events import LogEntry
from .gaps import GapRun
from .requests import Request

_new_tuple = tuple.__new__  # a GapRun without NamedTuple's Python-level __new__ (one per run)


class Book(Protocol):
    """What a worker's token book gives its results: first tokens and finishes, the token
    gaps (points, and runs of growing step gaps) and each request's token times."""

    first_token: dict[str, Any]
    finish: dict[str, Any]
    gaps: dict[Any, int]
    gap_runs: list[GapRun]

    def token_times(self, request: Request) -> list[Any]: ...


class TokenBook:
    """The tokens of the requests decoding on one worker. Times are the worker's (ticks in the
    simulator, seconds in the engine).

    Decode-bearing iterations are counted by ``steps`` (a run of ``n`` unchanging decode steps
    counts ``n``); a request entering the rows at step index ``i`` emits its tokens at steps
    ``i .. i + output_len - 1``. ``kv_tokens`` is what the rows' next decode step reads: each
    row's prompt and the tokens it emitted.

    ``prefill_first`` (the ``prefill`` first-token rule): a request's first token came from
    the iteration that completed its prompt (its time is in ``first_token`` before it enters);
    it then emits the other ``output_len - 1`` at decode steps, the first of them a gap after
    that token.
    """

    __slots__ = (
        "prefill_first",
        "steps",
        "kv_tokens",
        "first_index",
        "finishing",
        "finish_heap",
        "newcomers",
        "first_token",
        "finish",
        "entries",
        "entry_index",
        "gaps",
        "gap_runs",
        "last_end",
    )

    def __init__(self, prefill_first: bool = False) -> None:
        self.prefill_first = prefill_first
        self.steps = 0  # decode-bearing iterations so far (a token-time index)
        self.kv_tokens = 0  # what the next decode step reads
        self.first_index: dict[str, int] = {}  # request -> index of its first token here
        self.finishing: dict[int, list[Request]] = {}  # index -> requests done there
        self.finish_heap: list[int] = []  # the keys of ``finishing``
        self.newcomers: dict[int, list[Request]] = {}  # index -> first tokens there
        self.first_token: dict[str, Any] = {}
        self.finish: dict[str, Any] = {}
        # The decode-bearing iterations and the index of each one's first step: step j of an
        # entry lasts first + j * growth and ends its token.
        self.entries: list[LogEntry] = []
        self.entry_index: list[int] = []
        self.gaps: dict[Any, int] = {}  # token gap -> how many tokens followed such a gap
        self.gap_runs: list[GapRun] = []
        self.last_end: Any = None  # end of the last decode-bearing iteration

    def next_finish(self) -> int:
        """How many decode steps from now until the next request finishes (>= 1)."""
        return self.finish_heap[0] - self.steps + 1

    def enter(self, requests: list[Request]) -> None:
        """``requests`` join the decode rows at this boundary."""
        index = self.steps
        self.newcomers.setdefault(index, []).extend(requests)
        finishing, heap = self.finishing, self.finish_heap
        emitted = 1 if self.prefill_first else 0  # tokens each has before its first row
        for r in requests:
            self.first_index[r.id] = index
            last = index + r.output_len - 1 - emitted
            if last not in finishing:
                finishing[last] = []
                heapq.heappush(heap, last)
            finishing[last].append(r)
            self.kv_tokens += r.prompt_len + emitted

    def emit(self, entry: LogEntry, first: Any) -> list[Request] | None:
        """The decode-bearing iteration ``entry`` ended: each of its rows emitted a token at
        the end of each of its ``steps`` steps, the first lasting ``first``. Returns the
        requests that emitted their last token (None: none did)."""
        _, start, end, _, _, ids, _, steps, growth = entry
        rows = len(ids)
        first_end = end if steps == 1 else start + first
        index = self.steps
        gaps = self.gaps
        newcomers = self.newcomers.pop(index, None) if self.newcomers else None
        if newcomers is None:
            last_end = self.last_end
            if last_end is not None:
                gap = first_end - last_end
                gaps[gap] = gaps.get(gap, 0) + rows
        else:
            continuing = rows - len(newcomers)
            if continuing and self.last_end is not None:
                gap = first_end - self.last_end
                gaps[gap] = gaps.get(gap, 0) + continuing
            if self.prefill_first:  # a newcomer's row follows the token its prefill emitted
                for r in newcomers:
                    gap = first_end - self.first_token[r.id]
                    gaps[gap] = gaps.get(gap, 0) + 1
            else:
                for r in newcomers:
                    self.first_token[r.id] = first_end
        if steps > 1:
            if growth:
                self.gap_runs.append(_new_tuple(GapRun, (first + growth, growth, steps - 1, rows)))
            else:
                gaps[first] = gaps.get(first, 0) + (steps - 1) * rows
        self.entries.append(entry)
        self.entry_index.append(index)
        self.steps = last = index + steps
        self.kv_tokens += rows * steps
        self.last_end = end
        heap = self.finish_heap
        if not heap or heap[0] != last - 1:
            return None
        heapq.heappop(heap)
        done = self.finishing.pop(last - 1)
        finish = self.finish
        for r in done:
            finish[r.id] = end
            self.kv_tokens -= r.prompt_len + r.output_len
        return done

    def token_times(self, request: Request) -> list[Any]:
        """Every token time of ``request``, decoded here (under ``prefill_first``, its first
        token's time first)."""
        times: list[Any] = [self.first_token[request.id]] if self.prefill_first else []
        want = request.output_len
        if len(times) == want:
            return times
        first = self.first_index[request.id]
        i = bisect.bisect_right(self.entry_index, first) - 1
        while len(times) < want:
            entry, index = self.entries[i], self.entry_index[i]
            steps, end = entry.steps, entry.end
            if steps == 1:
                times.append(end)
            else:
                start, step, growth = entry.start, entry.first_step(), entry.growth
                for j in range(max(first - index, 0), steps):
                    times.append(
                        end if j == steps - 1 else run_step_start(start, step, growth, j + 1)
                    )
                    if len(times) == want:
                        break
            i += 1
        return times


class RowBook:
    """The tokens of a paged worker's requests (:mod:`.paged_worker`), kept implicit as
    :class:`TokenBook` keeps them: a request emits one token at each step of the decode-bearing
    iterations it is a row of, so its tokens are stretches of the worker's steps (``steps``
    counts them), one stretch per stay among the rows (a preemption ends one), with single
    tokens between them at known times (a completed prompt's under the ``prefill`` rule).
    Times are read off on demand; first tokens, finishes and the gaps are kept as they happen
    (what a run's stop and summary read). The worker says who joins the rows (:meth:`enter`),
    who leaves them (:meth:`leave`), each single token (:meth:`add`) and each decode-bearing
    iteration's end (:meth:`emit`)."""

    __slots__ = (
        "steps",
        "first_token",
        "finish",
        "gaps",
        "gap_runs",
        "last_end",
        "entries",
        "entry_index",
        "parts",
        "entered",
        "last",
        "newcomers",
    )

    def __init__(self) -> None:
        self.steps = 0  # decode steps so far
        self.first_token: dict[str, Any] = {}
        self.finish: dict[str, Any] = {}
        self.gaps: dict[Any, int] = {}  # token gap -> how many tokens followed such a gap
        self.gap_runs: list[GapRun] = []
        self.last_end: Any = None  # end of the last decode-bearing iteration
        # The decode-bearing iterations, each (start, first step, growth, steps, end), and the
        # index of each one's first step.
        self.entries: list[tuple[Any, Any, Any, int, Any]] = []
        self.entry_index: list[int] = []
        self.parts: dict[str, list[Any]] = {}  # request -> its tokens: times, (from, to) steps
        self.entered: dict[str, int] = {}  # a row -> the step index it joined at
        self.last: dict[str, Any] = {}  # not a row -> its last token's time
        self.newcomers: list[str] = []  # joined since the last decode-bearing iteration

    def add(self, rid: str, t: Any) -> None:
        """One token of ``rid`` (not a row) at ``t``."""
        parts = self.parts.get(rid)
        if parts is None:
            self.parts[rid] = [t]
            self.first_token[rid] = t
        else:
            gap = t - self.last[rid]
            self.gaps[gap] = self.gaps.get(gap, 0) + 1
            parts.append(t)
        self.last[rid] = t

    def enter(self, rid: str) -> None:
        """``rid`` joins the rows at this boundary."""
        self.entered[rid] = self.steps
        self.newcomers.append(rid)

    def leave(self, rid: str) -> None:
        """``rid`` leaves the rows (finished, or preempted) at this boundary."""
        since = self.entered.pop(rid)
        if since == self.steps:  # not a step among them this time
            self.newcomers.remove(rid)
            return
        self.parts.setdefault(rid, []).append((since, self.steps))
        self.last[rid] = self.last_end

    def emit(self, start: Any, end: Any, steps: int, first: Any, growth: Any, rows: int) -> None:
        """A decode-bearing iteration of ``rows`` rows ended at ``end``: ``steps`` steps from
        ``start``, the first lasting ``first``, each next one ``growth`` longer."""
        first_end = end if steps == 1 else start + first
        gaps = self.gaps
        newcomers = self.newcomers
        continuing = rows - len(newcomers)
        if continuing and self.last_end is not None:
            gap = first_end - self.last_end
            gaps[gap] = gaps.get(gap, 0) + continuing
        if newcomers:
            last = self.last
            for rid in newcomers:
                before = last.pop(rid, None)
                if before is None:
                    self.first_token[rid] = first_end
                else:
                    gap = first_end - before
                    gaps[gap] = gaps.get(gap, 0) + 1
            newcomers.clear()
        if steps > 1:
            if growth:
                self.gap_runs.append(_new_tuple(GapRun, (first + growth, growth, steps - 1, rows)))
            else:
                gaps[first] = gaps.get(first, 0) + (steps - 1) * rows
        self.entries.append((start, first, growth, steps, end))
        self.entry_index.append(self.steps)
        self.steps += steps
        self.last_end = end

    def token_times(self, request: Request) -> list[Any]:
        """Every token time of ``request``, decoded here."""
        times: list[Any] = []
        for part in self.parts.get(request.id, ()):
            if isinstance(part, tuple):
                self._stretch(part[0], part[1], times)
            else:
                times.append(part)
        return times

    def _stretch(self, since: int, until: int, times: list[Any]) -> None:
        """Append the token times of steps ``since`` to ``until`` (not included)."""
        i = bisect.bisect_right(self.entry_index, since) - 1
        entries, index = self.entries, self.entry_index
        while since < until:
            start, first, growth, steps, end = entries[i]
            stop = min(steps, until - index[i])
            for j in range(since - index[i], stop):
                times.append(end if j == steps - 1 else run_step_start(start, first, growth, j + 1))
            since = index[i] + stop
            i += 1
