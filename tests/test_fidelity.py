"""The fidelity arithmetic (errors, spreads, combination rules), the scenarios, the tables, and
argument checking. Real runs are in pytest_prefill/suite/test_fidelity.py."""

from __future__ import annotations

import math

import pytest

from pytest_prefill.lab import fidelity as fid
from pytest_prefill.lab import fidelity_result as fr
from pytest_prefill.report import fidelity as tables
from pytest_prefill.sim import PRESETS


def test_cell_error_and_spread_follow_their_definitions():
    cell = fr.Cell("lab", "shared", "makespan", simulated=1.2, runs=(1.0, 0.8, 1.1))
    assert cell.median == 1.0 and cell.minimum == 0.8 and cell.maximum == 1.1
    assert cell.relative_error == pytest.approx((1.2 - 1.0) / 1.0)
    assert cell.spread == pytest.approx((1.1 - 0.8) / 1.0)
    assert not cell.within_spread
    assert fr.Cell("lab", "shared", "makespan", 0.9, (1.0, 0.8, 1.1)).within_spread
    assert math.isnan(fr.Cell("lab", "shared", "makespan", 0.9, (0.0, 0.0, 0.0)).relative_error)
    data = cell.to_dict()
    assert data["measured_median"] == 1.0 and data["within_spread"] is False


def test_scenarios_cover_the_lab_lengths_and_say_why_azure_is_missing(monkeypatch, tmp_path):
    cost = PRESETS["lab-laptop"].cost
    chosen, skipped = fid.scenarios(cost, prompt_lens=(256, 1024), azure=False)
    assert [s.name for s in chosen] == ["lab 256", "lab 1024"]
    assert [r.prompt_len for r in chosen[1].load if r.id == "long"] == [1024]
    assert skipped and "not asked" in skipped[0]
    monkeypatch.setenv("PYTEST_PREFILL_AZURE_DIR", str(tmp_path))
    import pytest_prefill.plan.traces as traces

    monkeypatch.setattr(traces, "azure_trace_path", lambda name: None)
    chosen, skipped = fid.scenarios(cost, prompt_lens=(256,))
    assert len(chosen) == 1 and "Azure conv trace" in skipped[0]


def test_poisson_scenario_draws_capped_lengths_from_the_azure_trace(tmp_path, monkeypatch):
    rows = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    rows += [f"2023-11-16 18:17:{i:02d}.0000000,{100 * (i + 1)},{8 * (i + 1)}" for i in range(30)]
    (tmp_path / "conv.csv").write_text("\n".join(rows) + "\n")
    monkeypatch.setenv("PYTEST_PREFILL_AZURE_DIR", str(tmp_path))
    cost = PRESETS["lab-laptop"].cost
    chosen, skipped = fid.scenarios(cost, prompt_lens=(512,), count=6, seed=3)
    assert not skipped
    load = chosen[-1].load
    assert len(load) == 6
    assert all(r.prompt_len <= 512 for r in load)
    allowed = {max(1, round(8 * (i + 1) / fid.AZURE_OUTPUT_SCALE)) for i in range(30)}
    assert all(r.output_len in allowed for r in load)
    assert fid.scenarios(cost, prompt_lens=(512,), count=6, seed=3)[0][-1].load == load


def _result(cells, quiet=None, not_run=None):
    from pytest_prefill.lab.fidelity_calibration import Link

    link = Link(1e-5, 1e9, (), "synthetic")
    return fr.FidelityResult(
        tuple(cells), (), (), not_run or {}, {}, link, (1e-4, 2e-4), {}, 64, 3, {}, {}, quiet
    )


def test_median_error_and_verdict():
    cells = [
        fr.Cell("s", "shared", "makespan", 1.05, (1.0, 1.0, 1.0)),  # +5%
        fr.Cell("s", "chunked", "makespan", 1.5, (1.0, 1.0, 1.0)),  # +50%
        fr.Cell("s", "shared", "max_stall", 0.92, (1.0, 1.0, 1.0)),  # -8%
    ]
    result = _result(cells)
    assert result.median_abs_error == pytest.approx(0.08)
    assert result.passed == (0.08 <= fr.THRESHOLD)
    assert result.by("policy")["chunked"] == pytest.approx(0.5)
    assert result.weakest(1)[0].policy == "chunked"
    table = tables.fidelity_table(result)
    assert "+50%" in table and "in spread" in table
    assert "threshold" in tables.summary_table(result)
    assert "transfers in the disaggregated runs: 2" in tables.link_table(result)


