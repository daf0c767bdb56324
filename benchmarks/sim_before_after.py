"""The simulator before and after a change, interleaved, on the same machine: the wall time of
``simulate(...).summary()`` on whole real traces, per path, with each side's summary compared
(they must be identical). Reported, never asserted.

Run it alone (each round is one fresh process per side, the order alternating)::

    git worktree add /tmp/before 8e81c48
    /work/tools/cpu quiet python -m benchmarks.sim_before_after --before /tmp/before --rounds 5
    /work/tools/cpu quiet python -m benchmarks.sim_before_after --before /tmp/before --rounds 8 \\
        --side-by-side

Runs (``--run`` picks some; default all): the Azure conv trace (an hour, ~19,000 requests) under
the lab profile for each policy (chunked at 512 tokens; disaggregated 1 prefill : 1 decode),
and the Mooncake conversation trace (FAST'25, 12,031 requests) under the lab profile (chunked
512) and under vllm (chunked under its budget, prefix cache on with the trace's 512-token
blocks, KV unbounded and 200,000 tokens), one worker each, the preset
``datacenter-illustrative``. ``--memory`` adds each side's peak traced memory (one more run).
The traces are looked up under ``../shared/data`` or ``../../shared/data`` (``PREFILL_DATA``
overrides)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_BESIDE = [up / "shared" / "data" for up in (ROOT.parent, ROOT.parents[1])]
DATA = Path(os.environ.get("PREFILL_DATA") or next((p for p in _BESIDE if p.exists()), _BESIDE[0]))
TRACES = {
    "azure": DATA / "azure-llm-inference-2023" / "conv.csv",
    "mooncake": DATA / "mooncake-fast25" / "conversation_trace.jsonl",
}
RUNS = {  # name -> (trace, engine, policy, kv tokens)
    "azure-lab-shared": ("azure", "lab", "shared", "inf"),
    "azure-lab-coscheduled": ("azure", "lab", "coscheduled", "inf"),
    "azure-lab-chunked": ("azure", "lab", "chunked", "inf"),
    "azure-lab-disaggregated": ("azure", "lab", "disaggregated", "inf"),
    "mooncake-lab-chunked": ("mooncake", "lab", "chunked", "inf"),
    "mooncake-vllm-cache-kv-inf": ("mooncake", "vllm", "chunked", "inf"),
    "mooncake-vllm-cache-kv-200k": ("mooncake", "vllm", "chunked", "200000"),
}

# One side's process: import the simulator from the tree on sys.path[0], time each run.
CHILD = r"""
import dataclasses, json, sys, time, tracemalloc
from pytest_prefill.sim import PRESETS, get_profile, simulate
from pytest_prefill.plan.workloads import load_azure, load_jsonl
runs, traces, memory = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3] == "1"
loads = {}
def run(trace, engine, policy, kv):
    if trace not in loads:
        loads[trace] = (load_azure if trace == "azure" else load_jsonl)(traces[trace])
    cost = dataclasses.replace(PRESETS["datacenter-illustrative"].cost,
                               kv_capacity_tokens=float(kv))
    profile = get_profile(engine)
    if trace == "mooncake" and profile.prefix_caching:
        profile = dataclasses.replace(profile, prefix_block_tokens=512)
    kw = {"chunk": 512} if policy == "chunked" and engine == "lab" else {}
    if policy == "disaggregated":
        kw.update(prefill_workers=1, decode_workers=1)
    begin = time.perf_counter()
    summary = simulate(policy, loads[trace], cost, engine=profile, **kw).summary()
    return time.perf_counter() - begin, summary
