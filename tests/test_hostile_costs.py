"""Cost files with valid but extreme numbers given to ``simulate --cost``: handled or refused
in one line, never an OverflowError or IndexError."""

from __future__ import annotations

import json

import pytest

from pytest_prefill.cli import main

BASE = {
    "prefill_pass_overhead": 0.029,
    "prefill_per_token": 5.5e-05,
    "decode_step_base": 0.035,
    "decode_per_seq": 0.0,
    "decode_per_kv_token": 0.0,
    "kv_bytes_per_token": 114688.0,
}


@pytest.mark.parametrize(
    "change",
    [
        {"prefill_per_token": 1e300},
        {"decode_step_base": 1.7e308},
        {"prefill_per_token": 5e-324},
        {"kv_capacity_tokens": 1},
    ],
)
def test_an_extreme_cost_is_handled_or_refused_in_one_line(tmp_path, change, capsys):
    path = tmp_path / "cost.json"
    path.write_text(json.dumps({**BASE, **change}))
    try:
        status = main(["simulate", "--cost", str(path)])
    except SystemExit as exited:
        status = exited.code
        err = capsys.readouterr().err.strip()
        assert status == 2 and "\n" not in err and err.startswith("prefill-bench simulate: error:")
    else:
        assert status == 0


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"prefill_per_token": 1e300}, "prefill_per_token"),
        ({"decode_step_base": 3601.0}, "decode_step_base"),
        ({"prefill_per_pair": 1e300}, "prefill_per_pair"),
        ({"decode_step_base": 1e-300}, "decode_step_base"),
        ({"prefill_pass_overhead": 0.0, "prefill_per_token": 5e-324}, "prefill_per_token"),
    ],
)
@pytest.mark.parametrize("command", [["simulate"], ["timeline", "--text"], ["capacity"]])
def test_a_cost_out_of_range_is_refused_at_load_naming_file_field_and_range(
    tmp_path, change, field, command, capsys
):
    from pytest_prefill.plan.cost_document import LONGEST_TERM, SHORTEST_PASS

    path = tmp_path / "cost.json"
    path.write_text(json.dumps({**BASE, **change}))
    slo = ["--slo", "ttft:1s"] if command == ["capacity"] else []
    with pytest.raises(SystemExit) as exited:
        main([*command, "--cost", str(path), *slo])
    err = capsys.readouterr().err.strip()
    assert exited.value.code == 2 and "\n" not in err and "Traceback" not in err
    assert str(path) in err and field in err
    assert f"{LONGEST_TERM:g} s" in err or f"{SHORTEST_PASS:g} s" in err


def test_a_calibration_document_with_a_cost_out_of_range_is_refused(tmp_path):
    from pytest_prefill.measure.calibrate import Calibration
    from pytest_prefill.sim import CostModel

    good = Calibration(CostModel(**BASE), {}, (), {}, ()).to_dict()
    Calibration.from_dict(good)  # in range: read
    bad = {**good, "cost_model": {**good["cost_model"], "decode_step_base": 1e300}}
    with pytest.raises(ValueError, match=r"cost_model\.decode_step_base is 1e\+300 s"):
        Calibration.from_dict(bad)


def test_timeline_blames_the_cost_not_a_window_never_given(tmp_path, capsys):
    """A cost in range whose long prompt's prefill is too short to draw: the cost's prefill
    terms named, one line, no --window blamed."""
    path = tmp_path / "cost.json"
    change = {"prefill_pass_overhead": 2e-12, "prefill_per_token": 0.0}
    path.write_text(json.dumps({**BASE, **change}))
    with pytest.raises(SystemExit) as exited:
        main(["timeline", "--cost", str(path), "--text"])
    err = capsys.readouterr().err.strip()
    assert exited.value.code == 2 and "\n" not in err
    assert "prefill_pass_overhead 2e-12 s" in err and "window" not in err


def test_the_archive_passes_over_a_run_whose_cost_is_out_of_range(tmp_path):
    """``--cost archive`` picked the newest run, whose costs were 1e300 s, and overflowed: it is
    passed over, said why, for the older run in range."""
    import datetime

    from pytest_prefill.archive import saving
    from pytest_prefill.archive.runs import archived_cost
    from pytest_prefill.measure.calibrate import Calibration
    from pytest_prefill.sim import CostModel

    when = datetime.datetime(2026, 1, 2, 3, 4, 5)
    for cost in (BASE, {**BASE, "prefill_per_token": 1e300}):
        calibration = Calibration(CostModel(**cost), {}, (), {}, ()).to_dict()
        run = {"tables": [], "calibration": calibration}
        saving.write_run(tmp_path, "cpu-test", run, commit="abcdef12", dirty=False, when=when)
    warned: list[str] = []
    cost, run = archived_cost(tmp_path, "cpu-test", warn=warned.append)
    assert run.number == 1 and cost == CostModel(**BASE)
    assert len(warned) == 1 and "prefill_per_token is 1e+300 s" in warned[0]
