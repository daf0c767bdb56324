"""Serving metrics named and defined as vLLM's serving benchmark defines them (TTFT, TPOT, ITL,
E2EL, throughput), and goodput and attainment under an SLO (DistServe's measure), computed from a
:class:`~pytest_prefill.sim.Trace`. Standard library only.

Definitions (DESIGN.md, "Serving metrics"), per request: TTFT = first token - arrival; E2EL =
last token - arrival; TPOT = (E2EL - TTFT) / (output_len - 1), requests with one output token
excluded; ITL = every gap between consecutive tokens of any request. Statistics are the mean,
the median, the population standard deviation and percentiles by linear interpolation (numpy's
default, which vLLM uses). Throughputs divide by the run's duration: first arrival to last token.
A request meets an SLO when each stated bound is >= its value; for that test a one-token request's
TPOT counts as 0, as in vLLM.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from pytest_prefill.sim import (
    GapMultiset,
    Trace,
    check_bounds,
    check_percentile,
    slo_values,
    stated_bounds,
    weighted_linear_percentile,
    within,
)
from pytest_prefill.units import duration_label

METRICS = ("ttft", "tpot", "itl", "e2el")
SLO_METRICS = ("ttft", "tpot", "e2el")  # the bounds vLLM's --goodput accepts
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}
# ASCII digits only (\d would take every script's digits) and no "1_000"; units in any case, as
# metric names are ("ttft:1S" is one second).
_DURATION = re.compile(
    r"^\s*((?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?)\s*(s|ms|us|µs)\s*$",
    re.ASCII | re.IGNORECASE,
)


@dataclasses.dataclass(frozen=True, slots=True)
class Distribution:
    """Statistics of one metric over a run, in seconds (NaN when ``count`` is 0).

    ``percentiles`` holds (p, value) pairs for the percentiles asked for."""

    count: int
    mean: float
    median: float
    std: float
    percentiles: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 0:
            raise ValueError(f"Distribution.count must be an integer >= 0, got {self.count!r}")

    @classmethod
    def of(cls, pairs: Iterable[tuple[float, int]], percentiles: Sequence[float]) -> Distribution:
        """The statistics of a multiset of (value, multiplicity) pairs."""
        items = [(float(v), int(c)) for v, c in pairs if c > 0]
        count = sum(c for _, c in items)
        asked = tuple(check_percentile(p) for p in percentiles)
        if count == 0:
            nan = math.nan
            return cls(0, nan, nan, nan, tuple((p, nan) for p in asked))
        mean = math.fsum(v * c for v, c in items) / count
        try:
            variance = math.fsum(c * (v - mean) ** 2 for v, c in items) / count
        except OverflowError:  # values near the float range (a cost of 1e300 s a token)
            variance = math.inf
        return cls(
            count,
            mean,
            weighted_linear_percentile(items, 50),
            math.sqrt(variance),
            tuple((p, weighted_linear_percentile(items, p)) for p in asked),
        )

    @classmethod
    def of_gaps(cls, gaps: GapMultiset, percentiles: Sequence[float]) -> Distribution:
        """The statistics of a trace's token-gap multiset, read off its runs (a simulation's
        gaps are never expanded one by one)."""
        asked = tuple(check_percentile(p) for p in percentiles)
        return cls(
            len(gaps),
            gaps.mean(),
            gaps.linear_percentile(50),
            gaps.std(),
            tuple((p, gaps.linear_percentile(p)) for p in asked),
        )

    def percentile(self, p: float) -> float:
        """The ``p``-th percentile, if it was computed.

        Raises:
            ValueError: naming the percentiles that were computed, for any other ``p``.
        """
        for asked, value in self.percentiles:
            if asked == p:
                return value
        computed = ", ".join(f"{asked:g}" for asked, _ in self.percentiles) or "none"
        raise ValueError(f"percentile {p!r} was not computed; computed: {computed}")


def _duration(item: str, text: str) -> float:
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(
            f"SLO bound {item!r}: {text!r} is not a duration; write a positive number with a "
            f"unit ({', '.join(UNITS)}), e.g. 500ms or 1.5s"
        )
    return float(match.group(1)) * UNITS[match.group(2).lower()]


@dataclasses.dataclass(frozen=True, slots=True)
class SLO:
    """Latency bounds a request must meet, in seconds (None: no bound on that metric).

    Raises:
        ValueError: naming the field, for a bound that is not a positive finite number, or when
            no bound is given.
    """

    ttft: float | None = None
    tpot: float | None = None
    e2el: float | None = None

    def __post_init__(self) -> None:
        check_bounds(self)

    @classmethod
    def parse(cls, text: str) -> SLO:
        """``"ttft:500ms,tpot:50ms,e2el:10s"`` (any subset, any order; units s, ms, us).

        Raises:
            ValueError: for an empty text, an item that is not ``metric:duration``, an unknown
                or repeated metric, or a duration without a unit or not > 0.
        """
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"SLO must be like 'ttft:500ms,tpot:50ms', got {text!r}")
        bounds: dict[str, float] = {}
        for item in text.split(","):
            name, sep, value = item.partition(":")
            name = name.strip().lower()
            if not sep or not name:
                raise ValueError(f"SLO item {item.strip()!r} must be metric:duration, e.g. ttft:1s")
            if name not in SLO_METRICS:
                raise ValueError(
                    f"SLO metric {name!r} is not one of {', '.join(SLO_METRICS)} (in {text!r})"
                )
            if name in bounds:
                raise ValueError(f"SLO metric {name!r} is given twice in {text!r}")
            bounds[name] = _duration(item.strip(), value)
        return cls(**bounds)

    @property
    def bounds(self) -> tuple[tuple[str, float], ...]:
        """The stated bounds as (metric, seconds), in the order ttft, tpot, e2el."""
        return stated_bounds(self)

    def __str__(self) -> str:
        return ",".join(f"{name}:{duration_label(value)}" for name, value in self.bounds)

    def to_dict(self) -> dict[str, float]:
        return dict(self.bounds)


@dataclasses.dataclass(frozen=True, slots=True)
class ServingMetrics:
    """vLLM's serving metrics of one run, plus goodput and attainment when an SLO was given.

    ``met`` counts, per bound of ``slo``, the requests meeting that bound alone; ``good`` those
    meeting every bound (0 without an SLO). A simulated run also says which engine profile
    produced it (``engine``) and its first-token rule (``first_token``: ``prefill`` or
    ``decode``, DESIGN.md's "Engine semantics"), and what the prefix cache supplied
    (``cached_tokens``, prompt tokens not computed, and ``preemptions``); None for a measured
    run."""

    completed: int
    duration: float
    total_input_tokens: int
    total_output_tokens: int
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2el: Distribution
    slo: SLO | None = None
    good: int = 0
    met: tuple[tuple[str, int], ...] = ()
    engine: str | None = None
    first_token: str | None = None
    cached_tokens: int | None = None
    preemptions: int | None = None
    refused: int = 0  # requests the engine refused (their KV never fits): each a miss

    @property
    def hit_rate(self) -> float:
        """Prompt tokens the prefix cache supplied / prompt tokens (NaN when not simulated)."""
        if self.cached_tokens is None or self.total_input_tokens == 0:
            return math.nan
        return self.cached_tokens / self.total_input_tokens

    @property
    def mean_cached_tokens(self) -> float:
        """Prompt tokens the prefix cache supplied per request (NaN when not simulated)."""
        if self.cached_tokens is None or self.completed == 0:
            return math.nan
        return self.cached_tokens / self.completed

    def _per_second(self, amount: float) -> float:
        return amount / self.duration if self.duration > 0 else math.nan

    @property
    def request_throughput(self) -> float:
        """Completed requests per second."""
        return self._per_second(self.completed)

    @property
    def output_throughput(self) -> float:
        """Output tokens per second."""
        return self._per_second(self.total_output_tokens)

    @property
    def total_token_throughput(self) -> float:
        """Prompt plus output tokens per second."""
        return self._per_second(self.total_input_tokens + self.total_output_tokens)

    @property
    def goodput(self) -> float:
        """Requests meeting every bound of the SLO, per second (NaN without an SLO)."""
        return self._per_second(self.good) if self.slo is not None else math.nan

    @property
    def attainment(self) -> float:
        """The fraction of requests meeting every bound of the SLO, those refused counted as
        missing it (NaN without one)."""
        if self.slo is None or self.completed + self.refused == 0:
            return math.nan
        return self.good / (self.completed + self.refused)

    def bound_attainment(self) -> tuple[tuple[str, float], ...]:
        """Per bound of the SLO, the fraction of requests meeting that bound alone."""
        judged = self.completed + self.refused
        if judged == 0:
            return tuple((name, math.nan) for name, _ in self.met)
        return tuple((name, n / judged) for name, n in self.met)

    def to_dict(self) -> dict[str, Any]:
        """The figures under the names vLLM's serving benchmark writes in its result JSON
        (latencies in ms: ``mean_ttft_ms``, ``p99_itl_ms``, …; ``request_goodput``), plus
        ``attainment`` and the ``slo`` in seconds; for a simulated run the ``engine`` profile,
        its ``first_token`` rule, the prefix cache's ``cached_tokens``, ``mean_cached_tokens``
        (per request) and ``hit_rate``, and ``preemptions``. NaN becomes None (JSON null)."""
        out: dict[str, Any] = {
            "completed": self.completed,
            "refused": self.refused,
            "duration": self.duration,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "request_goodput": self.goodput if self.slo is not None else None,
            "attainment": self.attainment if self.slo is not None else None,
            "slo": self.slo.to_dict() if self.slo is not None else None,
        }
        if self.engine is not None:
            out["engine"], out["first_token"] = self.engine, self.first_token
            out["cached_tokens"], out["mean_cached_tokens"] = (
                self.cached_tokens,
                self.mean_cached_tokens,
            )
            out["hit_rate"], out["preemptions"] = self.hit_rate, self.preemptions
        for name in METRICS:
            dist: Distribution = getattr(self, name)
            out[f"mean_{name}_ms"] = dist.mean * 1e3
            out[f"median_{name}_ms"] = dist.median * 1e3
            out[f"std_{name}_ms"] = dist.std * 1e3
            for p, value in dist.percentiles:
                out[f"p{p:g}_{name}_ms"] = value * 1e3
        return {k: None if isinstance(v, float) and math.isnan(v) else v for k, v in out.items()}


def _request_values(trace: Trace) -> tuple[list[float], list[float | None], list[float]]:
    """Per request, in the trace's order: TTFT, TPOT (None for one output token), E2EL."""
    ttfts: list[float] = []
    tpots: list[float | None] = []
    e2els: list[float] = []
    for record in trace.requests.values():
        ttft, tpot, e2el = slo_values(
            record.arrival, record.first_token, record.finish, record.output_len
        )
        ttfts.append(ttft)
        tpots.append(tpot)
        e2els.append(e2el)
    return ttfts, tpots, e2els


def _meeting(
    slo: SLO, values: Mapping[str, Sequence[float | None]]
) -> tuple[int, tuple[tuple[str, int], ...]]:
    """(requests meeting every bound, per bound the requests meeting it alone)."""
    checks = []
    for name, bound in slo.bounds:  # the simulator's test of one request (sim.within)
        checks.append((name, [within(v, bound) for v in values[name]]))
    good = sum(1 for row in zip(*(ok for _, ok in checks)) if all(row))
    return good, tuple((name, sum(ok)) for name, ok in checks)


def serving_metrics(
    trace: Trace, *, slo: SLO | None = None, percentiles: Sequence[float] = DEFAULT_PERCENTILES
) -> ServingMetrics:
    """vLLM's serving metrics of ``trace`` (and goodput and attainment for ``slo``).

    Never materialises every token time: it reads each request's first and last token and the
    trace's token-gap multiset (:meth:`Trace.token_gaps`).

    Raises:
        ValueError: for a percentile outside [0, 100] or an ``slo`` that is not an :class:`SLO`.
    """
    _check_slo(slo)
    records = list(trace.requests.values())
    ttfts, tpots, e2els = _request_values(trace)
    duration = max(r.finish for r in records) - min(r.arrival for r in records) if records else 0.0
    metrics = _assemble(
        (ttfts, tpots, e2els),
        Distribution.of_gaps(trace.token_gaps(), percentiles),
        duration=duration,
        tokens=(sum(r.prompt_len for r in records), sum(r.output_len for r in records)),
        slo=slo,
        percentiles=percentiles,
    )
    return dataclasses.replace(
        metrics,
        engine=trace.engine.name,
        first_token=trace.engine.first_token,
        cached_tokens=sum(r.cached_tokens for r in records),
        preemptions=trace.preemptions,
    )


class TimedRequest(Protocol):
    """A measured request: when it was sent, its lengths and every output token's time (the
    same clock), e.g. a load generator's record."""

    @property
    def arrival(self) -> float: ...
    @property
    def prompt_len(self) -> int: ...
    @property
    def token_times(self) -> Sequence[float]: ...


def serving_metrics_of(
    requests: Iterable[TimedRequest],
    *,
    slo: SLO | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> ServingMetrics:
    """vLLM's serving metrics of measured requests, by the same definitions as
    :func:`serving_metrics`: the output length is the number of token times (tokens that
    arrived together share a time, and their gaps of 0 count in ITL, as they happened).

    Raises:
        ValueError: for a request without tokens or with token times out of order, a
            percentile outside [0, 100], or an ``slo`` that is not an :class:`SLO`.
    """
    _check_slo(slo)
    rows = list(requests)
    ttfts: list[float] = []
    tpots: list[float | None] = []
    e2els: list[float] = []
    gaps: list[float] = []
    for row in rows:
        times = list(row.token_times)
        if not times or any(b < a for a, b in zip(times, times[1:])):
            raise ValueError(f"request {row!r:.60}: token_times must be non-empty and in order")
        ttfts.append(times[0] - row.arrival)
        e2els.append(times[-1] - row.arrival)
        tpots.append((times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None)
        gaps.extend(b - a for a, b in zip(times, times[1:]))
    start = min((r.arrival for r in rows), default=0.0)
    end = max((r.token_times[-1] for r in rows), default=0.0)
    return _assemble(
        (ttfts, tpots, e2els),
        Distribution.of(((g, 1) for g in gaps), percentiles),
        duration=end - start if rows else 0.0,
        tokens=(sum(r.prompt_len for r in rows), sum(len(r.token_times) for r in rows)),
        slo=slo,
        percentiles=percentiles,
    )


def _check_slo(slo: Any) -> None:
    if slo is not None and not isinstance(slo, SLO):
        raise ValueError(f"slo must be an SLO (SLO.parse('ttft:1s')), got {type(slo).__name__}")


def _assemble(
    values: tuple[list[float], list[float | None], list[float]],
    itl: Distribution,
    *,
    duration: float,
    tokens: tuple[int, int],
    slo: SLO | None,
    percentiles: Sequence[float],
) -> ServingMetrics:
    """The metrics of per-request TTFTs, TPOTs (None: one token) and E2ELs and the ITLs."""
    ttfts, tpots, e2els = values
    good, met = _meeting(slo, {"ttft": ttfts, "tpot": tpots, "e2el": e2els}) if slo else (0, ())
    return ServingMetrics(
        completed=len(ttfts),
        duration=duration,
        total_input_tokens=tokens[0],
        total_output_tokens=tokens[1],
        ttft=Distribution.of(((v, 1) for v in ttfts), percentiles),
        tpot=Distribution.of(((v, 1) for v in tpots if v is not None), percentiles),
        itl=itl,
        e2el=Distribution.of(((v, 1) for v in e2els), percentiles),
        slo=slo,
        good=good,
        met=met,
    )
