"""The capacity search on real traces, before a change and after it, interleaved
(:mod:`benchmarks.capacity_search`): wall times and simulations reported, never asserted; the
answers (deployment, rate to the printed precision, devices needed) must be the same. Runs
when ``PREFILL_BEFORE`` names a checkout of the code before (e.g. ``git worktree add
/tmp/before 8e81c48``) and the traces are present; it takes minutes: run it alone to quote it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.capacity_search import CASES, DATA, MOONCAKE, ROOT, compare, summary

pytestmark = pytest.mark.sim


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_capacity_search_before_and_after(case, prefill_report):
    before = os.environ.get("PREFILL_BEFORE")
    if not before:
        pytest.skip("PREFILL_BEFORE names no checkout of the code before")
    if not MOONCAKE.exists() or not (DATA / "azure-llm-inference-2023").exists():
        pytest.skip(f"the traces are not under {DATA}")
    row = compare(Path(before), ROOT, case, int(os.environ.get("PREFILL_REPEATS", "1")))
    line = summary([row])
    prefill_report.table(f"capacity search before and after: {case}", line, row)
    answers = {str(r["answer"]) for r in row["before"] + row["after"]}
    assert len(answers) == 1, line
