"""The timeline as a self-contained SVG, drawn from the layout :mod:`.timeline` computes (the
same bars, token rows and stalls as the text rendering). Standard library only."""

from __future__ import annotations

import textwrap
from collections.abc import Collection, Sequence
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from pytest_prefill.plan.sweep import lab_timeline
from pytest_prefill.report.timeline import (
    COLOURS,
    STALL_FACTOR,
    STALL_WINDOW,
    Bar,
    Layout,
    Panel,
    TokenRow,
    Window,
    focus_window,
    layout,
    ticks,
)
from pytest_prefill.sim import CostModel, Trace
from pytest_prefill.units import ms

FONT = "DejaVu Sans Mono, Menlo, Consolas, Liberation Mono, monospace"
CHAR_EM = 0.62  # width of one character of FONT, in font sizes (0.602 for DejaVu Sans Mono)
WIDTH, LEFT, RIGHT, MARGIN = 1400, 118, 24, 12
BAR_H, TOKEN_H, LINE_H = 22, 15, 18


def text_width(text: str, size: float) -> float:
    """Estimated drawn width of ``text`` at font ``size`` (px), as every fit check uses it."""
    return len(text) * size * CHAR_EM


def _text(x: float, y: float, text: str, size: float, **attrs: str) -> str:
    """A <text>; ``attrs`` are SVG attributes with ``_`` for ``-`` (anchor: text-anchor)."""
    attrs = {"text_anchor": attrs.pop("anchor", "start"), "fill": "#222", **attrs}
    more = "".join(f' {k.replace("_", "-")}="{v}"' for k, v in attrs.items())
    return f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}"{more}>{escape(text)}</text>'


def _rect(x: float, y: float, w: float, h: float, fill: str, extra: str = "") -> str:
    return (
        f'<rect x="{x:.2f}" y="{y:.1f}" width="{max(w, 0.0):.2f}" height="{h:.1f}" '
        f'fill="{fill}"{extra}/>'
    )


def _line(xa: float, ya: float, xb: float, yb: float, extra: str) -> str:
    return f'<line x1="{xa:.1f}" y1="{ya:.1f}" x2="{xb:.1f}" y2="{yb:.1f}" {extra}/>'


HATCH = (
    '<defs><pattern id="hidden" width="8" height="8" patternUnits="userSpaceOnUse" '
    'patternTransform="rotate(45)"><rect width="8" height="8" fill="#ffffff" fill-opacity="0.7"/>'
    '<line x1="0" y1="0" x2="0" y2="8" stroke="#999" stroke-width="2"/></pattern></defs>'
)
LEGEND = {
    "prefill": "prefill",
    "decode": "decode",
    "fused": "fused prefill+decode",
    "transfer": "KV transfer",
    "tick": "output token",
    "stall": f"stall: gap > {STALL_FACTOR:g}× the median of its {2 * STALL_WINDOW + 1} around it",
    "wait": "arrival → first token",
    "hidden": "not shown (bar limit)",
    "gpu_seconds": "GPU-s: device-seconds busy, all workers",
}


def render_svg(
    traces: Sequence[Trace],
    *,
    window: Window | None = None,
    max_bars: int | None = None,
    title: str | None = None,
) -> str:
    """A self-contained SVG of ``traces``, one panel each (see :func:`layout` for the arguments;
    ``title`` may hold several lines). Raises ValueError as :func:`layout` does."""
    lay = layout(traces, window, max_bars)
    x0, x1 = LEFT, WIDTH - RIGHT
    span = lay.end - lay.start

    def x(t: float) -> float:
        return x0 + (min(max(t, lay.start), lay.end) - lay.start) / span * (x1 - x0)

    out, y = _svg_heading(lay, title)
    top = y
    for panel in lay.panels:
        drawn, y = _svg_panel(panel, y, x, lay)
        out += drawn
    grid, labels = _svg_axis(lay, top, y, x)
    height = f"{y + 30:.0f}"
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-family={quoteattr(FONT)}>{HATCH}'
        f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>'
    )
    return "\n".join(
        ['<?xml version="1.0" encoding="UTF-8"?>', head, *grid, *out, *labels, "</svg>", ""]
    )


