"""The one way a duration is printed: seconds inside, milliseconds (or microseconds) only when
a table or a line shows them. Standard library only."""

from __future__ import annotations

import math


def _scaled(value: float, decimals: int) -> str:
    if value == 0 or abs(value) >= 1:
        return f"{value:,.{decimals}f}"
    return f"{value:.3g}"  # below one unit: three significant digits, never a bare 0.00


def ms(seconds: float, decimals: int = 2) -> str:
    """``seconds`` as milliseconds: ``decimals`` places from 1 ms up, three significant digits
    below; "-" when it is not a finite number."""
    return _scaled(seconds * 1e3, decimals) if math.isfinite(seconds) else "-"


def ms_spread(median: float, low: float, high: float) -> str:
    """A measurement as "median ms [low, high]", each as :func:`ms` prints it."""
    return f"{ms(median)} ms [{ms(low)}, {ms(high)}]"


def duration_label(seconds: float) -> str:
    """A duration as a compact label, the way an SLO is written: "1.5s", "100ms"."""
    return f"{seconds:g}s" if seconds >= 1 else f"{seconds * 1e3:g}ms"


def us(seconds: float, decimals: int = 1) -> str:
    """``seconds`` as microseconds, like :func:`ms`."""
    return _scaled(seconds * 1e6, decimals) if math.isfinite(seconds) else "-"
