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


_UNITS = (("ns", 1e-9), ("µs", 1e-6), ("ms", 1e-3), ("s", 1.0))


def readable(seconds: float, digits: int = 3) -> str:
    """``seconds`` in the unit that puts it between 1 and 1,000 (ns, µs, ms, s; ns below, s
    above), to ``digits`` significant digits: 2.317e-05 is "23.2 µs", never "2.317e+04 ns";
    "0 s" for zero, "-" when it is not a finite number."""
    if not math.isfinite(seconds):
        return "-"
    if seconds == 0:
        return "0 s"
    index = 0
    while index + 1 < len(_UNITS) and abs(seconds) >= _UNITS[index + 1][1]:
        index += 1
    value = float(f"{seconds / _UNITS[index][1]:.{digits}g}")
    if abs(value) >= 1000 and index + 1 < len(_UNITS):  # rounding reached the next unit
        index += 1
        value = float(f"{seconds / _UNITS[index][1]:.{digits}g}")
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value)))) if value else 0
    return f"{value:,.{decimals}f} {_UNITS[index][0]}"
