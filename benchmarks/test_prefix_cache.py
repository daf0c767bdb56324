"""The Mooncake-shaped conversation trace (tests/data/mooncake-shaped.jsonl, SYNTHETIC: made by
tests/mooncake_shaped.py; its ``hash_ids`` are 512-token blocks whose leading ids repeat across
a conversation's turns) under the ``vllm`` profile with the prefix cache on and off (issue 18):
how fast the simulator replays it (simulated seconds per wall second, the span of its
arrivals over the wall time of simulation and summary), its peak memory (tracemalloc's peak of
one run, and the process's maximum resident set), the hit rate, TTFT and preemptions; and the
capacity answer (requests per second per device at 90% attainment) with the cache on and off.

Two KV sizes: unbounded (the preset's) and 200,000 tokens a worker, where paged KV evicts
cached blocks and preempts under the 16 prompts of 18,000 tokens that arrive at once. Reported,
never asserted: quote it only from a quiet run (``/work/tools/cpu quiet``)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import resource
import statistics
import time
import tracemalloc

import pytest
from tabulate import tabulate

from pytest_prefill.plan.capacity import capacity
from pytest_prefill.plan.executors import InlineExecutor
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.plan.question import ServingQuestion
from pytest_prefill.sim import PRESETS, Request, get_profile, simulate

pytestmark = pytest.mark.sim

TRACE = pathlib.Path(__file__).parent.parent / "tests" / "data" / "mooncake-shaped.jsonl"
BLOCK = 512  # the trace's hash_ids block
COST = PRESETS["datacenter-illustrative"].cost
TIGHT_KV = 200_000.0
POLICIES = ("chunked", "shared", "coscheduled")
ROUNDS = 5
SPEED_TARGET = 1000.0  # x real time
MEMORY_TARGET = 500e6  # bytes
SLO_TEXT = "ttft:3s,tpot:100ms"  # looser, and with the cache the search never misses


def mooncake_load() -> list[Request]:
    """The trace's requests with their hash ids as prefix blocks (arrivals in seconds)."""
    rows = [json.loads(line) for line in TRACE.read_text().splitlines() if line.strip()]
    origin = min(row["timestamp"] for row in rows)
    return [
        Request(
            f"m{i}",
            (row["timestamp"] - origin) / 1e3,
            row["input_length"],
            row["output_length"],
            tuple(row["hash_ids"]),
        )
        for i, row in enumerate(rows)
    ]


def engine(caching: bool):
    return dataclasses.replace(
        get_profile("vllm"), prefix_caching=caching, prefix_block_tokens=BLOCK
    )


def run_once(policy, load, cost, caching):
    trace = simulate(policy, load, cost, engine=engine(caching))
    trace.summary()
    return trace


def peak_bytes(policy, load, cost, caching) -> int:
    tracemalloc.start()
    try:
        run_once(policy, load, cost, caching)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_mooncake_shaped_trace_under_vllm_with_the_prefix_cache(prefill_report):
    load = mooncake_load()
    span = max(r.arrival for r in load) - min(r.arrival for r in load)
    rows, data = [], []
    for kv in (float("inf"), TIGHT_KV):
        cost = dataclasses.replace(COST, kv_capacity_tokens=kv)
        for policy in POLICIES:
            for caching in (True, False):
                walls = []
                for _ in range(ROUNDS):
                    begin = time.perf_counter()
                    trace = run_once(policy, load, cost, caching)
                    walls.append(time.perf_counter() - begin)
                wall = statistics.median(walls)
                peak = peak_bytes(policy, load, cost, caching)
                s = trace.summary()
                rows.append(
                    (
                        "inf" if kv == float("inf") else f"{kv:,.0f}",
                        policy,
                        "on" if caching else "off",
                        f"{s.hit_rate:.1%}",
                        f"{s.ttft_p50:.3f}",
                        f"{s.ttft_p99:.3f}",
                        str(s.preemptions),
                        f"{wall * 1e3:.1f} [{min(walls) * 1e3:.1f}, {max(walls) * 1e3:.1f}]",
                        f"{span / wall:,.0f}x",
                        f"{peak / 1e6:.1f}",
                    )
                )
                data.append(
                    {
                        "kv_capacity_tokens": kv,
                        "policy": policy,
                        "prefix_caching": caching,
                        "hit_rate": s.hit_rate,
                        "ttft_p50": s.ttft_p50,
                        "ttft_p99": s.ttft_p99,
                        "preemptions": s.preemptions,
                        "wall_median_s": wall,
                        "realtime_factor": span / wall,
                        "peak_traced_bytes": peak,
                    }
                )
    slowest = min(d["realtime_factor"] for d in data if d["prefix_caching"])
    heaviest = max(d["peak_traced_bytes"] for d in data)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    text = tabulate(
        rows,
        headers=(
            "KV tokens",
            "policy",
            "cache",
            "hit rate",
            "TTFT p50 s",
            "TTFT p99 s",
            "preempt",
            "wall ms median [min, max]",
            "x real time",
            "peak MB",
        ),
        disable_numparse=True,
    )
    text += (
        f"\n{len(load)} requests over {span:,.0f} s of arrivals (SYNTHETIC Mooncake-shaped), "
        f"engine vllm (paged KV, 16-token blocks) with prefix_block_tokens {BLOCK}, preset "
        f"'datacenter-illustrative', {ROUNDS} rounds each. Slowest with the cache on: "
        f"{slowest:,.0f}x real time (target >= {SPEED_TARGET:,.0f}x: "
        f"{'met' if slowest >= SPEED_TARGET else 'NOT met'}); peak traced memory of one run "
        f"{heaviest / 1e6:.1f} MB, process max RSS {rss / 1e6:.0f} MB (target <= "
        f"{MEMORY_TARGET / 1e6:.0f} MB: {'met' if max(heaviest, rss) <= MEMORY_TARGET else 'NOT met'}"
        "). A figure only when nothing else ran on the machine."
    )
    prefill_report.table("prefix cache: Mooncake-shaped trace under vllm", text, data)
    assert len(data) == 2 * len(POLICIES) * 2


def test_the_capacity_answer_with_the_prefix_cache_on_and_off(prefill_report):
    load = mooncake_load()
    slo = SLO.parse(SLO_TEXT)
    rows, data = [], []
    for caching in (True, False):
        result = capacity(
            ServingQuestion(load, COST, slo, engine=engine(caching), executor=InlineExecutor()), 1
        )
        best = result.ranked()[0]
        label = "on" if caching else "off"
        rows.append((label, best.deployment.label, best.status, f"{best.max_rate:.4f}"))
        data.append(
            {
                "prefix_caching": caching,
                "best": best.deployment.label,
                "status": best.status,
                "max_rate": best.max_rate,
            }
        )
    text = tabulate(
        rows, headers=("cache", "best deployment (1 device)", "status", "max rate req/s")
    )
    text += (
        f"\nSLO {SLO_TEXT}, 90% attainment, the trace's arrivals scaled, engine vllm with "
        f"prefix_block_tokens {BLOCK}, preset 'datacenter-illustrative' (unbounded KV). "
        "'never missed': the SLO held at the highest rate tried (the rate is a floor)."
    )
    prefill_report.table("prefix cache: capacity with the cache on and off", text, data)
    assert len(data) == 2
