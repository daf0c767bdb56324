"""The capacity search as a picture: attainment against arrival rate, one line per deployment,
every probe a marker of its kind (standard library SVG, like the timeline). Rendering only."""

from __future__ import annotations

import dataclasses
import math
import textwrap
from collections.abc import Callable
from xml.sax.saxutils import escape, quoteattr

from pytest_prefill.plan.capacity import CapacityResult
from pytest_prefill.plan.rate_search import DeploymentResult, Probe

PLOT_WIDTH, PLOT_HEIGHT = 600, 400
LEFT, TOP, BOTTOM = 78, 96, 70
MIN_WIDTH = 960
CHAR_WIDTH = 6.4  # sans-serif at 11 px, a generous average, so a legend line fits its box
LEGEND_ROW = 18
PALETTE = (
    "#3f76b5",
    "#e07b28",
    "#2f9a62",
    "#c0392b",
    "#8a55b0",
    "#8c6d31",
    "#d6609f",
    "#5b5b5b",
    "#17a2b8",
    "#9aa02d",
)
# After the ten colours, the same ten dashed, then dotted: 30 deployments drawn apart.
DASHES = ("", "7 3", "2 2")
# Above this target the attainment axis is a log scale of the misses (see AttainmentAxis).
NINES_ABOVE = 0.95
MARKER_KINDS = (
    ("met", "meets the target"),
    ("missed", "misses it"),
    ("stopped-missed", "stopped once it could not meet it (at most here)"),
    ("stopped-met", "stopped once sure to meet it (at most here, at least the target)"),
    ("answer", "the answer: the highest rate that meets it"),
)


def attainment_floor(target: float) -> float:
    """The bottom of the linear attainment axis: the decision band, 30 points below the target
    rounded down to 10% (a 90% target: 60% to 100%), not 0 to 100%, which squashes it."""
    return max(0.0, math.floor(round((target - 0.3) * 10, 9)) / 10)


@dataclasses.dataclass(frozen=True)
class AttainmentAxis:
    """The attainment axis for a ``target``: up to :data:`NINES_ABOVE`, linear from
    :func:`attainment_floor` to 100%; above it, a log scale of the misses (1 - attainment) from
    30x the target's misses to a tenth of them (99%: 70% to 99.9%), so that 99% sits mid-axis
    and 99.9% is as far above it as 90% is below. Values past either end sit on that edge."""

    target: float

    def __post_init__(self) -> None:
        if not 0 < self.target < 1:
            raise ValueError(f"target must be in (0, 1), got {self.target!r}")

    @property
    def nines(self) -> bool:
        return self.target > NINES_ABOVE

    @property
    def bottom(self) -> float:
        if not self.nines:
            return attainment_floor(self.target)
        return 1 - min(1.0, 30 * (1 - self.target))

    @property
    def top(self) -> float:
        return 1 - (1 - self.target) / 10 if self.nines else 1.0

    def position(self, attainment: float) -> float:
        """0 at the bottom edge, 1 at the top; values past an end on that end."""
        value = min(max(attainment, self.bottom), self.top)
        if not self.nines:
            return (value - self.bottom) / (self.top - self.bottom)
        span = math.log(1 - self.bottom) - math.log(1 - self.top)
        return (math.log(1 - self.bottom) - math.log(1 - value)) / span

    def ticks(self) -> list[float]:
        if not self.nines:
            steps = round((1 - self.bottom) / 0.1)
            return [self.bottom + (1 - self.bottom) * i / steps for i in range(steps + 1)]
        low, high = 1 - self.top, 1 - self.bottom  # misses
        misses = {high, low}
        for exponent in range(math.floor(math.log10(low)), 1):
            for mantissa in (1, 2, 5):
                miss = mantissa * 10.0**exponent
                if low * (1 - 1e-9) <= miss <= high * (1 + 1e-9):
                    misses.add(miss)
        # the ends and a 1-2-5 tick may be one value apart by rounding: keep one of each
        return sorted({round(1 - m, 12) for m in misses})

    def label(self, attainment: float) -> str:
        """A value's words, with the decimals its misses need (70%, 99%, 99.5%, 99.9%)."""
        miss = 1 - attainment
        digits = max(0, math.ceil(round(-math.log10(miss), 9)) - 2) if miss > 0 else 0
        return f"{attainment * 100:.{digits}f}%"

    def tick_label(self, attainment: float) -> str:
        """A tick's words: the bottom one "≤" (lower values sit on that edge), the top one "≥"
        when the axis stops short of 100% (100% sits there too)."""
        words = self.label(attainment)
        if math.isclose(attainment, self.bottom) and self.bottom > 0:
            return f"≤{words}"
        return f"≥{words}" if math.isclose(attainment, self.top) and self.top < 1 else words

    def words(self) -> str:
        return "SLO attainment (log scale of the misses)" if self.nines else "SLO attainment"


