"""How fast the simulator replays the real Azure conv trace (about 19,000 requests over an
hour), per policy and cost model, at 1/4, 1/2 and all of the trace: simulated seconds per wall
second, requests per second, whether the cost grows linearly, and the peak memory of one run.
Reported, never asserted (this machine is shared: run it alone to quote it).

Two cost models: ``flat`` (the datacenter-illustrative preset: every decode step costs the same)
and ``realistic`` (the same plus 50 us per extra decode row and 20 ns per cached token read, as
every real calibration has: each decode step then costs a little more than the one before)."""

from __future__ import annotations

import dataclasses
import statistics
import time
import tracemalloc

import pytest
from tabulate import tabulate

from pytest_prefill.plan.traces import azure_trace_path, load_azure
from pytest_prefill.sim import POLICIES, PRESETS, simulate

pytestmark = pytest.mark.sim

PRESET = "datacenter-illustrative"
COSTS = {
    "flat": PRESETS[PRESET].cost,
    "realistic": dataclasses.replace(
        PRESETS[PRESET].cost, decode_per_seq=5e-5, decode_per_kv_token=2e-8
    ),
}
CHUNK = 512
FRACTIONS = (4, 2, 1)
ROUNDS = 3
TARGET = 5000.0  # simulated seconds per wall second, on one quiet core, slowest policy
MEMORY_TARGET = 200e6  # bytes, peak of one whole-trace run


@pytest.fixture(scope="module")
def conv_trace():
    path = azure_trace_path("conv")
    if path is None:
        pytest.skip("the Azure conv trace is not in ../shared/data/azure-llm-inference-2023")
    return load_azure(path)


def replay(policy, load, cost):
    """What a user pays for: the simulation and its summary."""
    return simulate(policy, load, cost, chunk=CHUNK).summary()


def peak_memory(policy, load, cost) -> int:
    tracemalloc.start()
    try:
        replay(policy, load, cost)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def walls_of(benchmark, policy, load, cost, whole: bool) -> list[float]:
    if whole:
        benchmark.pedantic(replay, args=(policy, load, cost), rounds=ROUNDS, iterations=1)
        walls = list(benchmark.stats.stats.data) if benchmark.stats else []
        if walls:
            return walls
    walls = []  # a fraction, or benchmarks disabled (--benchmark-disable, xdist): time it here
    for _ in range(ROUNDS):
        begin = time.perf_counter()
        replay(policy, load, cost)
        walls.append(time.perf_counter() - begin)
    return walls


@pytest.mark.parametrize("cost_name", sorted(COSTS))
@pytest.mark.parametrize("policy", POLICIES)
def test_simulator_speed_on_the_azure_conv_trace(
    benchmark, policy, cost_name, conv_trace, prefill_report
):
    cost = COSTS[cost_name]
    rows, data = [], []
    for fraction in FRACTIONS:
        load = conv_trace[: len(conv_trace) // fraction]
        span = load[-1].arrival - load[0].arrival
        walls = walls_of(benchmark, policy, load, cost, whole=fraction == 1)
        wall = statistics.median(walls)
        memory = peak_memory(policy, load, cost) if fraction == 1 else None
        rows.append(
            (
                f"1/{fraction}" if fraction > 1 else "all",
                f"{len(load):,}",
                f"{span:,.0f}",
                f"{wall:.3f} [{min(walls):.3f}, {max(walls):.3f}]",
                f"{span / wall:,.0f}x",
                f"{len(load) / wall:,.0f}",
                f"{wall / len(load) * 1e6:.1f}",
                "-" if memory is None else f"{memory / 1e6:.0f}",
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
                "peak_memory_bytes": memory,
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
            "peak MB",
        ),
        disable_numparse=True,
        colalign=("left",) + ("right",) * 7,
    )
    full, memory = data[-1]["realtime_factor"], data[-1]["peak_memory_bytes"]
    text += (
        f"\nwall per request, all vs 1/4: {growth:.2f}x (1.00x = linear). Target >= "
        f"{TARGET:,.0f}x real time: {'met' if full >= TARGET else 'NOT met'} ({full:,.0f}x); "
        f"peak memory <= {MEMORY_TARGET / 1e6:.0f} MB: "
        f"{'met' if memory <= MEMORY_TARGET else 'NOT met'}. Preset '{PRESET}' ({cost_name}), "
        f"chunk {CHUNK}, {ROUNDS} rounds each; simulation and summary timed together. A figure "
        "only when nothing else ran on the machine."
    )
    benchmark.extra_info.update(policy=policy, cost=cost_name, rows=data, linear_growth=growth)
    prefill_report.table(f"simulator speed: {policy}, {cost_name} costs, Azure conv", text, data)
    assert data[-1]["requests"] == len(conv_trace)


ENGINES = ("lab", "vllm")
SPEED_TARGET = 0.90  # the vllm profile's speed as a fraction of lab's, whole trace


def test_the_vllm_profile_against_lab_on_the_azure_conv_trace(conv_trace, prefill_report):
    """The engine knobs' cost: each policy on the whole trace under ``lab`` and ``vllm``
    (prefill first token, 2048-token budget, 256 sequences), the two interleaved round by
    round so that both see the same machine. Speed = lab's wall / vllm's (1.00: as fast)."""
    cost = COSTS["flat"]
    rows, data = [], []
    for policy in POLICIES:
        walls: dict[str, list[float]] = {engine: [] for engine in ENGINES}
        for k in range(ROUNDS):
            for engine in ENGINES if k % 2 == 0 else ENGINES[::-1]:
                begin = time.perf_counter()
                simulate(policy, conv_trace, cost, chunk=CHUNK, engine=engine).summary()
                walls[engine].append(time.perf_counter() - begin)
        lab, vllm = (statistics.median(walls[e]) for e in ENGINES)
        speed = lab / vllm
        rows.append(
            (
                policy,
                f"{lab:.3f} [{min(walls['lab']):.3f}, {max(walls['lab']):.3f}]",
                f"{vllm:.3f} [{min(walls['vllm']):.3f}, {max(walls['vllm']):.3f}]",
                f"{speed:.2f}",
                "met" if speed >= SPEED_TARGET else "NOT met",
            )
        )
        data.append({"policy": policy, "lab_wall_s": lab, "vllm_wall_s": vllm, "speed": speed})
    text = tabulate(
        rows,
        headers=("policy", "lab wall s [min, max]", "vllm wall s [min, max]", "speed", "target"),
        disable_numparse=True,
        colalign=("left", "right", "right", "right", "left"),
    )
    text += (
        f"\nspeed = lab's median wall / vllm's, target >= {SPEED_TARGET:.2f}; {len(conv_trace):,} "
        f"requests, preset '{PRESET}' (flat), chunk {CHUNK}, {ROUNDS} interleaved rounds. A "
        "figure only when nothing else ran on the machine."
    )
    prefill_report.table("simulator speed: vllm profile vs lab, Azure conv", text, data)
    assert len(data) == len(POLICIES)
