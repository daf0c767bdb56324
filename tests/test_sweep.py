"""The chunk sweep and the `prefill-bench simulate` command."""

from __future__ import annotations

import json
import math

import pytest

from pytest_prefill.cli import main
from pytest_prefill.plan.advice import choose_chunk
from pytest_prefill.plan.sweep import chunk_sweep, default_chunks
from pytest_prefill.plan.workloads import lab_scenario
from pytest_prefill.sim import PRESETS, CostModel, simulate

pytestmark = pytest.mark.sim
LAB = PRESETS["lab-laptop"].cost


def test_default_chunks_hold_c_star_powers_of_two_and_the_prompt():
    chunks = default_chunks(LAB, 2048)
    assert round(LAB.chunk_star()) in chunks and 2048 in chunks and 64 in chunks
    assert chunks == sorted(set(chunks)) and max(chunks) == 2048


@pytest.mark.parametrize(
    "cost",
    [
        LAB,
        CostModel(prefill_pass_overhead=0.05, prefill_per_token=1e-5, decode_step_base=0.01),
        CostModel(
            prefill_pass_overhead=1e-3,
            prefill_per_token=1e-5,
            prefill_per_pair=1e-9,
            decode_step_base=1e-2,
        ),
    ],
)
def test_the_sweep_holds_the_chunk_every_report_runs(cost):
    assert choose_chunk(cost, 2048).chunk in default_chunks(cost, 2048)


def test_sweep_ratios_are_against_the_shared_row():
    load = lab_scenario()
    rows = chunk_sweep(LAB, load, [128, 512])
    assert [r.label for r in rows] == [
        "shared",
        "coscheduled",
        "chunked 128",
        "chunked 512",
        "disaggregated",
    ]
    shared = simulate("shared", load, LAB).summary()
    for r in rows:
        assert r.ttft_cost == pytest.approx(r.summary.ttft_p99 / shared.ttft_p99)
        assert r.stall_gain == pytest.approx(shared.max_stall / r.summary.max_stall)
    assert rows[0].ttft_cost == 1.0 and rows[0].stall_gain == 1.0


def test_simulate_prints_every_policy_and_writes_json(tmp_path, capsys):
    out_file = tmp_path / "sweep.json"
    assert main(["simulate", "--chunk", "256", "--json", str(out_file)]) == 0
    out = capsys.readouterr().out
    for word in ("shared", "coscheduled", "chunked", "disaggregated", "C* = 121", "lab-laptop"):
        assert word in out
    data = json.loads(out_file.read_text())
    assert [row["policy"] for row in data["rows"]] == [
        "shared",
        "coscheduled",
        "chunked",
        "disaggregated",
    ]
    assert math.isclose(data["cost_model"]["decode_step_base"], LAB.decode_step_base)
    assert [p.name for p in tmp_path.iterdir()] == ["sweep.json"]  # no temporary left behind


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "--cost", "nope"], "unknown cost 'nope'"),
        (["simulate", "--cost", "missing.json"], "does not exist"),
        (["simulate", "--chunk", "0"], "--chunk: must be a positive integer"),
        (["simulate", "--prompt-len", "-3"], "--prompt-len"),
        (["simulate", "--arrival", "nan"], "--arrival"),
    ],
)
def test_bad_simulate_arguments_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_foreign_json_is_refused(tmp_path, capsys):
    path = tmp_path / "foreign.json"
    path.write_text(json.dumps({"hello": 1}))
    with pytest.raises(SystemExit):
        main(["simulate", "--cost", str(path)])
    assert "not a cost model" in capsys.readouterr().err


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_preset_is_said_not_measured_here_on_the_command_line(preset, tmp_path, capsys):
    assert main(["simulate", "--cost", preset]) == 0
    simulate_header = capsys.readouterr().out.splitlines()[0]
    argv = ["capacity", "--cost", preset, "--workload", "poisson", "--num-prompts", "20"]
    argv += ["--slo", "ttft:2s,tpot:200ms", "--devices", "1", "--no-devices-needed"]
    argv += ["--deployment", "chunked", "--workers", "1"]
    assert main(argv) == 0
    capacity_header = capsys.readouterr().out.splitlines()[0]
    for header in (simulate_header, capacity_header):
        assert header.startswith(f"Cost model: preset '{preset}' [not measured here]: "), header


@pytest.mark.parametrize("argv", [["simulate"], ["timeline", "--text"]])
def test_gpu_seconds_is_defined_wherever_printed(argv, capsys):
    """Issue 50 item 13: "GPU-s" was printed and never defined."""
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "GPU-s" in out
    assert "GPU-s = seconds the devices were busy" in out or "GPU-s: device-seconds busy" in out