def test_cells_not_judged_are_reported_but_not_held_against_the_model():
    cells = [
        fr.Cell("s", "shared", "makespan", 1.05, (1.0, 1.0, 1.0)),  # +5%
        fr.Cell("s", "disaggregated", "max_stall", 2.0, (1.0, 1.0, 1.0), judged=False),
        fr.Cell("s", "disaggregated", "makespan", 0.95, (1.0, 1.0, 1.0)),  # -5%
    ]
    result = _result(cells)
    assert result.median_abs_error == pytest.approx(0.05)
    assert result.median_abs_error_all == pytest.approx(0.05)
    assert result.by("metric") == {"makespan": pytest.approx(0.05)}
    assert result.by("metric", only_judged=False)["max_stall"] == pytest.approx(1.0)
    assert all(c.judged for c in result.weakest(5))
    assert "not judged" in tables.fidelity_table(result)
    assert result.to_dict()["cells"][1]["judged"] is False


def test_max_stall_is_judged_where_the_policy_causes_a_stall():
    from pytest_prefill.plan.workloads import lab_scenario
    from pytest_prefill.sim import simulate

    cost = PRESETS["lab-laptop"].cost
    shared = simulate("shared", lab_scenario(), cost).summary()
    disaggregated = simulate("disaggregated", lab_scenario(), cost).summary()
    assert shared.max_stall >= fr.STALL_JUDGED_RATIO * shared.tbt_p50
    assert fr.judged("max_stall", shared)
    # disaggregation: the streams never wait for a prefill, the stall is one decode step
    assert not fr.judged("max_stall", disaggregated)
    assert fr.judged("makespan", disaggregated)


def test_on_one_cuda_device_disaggregation_is_reported_not_run_with_the_reason():
    import types

    cuda = types.SimpleNamespace(type="cuda")
    policies, not_run = fid.policies_for(cuda, cuda_devices=1)
    assert policies == ("shared", "coscheduled", "chunked")
    assert "two devices" in not_run["disaggregated"] and "1 CUDA" in not_run["disaggregated"]
    policies, not_run = fid.policies_for(cuda, cuda_devices=2)
    assert "disaggregated" not in policies and "not built" in not_run["disaggregated"]
    assert fid.policies_for(types.SimpleNamespace(type="cpu")) == (tuple(fid.POLICIES), {})
    result = _result([fr.Cell("s", "shared", "makespan", 1.0, (1.0, 1.0, 1.0))], None, not_run)
    assert "not built" in tables.summary_table(result)


def test_a_busy_machine_gets_a_loud_warning_in_the_table_and_the_archive():
    from pytest_prefill.measure.quiet import Quietness

    busy = Quietness(other_cores=1.4, jitter=0.3, cores=2, seconds=1.0)
    result = _result([fr.Cell("s", "shared", "makespan", 1.0, (1.0, 1.0, 1.0))], busy)
    assert "BUSY MACHINE" in tables.summary_table(result)
    assert result.to_dict()["quiet"]["quiet"] is False
    assert "BUSY MACHINE" in result.to_dict()["quiet"]["warning"]


def test_the_fidelity_sweep_covers_what_the_scenarios_run():
    from pytest_prefill.lab.fidelity_calibration import fidelity_sweep

    sweep = fidelity_sweep((256, 1024, 2048), 256)
    assert max(sweep["prompt_lens"]) == 2048 and len(sweep["prompt_lens"]) >= 4
    assert {t for t, _ in sweep["chunks"]} == {256}
    assert max(c for _, c in sweep["chunks"]) == 2048 - 256  # a chunked prompt's last chunk
    assert (2048, 0, 2) in sweep["fused"]  # coscheduled: a whole prompt with two streams
    assert all(rows >= 1 for _, _, rows in sweep["fused"])


