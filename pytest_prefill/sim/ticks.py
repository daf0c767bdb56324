"""Exact time: inside, the simulator counts time in integer ticks of 2**-64 s, so every sum is
exact (a load shifted by 10**9 s gives the same gaps, and a week-long trace drifts by nothing).
Cost constants are converted once (exactly, for any value of 2**-11 s or more; smaller ones to
the nearest tick); floats appear only at the API. :class:`TickCost` is the cost model in ticks.
"""

from __future__ import annotations

import math

from .cost import CostModel

TICKS_PER_SECOND = 1 << 64
_FLOAT_TICKS = float(TICKS_PER_SECOND)
_EXACT_INT = 2.0**53


def to_ticks(seconds: float, *, up: bool = False) -> int:
    """``seconds`` (finite, >= 0) in ticks of 2**-64 s: exact for any float of 2**-11 s or more;
    a smaller one goes to the nearest tick, or (``up``: arrivals, so that nothing happens
    before one) to the next."""
    if seconds >= _EXACT_INT:
        return int(seconds) << 64
    scaled = seconds * _FLOAT_TICKS  # exact: a power of two
    return math.ceil(scaled) if up else round(scaled)


def from_ticks(ticks: int) -> float:
    """Ticks back to seconds, correctly rounded to the nearest float."""
    return ticks / TICKS_PER_SECOND


class TickCost:
    """A :class:`CostModel` in exact integer ticks: the same formulas, no rounding beyond each
    constant's conversion and the fusion penalty's product (rounded down to a tick)."""

    __slots__ = (
        "overhead",
        "per_token",
        "per_pair",
        "per_kv",
        "base",
        "per_seq",
        "latency",
        "per_transfer",
        "penalty",
        "batch_pair",
        "floor",
    )

    def __init__(self, cost: CostModel) -> None:
        self.overhead = to_ticks(cost.prefill_pass_overhead)
        self.per_token = to_ticks(cost.prefill_per_token)
        self.per_pair = to_ticks(cost.prefill_per_pair)
        self.per_kv = to_ticks(cost.decode_per_kv_token)
        self.base = to_ticks(cost.decode_step_base)
        self.per_seq = to_ticks(cost.decode_per_seq)
        self.latency = to_ticks(cost.link_latency)
        self.per_transfer = to_ticks(cost.kv_bytes_per_token / cost.link_bandwidth)
        self.penalty = cost.fusion_penalty.as_integer_ratio()
        self.batch_pair = to_ticks(cost.batch_attention_per_pair)
        self.floor = to_ticks(cost.prefill_floor)

    def decode(self, rows: int, kv_tokens: int) -> int:
        return self.base + self.per_seq * (rows - 1) + self.per_kv * kv_tokens

    def price(self, tokens: int, pairs: int, context: int, rows: int, kv_tokens: int) -> int:
        """:meth:`CostModel.iteration_sums` in ticks."""
        compute = (
            self.overhead
            + self.per_token * (tokens + rows)
            + self.per_pair * pairs
            + self.per_kv * context
            + self.batch_pair * tokens * kv_tokens
        )
        if compute < self.floor:
            compute = self.floor
        if not rows:
            return compute
        decode = self.base + self.per_seq * (rows - 1) + self.per_kv * kv_tokens
        if not tokens:
            return decode
        high, low = (decode, compute) if decode >= compute else (compute, decode)
        num, den = self.penalty
        return high + low * num // den if num else high

    def transfer(self, tokens: int) -> int:
        return self.latency + self.per_transfer * tokens
