"""Percentiles, the one home of both rules the package uses: nearest rank (DESIGN.md: the
summary's percentiles; the k-th smallest value with k = ceil(p/100 * n)) and linear
interpolation between the order statistics around rank (n - 1) * p / 100 (numpy's default, and
so vLLM's serving metrics). Over plain values or a multiset of (value, multiplicity) pairs, with
one range check."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def check_percentile(p: Any, *, nearest: bool = False) -> float:
    """``p`` as a float: a number in [0, 100] (``nearest``: in (0, 100], the nearest rank of
    p = 0 being undefined).

    Raises:
        ValueError: naming ``p`` and the range allowed.
    """
    number = not isinstance(p, bool) and isinstance(p, (int, float))
    if not number or not (0 < p <= 100 if nearest else 0 <= p <= 100):
        allowed = "(0, 100]" if nearest else "[0, 100]"
        raise ValueError(f"percentile p must be a number in {allowed}, got {p!r}")
    return float(p)


def nearest_rank(p: float, count: int) -> int:
    """The 1-based rank of the nearest-rank ``p``-th percentile among ``count`` values:
    ``ceil(p / 100 * count)``, at least 1 (exact for integer ``p``).

    Raises:
        ValueError: for ``p`` outside (0, 100].
    """
    check_percentile(p, nearest=True)
    return max(1, math.ceil(p * count / 100))


def linear_rank(p: float, count: int) -> tuple[int, float]:
    """Where the linear ``p``-th percentile of ``count`` values lies: (the 1-based rank of the
    order statistic below, the fraction of the way to the next one).

    Raises:
        ValueError: for ``p`` outside [0, 100].
    """
    position = (count - 1) * check_percentile(p) / 100
    below = math.floor(position)
    return below + 1, position - below


def weighted_percentile(pairs: Iterable[tuple[Any, int]], p: float) -> Any:
    """Nearest-rank percentile of a multiset given as (value, multiplicity) pairs (NaN for
    none)."""
    ordered = sorted(pair for pair in pairs if pair[1] > 0)
    total = sum(weight for _, weight in ordered)
    rank = nearest_rank(p, total)
    if total == 0:
        return math.nan
    return _kth(ordered, rank)


def percentile(values: Iterable[float], p: float) -> float:
    """Nearest-rank percentile of ``values`` (NaN for none)."""
    return weighted_percentile([(v, 1) for v in values], p)


def weighted_linear_percentile(pairs: Iterable[tuple[float, int]], p: float) -> float:
    """The ``p``-th percentile of a multiset given as (value, multiplicity) pairs, by linear
    interpolation between the two nearest ranks (numpy's default method); NaN for an empty set.

    Raises:
        ValueError: for ``p`` outside [0, 100].
    """
    ordered = sorted((value, count) for value, count in pairs if count > 0)
    total = sum(count for _, count in ordered)
    rank, fraction = linear_rank(p, max(total, 1))
    if total == 0:
        return math.nan
    low = _kth(ordered, rank)
    if fraction == 0:
        return low
    return low + (_kth(ordered, rank + 1) - low) * fraction


def linear_percentile(values: Iterable[float], p: float) -> float:
    """The ``p``-th percentile of ``values`` as numpy (and so vLLM) computes it; NaN for none."""
    return weighted_linear_percentile(((v, 1) for v in values), p)


def _kth(ordered: list[tuple[Any, int]], rank: int) -> Any:
    """The ``rank``-th smallest value (1-based) of sorted (value, multiplicity) pairs."""
    seen = 0
    for value, weight in ordered:
        seen += weight
        if seen >= rank:
            return value
    return ordered[-1][0]
