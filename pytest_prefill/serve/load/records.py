"""What a run against a server measured: one record per request (every token's arrival on the
client's monotonic clock, counted from the server's usage figures), and the run's serving
metrics by the simulator's own definitions. Standard library only.

What a server's own counters say about a run: the engines' metric names (vLLM's, llama.cpp's,
SGLang's) and :class:`ServerCounters`, the samples before and after a run with the hit rate,
preemptions, tokens and gauges they give. Reading them is :mod:`.server_metrics`'s."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_prefill.plan.metrics import DEFAULT_PERCENTILES, SLO, ServingMetrics, serving_metrics_of
from pytest_prefill.serve.load.record_fields import RecordFields

if TYPE_CHECKING:
    from pytest_prefill.measure.quiet import HostSteal

# Tokens a server may count in a prompt beyond those asked for: a chat template's and a BOS
# token's. More is a tokenizer that is not the server's (the prompt was not the length asked).
PROMPT_SLACK = 64


@dataclasses.dataclass(frozen=True, slots=True)
class ServerRecord:
    """One request as the client saw it. Times are seconds since the run started.

    ``scheduled`` is when the schedule meant to send it, ``arrival`` when it went out (what
    TTFT is counted from, as vLLM's benchmark does); ``chunk_times`` when each streamed chunk
    that carried tokens arrived and ``chunk_tokens`` how many (several tokens in one chunk
    arrived together); ``prompt_tokens`` / ``output_tokens`` are the server's usage figures
    (None when it gave none); ``error`` says why a request failed (then it has no metrics)."""

    id: str
    scheduled: float
    arrival: float
    prompt_len: int
    output_len: int
    chunk_times: tuple[float, ...] = ()
    chunk_tokens: tuple[int, ...] = ()
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    server_timings: Mapping[str, Any] | None = None
    error: str | None = None
    counts_assumed: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.chunk_times)

    @property
    def token_times(self) -> tuple[float, ...]:
        """Every output token's arrival time (a chunk of k tokens gives k equal times)."""
        return tuple(t for t, k in zip(self.chunk_times, self.chunk_tokens) for _ in range(k))

    @property
    def tokens_received(self) -> int:
        return sum(self.chunk_tokens)

    @property
    def exact(self) -> bool:
        """Whether the server's usage confirms the lengths that were asked for: the output
        exactly, the prompt to within what a chat template or a BOS token adds
        (:data:`PROMPT_SLACK`)."""
        return self.output_tokens == self.output_len == self.tokens_received and (
            self.prompt_tokens is None
            or self.prompt_len <= self.prompt_tokens <= self.prompt_len + PROMPT_SLACK
        )

    @property
    def input_tokens(self) -> int:
        """The prompt's tokens: the server's count when it gave one, else the asked length."""
        return self.prompt_len if self.prompt_tokens is None else self.prompt_tokens

    @property
    def ttft(self) -> float:
        return self.chunk_times[0] - self.arrival

    @property
    def e2el(self) -> float:
        return self.chunk_times[-1] - self.arrival

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "scheduled": self.scheduled,
            "arrival": self.arrival,
            "prompt_len": self.prompt_len,
            "output_len": self.output_len,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "chunk_times": list(self.chunk_times),
            "chunk_tokens": list(self.chunk_tokens),
            "counts_assumed": self.counts_assumed,
            "server_timings": dict(self.server_timings) if self.server_timings else None,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, data: Any, where: str = "record") -> ServerRecord:
        """The record :meth:`to_dict` wrote.

        Raises:
            ValueError: naming ``where`` and the field, for one missing, of the wrong type, out
                of range (a time or a count below 0, not finite; a chunk of no token), or
                chunk times out of order or not one per chunk count.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: must be an object, got {type(data).__name__}")
        field = RecordFields(data, where)
        arrival = field.time("arrival")
        times = tuple(
            field.time(f"chunk_times[{i}]", t) for i, t in enumerate(field.seq("chunk_times"))
        )
        counts = tuple(
            field.count(f"chunk_tokens[{i}]", k, least=1)
            for i, k in enumerate(field.seq("chunk_tokens"))
        )
        if len(times) != len(counts):
            raise field.fail(
                "chunk_tokens", f"as many counts as chunk_times ({len(times)})", counts
            )
        if any(b < a for a, b in zip((arrival, *times), times)):
            raise field.fail("chunk_times", "in order, none before the arrival", times)
        return cls(
            field.text("id"),
            field.time("scheduled"),
            arrival,
            field.count("prompt_len"),
            field.count("output_len"),
            times,
            counts,
            field.optional("prompt_tokens", field.count),
            field.optional("output_tokens", field.count),
            field.optional("server_timings", field.mapping),
            field.optional("error", field.text),
            field.flag("counts_assumed", False),
        )


@dataclasses.dataclass(frozen=True)
class BenchRun:
    """A measured run: its records (warm-up requests excluded), what it was aimed at and how
    requests were issued (``settings``), and the server's identity (``server``). ``duration``
    is the seconds from the first send to the last token; ``stopped`` says why the run ended
    early (a time bound, an interruption), or is None; ``interrupted``: the run was cut off
    (Ctrl-C) and holds what it had measured by then; ``server_counters`` is what the server's
    own ``/metrics`` said before and after (None: it has none, or was not asked); ``host``
    what the host's CPU steal was during it (``measure.quiet``; None: not watched)."""

    records: tuple[ServerRecord, ...]
    server: Mapping[str, Any]
    settings: Mapping[str, Any]
    started: str
    warmup: tuple[ServerRecord, ...] = ()
    stopped: str | None = None
    server_counters: ServerCounters | None = None
    interrupted: bool = False
    host: HostSteal | None = None

    @property
    def completed(self) -> tuple[ServerRecord, ...]:
        return tuple(r for r in self.records if r.ok)

    @property
    def failed(self) -> tuple[ServerRecord, ...]:
        return tuple(r for r in self.records if not r.ok)

    def peak_concurrency(self) -> int:
        """The most requests in flight at once (sent, last token not yet arrived), over the
        completed requests: vLLM's "Peak concurrent requests"."""
        events = sorted(
            [(r.arrival, 1) for r in self.completed]
            + [(r.chunk_times[-1], -1) for r in self.completed]
        )  # at equal times a finish (-1) sorts before a send: it had left
        peak = running = 0
        for _, step in events:
            running += step
            peak = max(peak, running)
        return peak

    def offered_rate(self) -> float | None:
        """The rate the schedule offered: requests per second between the first and the last
        scheduled send (None: fewer than two requests, or all at once)."""
        times = [r.scheduled for r in self.records]
        span = max(times) - min(times) if len(times) > 1 else 0.0
        return (len(times) - 1) / span if span > 0 else None

    def inexact(self) -> tuple[ServerRecord, ...]:
        """Completed requests whose usage does not confirm the asked lengths."""
        return tuple(r for r in self.completed if not r.exact)

    def metrics(
        self, *, slo: SLO | None = None, percentiles: Sequence[float] = DEFAULT_PERCENTILES
    ) -> ServingMetrics:
        """vLLM's serving metrics over the completed requests; the input tokens are the
        server's counts where it gave them (what it computed), else the asked lengths."""
        metrics = serving_metrics_of(self.completed, slo=slo, percentiles=percentiles)
        counted = sum(r.input_tokens for r in self.completed)
        return dataclasses.replace(metrics, total_input_tokens=counted)

    def to_dict(self) -> dict[str, Any]:
        return {
            "server": dict(self.server),
            "settings": dict(self.settings),
            "started": self.started,
            "stopped": self.stopped,
            "incomplete": self.interrupted,
            "completed": len(self.completed),
            "failed": len(self.failed),
            "inexact": len(self.inexact()),
            "server_counters": (
                self.server_counters.to_dict() if self.server_counters is not None else None
            ),
            "host": self.host.to_dict() if self.host is not None else None,
        }

    @classmethod
    def from_dict(
        cls,
        data: Any,
        records: Sequence[Any] = (),
        where: str = "run",
        records_where: str = "records",
    ) -> BenchRun:
        """The run :meth:`to_dict` wrote, with its ``records`` (their documents, read at
        ``records_where``; none: a document kept without them). Warm-up requests are not
        written, so none is read.

        Raises:
            ValueError: naming ``where`` (or ``records_where``) and the field, for one missing,
                of the wrong type or out of range.
        """
        from pytest_prefill.measure.quiet import HostSteal

        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: must be an object, got {type(data).__name__}")
        field = RecordFields(data, where)
        counters, host = data.get("server_counters"), data.get("host")
        try:
            counted = ServerCounters.from_dict(counters) if counters is not None else None
            steal = HostSteal.from_dict(host) if host is not None else None
        except ValueError as err:
            raise ValueError(f"{where}.{err}") from None
        return cls(
            tuple(
                ServerRecord.from_dict(r, f"{records_where}[{i}]") for i, r in enumerate(records)
            ),
            field.mapping("server"),
            field.mapping("settings"),
            field.text("started"),
            stopped=field.optional("stopped", field.text),
            server_counters=counted,
            interrupted=field.flag("incomplete", False),
            host=steal,
        )

    def records_jsonl(self) -> str:
        """One JSON object per request (warm-up ones marked), a line each."""
        lines = [json.dumps({"warmup": True, **r.to_dict()}) for r in self.warmup]
        lines += [json.dumps(r.to_dict()) for r in self.records]
        return "\n".join(lines) + "\n"


