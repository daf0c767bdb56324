"""``prefill-bench compare``: constants side by side, relative difference, beyond-spread verdicts
from the calibrations' own fits, each side's C* and recommendation; bad input named."""

from __future__ import annotations

import datetime
import json
import math
import subprocess
import sys

import pytest

from pytest_prefill.archive import saving
from pytest_prefill.cli import main
from pytest_prefill.report.comparison import CONSTANTS, Side, compare, side_from_document
from pytest_prefill.sim import CostModel, get_preset

LAB = get_preset("lab-laptop").cost


def fit(
    slope,
    intercept,
    *,
    slope_stderr=0.0,
    intercept_stderr=0.0,
    scatter=0.0,
    x_range=1792.0,
    refused=False,
):
    return {
        "slope": slope,
        "intercept": intercept,
        "slope_stderr": slope_stderr,
        "intercept_stderr": intercept_stderr,
        "points": 4,
        "x_range": x_range,
        "effect": abs(slope) * x_range,
        "scatter": scatter,
        "mean_y": intercept,
        "refused": refused,
        "reason": "flat within noise" if refused else "",
    }


def calibration(cost: CostModel, *, noise: float = 1e-4, refused=("decode_per_kv_token",)):
    """A calibration document whose fits give every measured constant a spread of about
    ``noise`` seconds (scatter), 2 standard errors smaller."""
    return {
        "kind": "pytest-prefill/calibration",
        "schema_version": 1,
        "cost_model": cost.to_dict(),
        "provenance": {"device": "test"},
        "measurements": [],
        "fits": {
            "prefill": fit(
                cost.prefill_per_token,
                cost.prefill_pass_overhead,
                slope_stderr=noise / 1e4,
                intercept_stderr=noise / 4,
                scatter=noise,
            ),
            "decode_kv": fit(
                0.0,
                cost.decode_step_base,
                scatter=noise,
                x_range=16256.0,
                refused="decode_per_kv_token" in refused,
            ),
        },
        "refusals": [
            {"constant": c, "reason": "flat within noise", "numbers": {}} for c in refused
        ],
    }


def write_run(results, key, cost, **kwargs):
    return saving.write_run(
        results,
        key,
        {"calibration": calibration(cost, **kwargs)},
        commit="abcdef12",
        dirty=False,
        when=datetime.datetime(2026, 1, 1),
    )


def side(cost, label="A", **kwargs):
    return side_from_document(calibration(cost, **kwargs), label, label)


def test_identical_calibrations_differ_nowhere():
    rows = compare(side(LAB), side(LAB, "B"))
    assert [r.constant for r in rows] == list(CONSTANTS)
    for row in rows:
        assert row.relative == 0.0
        assert row.beyond != "yes"  # "unknown" where this calibration fitted nothing


def test_a_difference_beyond_both_spreads_is_flagged_and_one_within_is_not():
    noise = 1e-4
    slower = CostModel.from_dict(
        {
            **LAB.to_dict(),
            "decode_step_base": LAB.decode_step_base + 10 * noise,
            "prefill_pass_overhead": LAB.prefill_pass_overhead + noise / 2,
            "link_bandwidth": LAB.link_bandwidth,
        }
    )
    rows = {r.constant: r for r in compare(side(LAB, noise=noise), side(slower, "B", noise=noise))}
    step = rows["decode_step_base"]
    assert step.beyond == "yes"  # 10 x noise apart, spreads noise each
    assert math.isclose(step.relative, 10 * noise / LAB.decode_step_base)
    assert rows["prefill_pass_overhead"].beyond == "no"  # half a noise apart
    assert rows["link_bandwidth"].beyond == "assumed"
    assert rows["decode_per_kv_token"].refused_a and rows["decode_per_kv_token"].refused_b


def test_without_recorded_spreads_the_verdict_is_unknown():
    bare = Side("B", "bare", LAB, None)
    rows = {r.constant: r for r in compare(side(LAB), bare)}
    assert rows["prefill_per_token"].beyond == "unknown"
    assert rows["kv_bytes_per_token"].beyond == "no"  # exact on both sides


