"""Our SVG drawings as PNG, for a reader with no browser at hand: the timeline and the capacity
plot are drawn once, as SVG, and this module paints that SVG's few elements (rect, line, path of
straight segments, polyline, polygon, circle, text) with matplotlib's Agg backend, which needs no display.

Why matplotlib and not a rasteriser of our own: a PNG a person reads needs its labels, and
labels need a font and a text renderer; matplotlib brings both (with DejaVu fonts) in one
``pip install ".[plot]"`` on a fresh machine, and nothing else of ours depends on
it. Imported lazily: without it, asking for a PNG is one line saying what to install."""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from typing import Any

SVG_NS = "{http://www.w3.org/2000/svg}"
DPI = 100  # one SVG unit (a CSS pixel) is one PNG pixel
HIDDEN = "#dddddd"  # the timeline's hatched 'hidden' pattern, as a flat light grey
_NUMBER = r"-?\d+(?:\.\d+)?(?:e-?\d+)?"


def need_matplotlib() -> None:
    """ValueError saying how to get matplotlib, when it is not installed."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ValueError(
            'a .png needs matplotlib: pip install ".[plot]" (or write .svg, which needs nothing)'
        )


def svg_to_png(svg: str) -> bytes:
    """``svg`` (one of ours) painted as a PNG, one pixel per SVG unit."""
    need_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    root = ET.fromstring(svg)
    width, height = float(root.get("width", "800")), float(root.get("height", "600"))
    figure = Figure(figsize=(width / DPI, height / DPI), dpi=DPI)
    axes = figure.add_axes((0.0, 0.0, 1.0, 1.0))
    axes.set_xlim(0, width)
    axes.set_ylim(height, 0)
    axes.axis("off")
    for order, element in enumerate(_drawn(root)):
        _paint(axes, element, order)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


def _drawn(root: ET.Element) -> list[ET.Element]:
    """The elements to paint, in document order (a pattern's own shapes and titles are not)."""
    skip = {SVG_NS + "defs", SVG_NS + "title"}
    out: list[ET.Element] = []

    def walk(element: ET.Element) -> None:
        for child in element:
            if child.tag in skip:
                continue
            out.append(child)
            walk(child)

    walk(root)
    return out


def _colour(value: str | None, opacity: str | None = None) -> Any:
    if value is None or value == "none":
        return "none"
    colour = HIDDEN if value.startswith("url(") else value
    if opacity is None:
        return colour
    from matplotlib.colors import to_rgba

    return to_rgba(colour, float(opacity))


def _style(element: ET.Element, default_fill: str | None) -> dict[str, Any]:
    get = element.get
    stroke = get("stroke")
    dash = get("stroke-dasharray")
    return {
        "facecolor": _colour(get("fill", default_fill), get("fill-opacity")),
        "edgecolor": _colour(stroke, get("stroke-opacity")),
        "linewidth": float(get("stroke-width", "1")) * 72 / DPI if stroke else 0.0,
        "linestyle": (0, tuple(float(v) for v in re.findall(_NUMBER, dash))) if dash else "-",
    }


def _paint(axes: Any, element: ET.Element, order: int) -> None:
    from matplotlib.patches import Circle, PathPatch, Polygon, Rectangle

    tag = element.tag.removeprefix(SVG_NS)
    number = lambda name: float(element.get(name) or "0")  # noqa: E731
    if tag == "rect":
        style = _style(element, "#000")
        box = (number("x"), number("y")), number("width"), number("height")
        axes.add_patch(Rectangle(*box, zorder=order, **style))
    elif tag == "circle":
        style = _style(element, "#000")
        axes.add_patch(Circle((number("cx"), number("cy")), number("r"), zorder=order, **style))
    elif tag == "line":
        style = _style(element, None)
        xs, ys = (number("x1"), number("x2")), (number("y1"), number("y2"))
        axes.plot(
            xs,
            ys,
            color=style["edgecolor"],
            linewidth=style["linewidth"] or 0.72,
            linestyle=style["linestyle"],
            zorder=order,
        )
    elif tag in ("polyline", "polygon"):  # SVG fills a polygon black unless told otherwise
        style = _style(element, "none" if tag == "polyline" else "#000")
        values = [float(v) for v in re.findall(_NUMBER, element.get("points", ""))]
        points = list(zip(values[0::2], values[1::2]))
        if len(points) >= 2:
            axes.add_patch(Polygon(points, closed=tag == "polygon", zorder=order, **style))
    elif tag == "path":
        style = _style(element, "#000")
        axes.add_patch(PathPatch(_path(element.get("d", "")), zorder=order, **style))
    elif tag == "text":
        _text(axes, element, order)


def _path(d: str) -> Any:
    """An SVG path of straight segments (M, L, H, V, Z, absolute or relative)."""
    from matplotlib.path import Path

    vertices: list[tuple[float, float]] = []
    codes: list[Any] = []
    x = y = x0 = y0 = 0.0
    for command, args in re.findall(r"([MmLlHhVvZz])([^MmLlHhVvZz]*)", d):
        values = [float(v) for v in re.findall(_NUMBER, args)]
        relative, kind = command.islower(), command.upper()
        if kind == "Z":
            vertices.append((x0, y0))
            codes.append(Path.CLOSEPOLY)
            x, y = x0, y0
            continue
        step = 1 if kind in "HV" else 2
        for i in range(0, len(values) - step + 1, step):
            if kind == "H":
                x = values[i] + (x if relative else 0)
            elif kind == "V":
                y = values[i] + (y if relative else 0)
            else:
                x = values[i] + (x if relative else 0)
                y = values[i + 1] + (y if relative else 0)
            moving = kind == "M" and i == 0
            if moving:
                x0, y0 = x, y
            vertices.append((x, y))
            codes.append(Path.MOVETO if moving else Path.LINETO)
    return Path(vertices or [(0.0, 0.0)], codes or [Path.MOVETO])


def _text(axes: Any, element: ET.Element, order: int) -> None:
    content = "".join(element.itertext())
    if not content.strip():
        return
    size = float(element.get("font-size", "12")) * 72 / DPI
    anchor = {"start": "left", "middle": "center", "end": "right"}
    rotated = re.search(r"rotate\((" + _NUMBER + ")", element.get("transform", ""))
    axes.text(
        float(element.get("x", "0")),
        float(element.get("y", "0")),
        content,
        fontsize=size,
        ha=anchor.get(element.get("text-anchor", "start"), "left"),
        va="baseline",
        color=_colour(element.get("fill", "#000")),
        fontweight="bold" if element.get("font-weight") == "bold" else "normal",
        fontstyle="italic" if element.get("font-style") == "italic" else "normal",
        family="monospace" if "mono" in (element.get("font-family") or "mono") else "sans-serif",
        rotation=-float(rotated.group(1)) if rotated else 0.0,
        rotation_mode="anchor",
        zorder=order,
    )
