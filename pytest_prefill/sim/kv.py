"""KV memory: what a request holds on a worker, and when it may be admitted (DESIGN.md,
"Simulation semantics", KV capacity). The rule here is ``reserve``: a request reserves
``prompt_len + output_len`` tokens at admission, strictly FCFS, and releases them when it
finishes (on a prefill worker of its own: when its KV has left over the link)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from .cost import CostModel
from .requests import Request


def kv_need(request: Request) -> int:
    """The KV tokens ``request`` reserves: its prompt and every token it will emit."""
    return request.prompt_len + request.output_len


class KVReserve:
    """One worker's KV memory under the reservation rule: ``capacity`` tokens (inf: no limit),
    ``reserved`` of them held by requests admitted and not yet released."""

    __slots__ = ("capacity", "reserved")

    def __init__(self, capacity: float = math.inf) -> None:
        self.capacity = capacity
        self.reserved = 0

    def fits(self, request: Request) -> bool:
        return self.reserved + request.prompt_len + request.output_len <= self.capacity

    def reserve(self, request: Request) -> None:
        self.reserved += request.prompt_len + request.output_len

    def release(self, request: Request) -> None:
        self.reserved -= request.prompt_len + request.output_len


def kv_capacity(requests: Sequence[Request], cost: CostModel) -> float:
    """The KV capacity of a worker as a whole number of tokens (or inf).

    Raises:
        ValueError: naming a request that could never be admitted (it needs more than a
            worker holds).
    """
    capacity = cost.kv_capacity_tokens
    if math.isinf(capacity):
        return capacity
    whole = int(capacity)
    for r in requests:
        if kv_need(r) > whole:
            raise ValueError(
                f"request {r.id!r} needs {kv_need(r)} tokens of KV "
                f"(prompt_len + output_len) but kv_capacity_tokens is {whole}: it can never "
                "be admitted"
            )
    return whole