def test_compare_two_machine_keys_prints_the_table_and_both_recommendations(tmp_path, capsys):
    fast = get_preset("datacenter-illustrative").cost
    write_run(tmp_path, "cpu-one", LAB)
    write_run(tmp_path, "nvidia-h200", fast)
    assert main(["compare", "cpu-one", "nvidia-h200", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in CONSTANTS:
        assert name in out
    assert "beyond spread?" in out
    assert out.count("C* = (decode_step - pass_overhead) / prefill_per_token") == 2
    assert f"{LAB.chunk_star():.0f} tokens" in out and f"{fast.chunk_star():.0f} tokens" in out
    assert "DISAGGREGATION" in out and "CHUNKED" in out


def test_compare_takes_run_files_and_calibration_files(tmp_path, capsys):
    run = write_run(tmp_path, "cpu-one", LAB)
    loose = tmp_path / "calibration.json"
    loose.write_text(json.dumps(calibration(LAB)))
    assert main(["compare", str(run), str(loose)]) == 0
    out = capsys.readouterr().out
    assert str(run) in out and str(loose) in out


@pytest.mark.parametrize(
    "ref, message",
    [
        ("nvidia-h200", "no calibrated run archived for machine 'nvidia-h200'"),
        ("missing.json", "does not exist"),
        ("Not A Key", "neither a JSON file nor a machine key"),
    ],
)
def test_bad_references_are_errors_that_say_why(tmp_path, capsys, ref, message):
    write_run(tmp_path, "cpu-one", LAB)
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "cpu-one", ref, "--results", str(tmp_path)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_corrupt_run_file_is_named(tmp_path, capsys):
    bad = tmp_path / "0001_abcdef12_20260101_000000.json"
    bad.write_text("{oops")
    with pytest.raises(SystemExit):
        main(["compare", str(bad), str(bad)])
    assert str(bad) in capsys.readouterr().err


def test_a_corrupt_file_in_a_machine_folder_is_skipped_with_a_message(tmp_path, capsys):
    write_run(tmp_path, "cpu-one", LAB)
    latest = tmp_path / "cpu-one" / "0002_abcdef12_20260101_000000.json"
    latest.write_text("{oops")
    assert main(["compare", "cpu-one", "cpu-one", "--results", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert str(latest) in captured.err and "skipped" in captured.err


def test_compare_needs_neither_torch_nor_numpy(tmp_path):
    write_run(tmp_path, "cpu-one", LAB)
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['numpy'] = None\n"
        "from pytest_prefill.cli import main\n"
        f"sys.exit(main(['compare', 'cpu-one', 'cpu-one', '--results', {str(tmp_path)!r}]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "beyond spread?" in done.stdout


def test_run_numbers_as_runs_lists_them_are_accepted(tmp_path, capsys):
    first = write_run(tmp_path, "cpu-one", LAB)
    second = write_run(tmp_path, "cpu-one", LAB)
    common = ["--results", str(tmp_path), "--machine", "cpu-one"]
    assert main(["compare", "0001", "0002", *common]) == 0
    out = capsys.readouterr().out
    assert f"A: {first}" in out and f"B: {second}" in out
    assert main(["compare", "cpu-one/0002", "cpu-one/0001", "--results", str(tmp_path)]) == 0
    assert f"A: {second}" in capsys.readouterr().out


def test_a_missing_run_number_lists_the_numbers_there(tmp_path, capsys):
    write_run(tmp_path, "cpu-one", LAB)
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "cpu-one/0001", "cpu-one/0007", "--results", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "no run 0007 archived for machine 'cpu-one'" in err and "0001" in err


def test_a_refused_per_token_cost_gives_no_recommendation_in_compare(tmp_path, capsys):
    refusing = tmp_path / "refusing.json"
    refusing.write_text(json.dumps(calibration(LAB, refused=("prefill_per_token",))))
    assert main(["compare", str(refusing), str(refusing)]) == 0
    out = capsys.readouterr().out
    assert out.count("-> no recommendation: prefill_per_token was refused") == 2
    assert "DISAGGREGATION" not in out


def scaled(cost: CostModel, factor: float) -> CostModel:
    return CostModel.from_dict(
        {**cost.to_dict(), "prefill_per_token": cost.prefill_per_token * factor}
    )


@pytest.mark.parametrize(
    ("factor", "percent", "status"),
    [
        (1.0, 10.0, 0),  # identical
        (1.5, 10.0, 1),  # +50%, far beyond the spread
        (1.5, 60.0, 0),  # beyond the spread but within the percentage
        (1.00001, 0.0, 0),  # beyond 0% but within the spread
    ],
)
def test_fail_above_gates_on_spread_and_percentage_together(
    tmp_path, capsys, factor, percent, status
):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(calibration(LAB)))
    b.write_text(json.dumps(calibration(scaled(LAB, factor))))
    assert main(["compare", str(a), str(b), "--fail-above", str(percent)]) == status
    out = capsys.readouterr().out
    assert ("FAIL" in out) == bool(status)
    if status:
        assert "prefill_per_token: +50.0%, beyond both spreads" in out


def test_without_fail_above_compare_never_fails(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(calibration(LAB)))
    b.write_text(json.dumps(calibration(scaled(LAB, 3.0))))
    assert main(["compare", str(a), str(b)]) == 0


@pytest.mark.parametrize("bad", ["-1", "nan", "inf", "ten"])
def test_a_bad_percentage_is_a_usage_error(tmp_path, capsys, bad):
    a = tmp_path / "a.json"
    a.write_text(json.dumps(calibration(LAB)))
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", str(a), str(a), "--fail-above", bad])
    assert exit_info.value.code == 2
    assert "--fail-above" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("fits", [1, 2], "calibration 'fits' must be an object of fits"),
        ("fits", {"prefill": 3}, "calibration 'fits' must be an object of fits"),
        ("refusals", 7, "calibration 'refusals' must be a list of objects naming a 'constant'"),
        ("refusals", [{"why": "x"}], "calibration 'refusals' must be a list of objects"),
        ("measurements", {"a": 1}, "calibration 'measurements' must be a list"),
    ],
)
def test_a_malformed_calibration_is_one_line_naming_the_file_and_field(
    tmp_path, capsys, field, value, words
):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({**calibration(LAB), field: value}))
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", str(path), str(path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and words in err[0]


