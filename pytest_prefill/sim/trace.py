"""A run's results as the API gives them: per-request records, the summary's headline
figures, and :class:`Trace`, which holds events and records (or, for a simulation, its compact
results, read on first access)."""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

from .events import LINK, Event
from .gaps import GapMultiset
from .percentiles import nearest_rank, weighted_percentile
from .profiles import LAB, EngineProfile


class Ranked(Protocol):
    """Token gaps as a summary ranks them: nearest-rank percentiles and the largest."""

    def percentile(self, p: float) -> float: ...

    def max(self) -> float: ...


class _Pairs:
    """(gap, count) pairs, ranked as :class:`Ranked` (a trace built from token times)."""

    def __init__(self, pairs: tuple[tuple[float, int], ...]) -> None:
        self.pairs = pairs

    def percentile(self, p: float) -> float:
        value: float = weighted_percentile(self.pairs, p)
        return value

    def max(self) -> float:
        return max((g for g, w in self.pairs if w > 0), default=math.nan)


class CompactRun(Protocol):
    """What a simulation's compact results give a :class:`Trace`."""

    def events(self) -> tuple[Event, ...]: ...

    def records(self) -> dict[str, RequestRecord]: ...

    def resources(self) -> tuple[str, ...]: ...

    def busy_time(self, resource: str | None = None) -> float: ...

    def gaps(self) -> GapMultiset: ...

    def summary(self) -> Summary: ...

    def steps(self) -> Iterator[Event]: ...


