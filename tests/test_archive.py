"""The results archive and the machine key: naming, atomic numbered writes under concurrency,
and reading that skips corrupt or foreign files with a message instead of crashing."""

from __future__ import annotations

import datetime
import json
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from pytest_prefill import archive
from pytest_prefill.machine import (
    Accelerator,
    check_device,
    cpu_key,
    machine_info,
    machine_key,
    slug,
)
from pytest_prefill.scheduler import get_preset

WHEN = datetime.datetime(2026, 1, 2, 3, 4, 5)
COST = get_preset("lab-laptop").cost


def calibrated_run(cost=COST):
    return {
        "calibration": {
            "kind": "pytest-prefill/calibration",
            "schema_version": 1,
            "cost_model": cost.to_dict(),
        },
        "tables": [],
        "verdicts": [],
    }


def write(results, run=None, *, key="cpu-test", commit="abcdef12", dirty=False):
    return archive.write_run(
        results, key, run or {"tables": []}, commit=commit, dirty=dirty, when=WHEN
    )


# --- machine keys ------------------------------------------------------------------------------


def test_the_machine_key_names_the_gpu_under_test():
    gpus = [Accelerator(0, "NVIDIA H200", "550.1", 143771), Accelerator(1, "NVIDIA A100-SXM4-80GB")]
    assert machine_key(None, gpus, "AMD EPYC 7763 64-Core Processor") == "nvidia-h200"
    assert machine_key("cuda", gpus, "x") == "nvidia-h200"
    assert machine_key("cuda:1", gpus, "x") == "nvidia-a100-sxm4-80gb"


def test_the_machine_key_names_the_cpu_without_a_gpu_or_on_cpu():
    gpus = [Accelerator(0, "NVIDIA H200")]
    cpu = "Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz"
    assert machine_key(None, [], cpu) == "cpu-intel-xeon-platinum-8480"
    assert machine_key("cpu", gpus, cpu) == "cpu-intel-xeon-platinum-8480"
    assert cpu_key("AMD EPYC 7763 64-Core Processor") == "cpu-amd-epyc-7763"


@pytest.mark.parametrize("text", ["NVIDIA GeForce RTX 3080 Ti Laptop GPU", "a//b  c", "--x--"])
def test_a_slug_is_a_folder_name(text):
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", slug(text))


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "CPU", "", "cuda:"])
def test_a_malformed_device_is_refused(device):
    with pytest.raises(ValueError, match="device must be one of"):
        check_device(device)


def test_machine_info_holds_the_provenance_the_archive_needs():
    info = machine_info("cpu", [])
    assert info["key"].startswith("cpu-")
    for field in ("host", "os", "cpu", "accelerators", "python", "packages"):
        assert field in info
    assert {"torch", "transformers", "pytest"} <= set(info["packages"])


# --- writing -----------------------------------------------------------------------------------


def test_run_files_are_numbered_and_named(tmp_path):
    first = write(tmp_path)
    second = write(tmp_path, dirty=True)
    assert first.name == "0001_abcdef12_20260102_030405.json"
    assert second.name == "0002_abcdef12_20260102_030405_dirty.json"
    data = json.loads(second.read_text())
    assert data["kind"] == archive.RUN_KIND
    assert data["schema_version"] == archive.SCHEMA_VERSION
    assert data["number"] == 2
    assert not [n for n in os.listdir(first.parent) if n.startswith(".")], "no leftovers"


def test_concurrent_writers_never_share_a_number_or_lose_a_file(tmp_path):
    writers, each = 8, 4

    def work(i):
        return [
            write(tmp_path, {"writer": i, "tables": []}, commit=f"{i:08d}") for _ in range(each)
        ]

    with ThreadPoolExecutor(writers) as pool:
        paths = [p for batch in pool.map(work, range(writers)) for p in batch]
    numbers = sorted(int(p.name[:4]) for p in paths)
    assert numbers == list(range(1, writers * each + 1))
    for path in paths:
        assert json.loads(path.read_text())["number"] == int(path.name[:4])
    assert len(archive.runs(tmp_path, "cpu-test")) == writers * each


