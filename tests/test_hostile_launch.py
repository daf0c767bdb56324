"""A server ``verify --launch`` started is stopped on every way out: Ctrl-C or SIGTERM or
SIGHUP while it waits for ``/health``, and an engine that exits at start says its status and
its log."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from hostile_engines import (
    EXITS_AT_START,
    NEVER_READY,
    SERVES,
    environment,
    pids_of,
    running,
    signalled,
    verify_launch,
    wait_for_pids,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="process groups, /proc")


_verify = verify_launch


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_waiting_for_health_stops_the_server(tmp_path, signum):
    pids = tmp_path / "pids"
    command = subprocess.Popen(
        _verify(tmp_path, NEVER_READY),
        env=environment(pids),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        started = wait_for_pids(pids, 2)
        time.sleep(0.5)
        command.send_signal(signum)
        _, err = command.communicate(timeout=60)
    finally:
        if command.poll() is None:
            command.kill()
    assert command.returncode != 0, err
    deadline = time.monotonic() + 15  # SIGTERM, then SIGKILL after the grace
    while any(running(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in started if running(pid)], err.decode()
    assert b"Traceback" not in err


def test_an_engine_that_exits_at_start_says_its_status_and_log(tmp_path):
    pids = tmp_path / "pids"
    done = subprocess.run(
        _verify(tmp_path, EXITS_AT_START),
        env=environment(pids),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert pids_of(pids), done.stderr
    out = done.stdout + done.stderr
    assert "status 3" in out
    assert "prefill-server-" in out and ".log" in out
    assert "no such model" in out
    assert done.returncode != 0


def test_health_timeout_bounds_the_wait_and_stops_the_server(tmp_path):
    pids = tmp_path / "pids"
    done = subprocess.run(
        _verify(tmp_path, NEVER_READY, "--health-timeout", "2"),
        env=environment(pids),
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert "not ready within 2 s" in out and "prefill-server-" in out
    started = pids_of(pids)
    deadline = time.monotonic() + 15
    while any(running(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert started and not [pid for pid in started if running(pid)]


def test_sigterm_mid_run_stops_the_server_and_its_log_was_named(tmp_path):
    pids = tmp_path / "pids"
    argv = _verify(tmp_path, SERVES, "--tokenizer", str(tmp_path / "model"))
    command, said, rest = signalled(argv, environment(pids), signal.SIGTERM, "up, its log")
    started = pids_of(pids)
    assert started and "up, its log" in said and "prefill-server-" in said, said + rest
    assert command.returncode != 0
    deadline = time.monotonic() + 15
    while any(running(pid) for pid in started) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in started if running(pid)]