class RequestRecord:
    """What happened to one request (seconds). ``kv_ready`` is when its KV cache was usable by
    the worker that decodes it (its prefill end, except under disaggregation: the transfer's
    end); ``prefill_resource`` and ``decode_resource`` name the workers it was on.

    ``token_times`` may be given as a zero-argument function returning them (the simulator
    keeps them implicit, computed on first access), with ``first_token`` and ``finish``
    stated; given as a tuple, those two are read off it. ``cached_tokens``: prompt tokens
    the prefix cache supplied at its first admission (never computed; a request preempted may
    hit again when it is prefilled again, not counted here); ``preemptions``: how many times it was
    preempted by recompute (paged KV), at ``preempted_at`` (when known). Immutable.
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
        "cached_tokens",
        "preemptions",
        "preempted_at",
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
    cached_tokens: int
    preemptions: int
    preempted_at: tuple[float, ...]
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
        cached_tokens: int = 0,
        preemptions: int | None = None,
        preempted_at: tuple[float, ...] = (),
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
            cached_tokens=cached_tokens,
            preemptions=len(preempted_at) if preemptions is None else preemptions,
            preempted_at=tuple(preempted_at),
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
            self.cached_tokens,
            self.preemptions,
            self.preempted_at,
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
            f"{self.first_token!r}, finish={self.finish!r}, cached_tokens="
            f"{self.cached_tokens}, preemptions={self.preemptions})"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Summary:
    """Headline figures of a trace (seconds). Percentiles are nearest-rank; NaN when there is
    nothing to rank (no requests, or no request with two tokens for TBT). ``prefill_tokens``
    is the prompt tokens of the load; ``cached_tokens`` those of them the prefix cache
    supplied (:attr:`hit_rate` = cached / prompt tokens); ``preemptions`` the preemptions by
    recompute (paged KV), all requests together."""

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
    cached_tokens: int = 0
    preemptions: int = 0

    @property
    def empty(self) -> bool:
        return self.requests == 0

    @property
    def hit_rate(self) -> float:
        """Prompt tokens the prefix cache supplied / prompt tokens (0.0 for an empty trace)."""
        return self.cached_tokens / self.prefill_tokens if self.prefill_tokens else 0.0

    def to_dict(self) -> dict[str, float | int]:
        """The fields by name, and ``hit_rate``."""
        out: dict[str, float | int] = {
            f.name: getattr(self, f.name) for f in dataclasses.fields(self)
        }
        out["hit_rate"] = self.hit_rate
        return out

    @classmethod
    def of(
        cls,
        ttfts: Iterable[Any],
        gaps: Ranked,
        *,
        output_tokens: int,
        prefill_tokens: int,
        gpu_seconds: float,
        makespan: float,
        cached_tokens: int = 0,
        preemptions: int = 0,
        seconds: Callable[[Any], float] = float,
    ) -> Summary:
        """The summary of a run from each request's TTFT (any order; in ``seconds`` units:
        the simulator's ticks, converted once ranked) and its token gaps, ranked by nearest
        rank: the one place a summary is computed (a simulation's compact results and a trace
        of records both come here)."""
        ordered = sorted(ttfts)
        n = len(ordered)
        if not n:
            nan = math.nan
            return cls(0, 0, 0, nan, nan, nan, nan, nan, 0.0, 0.0)
        return cls(
            requests=n,
            output_tokens=output_tokens,
            prefill_tokens=prefill_tokens,
            ttft_p50=seconds(ordered[nearest_rank(50, n) - 1]),
            ttft_p99=seconds(ordered[nearest_rank(99, n) - 1]),
            tbt_p50=gaps.percentile(50),
            tbt_p99=gaps.percentile(99),
            max_stall=gaps.max(),
            gpu_seconds=gpu_seconds,
            makespan=makespan,
            cached_tokens=cached_tokens,
            preemptions=preemptions,
        )

    def __str__(self) -> str:
        if self.empty:
            return "empty trace: no requests were simulated"
        return (
            f"{self.requests} requests, {self.output_tokens} tokens: "
            f"TTFT p50 {self.ttft_p50 * 1e3:.1f} ms, p99 {self.ttft_p99 * 1e3:.1f} ms; "
            f"TBT p50 {self.tbt_p50 * 1e3:.1f} ms, p99 {self.tbt_p99 * 1e3:.1f} ms; "
            f"max stall {self.max_stall * 1e3:.1f} ms; {self.gpu_seconds:.3f} GPU-s; "
            f"makespan {self.makespan:.3f} s"
            + (f"; prefix hit rate {self.hit_rate:.1%}" if self.cached_tokens else "")
            + (f"; {self.preemptions} preemptions" if self.preemptions else "")
        )


class Trace:
    """Everything a run did: iterations and transfers (``events``, by resource then time) and
    one record per request (``requests``, by arrival then id). Real engine runs build one from
    their events and records; the simulator's keeps its results compact and builds events,
    records and token times on first access (``summary()`` and ``token_gap_counts()`` never
    need them). ``gaps`` optionally carries the token-gap multiset as (gap, count) pairs;
    ``engine`` is the profile whose rules produced the run (default: the lab's).
    """

    def __init__(
        self,
        policy: str,
        events: Iterable[Event],
        requests: Mapping[str, RequestRecord],
        chunk: int | None = None,
        gaps: Iterable[tuple[float, int]] | None = None,
        engine: EngineProfile | None = None,
    ) -> None:
        self.policy = policy
        self.chunk = chunk
        self.engine = LAB if engine is None else engine
        self._events: tuple[Event, ...] | None = tuple(events)
        self._requests: Mapping[str, RequestRecord] | None = requests
        self._gaps = None if gaps is None else tuple(gaps)
        self._run: CompactRun | None = None
        self._summary: Summary | None = None
        self.stopped: str | None = None  # a simulation stopped once its verdict was fixed
        self.misses = 0  # then: the requests known to have missed the SLO

    @classmethod
    def of_run(
        cls,
        policy: str,
        chunk: int | None,
        run: CompactRun,
        engine: EngineProfile | None = None,
        stopped: str | None = None,
        misses: int = 0,
    ) -> Trace:
        """The trace of a simulation, read from its compact results on demand; ``stopped``:
        the verdict it stopped on (``"failed"`` or ``"passed"``; None: it ran to the end),
        with the ``misses`` known then (its records are then those of the requests finished
        by then)."""
        trace = cls(policy, (), {}, chunk, engine=engine)
        trace._events = trace._requests = None
        trace._run = run
        trace.stopped, trace.misses = stopped, misses
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
        for gap, n in record_gaps(self.requests.values()):
            counts[gap] = counts.get(gap, 0) + n
        return tuple(sorted(counts.items()))

    def summary(self) -> Summary:
        """The headline figures.

        Raises:
            ValueError: for a simulation that stopped once its verdict was fixed: its records
                are partial, so would its figures be.
        """
        if self.stopped is not None:
            raise ValueError(
                f"this simulation stopped early ({self.stopped}, {self.misses} misses known): "
                "its records are those of the requests finished by then; run it without stop= "
                "for a summary"
            )
        if self._summary is None:
            with no_collection():
                self._summary = self._run.summary() if self._run is not None else self._summarize()
        return self._summary

    def _summarize(self) -> Summary:
        records = list(self.requests.values())
        return Summary.of(
            [r.ttft for r in records],
            _Pairs(self.token_gap_counts()),
            output_tokens=sum(len(r.token_times) for r in records),
            prefill_tokens=sum(r.prompt_len for r in records),
            gpu_seconds=self.busy_time(),
            makespan=max((r.finish for r in records), default=0.0)
            - min((r.arrival for r in records), default=0.0),
            cached_tokens=sum(r.cached_tokens for r in records),
            preemptions=sum(r.preemptions for r in records),
        )

    @property
    def hit_rate(self) -> float:
        """Prompt tokens the prefix cache supplied / prompt tokens, over the whole load."""
        return self.summary().hit_rate

    @property
    def preemptions(self) -> int:
        """Preemptions by recompute (paged KV) in the run, all requests together."""
        return self.summary().preemptions

    def cached_tokens(self, request_id: str) -> int:
        """The prompt tokens of request ``request_id`` the prefix cache supplied.

        Raises:
            ValueError: naming the id, for a request not in the trace.
        """
        record = self.requests.get(request_id)
        if record is None:
            raise ValueError(f"request_id {request_id!r} is not a request of this trace")
        return record.cached_tokens

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
        return (self.policy, self.chunk, self.engine, self.events, dict(self.requests)) == (
            other.policy,
            other.chunk,
            other.engine,
            other.events,
            dict(other.requests),
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        engine = "" if self.engine == LAB else f", engine={self.engine.name!r}"
        if self.stopped is not None:
            figures = f"stopped {self.stopped} with {self.misses} misses"
        else:
            figures = str(self.summary())
        return f"Trace(policy={self.policy!r}, chunk={self.chunk!r}{engine}, {figures})"


def record_gaps(records: Iterable[RequestRecord]) -> list[tuple[float, int]]:
    """Every gap between consecutive tokens of a request, read off its records' token times, as
    (gap, 1) pairs (:meth:`Trace.token_gaps` is the multiset of them)."""
    return [(b - a, 1) for r in records for a, b in zip(r.token_times, r.token_times[1:])]


@contextlib.contextmanager
def no_collection() -> Iterator[None]:
    """No cyclic garbage collection inside: a run (or its summary) builds many small objects
    and no reference cycles, and the collector's scans would only cost time."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
