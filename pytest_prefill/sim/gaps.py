"""The token gaps of a run as a multiset kept the way the simulator makes them (point masses and
arithmetic runs of decode steps), ranked without expanding them (:mod:`.percentiles`' rules)."""

from __future__ import annotations

import bisect
import itertools
import math
import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

from .percentiles import linear_rank, nearest_rank
from .ticks import TICKS_PER_SECOND, from_ticks, to_ticks


class GapRun(NamedTuple):
    """``length`` gaps ``first, first + growth, ...`` (ticks), each counted ``weight`` times:
    the gaps of a run of decode steps whose cost grows by ``growth`` a step, over ``weight``
    rows."""

    first: int
    growth: int
    length: int
    weight: int


class GapMultiset:
    """The token gaps of a run (vLLM's ITL), kept as the simulator makes them: point masses
    ``{gap: count}`` and arithmetic runs ``(first, growth, k, weight)`` (the k gaps first,
    first + growth, ... each counted ``weight`` times), in ticks. Order statistics, moments and
    the maximum come from these directly; :meth:`items` expands them (one pair per distinct gap).
    """

    def __init__(
        self,
        points: Mapping[int, int] | None = None,
        runs: Iterable[tuple[int, int, int, int]] = (),  # GapRun fields
        *,
        owned: bool = False,
    ) -> None:
        # ``owned``: the caller hands over ``points`` (a dict) and ``runs`` (growth > 0, k and
        # weight > 0), not to be touched again: no copy.
        self._index: tuple[Any, ...] | None = None
        self.points: dict[int, int]
        self.runs: list[tuple[int, int, int, int]]
        if owned and isinstance(points, dict) and isinstance(runs, list):
            self.points, self.runs = points, runs
            self.count = sum(self.points.values()) + sum(k * w for _, _, k, w in self.runs)
            return
        self.points = dict(points or {})
        self.runs = []
        for a, g, k, w in runs:
            if k > 0 and w > 0:
                if g:
                    self.runs.append((a, g, k, w))
                else:
                    self.points[a] = self.points.get(a, 0) + k * w
        self.count = sum(self.points.values()) + sum(k * w for _, _, k, w in self.runs)

    @classmethod
    def of_seconds(cls, pairs: Iterable[tuple[float, int]]) -> GapMultiset:
        """From (gap seconds, count) pairs (a trace built from token times)."""
        points: dict[int, int] = {}
        for gap, n in pairs:
            ticks = to_ticks(gap)
            points[ticks] = points.get(ticks, 0) + n
        return cls(points)

    def __len__(self) -> int:
        return self.count

    def max(self) -> float:
        if not self.count:
            return math.nan
        self._counter()
        return from_ticks(self._high)

    def mean(self) -> float:
        if not self.count:
            return math.nan
        return from_ticks(self._sum()) / self.count

    def _sum(self) -> int:
        total = sum(v * c for v, c in self.points.items())
        for a, g, k, w in self.runs:
            total += w * (k * a + g * (k * (k - 1) // 2))
        return total

    def std(self) -> float:
        """The population standard deviation (numpy's default, as vLLM reports it)."""
        n = self.count
        if not n:
            return math.nan
        squares = sum(v * v * c for v, c in self.points.items())
        for a, g, k, w in self.runs:
            squares += w * (
                k * a * a + a * g * k * (k - 1) + g * g * ((k - 1) * k * (2 * k - 1) // 6)
            )
        total = self._sum()
        try:
            variance = (n * squares - total * total) / (n * n)  # ticks squared, exact until here
        except OverflowError:  # past the float range (a cost of 1e300 s a token)
            return math.inf
        return math.sqrt(variance) / TICKS_PER_SECOND

    def kth(self, k: int) -> float:
        """The k-th smallest gap (1-based)."""
        if not 1 <= k <= self.count:
            raise ValueError(f"k must be in [1, {self.count}], got {k!r}")
        count = self._counter()
        low, high = self._low, self._high
        while low < high:  # the least x with count(x) >= k: always a gap
            middle = (low + high) // 2
            if count(middle) >= k:
                high = middle
            else:
                low = middle + 1
        return from_ticks(low)

    def _counter(self) -> Callable[[int], int]:
        """count(x): how many gaps are <= x, in O(log n) plus about twice the runs that straddle
        x. Runs are grouped by the bit length b of their span (< 2**b): those of a group that
        straddle x start in (x - 2**b, x], a window found by bisection."""
        if self._index is None:
            points = self.points
            keys = sorted(points)
            below = [0, *itertools.accumulate(map(points.__getitem__, keys))]
            weight_at_end: dict[int, int] = {}
            groups: dict[int, list[tuple[int, int, int, int]]] = {}
            for run in sorted(self.runs, key=operator.itemgetter(0)):
                a, g, k, w = run
                span = (k - 1) * g
                weight_at_end[a + span] = weight_at_end.get(a + span, 0) + k * w
                groups.setdefault(span.bit_length(), []).append(run)
            end_values = sorted(weight_at_end)
            full = [0, *itertools.accumulate(map(weight_at_end.__getitem__, end_values))]
            windows = [
                (1 << bits, [a for a, _, _, _ in runs], runs) for bits, runs in groups.items()
            ]
            self._index = (keys, below, end_values, full, windows)
            firsts = [runs[0][0] for _, _, runs in windows]
            self._low = min(keys[:1] + firsts)
            self._high = max(keys[-1:] + end_values[-1:])
        keys, below, end_values, full, windows = self._index
        right = bisect.bisect_right

        def count(x: int) -> int:
            n = below[right(keys, x)] + full[right(end_values, x)]
            for reach, starts, runs in windows:
                for a, g, k, w in runs[right(starts, x - reach) : right(starts, x)]:
                    if a + (k - 1) * g > x:
                        n += ((x - a) // g + 1) * w
            return n

        return count

    def percentile(self, p: float) -> float:
        """Nearest-rank percentile (NaN for no gaps)."""
        rank = nearest_rank(p, self.count)
        return self.kth(rank) if self.count else math.nan

    def linear_percentile(self, p: float) -> float:
        """The percentile as numpy (and so vLLM) computes it: linear interpolation between the
        order statistics around rank (n - 1) * p / 100 (NaN for no gaps)."""
        rank, fraction = linear_rank(p, max(self.count, 1))
        if not self.count:
            return math.nan
        below = self.kth(rank)
        if fraction == 0:
            return below
        return below + (self.kth(rank + 1) - below) * fraction

    def items(self) -> list[tuple[float, int]]:
        """Every distinct gap with its count, by gap (expanded: as long as the run was)."""
        counts = dict(self.points)
        for first, growth, k, w in self.runs:
            for gap in range(first, first + k * growth, growth) if growth else (first,):
                counts[gap] = counts.get(gap, 0) + (w if growth else k * w)
        return [(from_ticks(g), n) for g, n in sorted(counts.items())]
