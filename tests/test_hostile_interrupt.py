"""``verify`` ended by a signal keeps what it measured, as ``bench`` does: its ``--json`` is a
verify document marked interrupted that ``--rank`` reads back, the probe cut short counted
neither met nor missed, its server stopped, and its status the shell's for that signal."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from hostile import write_words
from hostile_engines import SERVES, environment, pids_of, running, signalled, verify_launch

from pytest_prefill.measure.calibrate import Calibration
from pytest_prefill.serve.calibration.calibration_fit import RequestOverhead
from pytest_prefill.serve.calibration.server_calibration import ServerCalibration, ServerSweep
from pytest_prefill.sim import CostModel
from pytest_prefill.verify.result import read_verify

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="process groups, /proc")
GONE_WITHIN = 15.0  # SIGTERM, then SIGKILL after the launcher's grace


def _cost(tmp_path) -> str:
    """A server calibration (none measured now: the reference server's TTFT does not grow with
    the prompt) under which each probe lasts seconds: the signal lands mid-probes."""
    cost = CostModel(prefill_pass_overhead=3e-3, prefill_per_token=1e-7, decode_step_base=6e-4)
    calibration = ServerCalibration(
        Calibration(cost, {}, (), {}, ()),
        RequestOverhead(0.0, 0.0, 0.0, "none"),
        (),
        ServerSweep(16),
    )
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(calibration.to_dict()))
    return str(path)


def _verify(tmp_path, *more: str) -> list[str]:
    argv = verify_launch(tmp_path, SERVES, "--engine", "vllm", "--no-load-check")
    write_words(tmp_path / "model")
    more = ("--ignore-steal", "--repeats", "1", "--json", str(tmp_path / "out.json"), *more)
    return [*argv, *more]


def _interrupt(
    tmp_path, signum: int, when: str, *more: str
) -> tuple[subprocess.Popen[str], str, str]:
    """The command sent ``signum`` once its progress says ``when``."""
    return signalled(_verify(tmp_path, *more), environment(tmp_path / "pids"), signum, when)


def _none_left(tmp_path) -> None:
    started = pids_of(tmp_path / "pids")
    deadline = time.monotonic() + GONE_WITHIN
    while any(running(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert started and not [pid for pid in started if running(pid)]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_mid_probes_keeps_the_probes_that_finished(tmp_path, signum):
    more = ("--flags", "tokens=32", "--cost", _cost(tmp_path), "--short-probes")
    command, before, after = _interrupt(tmp_path, signum, "probe 1:", *more)
    name = signal.Signals(signum).name
    assert command.returncode == 128 + signum, before + after
    assert "Traceback" not in after
    assert f"kept in {tmp_path / 'out.json'}" in after
    result = read_verify(str(tmp_path / "out.json"))  # what --rank reads
    assert result.interrupted == name
    assert len(result.results) == 1  # the second flag set never started
    knee = result.results[0].measured
    assert knee is not None and knee.probes  # probe 1 finished before the signal
    assert all(p.sent and not p.failed for p in knee.probes)  # none of them cut short
    assert knee.ended is not None and f"interrupted by {name}" in knee.ended
    assert knee.estimate is None and result.compared == ()  # no knee from a search cut short
    assert result.results[0].ended is not None and name in result.results[0].ended
    _none_left(tmp_path)


def test_a_signal_during_calibration_ends_its_flag_set_in_one_line(tmp_path):
    command, before, after = _interrupt(tmp_path, signal.SIGHUP, "warm-up done")
    assert command.returncode == 128 + signal.SIGHUP, before + after
    assert "Traceback" not in after
    result = read_verify(str(tmp_path / "out.json"))
    assert result.interrupted == "SIGHUP" and len(result.results) == 1
    (only,) = result.results
    assert only.measured is None and only.calibration is None
    assert only.ended == "≤16 tok: interrupted by SIGHUP during calibration"
    _none_left(tmp_path)


@pytest.mark.parametrize(
    ("engine", "status"),
    [
        (("--engine", "vllm"), 0),  # the normal way out: the flag set measured
        ((), 2),  # an error once started: the server names itself "openai", which has no profile
    ],
)
def test_every_other_way_out_leaves_nothing_running(tmp_path, engine, status):
    argv = _verify(tmp_path, "--cost", _cost(tmp_path), "--short-probes", "--max-probes", "2")
    if not engine:
        at = argv.index("--engine")
        del argv[at : at + 2]
    done = subprocess.run(
        argv, env=environment(tmp_path / "pids"), capture_output=True, text=True, timeout=180
    )
    assert done.returncode == status, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    _none_left(tmp_path)