def _text(
    x: float, y: float, text: str, size: int = 12, anchor: str = "start", **style: str
) -> str:
    extra = "".join(f" {k.replace('_', '-')}={quoteattr(v)}" for k, v in style.items())
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"'
        f' font-family="sans-serif"{extra}>{escape(text)}</text>'
    )


def _decade_ticks(low: float, high: float) -> list[float]:
    ticks = []
    for exponent in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1):
        for mantissa in (1, 2, 5):
            value = mantissa * 10.0**exponent
            if low <= value <= high:
                ticks.append(value)
    return ticks


def series_style(index: int) -> tuple[str, str]:
    """(colour, dash) of the ``index``-th deployment: no two of the first 30 alike."""
    return PALETTE[index % len(PALETTE)], DASHES[(index // len(PALETTE)) % len(DASHES)]


def marker_kind(r: DeploymentResult, p: Probe) -> str:
    """Which of :data:`MARKER_KINDS` a probe is drawn as."""
    if p is r.best:
        return "answer"
    if p.stopped is not None:
        return "stopped-met" if p.stopped == "passed" else "stopped-missed"
    return "met" if p.attainment >= r.target else "missed"


def _marker(kind: str, cx: float, cy: float, colour: str, tip: str = "") -> str:
    title = f"<title>{escape(tip)}</title>" if tip else ""
    if kind.startswith("stopped"):  # a triangle pointing down: the value is an upper bound
        fill = colour if kind == "stopped-met" else "white"
        points = (
            f"{cx - 4.5:.1f},{cy - 3.5:.1f} {cx + 4.5:.1f},{cy - 3.5:.1f} {cx:.1f},{cy + 4:.1f}"
        )
        return (
            f'<polygon class="probe {kind}" points="{points}" fill="{fill}" stroke="{colour}" '
            f'stroke-width="1.3">{title}</polygon>'
        )
    radius = 5.5 if kind == "answer" else 3
    fill = "white" if kind == "missed" else colour
    return (
        f'<circle class="probe {kind}" cx="{cx:.1f}" cy="{cy:.1f}" r="{radius}" fill="{fill}" '
        f'stroke="{colour}" stroke-width="1.5">{title}</circle>'
    )


@dataclasses.dataclass(frozen=True)
class _Frame:
    """The plot's box and how a rate and an attainment map into it."""

    x: Callable[[float], float]
    y: Callable[[float], float]
    left: float
    right: float
    top: float
    bottom: float


def _axes(
    result: CapacityResult, axis: AttainmentAxis, low: float, high: float, f: _Frame
) -> list[str]:
    out = [
        f'<rect x="{f.left}" y="{f.top}" width="{f.right - f.left}" height="{f.bottom - f.top}" '
        'fill="#fafafa" stroke="#999"/>'
    ]
    for value in axis.ticks():
        out.append(
            f'<line x1="{f.left}" x2="{f.right}" y1="{f.y(value):.1f}" y2="{f.y(value):.1f}" '
            'stroke="#e4e4e4"/>'
        )
        out.append(_text(f.left - 8, f.y(value) + 4, axis.tick_label(value), 11, "end"))
    for tick in _decade_ticks(low, high):
        out.append(
            f'<line x1="{f.x(tick):.1f}" x2="{f.x(tick):.1f}" y1="{f.top}" y2="{f.bottom}" '
            'stroke="#e4e4e4"/>'
        )
        out.append(_text(f.x(tick), f.bottom + 16, f"{tick:g}", 11, "middle"))
    ty = f.y(result.target)
    out.append(
        f'<line x1="{f.left}" x2="{f.right}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#333" '
        'stroke-dasharray="6 4"/>'
    )
    out.append(_text(f.right - 4, ty - 5, f"target {axis.label(result.target)}", 11, "end"))
    own = f.x(result.base_rate)
    out.append(
        f'<line x1="{own:.1f}" x2="{own:.1f}" y1="{f.top}" y2="{f.bottom}" stroke="#b03030" '
        'stroke-width="1.5" stroke-dasharray="2 3"/>'
    )
    # above the box, where no target line or curve can run through it
    near_right = own > (f.left + f.right) / 2
    out.append(
        _text(
            own + (-4 if near_right else 4),
            f.top - 6,
            f"this workload: {result.base_rate:.3g} req/s",
            11,
            "end" if near_right else "start",
            fill="#b03030",
        )
    )
    out.append(
        _text(
            (f.left + f.right) / 2,
            f.bottom + 40,
            "arrival rate, requests/s (log scale)",
            12,
            "middle",
        )
    )
    middle = (f.top + f.bottom) / 2
    out.append(
        f'<text x="18" y="{middle:.1f}" font-size="12" font-family="sans-serif" '
        f'text-anchor="middle" transform="rotate(-90 18 {middle:.1f})">{escape(axis.words())}</text>'
    )
    return out


def _series(r: DeploymentResult, colour: str, dash: str, f: _Frame) -> list[str]:
    ordered = sorted(r.probes, key=lambda p: p.rate)
    points = " ".join(f"{f.x(p.rate):.1f},{f.y(p.attainment):.1f}" for p in ordered)
    dashed = f' stroke-dasharray="{dash}"' if dash else ""
    out = [
        f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.8"{dashed}/>'
    ]
    for p in ordered:
        tip = f"{r.deployment.label}: {p.rate:.3g} req/s, attainment {p.attainment:.1%}"
        if p.stopped is not None:
            tip += " (an upper bound: stopped once decided)"
        out.append(_marker(marker_kind(r, p), f.x(p.rate), f.y(p.attainment), colour, tip))
    return out


def _legend_lines(result: CapacityResult) -> list[str]:
    lines = []
    for r in result.ranked():
        answer = f"{r.max_rate:.3g} req/s" if r.best is not None else "never met"
        if r.pruned and r.miss is not None:  # as the table says it
            answer = f"< {r.miss.rate:.3g} req/s (stopped)"
        lines.append(f"{r.deployment.label}: {answer}{'' if r.monotone else ' (!)'}")
    return lines


def _legend(result: CapacityResult, x0: float, y0: float) -> list[str]:
    out = []
    for i, line in enumerate(_legend_lines(result)):
        colour, dash = series_style(i)
        ly = y0 + i * LEGEND_ROW
        dashed = f' stroke-dasharray="{dash}"' if dash else ""
        out.append(
            f'<line x1="{x0}" x2="{x0 + 24}" y1="{ly - 4}" y2="{ly - 4}" stroke="{colour}" '
            f'stroke-width="2.5"{dashed}/>'
        )
        out.append(_text(x0 + 32, ly, line, 11))
    ly = y0 + (len(result.results) + 1) * LEGEND_ROW
    out.append(_text(x0, ly, "markers (one a simulation):", 11, font_weight="bold"))
    for j, (kind, words) in enumerate(MARKER_KINDS, start=1):
        out.append(_marker(kind, x0 + 12, ly + j * LEGEND_ROW - 4, "#555"))
        out.append(_text(x0 + 32, ly + j * LEGEND_ROW, words, 11))
    return out


def _size(result: CapacityResult) -> tuple[int, int, float]:
    """(width, height, legend's left edge): wide enough for the longest legend line, tall
    enough for every legend row."""
    lines = [*_legend_lines(result), *(words for _, words in MARKER_KINDS)]
    legend_x = LEFT + PLOT_WIDTH + 24
    width = max(MIN_WIDTH, math.ceil(legend_x + 32 + CHAR_WIDTH * max(map(len, lines)) + 16))
    rows = len(result.results) + 2 + len(MARKER_KINDS)
    height = max(TOP + PLOT_HEIGHT + BOTTOM, TOP + rows * LEGEND_ROW + 40)
    return width, height, legend_x


def capacity_svg(result: CapacityResult, title: str | None = None) -> str:
    """Attainment against arrival rate, one line per deployment (:func:`series_style`), every
    probe a marker of its kind (:data:`MARKER_KINDS`, in the legend), the target dashed, the
    workload's own rate marked; the attainment axis is :class:`AttainmentAxis`'s."""
    rates = [p.rate for r in result.results for p in r.probes if p.rate > 0]
    rates.append(result.base_rate)  # the workload's own rate is marked
    low, high = min(rates) / 1.3, max(rates) * 1.3
    axis = AttainmentAxis(result.target)
    width, height, legend_x = _size(result)
    x0, x1, y0, y1 = LEFT, LEFT + PLOT_WIDTH, TOP + PLOT_HEIGHT, TOP

    def x(rate: float) -> float:
        return x0 + (math.log(rate) - math.log(low)) / (math.log(high) - math.log(low)) * (x1 - x0)

    def y(attainment: float) -> float:
        return y0 - axis.position(attainment) * (y0 - y1)

    frame = _Frame(x, y, x0, x1, y1, y0)
    heading = title or (
        f"SLO attainment against arrival rate: {result.slo} for >= {axis.label(result.target)}, "
        f"{result.devices} device{'s' * (result.devices != 1)}. {result.workload}. "
        "Simulated, not measured."
    )
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    for i, line in enumerate(textwrap.wrap(heading, int((width - 40) / 8))[:4]):
        weight = "bold" if i == 0 else "normal"
        out.append(_text(20, 24 + 16 * i, line, 13 if i == 0 else 12, font_weight=weight))
    out += _axes(result, axis, low, high, frame)
    for i, r in enumerate(result.ranked()):
        out += _series(r, *series_style(i), frame)
    out += _legend(result, legend_x, TOP + 10)
    if result.attribution:
        out.append(_text(20, height - 12, f"Data: {result.attribution}", 10, fill="#555"))
    out.append("</svg>")
    return "\n".join(out) + "\n"
