"""Output paths (issue 50 item 6): a missing folder is an error and is never created; an
existing file of another kind is replaced only with ``--force``; an output naming an input is
refused; every command's output flag goes through the one check (_io.check_output)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest
from hostile import write_words

from pytest_prefill._io import check_output, content_kind
from pytest_prefill.cli import build_parser, main
from pytest_prefill.commands._outputs import OUTPUTS
from pytest_prefill.serve.client.prompts import WORDS_FILE

pytestmark = pytest.mark.sim

CALIBRATION = '{"kind": "pytest-prefill/calibration", "schema_version": 2}\n'


@pytest.mark.parametrize(
    ("content", "kind"),
    [
        (CALIBRATION, "a calibration"),
        ('{\n  "kind": "pytest-prefill/capacity",\n  "x": 1\n}\n', "a capacity answer"),
        ('{"traceEvents": []}', "a Chrome trace"),
        (
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.0,5,5\n",
            "a workload trace",
        ),
        ('{"timestamp": 0, "input_length": 5, "output_length": 5}\n', "a workload trace"),
        ('<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"></svg>', "an SVG picture"),
        (b"\x89PNG\r\n\x1a\n", "a PNG picture"),
        ('{"a": 1}\n{"a": 2}\n', "JSON lines"),
        ('{"date": "x", "completed": 3}', "a JSON document"),
        ("hello\n", "a file of another kind"),
        ("", None),
    ],
)
def test_content_kind_reads_what_a_file_holds_from_its_first_bytes(tmp_path, content, kind):
    path = tmp_path / "f"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    assert content_kind(path) == kind


def test_a_missing_folder_is_an_error_and_is_not_created(tmp_path):
    with pytest.raises(ValueError, match="does not exist") as info:
        check_output(tmp_path / "a" / "b" / "c.json")
    assert "\n" not in str(info.value)
    assert not (tmp_path / "a").exists()


def test_a_file_of_another_kind_is_replaced_only_with_force(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(CALIBRATION)
    with pytest.raises(ValueError, match="holds a calibration and this writes a Chrome trace"):
        check_output(path, writes="a Chrome trace")
    assert check_output(path, writes="a Chrome trace", force=True) == str(path)
    assert check_output(path, writes="a calibration") == str(path)  # its own kind: replaced


def test_an_output_naming_an_input_is_refused_even_with_force(tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(CALIBRATION)
    (tmp_path / "link.json").symlink_to(path)
    for given in (path, tmp_path / "link.json"):
        with pytest.raises(ValueError, match="is also --cost's input"):
            check_output(given, writes="a calibration", inputs={"--cost": str(path)}, force=True)


def _output_flags() -> set[tuple[str, str]]:
    """(command, dest) of every flag whose type refuses a file in a folder that does not exist:
    found by behaviour, so a new output flag cannot miss the table."""
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found = set()
    for name, command in sub.choices.items():
        for action in command._actions:
            if not callable(action.type) or not action.option_strings:
                continue
            try:
                action.type("/no-such-folder-here/x.json")
            except (argparse.ArgumentTypeError, ValueError) as err:
                if "does not exist" in str(err):
                    found.add((name, action.dest))
            except Exception:  # noqa: S110 - a type that is not a path's
                pass
    return found


def test_every_output_flag_goes_through_the_one_check_and_takes_force():
    assert _output_flags() == set(OUTPUTS)
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, _ in OUTPUTS:
        assert any("--force" in a.option_strings for a in sub.choices[name]._actions), name


def test_timeline_does_not_replace_a_calibration_nor_make_a_folder(tmp_path, capsys):
    """The issue's three cases: ``timeline --out cal.json`` replaced a calibration with a Chrome
    trace; ``--out /nope/t.svg`` made /nope; ``capacity --json a/b/c.json`` made folders."""
    cal = tmp_path / "cal.json"
    cal.write_text(CALIBRATION)
    with pytest.raises(SystemExit) as exit_info:
        main(["timeline", "--out", str(cal)])
    assert exit_info.value.code == 2 and cal.read_text() == CALIBRATION
    for argv in (["timeline", "--out"], ["capacity", "--json"]):
        with pytest.raises(SystemExit):
            main([*argv, str(tmp_path / "nope" / "t.svg")])
    assert not (tmp_path / "nope").exists()
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--json", "out.json"],
        ["timeline", "--out", "out.json"],
        ["timeline", "--out", "out.svg"],
    ],
)
def test_what_a_flag_says_it_writes_is_what_it_writes(tmp_path, monkeypatch, argv, capsys):
    """The table's words match what content_kind reads back, so a rerun replaces its own file."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 0
    path = argv[-1]
    assert content_kind(path) == OUTPUTS[argv[0], argv[1][2:]](path)
    assert main(argv) == 0  # the same file again: no --force needed
    if path.endswith(".json"):
        json.loads((tmp_path / path).read_text())


def _value_flags(command: str) -> list[argparse.Action]:
    """Every option of ``command`` that takes a value and is not one of its outputs."""
    outputs = {dest for name, dest in OUTPUTS if name == command}
    return [
        action
        for action in _command_parser(command)._actions
        if action.option_strings and action.nargs != 0 and action.dest not in outputs
    ]


def _command_parser(command: str) -> argparse.ArgumentParser:
    parser = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices[command]