def _svg_heading(lay: Layout, title: str | None) -> tuple[list[str], float]:
    """The title lines and the legend (wrapping when it runs out of room); the y below them."""
    out: list[str] = []
    y: float = MARGIN
    heading = title or "Timeline of " + ", ".join(p.title for p in lay.panels)
    chars = int((WIDTH - 2 * MARGIN) / (14 * CHAR_EM))
    lines = [w for part in heading.split("\n") for w in textwrap.wrap(part, chars) or [""]]
    for i, line in enumerate(lines):
        y += LINE_H + 2
        out.append(_text(MARGIN, y, line, 12 if i else 14, font_weight="normal" if i else "bold"))
    lx, ly = float(MARGIN), y + 22
    cut = any(p.shown_until < lay.end for p in lay.panels)
    for kind, name in LEGEND.items():
        if kind == "hidden" and not cut:
            continue
        mark = _legend_mark(kind, lx, ly)
        indent = 24 if mark else 0  # a legend entry of words alone has no swatch
        w = indent + 2 + text_width(name, 11) + 18
        if lx + w > WIDTH - MARGIN:
            lx, ly = MARGIN, ly + LINE_H
            mark = _legend_mark(kind, lx, ly)
        out += [mark, _text(lx + indent, ly, name, 11)]
        lx += w
    return out, ly + 16


def _svg_panel(panel: Panel, y: float, x: Any, lay: Layout) -> tuple[list[str], float]:
    """One policy's panel from ``y``: heading, worker rows, token rows, notes; the y below."""
    x0, x1 = LEFT, WIDTH - RIGHT
    out: list[str] = []
    y += LINE_H
    head = f"{panel.title}: {panel.description}" if panel.description else panel.title
    if text_width(head, 12) + text_width(panel.stats, 11) + 24 > WIDTH - 2 * MARGIN:
        head = panel.title
    out.append(_text(MARGIN, y, head, 12, font_weight="bold"))
    out.append(_text(WIDTH - MARGIN, y, panel.stats, 11, anchor="end", fill="#444"))
    y += 6
    xc = x(panel.shown_until)  # what a bar limit cut is hatched, behind the bars kept
    tall = len(panel.rows) * (BAR_H + 4) + len(panel.tokens) * (TOKEN_H + 3)
    rows_y = [y + i * (BAR_H + 4) for i in range(len(panel.rows))]
    out += [_rect(x0, ry, x1 - x0, BAR_H, "#f3f3f3") for ry in rows_y]
    if panel.shown_until < lay.end:
        out.append(_rect(xc, y, x1 - xc, tall, "url(#hidden)"))
    for row, ry in zip(panel.rows, rows_y):  # noqa: B905
        out.append(_text(x0 - 8, ry + BAR_H / 2 + 4, row.label, 11, anchor="end"))
        out.extend(_bars_svg(row.bars, ry, x, xc))
    y += len(panel.rows) * (BAR_H + 4)
    for tokens in panel.tokens:
        out.extend(_tokens_svg(tokens, y, x, lay.start, panel.shown_until))
        y += TOKEN_H + 3
    for note in panel.notes:
        y += 14
        out.append(_text(x0, y, note, 11, fill="#7a4a00", font_style="italic"))
    return out, y + 10


def _svg_axis(lay: Layout, top: float, y: float, x: Any) -> tuple[list[str], list[str]]:
    """(the grid and axis lines, the tick labels and the "time (ms)" caption)."""
    x0, x1 = LEFT, WIDTH - RIGHT
    grid = [_line(x0, y, x1, y, 'stroke="#444"')]
    labels = []
    for value, label in ticks(lay.start * 1e3, lay.end * 1e3, x1 - x0, 11 * CHAR_EM):
        gx, half = x(value / 1e3), text_width(label, 11) / 2
        grid += [
            _line(gx, top, gx, y, 'stroke="#e2e2e2"'),
            _line(gx, y, gx, y + 4, 'stroke="#444"'),
        ]
        if x0 - 6 <= gx - half and gx + half <= WIDTH:  # clear of the "time (ms)" caption
            labels.append(_text(gx, y + 16, label, 11, anchor="middle"))
    labels.append(_text(x0 - 8, y + 16, "time (ms)", 11, anchor="end"))
    return grid, labels


def _legend_mark(kind: str, lx: float, ly: float) -> str:
    if kind in COLOURS:
        return _rect(lx, ly - 10, 18, 12, COLOURS[kind])
    if kind == "tick":
        return _line(lx + 9, ly - 11, lx + 9, ly + 2, 'stroke="#222" stroke-width="1.5"')
    if kind == "stall":
        return _rect(lx, ly - 10, 18, 12, "#d62728", ' fill-opacity="0.25" stroke="#d62728"')
    if kind == "gpu_seconds":  # words only
        return ""
    if kind == "wait":
        return f'<path d="M{lx} {ly - 10} h8 l-4 6 z" fill="#555"/>' + _line(
            lx + 4, ly - 4, lx + 18, ly - 4, 'stroke="#888" stroke-dasharray="3 2"'
        )
    return _rect(lx, ly - 10, 18, 12, "url(#hidden)", ' stroke="#999"')


