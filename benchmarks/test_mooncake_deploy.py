"""Issue 25's Done-when on the real Mooncake conversation trace (FAST'25, 12,031 requests;
../shared/data/mooncake-fast25): ``capacity`` for a Llama-3.1-8B ``config.json`` (written here;
its 131,072-token context caps none of the trace's prompts) on 8 devices of 80 and of 40 GiB,
``--slo ttft:2s,tpot:100ms --target 0.99``, on the illustrative preset. Reported, never
asserted: the answer (deployment, TP, KV tokens per replica, the command), the preemptions, the
devices the traffic needs and the wall time of each search. Minutes long, so it runs only with
PREFILL_MOONCAKE_DEPLOY=1 (never in CI's run). Quote the wall times only from a quiet run; the
answers do not depend on the machine."""

from __future__ import annotations

import contextlib
import io
import json
import os
import time

import pytest
from tabulate import tabulate

from pytest_prefill.cli import main
from pytest_prefill.plan.model_spec import LLAMA_3_1_8B

pytestmark = pytest.mark.sim

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CANDIDATES = [  # ../shared beside the checkout, or beside the folder of worktrees
    os.path.join(up, "shared", "data", "mooncake-fast25", "conversation_trace.jsonl")
    for up in (os.path.dirname(ROOT), os.path.dirname(os.path.dirname(ROOT)))
]
MEMORIES_GIB = (80, 40)


def _answer(trace, folder, memory):
    """(the printed answer, its --json document, wall seconds) of one search."""
    out_json = os.path.join(folder, f"answer-{memory}.json")
    argv = ["capacity", "--cost", "datacenter-illustrative", "--model", str(folder)]
    argv += ["--device-memory", str(memory), "--devices", "8", "--slo", "ttft:2s,tpot:100ms"]
    argv += ["--target", "0.99", "--workload", trace, "--json", out_json]
    printed = io.StringIO()
    begin = time.perf_counter()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
        assert main(argv) == 0
    wall = time.perf_counter() - begin
    with open(out_json, encoding="utf-8") as handle:
        return printed.getvalue(), json.load(handle), wall


def test_the_mooncake_trace_for_llama_3_1_at_80_and_40_gib(tmp_path, prefill_report):
    if not os.environ.get("PREFILL_MOONCAKE_DEPLOY"):
        pytest.skip("minutes long: set PREFILL_MOONCAKE_DEPLOY=1 to run it")
    found = [path for path in CANDIDATES if os.path.exists(path)]
    if not found:
        pytest.skip("the Mooncake trace is not in ../shared/data/mooncake-fast25")
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_3_1_8B))
    rows, data = [], []
    for memory in MEMORIES_GIB:
        printed, document, wall = _answer(found[0], tmp_path, memory)
        best = max(document["results"], key=lambda r: r["max_rate"])
        tp = best["deployment"]["tp"]
        kv = best["deployment"]["cost"]["kv_capacity_tokens"]
        preempted = best["best"]["metrics"]["preemptions"] if best["best"] else None
        needed = document["devices_needed"] or {}
        rows.append(
            (
                f"{memory} GiB",
                best["deployment"]["label"],
                f"{best['max_rate']:.3g}",
                str(tp),
                f"{kv:,.0f}",
                str(preempted),
                str(needed.get("devices")),
                f"{wall:.0f}",
            )
        )
        data.append(
            {
                "memory_gib": memory,
                "best": best["deployment"]["label"],
                "max_rate": best["max_rate"],
                "tp": tp,
                "kv_tokens_per_replica": kv,
                "preempted": preempted,
                "devices_needed": needed.get("devices"),
                "command": document["command"],
                "wall_s": wall,
                "capped": "were capped at it" in printed,
            }
        )
    text = tabulate(
        rows,
        headers=("memory", "best on 8", "req/s", "TP", "KV/replica", "preempted", "needed", "s"),
        disable_numparse=True,
    )
    text += "\n" + "\n".join(f"{d['memory_gib']} GiB: {d['command']}" for d in data)
    prefill_report.table("capacity on the Mooncake trace, Llama-3.1-8B", text, data)
    assert len(data) == len(MEMORIES_GIB)
