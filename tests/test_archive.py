"""The results archive and the machine key: naming, atomic numbered writes under concurrency,
and reading that skips corrupt or foreign files with a message instead of crashing."""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from pytest_prefill import _io
from pytest_prefill.archive import runs as archive
from pytest_prefill.archive import saving
from pytest_prefill.machine import (
    Accelerator,
    check_device,
    cpu_key,
    machine_info,
    machine_key,
    slug,
)
from pytest_prefill.plan.advice import FittedCost, recommend
from pytest_prefill.plan.cost_document import load_cost
from pytest_prefill.sim import CostModel, get_preset

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
    return saving.write_run(
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
    path = saving.write_run(
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
        saving.write_run(
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
        _io.json_safe({"x": object()})


@pytest.mark.parametrize("key", ["../up", "Upper", "a/b", ""])
def test_a_bad_machine_key_is_refused(tmp_path, key):
    with pytest.raises(ValueError, match="machine key"):
        write(tmp_path, key=key)


def test_git_state_outside_git_says_nocommit(tmp_path):
    assert saving.git_state(tmp_path) == (archive.NO_COMMIT, False)


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


# --- faults: a writer killed mid-write, files that must not be trusted -------------------------

# A writer stopped at a chosen point: ``fsync1`` after its attachment's temporary file,
# ``fsync2`` after the run's, ``rename`` after the run file is in place (before the attachment
# is). SIGKILL there is a ``kill -9``; ``interrupt`` raises KeyboardInterrupt (Ctrl-C) instead.
KILLED_WRITER = """
import datetime, os, signal, sys
from pytest_prefill.archive import runs as archive
from pytest_prefill.archive import saving

results, point, how = sys.argv[1:4]
calls = {"fsync": 0}
real_fsync, real_replace = os.fsync, os.replace

def stop():
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise KeyboardInterrupt

def fsync(fd):
    real_fsync(fd)
    calls["fsync"] += 1
    if point == f"fsync{calls['fsync']}":
        stop()

def replace(src, dst):
    if point == "rename" and str(dst).endswith(".svg"):
        stop()
    real_replace(src, dst)

os.fsync, os.replace = fsync, replace
try:
    saving.write_run(results, "cpu-test", {"tables": []}, commit="abcdef12", dirty=False,
                      when=datetime.datetime(2026, 1, 1), attachments={"timeline.svg": "<svg/>"})
except KeyboardInterrupt:
    sys.exit(130)
"""


def stop_a_writer(tmp_path, point, how):
    result = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, str(tmp_path), point, how],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == (-signal.SIGKILL if how == "kill" else 130), result.stderr
    return tmp_path / "cpu-test"


def in_progress(folder):
    return sorted(n for n in os.listdir(folder) if n.startswith("."))


def assert_no_orphans(folder):
    """Every attachment beside a run file belongs to a run file that exists."""
    names = set(os.listdir(folder))
    runs_there = {n[: -len(".json")] for n in names if archive.RUN_NAME.match(n)}
    for name in names - {archive.MACHINE_FILE} - {r + ".json" for r in runs_there}:
        if not name.startswith("."):
            assert any(name.startswith(r + "_") for r in runs_there), f"orphan {name}"


def age(folder, seconds=3600):
    for name in in_progress(folder):
        then = time.time() - seconds
        os.utime(folder / name, (then, then))


@pytest.mark.parametrize("point", ["fsync1", "fsync2", "rename"])
def test_kill_9_mid_write_leaves_no_orphan_and_the_next_run_sweeps_and_moves_on(tmp_path, point):
    folder = stop_a_writer(tmp_path, point, "kill")
    left = in_progress(folder)
    assert any(n.endswith(".reserved") for n in left) and any(n.endswith(".part") for n in left)
    assert_no_orphans(folder)
    run_written = point == "rename"  # killed after the run file was in place
    assert [r.number for r in archive.runs(tmp_path, "cpu-test")] == ([1] if run_written else [])
    age(folder)
    path = write(tmp_path)
    assert path.name.startswith("0002_"), "the dead writer's number is not given out again"
    assert in_progress(folder) == []
    assert_no_orphans(folder)


@pytest.mark.parametrize("point", ["fsync1", "fsync2", "rename"])
def test_ctrl_c_mid_write_leaves_nothing_behind_but_a_finished_run(tmp_path, point):
    folder = stop_a_writer(tmp_path, point, "interrupt")
    assert in_progress(folder) == []
    assert_no_orphans(folder)
    assert len(os.listdir(folder)) == (1 if point == "rename" else 0)


def test_a_fresh_or_live_in_progress_file_is_not_swept(tmp_path):
    folder = write(tmp_path).parent
    live = folder / ".tmp-live.part"
    fresh = folder / ".0009.reserved"
    fresh.write_text("")
    with open(live, "w") as handle:
        _io.lock(handle.fileno())  # a live writer holds its lock
        then = time.time() - 3600
        os.utime(live, (then, then))
        assert saving.sweep_abandoned(folder) == []
    # its writer gone, the old file goes; the reservation is too young to judge
    assert saving.sweep_abandoned(folder) == [".tmp-live.part"]
    age(folder)
    assert saving.sweep_abandoned(folder) == [".0009.reserved"]


def test_an_attachment_left_without_its_run_keeps_its_number_taken(tmp_path):
    folder = tmp_path / "cpu-test"
    folder.mkdir()
    (folder / "0001_abcdef12_20260101_000000_timeline.svg").write_text("<svg/>")
    assert write(tmp_path).name.startswith("0002_")


def test_only_the_newest_runs_are_read_to_find_the_latest_calibration(tmp_path, monkeypatch):
    for _ in range(5):
        write(tmp_path, calibrated_run())
    newest = write(tmp_path, calibrated_run())
    read = []
    real = archive.read_json
    monkeypatch.setattr(
        archive, "read_json", lambda path, what: read.append(path) or real(path, what)
    )
    cost, run = archive.archived_cost(tmp_path, "cpu-test")
    assert run.path == newest and read == [newest]


def test_a_run_file_over_the_size_limit_is_skipped_unread_for_an_older_one(tmp_path, monkeypatch):
    older = write(tmp_path, calibrated_run())
    write(tmp_path, {**calibrated_run(), "tables": [{"text": "x" * 5000}]})
    monkeypatch.setattr(_io, "MAX_JSON_BYTES", 4000)
    messages = []
    cost, run = archive.archived_cost(tmp_path, "cpu-test", warn=messages.append)
    assert run.path == older
    assert len(messages) == 1 and "0002_" in messages[0] and "over" in messages[0]


def test_a_truncated_newest_calibration_is_named_and_an_older_one_used(tmp_path):
    older = write(tmp_path, calibrated_run())
    newest = write(tmp_path, calibrated_run())
    newest.write_text(newest.read_text()[:100])
    messages = []
    assert archive.archived_cost(tmp_path, "cpu-test", warn=messages.append)[1].path == older
    assert messages == [f"skipped {newest}: not readable JSON" + messages[0].split("JSON", 1)[1]]
    older.unlink()
    with pytest.raises(
        ValueError, match=f"no calibration archived .*passed over: skipped {newest}"
    ):
        archive.archived_cost(tmp_path, "cpu-test")


def test_an_invalid_cost_model_in_the_newest_run_falls_back_to_an_older_one(tmp_path):
    older = write(tmp_path, calibrated_run())
    bad = calibrated_run()
    bad["calibration"]["cost_model"] = {**COST.to_dict(), "decode_step_base": -1}
    newest = write(tmp_path, bad)
    messages = []
    assert archive.archived_cost(tmp_path, "cpu-test", warn=messages.append)[1].path == older
    assert len(messages) == 1 and str(newest) in messages[0] and "decode_step_base" in messages[0]


@pytest.mark.parametrize("version", [True, 99, 0, "1", 1.0, None])
def test_a_schema_version_must_be_an_integer_this_version_reads(tmp_path, version):
    path = write(tmp_path, calibrated_run())
    data = json.loads(path.read_text())
    data["schema_version"] = version
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"schema_version {version!r}"):
        archive.read_run(path)
    with pytest.raises(ValueError, match=f"schema_version {version!r}"):
        load_cost(str(path))  # --cost reads the same rule as the archive and compare


def test_a_run_file_name_with_a_huge_number_is_not_a_run(tmp_path):
    folder = write(tmp_path).parent
    (folder / ("9" * 200 + "_abcdef12_20260101_000000.json")).write_text("{}")
    messages = []
    assert len(archive.runs(tmp_path, "cpu-test", warn=messages.append)) == 1
    assert write(tmp_path).name.startswith("0002_") and len(messages) == 1


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[" * 100_000 + "]" * 100_000, "nests arrays or objects too deeply"),
        ('{"kind": "pytest-prefill/run", "schema_version": 1' + "0" * 400 + "}", "401 digits"),
        ('{"kind": "pytest-prefill/run", "x": "\xff"}', "not UTF-8"),
    ],
)
def test_an_unreadable_newest_run_is_skipped_for_an_older_calibration(tmp_path, text, words):
    older = write(tmp_path, calibrated_run())
    newest = older.with_name("0002_abcdef12_20260102_030405.json")
    newest.write_bytes(text.encode("latin-1"))
    messages = []
    assert archive.archived_cost(tmp_path, "cpu-test", warn=messages.append)[1].path == older
    assert len(messages) == 1 and f"skipped {newest}: " in messages[0] and words in messages[0]


