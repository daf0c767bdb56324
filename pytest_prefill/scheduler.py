"""Iteration-level simulator of LLM serving policies: shared worker, co-scheduled batching,
chunked prefill (Sarathi-Serve) and prefill/decode disaggregation (DistServe).

Standard library only and copy-and-run: ``python pytest_prefill/scheduler.py`` prints a policy
comparison. Its :class:`Worker` (the scheduling rules, one iteration at a time) is also what the
real engine runs. The semantics are DESIGN.md's "Simulation semantics"; each point is pinned by a
test.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import gc
import heapq
import itertools
import math
import operator
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

POLICIES = ("shared", "coscheduled", "chunked", "disaggregated")
KINDS = ("prefill", "decode", "fused", "transfer")
LINK = "link"  # the resource name of the KV link; every other resource is a compute worker


def check_number(
    field: str, value: Any, *, positive: bool = False, allow_inf: bool = False
) -> float:
    """Return ``value`` as a float, or raise ValueError naming ``field`` and what is allowed.

    The one number check of the package: rejects bools, non-numbers, NaN, negative values (and
    0 when ``positive``), infinity unless ``allow_inf``, and ints too large for a float."""
    allowed = "a positive number" if positive else "a finite number >= 0"
    if allow_inf:
        allowed += " (inf allowed)"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field} must be {allowed}, got {value!r}")
    try:
        value = float(value)
    except OverflowError:  # an int beyond the float range
        raise ValueError(
            f"{field} must be {allowed}, got an integer of {len(str(value))} digits"
        ) from None
    if math.isnan(value) or (math.isinf(value) and not (allow_inf and value > 0)):
        raise ValueError(f"{field} must be {allowed}, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{field} must be {allowed}, got {value!r}")
    return value


def check_int(field: str, value: Any, *, minimum: int = 1) -> int:
    """Return ``value`` if it is an int >= ``minimum``, else raise ValueError naming ``field``
    (the one integer check of the package)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{field} must be an integer >= {minimum}, got {value!r}")
    return value


Piece = tuple[int, int]  # a prompt piece in a pass: (new tokens T, tokens of context C)


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
        pairs += t * c + t * (t + 1) // 2
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
    pass plus ``prefill_per_token*n``. With ``prefill_per_pair = fusion_penalty = 0`` this is
    the lab's linear model exactly.

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
        if rows == 0:
            return (
                self.prefill_pass_overhead
                + self.prefill_per_token * tokens
                + self.prefill_per_pair * pairs
                + self.decode_per_kv_token * context
            )
        decode = (
            self.decode_step_base
            + self.decode_per_seq * (rows - 1)
            + self.decode_per_kv_token * kv_tokens
        )
        if tokens == 0:
            return decode
        compute = (
            self.prefill_pass_overhead
            + self.prefill_per_token * (tokens + rows)
            + self.prefill_per_pair * pairs
            + self.decode_per_kv_token * context
        )
        return max(decode, compute) + self.fusion_penalty * min(decode, compute)

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
        return self.prefill_pieces(pieces) + self.prefill_per_token * rows

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

        With no arguments it is the lab's formula exactly, ``(decode_step_base -
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
        b = self.prefill_per_token + self.prefill_per_pair * (context + 0.5)
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


@dataclasses.dataclass(frozen=True, slots=True)
class Preset:
    """A named cost model and where its numbers come from (never measured on this machine)."""

    name: str
    cost: CostModel
    source: str


_QWEN3_06B_KV_BYTES = 28 * 8 * 128 * 2 * 2  # layers x KV heads x head dim x (K, V) x bf16 bytes

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "lab-laptop",
            CostModel(
                prefill_pass_overhead=29.03e-3,
                prefill_per_token=55.2e-6,
                decode_step_base=35.73e-3,
                kv_bytes_per_token=_QWEN3_06B_KV_BYTES,
                link_bandwidth=25e9,
                link_latency=20e-6,
            ),
            "published calibration of the lab's RTX 3080 Ti Laptop 16 GB, Qwen3-0.6B bf16, eager "
            "PyTorch, batch 1; decode cost per cached token refused there (flat within noise "
            "from 128 to 16,384 cached tokens) and recorded as 0. Link: an assumed PCIe 4.0 x16 "
            "(25 GB/s, 20 us), not measured.",
        ),
        Preset(
            "datacenter-illustrative",
            CostModel(
                prefill_pass_overhead=1.0e-3,
                prefill_per_token=10.0e-6,
                decode_step_base=10.0e-3,
                kv_bytes_per_token=_QWEN3_06B_KV_BYTES,
                link_bandwidth=300e9,
                link_latency=10e-6,
            ),
            "ILLUSTRATIVE, measured nowhere: a datacenter GPU with fused kernels (~1 ms pass "
            "overhead, ~10 us per prompt token, ~10 ms decode step; C* ~ 900, the order of "
            "vLLM's defaults). KV bytes for Qwen3-0.6B bf16; link an assumed NVLink-class "
            "300 GB/s, 10 us.",
        ),
    )
}


def get_preset(name: str) -> Preset:
    """The preset called ``name``; ValueError listing the known names otherwise."""
    try:
        return PRESETS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown cost preset {name!r}; known: {', '.join(PRESETS)}") from None


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


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """One iteration on a compute resource, or one KV transfer on the link.

    ``prefill`` lists (request id, prompt tokens) processed in the pass, and ``contexts`` each
    piece's earlier context C_i (aligned with ``prefill``; empty in events recorded before cost
    model v2, where ``context_tokens`` is the only context known); for a transfer, the request
    whose KV moved and its prompt length. ``context_tokens`` is the sum of the contexts,
    ``kv_tokens`` what the decode rows read (K).

    ``count`` > 1 stands for that many back-to-back decode steps of the same rows; the i-th of
    them (from 0) reads ``kv_tokens + i * decode_rows`` cached tokens and lasts ``growth``
    seconds longer than the one before it (``growth`` = decode_per_kv_token * rows; 0 when a
    cached token costs nothing to read). :meth:`step_start` gives each step's start.
    """

    resource: str
    start: float
    end: float
    kind: str
    prefill: tuple[tuple[str, int], ...] = ()
    decode_ids: tuple[str, ...] = ()
    kv_tokens: int = 0
    context_tokens: int = 0
    count: int = 1
    contexts: tuple[int, ...] = ()
    growth: float = 0.0

    @property
    def prefill_tokens(self) -> int:
        return sum(tokens for _, tokens in self.prefill)

    @property
    def pieces(self) -> tuple[Piece, ...]:
        """The prompt pieces as the cost model takes them: (new tokens, context) each."""
        if len(self.contexts) == len(self.prefill):
            return tuple((t, c) for (_, t), c in zip(self.prefill, self.contexts))
        return ((self.prefill_tokens, self.context_tokens),) if self.prefill else ()

    @property
    def decode_rows(self) -> int:
        return len(self.decode_ids)

    @property
    def request_ids(self) -> tuple[str, ...]:
        return tuple(rid for rid, _ in self.prefill) + self.decode_ids

    @property
    def duration(self) -> float:
        """Busy time of the whole event (all ``count`` iterations)."""
        return self.end - self.start

    def step_start(self, i: int) -> float:
        """When step ``i`` (0..count) of the event starts; ``step_start(count)`` is its end."""
        if i >= self.count:
            return self.end
        n = self.count
        first = (self.duration - self.growth * (n * (n - 1) / 2)) / n
        return self.start + i * first + self.growth * (i * (i - 1) / 2)