# The engines' metric prefixes: everything else (process_*, python_gc_*, http_*) is left out.
PREFIXES = ("vllm:", "llamacpp:", "sglang:")
# A sample name -> what it means, per engine (vLLM v1 names; llama.cpp's; SGLang's). Counters
# are differenced over the run; gauges are read after it.
COUNTERS = {
    "prefix_queries": ("vllm:prefix_cache_queries_total",),
    "prefix_hits": ("vllm:prefix_cache_hits_total",),
    "preemptions": ("vllm:num_preemptions_total",),
    "prompt_tokens": (
        "vllm:prompt_tokens_total",
        "llamacpp:prompt_tokens_total",
        "sglang:prompt_tokens_total",
    ),
    "generation_tokens": (
        "vllm:generation_tokens_total",
        "llamacpp:tokens_predicted_total",
        "sglang:generation_tokens_total",
    ),
}
GAUGES = {
    "kv_usage": (
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "llamacpp:kv_cache_usage_ratio",
        "sglang:token_usage",
    ),
    "running": (
        "vllm:num_requests_running",
        "llamacpp:requests_processing",
        "sglang:num_running_reqs",
    ),
    "waiting": ("vllm:num_requests_waiting", "llamacpp:requests_deferred", "sglang:num_queue_reqs"),
    "cache_hit_rate": ("sglang:cache_hit_rate",),
}


