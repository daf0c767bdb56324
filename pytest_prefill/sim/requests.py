"""Requests: what a run is given (DESIGN.md, "Simulation semantics"), and the one check of a
load that puts it in FCFS order."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from .checks import check_int, check_number


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """A request: its prompt is prefilled, then it takes part in ``output_len`` decode steps."""

    id: str
    arrival: float
    prompt_len: int
    output_len: int

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"Request.id must be a non-empty string, got {self.id!r}")
        object.__setattr__(self, "arrival", check_number("Request.arrival", self.arrival))
        check_int("Request.prompt_len", self.prompt_len)
        check_int("Request.output_len", self.output_len)


def validate_load(load: Iterable[Request]) -> list[Request]:
    """The requests of ``load`` in FCFS order (arrival, then id: the order of the list never
    matters). ValueError for anything that is not an iterable of Requests with unique ids."""
    try:
        requests = list(load)
    except TypeError:
        raise ValueError(
            f"load must be an iterable of Request, got {type(load).__name__}"
        ) from None
    seen: set[str] = set()
    for i, r in enumerate(requests):
        if not isinstance(r, Request):
            raise ValueError(f"load[{i}] must be a Request, got {type(r).__name__}")
        if r.id in seen:
            raise ValueError(f"load[{i}].id {r.id!r} is a duplicate; request ids must be unique")
        seen.add(r.id)
    return sorted(requests, key=lambda r: (r.arrival, r.id))
