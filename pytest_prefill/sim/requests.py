"""Requests: what a run is given (DESIGN.md, "Simulation semantics"), and the one check of a
load that puts it in FCFS order."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from .checks import check_int, check_number


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """A request: its prompt is prefilled, then it takes part in ``output_len`` decode steps.

    ``prefix_blocks``: the hash ids of its prompt's consecutive blocks of the engine's
    ``prefix_block_tokens`` tokens, first to last (Mooncake's ``hash_ids``); two requests
    whose leading ids agree share those blocks' tokens, which a prefix cache may hold (DESIGN.md,
    "Engine semantics (v3)", prefix caching). Ids are ints or non-empty strings; a list is
    kept as a tuple. Empty: nothing to share.
    """

    id: str
    arrival: float
    prompt_len: int
    output_len: int
    prefix_blocks: tuple[int | str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"Request.id must be a non-empty string, got {self.id!r}")
        object.__setattr__(self, "arrival", check_number("Request.arrival", self.arrival))
        check_int("Request.prompt_len", self.prompt_len)
        check_int("Request.output_len", self.output_len)
        object.__setattr__(self, "prefix_blocks", check_prefix_blocks(self.prefix_blocks))


def check_prefix_blocks(blocks: object) -> tuple[int | str, ...]:
    """``blocks`` as a tuple of hash ids (ints, not bools, or non-empty strings).

    Raises:
        ValueError: naming ``Request.prefix_blocks``, for anything else.
    """
    if isinstance(blocks, (str, bytes)) or not isinstance(blocks, (tuple, list)):
        raise ValueError(
            "Request.prefix_blocks must be a tuple (or list) of block hash ids, got "
            f"{type(blocks).__name__}"
        )
    for i, b in enumerate(blocks):
        if isinstance(b, bool) or not (isinstance(b, int) or (isinstance(b, str) and b)):
            raise ValueError(
                f"Request.prefix_blocks[{i}] must be an int or a non-empty string (a block "
                f"hash id), got {b!r}"
            )
    return tuple(blocks)


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
    return in_arrival_order(requests)


def in_arrival_order(load: Iterable[Request]) -> list[Request]:
    """``load`` first come, first served: by arrival, ties by id (the one FCFS order)."""
    return sorted(load, key=lambda r: (r.arrival, r.id))
