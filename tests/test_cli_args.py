"""The commands' arguments: sizes the command line bounds, times and windows it can resolve,
output paths checked before anything is measured or simulated, and cost files that cannot be
read named in one line. Every bad input: exit 2 with one line naming the option or the file."""

from __future__ import annotations

import json
import os
import stat

import pytest
from cli_errors import usage_error

from pytest_prefill.cli import COMMANDS, main
from pytest_prefill.commands import _measure_args
from pytest_prefill.commands._measure_args import load as _measure_args_load
from pytest_prefill.plan.workloads import lab_scenario
from pytest_prefill.report.timeline import check_window, render_text
from pytest_prefill.report.timeline_svg import render_svg
from pytest_prefill.sim import get_preset, simulate

pytestmark = pytest.mark.sim


# --- sizes: the command line bounds them (the library takes any) --------------------------------


@pytest.mark.parametrize("command", ["simulate", "timeline"])
@pytest.mark.parametrize(
    ("flag", "value", "words"),
    [
        ("--prompt-len", "1000000000000", "at most 10,000,000 tokens"),
        ("--streams", "1000000", "at most 10,000 streams"),
        ("--arrival", "1e300", "at most 1,000,000 seconds"),
    ],
)
def test_sizes_beyond_the_bounds_are_usage_errors(command, flag, value, words, capsys):
    line = usage_error(
        [command, "--text", flag, value] if command == "timeline" else [command, flag, value],
        capsys,
    )
    assert f"argument {flag}: must be {words}" in line


@pytest.mark.parametrize("command", ["simulate", "timeline"])
def test_a_chunk_that_splits_the_prompt_too_finely_is_refused_before_simulating(command, capsys):
    argv = [command, "--prompt-len", "10000000", "--chunk", "1"]
    line = usage_error([*argv, "--text"] if command == "timeline" else argv, capsys)
    assert "chunk 1 would split the 10,000,000-token prompt into 10,000,000 iterations" in line


def test_the_largest_sizes_run(capsys):
    assert main(["simulate", "--prompt-len", "10000000", "--chunk", "1000000"]) == 0
    assert "10000000-token prompt" in capsys.readouterr().out


# --- windows: at least a nanosecond wide ---------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--window", "0:5e-324"],
        ["--window", "1e-300:2e-300"],
        ["--window", "0:nan"],
        ["--until", "5e-324"],
    ],
)
def test_a_window_too_narrow_to_draw_is_a_usage_error(argv, capsys):
    line = usage_error(["timeline", "--text", *argv], capsys)
    assert f"argument {argv[0]}: must be" in line


@pytest.mark.parametrize("window", [(0.0, 5e-324), (1e-300, 2e-300), (1.0, 1.0 + 1e-12)])
def test_the_library_refuses_a_window_too_narrow_to_draw(window):
    traces = [simulate("shared", lab_scenario(), get_preset("lab-laptop").cost)]
    for render in (render_svg, render_text):
        with pytest.raises(ValueError, match="at least 1e-09 s wide"):
            render(traces, window=window)
    assert check_window((0, 1e-9)) == (0.0, 1e-9)


def test_a_text_width_is_bounded(capsys):
    assert "at most 10,000 characters" in usage_error(
        ["timeline", "--text", "--width", "1000000000"], capsys
    )


# --- output paths: checked when parsed, written through symlinks, special files refused ---------


@pytest.fixture
def no_measuring(monkeypatch):
    """Fail the test if a command gets as far as loading a model. The commands bind ``load``
    when first imported (``from ._measure_args import load``), and the CLI imports only the
    command typed: so import every command first, with the real ``load``, and patch it where
    each one bound it — patching ``_measure_args`` alone would leak the fake into a command
    first imported during this test, and fail later tests that measure."""
    import importlib

    def load(args):
        raise AssertionError("the command started measuring before checking its --json path")

    modules = [importlib.import_module(name) for name in COMMANDS.values()]
    monkeypatch.setattr(_measure_args, "load", load)
    for module in modules:
        if getattr(module, "load", None) is _measure_args_load:
            monkeypatch.setattr(module, "load", load)