def calibration_v2(cost: CostModel, *, stderr: float = 0.01) -> dict:
    """A cost model v2 calibration: fits in groups of terms, each constant with a standard
    error of ``stderr`` times its value."""
    groups = {
        "prefill": ("prefill_pass_overhead", "prefill_per_token", "prefill_per_pair"),
        "decode": ("decode_step_base", "decode_per_seq", "decode_per_kv_token"),
    }
    fits = {
        group: {
            "names": list(names),
            "values": {n: getattr(cost, n) for n in names},
            "stderrs": {n: stderr * getattr(cost, n) for n in names},
        }
        for group, names in groups.items()
    }
    return {
        "kind": "pytest-prefill/calibration",
        "schema_version": 1,
        "cost_model": cost.to_dict(),
        "provenance": {"device": "test"},
        "fits": fits,
        "refusals": [],
    }


def test_a_v2_calibration_spreads_are_two_standard_errors(tmp_path, capsys):
    rows = {
        r.constant: r
        for r in compare(
            side_from_document(calibration_v2(LAB), "A", "a"),
            side_from_document(calibration_v2(scaled(LAB, 1.5)), "B", "b"),
        )
    }
    per_token = rows["prefill_per_token"]
    assert per_token.spread_a == pytest.approx(2 * 0.01 * LAB.prefill_per_token)
    assert per_token.beyond == "yes" and rows["decode_step_base"].beyond == "no"
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(calibration_v2(LAB)))
    b.write_text(json.dumps(calibration_v2(scaled(LAB, 1.5))))
    assert main(["compare", str(a), str(b), "--fail-above", "10"]) == 1
    assert "prefill_per_token: +50.0%, beyond both spreads" in capsys.readouterr().out
    assert main(["compare", str(a), str(a), "--fail-above", "10"]) == 0
