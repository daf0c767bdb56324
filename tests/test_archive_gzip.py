"""A compressed run file (``.json.gz``, how the committed archive keeps its long runs) reads back
wherever a plain one does: listing, finding by number, the latest calibration, a path, and
``prefill-bench runs``; a corrupt one is skipped with its path. And the commit a run is named by
comes from PYTEST_PREFILL_COMMIT where the tree travelled without its .git."""

from __future__ import annotations

import datetime
import gzip
import json
import os

import pytest

from pytest_prefill.archive import runs as archive
from pytest_prefill.archive import saving
from pytest_prefill.cli import main
from pytest_prefill.sim import get_preset

COST = get_preset("datacenter-illustrative").cost
WHEN = datetime.datetime(2026, 1, 2, 3, 4, 5)
KEY = "cpu-test"


def _compress(path) -> str:
    """Replace the run file at ``path`` by its gzip-compressed twin, as the archive keeps it."""
    zipped = str(path) + ".gz"
    with open(path, "rb") as plain, gzip.open(zipped, "wb") as out:
        out.write(plain.read())
    os.unlink(path)
    return zipped


def _runs(tmp_path):
    run = {
        "calibration": {
            "kind": "pytest-prefill/calibration",
            "schema_version": 1,
            "cost_model": COST.to_dict(),
        },
        "tables": [{"title": "records", "data": {"runs": [{"id": i} for i in range(500)]}}],
        "verdicts": [],
    }
    old = saving.write_run(tmp_path, KEY, run, commit="abcdef12", dirty=False, when=WHEN)
    new = saving.write_run(tmp_path, KEY, {"tables": []}, commit="abcdef12", dirty=False, when=WHEN)
    return _compress(old), new, run


def test_a_compressed_run_reads_back_as_it_was_written(tmp_path):
    zipped, _, run = _runs(tmp_path)
    listed = archive.runs(tmp_path, KEY)
    assert [r.number for r in listed] == [1, 2]
    assert listed[0].path.name.endswith(".json.gz")
    assert listed[0].data["tables"] == run["tables"]
    assert archive.find_run(tmp_path, KEY, 1).data["tables"] == run["tables"]
    assert archive.resolve_run(zipped, tmp_path).number == 1
    cost, found = archive.archived_cost(tmp_path, KEY)
    assert cost == COST and found.number == 1
    assert os.path.getsize(zipped) < len(json.dumps(run)) / 4  # what compression is for


def test_prefill_bench_runs_lists_a_compressed_run(tmp_path, capsys):
    _runs(tmp_path)
    assert main(["runs", KEY, "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "0001" in out and "0002" in out


def test_a_corrupt_compressed_run_is_skipped_with_its_path(tmp_path):
    _, _, _ = _runs(tmp_path)
    folder = archive.machine_dir(tmp_path, KEY)
    bad = folder / "0003_abcdef12_20260102_030405.json.gz"
    bad.write_bytes(b"not gzip at all")
    warnings: list[str] = []
    assert [r.number for r in archive.runs(tmp_path, KEY, warn=warnings.append)] == [1, 2]
    assert len(warnings) == 1 and str(bad) in warnings[0] and "gzip" in warnings[0]


def test_a_new_run_takes_a_number_past_the_compressed_ones(tmp_path):
    _runs(tmp_path)
    path = saving.write_run(
        tmp_path, KEY, {"tables": []}, commit="abcdef12", dirty=False, when=WHEN
    )
    assert archive.read_run(path).number == 3


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("0123456789abcdef0123456789abcdef01234567", ("01234567", False)),
        ("ABCDEF12-dirty", ("abcdef12", True)),
        ("not-a-commit", (archive.NO_COMMIT, False)),
        ("", (archive.NO_COMMIT, False)),
    ],
)
def test_outside_git_the_commit_comes_from_the_environment(tmp_path, monkeypatch, given, expected):
    monkeypatch.setenv(saving.COMMIT_VARIABLE, given)
    assert saving.git_state(tmp_path) == expected


def test_a_compressed_run_file_is_a_cost_file_with_its_refusals(tmp_path):
    from pytest_prefill.archive.cost_spec import resolve_cost

    run = {
        "calibration": {
            "kind": "pytest-prefill/calibration",
            "cost_model": {**COST.to_dict(), "prefill_per_pair": 0.0},
            "refusals": [{"constant": "prefill_per_pair", "reason": "noise", "numbers": {}}],
        },
        "tables": [],
    }
    path = saving.write_run(tmp_path, KEY, run, commit="abcdef12", dirty=False, when=WHEN)
    spec = resolve_cost(_compress(path))
    assert spec.cost is not None and spec.cost.prefill_per_token == COST.prefill_per_token
    assert spec.refused == ("prefill_per_pair",)
