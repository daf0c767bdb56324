"""The simulator before a change and after it, interleaved (:mod:`benchmarks.sim_before_after`):
wall times per path reported, never asserted; the summaries must be identical. Runs when
``PREFILL_BEFORE`` names a checkout of the code before (e.g. ``git worktree add /tmp/before
8e81c48``) and the traces are present; ``PREFILL_REPEATS`` rounds (default 3). Run it alone to
quote it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from benchmarks.sim_before_after import ROOT, RUNS, TRACES, compare, summary

pytestmark = pytest.mark.sim


def test_the_simulator_before_and_after(prefill_report):
    before = os.environ.get("PREFILL_BEFORE")
    if not before:
        pytest.skip("PREFILL_BEFORE names no checkout of the code before")
    if not all(path.exists() for path in TRACES.values()):
        pytest.skip(f"the traces are not at {', '.join(map(str, TRACES.values()))}")
    rounds = int(os.environ.get("PREFILL_REPEATS", "3"))
    rows = compare(Path(before), ROOT, sorted(RUNS), rounds)
    text = summary(rows)
    prefill_report.table("simulator before and after", text, rows)
    assert "DIFFER" not in text, text