def _first(samples: Mapping[str, float], names: tuple[str, ...]) -> float | None:
    """The first of ``names`` ``samples`` holds as a finite number (None: none; a NaN, an
    infinity or anything else is not known)."""
    for n in names:
        value = samples.get(n)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value) if math.isfinite(value) else None
    return None


@dataclasses.dataclass(frozen=True)
class ServerCounters:
    """``before`` and ``after`` a run (the engine's samples); what they say in
    :meth:`summary`."""

    before: Mapping[str, float]
    after: Mapping[str, float]

    def delta(self, name: str) -> float | None:
        """A counter's growth over the run (None when the server has no such counter, or it
        went down: the server restarted, and the counters were reset)."""
        names = COUNTERS[name]
        after, before = _first(self.after, names), _first(self.before, names)
        if after is None or before is None or after < before:
            return None
        return after - before

    @property
    def reset(self) -> bool:
        """Whether a counter went down over the run (a restart): none of them is read."""
        for names in COUNTERS.values():
            after, before = _first(self.after, names), _first(self.before, names)
            if after is not None and before is not None and after < before:
                return True
        return False

    def gauge(self, name: str) -> float | None:
        return _first(self.after, GAUGES[name])

    @property
    def hit_rate(self) -> float:
        """Prefix-cache tokens hit over tokens queried during the run (NaN: no counter, or
        nothing queried)."""
        hits, queries = self.delta("prefix_hits"), self.delta("prefix_queries")
        if hits is None or not queries or self.reset:
            return math.nan
        return hits / queries

    def summary(self) -> dict[str, Any]:
        reset = self.reset
        out: dict[str, Any] = {name: None if reset else self.delta(name) for name in COUNTERS}
        out.update({name: self.gauge(name) for name in GAUGES})
        out["hit_rate"] = None if math.isnan(self.hit_rate) else self.hit_rate
        return out

    def line(self) -> str:
        """One line: the figures the server has."""
        s = self.summary()
        parts = []
        if s["hit_rate"] is not None:
            parts.append(
                f"prefix cache hit {s['hit_rate']:.1%} of {s['prefix_queries']:,.0f} tokens queried"
            )
        if s["preemptions"] is not None:
            parts.append(f"{s['preemptions']:,.0f} preemptions")
        for name, what in (("prompt_tokens", "prompt"), ("generation_tokens", "generated")):
            if s[name] is not None:
                parts.append(f"{s[name]:,.0f} {what} tokens")
        if s["kv_usage"] is not None:
            parts.append(f"KV usage after {s['kv_usage']:.1%}")
        if self.reset:
            parts.append("counters reset (the server restarted?): not read")
        return "server /metrics over the run: " + (", ".join(parts) or "no engine counters")

    def to_dict(self) -> dict[str, Any]:
        def known(samples: Mapping[str, float]) -> dict[str, float]:
            return {k: v for k, v in samples.items() if _first({k: v}, (k,)) is not None}

        return {
            "before": known(self.before),
            "after": known(self.after),
            "summary": self.summary(),
        }

    @classmethod
    def from_dict(cls, data: Any) -> ServerCounters:
        """Raises: ValueError for anything but the counters :meth:`to_dict` wrote."""
        ok = isinstance(data, Mapping) and all(
            isinstance(data.get(side), Mapping) for side in ("before", "after")
        )
        if not ok:
            raise ValueError("server_counters must hold 'before' and 'after' objects")
        return cls(dict(data["before"]), dict(data["after"]))