def _path_value(action: argparse.Action, path: str) -> Any:
    """What ``action`` makes of a file's path (None: its type refuses one)."""
    try:
        value = action.type(path) if callable(action.type) else path
    except (argparse.ArgumentTypeError, ValueError, TypeError):
        return None
    if action.nargs in ("+", "*") or isinstance(action, argparse._AppendAction):
        return [value]
    return value


def _inputs_beside_outputs() -> list[tuple[str, str, str]]:
    """(command, output's dest, flag) for every flag that takes a file's path (found by
    behaviour: its type takes this file's) beside each output flag of its command."""
    return [
        (command, dest, action.option_strings[-1])
        for command, dest in sorted(OUTPUTS)
        for action in _value_flags(command)
        if _path_value(action, __file__) is not None
    ]


@pytest.mark.parametrize(("command", "output", "flag"), _inputs_beside_outputs())
def test_no_output_flag_names_a_file_any_other_flag_names(tmp_path, command, output, flag):
    """Every output flag against every other flag that takes a path (found by behaviour: one
    whose type refuses a file's path takes none), the same existing file given to both: refused
    before anything runs, naming both flags, in one line."""
    from pytest_prefill.commands._outputs import check_outputs

    path = tmp_path / "in.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 5}\n')
    actions = _command_parser(command)._actions
    action = next(a for a in actions if flag in a.option_strings)
    args = argparse.Namespace(**{a.dest: a.default for a in actions}, command=command)
    setattr(args, action.dest, _path_value(action, str(path)))
    setattr(args, output, str(path))
    with pytest.raises(ValueError) as info:
        check_outputs(args)
    message = str(info.value)
    written = "--" + output.replace("_", "-")
    assert written in message and f"{flag}'s input" in message and "\n" not in message


def test_bench_records_over_its_workload_is_a_usage_error_and_writes_nothing(tmp_path, capsys):
    workload = tmp_path / "t.jsonl"
    text = '{"timestamp": 0, "input_length": 5, "output_length": 5}\n'
    workload.write_text(text)
    argv = ["bench", "--url", "http://127.0.0.1:9", "--workload", str(workload)]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--records", str(workload)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "--records" in err and "--workload's input" in err
    assert workload.read_text() == text and sorted(tmp_path.iterdir()) == [workload]


def _folders(tmp_path):
    """A model folder (its config.json, its word list: read by name) and an archive with one
    machine's folder (read whole), and a workload file beside them."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    write_words(model)
    archive = tmp_path / "archive"
    (archive / "cpu-test").mkdir(parents=True)
    workload = tmp_path / "t.jsonl"
    workload.write_text('{"timestamp": 0, "input_length": 5, "output_length": 5}\n')
    return model, archive, workload


SERVER = ["--url", "http://127.0.0.1:9"]
VERIFY = ["verify", *SERVER, "--flags", "tokens=16", "--slo", "ttft:1s"]


def _inside_cases(tmp_path) -> list[tuple[list[str], str, str]]:
    """(command line, the output flag, the input folder's flag)."""
    model, archive, workload = _folders(tmp_path)
    bench = ["bench", *SERVER, "--workload", str(workload)]
    config, words = str(model / "config.json"), str(model / WORDS_FILE)
    return [
        ([*bench, "--records", config, "--tokenizer", str(model)], "--records", "--tokenizer"),
        ([*bench, "--json", config, "--tokenizer", str(model), "--force"], "--json", "--tokenizer"),
        (
            [*bench, "--results", str(archive), "--json", str(archive / "cpu-test" / "b.json")],
            "--json",
            "--results",
        ),
        ([*VERIFY, "--tokenizer", str(model), "--json", words], "--json", "--tokenizer"),
        (
            [*VERIFY, "--results", str(archive), "--json", str(archive / "cpu-test" / "v.json")],
            "--json",
            "--results",
        ),
        (
            ["capacity", "--slo", "ttft:1s", "--model", str(model), "--json", config],
            "--json",
            "--model",
        ),
        (
            [
                "simulate",
                "--cost",
                "archive",
                "--results",
                str(archive),
                "--json",
                str(archive / "cpu-test" / "s.json"),
            ],
            "--json",
            "--results",
        ),
    ]


def test_an_output_over_what_an_input_folder_holds_is_a_usage_error_naming_both_flags(
    tmp_path, capsys
):
    for argv, output, folder in _inside_cases(tmp_path):
        before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        err = capsys.readouterr().err.strip()
        assert exit_info.value.code == 2 and "\n" not in err, (argv, err)
        assert f"{output} " in err and f"{folder}'s folder" in err, (argv, err)
        after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
        assert after == before  # nothing written, nothing replaced


def test_an_output_beside_what_an_input_folder_holds_is_written(tmp_path):
    from pytest_prefill.commands._outputs import check_outputs

    model, archive, workload = _folders(tmp_path)
    (model / "v.json").write_text(json.dumps({"kind": "pytest-prefill/verify"}))
    bench = ["bench", *SERVER, "--workload", str(workload), "--tokenizer", str(model)]
    beside = [
        [*bench, "--results", str(archive), "--json", str(archive / "b.json")],  # not a machine's
        [*bench, "--records", str(model / "new.jsonl")],  # a new file in a model folder
        [*VERIFY, "--tokenizer", str(model), "--json", str(model / "v.json")],  # a rerun's
    ]
    for argv in beside:
        args, _ = build_parser(argv[0]).parse_known_args(argv)
        check_outputs(args)
