"""The router: which of a pool's workers gets the next request. Least loaded first (the fewest
requests counted against it; ties: the lowest index), in O(log n), for pools of any size."""

from __future__ import annotations

import heapq
from collections.abc import Callable

ROUTERS = ("least-loaded", "prefix")


class LeastLoaded:
    """Picks, among ``size`` workers, the one with the least count (ties: the lowest index)
    in O(log n); workers not touched yet exist only as a count of them (all at 0)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.values: list[int] = []
        self.heap: list[tuple[int, int]] = []

    def pick(self, fits: Callable[[int], bool] | None = None) -> int | None:
        """The least-count worker for which ``fits`` holds (an untouched worker always
        fits); None when there is none."""
        heap, values = self.heap, self.values
        skipped, found = [], None
        while heap:
            value, i = heap[0]
            if values[i] != value:
                heapq.heappop(heap)  # stale
            elif fits is None or fits(i):
                found = heap[0]
                break
            else:
                skipped.append(heapq.heappop(heap))
        for entry in skipped:
            heapq.heappush(heap, entry)
        if len(values) < self.size and (found is None or found[0] > 0):
            values.append(0)
            heapq.heappush(heap, (0, len(values) - 1))
            return len(values) - 1
        return None if found is None else found[1]

    def set(self, i: int, value: int) -> None:
        if self.values[i] != value:
            self.values[i] = value
            heapq.heappush(self.heap, (value, i))


class PrefixRouter:
    """DESIGN.md's ``router="prefix"``: a request goes to the replica whose prefix cache holds
    the longest run of its leading blocks (as admission would count them), ties to the fewest
    unfinished requests, then the lowest index; replicas not touched yet hold nothing."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.values: list[int] = []  # unfinished requests per touched replica

    def pick_by(self, hits: Callable[[int], int]) -> int:
        """The replica to take a request, ``hits(i)`` its cached run on touched replica i."""
        best, key = 0, None
        for i in range(min(len(self.values) + 1, self.size)):
            touched = i < len(self.values)
            k = (hits(i) if touched else 0, -(self.values[i] if touched else 0), -i)
            if key is None or k > key:
                best, key = i, k
        while len(self.values) <= best:
            self.values.append(0)
        return best

    def set(self, i: int, value: int) -> None:
        self.values[i] = value
