"""The capacity search before and after a change, interleaved, on the same machine: wall time of
the whole ``capacity`` command, its simulations, and its answer (the best deployment, its rate to
the printed precision, its status, the devices the traffic needs). Reported, never asserted.

Run it alone, one case per quiet slot (each old Mooncake search takes minutes)::

    git worktree add /tmp/before 8e81c48
    /work/tools/cpu quiet python -m benchmarks.capacity_search --before /tmp/before \\
        --case mooncake-on --repeats 1 --record results.jsonl
    python -m benchmarks.capacity_search --summary results.jsonl

Cases: the Mooncake conversation trace (FAST'25; its ``hash_ids`` as prefix blocks) on 8 devices
at ttft:2s,tpot:100ms for 99% of requests, prefix cache on and off; and the README's Azure conv
example (10 minutes, 4 devices, ttft:1s,tpot:100ms). Both need the traces under
``../shared/data`` or ``../../shared/data`` (``PREFILL_DATA`` overrides)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
_BESIDE = [
    up / "shared" / "data" for up in (ROOT.parent, ROOT.parents[1])
]  # a checkout, a worktree
DATA = Path(os.environ.get("PREFILL_DATA") or next((p for p in _BESIDE if p.exists()), _BESIDE[0]))
MOONCAKE = DATA / "mooncake-fast25" / "conversation_trace.jsonl"
COMMON = ["capacity", "--cost", "datacenter-illustrative"]
MOONCAKE_ARGS = ["--workload", str(MOONCAKE), "--devices", "8", "--slo", "ttft:2s,tpot:100ms"]
CASES: dict[str, list[str]] = {
    "mooncake-on": [*COMMON, *MOONCAKE_ARGS, "--target", "0.99", "--prefix-caching", "on"],
    "mooncake-off": [*COMMON, *MOONCAKE_ARGS, "--target", "0.99", "--prefix-caching", "off"],
    "azure": [
        *COMMON,
        *("--workload", "azure-conv", "--window", "0:600"),
        *("--slo", "ttft:1s,tpot:100ms", "--devices", "4"),
    ],
}


def answer(document: dict[str, Any]) -> dict[str, Any]:
    """What a user acts on, from a search's ``--json``: the best deployment, its rate to the
    printed precision (3 significant figures) and status, and the devices needed."""
    results = document.get("results") or []
    best = max(results, key=lambda r: r.get("max_rate") or 0.0) if results else {}
    needed = document.get("devices_needed") or {}
    return {
        "deployment": (best.get("deployment") or {}).get("label"),
        "rate": f"{best.get('max_rate') or 0.0:.3g}",
        "status": best.get("status"),
        "devices_needed": needed.get("devices"),
    }


def run_once(tree: Path, case: str) -> dict[str, Any]:
    """One ``capacity`` command of ``case`` on the code in ``tree``: wall seconds, simulations,
    the answer and the recommendation line."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "search.json"
        argv = [sys.executable, "-m", "pytest_prefill", *CASES[case], "--json", str(out)]
        azure = str(DATA / "azure-llm-inference-2023")  # wherever the checkout is
        env = {**os.environ, "PYTHONPATH": str(tree), "PYTEST_PREFILL_AZURE_DIR": azure}
        began = time.perf_counter()
        done = subprocess.run(argv, env=env, cwd=folder, capture_output=True, text=True)
        wall = time.perf_counter() - began
        if done.returncode != 0:
            raise RuntimeError(f"{case} on {tree} failed:\n{done.stderr[-2000:]}")
        document = json.loads(out.read_text())
    simulations = document.get("simulations", 0) + (
        (document.get("devices_needed") or {}).get("simulations") or 0
    )
    return {
        "wall": wall,
        "simulations": simulations,
        "answer": answer(document),
        "recommendation": document.get("recommendation"),
    }


def compare(before: Path, after: Path, case: str, repeats: int) -> dict[str, Any]:
    """``repeats`` rounds of ``case``, before and after interleaved (the order alternates)."""
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    for i in range(repeats):
        order = [("before", before), ("after", after)]
        for side, tree in order if i % 2 == 0 else order[::-1]:
            runs[side].append(run_once(tree, case))
    return {"case": case, "repeats": repeats, **runs}


def summary(rows: list[dict[str, Any]]) -> str:
    """One line per case: median walls [min, max], simulations, speed-up, answers identical."""
    lines = []
    for row in rows:
        walls = {side: [r["wall"] for r in row[side]] for side in ("before", "after")}
        medians = {side: statistics.median(w) for side, w in walls.items()}
        same = all(r["answer"] == row["before"][0]["answer"] for r in row["before"] + row["after"])
        spread = {s: f"[{min(w):.1f}, {max(w):.1f}]" for s, w in walls.items()}
        lines.append(
            f"{row['case']}: before {medians['before']:.1f} s {spread['before']} "
            f"({row['before'][0]['simulations']} simulations), after {medians['after']:.1f} s "
            f"{spread['after']} ({row['after'][0]['simulations']} simulations): "
            f"{medians['before'] / medians['after']:.1f}× faster; answers "
            f"{'identical' if same else 'DIFFER'}: {row['after'][0]['answer']}"
            + ("" if same else f" vs before {row['before'][0]['answer']}")
            + f" ({row['repeats']} round(s), interleaved)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of the code before")
    parser.add_argument("--after", type=Path, default=ROOT, help="(default: this checkout)")
    parser.add_argument("--case", action="append", choices=sorted(CASES))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--record", type=Path, help="append each case's runs here (JSON lines)")
    parser.add_argument("--summary", type=Path, help="print the summary of a --record file")
    args = parser.parse_args(argv)
    if args.summary:
        rows = [json.loads(line) for line in args.summary.read_text().splitlines() if line]
        print(summary(rows))
        return 0
    if args.before is None:
        parser.error("--before is required (or --summary)")
    rows = []
    for case in args.case or sorted(CASES):
        row = compare(args.before, args.after, case, args.repeats)
        rows.append(row)
        if args.record:
            with args.record.open("a") as handle:
                handle.write(json.dumps(row) + "\n")
        print(summary([row]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