@pytest.mark.parametrize("command", ["calibrate", "demo", "fidelity", "simulate"])
def test_a_bad_json_destination_is_refused_before_measuring(
    command, tmp_path, capsys, no_measuring
):
    (tmp_path / "file.json").write_text("{}\n")
    (tmp_path / "folder").mkdir()
    for bad, words in [
        ("", "the output path is empty"),
        (str(tmp_path / "folder"), "is a folder"),
        (str(tmp_path / "file.json" / "x.json"), "a file is used there as a folder"),
        ("/dev/null", "is a character device"),
    ]:
        line = usage_error([command, "--json", bad], capsys)
        assert (
            line.startswith(f"prefill-bench {command}: error: argument --json: ") and words in line
        )
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_timeline_out_refuses_a_fifo_and_leaves_it(tmp_path, capsys):
    fifo = tmp_path / "t.svg"
    os.mkfifo(fifo)
    assert "is a FIFO" in usage_error(["timeline", "--out", str(fifo)], capsys)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)


def test_json_and_out_write_through_a_symlink(tmp_path, capsys):
    for name, argv in [("sweep.json", ["simulate", "--json"]), ("t.svg", ["timeline", "--out"])]:
        target, link = tmp_path / ("real-" + name), tmp_path / name
        target.write_text("")
        link.symlink_to(target)
        assert main([*argv, str(link)]) == 0
        assert link.is_symlink() and target.stat().st_size > 0
    assert (
        json.loads((tmp_path / "real-sweep.json").read_text())["kind"]
        == "pytest-prefill/chunk-sweep"
    )
    capsys.readouterr()


def test_a_write_that_fails_is_one_line_and_exit_1(tmp_path, capsys, monkeypatch):
    def full(src, dst):
        raise OSError(28, "No space left on device", str(dst))

    monkeypatch.setattr(os, "replace", full)
    out = tmp_path / "sweep.json"
    with pytest.raises(SystemExit) as info:
        main(["simulate", "--json", str(out)])
    assert info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"prefill-bench simulate: error: [Errno 28] No space left on device: '{out}'"]
    assert os.listdir(tmp_path) == []


# --- cost files that cannot be read: one line naming the file -----------------------------------


def cost_files(tmp_path):
    fields = '"prefill_per_token": 1e-5, "decode_step_base": 0.03'
    (tmp_path / "huge.json").write_text(
        '{"prefill_pass_overhead": 1' + "0" * 400 + ", " + fields + "}"
    )
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "latin1.json").write_bytes(
        b'{"prefill_pass_overhead": 0.01, ' + fields.encode() + b', "x": "\xff"}'
    )
    (tmp_path / "folder.json").mkdir()
    return [
        ("huge.json", "an integer of 401 digits is too large"),
        ("deep.json", "nests arrays or objects too deeply"),
        ("latin1.json", ": not UTF-8"),
        ("folder.json", ": a folder, not a JSON file"),
    ]


@pytest.mark.parametrize("command", ["simulate", "timeline", "compare"])
def test_an_unreadable_cost_or_run_file_is_one_line_naming_it(command, tmp_path, capsys):
    for name, words in cost_files(tmp_path):
        path = str(tmp_path / name)
        argv = {
            "simulate": ["simulate", "--cost", path],
            "timeline": ["timeline", "--text", "--cost", path],
            "compare": ["compare", path, path],
        }[command]
        line = usage_error(argv, capsys)
        assert path in line and words in line and "one of the words" not in line


def test_dev_zero_as_cost_is_named_as_a_device(capsys):
    line = usage_error(["simulate", "--cost", "/dev/zero"], capsys)
    assert "/dev/zero: a character device, not a JSON file" in line


