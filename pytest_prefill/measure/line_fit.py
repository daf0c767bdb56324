"""A straight-line fit that refuses what the noise cannot support, and that rule itself
(:func:`unsupported`), which :mod:`.fitting`'s many-term fit applies too. numpy, imported
lazily."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from pytest_prefill.measure.timing import finite
from pytest_prefill.sim import check_int

# A fitted slope is kept only when the effect it predicts across the measured range is more than
# CLEARLY times the measurements' own scatter, and (with 3 or more points) more than
# SIGNIFICANT standard errors from zero.
CLEARLY = 3.0
SIGNIFICANT = 2.0
UNSUPPORTED = ("negative", "flat", "near zero")


def unsupported(
    value: float,
    stderr: float,
    effect: float,
    scatter: float,
    *,
    nonnegative: bool = True,
    test_stderr: bool = True,
) -> str | None:
    """The one rule for refusing a fitted term: why the noise cannot support ``value`` — one of
    :data:`UNSUPPORTED` — or None when it is kept. ``effect`` is what the term contributes
    across the measured range and ``scatter`` the measurements' own scatter, in the same unit:
    a term whose effect is not more than ``CLEARLY`` times the scatter is "flat"; with
    ``test_stderr`` (enough points to have one), a value within ``SIGNIFICANT`` standard errors
    of zero is "near zero"; with ``nonnegative``, a negative value is "negative"."""
    if nonnegative and value < 0:
        return "negative"
    if effect <= CLEARLY * scatter:
        return "flat"
    if test_stderr and abs(value) <= SIGNIFICANT * stderr:
        return "near zero"
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class Fit:
    """``y = intercept + slope * x`` by least squares, and whether the slope is believed.

    ``refused`` is True when the slope is noise or impossible; ``reason`` says why, with the
    numbers. ``recorded_slope`` is 0 for a refused slope, and ``level`` the constant to use
    with it: the intercept when the slope is kept, the mean of the ys when it is refused.
    """

    slope: float
    intercept: float
    slope_stderr: float
    intercept_stderr: float
    points: int
    x_range: float
    effect: float
    scatter: float
    mean_y: float
    refused: bool
    reason: str

    @property
    def recorded_slope(self) -> float:
        return 0.0 if self.refused else self.slope

    @property
    def level(self) -> float:
        return self.mean_y if self.refused else self.intercept

    def to_dict(self) -> dict[str, Any]:
        return {
            "slope": self.slope,
            "intercept": self.intercept,
            "slope_stderr": self.slope_stderr,
            "intercept_stderr": self.intercept_stderr,
            "points": self.points,
            "x_range": self.x_range,
            "effect": self.effect,
            "scatter": self.scatter,
            "mean_y": self.mean_y,
            "refused": self.refused,
            "reason": self.reason,
        }


def fit_line(
    xs: Sequence[float],
    ys: Sequence[float],
    spreads: Sequence[float] | None = None,
    *,
    nonnegative: bool = True,
    unit: str = "",
    x_unit: str = "unit of x",
) -> Fit:
    """Fit a line to (xs, ys) and refuse a slope the measurements cannot support.

    The effect is ``|slope| * (max(xs) - min(xs))``: how much the fitted cost changes across
    the measured range. The scatter is the larger of the points' typical spread (the median of
    ``spreads``, e.g. each point's IQR) and the residual standard deviation of the fit. The
    slope is refused when the effect is not more than ``CLEARLY`` times the scatter, when
    (with 3+ points) it is within ``SIGNIFICANT`` standard errors of zero, or when it is
    negative and ``nonnegative`` (a cost cannot fall as work grows).

    Args:
        xs, ys: at least two points, two or more distinct xs; finite numbers.
        spreads: optional per-point scatter (>= 0), same length as ``xs``.
        nonnegative: refuse negative slopes.
        unit: how to print a y value in the reason (``"ms"`` multiplies seconds by 1e3).
        x_unit: what one unit of x is, for the reason (e.g. ``"cached token"``).

    Raises:
        ValueError: for mismatched lengths, fewer than two distinct xs, or non-finite input.
    """
    import numpy as np

    x, y, spread_values = _line_input(xs, ys, spreads)
    n = len(x)
    x_mean, y_mean = float(x.mean()), float(y.mean())
    sxx = float(((x - x_mean) ** 2).sum())
    slope = float(((x - x_mean) * (y - y_mean)).sum() / sxx)
    intercept = y_mean - slope * x_mean
    residuals = y - (intercept + slope * x)
    if n > 2:
        residual_sd = math.sqrt(float((residuals**2).sum()) / (n - 2))
        slope_stderr = residual_sd / math.sqrt(sxx)
        intercept_stderr = residual_sd * math.sqrt(1.0 / n + x_mean**2 / sxx)
    else:
        residual_sd = slope_stderr = intercept_stderr = 0.0
    typical_spread = float(np.median(spread_values)) if spread_values else 0.0
    scatter = max(typical_spread, residual_sd)
    x_range = float(x.max() - x.min())
    effect = abs(slope) * x_range
    span = (float(x.min()), float(x.max()), n)
    reason = _line_refusal(
        slope,
        slope_stderr,
        effect,
        scatter,
        span,
        nonnegative=nonnegative,
        unit=unit,
        x_unit=x_unit,
    )
    return Fit(
        slope=slope,
        intercept=intercept,
        slope_stderr=slope_stderr,
        intercept_stderr=intercept_stderr,
        points=n,
        x_range=x_range,
        effect=effect,
        scatter=scatter,
        mean_y=y_mean,
        refused=bool(reason),
        reason=reason,
    )


def _line_input(
    xs: Sequence[float], ys: Sequence[float], spreads: Sequence[float] | None
) -> tuple[Any, Any, list[float]]:
    """``fit_line``'s points as arrays, checked (ValueError naming what is wrong)."""
    import numpy as np

    if len(xs) != len(ys):
        raise ValueError(f"xs and ys must have the same length, got {len(xs)} and {len(ys)}")
    x = np.array([finite("x", v) for v in xs], dtype=float)
    y = np.array([finite("y", v) for v in ys], dtype=float)
    if len(set(x.tolist())) < 2:
        raise ValueError(f"fit_line needs at least two distinct xs, got {list(xs)!r}")
    spread_values: list[float] = []
    if spreads is not None:
        if len(spreads) != len(xs):
            raise ValueError(
                f"spreads must have one value per point, got {len(spreads)} for {len(xs)}"
            )
        spread_values = [finite("spread", s) for s in spreads]
        if min(spread_values) < 0:
            raise ValueError(f"spreads must be >= 0, got {min(spread_values)!r}")
    return x, y, spread_values


