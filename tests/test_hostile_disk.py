"""A full disk: ``timeline --out`` and a ``bench --records``-style write end in one line naming
the file, exit 1, and leave nothing half-written (ENOSPC simulated at the writer's fsync)."""

from __future__ import annotations

import errno
import os

import pytest

from pytest_prefill import _io
from pytest_prefill.cli import main


def _full_disk(monkeypatch) -> None:
    def no_space(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_io.os, "fsync", no_space)


def test_timeline_on_a_full_disk_says_one_line_and_leaves_nothing(tmp_path, monkeypatch, capsys):
    out = tmp_path / "t.svg"
    _full_disk(monkeypatch)
    with pytest.raises(SystemExit) as exited:
        main(["timeline", "--out", str(out), "--until", "5"])
    assert exited.value.code == 1
    err = capsys.readouterr().err.strip()
    assert "No space left on device" in err and str(out) in err and "\n" not in err
    assert os.listdir(tmp_path) == []


def test_records_on_a_full_disk_name_the_file_and_leave_nothing(tmp_path, monkeypatch):
    records = tmp_path / "records.jsonl"
    records.write_text("earlier\n")
    _full_disk(monkeypatch)
    with pytest.raises(OSError) as caught:
        _io.write_atomic(records, '{"id": "r1"}\n' * 1000)  # what bench --records writes
    assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(records)
    assert os.listdir(tmp_path) == ["records.jsonl"] and records.read_text() == "earlier\n"
