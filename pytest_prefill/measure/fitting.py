"""Fits of a cost that is a sum of terms, weighted by relative error (timing noise is
proportional to the time), that refuse any term the scatter cannot support. numpy only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_prefill.measure.line_fit import CLEARLY, SIGNIFICANT, unsupported


@dataclasses.dataclass(frozen=True)
class TermFit:
    """``y ~ sum(value[name] * column[name])`` fitted by relative least squares.

    ``values`` holds every term, 0 for a refused one; ``estimates`` what the last fit that
    still held the term gave it (the number a refusal quotes); ``refused`` maps a refused term to
    the reason, with numbers. ``scatter`` is the measurements' own relative scatter the terms'
    effects were judged against (the points' median IQR / median); ``residual_sd`` the fit's
    relative residual SD, which sets the standard errors (a misfit widens them; it is not
    mistaken for noise).
    """

    names: tuple[str, ...]
    values: Mapping[str, float]
    stderrs: Mapping[str, float]
    estimates: Mapping[str, float]
    effects: Mapping[str, float]
    refused: Mapping[str, str]
    scatter: float
    residual_sd: float
    points: int

    def predict(self, row: Mapping[str, float]) -> float:
        """The fitted cost at a point given by its column values (missing columns count 0)."""
        return sum(self.values[name] * float(row.get(name, 0.0)) for name in self.names)

    def to_dict(self) -> dict[str, Any]:
        return {
            "names": list(self.names),
            "values": dict(self.values),
            "stderrs": dict(self.stderrs),
            "estimates": dict(self.estimates),
            "effects": dict(self.effects),
            "refused": dict(self.refused),
            "scatter": self.scatter,
            "residual_sd": self.residual_sd,
            "points": self.points,
        }


def _check(columns: Mapping[str, Sequence[float]], ys: Sequence[float]) -> int:
    n = len(ys)
    if n == 0:
        raise ValueError("ys must hold at least one measured time")
    if not columns:
        raise ValueError("columns must name at least one term")
    for name, column in columns.items():
        if len(column) != n:
            raise ValueError(f"column {name!r} has {len(column)} values for {n} points")
        if any(not math.isfinite(float(v)) or float(v) < 0 for v in column):
            raise ValueError(f"column {name!r} must hold finite numbers >= 0")
    if any(not math.isfinite(float(y)) or float(y) <= 0 for y in ys):
        raise ValueError("ys must be finite times > 0 (a relative fit divides by them)")
    return n


def _solve(x: Any, y: Any, offset: Any) -> tuple[Any, Any, float]:
    """Relative least squares of ``y - offset`` on ``x``: coefficients, their standard errors,
    the relative residual SD."""
    import numpy as np

    weighted = x / y[:, None]
    target = (y - offset) / y
    coef, *_ = np.linalg.lstsq(weighted, target, rcond=None)
    residuals = weighted @ coef - target
    n, p = weighted.shape
    if n <= p:
        return coef, np.zeros(p), 0.0
    sd = math.sqrt(float(residuals @ residuals) / (n - p))
    gram = weighted.T @ weighted
    try:
        cov = np.linalg.inv(gram) * sd * sd
    except np.linalg.LinAlgError:
        cov = np.linalg.pinv(gram) * sd * sd
    return coef, np.sqrt(np.clip(np.diag(cov), 0.0, None)), sd


def _verdict(
    name: str, value: float, stderr: float, effect: float, scatter: float, dof: int
) -> str:
    """Why ``name`` cannot be kept ('' when it can), by the one rule (:func:`unsupported`)."""
    why = unsupported(value, stderr, effect, scatter, test_stderr=dof > 0)
    if why == "negative":
        return f"negative ({value:.3g}) for a cost that cannot be negative"
    if why == "flat":
        return (
            f"too small to see: it accounts for at most {effect:.1%} of a measured time, not "
            f"more than {CLEARLY:g}x the relative scatter {scatter:.1%}"
        )
    if why == "near zero":
        return f"{value:.3g} is within {SIGNIFICANT:g} standard errors ({stderr:.2g}) of zero"
    return ""


def fit_terms(
    columns: Mapping[str, Sequence[float]],
    ys: Sequence[float],
    spreads: Sequence[float] | None = None,
    *,
    offset: Sequence[float] | None = None,
    required: Sequence[str] = (),
) -> TermFit:
    """Fit non-negative coefficients of ``columns`` to ``ys``, minimising the sum of squared
    relative errors, and refuse terms one at a time (the least supported first) until every
    kept term is positive, more than ``line_fit.SIGNIFICANT`` standard errors from zero, and
    accounts for more than ``line_fit.CLEARLY`` times the measurements' own relative scatter
    (their IQRs) of some measured time.

    Args:
        columns: per term, its multiplier at each point (e.g. 1 for an overhead, the tokens
            for a per-token cost); finite and >= 0.
        ys: the measured times (> 0), one per point.
        spreads: optional per-point scatter in seconds (e.g. each point's IQR).
        offset: optional known part of each time (seconds), fitted around, not fitted.
        required: terms never refused (e.g. a decode step's base cost: the level itself).

    Raises:
        ValueError: for mismatched lengths, no points or terms, or bad values.
    """
    import numpy as np

    n = _check(columns, ys)
    y = np.array([float(v) for v in ys])
    known = np.zeros(n) if offset is None else np.array([float(v) for v in offset])
    if known.shape != (n,) or not np.all(np.isfinite(known)):
        raise ValueError(f"offset must be {n} finite values")
    typical = 0.0
    if spreads is not None:
        if len(spreads) != n or any(not math.isfinite(s) or s < 0 for s in spreads):
            raise ValueError(f"spreads must be {n} finite values >= 0")
        typical = float(np.median(np.array(spreads, dtype=float) / y))
    names = tuple(columns)
    active, refused = list(names), {}
    stats: dict[str, dict[str, float]] = {"estimate": {}, "stderr": {}, "effect": {}}
    coef: Any = np.zeros(0)
    sd = 0.0
    while active:
        x = np.array([[float(columns[name][i]) for name in active] for i in range(n)])
        coef, se, sd = _solve(x.reshape(n, len(active)), y, known)
        candidates = [name for name in active if name not in required]
        worst = _least_supported(active, candidates, x, y, coef, se, typical, stats)
        if worst is None:
            break
        refused[worst[0]] = worst[1]
        active.remove(worst[0])
    values = dict.fromkeys(names, 0.0)
    values.update({name: float(coef[j]) for j, name in enumerate(active)})
    return TermFit(
        names,
        values,
        {name: stats["stderr"].get(name, 0.0) for name in names},
        stats["estimate"],
        {name: stats["effect"].get(name, 0.0) for name in names},
        refused,
        typical,
        sd,
        n,
    )


def _least_supported(
    active: Sequence[str],
    candidates: Sequence[str],
    x: Any,
    y: Any,
    coef: Any,
    se: Any,
    scatter: float,
    stats: dict[str, dict[str, float]],
) -> tuple[str, str] | None:
    """The term of ``candidates`` to refuse next, with the reason (the lowest t-statistic
    among those that fail :func:`_verdict`); None when every one is supported. Records each
    active term's numbers."""
    import numpy as np

    worst: tuple[float, str, str] | None = None
    for j, name in enumerate(active):
        value, stderr = float(coef[j]), float(se[j])
        effect = float(np.max(np.abs(value * x[:, j]) / y))
        stats["estimate"][name], stats["stderr"][name], stats["effect"][name] = (
            value,
            stderr,
            effect,
        )
        reason = _verdict(name, value, stderr, effect, scatter, len(y) - len(active))
        if reason and name in candidates:
            support = value / stderr if stderr > 0 else value
            if worst is None or support < worst[0]:
                worst = (support, name, reason)
    return None if worst is None else (worst[1], worst[2])


def relative_errors(predicted: Sequence[float], measured: Sequence[float]) -> list[float]:
    """(predicted - measured) / measured for each pair."""
    return [(p - m) / m for p, m in zip(predicted, measured, strict=True)]
