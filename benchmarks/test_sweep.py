"""What-if tables from the session's cost model (``--prefill-cost``): the chunk sweep on the lab
scenario and the policy comparison on a seeded Poisson load. Simulated, not measured; the
tables go to the run's summary and archive, and the tests assert only the simulator's
invariants (the numbers are reported, never asserted)."""

from __future__ import annotations

import pytest

from pytest_prefill.plan.advice import chunk_from_cost
from pytest_prefill.plan.sweep import chunk_sweep, default_chunks
from pytest_prefill.plan.workloads import lab_scenario, poisson
from pytest_prefill.report.sweep import sweep_rows_json, sweep_table
from pytest_prefill.sim import POLICIES, check_invariants

pytestmark = pytest.mark.sim

PROMPT_LEN = 2048
POISSON_PROMPTS = (256, 512, 1024, 2048, 4096)
POISSON_OUTPUTS = (32, 64, 128, 256)
POISSON_COUNT = 120
PREFILL_UTILISATION = 0.3  # the prompts' share of one worker's time, on average


def test_chunk_sweep_on_the_lab_scenario(prefill_cost_model, prefill_scheduler, prefill_report):
    load = lab_scenario(prompt_len=PROMPT_LEN)
    chunks = default_chunks(prefill_cost_model, PROMPT_LEN)
    rows = chunk_sweep(prefill_cost_model, load, chunks)
    prefill_report.table(
        f"What-if: chunk sweep, 2 live streams + a {PROMPT_LEN:,}-token prompt at 100 ms "
        "(simulated from the session's cost model)",
        sweep_table(rows)
        + "\nTTFT cost = TTFT p99 / shared's; stall gain = shared's max stall / this one's.",
        {
            "scenario": {"streams": 2, "prompt_len": PROMPT_LEN, "arrival": 0.1},
            "rows": sweep_rows_json(rows),
        },
    )
    assert [r.policy for r in rows][:2] == ["shared", "coscheduled"]
    assert {r.chunk for r in rows if r.policy == "chunked"} == set(chunks)
    for policy, chunk in [(r.policy, r.chunk) for r in rows]:
        trace = prefill_scheduler(policy, load, chunk=chunk)
        assert check_invariants(trace, load, prefill_cost_model) == []


def test_policy_comparison_on_a_poisson_load(prefill_cost_model, prefill_scheduler, prefill_report):
    mean_prompt = sum(POISSON_PROMPTS) / len(POISSON_PROMPTS)
    rate = PREFILL_UTILISATION / prefill_cost_model.prefill_pass(round(mean_prompt))
    load = poisson(
        rate, POISSON_COUNT, prompt_len=POISSON_PROMPTS, output_len=POISSON_OUTPUTS, seed=0
    )
    chunk = chunk_from_cost(prefill_cost_model, max(POISSON_PROMPTS))  # the one chunk rule
    rows = chunk_sweep(prefill_cost_model, load, [chunk])
    prefill_report.table(
        f"What-if: policies on {POISSON_COUNT} Poisson arrivals at {rate:.2f}/s (prompts "
        f"{', '.join(map(str, POISSON_PROMPTS))}; seed 0), chunk {chunk:,} "
        f"(C* = {prefill_cost_model.chunk_star():,.0f}; the one chunk rule) (simulated)",
        sweep_table(rows),
        {
            "load": {
                "rate": rate,
                "count": POISSON_COUNT,
                "prompt_lens": list(POISSON_PROMPTS),
                "output_lens": list(POISSON_OUTPUTS),
                "seed": 0,
            },
            "chunk": chunk,
            "rows": sweep_rows_json(rows),
        },
    )
    assert {r.policy for r in rows} == set(POLICIES)
    for policy in POLICIES:
        trace = prefill_scheduler(policy, load, chunk=chunk if policy == "chunked" else None)
        assert check_invariants(trace, load, prefill_cost_model) == []