def test_a_run_found_by_number_is_the_only_file_read(tmp_path, monkeypatch):
    paths = [write(tmp_path, calibrated_run()) for _ in range(4)]
    paths[3].write_text("{broken")
    read = []
    real = archive.read_json
    monkeypatch.setattr(
        archive, "read_json", lambda path, what: read.append(path) or real(path, what)
    )
    assert archive.find_run(tmp_path, "cpu-test", 2).path == paths[1]
    assert read == [paths[1]]
    with pytest.raises(ValueError, match=f"{paths[3]}: not readable JSON"):
        archive.find_run(tmp_path, "cpu-test", 4)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"machine": None}, "document.machine"),
        ({"machine_key": 7}, "document.machine_key"),
        ({"commit": None}, "document.commit"),
        ({"dirty": "no"}, "document.dirty"),
    ],
)
def test_save_run_names_what_a_document_lacks(tmp_path, change, field):
    document = saving.run_document(
        created=datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc),
        machine={"key": "cpu-test"},
        commit="abcdef12",
        dirty=False,
        settings={},
    )
    with pytest.raises(ValueError, match=field):
        saving.save_run(tmp_path, {**document, **change}, when=datetime.datetime(2026, 1, 1))
    assert not any(tmp_path.iterdir()), "nothing written for a bad document"


def test_a_saved_document_reads_back_with_its_cost_and_recommendation(tmp_path):
    cost = CostModel(prefill_pass_overhead=0.002, prefill_per_token=1e-5, decode_step_base=0.02)
    document = saving.run_document(
        created=datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc),
        machine={"key": "cpu-test"},
        commit="abcdef12",
        dirty=False,
        settings={"threads": 1},
        cost=saving.cost_block(FittedCost(cost), "given"),
        command="prefill-bench calibrate",
    )
    path = saving.save_run(tmp_path, document, when=datetime.datetime(2026, 1, 1))
    data = archive.read_run(path).data
    assert CostModel.from_dict(data["cost"]["cost_model"]) == cost
    assert data["cost"]["recommendation"]["line"] == recommend(FittedCost(cost)).line
    assert (tmp_path / "cpu-test" / archive.MACHINE_FILE).is_file()
