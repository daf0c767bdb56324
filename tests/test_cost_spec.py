"""One resolution of a cost spec for the plugin and every command: preset | file | archive |
measure, with the calibration's refusals carried along for the recommendation."""

from __future__ import annotations

import datetime
import json

import pytest

from pytest_prefill.archive import saving
from pytest_prefill.archive.cost_spec import COST_WORDS, resolve_cost
from pytest_prefill.cli import main
from pytest_prefill.sim import PRESETS, CostModel

pytestmark = pytest.mark.sim

COST = CostModel(prefill_pass_overhead=0.002, prefill_per_token=1e-5, decode_step_base=0.02)
CALIBRATION = {
    "kind": "pytest-prefill/calibration",
    "cost_model": COST.to_dict(),
    "refusals": [{"constant": "prefill_per_token", "reason": "noise", "numbers": {}}],
}


def archived(tmp_path, key="cpu-test"):
    return saving.write_run(
        tmp_path,
        key,
        {"created": "2026-01-01T00:00:00+00:00", "calibration": CALIBRATION},
        commit="abcdef12",
        dirty=False,
        when=datetime.datetime(2026, 1, 1),
    )


def test_a_preset_is_labelled_as_not_measured_here():
    spec = resolve_cost("lab-laptop")
    assert spec.kind == "preset" and spec.cost == PRESETS["lab-laptop"].cost
    assert "not measured here" in spec.label and spec.refused == ()


def test_a_file_is_read_relative_to_the_base_and_keeps_its_refusals(tmp_path):
    (tmp_path / "cal.json").write_text(json.dumps(CALIBRATION))
    spec = resolve_cost("cal.json", base=tmp_path)
    assert spec.kind == "file" and spec.cost == COST
    assert spec.refused == ("prefill_per_token",)


def test_archive_finds_the_latest_calibration_of_the_machine(tmp_path):
    path = archived(tmp_path)
    spec = resolve_cost("archive", results=tmp_path, machine="cpu-test")
    assert spec.kind == "archive" and spec.cost == COST and str(path) in spec.source
    assert spec.refused == ("prefill_per_token",)


def test_measure_is_left_to_the_caller():
    spec = resolve_cost("measure")
    assert spec.kind == "measure" and spec.cost is None
    done = spec.measured(COST, "measured now", ["decode_per_seq"])
    assert done.cost == COST and done.refused == ("decode_per_seq",)


@pytest.mark.parametrize("spec", ["", "  ", "fastest", "missing.json"])
def test_a_bad_spec_names_itself_and_the_choices(spec, tmp_path):
    with pytest.raises(ValueError) as info:
        resolve_cost(spec, base=tmp_path)
    message = str(info.value)
    assert any(word in message for word in COST_WORDS) or "preset" in message


def test_simulate_and_timeline_take_the_archive_of_a_named_machine(tmp_path, capsys):
    archived(tmp_path, "cpu-elsewhere")
    common = ["--cost", "archive", "--results", str(tmp_path), "--machine", "cpu-elsewhere"]
    assert main(["simulate", *common]) == 0
    out = capsys.readouterr().out
    assert "archived calibration" in out
    assert recommend_line("prefill_per_token") in out  # the refusal reaches the wording
    assert main(["timeline", "--text", *common]) == 0
    out = " ".join(capsys.readouterr().out.split())  # --text wraps the title
    assert "Chunk 16 (fallback 16: the per-token prefill cost was refused)" in out


def recommend_line(refused: str) -> str:
    from pytest_prefill.plan.advice import FittedCost, recommend

    return recommend(FittedCost(COST, frozenset({refused}))).line


def test_archive_without_runs_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--cost", "archive", "--results", str(tmp_path), "--machine", "cpu-x"])
    assert exit_info.value.code == 2
    assert "no calibration archived for machine 'cpu-x'" in capsys.readouterr().err