def test_attachments_are_written_beside_the_run_file_and_listed_in_it(tmp_path):
    path = archive.write_run(
        tmp_path,
        "cpu-test",
        {},
        commit="abcdef12",
        dirty=False,
        when=WHEN,
        attachments={"timeline.svg": "<svg/>"},
    )
    svg = path.with_name(path.stem + "_timeline.svg")
    assert svg.read_text() == "<svg/>"
    assert json.loads(path.read_text())["attachments"] == {"timeline.svg": svg.name}
    assert [r.path for r in archive.runs(tmp_path, "cpu-test")] == [path]
    with pytest.raises(ValueError, match="attachment suffix"):
        archive.write_run(
            tmp_path,
            "cpu-test",
            {},
            commit="abcdef12",
            dirty=False,
            when=WHEN,
            attachments={"x.json": "{}"},
        )


def test_a_number_taken_by_a_finished_file_is_skipped(tmp_path):
    folder = tmp_path / "cpu-test"
    folder.mkdir()
    (folder / "0007_00000000_20250101_000000.json").write_text("{}")
    assert write(tmp_path).name.startswith("0008_")


def test_nan_and_infinity_become_strict_json(tmp_path):
    path = write(tmp_path, {"tables": [{"data": {"a": math.nan, "b": math.inf, "c": (1, 2)}}]})
    data = json.loads(path.read_text())  # strict JSON: parses with any reader
    assert data["tables"][0]["data"] == {"a": None, "b": "inf", "c": [1, 2]}
    with pytest.raises(ValueError, match="cannot be stored as JSON"):
        archive.json_safe({"x": object()})


@pytest.mark.parametrize("key", ["../up", "Upper", "a/b", ""])
def test_a_bad_machine_key_is_refused(tmp_path, key):
    with pytest.raises(ValueError, match="machine key"):
        write(tmp_path, key=key)


def test_git_state_outside_git_says_nocommit(tmp_path):
    assert archive.git_state(tmp_path) == (archive.NO_COMMIT, False)


# --- reading -----------------------------------------------------------------------------------


def test_corrupt_foreign_and_future_files_are_skipped_with_their_path(tmp_path):
    good = write(tmp_path, calibrated_run())
    folder = good.parent
    (folder / "0002_abcdef12_20260102_030405.json").write_text("{not json")
    (folder / "0003_abcdef12_20260102_030405.json").write_text(json.dumps({"kind": "other"}))
    (folder / "0004_abcdef12_20260102_030405.json").write_text(
        json.dumps({"kind": archive.RUN_KIND, "schema_version": archive.SCHEMA_VERSION + 1})
    )
    (folder / "benchmark.json").write_text(json.dumps([1, 2]))
    messages = []
    found = archive.runs(tmp_path, "cpu-test", warn=messages.append)
    assert [r.path for r in found] == [good]
    assert len(messages) == 4
    for name in ("0002_", "0003_", "0004_", "benchmark.json"):
        assert any(name in m and str(folder) in m for m in messages), name


def test_the_latest_calibration_is_found_past_runs_without_one(tmp_path):
    doubled = type(COST).from_dict(
        {**COST.to_dict(), "link_bandwidth": 1e9, "decode_step_base": 0.07}
    )
    write(tmp_path, calibrated_run())
    write(tmp_path, calibrated_run(doubled))
    write(tmp_path, {"tables": []})  # a sim-only run: no calibration
    cost, run = archive.archived_cost(tmp_path, "cpu-test")
    assert cost == doubled
    assert run.number == 2


def test_no_archived_calibration_is_a_clear_error(tmp_path):
    write(tmp_path)
    with pytest.raises(ValueError, match="no calibration archived for machine 'cpu-test'"):
        archive.archived_cost(tmp_path, "cpu-test")


def test_resolve_run_takes_a_path_or_a_machine_key(tmp_path):
    write(tmp_path)
    second = write(tmp_path)
    assert archive.resolve_run(str(second), tmp_path).path == second
    assert archive.resolve_run("cpu-test", tmp_path).number == 2
    with pytest.raises(ValueError, match="machines there: cpu-test"):
        archive.resolve_run("nvidia-h200", tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        archive.resolve_run(str(tmp_path / "missing.json"), tmp_path)