def test_the_link_fit_recovers_latency_and_bandwidth():
    from pytest_prefill.lab.fidelity_calibration import fit_link
    from pytest_prefill.measure.timing import Measurement

    points = [
        (b, Measurement.from_samples([2e-4 + b / 5e9] * 5)) for b in (10**6, 4 * 10**6, 16 * 10**6)
    ]
    link = fit_link(points)
    assert link.latency == pytest.approx(2e-4) and link.bandwidth == pytest.approx(5e9)
    flat = fit_link([(b, Measurement.from_samples([1e-3, 1.1e-3, 0.9e-3])) for b in (1, 2, 3)])
    assert math.isinf(flat.bandwidth) and "refused" in flat.note


def test_run_fidelity_checks_its_arguments():
    with pytest.raises(ValueError, match="runs"):
        fid.run_fidelity(object(), runs=2)
    with pytest.raises(ValueError, match="chunk"):
        fid.run_fidelity(object(), chunk=0)
    with pytest.raises(ValueError, match="prompt_lens"):
        fid.run_fidelity(object(), prompt_lens=(0,))


def test_fidelity_command_refuses_fewer_than_three_runs(capsys):
    from pytest_prefill.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["fidelity", "--runs", "2"])
    assert exit_info.value.code == 2
    assert ">= 3" in capsys.readouterr().err


def test_importing_fidelity_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, pytest_prefill.lab.fidelity, pytest_prefill.lab.loop, pytest_prefill.lab.execute, "
        "pytest_prefill.lab.fidelity_calibration, pytest_prefill.lab.disaggregated, "
        "pytest_prefill.commands.fidelity; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_iteration_errors_are_zero_for_a_trace_the_cost_model_made():
    from pytest_prefill.plan.workloads import lab_scenario
    from pytest_prefill.sim import simulate

    cost = PRESETS["lab-laptop"].cost
    for policy in ("shared", "chunked", "disaggregated"):
        trace = simulate(policy, lab_scenario(), cost, chunk=128)
        errors = fr.iteration_errors(trace, cost)
        assert errors and all(abs(e) < 1e-9 for kind in errors.values() for e in kind)
    slower = fr.iteration_errors(
        simulate("shared", lab_scenario(), cost),
        cost.__class__.from_dict(
            {
                **cost.to_dict(),
                "decode_step_base": cost.decode_step_base / 2,
                "link_bandwidth": 25e9,
            }
        ),
    )
    assert all(e > 0 for e in slower["decode"])


def test_percentiles_are_nearest_rank():
    p = fr.percentiles([float(i) for i in range(1, 11)])
    assert p == {"median": 5.5, "p10": 1.0, "p90": 9.0, "count": 10}


def test_fidelity_takes_save_results_and_machine():
    from pytest_prefill.cli import build_parser

    args = build_parser().parse_args(
        ["fidelity", "--save", "--results", "r", "--machine", "cpu-x", "--runs", "3"]
    )
    assert args.save and args.results == "r" and args.machine == "cpu-x"


def test_fidelity_save_archives_the_tables_and_the_verdict(tmp_path):
    import argparse

    from pytest_prefill.archive import runs as archive
    from pytest_prefill.commands.fidelity import save_fidelity

    cells = [fr.Cell("lab 256", "shared", "makespan", 1.05, (1.0, 1.0, 1.0))]
    args = argparse.Namespace(
        results=str(tmp_path),
        machine="cpu-test",
        model="small",
        device="cpu",
        dtype=None,
        repeats=None,
        warmup=None,
        dry_run=False,
        argv=["fidelity", "--save"],
    )
    path = save_fidelity(args, _result(cells))
    (saved,) = archive.runs(tmp_path, "cpu-test")
    assert saved.path == path
    assert saved.data["verdicts"][0]["verdict"] == "HOLDS"  # 5% <= 10%
    assert saved.data["tables"][0]["data"]["cells"][0]["policy"] == "shared"
    assert saved.data["command"] == "prefill-bench fidelity --save"
