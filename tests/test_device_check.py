"""The device check, rehearsed on the CPU: the preflight agrees with the HF forward on the tiny
preset; every file lands in OUT as it is made, so a run killed partway still holds what it made
and a run out of budget still holds env.txt, the preflight and a summary saying what is
missing; the commit comes from the environment where .git does not travel; the summary reads
whatever the stages brought back."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pytest_prefill.lab.device_check import summary

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "device-check.sh"
needs_bash = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("timeout") is None,
    reason="the device check is a bash script using timeout",
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_ADD"))}
    env.update(DEVICE="cpu", MODEL="tiny", PYTHON=sys.executable, **extra)
    return env


def test_the_preflight_of_the_tiny_model_passes_every_check():
    pytest.importorskip("torch")
    from pytest_prefill.lab.preflight import preflight, preflight_lines
    from pytest_prefill.measure.models import load_model

    document = preflight(load_model("tiny", device="cpu"))
    names = [c["name"] for c in document["checks"]]
    assert names == [
        "placement and dtype",
        "packed pass vs HF forward",
        "chunked over the cache vs whole prefill",
        "batched decode rows vs HF forward",
    ]
    assert document["ok"], preflight_lines(document)
    assert all(c["relative_error"] <= c["limit"] for c in document["checks"][1:])
    assert set(document["kernels"]) == {
        "whole prompt (512 tokens)",
        "chunk of 128 over 384 cached",
        "decode rows (4, masked)",
    }
    assert all(probe["runs_on"] for probe in document["kernels"].values())


@needs_bash
def test_stages_without_time_left_still_brings_back_env_preflight_and_summary(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "out"
    commit = "0123456789abcdef0123456789abcdef01234567"
    done = subprocess.run(
        ["bash", str(SCRIPT), str(out)],
        env=_env(
            CAL_LIMIT="5", FALSIFIER_LIMIT="5", FIDELITY_LIMIT="5", PYTEST_PREFILL_COMMIT=commit
        ),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0  # the stages were not run: not a pass
    files = sorted(p.name for p in out.iterdir())
    assert files == ["env.txt", "preflight.json", "pytest-gpu.txt", "summary.txt"], done.stdout
    assert f"commit: {commit}" in (out / "env.txt").read_text()
    assert json.loads((out / "preflight.json").read_text())["ok"] is True
    text = (out / "summary.txt").read_text()
    assert "preflight: OK" in text and "calibration: MISSING" in text
    assert "not brought back: calibration, falsifier, fidelity" in text
    assert (out / "pytest-gpu.txt").read_text().count("not run: 5 s left for it") == 3


@needs_bash
def test_killed_partway_the_files_made_so_far_are_in_out(tmp_path):
    out = tmp_path / "out"
    process = subprocess.Popen(
        ["bash", str(SCRIPT), str(out)],
        env=_env(),
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not (out / "env.txt").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)  # as the device tool stops a command at its limit
    process.wait()
    assert (out / "env.txt").is_file()
    assert "commit: " in (out / "env.txt").read_text()
    assert not [p for p in out.iterdir() if p.name.endswith(".part")]  # nothing half-copied


def test_the_summary_reads_what_the_stages_brought_back(tmp_path):
    calibration = {
        "calibration": {
            "chunk_star": 1234.4,
            "chunk_star_by_context": {"0": 1234.4, "2048": 900.2},
            "recommendation": "chunked",
            "recommended_chunk": 900,
            "held_out_median_error": 0.042,
            "refusals": [{"constant": "prefill_per_pair"}],
            "floor": {"value": 0.012, "knee": 512},
            "provenance": {
                "model": "qwen3-0.6b",
                "device_name": "NVIDIA H100",
                "dtype": "bfloat16",
                "runner": "engine packed pass",
                "host_share": {"median": 0.97, "line": "HOST-BOUND: the eager engine"},
                "peak_device_memory_bytes": 3 * 2**30,
            },
        }
    }
    falsifier = {
        "verdicts": [{"name": "falsifier", "verdict": "HOLDS", "sentence": "claim", "detail": "d"}],
        "tables": [{"data": {"chunk": 900, "chunk_source": "C* of file x"}}],
    }
    (tmp_path / "run-calibration.json").write_text(json.dumps(calibration))
    (tmp_path / "run-falsifier.json").write_text(json.dumps(falsifier))
    text = "\n".join(summary(str(tmp_path)))
    assert "C* = 1234 tokens; by context: 0: 1234, 2048: 900" in text
    assert "held-out error 4.2%" in text and "host share 97%: HOST-BOUND" in text
    assert "refused (recorded as 0): prefill_per_pair" in text and "3.00 GiB" in text
    assert "falsifier: HOLDS -- d" in text and "chunk 900 (C* of file x)" in text
    assert "preflight: MISSING" in text and "fidelity: MISSING" in text
    assert "not brought back: fidelity" in text
