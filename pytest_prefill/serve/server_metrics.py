"""A server's own counters: its Prometheus ``/metrics`` read before and after a run (vLLM's,
llama.cpp's with ``--metrics``, SGLang's), parsed by ``prometheus_client``'s text parser (the
``serve`` extra), and what they say about the run: the prefix cache's hit rate (tokens hit over
tokens queried), preemptions, KV cache usage, requests running and waiting. A server without
``/metrics`` gives None, and nothing else changes. Standard library, plus ``prometheus_client``
when a server has metrics to parse."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_prefill.serve.http import ServerError, Timeouts, Url, exchange
from pytest_prefill.serve.loadgen import Bounds, Target, run_load, send_one
from pytest_prefill.serve.records import BenchRun
from pytest_prefill.sim import Request

# The engines' metric prefixes: everything else (process_*, python_gc_*, http_*) is left out.
PREFIXES = ("vllm:", "llamacpp:", "sglang:")
SCRAPE_TIMEOUT = 5.0
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


def parse_metrics(text: str) -> dict[str, float]:
    """The engine's counter and gauge samples in a Prometheus text exposition, summed over
    their labels (one figure per name); histogram and summary samples are left out.

    Raises:
        ValueError: for text the parser cannot read.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            if family.type not in ("counter", "gauge", "untyped", "unknown"):
                continue
            for sample in family.samples:
                if sample.name.startswith(PREFIXES) and not sample.name.endswith("_created"):
                    out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    except (ValueError, TypeError, IndexError) as err:
        raise ValueError(f"/metrics is not a Prometheus text exposition: {err}") from None
    return out


async def scrape(url: Url, headers: Mapping[str, str] | None = None) -> dict[str, float] | None:
    """The engine samples of ``url``'s ``/metrics``; None when it has none (not found, not
    Prometheus text, or ``prometheus_client`` is not installed)."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return None
    try:
        response = await exchange(
            url,
            "GET",
            "/metrics",
            timeouts=Timeouts(SCRAPE_TIMEOUT, SCRAPE_TIMEOUT),
            headers=headers,
        )
    except ServerError:
        return None
    if response.status != 200:
        return None
    try:
        samples = parse_metrics(response.content().decode("utf-8", "replace"))
    except ValueError:
        return None
    return samples or None


def _first(samples: Mapping[str, float], names: tuple[str, ...]) -> float | None:
    return next((samples[n] for n in names if n in samples), None)


@dataclasses.dataclass(frozen=True)
class ServerCounters:
    """``before`` and ``after`` a run (the engine's samples); what they say in
    :meth:`summary`."""

    before: Mapping[str, float]
    after: Mapping[str, float]

    def delta(self, name: str) -> float | None:
        """A counter's growth over the run (None when the server has no such counter)."""
        names = COUNTERS[name]
        after, before = _first(self.after, names), _first(self.before, names)
        return None if after is None or before is None else after - before

    def gauge(self, name: str) -> float | None:
        return _first(self.after, GAUGES[name])

    @property
    def hit_rate(self) -> float:
        """Prefix-cache tokens hit over tokens queried during the run (NaN: no counter, or
        nothing queried)."""
        hits, queries = self.delta("prefix_hits"), self.delta("prefix_queries")
        if hits is None or not queries:
            return math.nan
        return hits / queries

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: self.delta(name) for name in COUNTERS}
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
        return "server /metrics over the run: " + (", ".join(parts) or "no engine counters")

    def to_dict(self) -> dict[str, Any]:
        return {"before": dict(self.before), "after": dict(self.after), "summary": self.summary()}


async def run_counted(
    target: Target, load: Sequence[Request], *, bounds: Bounds | None = None, **options: Any
) -> BenchRun:
    """``loadgen.run_load`` with the server's ``/metrics`` read after the warm-up and after
    the run: the run with ``server_counters`` set when the server has them."""
    bounds = bounds or Bounds()
    ordered = sorted(load, key=lambda r: (r.arrival, r.id))
    warm = []
    for i, request in enumerate(ordered[: bounds.warmup]):
        twin = dataclasses.replace(request, id=f"warmup{i}-{request.id}")
        warm.append(await send_one(target, twin, 0.0, time.perf_counter()))
    before = await scrape(target.url, target.headers)
    run = await run_load(target, load, bounds=dataclasses.replace(bounds, warmup=0), **options)
    run = dataclasses.replace(run, warmup=tuple(warm))
    after = await scrape(target.url, target.headers) if before is not None else None
    if before is None or after is None:
        return run
    return dataclasses.replace(run, server_counters=ServerCounters(before, after))
