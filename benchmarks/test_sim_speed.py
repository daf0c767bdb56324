"""How fast the simulator replays the real Azure conv trace (19,366 requests, about an hour),
per policy, at 1/4, 1/2 and all of the trace: simulated seconds per wall second, requests per
second, and whether cost grows linearly. Reported, never asserted (this machine is shared)."""

from __future__ import annotations

import statistics
import time

import pytest
from tabulate import tabulate

from pytest_prefill.scheduler import POLICIES, PRESETS, simulate
from pytest_prefill.workloads import azure_trace_path, load_azure

pytestmark = pytest.mark.sim

PRESET = "datacenter-illustrative"
CHUNK = 512
FRACTIONS = (4, 2, 1)
TARGET = 1000.0  # simulated seconds per wall second, on one core


@pytest.fixture(scope="module")
def conv_trace():
    path = azure_trace_path("conv")
    if path is None:
        pytest.skip("the Azure conv trace is not in ../shared/data/azure-llm-inference-2023")
    return load_azure(path)


def replay(policy, load):
    trace = simulate(policy, load, PRESETS[PRESET].cost, chunk=CHUNK)
    return trace.summary()


@pytest.mark.parametrize("policy", POLICIES)
def test_simulator_speed_on_the_azure_conv_trace(benchmark, policy, conv_trace, prefill_report):
    rows, data = [], []
    for fraction in FRACTIONS:
        load = conv_trace[: len(conv_trace) // fraction]
        span = load[-1].arrival - load[0].arrival
        if fraction == 1:
            summary = benchmark.pedantic(replay, args=(policy, load), rounds=3, iterations=1)
            walls = list(benchmark.stats.stats.data) if benchmark.stats else []
        else:
            walls = []
            for _ in range(3):
                begin = time.perf_counter()
                summary = replay(policy, load)
                walls.append(time.perf_counter() - begin)
        if not walls:  # benchmarks disabled (e.g. --benchmark-disable or xdist): time once
            begin = time.perf_counter()
            summary = replay(policy, load)
            walls = [time.perf_counter() - begin]
        wall = statistics.median(walls)
        rows.append(
            (
                f"1/{fraction}" if fraction > 1 else "all",
                len(load),
                f"{span:,.0f}",
                f"{wall:.2f} [{min(walls):.2f}, {max(walls):.2f}]",
                f"{span / wall:,.0f}x",
                f"{len(load) / wall:,.0f}",
                f"{wall / len(load) * 1e6:.0f}",
                summary.requests,
            )
        )
        data.append(
            {
                "fraction": 1 / fraction,
                "requests": len(load),
                "simulated_s": span,
                "wall_median_s": wall,
                "wall_min_s": min(walls),
                "wall_max_s": max(walls),
                "realtime_factor": span / wall,
                "requests_per_s": len(load) / wall,
            }
        )
    per_request = [d["wall_median_s"] / d["requests"] for d in data]
    growth = per_request[-1] / per_request[0]
    text = tabulate(
        rows,
        headers=(
            "trace",
            "requests",
            "simulated s",
            "wall s median [min, max]",
            "x real time",
            "req/s",
            "us/request",
            "done",
        ),
        disable_numparse=True,
        colalign=("left",) + ("right",) * 7,
    )
    full = data[-1]["realtime_factor"]
    text += (
        f"\nwall per request, all vs 1/4: {growth:.2f}x (1.00x = linear); "
        f"target >= {TARGET:,.0f}x real time: {'met' if full >= TARGET else 'NOT met'} "
        f"({full:,.0f}x). Preset '{PRESET}', chunk {CHUNK}, 3 rounds each."
    )
    benchmark.extra_info.update(policy=policy, rows=data, linear_growth=growth)
    prefill_report.table(f"simulator speed: {policy} on the Azure conv trace", text, data)
    assert data[-1]["requests"] == len(conv_trace)
