"""Ranking flag sets by their knees, and ties the prediction cannot break.

Two predicted knees closer than a tolerance are a tie: the predicted best is every flag set
within the tolerance of the highest knee, and an order agrees with the predicted one when every
pair the prediction does tell apart (more than the tolerance between them) comes out the same
way. Verify's tolerance (:func:`claimed_apart`) is the closest two knees can be predicted and
still be ordered by the claims made of each knee, within ±``within`` of its measured one: 22%
at ±10%. Closer than that both knee claims can hold with the knees either way round (two knees
predicted 14% apart can both hold, at 1.07 and 0.91, and measure in the other order), so a best
claimed there would be a claim stronger than the model's. Never below the simulated search's
own bracket (``knee.PREDICTION_TOLERANCE``, 2%). Standard library only."""

from __future__ import annotations

import math
from collections.abc import Sequence


def _check(values: Sequence[float], tolerance: float) -> None:
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
    if not all(isinstance(v, (int, float)) and v == v for v in values):
        raise ValueError(f"values must be numbers, got {list(values)!r}")


def claimed_apart(within: float) -> float:
    """How far apart (relative, of the lower) two predicted knees must be for claims each
    within ±``within`` of its measured knee to order the measured ones: the higher measures at
    least ``p_a / (1 + within)``, the lower at most ``p_b / (1 - within)``, so
    ``(1 + within) / (1 - within) - 1`` (0.222 at 0.10).

    Raises:
        ValueError: for a ``within`` that is not in [0, 1).
    """
    if not (
        isinstance(within, (int, float))
        and not isinstance(within, bool)
        and math.isfinite(within)
        and 0 <= within < 1
    ):
        raise ValueError(f"within must be a number in [0, 1), got {within!r}")
    return (1 + within) / (1 - within) - 1


def ranking(values: Sequence[float]) -> list[int]:
    """Indices by value, highest first (ties keep the given order)."""
    return sorted(range(len(values)), key=lambda i: -values[i])


def apart(a: float, b: float, tolerance: float) -> bool:
    """Whether ``a`` and ``b`` differ by more than ``tolerance`` of the smaller."""
    low, high = sorted((a, b))
    return high > low * (1 + tolerance)


def tied_best(values: Sequence[float], tolerance: float) -> tuple[int, ...]:
    """The indices whose value is within ``tolerance`` of the highest (highest first; empty
    for no values).

    Raises:
        ValueError: for a negative or non-finite tolerance, or a value that is not a number.
    """
    _check(values, tolerance)
    order = ranking(values)
    return tuple(i for i in order if not apart(values[i], values[order[0]], tolerance))


def agrees(predicted: Sequence[float], measured: Sequence[float], tolerance: float) -> bool:
    """Whether ``measured`` orders every pair that ``predicted`` tells apart (more than
    ``tolerance``) the same way (a measured tie, equal values, breaks such a pair).

    Raises:
        ValueError: for lists of different lengths, or as :func:`tied_best`.
    """
    _check(predicted, tolerance)
    if len(predicted) != len(measured):
        raise ValueError(f"{len(predicted)} predicted values against {len(measured)} measured")
    n = len(predicted)
    return all(
        measured[i] > measured[j]
        for i in range(n)
        for j in range(n)
        if predicted[i] > predicted[j] and apart(predicted[i], predicted[j], tolerance)
    )


def best_verdict(
    predicted: Sequence[float],
    intervals: Sequence[tuple[float, float] | None],
    tolerance: float,
) -> tuple[str, tuple[int, ...]]:
    """The claim "the predicted best sustains the most" judged on the measured knees'
    intervals (low, high; None: unknown, taken as (0, inf)): HOLDS when a predicted best's
    interval lies above every other flag set's, FAILS when another's lies above every
    predicted best's, else UNDECIDED (also when the prediction ties them all: nothing to
    refute). With it, the flag sets that decided it (the one above, HOLDS or FAILS) or those
    whose intervals reach a predicted best's (UNDECIDED).

    Raises:
        ValueError: for lists of different lengths, or as :func:`tied_best`.
    """
    if len(predicted) != len(intervals):
        raise ValueError(f"{len(predicted)} predicted values against {len(intervals)} intervals")
    best = tied_best(predicted, tolerance)
    spans = [span if span is not None else (0.0, math.inf) for span in intervals]
    others = [j for j in range(len(predicted)) if j not in best]
    if not others:
        return "UNDECIDED", best
    for b in best:
        if all(spans[b][0] > spans[j][1] for j in others):
            return "HOLDS", (b,)
    for j in others:
        if all(spans[j][0] > spans[b][1] for b in best):
            return "FAILS", (j,)
    return "UNDECIDED", tuple(j for j in others if spans[j][1] >= spans[best[0]][0])


def order_text(labels: Sequence[str], values: Sequence[float], tolerance: float) -> str:
    """``labels`` highest value first, joined by " > ", or " = " where the next is within
    ``tolerance`` of the first of its run of ties (ties are not transitive: 4.47 = 3.84 and
    3.84 = 3.41 at 22%, but 4.47 > 3.41, so a run is measured from its leader, as
    :func:`tied_best` measures the best from the highest)."""
    _check(values, tolerance)
    order = ranking(values)
    if not order:
        return ""
    text, leader = labels[order[0]], order[0]
    for i in order[1:]:
        if apart(values[leader], values[i], tolerance):
            text += " > " + labels[i]
            leader = i
        else:
            text += " = " + labels[i]
    return text
