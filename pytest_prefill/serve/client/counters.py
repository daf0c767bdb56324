"""What a server's own counters say about a run: the engines' metric names (vLLM's, llama.cpp's,
SGLang's) and :class:`ServerCounters`, the samples before and after a run with the hit rate,
preemptions, tokens and gauges they give. Reading them is :mod:`.server_metrics`'s. Standard
library only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

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
