"""``prefill-bench calibrate``, ``demo`` and ``simulate --cost measure`` on the tiny preset, with
short sweeps (the module constants are patched; prompt lengths given on the command line are
honoured). Bad arguments are usage errors."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from pytest_prefill.cli import main  # noqa: E402
from pytest_prefill.lab.falsifier import CLAIM  # noqa: E402
from pytest_prefill.measure import calibrate as cal  # noqa: E402
from pytest_prefill.measure import sweep as sweeps  # noqa: E402
from pytest_prefill.measure.calibration_document import Calibration  # noqa: E402
from pytest_prefill.plan.cost_document import load_cost  # noqa: E402

TINY = ["--model", "tiny", "--device", "cpu"]


@pytest.fixture(autouse=True)
def short_sweeps(monkeypatch, one_torch_thread):
    monkeypatch.setattr(sweeps, "CPU_PROMPT_LENS", (16, 32, 48, 64))
    monkeypatch.setattr(sweeps, "DEFAULT_CHUNKS", ((16, 32),))
    monkeypatch.setattr(sweeps, "DEFAULT_FUSED", ((8, 16, 2),))
    monkeypatch.setattr(sweeps, "DEFAULT_CACHE_LENS", (16, 128))
    monkeypatch.setattr(sweeps, "DEFAULT_BATCH_SIZES", (1, 2))
    monkeypatch.setattr(sweeps, "BATCH_CACHE_LEN", 16)


def test_calibrate_prints_the_report_and_writes_json(tmp_path, capsys):
    path = tmp_path / "cal.json"
    assert main(["calibrate", *TINY, "--dry-run", "--json", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "C* = (decode_step - pass_overhead) / prefill_per_token" in out
    for section in (
        "provenance",
        "Prefill and chunk passes",
        "per cached-token count",
        "per batch size",
        "Cost model",
        "pass overhead is",
    ):
        assert section in out, section
    assert "prefill" in err and "decode" in err  # progress goes to stderr
    document = json.loads(path.read_text())
    calibration = Calibration.from_dict(document)
    assert calibration.provenance["dry_run"] is True
    assert calibration.provenance["repeats"] == cal.DRY_RUN_REPEATS
    cost, origin = load_cost(str(path))
    assert cost == calibration.cost and str(path) in origin
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_demo_prints_the_claim_first_and_ends_with_a_verdict(tmp_path, capsys):
    path = tmp_path / "demo.json"
    status = main(["demo", *TINY, "--dry-run", "--prompt-len", "64", "--json", str(path)])
    out = capsys.readouterr().out
    assert out.startswith(f"Falsifier: {CLAIM}")
    last = [line for line in out.splitlines() if line.strip()][-2]  # before "wrote PATH"
    assert last.startswith(("HOLDS", "FAILS"))
    assert "x baseline" in out and "cached tokens" in out
    verdict = json.loads(path.read_text())["verdict"]
    assert verdict in ("HOLDS", "FAILS")
    assert status == (1 if verdict == "FAILS" else 0), "CI gates on the exit status"


def test_demo_takes_the_chunk_from_a_cost_preset(capsys):
    argv = ["demo", *TINY, "--repeats", "1", "--warmup", "0", "--prompt-len", "256"]
    status = main([*argv, "--cost", "lab-laptop"])
    out = capsys.readouterr().out
    assert "Chunk 121 tokens (C* of the given cost model)" in out
    assert status == (1 if "\nFAILS" in out else 0)


def test_simulate_can_measure_its_cost_model(capsys):
    assert main(["simulate", "--cost", "measure", *TINY, "--dry-run", "--prompt-len", "64"]) == 0
    out = capsys.readouterr().out
    assert "Cost model: measured now: tiny" in out and "shared" in out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["calibrate", "--device", "gpu"], "--device"),
        (["calibrate", "--repeats", "0"], "--repeats"),
        (["calibrate", "--warmup", "-1"], "--warmup"),
        (["calibrate", "--dtype", "int8"], "--dtype"),
        (["demo", "--prompt-len", "0"], "--prompt-len"),
        (["demo", "--chunk", "x"], "--chunk"),
        (["demo", *TINY, "--cost", "no-such-preset"], "unknown cost"),
        (["calibrate", "--model", "nobody/no-such-model", "--device", "cpu"], "looked in"),
    ],
)
def test_bad_arguments_are_usage_errors(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert words in capsys.readouterr().err


def test_ctrl_c_leaves_no_json(tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cal, "calibrate", interrupted)
    path = tmp_path / "cal.json"
    assert main(["calibrate", *TINY, "--json", str(path)]) == 130
    assert list(tmp_path.iterdir()) == []
    assert "interrupted" in capsys.readouterr().err


def test_measuring_without_torch_is_a_usage_error(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # as if torch were not installed
    with pytest.raises(SystemExit) as exit_info:
        main(["calibrate", *TINY])
    assert exit_info.value.code == 2
    assert ".[measure]" in capsys.readouterr().err