# --- bounds the hostile run crossed: each refused when parsed, before any work --------------------


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if a command gets as far as running (its ``run``): a bound must be checked
    when the command line is parsed, before anything is read, generated or simulated."""
    import importlib

    from pytest_prefill.cli import COMMANDS

    for name, module_name in COMMANDS.items():

        def ran(args, name=name):
            raise AssertionError(f"{name} started working before refusing its command line")

        monkeypatch.setattr(importlib.import_module(module_name), "run", ran)


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        # 1: 1 + 1e-17 is 1.0, so the bisection could never close
        (["capacity", "--slo", "ttft:1s", "--tolerance", "1e-17"], "at least 0.0001"),
        (["capacity", "--slo", "ttft:1s", "--tolerance", "1e-300"], "at least 0.0001"),
        # 4: tls:// and ucx:// crashed with TypeError tracebacks
        (["capacity", "--slo", "ttft:1s", "--cluster", "tls://127.0.0.1:8786"], "only tcp://"),
        (["capacity", "--slo", "ttft:1s", "--cluster", "ucx://127.0.0.1:8786"], "only tcp://"),
        # 5: a Chrome trace of 7.7 million token instants (945 MB; 5.7 GB with chunk 10)
        (["timeline", "--streams", "10000", "--out", "w.json"], "at most 1,000,000"),
        (["timeline", "--max-bars", "1000000", "--text"], "at most 100,000 bars"),
        (
            ["timeline", "--prompt-len", "10000000", "--chunk", "10", "--until", "1e6", "--text"],
            "simulates at most 100,000",
        ),
        # 8: sizes the command line did not bound
        (["simulate", "--workload", "poisson", "--num-prompts", "1000000000"], "1,000,000 req"),
        (
            ["simulate", "--workload", "poisson", "--num-prompts", "20000", "--chunk", "1"],
            "20,480,000 iterations",
        ),
        (
            ["capacity", "--slo", "ttft:1s", "--deployment", "chunked:1", "--num-prompts", "2000"],
            "2,048,000 iterations",
        ),
        (["capacity", "--slo", "ttft:1s", "--max-model-len", "100000000"], "10,000,000 tokens"),
        (["capacity", "--slo", "ttft:1s", "--workers", "100000"], "at most 256 processes"),
        # 9: arrivals so far from 0 that float seconds lose the latency
        (["simulate", "--workload", "poisson", "--rate-scale", "1e-14"], "from 1e-06"),
        (["simulate", "--workload", "poisson", "--request-rate", "1e-300"], "from 1e-06"),
        (
            ["simulate", "--workload", "poisson", "--num-prompts", "50", "--request-rate", "1e-5"],
            "at most 1,000,000 s of arrivals",
        ),
        # 11: flags a workload does not take were ignored without a word
        (["simulate", "--workload", "poisson", "--prompt-len", "100"], "--prompt-len shapes"),
        (["simulate", "--workload", "x.csv", "--streams", "3"], "--streams shapes"),
        (["simulate", "--workload", "x.csv", "--seed", "5"], "--seed is poisson's seed"),
        (["capacity", "--slo", "ttft:1s", "--workload", "x.csv", "--seed", "5"], "poisson's"),
        (["simulate", "--workload", "x.csv", "--random-input-len", "5"], "shapes poisson's"),
        (["simulate", "--workload", "poisson", "--random-range-ratio", "1"], "[0, 1)"),
        # 13: an empty archive folder meant the current one; numbers in other scripts' digits
        (["runs", "--results", ""], "must name a folder"),
        (["compare", "a", "b", "--results", ""], "must name a folder"),
        (["simulate", "--chunk", "1_000"], "must be a positive integer"),
        (["simulate", "--chunk", "١٠٠"], "must be a positive integer"),
        (["capacity", "--slo", "ttft:١s"], "is not a duration"),
        (["capacity", "--slo", "ttft:1s", "--deployment", "chunked:١٠"], "chunked takes"),
        (["capacity", "--slo", "ttft:1s", "--deployment", "chunked:1_0"], "chunked takes"),
    ],
)
def test_a_bound_is_refused_when_parsed_before_any_work(argv, words, capsys, no_work):
    line = usage_error(argv, capsys)
    assert words in line, line


def test_a_usage_error_is_short(capsys):
    """Issue 21: the error, and where the usage is; not a 14-line usage block above it."""
    with pytest.raises(SystemExit):
        main(["capacity", "--slo", "nonsense"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("prefill-bench capacity: error: argument --slo")
    assert err[0].endswith("(usage: prefill-bench capacity --help)")


def test_the_default_chunk_is_checked_against_the_trace_before_simulating(
    tmp_path, capsys, monkeypatch
):
    """8: the chunk bound is per run (all prompts), not per prompt; a trace's prompts are known
    once it is read, and then checked before anything is simulated."""
    from pytest_prefill.commands import simulate as command

    def simulated(*args, **kwargs):
        raise AssertionError("simulated before checking the chunked iterations")

    monkeypatch.setattr(command, "chunk_sweep", simulated)
    rows = [{"timestamp": i, "input_length": 500_000, "output_length": 1} for i in range(200)]
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    line = usage_error(["simulate", "--workload", str(path), "--max-model-len", "1000000"], capsys)
    assert "prompts into" in line and "at most 1,000,000 a run" in line


def test_a_trace_spanning_more_than_the_bound_is_refused_before_simulating(
    tmp_path, capsys, monkeypatch
):
    """9: a JSONL whose arrivals span 2·10⁶ s (its own timestamps, or rescaled) would print
    latencies float seconds cannot carry; refused once read, before simulating."""
    from pytest_prefill.commands import simulate as command

    monkeypatch.setattr(command, "chunk_sweep", lambda *a, **k: pytest.fail("simulated"))
    path = tmp_path / "far.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 5, "output_length": 2}\n'
        '{"timestamp": 2e9, "input_length": 5, "output_length": 2}\n'
    )
    assert "its arrivals span 2,000,000 s" in usage_error(
        ["simulate", "--workload", str(path)], capsys
    )
    path.write_text(
        '{"timestamp": 0, "input_length": 5, "output_length": 2}\n'
        '{"timestamp": 2000, "input_length": 5, "output_length": 2}\n'
    )
    line = usage_error(["simulate", "--workload", str(path), "--rate-scale", "1e-6"], capsys)
    assert "its arrivals span 2,000,000 s" in line and "--window" in line


def test_a_workload_within_the_span_bound_gives_latencies_independent_of_its_offset(capsys):
    """9: within the bound the latencies do not depend on where the arrivals sit: the lightest
    load the command takes (50 prompts at the lowest rate it accepts, 5·10⁵ s) gives each request
    its isolated TTFT, exactly as at a high rate."""
    from pytest_prefill.plan.metrics import serving_metrics
    from pytest_prefill.plan.workloads import resolve_workload

    cost = get_preset("lab-laptop").cost
    ttfts = []
    for rate in (1e-4, 1e3):
        load = resolve_workload("poisson", num_prompts=50, request_rate=rate).requests
        metrics = serving_metrics(simulate("chunked", list(load), cost, chunk=900))
        ttfts.append(metrics.ttft.median)
    alone = serving_metrics(simulate("chunked", list(load[:1]), cost, chunk=900)).ttft.median
    assert ttfts[0] == pytest.approx(alone, rel=1e-6)
    assert ttfts[1] > ttfts[0]  # at a high rate the requests queue


def test_a_timeline_svg_draws_a_bounded_number_of_bars_by_default(tmp_path, capsys):
    """5: a 10,000-chunk prompt drawn whole was a bar per chunk (167 MB at 10⁶ chunks); the
    default draws the earliest 2,000 per policy and says what it left out."""
    from pytest_prefill.commands.timeline import DEFAULT_MAX_BARS

    out = tmp_path / "t.svg"
    argv = ["timeline", "--prompt-len", "100000", "--chunk", "10", "--until", "1000"]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{DEFAULT_MAX_BARS:,}" in printed and "not shown" in printed
    assert out.read_text().count("<rect") < 3 * (DEFAULT_MAX_BARS + 100)


# --- issue 21: reading the capacity answer, output a new user meets --------------------------------


def test_capacity_gate_fails_when_goodput_per_device_fell(tmp_path, capsys):
    """7: a history and regression gate for simulated results, like pytest-benchmark's
    --benchmark-compare-fail: a baseline search, then a search that serves less per device."""
    base = tmp_path / "base.json"
    argv = ["capacity", "--slo", "ttft:1s,tpot:100ms", "--num-prompts", "60", "--workers", "1"]
    argv += ["--deployment", "shared", "--deployment", "chunked:256"]
    assert main([*argv, "--json", str(base)]) == 0
    capsys.readouterr()
    assert main([*argv, "--baseline", str(base), "--fail-above", "5"]) == 0
    assert "PASS: no deployment's goodput per device fell" in capsys.readouterr().out
    doubled = json.loads(base.read_text())
    for r in doubled["results"]:
        r["goodput_per_device"] *= 2
    base.write_text(json.dumps(doubled))
    assert main([*argv, "--baseline", str(base), "--fail-above", "5"]) == 1
    out = capsys.readouterr().out
    assert "FAIL: goodput per device fell more than" in out and "shared ×1" in out
    assert "gates against a --baseline" in usage_error([*argv, "--fail-above", "5"], capsys)


def test_a_jsonl_workload_says_its_time_unit_and_warns_when_it_looks_like_seconds(tmp_path, capsys):
    """5: timestamps in seconds were read as milliseconds without a word (5 requests over
    0.0 s, 2000 req/s); and the title carried the trace's absolute path."""
    path = tmp_path / "seconds.jsonl"
    path.write_text(
        "".join(f'{{"timestamp": {t}, "input_length": 64, "output_length": 4}}\n' for t in range(5))
    )
    assert (
        main(
            [
                "capacity",
                "--workload",
                str(path),
                "--slo",
                "ttft:1s",
                "--deployment",
                "shared",
                "--workers",
                "1",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    table = next(i for i, line in enumerate(lines) if line.startswith("deployment "))
    head = "\n".join(lines[:table])
    assert "Workload: seconds.jsonl (timestamps read as milliseconds)" in head
    assert "WARNING: seconds.jsonl's timestamps were read as milliseconds" in head
    assert str(tmp_path) not in "\n".join(lines)


def test_prompts_capped_at_the_model_length_are_said_above_the_table(tmp_path, capsys):
    """5: the --max-model-len notice printed below the table."""
    path = tmp_path / "long.jsonl"
    path.write_text(
        "".join(
            f'{{"timestamp": {t * 100}, "input_length": {64 + 9000 * (t % 2)}, "output_length": 4}}\n'
            for t in range(6)
        )
    )
    argv = ["capacity", "--workload", str(path), "--slo", "ttft:1s", "--deployment", "shared"]
    assert main([*argv, "--workers", "1", "--max-model-len", "4096"]) == 0
    lines = capsys.readouterr().out.splitlines()
    capped = next(i for i, line in enumerate(lines) if "were capped at it" in line)
    assert capped < next(i for i, line in enumerate(lines) if line.startswith("deployment "))


def test_a_missing_azure_trace_names_the_dataset(monkeypatch, tmp_path, capsys):
    """6: the error named the missing path, not the dataset or where it comes from."""
    import pytest_prefill.plan.workloads as workloads

    monkeypatch.setattr(workloads, "named_trace_path", lambda name: None)
    line = usage_error(["simulate", "--workload", "azure-conv"], capsys)
    assert "Azure LLM inference trace 2023" in line and "AzurePublicDataset" in line
    assert "azure-conv.csv.gz" in line  # where it looked


def test_runs_on_an_empty_archive_says_how_to_make_one(tmp_path, capsys):
    """6: 'no machines archived under results' with no hint."""
    line = usage_error(["runs", "--results", str(tmp_path)], capsys)
    assert "calibrate --save" in line and "--prefill-save" in line


def test_compare_says_when_the_two_sides_measured_different_models(tmp_path, capsys):
    """6: tiny on one CPU against small on another reported +1924.3% and FAIL without saying
    the models differ."""
    cost = get_preset("lab-laptop").cost
    for name, model in (("a.json", "tiny"), ("b.json", "small")):
        (tmp_path / name).write_text(
            json.dumps(
                {
                    "kind": "pytest-prefill/calibration",
                    "cost_model": cost.to_dict(),
                    "provenance": {"model": model, "dtype": "float32"},
                }
            )
        )
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "NOTE: the two sides measured different setups (model tiny vs small)" in out


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_parses_alone_as_among_all(command, capsys):
    """main builds only the parser of the command typed: its help, every option and default
    in it, is the whole parser's."""
    from pytest_prefill.cli import build_parser

    helps = []
    for parser in (build_parser(command), build_parser()):
        with pytest.raises(SystemExit):
            parser.parse_args([command, "--help"])
        helps.append(capsys.readouterr().out)
    assert helps[0] == helps[1] and f"prefill-bench {command}" in helps[0]


@pytest.mark.parametrize(
    ("missing", "argv", "extra"),
    [("torch", [], "measure"), ("transformers", [], "measure"), ("gguf", ["--gguf"], "serve")],
)
def test_make_model_without_its_imports_names_the_extra_in_one_line(
    missing, argv, extra, monkeypatch, tmp_path, capsys
):
    """Issue 50 item 8: make-model without torch ended in a 15-line traceback."""
    import sys

    monkeypatch.setitem(sys.modules, missing, None)  # importing it raises ImportError
    folder = tmp_path / "m"
    with pytest.raises(SystemExit) as info:
        main(["make-model", "tiny", str(folder), *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert f"make-model needs {missing}" in err and f'pip install ".[{extra}]"' in err
    assert not folder.exists()


def test_memory_the_user_did_not_type_is_said_to_come_from_the_preset(capsys):
    """Issue 50 item 11: --model llama-3-8b without --device-memory blamed "16 GiB" that the
    user never typed (the lab-laptop preset's device)."""
    line = usage_error(["capacity", "--model", "llama-3-8b", "--slo", "ttft:2s"], capsys)
    assert line.index("no --device-memory given") < line.index("16 GiB")
    assert "lab-laptop preset" in line


@pytest.mark.parametrize(
    ("argv", "near"),
    [
        (["capacity", "--slo", "ttft:1s", "--devics", "3"], "--devices"),
        (["simulate", "--chunks", "3"], "--chunk"),
        (["timeline", "--text", "--windw", "0:1"], "--window"),
    ],
)
def test_a_flag_typo_is_answered_by_its_subcommand_with_the_near_match(argv, near, capsys):
    """Issue 50 item 13: a subcommand's flag typo pointed at the top-level help, no near match."""
    line = usage_error(argv, capsys)
    assert line.startswith(f"prefill-bench {argv[0]}: error: unrecognized arguments")
    assert f"did you mean {near}?" in line and f"prefill-bench {argv[0]} --help" in line


def test_simulate_and_timeline_name_the_model_and_its_memory_after_the_cost(capsys):
    """Both commands run on the cost for one instance of --model: the cost's source, then the
    model's and the memory's lines (simulate prints a line each; the timeline's title joins
    them to the source with '; ')."""
    model = ["--model", "qwen3-0.6b", "--device-memory", "16"]
    assert main(["simulate", *model]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Cost model: ") and out[1].startswith("Model: qwen3-0.6b")
    assert out[2].startswith("  KV at TP=1: ")
    assert main(["timeline", "--text", "--width", "10000", *model]) == 0
    lines = capsys.readouterr().out.splitlines()
    cost = next(line for line in lines if line.startswith("Cost model: "))
    assert "; Model: qwen3-0.6b" in cost and ";   KV at TP=1: " in cost
