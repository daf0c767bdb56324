"""A server's own counters: its Prometheus ``/metrics`` read before and after a run (vLLM's,
llama.cpp's with ``--metrics``, SGLang's), parsed by ``prometheus_client``'s text parser (the
``serve`` extra), and what they say about the run: the prefix cache's hit rate (tokens hit over
tokens queried), preemptions, KV cache usage, requests running and waiting. A server without
``/metrics`` gives None, and nothing else changes. Standard library, plus ``prometheus_client``
when a server has metrics to parse."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_prefill.serve.client.http import exchange
from pytest_prefill.serve.client.wire import ServerError, Timeouts, Url
from pytest_prefill.serve.load.loadgen import Bounds, Target, run_load, send_one
from pytest_prefill.serve.load.records import PREFIXES, BenchRun, ServerCounters
from pytest_prefill.sim import Request, in_arrival_order

SCRAPE_TIMEOUT = 5.0
# A scrape as a whole: a /metrics trickled a byte at a time is given up after this (each byte
# would reset the read timeout), and one larger than MAX_METRICS_BYTES is not parsed (vLLM's
# is tens of kilobytes; a 60 MB one took 24-50 s and ~1 GB to parse).
SCRAPE_DEADLINE = 2 * SCRAPE_TIMEOUT
MAX_METRICS_BYTES = 4 * 2**20


def parse_metrics(text: str) -> dict[str, float]:
    """The engine's counter and gauge samples in a Prometheus text exposition, summed over
    their labels (one figure per name); histogram and summary samples are left out.

    Raises:
        ValueError: for text the parser cannot read.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    unknown = set()  # a NaN or infinite sample: the name's figure is not known
    try:
        for family in text_string_to_metric_families(text):
            if family.type not in ("counter", "gauge", "untyped", "unknown"):
                continue
            for sample in family.samples:
                if sample.name.startswith(PREFIXES) and not sample.name.endswith("_created"):
                    value = float(sample.value)
                    if not math.isfinite(value):
                        unknown.add(sample.name)
                    out[sample.name] = out.get(sample.name, 0.0) + value
    except (ValueError, TypeError, IndexError) as err:
        raise ValueError(f"/metrics is not a Prometheus text exposition: {err}") from None
    return {name: value for name, value in out.items() if name not in unknown}


async def scrape(url: Url, headers: Mapping[str, str] | None = None) -> dict[str, float] | None:
    """The engine samples of ``url``'s ``/metrics``; None when it has none (not found, not
    Prometheus text, or ``prometheus_client`` is not installed)."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return None
    try:
        response = await asyncio.wait_for(
            exchange(
                url,
                "GET",
                "/metrics",
                timeouts=Timeouts(SCRAPE_TIMEOUT, SCRAPE_TIMEOUT),
                headers=headers,
            ),
            SCRAPE_DEADLINE,
        )
    except (ServerError, asyncio.TimeoutError):
        return None
    if response.status != 200:
        return None
    content = response.content()
    if len(content) > MAX_METRICS_BYTES:
        return None
    try:
        samples = parse_metrics(content.decode("utf-8", "replace"))
    except ValueError:
        return None
    return samples or None


async def run_counted(
    target: Target, load: Sequence[Request], *, bounds: Bounds | None = None, **options: Any
) -> BenchRun:
    """``loadgen.run_load`` with the server's ``/metrics`` read after the warm-up and after
    the run: the run with ``server_counters`` set when the server has them."""
    bounds = bounds or Bounds()
    ordered = in_arrival_order(load)
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