def _bars_svg(bars: Sequence[Bar], y: float, x: Any, x1: float) -> list[str]:
    out = []
    for i, bar in enumerate(bars):
        bx, bw = x(bar.start), x(bar.end) - x(bar.start)
        tip = (
            f"{bar.kind}{f' ×{bar.count:,}' if bar.count > 1 else ''}: "
            f"{ms(bar.start, 1)}–{ms(bar.end, 1)} ms {' '.join(bar.request_ids)}"
        )
        out.append(
            f'<rect x="{bx:.2f}" y="{y:.1f}" width="{bw:.2f}" height="{BAR_H}" '
            f'fill="{COLOURS.get(bar.kind, "#888")}" stroke="#ffffff" '
            f'stroke-width="{0.8 if bw > 3 else 0}"><title>{escape(tip)}</title></rect>'
        )
        step = bw / bar.count
        if bar.count > 1 and step >= 5:  # show the iterations inside a coalesced bar
            ticks = " ".join(f"M{bx + j * step:.1f} {y + BAR_H - 5}v5" for j in range(1, bar.count))
            out.append(f'<path d="{ticks}" stroke="#ffffff" stroke-opacity="0.6"/>')
        room = (x(bars[i + 1].start) if i + 1 < len(bars) else x1) - (bx + bw)
        for label in bar.labels:
            if text_width(label, 10) + 6 <= bw:
                out.append(_text(bx + bw / 2, y + 14.5, label, 10, anchor="middle", fill="#fff"))
                break
            if text_width(label, 10) + 8 <= room:  # beside the bar, in the idle time after it
                out.append(_text(bx + bw + 4, y + 14.5, label, 10, fill="#333"))
                break
    return out


def _tokens_svg(row: TokenRow, y: float, x: Any, lo: float, until: float) -> list[str]:
    out = [_text(LEFT - 8, y + TOKEN_H - 3, f"{row.request} tokens", 10, anchor="end", fill="#444")]
    mid, base = y + TOKEN_H / 2, y + TOKEN_H - 4
    for a, b in row.stalls:
        xa, xb = x(a), x(min(b, until))
        out.append(_rect(xa, y, xb - xa, TOKEN_H, "#d62728", ' fill-opacity="0.18"'))
        label = f"stall {ms(b - a, 1)} ms"
        if text_width(label, 10) + 8 <= xb - xa:
            out.append(
                _text(
                    (xa + xb) / 2,
                    base,
                    label,
                    10,
                    anchor="middle",
                    fill="#a01010",
                    font_weight="bold",
                )
            )
    if row.first_token > lo and row.arrival < until:
        xa, xb = x(row.arrival), x(min(row.first_token, until))
        if row.arrival >= lo:
            out.append(f'<path d="M{xa - 4:.1f} {y} h8 l-4 6 z" fill="#555"/>')
        label = f"TTFT {ms(row.first_token - row.arrival, 1)} ms"
        half, c = text_width(label, 10) / 2 + 4, (xa + xb) / 2
        dashes = [(xa, xb)]
        if 2 * half + 16 <= xb - xa:  # the label sits in a break of the dashed line
            dashes = [(xa, c - half), (c + half, xb)]
            out.append(_text(c, base, label, 10, anchor="middle", fill="#555"))
        for a, b in dashes:
            out.append(_line(a, mid, b, mid, 'stroke="#888" stroke-dasharray="3 2"'))
    if row.ticks:
        d = " ".join(f"M{x(t):.1f} {y + 1:.1f}v{TOKEN_H - 2}" for t in row.ticks)
        out.append(f'<path d="{d}" stroke="#222" stroke-width="1.5"/>')
    return out


def lab_timeline_svg(
    cost: CostModel,
    origin: str,
    *,
    max_bars: int = 150,
    refused: Collection[str] = (),
) -> str:
    """:func:`lab_timeline` (the default lab scenario) as an SVG around the prompt (at most
    ``max_bars`` bars per policy, so a tiny chunk cannot make it megabytes)."""
    drawn = lab_timeline(cost, origin, refused=refused)
    window = focus_window(drawn.traces, "long")
    return render_svg(drawn.traces, window=window, max_bars=max_bars, title=drawn.title)
