"""Fidelity on the device under test: every policy run for real on the engine (disaggregation as
two processes) and in the simulator with the engine-calibrated cost model. Fails when the median
|relative error| over all (scenario, policy, metric) cells exceeds ``fidelity.THRESHOLD``."""

from __future__ import annotations

import pytest

from pytest_prefill.lab import fidelity as fid
from pytest_prefill.lab.fidelity_result import THRESHOLD
from pytest_prefill.report import fidelity as tables

pytestmark = pytest.mark.gpu

CLAIM = (
    f"The simulator, calibrated on the engine, predicts TTFT p50/p99, makespan, GPU-seconds and "
    f"the stalls a policy causes, of real runs under every policy the device runs, within a "
    f"median error of {THRESHOLD:.0%}."
)


def test_simulator_predicts_the_engine(prefill_model, prefill_settings, prefill_report):
    s = prefill_settings
    result = fid.run_fidelity(
        prefill_model,
        runs=fid.MIN_RUNS,
        repeats=s.repeats,
        warmup=s.warmup,
        dry_run=s.dry_run,
        progress=prefill_report.say,
    )
    _record_tables(result, prefill_report)
    error = result.median_abs_error
    line = (
        f"median |relative error| {error:.1%} over the {sum(c.judged for c in result.cells)} "
        f"judged cells of {len(result.cells)} (threshold {THRESHOLD:.0%})"
    )
    if result.not_run:
        line += "; " + "; ".join(f"{p} {r}" for p, r in result.not_run.items())
    if result.quiet is not None and result.quiet.warning:
        line += f"; {result.quiet.warning}"
    elif result.quiet is not None:
        line += "; the machine was quiet by the probe"
    prefill_report.verdict("fidelity", "HOLDS" if result.passed else "FAILS", CLAIM, line)
    if not result.passed:
        pytest.fail(f"{line}\n{tables.weakest_text(result)}", pytrace=False)


def _record_tables(result, prefill_report) -> None:
    data = result.to_dict()
    prefill_report.table(
        f"Fidelity: simulated vs measured (median [min, max] of {result.runs} runs), "
        f"chunk {result.chunk}",
        tables.fidelity_table(result),
        {
            k: data[k]
            for k in (
                "cells",
                "setups",
                "not_run",
                "scenarios",
                "skipped",
                "threshold",
                "median_abs_relative_error",
                "median_abs_relative_error_all_cells",
                "quiet",
            )
        },
    )
    prefill_report.table(
        "Fidelity: median |error| by policy and metric",
        tables.summary_table(result) + "\n\n" + tables.weakest_text(result),
        {k: data[k] for k in ("error_by_policy", "error_by_metric", "error_by_metric_all_cells")},
    )
    prefill_report.table(
        "Fidelity: the cost models the simulator used (calibrated on the engine)",
        tables.calibration_table(result),
        data["calibrations"],
    )
    prefill_report.table(
        "Each real iteration vs. the cost model for its composition",
        tables.iteration_table(result),
        data["iteration_errors"],
    )
    prefill_report.table(
        "KV link between the disaggregated workers",
        tables.link_table(result),
        {"link": data["link"], "transfers": data["transfers"]},
    )