class RequestRecord:
    """What happened to one request (seconds). ``kv_ready`` is when its KV cache was usable by
    the worker that decodes it (its prefill end, except under disaggregation: the transfer's
    end); ``prefill_resource`` and ``decode_resource`` name the workers it was on.

    ``token_times`` may be given as a zero-argument function returning them (the simulator
    keeps them implicit, computed on first access), with ``first_token`` and ``finish``
    stated; given as a tuple, those two are read off it. Immutable.
    """

    __slots__ = (
        "id",
        "arrival",
        "prompt_len",
        "output_len",
        "prefill_start",
        "prefill_end",
        "kv_ready",
        "decode_resource",
        "prefill_resource",
        "first_token",
        "finish",
        "_times",
    )
    id: str
    arrival: float
    prompt_len: int
    output_len: int
    prefill_start: float
    prefill_end: float
    kv_ready: float
    decode_resource: str
    prefill_resource: str
    first_token: float
    finish: float
    _times: tuple[float, ...] | Callable[[], tuple[float, ...]]

    def __init__(
        self,
        id: str,
        arrival: float,
        prompt_len: int,
        output_len: int,
        prefill_start: float,
        prefill_end: float,
        kv_ready: float,
        decode_resource: str,
        token_times: tuple[float, ...] | Callable[[], tuple[float, ...]],
        prefill_resource: str | None = None,
        *,
        first_token: float | None = None,
        finish: float | None = None,
    ) -> None:
        values = dict(
            id=id,
            arrival=arrival,
            prompt_len=prompt_len,
            output_len=output_len,
            prefill_start=prefill_start,
            prefill_end=prefill_end,
            kv_ready=kv_ready,
            decode_resource=decode_resource,
            prefill_resource=decode_resource if prefill_resource is None else prefill_resource,
            _times=token_times,
        )
        if callable(token_times):
            if first_token is None or finish is None:
                raise ValueError("implicit token_times need first_token and finish")
            values.update(first_token=first_token, finish=finish)
        else:
            times = tuple(token_times)
            values.update(
                _times=times,
                first_token=times[0] if times else math.nan,
                finish=times[-1] if times else math.nan,
            )
        for name, value in values.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")

    @property
    def token_times(self) -> tuple[float, ...]:
        """Every token's time, first to last."""
        times = self._times
        if callable(times):
            times = times()
            object.__setattr__(self, "_times", times)
        return times

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    def _key(self) -> tuple[Any, ...]:
        return (
            self.id,
            self.arrival,
            self.prompt_len,
            self.output_len,
            self.prefill_start,
            self.prefill_end,
            self.kv_ready,
            self.decode_resource,
            self.prefill_resource,
            self.token_times,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RequestRecord):
            return NotImplemented
        return self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"RequestRecord(id={self.id!r}, arrival={self.arrival!r}, prompt_len="
            f"{self.prompt_len}, output_len={self.output_len}, prefill_start="
            f"{self.prefill_start!r}, prefill_end={self.prefill_end!r}, kv_ready="
            f"{self.kv_ready!r}, decode_resource={self.decode_resource!r}, first_token="
            f"{self.first_token!r}, finish={self.finish!r})"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Summary:
    """Headline figures of a trace (seconds). Percentiles are nearest-rank; NaN when there is
    nothing to rank (no requests, or no request with two tokens for TBT)."""

    requests: int
    output_tokens: int
    prefill_tokens: int
    ttft_p50: float
    ttft_p99: float
    tbt_p50: float
    tbt_p99: float
    max_stall: float
    gpu_seconds: float
    makespan: float

    @property
    def empty(self) -> bool:
        return self.requests == 0

    def as_dict(self) -> dict[str, float | int]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def __str__(self) -> str:
        if self.empty:
            return "empty trace: no requests were simulated"
        return (
            f"{self.requests} requests, {self.output_tokens} tokens: "
            f"TTFT p50 {self.ttft_p50 * 1e3:.1f} ms, p99 {self.ttft_p99 * 1e3:.1f} ms; "
            f"TBT p50 {self.tbt_p50 * 1e3:.1f} ms, p99 {self.tbt_p99 * 1e3:.1f} ms; "
            f"max stall {self.max_stall * 1e3:.1f} ms; {self.gpu_seconds:.3f} GPU-s; "
            f"makespan {self.makespan:.3f} s"
        )


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile of ``values`` (NaN for none)."""
    return weighted_percentile([(v, 1) for v in values], p)


def weighted_percentile(pairs: Iterable[tuple[Any, int]], p: float) -> Any:
    """Nearest-rank percentile of a multiset given as (value, multiplicity) pairs."""
    if not 0 < p <= 100:
        raise ValueError(f"percentile p must be in (0, 100], got {p!r}")
    ordered = sorted(pair for pair in pairs if pair[1] > 0)
    total = sum(weight for _, weight in ordered)
    if total == 0:
        return math.nan
    rank = max(1, math.ceil(p / 100 * total))
    seen = 0
    for value, weight in ordered:
        seen += weight
        if seen >= rank:
            return value
    return ordered[-1][0]  # pragma: no cover - rank <= total


def token_gaps(records: Iterable[RequestRecord]) -> list[tuple[float, int]]:
    """Every gap between consecutive tokens of a request, as (gap, 1) pairs."""
    return [(b - a, 1) for r in records for a, b in zip(r.token_times, r.token_times[1:])]


class GapMultiset:
    """The token gaps of a run (vLLM's ITL), kept as the simulator makes them: point masses
    ``{gap: count}`` and arithmetic runs ``(first, growth, k, weight)`` (the k gaps first,
    first + growth, ... each counted ``weight`` times), in ticks. Order statistics, moments and
    the maximum come from these directly; :meth:`items` expands them (one pair per distinct gap).
    """

    def __init__(
        self,
        points: Mapping[int, int] | None = None,
        runs: Iterable[tuple[int, int, int, int]] = (),
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
        variance = (n * squares - total * total) / (n * n)  # ticks squared, exact until here
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
        if not 0 < p <= 100:
            raise ValueError(f"percentile p must be in (0, 100], got {p!r}")
        if not self.count:
            return math.nan
        return self.kth(max(1, math.ceil(p / 100 * self.count)))

    def linear_percentile(self, p: float) -> float:
        """The percentile as numpy (and so vLLM) computes it: linear interpolation between the
        order statistics around rank (n - 1) * p / 100 (NaN for no gaps)."""
        if not 0 <= p <= 100:
            raise ValueError(f"percentile p must be in [0, 100], got {p!r}")
        if not self.count:
            return math.nan
        position = (self.count - 1) * p / 100
        low = math.floor(position)
        fraction = position - low
        below = self.kth(low + 1)
        if fraction == 0:
            return below
        return below + (self.kth(low + 2) - below) * fraction

    def items(self) -> list[tuple[float, int]]:
        """Every distinct gap with its count, by gap (expanded: as long as the run was)."""
        counts = dict(self.points)
        for first, growth, k, w in self.runs:
            for gap in range(first, first + k * growth, growth) if growth else (first,):
                counts[gap] = counts.get(gap, 0) + (w if growth else k * w)
        return [(from_ticks(g), n) for g, n in sorted(counts.items())]


class Trace:
    """Everything a run did: iterations and transfers (``events``, by resource then time) and
    one record per request (``requests``, by arrival then id). Real engine runs build one from
    their events and records; the simulator's keeps its results compact and builds events,
    records and token times on first access (``summary()`` and ``token_gap_counts()`` never
    need them). ``gaps`` optionally carries the token-gap multiset as (gap, count) pairs.
    """

    def __init__(
        self,
        policy: str,
        events: Iterable[Event],
        requests: Mapping[str, RequestRecord],
        chunk: int | None = None,
        gaps: Iterable[tuple[float, int]] | None = None,
    ) -> None:
        self.policy = policy
        self.chunk = chunk
        self._events: tuple[Event, ...] | None = tuple(events)
        self._requests: Mapping[str, RequestRecord] | None = requests
        self._gaps = None if gaps is None else tuple(gaps)
        self._run: _Results | None = None
        self._summary: Summary | None = None

    @classmethod
    def _of(cls, policy: str, chunk: int | None, results: _Results) -> Trace:
        trace = cls(policy, (), {}, chunk)
        trace._events = trace._requests = None
        trace._run = results
        return trace

    @property
    def events(self) -> tuple[Event, ...]:
        if self._events is None:
            assert self._run is not None
            self._events = self._run.events()
        return self._events

    @property
    def requests(self) -> Mapping[str, RequestRecord]:
        if self._requests is None:
            assert self._run is not None
            self._requests = self._run.records()
        return self._requests

    @property
    def resources(self) -> tuple[str, ...]:
        if self._run is not None:
            return self._run.resources()
        return tuple(dict.fromkeys(e.resource for e in self.events))

    def busy_time(self, resource: str | None = None) -> float:
        """Busy seconds of one resource, or of all compute resources (not the link)."""
        if self._run is not None:
            return self._run.busy_time(resource)
        return sum(
            e.duration
            for e in self.events
            if (e.resource == resource if resource is not None else e.resource != LINK)
        )

    def token_gaps(self) -> GapMultiset:
        """The gaps between consecutive tokens of every request (vLLM's ITL) as a multiset with
        order statistics, moments and maximum; for a simulation, without expanding them."""
        if self._run is not None:
            return self._run.gaps()
        return GapMultiset.of_seconds(self.token_gap_counts())

    def token_gap_counts(self) -> tuple[tuple[float, int], ...]:
        """Every gap between consecutive tokens of any request (vLLM's ITL) as (gap seconds,
        how many) pairs, by gap (never materialises a simulation's token times, but lists every
        distinct gap: :meth:`token_gaps` is the cheap way to rank them)."""
        if self._run is not None:
            return tuple(self._run.gaps().items())
        if self._gaps is not None:
            return self._gaps
        counts: dict[float, int] = {}
        for gap, n in token_gaps(self.requests.values()):
            counts[gap] = counts.get(gap, 0) + n
        return tuple(sorted(counts.items()))

    def summary(self) -> Summary:
        if self._summary is None:
            with _no_collection():
                self._summary = self._run.summary() if self._run is not None else self._summarize()
        return self._summary

    def _summarize(self) -> Summary:
        records = list(self.requests.values())
        if not records:
            nan = math.nan
            return Summary(0, 0, 0, nan, nan, nan, nan, nan, 0.0, 0.0)
        ttfts = [r.ttft for r in records]
        gaps = self.token_gap_counts()
        return Summary(
            requests=len(records),
            output_tokens=sum(len(r.token_times) for r in records),
            prefill_tokens=sum(r.prompt_len for r in records),
            ttft_p50=percentile(ttfts, 50),
            ttft_p99=percentile(ttfts, 99),
            tbt_p50=weighted_percentile(gaps, 50),
            tbt_p99=weighted_percentile(gaps, 99),
            max_stall=max((g for g, w in gaps if w > 0), default=math.nan),
            gpu_seconds=self.busy_time(),
            makespan=max(r.finish for r in records) - min(r.arrival for r in records),
        )

    def steps(self) -> Iterator[Event]:
        """Every iteration as an event of its own (coalesced decode runs expanded, each step
        with its own start, end and KV read; exact for a simulation): the shape to compare
        traces by."""
        if self._run is not None:
            yield from self._run.steps()
            return
        for e in self.events:
            if e.count == 1:
                yield e
                continue
            for i in range(e.count):
                yield dataclasses.replace(
                    e,
                    start=e.step_start(i),
                    end=e.step_start(i + 1),
                    kv_tokens=e.kv_tokens + i * e.decode_rows,
                    count=1,
                )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        return (self.policy, self.chunk, self.events, dict(self.requests)) == (
            other.policy,
            other.chunk,
            other.events,
            dict(other.requests),
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Trace(policy={self.policy!r}, chunk={self.chunk!r}, {self.summary()})"


class EventLog:
    """Collects events as a run makes them, coalescing back-to-back decode steps of the same
    rows into one event (the engine's log; the simulator coalesces whole runs itself)."""

    def __init__(self) -> None:
        self.done: list[Event] = []
        self._open: dict[str, list[Any]] = {}  # resource -> [start, end, step, ids, kv, count]

    def add(
        self,
        resource: str,
        start: float,
        end: float,
        kind: str,
        prefill: tuple[tuple[str, int], ...] = (),
        decode_ids: tuple[str, ...] = (),
        kv_tokens: int = 0,
        context_tokens: int = 0,
        count: int = 1,
        step: float = 0.0,
        contexts: tuple[int, ...] = (),
    ) -> None:
        """Record one iteration, or ``count`` decode steps of ``step`` seconds each."""
        if kind != "decode":
            self._close(resource)
            self.done.append(
                Event(
                    resource,
                    start,
                    end,
                    kind,
                    prefill,
                    decode_ids,
                    kv_tokens,
                    context_tokens,
                    1,
                    contexts,
                )
            )
            return
        step = step or end - start
        run = self._open.get(resource)
        if (
            run is not None
            and run[1] == start
            and run[2] == step
            and run[3] is decode_ids
            and kv_tokens == run[4] + run[5] * len(decode_ids)
        ):
            run[1] = end
            run[5] += count
            return
        self._close(resource)
        self._open[resource] = [start, end, step, decode_ids, kv_tokens, count]

    def _close(self, resource: str) -> None:
        run = self._open.pop(resource, None)
        if run is not None:
            start, end, _, ids, kv, count = run
            self.done.append(Event(resource, start, end, "decode", (), ids, kv, 0, count))

    def finish(self, order: Sequence[str]) -> tuple[Event, ...]:
        for resource in list(self._open):
            self._close(resource)
        return _by_resource(self.done, order)


def _by_resource(events: Iterable[Event], order: Sequence[str]) -> tuple[Event, ...]:
    """Events by resource in ``order``, then by start (grouping first spares a key call each)."""
    groups: dict[str, list[Event]] = {name: [] for name in order}
    for e in events:
        groups[e.resource].append(e)
    start = operator.attrgetter("start")
    return tuple(itertools.chain.from_iterable(sorted(g, key=start) for g in groups.values()))


MODES = ("shared", "chunked", "decode")


class Plan(NamedTuple):
    """What one iteration does, decided at its start by :meth:`Worker.compose`: prompt pieces
    ``(request, tokens done before, tokens now)`` taken FCFS, the ids of the decode rows (each
    emits one token; the same tuple while the rows do not change), the KV tokens the rows read
    (K), the earlier context the pieces attend to (sum of C), and the requests whose prompt the
    iteration completes.

    Immutable, built by the worker and not validated; a named tuple rather than a frozen
    dataclass because the simulator builds one per iteration.
    """

    prefill: tuple[tuple[Request, int, int], ...]
    decode_ids: tuple[str, ...]
    kv_tokens: int = 0
    context_tokens: int = 0
    completed: tuple[Request, ...] = ()

    @property
    def kind(self) -> str:
        if self.prefill:
            return "fused" if self.decode_ids else "prefill"
        return "decode"

    @property
    def prefill_tokens(self) -> int:
        return sum(n for _, _, n in self.prefill)

    @property
    def decode_rows(self) -> int:
        return len(self.decode_ids)

    def prefill_ids(self) -> tuple[tuple[str, int], ...]:
        """The prompt pieces as an :class:`Event` lists them: (request id, tokens now)."""
        return tuple([(r.id, n) for r, _, n in self.prefill])

    def pieces(self) -> tuple[Piece, ...]:
        """The prompt pieces as the cost model takes them: (tokens now, tokens done before)."""
        return tuple([(n, done) for _, done, n in self.prefill])

    def contexts(self) -> tuple[int, ...]:
        """Each piece's earlier context, as :attr:`Event.contexts` lists it."""
        return tuple([done for _, done, _ in self.prefill])


Price = Callable[[int, int, int, int, int], Any]  # (tokens, pairs, context, rows, kv) -> cost


class Worker:
    """The scheduling rules of one compute resource, one iteration at a time: at a boundary
    :meth:`compose` says what the next iteration does, the caller runs it, :meth:`finish_at`
    ends it. The simulator times iterations with the cost model (whole runs of decode steps at
    once); the engine runs them for real. Times are whatever the caller counts in.

    Modes: ``shared`` (a prefill pass of every admitted prompt first, else a decode step),
    ``chunked`` (decode rows fused with up to ``chunk`` prompt tokens, FCFS; inf: co-scheduled;
    or, with ``budget`` and ``price``, the largest FCFS token count whose iteration ``price``
    keeps within ``budget``, at least one token), ``decode`` (decode only: prefilled requests
    come in through :meth:`join`). A prompt completed here joins this worker's decode rows at
    the next boundary.

    KV memory: a request is admitted (its prefill may start) only when the KV reserved here
    plus its ``prompt_len + output_len`` fits ``capacity``, strictly FCFS; :meth:`join`
    reserves too (the caller checks :meth:`has_room` first). A reservation is released when the
    request finishes.

    Raises:
        ValueError: for an unknown mode, a chunk that is not a whole number >= 1 or inf, or a
            budget without a price or outside ``chunked``.
    """

    __slots__ = (
        "name",
        "mode",
        "chunk",
        "capacity",
        "budget",
        "price",
        "reserved",
        "unfinished",
        "pending",
        "waiting",
        "joining",
        "running",
        "_ids",
        "kv_tokens",
        "steps",
        "first_index",
        "_finishing",
        "_finish_heap",
        "_newcomers",
        "prefill_start",
        "prefill_end",
        "first_token",
        "finish",
        "runs",
        "_run_index",
        "gaps",
        "gap_runs",
        "_last_end",
        "_start",
        "_plan",
    )

    def __init__(
        self,
        name: str,
        mode: str,
        chunk: float = math.inf,
        *,
        capacity: float = math.inf,
        budget: Any = None,
        price: Price | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
        whole = isinstance(chunk, (int, float)) and not isinstance(chunk, bool) and chunk >= 1
        if not (chunk == math.inf or (whole and chunk == int(chunk))):
            raise ValueError(f"chunk must be a whole number of tokens >= 1 or inf, got {chunk!r}")
        if budget is not None and (mode != "chunked" or price is None):
            raise ValueError("a chunk budget needs mode 'chunked' and a price function")
        self.name, self.mode = name, mode
        self.chunk = math.inf if mode == "shared" else float(chunk)  # prompt tokens per pass
        self.capacity, self.budget, self.price = capacity, budget, price
        self.reserved = 0  # KV tokens reserved by requests admitted here and not finished
        self.unfinished = 0  # requests handed to this worker and not finished
        self.pending: deque[Request] = deque()  # arrived, waiting for KV room
        self.waiting: deque[list[Any]] = deque()  # [request, prompt tokens done]
        self.joining: list[Request] = []  # prefilled, join the decode rows at the next boundary
        self.running: list[Request] = []
        self._ids: tuple[str, ...] = ()  # their ids, rebuilt on change: events key on identity
        self.kv_tokens = 0  # what the next decode step reads
        self.steps = 0  # decode-bearing iterations so far (a token-time index)
        self.first_index: dict[str, int] = {}  # request -> index of its first token here
        self._finishing: dict[int, list[Request]] = {}  # index -> requests done there
        self._finish_heap: list[int] = []  # the keys of _finishing
        self._newcomers: dict[int, list[Request]] = {}  # index -> first tokens there
        self.prefill_start: dict[str, Any] = {}
        self.prefill_end: dict[str, Any] = {}
        self.first_token: dict[str, Any] = {}
        self.finish: dict[str, Any] = {}
        # Decode-bearing iterations as runs (first index, start, first step, growth, steps,
        # end): step i of a run lasts first + i*growth and ends its token; one step each in
        # the engine. Token times are read off these on demand.
        self.runs: list[tuple[int, Any, Any, Any, int, Any]] = []
        self._run_index: list[int] = []
        self.gaps: dict[Any, int] = {}  # token gap -> how many tokens followed such a gap
        self.gap_runs: list[tuple[Any, Any, int, int]] = []  # (first, growth, gaps, rows)
        self._last_end: Any = None  # end of the last decode-bearing iteration
        self._start: Any = None
        self._plan: Plan | None = None  # the running iteration's

    def admit(self, request: Request) -> None:
        """A request arrives: its prompt waits here for KV room, then for prefill (FCFS)."""
        if self.mode == "decode":
            raise ValueError(f"{self.name} only decodes: hand it prefilled requests with join()")
        self.pending.append(request)
        self.unfinished += 1

    def has_room(self, request: Request) -> bool:
        return self.reserved + request.prompt_len + request.output_len <= self.capacity

    def join(self, request: Request) -> None:
        """A request prefilled elsewhere joins the decode rows at the next boundary."""
        self.reserved += request.prompt_len + request.output_len
        self.joining.append(request)
        self.unfinished += 1

    @property
    def load(self) -> int:
        return len(self.running) + len(self.joining)

    def _admit_pending(self) -> None:
        pending, capacity = self.pending, self.capacity
        while pending:
            need = pending[0].prompt_len + pending[0].output_len
            if self.reserved + need > capacity:
                return  # strict FCFS: the head waits, and so does everyone behind it
            self.reserved += need
            self.waiting.append([pending.popleft(), 0])

    def _admit_joining(self) -> None:
        index = self.steps
        self._newcomers.setdefault(index, []).extend(self.joining)
        for r in self.joining:
            self.first_index[r.id] = index
            last = index + r.output_len - 1
            if last not in self._finishing:
                self._finishing[last] = []
                heapq.heappush(self._finish_heap, last)
            self._finishing[last].append(r)
            self.kv_tokens += r.prompt_len
        self.running.extend(self.joining)
        self.joining = []
        self._ids = tuple([r.id for r in self.running])

    def compose(self, now: Any) -> Plan | None:
        """Admit the requests joining at this boundary and what fits in KV memory, and compose
        the iteration that starts at ``now`` (None: nothing to do). Call :meth:`finish_at`
        before composing again."""
        if self.joining:
            self._admit_joining()
        if self.pending:
            self._admit_pending()
        self._start = now
        if not self.waiting:  # decode rows only (always so in decode mode)
            plan = Plan((), self._ids, self.kv_tokens) if self._ids else None
        else:
            plan = self._compose_prefill(now)
        self._plan = plan
        return plan

    def _compose_prefill(self, now: Any) -> Plan:
        ids = () if self.mode == "shared" else self._ids  # shared: the pass holds up every row
        take = self._budget_take(len(ids)) if self.budget is not None else None
        chunk = self.chunk  # tokens; >= 1, so at least one prompt piece
        prefill: list[tuple[Request, int, int]] = []
        completed: list[Request] = []
        context = 0
        starts = self.prefill_start
        for entry in self.waiting:
            request, done = entry
            left = request.prompt_len - done
            if take is not None:
                n = take(len(prefill), request, done)
                if n <= 0:
                    break
            else:
                n = left if left <= chunk else int(chunk)
                chunk -= n
            prefill.append((request, done, n))
            context += done
            if request.id not in starts:
                starts[request.id] = now
            if n < left:
                entry[1] = done + n
                break
            completed.append(request)
            if chunk <= 0:
                break
        for _ in completed:
            self.waiting.popleft()
        return Plan(tuple(prefill), ids, self.kv_tokens if ids else 0, context, tuple(completed))

    def _budget_take(self, rows: int) -> Callable[[int, Request, int], int]:
        """The chunk_budget rule: the largest FCFS token count whose iteration costs <= the
        budget (at least one token). Returns how much of the next piece to take."""
        price, budget, kv = self.price, self.budget, self.kv_tokens
        assert price is not None
        sums = [0, 0, 0]  # tokens, pairs, context of the pieces taken so far

        def fits(take: int, done: int) -> bool:
            tokens, pairs, context = sums
            pairs += take * done + take * (take + 1) // 2
            return price(tokens + take, pairs, context + done, rows, kv) <= budget

        def take_of(pieces_so_far: int, request: Request, done: int) -> int:
            left = request.prompt_len - done
            if fits(left, done):
                take = left
            else:  # bisect: fits(lo) or lo == 0, not fits(hi)
                lo, hi = 0, left
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if fits(mid, done):
                        lo = mid
                    else:
                        hi = mid
                take = lo if lo or pieces_so_far else 1  # prompts always progress
            sums[0] += take
            sums[1] += take * done + take * (take + 1) // 2
            sums[2] += done
            return take

        return take_of

    def finish_at(self, end: Any) -> tuple[Request, ...]:
        """End the composed iteration at ``end``; return the requests whose prompt it completed
        (they join the decode rows at the next boundary)."""
        return self._complete(end, 1, end - self._start, 0, end)

    def _complete(
        self, end: Any, steps: int, first: Any, growth: Any, first_end: Any
    ) -> tuple[Request, ...]:
        """End the composed iteration at ``end``: ``steps`` decode steps (more than one: a run
        of unchanging decode steps), the first lasting ``first`` and ending at ``first_end``,
        each next one ``growth`` longer."""
        plan = self._plan
        assert plan is not None, "finish an iteration only after composing it"
        self._plan = None
        completed = plan.completed
        if completed:
            for r in completed:
                self.prefill_end[r.id] = end
            self.joining.extend(completed)
        rows = len(plan.decode_ids)
        if not rows:
            return completed
        index = self.steps
        newcomers = self._newcomers.pop(index, ())
        gaps = self.gaps
        continuing = rows - len(newcomers)
        if continuing and self._last_end is not None:
            gap = first_end - self._last_end
            gaps[gap] = gaps.get(gap, 0) + continuing
        for r in newcomers:
            self.first_token[r.id] = first_end
        if steps > 1:
            if growth:
                self.gap_runs.append((first + growth, growth, steps - 1, rows))
            else:
                gaps[first] = gaps.get(first, 0) + (steps - 1) * rows
        self.runs.append((index, self._start, first, growth, steps, end))
        self._run_index.append(index)
        self.steps = last = index + steps
        self.kv_tokens += rows * steps
        self._last_end = end
        if self._finish_heap and self._finish_heap[0] == last - 1:
            heapq.heappop(self._finish_heap)
            done = self._finishing.pop(last - 1)
            gone = set()
            for r in done:
                gone.add(r.id)
                self.finish[r.id] = end
                need = r.prompt_len + r.output_len
                self.kv_tokens -= need
                self.reserved -= need
            self.unfinished -= len(done)
            self.running = [r for r in self.running if r.id not in gone]
            self._ids = tuple([r.id for r in self.running])
        return completed

    def token_times(self, request: Request) -> list[Any]:
        """Every token time of ``request``, decoded here."""
        first = self.first_index[request.id]
        i = bisect.bisect_right(self._run_index, first) - 1
        times: list[Any] = []
        want = request.output_len
        while len(times) < want:
            first_index, start, step, growth, steps, end = self.runs[i]
            for j in range(max(first - first_index, 0), steps):
                times.append(
                    end if j == steps - 1 else start + (j + 1) * step + growth * (j * (j + 1) // 2)
                )
                if len(times) == want:
                    break
            i += 1
        return times

    def record(
        self, r: Request, start: Any, end: Any, ready: Any, prefill_resource: str | None = None
    ) -> RequestRecord:
        """What happened to ``r``, decoded here, given its prefill start and end, KV ready and
        where it was prefilled (default: here). The engine's records: times are the caller's."""
        times = tuple(self.token_times(r))
        return RequestRecord(
            r.id,
            r.arrival,
            r.prompt_len,
            r.output_len,
            start,
            end,
            ready,
            self.name,
            times,
            prefill_resource,
        )


# --- exact time -----------------------------------------------------------------------------
# Inside, the simulator counts time in integer ticks of 2**-64 s: every sum is exact, so a load
# shifted by 10**9 s gives the same gaps, and a week-long trace drifts by nothing. Cost
# constants are converted once (exactly, for any value of 2**-11 s or more; smaller ones to the
# nearest tick); floats appear only at the API.

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

    def decode(self, rows: int, kv_tokens: int) -> int:
        return self.base + self.per_seq * (rows - 1) + self.per_kv * kv_tokens

    def price(self, tokens: int, pairs: int, context: int, rows: int, kv_tokens: int) -> int:
        """:meth:`CostModel.iteration_sums` in ticks."""
        compute = (
            self.overhead
            + self.per_token * (tokens + rows)
            + self.per_pair * pairs
            + self.per_kv * context
        )
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


def _steps_before(start: int, first: int, growth: int, horizon: int) -> int:
    """How many steps of a run starting at ``start`` (step j lasts ``first + j * growth``)
    start before ``horizon`` (> start): the least j >= 1 with j*first + growth*j*(j-1)/2 >=
    horizon - start."""
    span = horizon - start
    if not growth:
        return -(-span // first)
    b = 2 * first - growth  # > 0: a step reads at least one cached token per row

    def short(j: int) -> bool:  # step j starts before the horizon
        return growth * j * j + b * j < 2 * span

    j = max(1, (math.isqrt(b * b + 8 * growth * span) - b) // (2 * growth))
    while short(j):
        j += 1
    while j > 1 and not short(j - 1):
        j -= 1
    return j


# Each logged iteration: (resource, start, end, kind, pieces as (request, done, tokens),
# decode ids, KV read, steps, growth), in ticks.
_LogEntry = tuple[
    str, int, int, str, tuple[tuple[Request, int, int], ...], tuple[str, ...], int, int, int
]


class _SimWorker(Worker):
    """A :class:`Worker` timed by the cost model in ticks. A decode-only iteration is planned
    as a whole run of steps up to the next finish and advanced in O(1) (its step costs form an
    arithmetic progression: K grows by the rows each step); a request handed to the worker
    mid-run cuts the run at the first step boundary after it (:meth:`truncate`)."""

    __slots__ = ("index", "tick", "log", "busy", "busy_until", "_decode")

    def __init__(
        self,
        index: int,
        name: str,
        mode: str,
        tick: TickCost,
        log: list[_LogEntry],
        chunk: float = math.inf,
        capacity: float = math.inf,
        budget: int | None = None,
    ) -> None:
        price = tick.price if budget is not None else None
        super().__init__(name, mode, chunk, capacity=capacity, budget=budget, price=price)
        self.index, self.tick, self.log = index, tick, log
        self.busy = 0  # ticks
        self.busy_until: int | None = None
        self._decode: tuple[int, int, int] | None = None  # a run's (first, growth, steps)

    def start(self, now: int) -> int | None:
        """Begin the next iteration at ``now`` if there is work and return when it ends; else
        stay idle (None)."""
        if self.waiting or self.pending or self.joining:
            plan = self.compose(now)
        elif self._ids:  # decode rows only, as compose would say, without its checks
            self._start = now
            plan = self._plan = Plan((), self._ids, self.kv_tokens)
        else:
            plan = self._plan = None
        if plan is None:
            return None
        rows = len(plan.decode_ids)
        if plan.prefill:
            tokens = pairs = 0
            for _, done, n in plan.prefill:
                tokens += n
                pairs += n * done + n * (n + 1) // 2
            end = now + self.tick.price(tokens, pairs, plan.context_tokens, rows, plan.kv_tokens)
            self._decode = None
            self.busy_until = end
            return end
        tick = self.tick
        first = tick.decode(rows, plan.kv_tokens)
        growth = tick.per_kv * rows
        steps = self._finish_heap[0] - self.steps + 1  # up to the next finish
        end = now + steps * first + growth * (steps * (steps - 1) // 2)
        self._decode = (first, growth, steps)
        self.busy_until = end
        return end

    def truncate(self, horizon: int) -> bool:
        """Cut a running decode run after its last step that starts before ``horizon``; True
        if its end moved."""
        run, start = self._decode, self._start
        if run is None or self.busy_until is None or horizon >= self.busy_until:
            return False
        first, growth, steps = run
        keep = _steps_before(start, first, growth, horizon)
        if keep >= steps:
            return False
        self._decode = (first, growth, keep)
        self.busy_until = start + keep * first + growth * (keep * (keep - 1) // 2)
        return True

    def end(self, now: int) -> None:
        """End the running iteration (or run) at ``now``."""
        plan, start = self._plan, self._start
        assert plan is not None
        self.busy += now - start
        self.busy_until = None
        if self._decode is not None:
            first, growth, steps = self._decode
            self.log.append(
                (
                    self.name,
                    start,
                    now,
                    "decode",
                    (),
                    plan.decode_ids,
                    plan.kv_tokens,
                    steps,
                    growth,
                )
            )
            self._complete(now, steps, first, growth, start + first)
            return
        kind = "fused" if plan.decode_ids else "prefill"
        self.log.append(
            (self.name, start, now, kind, plan.prefill, plan.decode_ids, plan.kv_tokens, 1, 0)
        )
        self._complete(now, 1, now - start, 0, now)


class _LeastLoaded:
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


class _Pool:
    """Workers driven through time together: at each instant, end the iterations that end then,
    hand out what arrives, then start every idle worker that has work."""

    def __init__(self, size: int, make: Callable[[int], _SimWorker]) -> None:
        self.make = make
        self.workers: list[_SimWorker] = []
        self.router = _LeastLoaded(size)
        self._heap: list[tuple[int, int]] = []  # (end, worker index); stale when it moved
        self._ready: list[_SimWorker] = []

    def _run_one(
        self, arrivals: Sequence[tuple[int, Request]], place: Callable[[Request, int], None]
    ) -> None:
        """:meth:`run` for a pool of one worker: no heap, no router to keep."""
        ready = self._ready
        i, n = 0, len(arrivals)
        w: _SimWorker | None = None
        while True:
            end = None if w is None else w.busy_until
            if end is not None and (i >= n or end <= arrivals[i][0]):
                t = end
                w.end(t)  # type: ignore[union-attr]
            elif i < n:
                t = arrivals[i][0]
            else:
                return
            while i < n and arrivals[i][0] == t:
                place(arrivals[i][1], t)  # cuts a running decode run short if need be
                i += 1
            ready.clear()
            w = self.workers[0]
            if w.busy_until is None:
                w.start(t)

    def get(self, i: int) -> _SimWorker:
        while i >= len(self.workers):
            self.workers.append(self.make(len(self.workers)))
        return self.workers[i]

    def give(self, worker: _SimWorker, now: int) -> None:
        """``worker`` was handed a request at ``now``: start it, or cut its decode run."""
        self.router.set(worker.index, worker.unfinished)
        if worker.busy_until is None:
            self._ready.append(worker)
        elif worker.truncate(now):
            heapq.heappush(self._heap, (worker.busy_until, worker.index))

    def run(
        self,
        arrivals: Sequence[tuple[int, Request]],
        place: Callable[[Request, int], None],
        retry: Callable[[int], None] | None = None,
    ) -> None:
        if self.router.size == 1 and retry is None:
            self._run_one(arrivals, place)
            return
        heap, ready, workers, router = self._heap, self._ready, self.workers, self.router
        i, n = 0, len(arrivals)
        while True:
            while heap and workers[heap[0][1]].busy_until != heap[0][0]:
                heapq.heappop(heap)  # a run that was cut short
            if heap:
                t = heap[0][0]
                if i < n and arrivals[i][0] < t:
                    t = arrivals[i][0]
            elif i < n:
                t = arrivals[i][0]
            else:
                return
            while heap and heap[0][0] == t:
                w = workers[heapq.heappop(heap)[1]]
                if w.busy_until == t:
                    before = w.unfinished
                    w.end(t)
                    if w.unfinished != before:
                        router.set(w.index, w.unfinished)
                    ready.append(w)
            if retry is not None:
                retry(t)
            while i < n and arrivals[i][0] == t:
                place(arrivals[i][1], t)
                i += 1
            for w in ready:
                if w.busy_until is None:
                    end = w.start(t)
                    if end is not None:
                        heapq.heappush(heap, (end, w.index))
            ready.clear()


def _colocated(
    requests: list[Request],
    tick: TickCost,
    policy: str,
    chunk: int | None,
    chunk_budget: float | None,
    replicas: int,
    capacity: float,
) -> _Results:
    """``shared``, ``coscheduled`` or ``chunked`` on ``replicas`` workers; each request goes at
    arrival to the one with the fewest unfinished requests routed to it (ties: lowest index)."""
    log: list[_LogEntry] = []
    mode = "shared" if policy == "shared" else "chunked"
    chunked = policy == "chunked"
    tokens = float(chunk) if chunked and chunk is not None else math.inf
    budget = to_ticks(chunk_budget) if chunked and chunk_budget is not None else None

    def make(i: int) -> _SimWorker:
        name = "worker" if replicas == 1 else f"worker{i}"
        return _SimWorker(i, name, mode, tick, log, tokens, capacity, budget)

    pool = _Pool(replicas, make)
    owner: dict[str, _SimWorker] = {}

    def place(r: Request, now: int) -> None:
        w = pool.get(pool.router.pick())  # type: ignore[arg-type]  # never None: no fits
        owner[r.id] = w
        w.admit(r)
        pool.give(w, now)

    pool.run([(to_ticks(r.arrival, up=True), r) for r in requests], place)
    prefill = {}
    for r in requests:
        w = owner[r.id]
        prefill[r.id] = (w.prefill_start[r.id], w.prefill_end[r.id], w.prefill_end[r.id])
    order = [w.name for w in pool.workers]
    return _Results(requests, owner, prefill, {}, log, order, pool.workers, 0)


def _prefill_side(
    requests: list[Request], tick: TickCost, size: int, capacity: float, log: list[_LogEntry]
) -> tuple[list[tuple[int, Request]], dict[str, tuple[int, int, int]], dict[str, str], int, int]:
    """The prefill pool and the link under disaggregation: a free prefill worker takes every
    waiting prompt that fits its KV room in one unchunked pass (FCFS; a head that fits no
    free worker waits, and so does everyone behind it); each finished prompt's KV crosses the
    link, one transfer at a time, FCFS by prefill end. Returns the requests in order of KV
    arrival with their times, (prefill start, end, KV ready) and prefill worker per request,
    how many prefill workers were used, and the ticks they computed in all."""
    order = {r.id: k for k, r in enumerate(requests)}
    pending: deque[Request] = deque()
    reserved: list[int] = []  # per prefill worker touched so far
    free: list[int] = []  # idle touched workers (a heap of indices)
    passes: list[tuple[int, int, list[Request], int]] = []  # (end, worker, batch, start)
    link: deque[Request] = deque()
    on_link: tuple[int, Request] | None = None
    times: dict[str, tuple[int, int, int]] = {}
    where: dict[str, int] = {}
    ready: list[tuple[int, Request]] = []
    busy = [0]  # ticks the prefill workers computed, in all
    arrivals = [(to_ticks(r.arrival, up=True), r) for r in requests]
    i, n = 0, len(arrivals)

    def release(r: Request, now: int) -> None:
        reserved[where[r.id]] -= r.prompt_len + r.output_len
        start, end, _ = times[r.id]
        times[r.id] = (start, end, now)
        ready.append((now, r))

    def take(w: int, now: int) -> bool:
        batch: list[Request] = []
        while pending and reserved[w] + pending[0].prompt_len + pending[0].output_len <= capacity:
            r = pending.popleft()
            reserved[w] += r.prompt_len + r.output_len
            batch.append(r)
        if not batch:
            return False
        pairs = sum(r.prompt_len * (r.prompt_len + 1) // 2 for r in batch)
        end = now + tick.price(sum(r.prompt_len for r in batch), pairs, 0, 0, 0)
        busy[0] += end - now
        for r in batch:
            times[r.id], where[r.id] = (now, end, end), w
        pieces = tuple([(r, 0, r.prompt_len) for r in batch])
        log.append((f"prefill{w}", now, end, "prefill", pieces, (), 0, 1, 0))
        heapq.heappush(passes, (end, w, batch, now))
        return True

    while True:
        times_next = [arrivals[i][0]] if i < n else []
        if passes:
            times_next.append(passes[0][0])
        if on_link is not None:
            times_next.append(on_link[0])
        if not times_next:
            break
        t = min(times_next)
        ended: list[Request] = []
        while passes and passes[0][0] == t:
            _, w, batch, _ = heapq.heappop(passes)
            ended.extend(batch)
            heapq.heappush(free, w)
        ended.sort(key=lambda r: order[r.id])
        link.extend(ended)
        if on_link is not None and on_link[0] == t:
            release(on_link[1], t)
            on_link = None
        while i < n and arrivals[i][0] == t:
            pending.append(arrivals[i][1])
            i += 1
        while on_link is None and link:
            r = link.popleft()
            duration = tick.transfer(r.prompt_len)
            if duration == 0:
                release(r, t)  # a free link: the KV is usable where it was made
                continue
            on_link = (t + duration, r)
            log.append((LINK, t, t + duration, "transfer", ((r, 0, r.prompt_len),), (), 0, 1, 0))
        progress = True
        while pending and progress:  # until no free worker has room for the head
            progress, full = False, []
            while pending and free:
                w = heapq.heappop(free)
                if take(w, t):
                    progress = True
                else:
                    full.append(w)  # no room for the head there: it stays free
            for w in full:
                heapq.heappush(free, w)
            while pending and len(reserved) < size:
                reserved.append(0)
                progress = take(len(reserved) - 1, t) or progress
    names = {rid: f"prefill{w}" for rid, w in where.items()}
    return ready, times, names, len(reserved), busy[0]


def _disaggregated(
    requests: list[Request],
    tick: TickCost,
    prefill_workers: int,
    decode_workers: int,
    capacity: float,
) -> _Results:
    """Prefill pool and link first (they only feed forward), then the decode pool: a request
    whose KV has arrived joins the decode worker with the fewest running plus joining requests
    among those with KV room (ties: lowest index), or waits, FCFS, until one has room."""
    log: list[_LogEntry] = []
    ready, times, names, used, busy = _prefill_side(requests, tick, prefill_workers, capacity, log)
    pool = _Pool(
        decode_workers,
        lambda i: _SimWorker(i, f"decode{i}", "decode", tick, log, capacity=capacity),
    )
    owner: dict[str, _SimWorker] = {}
    waiting: deque[Request] = deque()
    bounded = not math.isinf(capacity)

    def assign(r: Request, now: int) -> bool:
        fits = (lambda i: pool.workers[i].has_room(r)) if bounded else None
        i = pool.router.pick(fits)
        if i is None:
            return False
        w = owner[r.id] = pool.get(i)
        w.join(r)
        pool.give(w, now)
        return True

    def place(r: Request, now: int) -> None:
        if waiting or not assign(r, now):
            waiting.append(r)

    def retry(now: int) -> None:
        while waiting and assign(waiting[0], now):
            waiting.popleft()

    pool.run(ready, place, retry if bounded else None)
    order = [f"prefill{i}" for i in range(used)] + [LINK] + [w.name for w in pool.workers]
    return _Results(requests, owner, times, names, log, order, pool.workers, busy)


def disaggregated_prefill(
    load: Iterable[Request], cost: CostModel, *, prefill_workers: int = 1
) -> tuple[list[tuple[float, Request]], dict[str, tuple[float, float, float]], tuple[Event, ...]]:
    """The prefill pool and the link of a disaggregated run, as ``simulate`` runs them: the
    requests in order of KV arrival with its time, each request's (prefill start, prefill end,
    KV ready), and the prefill and transfer events. For an engine that decodes for real."""
    check_int("prefill_workers", prefill_workers)
    requests = validate_load(load)
    log: list[_LogEntry] = []
    capacity = cost.kv_capacity_tokens
    ready, times, names, used, busy = _prefill_side(
        requests, TickCost(cost), prefill_workers, capacity, log
    )
    order = [f"prefill{i}" for i in range(used)] + [LINK]
    results = _Results(requests, {}, times, names, log, order, [], busy)
    f = from_ticks
    return (
        [(f(t), r) for t, r in ready],
        {rid: (f(a), f(b), f(c)) for rid, (a, b, c) in times.items()},
        results.events(),
    )


class _Results:
    """A simulation's results, compact and in ticks; :class:`Trace` reads them."""

    def __init__(
        self,
        requests: list[Request],
        owner: Mapping[str, _SimWorker],
        prefill: Mapping[str, tuple[int, int, int]],
        prefill_names: Mapping[str, str],
        log: list[_LogEntry],
        order: list[str],
        workers: list[_SimWorker],
        prefill_busy: int,
    ) -> None:
        self.requests, self.owner, self.prefill = requests, owner, prefill
        # Busy ticks as the workers counted them (not from the log: the oracle compares both).
        self.busy = prefill_busy + sum(w.busy for w in workers)
        self._gaps: GapMultiset | None = None
        self.prefill_names, self.log, self.order, self.workers = prefill_names, log, order, workers
        latest = max((e[2] for e in log), default=0)
        try:
            from_ticks(latest)
        except OverflowError:
            raise ValueError(
                "the simulated run lasts beyond the float range (1.8e308 s): the cost model's "
                "terms or the arrivals are too large"
            ) from None

    def resources(self) -> tuple[str, ...]:
        used = {e[0] for e in self.log}
        return tuple(name for name in self.order if name in used)

    def busy_time(self, resource: str | None = None) -> float:
        if resource is None:
            return from_ticks(sum(e[2] - e[1] for e in self.log if e[0] != LINK))
        return from_ticks(sum(e[2] - e[1] for e in self.log if e[0] == resource))

    def gaps(self) -> GapMultiset:
        """Every worker's token gaps, in one multiset."""
        if self._gaps is None:
            workers = self.workers
            points: dict[int, int] = dict(workers[0].gaps) if workers else {}
            runs: list[tuple[int, int, int, int]] = []
            for w in workers[1:]:
                for gap, k in w.gaps.items():
                    points[gap] = points.get(gap, 0) + k
            for w in workers:
                runs += w.gap_runs
            self._gaps = GapMultiset(points, runs, owned=True)
        return self._gaps

    def summary(self) -> Summary:
        requests = self.requests
        if not requests:
            nan = math.nan
            return Summary(0, 0, 0, nan, nan, nan, nan, nan, 0.0, 0.0)
        arrival = {r.id: to_ticks(r.arrival, up=True) for r in requests}
        ttfts = sorted(self.owner[r.id].first_token[r.id] - arrival[r.id] for r in requests)
        gaps = self.gaps()
        last = max(self.owner[r.id].finish[r.id] for r in requests)
        return Summary(
            requests=len(requests),
            output_tokens=sum(r.output_len for r in requests),
            prefill_tokens=sum(r.prompt_len for r in requests),
            ttft_p50=from_ticks(_nearest_rank(ttfts, 50)),
            ttft_p99=from_ticks(_nearest_rank(ttfts, 99)),
            tbt_p50=gaps.percentile(50),
            tbt_p99=gaps.percentile(99),
            max_stall=gaps.max(),
            gpu_seconds=from_ticks(self.busy),
            makespan=from_ticks(last - min(arrival.values())),
        )

    def _entries(self) -> list[_LogEntry]:
        """The log by resource (in ``order``), then by start."""
        rank = {name: i for i, name in enumerate(self.order)}
        return sorted(self.log, key=lambda e: (rank[e[0]], e[1]))

    @staticmethod
    def _event(entry: _LogEntry) -> Event:
        f = from_ticks
        name, start, end, kind, pieces, ids, kv, steps, growth = entry
        prefill = tuple([(r.id, n) for r, _, n in pieces])
        contexts = tuple([done for _, done, _ in pieces])
        return Event(
            name,
            f(start),
            f(end),
            kind,
            prefill,
            ids,
            kv,
            sum(contexts),
            steps,
            contexts,
            f(growth),
        )

    def events(self) -> tuple[Event, ...]:
        return tuple([self._event(entry) for entry in self._entries()])

    def steps(self) -> Iterator[Event]:
        """Every iteration as an event of its own, each step's times exact to the float."""
        f = from_ticks
        for entry in self._entries():
            name, start, end, _, _, ids, kv, steps, growth = entry
            if steps == 1:
                yield self._event(entry)
                continue
            first = (end - start - growth * (steps * (steps - 1) // 2)) // steps  # exact
            for i in range(steps):
                stop = start + first + i * growth
                yield Event(
                    name,
                    f(start),
                    f(stop),
                    "decode",
                    (),
                    ids,
                    kv + i * len(ids),
                    0,
                    1,
                    (),
                    f(growth),
                )
                start = stop

    def records(self) -> dict[str, RequestRecord]:
        f = from_ticks
        out = {}
        for r in self.requests:
            w = self.owner[r.id]
            start, end, ready = self.prefill[r.id]
            out[r.id] = RequestRecord(
                r.id,
                r.arrival,
                r.prompt_len,
                r.output_len,
                f(start),
                f(end),
                f(ready),
                w.name,
                lambda w=w, r=r: tuple([f(t) for t in w.token_times(r)]),  # type: ignore[misc]
                self.prefill_names.get(r.id, w.name),
                first_token=f(w.first_token[r.id]),
                finish=f(w.finish[r.id]),
            )
        return out


def _nearest_rank(ordered: Sequence[int], p: int) -> int:
    return ordered[max(1, -(-p * len(ordered) // 100)) - 1]


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


def check_options(
    policy: Any,
    chunk: Any = None,
    chunk_budget: Any = None,
    replicas: Any = 1,
    prefill_workers: Any = 1,
    decode_workers: Any = 1,
) -> None:
    """ValueError naming the field for an unknown policy, a missing or bad chunk or budget,
    both at once, replicas for a disaggregated run, or a count < 1 (shared by every entry
    point that runs a policy)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
    if chunk is not None and chunk_budget is not None:
        raise ValueError("chunk and chunk_budget exclude each other: give one of them")
    if policy == "chunked" and chunk is None and chunk_budget is None:
        raise ValueError(
            "chunk must be a positive integer (prompt tokens per iteration) for 'chunked', "
            "or chunk_budget a positive number of seconds per iteration"
        )
    if chunk is not None:
        check_int("chunk", chunk)
    if chunk_budget is not None:
        check_number("chunk_budget", chunk_budget, positive=True)
    check_int("replicas", replicas)
    check_int("prefill_workers", prefill_workers)
    check_int("decode_workers", decode_workers)
    if policy == "disaggregated" and replicas != 1:
        raise ValueError(
            "replicas applies to colocated policies; size a disaggregated deployment with "
            f"prefill_workers and decode_workers (got replicas={replicas})"
        )


def simulate(
    policy: str,
    load: Iterable[Request],
    cost: CostModel,
    *,
    chunk: int | None = None,
    chunk_budget: float | None = None,
    replicas: int = 1,
    prefill_workers: int = 1,
    decode_workers: int = 1,
) -> Trace:
    """Replay ``load`` under ``policy`` on devices described by ``cost``.

    Args:
        policy: one of ``POLICIES``.
        load: the requests; their order does not matter (FCFS by arrival, then id).
        cost: the cost model (its ``kv_capacity_tokens`` bounds each worker's KV memory).
        chunk: prompt tokens per iteration for ``chunked`` (ignored by the other policies).
        chunk_budget: instead of ``chunk``, seconds per iteration for ``chunked``: each
            iteration takes the largest FCFS token count whose fused cost fits (at least one).
        replicas: independent workers of a colocated policy; a request goes at arrival to the
            one with the fewest unfinished requests routed to it (ties: lowest index).
        prefill_workers, decode_workers: pool sizes for ``disaggregated``.

    Raises:
        ValueError: naming the field, for an unknown policy, a missing or non-positive chunk
            or budget (or both), counts < 1, a non-Request or duplicate id in the load, a bad
            cost model, a request that can never fit the KV capacity, or a run whose times
            leave the float range.
    """
    check_options(policy, chunk, chunk_budget, replicas, prefill_workers, decode_workers)
    if not isinstance(cost, CostModel):
        raise ValueError(f"cost must be a CostModel, got {type(cost).__name__}")
    with _no_collection():
        requests = validate_load(load)
        capacity = _capacity(requests, cost)
        tick = TickCost(cost)
        if policy == "disaggregated":
            results = _disaggregated(requests, tick, prefill_workers, decode_workers, capacity)
        else:
            results = _colocated(requests, tick, policy, chunk, chunk_budget, replicas, capacity)
    return Trace._of(policy, chunk, results)


@contextlib.contextmanager
def _no_collection() -> Iterator[None]:
    """No cyclic garbage collection inside: a run (or its summary) builds many small objects
    and no reference cycles, and the collector's scans would only cost time."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _capacity(requests: Sequence[Request], cost: CostModel) -> float:
    """The KV capacity as a whole number of tokens (or inf); ValueError naming a request that
    could never be admitted."""
    capacity = cost.kv_capacity_tokens
    if math.isinf(capacity):
        return capacity
    whole = int(capacity)
    for r in requests:
        if r.prompt_len + r.output_len > whole:
            raise ValueError(
                f"request {r.id!r} needs {r.prompt_len + r.output_len} tokens of KV "
                f"(prompt_len + output_len) but kv_capacity_tokens is {whole}: it can never "
                "be admitted"
            )
    return whole


def _demo() -> str:
    """The lab's scenario under each policy, as a plain-text table."""
    preset = PRESETS["lab-laptop"]
    cost = preset.cost
    streams = [Request(f"live{i}", 0.0, 128, 256) for i in range(2)]
    load = [*streams, Request("long", 0.1, 2048, 32)]
    chunk = max(1, round(cost.chunk_star()))
    rows = [("policy", "TTFT long (ms)", "max stall (ms)", "GPU-s", "makespan (s)")]
    for policy in POLICIES:
        trace = simulate(policy, load, cost, chunk=chunk)
        s = trace.summary()
        rows.append(
            (
                policy + (f" (chunk {chunk})" if policy == "chunked" else ""),
                f"{trace.requests['long'].ttft * 1e3:.1f}",
                f"{s.max_stall * 1e3:.1f}",
                f"{s.gpu_seconds:.3f}",
                f"{s.makespan:.3f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.rjust(w) if j else cell.ljust(w) for j, (cell, w) in enumerate(zip(row, widths))
        )
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    head = (
        f"Lab scenario: 2 live streams decoding, a 2048-token prompt arrives at 100 ms.\n"
        f"Cost model: preset '{preset.name}' ({preset.source})\n"
        f"C* = {cost.chunk_star():.0f} tokens\n"
    )
    return head + "\n".join(lines)


if __name__ == "__main__":
    print(_demo())
