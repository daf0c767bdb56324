"""The cost model: what one iteration costs on a device, in seconds (DESIGN.md, "Simulation
semantics", cost model v2), the attention pair term every pass counts, and the geometry of a
run of decode steps (each step reads more KV than the one before, so lasts longer)."""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Iterable, Mapping
from typing import Any

from .checks import check_int, check_number

Piece = tuple[int, int]  # a prompt piece in a pass: (new tokens T, tokens of context C)


def attention_pairs(tokens: int, context: int) -> int:
    """Attention's work in a prompt piece of ``tokens`` new tokens over ``context`` cached ones
    of the same request: each new token attends to the cached ones and to the new ones up to
    itself, ``T*C + T*(T+1)/2`` pairs. The one home of the pair term; the cost model's
    ``prefill_per_pair`` is the price of one pair."""
    return tokens * context + tokens * (tokens + 1) // 2


def run_step_start(start: Any, first: Any, growth: Any, j: int) -> Any:
    """When step ``j`` (from 0; ``j = steps``: the run's end) of a run of decode steps starts,
    step i lasting ``first + i * growth`` (each step's rows read one more cached token each):
    ``start + j*first + growth*j*(j-1)/2``, exact in integer ticks. With
    :func:`run_first_step`, the one home of a decode run's geometry."""
    return start + j * first + growth * (j * (j - 1) // 2)


def run_first_step(duration: Any, growth: Any, steps: int) -> Any:
    """How long the first of a run's ``steps`` decode steps lasts, given the whole run's
    ``duration`` (exact division in integer ticks)."""
    span = duration - growth * (steps * (steps - 1) // 2)
    return span // steps if isinstance(span, int) else span / steps


def piece_sums(pieces: Iterable[Piece]) -> tuple[int, int, int]:
    """(sum T, sum of T*C + T*(T+1)/2, sum C) over prompt pieces (T, C): what a pass's cost
    depends on. ValueError for a piece that is not two ints >= 0."""
    tokens = pairs = context = 0
    for piece in pieces:
        try:
            t, c = (operator.index(x) for x in piece)
        except (TypeError, ValueError):
            t = c = -1
        if t < 0 or c < 0 or any(isinstance(x, bool) for x in piece):
            raise ValueError(f"a piece's tokens and context must be ints >= 0, got {piece!r}")
        tokens += t
        pairs += attention_pairs(t, c)
        context += c
    return tokens, pairs, context


@dataclasses.dataclass(frozen=True, slots=True)
class CostModel:
    """What one iteration costs on a device, in seconds (sizes in tokens and bytes).

    DESIGN.md, "Simulation semantics", cost model v2. A prefill pass over pieces (T_i, C_i)
    costs ``prefill_pass_overhead + prefill_per_token*sum(T) + prefill_per_pair*sum(T*C +
    T*(T+1)/2) + decode_per_kv_token*sum(C)``; a decode step of n rows reading K cached tokens
    ``decode_step_base + decode_per_seq*(n-1) + decode_per_kv_token*K``; a fused iteration
    ``max(decode, compute) + fusion_penalty*min(decode, compute)`` where compute is the prefill
    pass plus ``prefill_per_token*n`` plus ``batch_attention_per_pair*sum(T)*K``: on engines
    that run the batch's attention as one masked operation (``transformers serve``,
    llama.cpp), each new prompt token attends over the decode rows' K cached tokens too (a
    server calibration fits it where its fused iterations support it, else records 0). With
    ``prefill_per_pair = fusion_penalty = batch_attention_per_pair = 0`` this is the lab's
    linear model exactly.

    ``prefill_floor`` (seconds) is the least a pass with prompt tokens costs: below the compute
    knee a short prompt's pass is memory-bound and about flat, so a prefill pass costs
    ``max(prefill_floor, <the terms above>)`` and a fused iteration's compute part likewise
    (a calibration fits it as the constant through its prompts up to the knee). 0, the
    default, leaves every cost unchanged.

    Every term is finite and >= 0; ``link_bandwidth`` (bytes/s) is > 0 and may be infinite;
    ``fusion_penalty`` is in [0, 1]; ``kv_capacity_tokens`` (tokens of KV cache one compute
    worker holds) is a whole number >= 1 or infinite. A decode step must take time
    (``decode_step_base`` > 0) and so must a prefill pass (``prefill_pass_overhead`` or
    ``prefill_per_token`` > 0), or token times could not increase.
    """

    prefill_pass_overhead: float
    prefill_per_token: float
    decode_step_base: float
    decode_per_seq: float = 0.0
    decode_per_kv_token: float = 0.0
    kv_bytes_per_token: float = 0.0
    link_bandwidth: float = math.inf
    link_latency: float = 0.0
    prefill_per_pair: float = 0.0
    fusion_penalty: float = 0.0
    kv_capacity_tokens: float = math.inf
    batch_attention_per_pair: float = 0.0
    prefill_floor: float = 0.0

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("link_bandwidth", "kv_capacity_tokens"):
                checked = check_number(f.name, value, positive=True, allow_inf=True)
            else:
                checked = check_number(f.name, value)
            object.__setattr__(self, f.name, checked)
        if self.decode_step_base <= 0:
            raise ValueError(f"decode_step_base must be > 0 seconds, got {self.decode_step_base!r}")
        if self.prefill_pass_overhead + self.prefill_per_token <= 0:
            raise ValueError(
                "prefill_pass_overhead and prefill_per_token cannot both be 0: a prefill pass "
                "must take time"
            )
        if self.fusion_penalty > 1:
            raise ValueError(f"fusion_penalty must be in [0, 1], got {self.fusion_penalty!r}")
        capacity = self.kv_capacity_tokens
        if not math.isinf(capacity) and (capacity < 1 or capacity != int(capacity)):
            raise ValueError(
                f"kv_capacity_tokens must be a whole number of tokens >= 1 or inf, got {capacity!r}"
            )
        if math.isinf(self.kv_bytes_per_token / self.link_bandwidth):
            raise ValueError(
                "kv_bytes_per_token / link_bandwidth (seconds per transferred token) must be "
                f"finite, got {self.kv_bytes_per_token!r} / {self.link_bandwidth!r}"
            )

    def iteration_sums(
        self, tokens: int, pairs: int, context: int, rows: int = 0, kv_tokens: int = 0
    ) -> float:
        """One iteration given its prompt pieces' sums: ``tokens`` = sum(T), ``pairs`` =
        sum(T*C + T*(T+1)/2), ``context`` = sum(C) (all 0: no prompt piece), and ``rows``
        decode rows reading ``kv_tokens`` cached tokens (0 rows: a prefill pass). The one place
        the formulas of DESIGN.md live; every other cost method goes through it."""
        compute = self._compute(tokens, pairs, context, rows, kv_tokens if rows else 0)
        if rows == 0:
            return compute
        decode = (
            self.decode_step_base
            + self.decode_per_seq * (rows - 1)
            + self.decode_per_kv_token * kv_tokens
        )
        if tokens == 0:
            return decode
        return max(decode, compute) + self.fusion_penalty * min(decode, compute)

    def _compute(self, tokens: int, pairs: int, context: int, rows: int, kv_tokens: int) -> float:
        """A pass's compute part: the prefill terms over the pieces' sums, the ``rows`` decode
        rows riding the linear layers as that many more tokens, never under the floor."""
        terms = (
            self.prefill_pass_overhead
            + self.prefill_per_token * (tokens + rows)
            + self.prefill_per_pair * pairs
            + self.decode_per_kv_token * context
            + self.batch_attention_per_pair * tokens * kv_tokens
        )
        return max(self.prefill_floor, terms)

    def prefill_pieces(self, pieces: Iterable[Piece]) -> float:
        """A prefill pass over prompt pieces ``(T, C)``: T new tokens over C cached tokens of
        the same request (each piece attends only to its own request)."""
        return self.iteration_sums(*piece_sums(pieces))

    def prefill_pass(self, tokens: int, context: int = 0) -> float:
        """A prefill pass over ``tokens`` new tokens attending to ``context`` cached ones."""
        return self.prefill_pieces(((tokens, context),))

    def decode_step(self, rows: int, kv_tokens: int) -> float:
        """A decode step of ``rows`` sequences reading ``kv_tokens`` cached tokens in total."""
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"rows must be an int >= 1, got {rows!r}")
        check_int("kv_tokens", kv_tokens, minimum=0)
        return self.iteration_sums(0, 0, 0, rows, kv_tokens)

    def compute_part(self, pieces: Iterable[Piece], rows: int) -> float:
        """The compute part of a fused pass: the prefill pass over ``pieces`` with the ``rows``
        decode rows riding its linear layers as that many more tokens."""
        check_int("rows", rows, minimum=0)
        tokens, pairs, context = piece_sums(pieces)
        return self._compute(tokens, pairs, context, rows, 0)

    def iteration(self, pieces: Iterable[Piece] = (), rows: int = 0, kv_tokens: int = 0) -> float:
        """One iteration: a prefill pass (no rows), a decode step (no pieces), or a fused pass
        of both: ``max(decode, compute) + fusion_penalty * min(decode, compute)``."""
        tokens, pairs, context = piece_sums(pieces)
        check_int("rows", rows, minimum=0)
        check_int("kv_tokens", kv_tokens, minimum=0)
        if tokens == 0 and rows == 0:
            raise ValueError("an iteration needs prompt tokens or decode rows; got neither")
        return self.iteration_sums(tokens, pairs, context, rows, kv_tokens)

    def fused_iteration(
        self, prefill_tokens: int, decode_rows: int, kv_tokens: int = 0, context: int = 0
    ) -> float:
        """One forward pass of one prompt piece plus decode rows (see :meth:`iteration`)."""
        pieces = ((prefill_tokens, context),) if prefill_tokens else ()
        return self.iteration(pieces, decode_rows, kv_tokens)

    def kv_transfer(self, tokens: int) -> float:
        """Moving the KV cache of ``tokens`` prompt tokens across the link."""
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0, got {tokens!r}")
        return self.link_latency + tokens * (self.kv_bytes_per_token / self.link_bandwidth)

    def chunk_star(self, context: int = 0, rows: int = 0, kv_tokens: int = 0) -> float:
        """C*: the largest chunk T whose compute part fits within the decode step, in tokens.

        With no arguments and no pair term it is the lab's formula exactly, ``(decode_step_base -
        prefill_pass_overhead) / prefill_per_token``. ``context`` is the prompt's tokens already
        cached (the pair and KV-read terms make C* fall as a prompt proceeds); ``rows`` decode
        rows reading ``kv_tokens`` cached tokens set the decode step and ride the pass (0 rows:
        the lab's idealisation, a decode step of ``decode_step_base`` plus the KV read).
        Zero or negative is a diagnosis (the pass's fixed cost eats the decode step), not an
        error; with no per-token cost at all any chunk is free (inf) or none is (-inf).
        """
        check_int("context", context, minimum=0)
        check_int("rows", rows, minimum=0)
        check_int("kv_tokens", kv_tokens, minimum=0)
        decode = self.decode_step(max(rows, 1), kv_tokens)
        fixed = (
            self.prefill_pass_overhead
            + self.decode_per_kv_token * context
            + self.prefill_per_token * rows
        )
        room = decode - fixed
        # compute(T) - fixed = a*T^2 + b*T with a = pair/2, b = per_token + pair*(C + 1/2)
        a = self.prefill_per_pair / 2
        b = (
            self.prefill_per_token
            + self.prefill_per_pair * (context + 0.5)
            + self.batch_attention_per_pair * (kv_tokens if rows else 0)
        )
        if self.prefill_floor > decode:  # no pass fits under the step: the floor's diagnosis
            return (decode - self.prefill_floor) / b if b else -math.inf
        if b == 0:
            return math.inf if room > 0 else -math.inf
        if a == 0 or room <= 0:  # linear, or the diagnosis: the room left at T = 0 in tokens
            return room / b
        return 2 * room / (b + math.sqrt(b * b + 4 * a * room))  # the positive root, stably

    def to_dict(self) -> dict[str, float | str]:
        """JSON-safe fields (an infinite value is written as the string "inf")."""
        out: dict[str, float | str] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = "inf" if math.isinf(value) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> CostModel:
        """Inverse of :meth:`to_dict`; unknown or missing required fields raise ValueError.
        Fields added since (cost model v2) take their defaults when absent."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a cost model must be a JSON object, got {type(data).__name__}")
        names = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(map(str, data)) - set(names))
        if unknown:
            raise ValueError(f"unknown cost model field(s) {unknown}; allowed: {names}")
        values = {k: (math.inf if v == "inf" else v) for k, v in data.items()}
        try:
            return cls(**values)
        except TypeError as err:  # a required field is missing
            raise ValueError(f"cost model: {err}; fields: {names}") from None
