"""The timeline of one or more traces, drawn from ``Trace.events`` (the run the tables report, so
the picture cannot contradict the numbers): the layout both renderings share (bars, token rows,
stalls, the window) and the plain-text rendering; the SVG is :mod:`.timeline_svg`. Standard
library only."""

from __future__ import annotations

import dataclasses
import math
import statistics
import textwrap
from collections.abc import Sequence
from typing import Any

from pytest_prefill.sim import LINK, Event, Trace, run_first_step, run_step_start
from pytest_prefill.units import ms

Window = tuple[float, float]  # (start, end) in seconds
Labels = tuple[str, ...]

MAX_TOKEN_ROWS = 8  # token rows per trace; the rest are named in a note
# A gap between two tokens is a stall when it is longer than STALL_FACTOR times the median of
# the request's gaps around it (STALL_WINDOW either side, itself included): a step that waited
# for other work stands out from its neighbours; decode that is slower for a while (a long KV
# joined the batch) does not, however slow.
STALL_FACTOR = 1.5
STALL_WINDOW = 4
COLOURS = {"prefill": "#e07b28", "decode": "#3f76b5", "fused": "#8a55b0", "transfer": "#2f9a62"}
KIND_LETTERS = {"prefill": "P", "decode": "d", "fused": "F", "transfer": "K"}
DESCRIPTIONS = {
    "shared": "one worker; a prefill pass runs alone and every live stream waits for it",
    "coscheduled": "one worker; whole prompts are fused into the decode step",
    "chunked": "one worker; each step fuses the decodes with a chunk of prompt (Sarathi-Serve)",
    "disaggregated": "prefill and decode on separate workers; the KV cache crosses a link",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Bar:
    """``count`` back-to-back iterations (or one KV transfer) on one resource, drawn as one bar.

    ``labels`` are the texts to write on it, longest first; a renderer writes the longest that fits.
    """

    resource: str
    start: float
    end: float
    kind: str
    count: int
    labels: tuple[str, ...]
    request_ids: tuple[str, ...] = ()
    growth: float = 0.0  # each iteration lasts this much longer than the one before it

    @property
    def duration(self) -> float:
        return self.end - self.start

    @property
    def iteration(self) -> float:
        """Seconds of one of the ``count`` iterations, on average."""
        return self.duration / self.count

    @property
    def label(self) -> str:
        return self.labels[0] if self.labels else ""

    def edge(self, i: int) -> float:
        """When iteration ``i`` (0..count) starts; ``edge(count)`` is the end."""
        if i >= self.count:
            return self.end
        first = run_first_step(self.duration, self.growth, self.count)
        return run_step_start(self.start, first, self.growth, i)

    def part(self, first: int, stop: int) -> Bar:
        """Iterations ``first`` to ``stop - 1`` as a bar of their own."""
        labels = self.labels
        if self.kind == "decode" and stop - first != self.count:
            labels = _labels("decode", (), self.request_ids, stop - first)
        return dataclasses.replace(
            self, start=self.edge(first), end=self.edge(stop), count=stop - first, labels=labels
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    """One resource of one trace: ``name`` as in the trace, ``label`` as drawn."""

    name: str
    label: str
    bars: tuple[Bar, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class TokenRow:
    """The output tokens of one request that fall in view, and its stalls (:func:`stalls`) that
    overlap the view."""

    request: str
    arrival: float
    first_token: float
    ticks: tuple[float, ...]
    stalls: tuple[tuple[float, float], ...]


@dataclasses.dataclass(frozen=True, slots=True)
class Dropped:
    """Work of one trace that the picture leaves out, on one side of what it shows."""

    side: str  # "before" or "after"
    at: float  # seconds: the edge of what is shown
    iterations: int  # compute iterations (a coalesced bar counts each of its iterations)
    transfers: int  # KV transfers on the link
    gpu_seconds: float  # busy time of the dropped iterations
    reason: str  # "window", or the bar limit that cut it

    @property
    def text(self) -> str:
        parts = []
        if self.iterations:
            parts.append(f"{self.iterations:,} iteration{'s' * (self.iterations != 1)}")
        if self.transfers:
            parts.append(f"{self.transfers:,} KV transfer{'s' * (self.transfers != 1)}")
        why = f" (bar limit {self.reason})" if self.reason != "window" else ""
        return f"… {' and '.join(parts)} {self.side} {_seconds(self.at)} s not shown{why}"


@dataclasses.dataclass(frozen=True, slots=True)
class Panel:
    """One trace: its resource rows, token rows, and what was left out."""

    title: str
    description: str
    stats: str
    rows: tuple[Row, ...]
    tokens: tuple[TokenRow, ...]
    dropped: tuple[Dropped, ...]
    hidden_requests: tuple[str, ...]
    shown_until: float  # the view's end, or earlier where a bar limit cut the trace

    @property
    def notes(self) -> tuple[str, ...]:
        notes = [d.text for d in self.dropped]
        if self.hidden_requests:
            n = len(self.hidden_requests)
            notes.append(f"… token rows of {n:,} more request{'s' * (n != 1)} not shown")
        return tuple(notes)


@dataclasses.dataclass(frozen=True, slots=True)
class Layout:
    """What a timeline shows: the view ``start``..``end`` (seconds) and one panel per trace."""

    start: float
    end: float
    panels: tuple[Panel, ...]

    @property
    def dropped(self) -> tuple[Dropped, ...]:
        return tuple(d for p in self.panels for d in p.dropped)


def _seconds(t: float) -> str:
    text = f"{t:,.3f}".rstrip("0")
    return text + "0" if text.endswith(".") else text


def _labels(kind: str, prefill: Any, ids: Sequence[str], count: int, rows: int = 0) -> Labels:
    """Texts for a bar, longest first."""
    who = "+".join(ids) if len(ids) <= 3 else f"{len(ids)} requests"
    tokens = sum(t for _, t in prefill)
    if kind == "decode":
        if count == 1:
            return ()
        return (f"decode ×{count:,} ({who})", f"decode ×{count:,}", f"×{count:,}")
    if kind == "transfer":
        return (f"KV of {who} ({tokens:,} tok)", f"KV {who}", "KV")
    if kind == "fused":
        both = f"{tokens:,} tok + {rows} decode{'s' * (rows != 1)}"
        return (
            f"{who}: {both}",
            both,
            f"{tokens:,} tok + {rows} dec",
            f"{tokens:,} tok",
            f"{tokens:,}",
        )
    return (f"prefill {who} ({tokens:,} tok)", f"{who} {tokens:,} tok", who, f"{tokens:,} tok")


def _continues(bar: Bar, e: Event) -> bool:
    """Whether ``e``'s steps carry on ``bar``'s: the same growth, and its first step as long as
    the bar's last one plus that growth."""
    if not math.isclose(bar.growth, e.growth, rel_tol=1e-9, abs_tol=1e-15):
        return False
    last = bar.end - bar.edge(bar.count - 1)
    first = e.step_start(1) - e.start
    return math.isclose(first, last + e.growth, rel_tol=1e-9)


def coalesce(events: Sequence[Event]) -> list[Bar]:
    """Bars for ``events``: back-to-back decode iterations on one resource with the same rows, each
    as long as the one before plus the same growth, become one bar with their summed ``count``;
    everything else, one bar each.
    Total time and iteration count are kept."""
    bars: list[Bar] = []
    last: dict[str, int] = {}  # resource -> index of its latest bar
    for e in sorted(events, key=lambda e: e.start):
        prev = bars[last[e.resource]] if e.resource in last else None
        if (
            prev is not None
            and e.kind == prev.kind == "decode"
            and prev.end == e.start
            and prev.request_ids == e.decode_ids
            and _continues(prev, e)
        ):
            count = prev.count + e.count
            labels = _labels("decode", (), e.decode_ids, count)
            bars[last[e.resource]] = dataclasses.replace(
                prev, end=e.end, count=count, labels=labels
            )
            continue
        ids = e.decode_ids if e.kind == "decode" else tuple(r for r, _ in e.prefill)
        labels = _labels(e.kind, e.prefill, ids, e.count, e.decode_rows)
        last[e.resource] = len(bars)
        bars.append(Bar(e.resource, e.start, e.end, e.kind, e.count, labels, ids, e.growth))
    return bars


def _check_traces(traces: Any) -> list[Trace]:
    if isinstance(traces, Trace) or not isinstance(traces, Sequence):
        raise ValueError(f"traces must be a sequence of Trace, got {type(traces).__name__}")
    if not traces:
        raise ValueError("traces must hold at least one Trace, got an empty sequence")
    for i, t in enumerate(traces):
        if not isinstance(t, Trace):
            raise ValueError(f"traces[{i}] must be a Trace, got {type(t).__name__}")
    return list(traces)


MIN_WINDOW = 1e-9  # seconds: a narrower window has no room between two floats to draw in


def check_window(window: Any) -> tuple[float, float]:
    """``window`` as (start, end) seconds: 0 <= start < end, finite, at least a nanosecond wide.

    Raises:
        ValueError: naming the window and what is allowed.
    """
    try:
        start, end = (float(v) for v in window)
        ok = all(not isinstance(v, bool) for v in window) and 0 <= start < end < math.inf
    except (TypeError, ValueError):
        ok = False
    if not ok or end - start < MIN_WINDOW:
        raise ValueError(
            "window must be (start, end) in seconds, 0 <= start < end, finite, at least "
            f"{MIN_WINDOW:g} s wide; got {window!r}"
        )
    return start, end


def _extent(traces: Sequence[Trace]) -> tuple[float, float]:
    end = max(
        [e.end for t in traces for e in t.events]
        + [r.finish for t in traces for r in t.requests.values() if r.token_times]
        + [0.0]
    )
    return 0.0, end if end > 0 else 1.0


def focus_window(traces: Sequence[Trace], request_id: str, margin: float = 0.15) -> Window:
    """A window from ``request_id``'s arrival to its first token under every trace, padded by
    ``margin`` of that span on each side (from 0 when the padding would leave a sliver)."""
    traces = _check_traces(traces)
    records = [t.requests[request_id] for t in traces if request_id in t.requests]
    if not records:
        raise ValueError(f"request_id {request_id!r} is in none of the traces")
    arrival = min(r.arrival for r in records)
    last = max(r.first_token for r in records)
    pad = max(0.0, margin) * (last - arrival)
    start = arrival - pad
    return (0.0 if start < pad else start), last + pad


def layout(
    traces: Sequence[Trace],
    window: Window | None = None,
    max_bars: int | None = None,
    *,
    token_rows: int = MAX_TOKEN_ROWS,
) -> Layout:
    """What :func:`render_svg` and :func:`render_text` draw: every event of each trace is either
    in a bar of the view or counted in a :class:`Dropped` note.

    Args:
        traces: one panel each, in order.
        window: (start, end) seconds to show; default: 0 to the end of the last trace.
        max_bars: draw at most this many bars per trace (the earliest); the rest is noted.
        token_rows: draw the tokens of at most this many requests per trace.

    Raises:
        ValueError: naming the argument, for no traces, a bad window or a non-positive limit.
    """
    traces = _check_traces(traces)
    for name, value in (("max_bars", max_bars), ("token_rows", token_rows)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    start, end = check_window(window) if window is not None else _extent(traces)
    return Layout(start, end, tuple(_panel(t, start, end, max_bars, token_rows) for t in traces))


class _Tally:
    def __init__(self) -> None:
        self.iterations, self.transfers, self.gpu_seconds, self.reason = 0, 0, 0.0, "window"

    def add(self, bar: Bar) -> None:
        if bar.resource == LINK:
            self.transfers += bar.count
        else:
            self.iterations += bar.count
            self.gpu_seconds += bar.duration

    def note(self, side: str, at: float) -> tuple[Dropped, ...]:
        if not (self.iterations or self.transfers):
            return ()
        return (Dropped(side, at, self.iterations, self.transfers, self.gpu_seconds, self.reason),)


def _panel(trace: Trace, lo: float, hi: float, max_bars: int | None, token_rows: int) -> Panel:
    order = {name: i for i, name in enumerate(trace.resources)}
    before, after = _Tally(), _Tally()
    shown: list[Bar] = []
    for bar in coalesce(trace.events):
        # iterations [0, first) end by lo, [stop, count) start at or after hi
        stop = sum(1 for i in range(bar.count) if bar.edge(i) < hi) if bar.end > hi else bar.count
        first = sum(1 for i in range(1, stop + 1) if bar.edge(i) <= lo) if bar.start < lo else 0
        for tally, a, b in ((before, 0, first), (after, stop, bar.count)):
            if b > a:
                tally.add(bar.part(a, b) if (a, b) != (0, bar.count) else bar)
        if stop > first:
            shown.append(bar.part(first, stop) if (first, stop) != (0, bar.count) else bar)
    until = hi
    if max_bars is not None and len(shown) > max_bars:
        shown.sort(key=lambda b: (b.start, order[b.resource]))
        until = shown[max_bars].start
        for bar in shown:
            if bar.start >= until:
                after.add(bar)
        shown = [b for b in shown if b.start < until]
        after.reason = f"{max_bars:,}"
    by_row: dict[str, list[Bar]] = {name: [] for name in order}
    for bar in sorted(shown, key=lambda b: b.start):
        by_row[bar.resource].append(bar)
    rows = tuple(Row(n, "KV link" if n == LINK else n, tuple(b)) for n, b in by_row.items())
    summary = trace.summary()
    tokens: list[TokenRow] = []
    hidden: list[str] = []
    for r in trace.requests.values():
        if not r.token_times or r.arrival >= until or r.finish < lo:
            continue
        if len(tokens) == token_rows:
            hidden.append(r.id)
            continue
        times = r.token_times
        shown_stalls = tuple((a, b) for a, b in stalls(times) if b > lo and a < until)
        ticks = tuple(t for t in times if lo <= t <= until)
        tokens.append(TokenRow(r.id, r.arrival, r.first_token, ticks, shown_stalls))
    title = trace.policy
    if trace.policy == "chunked" and trace.chunk:
        title += f" (chunk {trace.chunk:,} tokens)"
    stats = "nothing ran"
    if not summary.empty:
        stats = (
            f"whole run: {stall_words(trace, summary.max_stall)} · TTFT p99 "
            f"{ms(summary.ttft_p99, 1)} ms · {summary.gpu_seconds:,.2f} GPU-s"
        )
    dropped = before.note("before", lo) + after.note("after", until)
    description = DESCRIPTIONS.get(trace.policy, "")
    return Panel(title, description, stats, rows, tuple(tokens), dropped, tuple(hidden), until)


def stalls(times: Sequence[float]) -> list[tuple[float, float]]:
    """The gaps between consecutive ``times`` (one request's tokens) that are stalls: longer
    than ``STALL_FACTOR`` x the median (the lower middle) of the gaps around each, within
    ``STALL_WINDOW`` either side and itself included."""
    gaps = [b - a for a, b in zip(times, times[1:])]  # noqa: B905
    out = []
    for i, gap in enumerate(gaps):
        around = gaps[max(0, i - STALL_WINDOW) : i + STALL_WINDOW + 1]
        if gap > STALL_FACTOR * statistics.median_low(around):
            out.append((times[i], times[i + 1]))
    return out


def stall_words(trace: Trace, longest_gap: float) -> str:
    """The row's stall figure by the shading's rule: the longest stall of the whole run; where
    the longest gap between tokens is not a stall (decode slower for a while), that gap too,
    said to be none."""
    found = [b - a for r in trace.requests.values() for a, b in stalls(r.token_times)]
    longest = max(found, default=0.0)
    if found and math.isclose(longest, longest_gap):
        return f"max stall {ms(longest, 1)} ms"
    # the longest gap is in a slow stretch, not a stall: the legend says what a stall is
    if found:
        return f"max stall {ms(longest, 1)} ms (longest gap {ms(longest_gap, 1)} ms)"
    return f"no stall (longest gap {ms(longest_gap, 1)} ms)"


TEXT_LABEL_W = 14  # characters of row label in the text rendering


def _text_panel(panel: Panel, lay: Layout, col: Any, cols: int, width: int) -> list[str]:
    """One policy's panel as text lines: heading, worker rows, token rows, the cut, notes."""
    label_w, span = TEXT_LABEL_W, lay.end - lay.start
    lines = textwrap.wrap(f"{panel.title}  ({panel.stats})", width, subsequent_indent="  ")
    for row in panel.rows:
        cells = [" "] * cols
        for bar in row.bars:
            c0, c1 = col(bar.start), col(bar.end - 1e-12 * span)
            letter = KIND_LETTERS.get(bar.kind, "?")
            cells[c0 : c1 + 1] = [letter] * (c1 + 1 - c0)
            if c1 > c0:  # a bar wider than a column starts with |; coalesced ones say ×N
                cells[c0] = "|"
            fits = next((t for t in bar.labels if len(t) <= c1 - c0 - 1), "")
            cells[c0 + 1 : c0 + 1 + len(fits)] = list(fits)
        lines.append(row.label[: label_w - 1].ljust(label_w) + "".join(cells).rstrip())
    for tokens in panel.tokens:
        cells = [" "] * cols
        if tokens.first_token > lay.start and tokens.arrival < panel.shown_until:
            first = col(min(tokens.first_token, panel.shown_until))
            cells[col(tokens.arrival) : first] = ["."] * (first - col(tokens.arrival))
        for a, b in tokens.stalls:
            gap = range(col(a) + 1, col(min(b, panel.shown_until)))
            cells[gap.start : gap.stop] = ["-"] * len(gap)
        for t in tokens.ticks:
            cells[col(t)] = "^"
        name = f"{tokens.request} tokens"[: label_w - 1]
        lines.append(name.ljust(label_w) + "".join(cells).rstrip())
    if panel.shown_until < lay.end:
        at = label_w + col(panel.shown_until)
        mark = "└ not shown from here"
        lines.append(
            " " * at + mark if at + len(mark) <= width else (mark[2:] + " ┘").rjust(at + 1)
        )
    for note in panel.notes:
        lines += textwrap.wrap(note, width, initial_indent="  ", subsequent_indent="    ")
    return lines + [""]


def ticks(lo: float, hi: float, room: float, char: float) -> list[tuple[float, str]]:
    """Ticks (value, label) from ``lo`` to ``hi`` at a 1-2-5 step whose labels, ``char`` wide
    per character, do not touch across ``room``."""
    span = hi - lo
    base = 10.0 ** math.floor(math.log10(span / 1000))
    while True:
        for step in (base, 2 * base, 5 * base):
            if span / step * 3 * char > room:  # too many ticks for even short labels
                continue
            places = max(0, -math.floor(math.log10(step) + 1e-9))
            first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
            ticks = [(k * step, f"{k * step:,.{places}f}") for k in range(first, last + 1)]
            if room * step / span >= (max(len(t) for _, t in ticks) + 2) * char:
                return ticks
        base *= 10


# ---- text ------------------------------------------------------------------------------------


def render_text(
    traces: Sequence[Trace],
    *,
    width: int = 100,
    window: Window | None = None,
    max_bars: int | None = None,
) -> str:
    """The timeline as plain text, ``width`` characters wide: one character per slice of time.

    Raises:
        ValueError: for a ``width`` under 40, or as :func:`layout` does.
    """
    if isinstance(width, bool) or not isinstance(width, int) or width < 40:
        raise ValueError(f"width must be an integer >= 40 characters, got {width!r}")
    lay = layout(traces, window, max_bars)
    cols = width - TEXT_LABEL_W
    span = lay.end - lay.start

    def col(t: float) -> int:
        return min(cols - 1, max(0, int((t - lay.start) / span * cols)))

    lines = []
    for panel in lay.panels:
        lines += _text_panel(panel, lay, col, cols, width)
    ruler, labels = [" "] * cols, [" "] * cols
    for value, label in ticks(lay.start * 1e3, lay.end * 1e3, cols, 1):
        c = col(value / 1e3)
        ruler[c] = "+"
        if c + len(label) <= cols:
            labels[c : c + len(label)] = list(label)
    lines.append(" " * TEXT_LABEL_W + "".join(ruler).rstrip())
    lines.append("time (ms)".ljust(TEXT_LABEL_W) + "".join(labels).rstrip())
    lines += textwrap.wrap(
        "P prefill · d decode · F fused prefill+decode · K KV transfer · "
        "| bar start · ^ token · - stall · . waiting for first token · GPU-s: device-seconds "
        "busy, all workers",
        width,
    )
    return "\n".join(lines) + "\n"
