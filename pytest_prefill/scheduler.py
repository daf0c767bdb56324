"""Iteration-level simulator of LLM serving policies: shared worker, co-scheduled batching,
chunked prefill (Sarathi-Serve) and prefill/decode disaggregation (DistServe).

Standard library only and copy-and-run: ``python pytest_prefill/scheduler.py`` prints a policy
comparison. Its :class:`Worker` (the scheduling rules, one iteration at a time) is also what the
real engine runs. The semantics are DESIGN.md's "Simulation semantics"; each point is pinned by a
test.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
import math
import operator
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
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

    def prefill_pieces(self, pieces: Iterable[Piece]) -> float:
        """A prefill pass over prompt pieces ``(T, C)``: T new tokens over C cached tokens of
        the same request (each piece attends only to its own request)."""
        tokens = pairs = context = 0
        for t, c in pieces:
            if (
                isinstance(t, bool)
                or isinstance(c, bool)
                or not (isinstance(t, int) and isinstance(c, int) and t >= 0 and c >= 0)
            ):
                raise ValueError(f"a piece's tokens and context must be ints >= 0, got {(t, c)!r}")
            tokens += t
            pairs += t * c + t * (t + 1) // 2
            context += c
        return (
            self.prefill_pass_overhead
            + self.prefill_per_token * tokens
            + self.prefill_per_pair * pairs
            + self.decode_per_kv_token * context
        )

    def prefill_pass(self, tokens: int, context: int = 0) -> float:
        """A prefill pass over ``tokens`` new tokens attending to ``context`` cached ones."""
        if tokens < 0 or context < 0:
            raise ValueError(f"tokens and context must be >= 0, got {tokens!r}, {context!r}")
        return self.prefill_pieces(((tokens, context),))

    def decode_step(self, rows: int, kv_tokens: int) -> float:
        """A decode step of ``rows`` sequences reading ``kv_tokens`` cached tokens in total."""
        if rows < 1 or kv_tokens < 0:
            raise ValueError(f"rows must be >= 1 and kv_tokens >= 0, got {rows!r}, {kv_tokens!r}")
        return (
            self.decode_step_base
            + self.decode_per_seq * (rows - 1)
            + self.decode_per_kv_token * kv_tokens
        )

    def compute_part(self, pieces: Iterable[Piece], rows: int) -> float:
        """The compute part of a fused pass: the prefill pass over ``pieces`` with the ``rows``
        decode rows riding its linear layers as that many more tokens."""
        if rows < 0:
            raise ValueError(f"rows must be >= 0, got {rows!r}")
        return self.prefill_pieces(pieces) + self.prefill_per_token * rows

    def iteration(self, pieces: Iterable[Piece] = (), rows: int = 0, kv_tokens: int = 0) -> float:
        """One iteration: a prefill pass (no rows), a decode step (no pieces), or a fused pass
        of both: ``max(decode, compute) + fusion_penalty * min(decode, compute)``."""
        pieces = tuple(pieces)
        if not pieces:
            return self.decode_step(rows, kv_tokens)
        if rows == 0:
            return self.prefill_pieces(pieces)
        decode = self.decode_step(rows, kv_tokens)
        compute = self.compute_part(pieces, rows)
        return max(decode, compute) + self.fusion_penalty * min(decode, compute)

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


@dataclasses.dataclass(frozen=True, slots=True)
class RequestRecord:
    """What happened to one request. ``kv_ready`` is when its KV cache was usable by the worker
    that decodes it (its prefill end, except under disaggregation: the transfer's end)."""

    id: str
    arrival: float
    prompt_len: int
    output_len: int
    prefill_start: float
    prefill_end: float
    kv_ready: float
    decode_resource: str
    token_times: tuple[float, ...]

    @property
    def first_token(self) -> float:
        return self.token_times[0]

    @property
    def ttft(self) -> float:
        return self.token_times[0] - self.arrival

    @property
    def finish(self) -> float:
        return self.token_times[-1]


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


def weighted_percentile(pairs: Iterable[tuple[float, int]], p: float) -> float:
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


@dataclasses.dataclass(frozen=True)
class Trace:
    """Everything a run did: iterations and transfers (``events``, by resource then time) and
    one record per request (``requests``, by arrival then id). Real engine runs produce the
    same type. ``gaps`` optionally carries the token-gap multiset precomputed by the simulator
    (it equals :func:`token_gaps` of the records, only faster to rank)."""

    policy: str
    events: tuple[Event, ...]
    requests: Mapping[str, RequestRecord]
    chunk: int | None = None
    gaps: tuple[tuple[float, int], ...] | None = dataclasses.field(
        default=None, compare=False, repr=False
    )

    @property
    def resources(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(e.resource for e in self.events))

    def busy_time(self, resource: str | None = None) -> float:
        """Busy seconds of one resource, or of all compute resources (not the link)."""
        return sum(
            e.duration
            for e in self.events
            if (e.resource == resource if resource is not None else e.resource != LINK)
        )

    def token_gap_counts(self) -> tuple[tuple[float, int], ...]:
        """Every gap between consecutive tokens of any request (vLLM's ITL) as (gap seconds,
        how many) pairs; cheap: the simulator's precomputed multiset when it has one."""
        if self.gaps is not None:
            return self.gaps
        counts: Counter[float] = Counter()
        for gap, n in token_gaps(self.requests.values()):
            counts[gap] += n
        return tuple(counts.items())

    def summary(self) -> Summary:
        records = list(self.requests.values())
        if not records:
            nan = math.nan
            return Summary(0, 0, 0, nan, nan, nan, nan, nan, 0.0, 0.0)
        ttfts = [r.ttft for r in records]
        gaps = list(self.gaps) if self.gaps is not None else token_gaps(records)
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


class _Events:
    """Collects events, coalescing back-to-back identical decode steps into one."""

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
        # By resource in ``order``, then by start; grouping first spares a key call per event.
        groups: dict[str, list[Event]] = {name: [] for name in order}
        for e in self.done:
            groups[e.resource].append(e)
        start = operator.attrgetter("start")
        return tuple(itertools.chain.from_iterable(sorted(g, key=start) for g in groups.values()))


MODES = ("shared", "chunked", "decode")


class Plan(NamedTuple):
    """What one iteration does, decided at its start by :meth:`Worker.compose`: prompt pieces
    ``(request, tokens done before, tokens now)`` taken FCFS, the ids of the decode rows (each
    emits one token; the same tuple while the rows do not change), the KV tokens the rows read
    (K), the earlier context the pieces attend to (C), and the requests whose prompt the
    iteration completes.

    Immutable, built by the worker and not validated; a named tuple rather than a frozen
    dataclass because the simulator builds one per iteration and a frozen dataclass's
    ``__init__`` costs about three times as much.
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


class Worker:
    """The scheduling rules of one compute resource, one iteration at a time: at a boundary
    :meth:`compose` says what the next iteration does, the caller runs it, :meth:`finish_at`
    ends it. The simulator times iterations with the cost model; the engine runs them for real.

    Modes: ``shared`` (a prefill pass of every waiting prompt first, else a decode step),
    ``chunked`` (decode rows fused with up to ``chunk`` prompt tokens; inf: co-scheduled),
    ``decode`` (decode only: prefilled requests come in through :meth:`join`); only ``chunked``
    reads ``chunk``. A prompt completed here joins this worker's decode rows at the next
    boundary.

    Raises:
        ValueError: for an unknown mode, or a chunk that is not a whole number >= 1 or inf.
    """

    def __init__(self, name: str, mode: str, chunk: float = math.inf) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
        whole = isinstance(chunk, (int, float)) and not isinstance(chunk, bool) and chunk >= 1
        if not (chunk == math.inf or (whole and chunk == int(chunk))):
            raise ValueError(f"chunk must be a whole number of tokens >= 1 or inf, got {chunk!r}")
        self.name, self.mode = name, mode
        self.chunk = math.inf if mode == "shared" else float(chunk)  # prompt tokens per pass
        self.waiting: deque[list[Any]] = deque()  # [request, prompt tokens done]
        self.joining: list[Request] = []  # prefilled, join the decode rows at the next boundary
        self.running: list[Request] = []
        self._ids: tuple[str, ...] = ()  # their ids, rebuilt on change: events key on identity
        self.kv_tokens = 0  # what the next decode step reads
        self.decode_ends: list[float] = []  # end of every iteration that emitted tokens
        self.first_index: dict[str, int] = {}  # request -> index of its first token there
        self._finishing: dict[int, list[Request]] = {}  # decode index -> requests done there
        self._finish_heap: list[int] = []  # the keys of _finishing
        self._firsts: dict[int, int] = {}  # decode index -> requests taking their first token
        self.gaps: dict[float, int] = {}  # token gap -> how many tokens followed such a gap
        self.prefill_start: dict[str, float] = {}
        self.prefill_end: dict[str, float] = {}
        self._plan: Plan | None = None  # the running iteration's

    def admit(self, request: Request) -> None:
        """A request arrives: its prompt waits for prefill here (FCFS)."""
        if self.mode == "decode":
            raise ValueError(f"{self.name} only decodes: hand it prefilled requests with join()")
        self.waiting.append([request, 0])

    def join(self, request: Request) -> None:
        """A request prefilled elsewhere joins the decode rows at the next boundary."""
        self.joining.append(request)

    @property
    def load(self) -> int:
        return len(self.running) + len(self.joining)

    def _admit_joining(self) -> None:
        index = len(self.decode_ends)
        for r in self.joining:
            self.first_index[r.id] = index
            self._firsts[index] = self._firsts.get(index, 0) + 1
            last = index + r.output_len - 1
            if last not in self._finishing:
                self._finishing[last] = []
                heapq.heappush(self._finish_heap, last)
            self._finishing[last].append(r)
            self.kv_tokens += r.prompt_len
        self.running.extend(self.joining)
        self.joining = []
        self._ids = tuple([r.id for r in self.running])

    def compose(self, now: float) -> Plan | None:
        """Admit the requests joining at this boundary and compose the iteration that starts
        at ``now`` (None: nothing to do). Call :meth:`finish_at` before composing again."""
        if self.joining:
            self._admit_joining()
        if not self.waiting:  # decode rows only (always so in decode mode)
            plan = Plan((), self._ids, self.kv_tokens) if self._ids else None
            self._plan = plan
            return plan
        budget = self.chunk  # >= 1, so at least one prompt piece
        prefill: list[tuple[Request, int, int]] = []
        completed: list[Request] = []
        context = 0
        while self.waiting and budget > 0:
            entry = self.waiting[0]
            request, done = entry
            take = int(min(request.prompt_len - done, budget))
            prefill.append((request, done, take))
            context += done
            budget -= take
            self.prefill_start.setdefault(request.id, now)
            if done + take == request.prompt_len:
                completed.append(request)
                self.waiting.popleft()
            else:
                entry[1] = done + take
        if self.mode == "shared" or not self.running:  # shared: the pass holds up every row
            plan = Plan(tuple(prefill), (), 0, context, tuple(completed))
        else:
            plan = Plan(tuple(prefill), self._ids, self.kv_tokens, context, tuple(completed))
        self._plan = plan
        return plan

    def finish_at(self, end: float) -> tuple[Request, ...]:
        """End the composed iteration at ``end``; return the requests whose prompt it completed
        (they join the decode rows at the next boundary)."""
        return self._finish(end, [end])

    def _finish(self, end: float, ends: list[float]) -> tuple[Request, ...]:
        """End the composed iteration at ``end``: its decode rows ran one step ending at each of
        ``ends`` (more than one: a run of unchanging decode steps, up to the next finish)."""
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
        index = len(self.decode_ends)
        gaps = self.gaps
        continuing = rows - self._firsts.pop(index, 0)
        if continuing and self.decode_ends:
            gap = ends[0] - self.decode_ends[-1]
            gaps[gap] = gaps.get(gap, 0) + continuing
        if len(ends) > 64:  # a long run: count equal gaps in C first
            for gap, times in Counter(map(operator.sub, ends[1:], ends)).items():
                gaps[gap] = gaps.get(gap, 0) + times * rows
        elif len(ends) > 1:
            for gap in map(operator.sub, ends[1:], ends):
                gaps[gap] = gaps.get(gap, 0) + rows
        self.decode_ends.extend(ends)
        self.kv_tokens += rows * len(ends)
        last = len(self.decode_ends) - 1
        if self._finish_heap[0] == last:
            heapq.heappop(self._finish_heap)
            done = self._finishing.pop(last)
            gone = {r.id for r in done}
            self.running = [r for r in self.running if r.id not in gone]
            self._ids = tuple([r.id for r in self.running])
            self.kv_tokens -= sum(r.prompt_len + r.output_len for r in done)
        return completed

    def record(self, r: Request, start: float, end: float, ready: float) -> RequestRecord:
        """What happened to ``r``, decoded here, given its prefill start and end and KV ready."""
        first = self.first_index[r.id]
        tokens = tuple(self.decode_ends[first : first + r.output_len])
        return RequestRecord(
            r.id, r.arrival, r.prompt_len, r.output_len, start, end, ready, self.name, tokens
        )


class _Worker(Worker):
    """A :class:`Worker` timed by the cost model, its iterations logged to ``events``.

    Speed: a stretch of decode steps in which nothing can change (no prompt waiting, nobody
    finishing, no arrival before the step starts) is advanced in one go; every step's end time
    is still computed by the same additions as step by step, so token times are exact.
    """

    def __init__(
        self, name: str, mode: str, cost: CostModel, events: _Events, chunk: float = math.inf
    ) -> None:
        super().__init__(name, mode, chunk)
        self.cost, self.events = cost, events
        self.busy_until: float | None = None
        self._ends: list[float] = []  # end of each decode-bearing step in the running iteration

    def start(self, now: float, horizon: float = math.inf) -> None:
        """Begin the next iteration at ``now`` if there is work; otherwise stay idle.
        ``horizon`` is the next arrival: no step that starts at or after it may be merged."""
        plan = self.compose(now)
        if plan is None:
            return
        rows = len(plan.decode_ids)
        if not plan.prefill:
            self._start_decode_run(now, horizon, rows)
            return
        end = now + self.cost.iteration(plan.pieces(), rows, plan.kv_tokens)
        self.events.add(
            self.name,
            now,
            end,
            "fused" if rows else "prefill",
            plan.prefill_ids(),
            plan.decode_ids,
            plan.kv_tokens,
            plan.context_tokens,
            contexts=plan.contexts(),
        )
        self._ends = [end] if rows else []
        self.busy_until = end

    def _start_decode_run(self, now: float, horizon: float, rows: int) -> None:
        cost, kv = self.cost, self.kv_tokens
        steps = self._finish_heap[0] - len(self.decode_ends) + 1  # up to the next finish
        first = cost.decode_step(rows, kv)
        if horizon < math.inf:  # steps last >= first, so at most this many start before it
            steps = min(steps, int((horizon - now) / first) + 2)
        if cost.decode_per_kv_token == 0:
            durations: Iterable[float] = itertools.repeat(first, steps)
        else:
            durations = [cost.decode_step(rows, kv + i * rows) for i in range(steps)]
        ends = list(itertools.accumulate(durations, initial=now))
        del ends[0]
        # Step i starts at ends[i-1]; keep the steps that start before the horizon.
        del ends[1 + bisect.bisect_left(ends, horizon, 0, steps - 1) :]
        if cost.decode_per_kv_token == 0:
            self.events.add(
                self.name, now, ends[-1], "decode", (), self._ids, kv, count=len(ends), step=first
            )
        else:
            begin = now
            for i, end in enumerate(ends):
                self.events.add(self.name, begin, end, "decode", (), self._ids, kv + i * rows)
                begin = end
        self._ends = ends
        self.busy_until = ends[-1]


def _run(
    workers: Sequence[_Worker],
    arrivals: Sequence[tuple[float, Request]],
    admit: Callable[[Request], None],
) -> None:
    """Advance ``workers`` instant by instant: finish iterations that end now, admit arrivals,
    then start an iteration on every idle worker that has work."""
    i, n = 0, len(arrivals)
    while True:
        t = arrivals[i][0] if i < n else math.inf
        for w in workers:
            if w.busy_until is not None and w.busy_until < t:
                t = w.busy_until
        if t == math.inf:
            return
        for w in workers:
            if w.busy_until == t:  # end what it started: one iteration, or a run of steps
                w.busy_until = None
                w._finish(t, w._ends)
        while i < n and arrivals[i][0] <= t:
            admit(arrivals[i][1])
            i += 1
        horizon = arrivals[i][0] if i < n else math.inf
        for w in workers:
            if w.busy_until is None:
                w.start(t, horizon)


def _validate_load(load: Iterable[Request]) -> list[Request]:
    requests = list(load)
    seen: set[str] = set()
    for i, r in enumerate(requests):
        if not isinstance(r, Request):
            raise ValueError(f"load[{i}] must be a Request, got {type(r).__name__}")
        if r.id in seen:
            raise ValueError(f"load[{i}].id {r.id!r} is a duplicate; request ids must be unique")
        seen.add(r.id)
    # FCFS ties are broken by id, so the order of the load list never matters.
    return sorted(requests, key=lambda r: (r.arrival, r.id))


def _check_options(policy: str, chunk: Any, prefill_workers: Any, decode_workers: Any) -> None:
    """ValueError naming the field for an unknown policy, a missing or bad chunk, or a pool
    size < 1 (shared by every entry point that runs a policy)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
    if policy == "chunked" and chunk is None:
        raise ValueError(
            "chunk must be a positive integer (prompt tokens per iteration) for 'chunked'"
        )
    if chunk is not None:
        check_int("chunk", chunk)
    check_int("prefill_workers", prefill_workers)
    check_int("decode_workers", decode_workers)


def simulate(
    policy: str,
    load: Iterable[Request],
    cost: CostModel,
    *,
    chunk: int | None = None,
    prefill_workers: int = 1,
    decode_workers: int = 1,
) -> Trace:
    """Replay ``load`` under ``policy`` on a device described by ``cost``.

    Args:
        policy: one of ``POLICIES``.
        load: the requests; their order does not matter (FCFS by arrival, then id).
        cost: the cost model.
        chunk: prompt tokens per iteration for ``chunked`` (required there, ignored elsewhere).
        prefill_workers, decode_workers: pool sizes for ``disaggregated``.

    Raises:
        ValueError: naming the field, for an unknown policy, a missing or non-positive chunk,
            workers < 1, a non-Request or duplicate id in the load, or a bad cost model.
    """
    _check_options(policy, chunk, prefill_workers, decode_workers)
    if not isinstance(cost, CostModel):
        raise ValueError(f"cost must be a CostModel, got {type(cost).__name__}")
    requests = _validate_load(load)
    events = _Events()
    if policy == "disaggregated":
        return _disaggregated(requests, cost, events, chunk, prefill_workers, decode_workers)
    mode = "shared" if policy == "shared" else "chunked"
    budget = float(chunk) if policy == "chunked" and chunk is not None else math.inf
    worker = _Worker("worker", mode, cost, events, budget)
    _run([worker], [(r.arrival, r) for r in requests], worker.admit)
    records = {
        r.id: worker.record(
            r, worker.prefill_start[r.id], worker.prefill_end[r.id], worker.prefill_end[r.id]
        )
        for r in requests
    }
    return Trace(policy, events.finish(["worker"]), records, chunk, tuple(worker.gaps.items()))


def _disaggregated(
    requests: list[Request],
    cost: CostModel,
    events: _Events,
    chunk: int | None,
    prefill_workers: int,
    decode_workers: int,
) -> Trace:
    # Prefill pool: one unchunked pass per prompt, FCFS, on the first free worker (lowest index).
    free_at = [0.0] * prefill_workers
    prefilled: list[tuple[float, int, Request, float]] = []
    for order, r in enumerate(requests):
        start = max(r.arrival, min(free_at))
        w = next(i for i, f in enumerate(free_at) if f <= start)
        end = start + cost.prefill_pass(r.prompt_len)
        events.add(f"prefill{w}", start, end, "prefill", ((r.id, r.prompt_len),))
        free_at[w] = end
        prefilled.append((end, order, r, start))
    # The link: one transfer at a time, in order of prefill completion.
    prefilled.sort(key=lambda x: (x[0], x[1]))
    link_free = 0.0
    ready: dict[str, tuple[float, float, float]] = {}
    arrivals: list[tuple[float, Request]] = []
    for end, _, r, start in prefilled:
        duration = cost.kv_transfer(r.prompt_len)
        if duration > 0:
            begin = max(end, link_free)
            link_free = begin + duration
            events.add(LINK, begin, link_free, "transfer", ((r.id, r.prompt_len),))
            arrived = link_free
        else:
            arrived = end  # a free link: the KV is usable where it was made
        ready[r.id] = (start, end, arrived)
        arrivals.append((arrived, r))
    # Decode pool: a request joins the worker with the fewest requests (lowest index on ties).
    workers = [_Worker(f"decode{i}", "decode", cost, events) for i in range(decode_workers)]

    def admit(r: Request) -> None:
        min(workers, key=lambda w: w.load).join(r)

    _run(workers, arrivals, admit)
    owner = {rid: w for w in workers for rid in w.first_index}
    records = {r.id: owner[r.id].record(r, *ready[r.id]) for r in requests}
    names = [f"prefill{i}" for i in range(prefill_workers)] + [LINK] + [w.name for w in workers]
    gaps = tuple(g for w in workers for g in w.gaps.items())
    return Trace("disaggregated", events.finish(names), records, chunk, gaps)


def iteration_cost(event: Event, cost: CostModel) -> float:
    """What ``event`` lasts by ``cost``'s formulas: a KV transfer, a prefill pass, a fused
    iteration, or ``count`` decode steps of which the i-th (from 0) reads
    ``kv_tokens + i * decode_rows`` cached tokens.

    Raises:
        ValueError: for an event kind not in ``KINDS``.
    """
    if event.kind == "decode":
        rows, n = event.decode_rows, event.count
        first = cost.decode_step(rows, event.kv_tokens)
        return n * first + cost.decode_per_kv_token * rows * (n * (n - 1) // 2)
    if event.kind == "transfer":
        return cost.kv_transfer(event.prefill_tokens)
    if event.kind in ("prefill", "fused"):
        return cost.iteration(event.pieces, event.decode_rows, event.kv_tokens)
    raise ValueError(f"event kind must be one of {', '.join(KINDS)}; got {event.kind!r}")


def check_invariants(
    trace: Trace, load: Iterable[Request], cost: CostModel | None = None
) -> list[str]:
    """Every DESIGN.md invariant that ``trace`` breaks for ``load``, as sentences (empty: none).

    With ``cost``, each event's duration is also checked against the cost model's formula.
    """
    problems: list[str] = []
    requests = {r.id: r for r in load}
    by_resource: dict[str, list[Event]] = {}
    for e in trace.events:
        by_resource.setdefault(e.resource, []).append(e)
        if e.kind not in KINDS:
            problems.append(f"event kind {e.kind!r} is not one of {KINDS}")
        if not e.end > e.start:
            problems.append(f"{e.resource} event at {e.start} has no duration")
    for resource, evs in by_resource.items():
        evs = sorted(evs, key=lambda e: e.start)
        for a, b in zip(evs, evs[1:]):
            if b.start < a.end:
                problems.append(f"{resource} runs two things at once at {b.start}")
    prefilled: dict[str, int] = {}
    for e in trace.events:
        if e.kind != "transfer":
            for rid, tokens in e.prefill:
                prefilled[rid] = prefilled.get(rid, 0) + tokens
    if set(trace.requests) != set(requests):
        problems.append("the trace's requests are not the load's requests")
    for rid, r in requests.items():
        rec = trace.requests.get(rid)
        if rec is None:
            continue
        if len(rec.token_times) != r.output_len:
            problems.append(f"{rid} got {len(rec.token_times)} tokens, expected {r.output_len}")
        if prefilled.get(rid, 0) != r.prompt_len:
            problems.append(
                f"{rid} prefilled {prefilled.get(rid, 0)} tokens, expected {r.prompt_len}"
            )
        times = rec.token_times
        if any(b <= a for a, b in zip(times, times[1:])):
            problems.append(f"{rid}'s token times do not strictly increase")
        if not r.arrival <= rec.prefill_start < rec.prefill_end <= rec.kv_ready:
            problems.append(f"{rid}: arrival <= prefill start < prefill end <= KV ready fails")
        if times and not times[0] > rec.kv_ready:
            problems.append(f"{rid}'s first token is not after its KV cache was ready")
    busy = sum(e.duration for e in trace.events if e.resource != LINK)
    if not math.isclose(busy, trace.summary().gpu_seconds, rel_tol=1e-9, abs_tol=1e-12):
        problems.append("events' busy time differs from gpu_seconds")
    if cost is not None:
        for e in trace.events:
            if e.kind not in KINDS:
                continue  # reported above
            expected = iteration_cost(e, cost)
            if not math.isclose(e.duration, expected, rel_tol=1e-9, abs_tol=1e-12):
                problems.append(
                    f"{e.resource} {e.kind} at {e.start} lasts {e.duration}, cost model says {expected}"
                )
    return problems


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
