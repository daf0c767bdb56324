"""The tool reading back its own files, broken one field at a time: a capacity answer given to
``verify --answer``, a server calibration given to ``--cost``, and an archive folder with a
stray numbered file. Each is refused in one line naming the file and the field."""

from __future__ import annotations

import datetime
import json

import pytest
from cli_errors import usage_error

from pytest_prefill.archive import runs as archive
from pytest_prefill.archive import saving
from pytest_prefill.commands.verify import answer_of
from pytest_prefill.serve.calibration.server_calibration import read_server_calibration


def _answer(tmp_path, deployment) -> str:
    path = tmp_path / "answer.json"
    document = {"slo": {"ttft": 1.0}, "target": 0.9, "results": [{"deployment": deployment}]}
    path.write_text(json.dumps(document))
    return str(path)


@pytest.mark.parametrize(
    "deployment, named",
    [
        ({"max_batched_tokens": float("inf")}, "max_batched_tokens"),
        ({"max_batched_tokens": [1]}, "max_batched_tokens"),
        ({"max_batched_tokens": 2.9}, "max_batched_tokens"),  # never truncated to 2
        ({"max_batched_tokens": 64, "max_seqs": "8"}, "max_seqs"),
        (5, "deployment"),
    ],
)
def test_a_broken_answer_is_refused_naming_the_file_and_the_field(tmp_path, deployment, named):
    path = _answer(tmp_path, deployment)
    with pytest.raises(ValueError) as caught:
        answer_of(path)
    message = str(caught.value)
    assert message.startswith(path) and named in message and "\n" not in message


def test_a_good_answer_still_reads(tmp_path):
    flags, slo, target = answer_of(_answer(tmp_path, {"max_batched_tokens": 64, "max_seqs": 4}))
    assert [(f.budget, f.max_seqs) for f in flags] == [(64, 4)] and target == 0.9


@pytest.mark.parametrize(
    "document, named",
    [
        ({"sweep": 5}, "server"),
        ({"server": {"sweep": 5, "chunking": [], "overhead": {}}}, "server.sweep"),
        ({"server": {"sweep": {}, "chunking": 5, "overhead": {}}}, "server.chunking"),
        ({"server": {"sweep": {}, "chunking": [], "overhead": []}}, "server.overhead"),
        ({"server": {"sweep": {"budget": 16}, "chunking": [5], "overhead": {}}}, "calibration"),
    ],
)
def test_a_broken_cost_file_is_refused_naming_the_file(tmp_path, document, named, capsys):
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError) as caught:
        read_server_calibration(str(path))
    message = str(caught.value)
    assert message.startswith(str(path)) and named in message and "\n" not in message
    argv = ["verify", "--cost", str(path), "--url", "http://127.0.0.1:9", "--flags", "tokens=16"]
    assert str(path) in usage_error([*argv, "--slo", "ttft:1s"], capsys)


def test_a_stray_numbered_file_does_not_take_the_next_numbers(tmp_path):
    folder = tmp_path / "cpu-test"
    folder.mkdir()
    (folder / "999999999_x.json").write_text("{}")
    when = datetime.datetime(2026, 1, 2, 3, 4, 5)
    first = saving.write_run(
        tmp_path, "cpu-test", {"tables": []}, commit="abcdef12", dirty=False, when=when
    )
    second = saving.write_run(
        tmp_path, "cpu-test", {"tables": []}, commit="abcdef12", dirty=False, when=when
    )
    assert first.name.startswith("0001_") and second.name.startswith("0002_")
    assert [r.number for r in archive.runs(tmp_path, "cpu-test")] == [1, 2]


@pytest.mark.parametrize("verdicts", [5, "FAILS", {"name": "x"}])
def test_runs_lists_a_run_whose_verdicts_are_not_a_list(tmp_path, verdicts, capsys):
    from pytest_prefill.cli import main

    when = datetime.datetime(2026, 1, 2, 3, 4, 5)
    run = {"tables": [], "verdicts": verdicts}
    saving.write_run(tmp_path, "cpu-test", run, commit="abcdef12", dirty=False, when=when)
    assert main(["runs", "cpu-test", "--results", str(tmp_path)]) == 0
    assert "0001" in capsys.readouterr().out