def _line_refusal(
    slope: float,
    slope_stderr: float,
    effect: float,
    scatter: float,
    span: tuple[float, float, int],
    *,
    nonnegative: bool,
    unit: str,
    x_unit: str,
) -> str:
    """Why ``fit_line`` refuses the slope ('' when it keeps it); ``span`` is (min x, max x,
    points)."""
    scale = 1e3 if unit == "ms" else 1.0

    def show(value: float) -> str:
        return f"{value * scale:.4g}{' ' + unit if unit else ''}"

    low, high, n = span
    why = unsupported(
        slope, slope_stderr, effect, scatter, nonnegative=nonnegative, test_stderr=n > 2
    )
    if why == "negative":
        return (
            f"negative slope ({slope * scale:.3g} {unit + ' ' if unit else ''}per {x_unit}) for a "
            "cost that cannot fall as work grows"
        )
    if why == "flat":
        return (
            f"flat within noise: the effect across x = {low:g}..{high:g} is "
            f"{show(effect)}, not more than {CLEARLY:g}x the scatter {show(scatter)}"
        )
    if why == "near zero":
        return (
            f"slope {slope * scale:.3g} is within {SIGNIFICANT:g} standard errors "
            f"({slope_stderr * scale:.3g}) of zero"
        )
    return ""


def fit_from_dict(data: Any) -> Fit:
    """Inverse of :meth:`Fit.to_dict`; ValueError for a missing or mistyped field."""
    if not isinstance(data, dict):
        raise ValueError(f"a fit must be a JSON object, got {type(data).__name__}")
    names = [f.name for f in dataclasses.fields(Fit)]
    missing = [name for name in names if name not in data]
    if missing:
        raise ValueError(f"fit is missing field(s) {missing}")
    values: dict[str, Any] = {}
    for name in names:
        if name == "refused":
            if not isinstance(data[name], bool):
                raise ValueError(f"fit field 'refused' must be true or false, got {data[name]!r}")
            values[name] = data[name]
        elif name == "reason":
            values[name] = str(data[name])
        elif name == "points":
            values[name] = check_int("points", data[name], minimum=2)
        else:
            values[name] = finite(f"fit field {name!r}", data[name])
    return Fit(**values)