for name, spec in runs.items():
    wall, summary = run(*spec)
    out = {"run": name, "wall": wall, "summary": str(summary)}
    if memory:
        tracemalloc.start()
        run(*spec)
        out["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    reqs = loads[spec[0]]
    out["span"] = max(r.arrival for r in reqs) - min(r.arrival for r in reqs)
    print(json.dumps(out), flush=True)
"""

# Both sides in one process (``--side-by-side``): each tree's ``sim`` folder loaded as a package
# of its own (a copy of the folder runs), the runs alternating before and after; what process
# start-up, memory layout and a drifting machine do to one process then falls on both sides.
BOTH = r"""
import dataclasses, gc, importlib.util, json, sys, time
from pytest_prefill.plan.workloads import load_azure, load_jsonl
trees, runs, traces, rounds = (json.loads(a) for a in sys.argv[1:5])
def package(name, tree):
    folder = f"{tree}/pytest_prefill/sim"
    spec = importlib.util.spec_from_file_location(
        name, f"{folder}/__init__.py", submodule_search_locations=[folder])
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
sims = {side: package(f"sim_{side}", tree) for side, tree in trees.items()}
raw = {}
def load(side, trace):
    if trace not in raw:
        raw[trace] = (load_azure if trace == "azure" else load_jsonl)(traces[trace])
    R = sims[side].Request
    return [R(r.id, r.arrival, r.prompt_len, r.output_len, r.prefix_blocks) for r in raw[trace]]
for name, (trace, engine, policy, kv) in runs.items():
    loads = {side: load(side, trace) for side in sims}
    span = max(r.arrival for r in raw[trace]) - min(r.arrival for r in raw[trace])
    for i in range(rounds):
        for side in ("before", "after") if i % 2 == 0 else ("after", "before"):
            sim = sims[side]
            cost = dataclasses.replace(sim.PRESETS["datacenter-illustrative"].cost,
                                       kv_capacity_tokens=float(kv))
            profile = sim.get_profile(engine)
            if trace == "mooncake" and profile.prefix_caching:
                profile = dataclasses.replace(profile, prefix_block_tokens=512)
            kw = {"chunk": 512} if policy == "chunked" and engine == "lab" else {}
            if policy == "disaggregated":
                kw.update(prefill_workers=1, decode_workers=1)
            gc.collect()
            begin = time.perf_counter()
            summary = sim.simulate(policy, loads[side], cost, engine=profile, **kw).summary()
            wall = time.perf_counter() - begin
            print(json.dumps({"run": name, "side": side, "wall": wall, "summary": str(summary),
                              "span": span}), flush=True)
"""


def side_by_side(before: Path, after: Path, names: list[str], rounds: int) -> list[dict[str, Any]]:
    """``rounds`` rounds of the runs ``names`` in one process holding both sides, alternating."""
    runs = {name: RUNS[name] for name in names}
    traces = {name: str(path) for name, path in TRACES.items()}
    trees = {"before": str(before), "after": str(after)}
    args = [json.dumps(a) for a in (trees, runs, traces, rounds)]
    env = {**os.environ, "PYTHONPATH": str(after)}
    done = subprocess.run(
        [sys.executable, "-c", BOTH, *args], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"the side-by-side runs failed:\n{done.stderr[-2000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def side(tree: Path, runs: dict[str, Any], memory: bool) -> list[dict[str, Any]]:
    """One process on the code in ``tree``: each run once."""
    traces = {name: str(path) for name, path in TRACES.items()}
    argv = [
        sys.executable,
        "-c",
        CHILD,
        json.dumps(runs),
        json.dumps(traces),
        "1" if memory else "0",
    ]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the runs on {tree} failed:\n{done.stderr[-2000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def spread(walls: list[float]) -> str:
    return f"{statistics.median(walls):.3f} [{min(walls):.3f}, {max(walls):.3f}]"


def summary(rows: list[dict[str, Any]]) -> str:
    """One line per run: each side's median wall [min, max], after / before, x real time, peak
    memory (when measured), and whether the summaries are identical."""
    by: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for row in rows:
        by.setdefault(row["run"], {"before": [], "after": []})[row["side"]].append(row)
    lines = []
    for name, sides in by.items():
        walls = {s: [r["wall"] for r in sides[s]] for s in sides}
        if not walls["before"] or not walls["after"]:
            continue
        ratio = statistics.median(walls["after"]) / statistics.median(walls["before"])
        every = sides["before"] + sides["after"]
        same = all(r["summary"] == every[0]["summary"] for r in every)
        real = every[0]["span"] / statistics.median(walls["after"])
        peaks = {s: [r["peak"] for r in sides[s] if "peak" in r] for s in sides}
        memory = (
            f"; peak MB before {max(peaks['before']) / 1e6:.1f}, after {max(peaks['after']) / 1e6:.1f}"
            if peaks["before"] and peaks["after"]
            else ""
        )
        lines.append(
            f"{name}: before {spread(walls['before'])} s, after {spread(walls['after'])} s, "
            f"after/before {ratio:.3f}, after {real:,.0f}x real time ({len(walls['after'])} "
            f"rounds){memory}; summaries {'identical' if same else 'DIFFER'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of the code before")
    parser.add_argument("--after", type=Path, default=ROOT, help="(default: this checkout)")
    parser.add_argument("--run", action="append", choices=sorted(RUNS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--memory", action="store_true", help="also each side's peak memory")
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="both sides in one process, each run alternating (no --memory)",
    )
    parser.add_argument("--record", type=Path, help="append every run here (JSON lines)")
    parser.add_argument("--summary", type=Path, help="print the summary of a --record file")
    args = parser.parse_args(argv)
    if args.summary:
        rows = [json.loads(line) for line in args.summary.read_text().splitlines() if line]
        print(summary(rows))
        return 0
    if args.before is None:
        parser.error("--before is required (or --summary)")
    names = args.run or sorted(RUNS)
    if args.side_by_side:
        rows = side_by_side(args.before, args.after, names, args.rounds)
    else:
        rows = compare(args.before, args.after, names, args.rounds, args.memory)
    if args.record:
        with args.record.open("a") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in rows)
    print(summary(rows), flush=True)
    return 0


def compare(
    before: Path, after: Path, names: list[str], rounds: int, memory: bool = False
) -> list[dict[str, Any]]:
    """``rounds`` rounds of the runs ``names``, one process per side a round, the order
    alternating; with ``memory``, the first round also measures peak memory."""
    runs = {name: RUNS[name] for name in names}
    rows: list[dict[str, Any]] = []
    for i in range(rounds):
        order = [("before", before), ("after", after)]
        for name, tree in order if i % 2 == 0 else order[::-1]:
            for row in side(tree, runs, memory and i == 0):
                row["side"] = name
                rows.append(row)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
