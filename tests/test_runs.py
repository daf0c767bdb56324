"""``prefill-bench runs``: every archived run with the id ``compare`` takes, and what it found."""

from __future__ import annotations

import datetime

import pytest

from pytest_prefill.archive import runs as archive
from pytest_prefill.archive import saving
from pytest_prefill.cli import main
from pytest_prefill.plan.advice import FittedCost, recommend
from pytest_prefill.sim import get_preset

pytestmark = pytest.mark.sim
LAB = get_preset("lab-laptop").cost


def write(results, key, **run):
    return saving.write_run(
        results, key, run, commit="abcdef12", dirty=False, when=datetime.datetime(2026, 1, 1)
    )


def test_one_machine_lists_run_numbers_with_c_star_and_verdicts(tmp_path, capsys):
    write(
        tmp_path,
        "cpu-one",
        calibration={"cost_model": LAB.to_dict()},
        command="prefill-bench calibrate",
    )
    write(
        tmp_path,
        "cpu-one",
        verdicts=[{"name": "falsifier", "verdict": "FAILS"}],
        pytest={"args": ["-m", "gpu"]},
    )
    assert main(["runs", "cpu-one", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    first = next(line for line in lines if line.startswith("0001 "))
    second = next(line for line in lines if line.startswith("0002 "))
    assert f"{LAB.chunk_star():.0f}" in first and recommend(FittedCost(LAB)).policy in first
    assert "  calibrate  " in first
    assert "falsifier FAILS" in second and "pytest -m gpu" in second


def test_the_runs_table_stays_within_about_120_columns(tmp_path, capsys):
    """Issue 50 item 13: ``prefill-bench runs`` was ~300 columns wide (every verdict on one
    line, the whole command)."""
    many = [{"name": f"verify ranking {i}", "verdict": v} for i, v in enumerate("AB" * 6)]
    write(tmp_path, "cpu-one", verdicts=many, command="prefill-bench verify " + "--flag x " * 40)
    write(tmp_path, "cpu-one", calibration={"cost_model": LAB.to_dict()}, command="x" * 300)
    assert main(["runs", "cpu-one", "--results", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(map(len, lines)) <= 120
    assert any("6 A, 6 B" in line for line in lines)


def test_every_machine_is_listed_with_key_prefixed_ids_that_compare_takes(tmp_path, capsys):
    write(tmp_path, "cpu-one", calibration={"cost_model": LAB.to_dict()})
    write(tmp_path, "nvidia-h200", calibration={"cost_model": LAB.to_dict()})
    assert main(["runs", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "cpu-one/0001" in out and "nvidia-h200/0001" in out
    assert main(["compare", "cpu-one/0001", "nvidia-h200/0001", "--results", str(tmp_path)]) == 0


def test_an_empty_archive_or_unknown_machine_is_an_error_that_says_where(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["runs", "--results", str(tmp_path)])
    assert exit_info.value.code == 2 and str(tmp_path) in capsys.readouterr().err
    write(tmp_path, "cpu-one")
    with pytest.raises(SystemExit):
        main(["runs", "cpu-two", "--results", str(tmp_path)])
    assert "machines there: cpu-one" in capsys.readouterr().err


def test_a_corrupt_file_is_reported_and_skipped(tmp_path, capsys):
    write(tmp_path, "cpu-one")
    (tmp_path / "cpu-one" / "0002_abcdef12_20260101_000000.json").write_text("{oops")
    assert main(["runs", "cpu-one", "--results", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert "0001" in captured.out and "skipped" in captured.err


def test_calibrate_save_archives_a_run_that_every_reader_finds(tmp_path, capsys, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from pytest_prefill.measure import sweep as sweeps

    monkeypatch.setattr(sweeps, "CPU_PROMPT_LENS", (16, 32, 48, 64))
    monkeypatch.setattr(sweeps, "DEFAULT_CHUNKS", ((16, 32),))
    monkeypatch.setattr(sweeps, "DEFAULT_FUSED", ((8, 16, 2),))
    monkeypatch.setattr(sweeps, "DEFAULT_CACHE_LENS", (16, 128))
    monkeypatch.setattr(sweeps, "DEFAULT_BATCH_SIZES", (1, 2))
    monkeypatch.setattr(sweeps, "BATCH_CACHE_LEN", 16)
    where = ["--results", str(tmp_path), "--machine", "cpu-saved"]
    argv = ["calibrate", "--model", "tiny", "--device", "cpu", "--dry-run", "--save", *where]
    assert main(argv) == 0
    out = capsys.readouterr().out
    (saved,) = archive.runs(tmp_path, "cpu-saved")
    assert f"archived: {saved.path}" in out
    assert saved.data["command"].startswith("prefill-bench calibrate --model tiny")
    assert saved.data["calibration"]["provenance"]["torch_threads"] == 1, "1 thread on the CPU"
    advice = saved.data["cost"]["recommendation"]
    assert advice["line"] in out, "calibrate and the archive say the same words"
    assert main(["runs", "cpu-saved", "--results", str(tmp_path)]) == 0
    assert "0001" in capsys.readouterr().out
    assert main(["simulate", "--cost", "archive", *where]) == 0
    assert str(saved.path) in capsys.readouterr().out
    assert main(["compare", "0001", "cpu-saved/0001", *where]) == 0


def test_a_run_number_two_files_carry_is_reported_not_picked(tmp_path, capsys):
    """Two archives merged: two 0001 files. compare picked one silently and runs listed 0001
    twice without a word."""
    write(tmp_path, "cpu-one", calibration={"cost_model": LAB.to_dict()})
    folder = tmp_path / "cpu-one"
    (first,) = sorted(folder.glob("0001_*.json"))
    twin = folder / first.name.replace("abcdef12", "12345678")
    twin.write_text(first.read_text())
    assert main(["runs", "cpu-one", "--results", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "run 0001 of cpu-one is listed 2 times" in err and twin.name in err
    with pytest.raises(SystemExit) as info:
        main(["compare", "--machine", "cpu-one", "0001", str(first), "--results", str(tmp_path)])
    assert info.value.code == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "run 0001 of machine 'cpu-one' is ambiguous" in line and twin.name in line
    assert main(["compare", str(twin), str(first)]) == 0  # the files name them
    capsys.readouterr()
