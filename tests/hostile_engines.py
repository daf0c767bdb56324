"""Engines written to misbehave, for the launch tests (tests/test_hostile_launch.py): shell
scripts given as ``verify --launch vllm --program`` (what would be vLLM's Python), each writing
its PID and its child's to ``$PIDS`` so that a test can tell whether anything outlived the
command."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time

NEVER_READY = """#!/bin/sh
echo $$ >> "$PIDS"
sleep 300 &
echo $! >> "$PIDS"
wait
"""
# The reference server on the port the launcher gives (its --port): healthy, so the run goes on.
SERVES = """#!/bin/sh
echo $$ >> "$PIDS"
while [ $# -gt 0 ]; do
  if [ "$1" = "--port" ]; then PORT=$2; fi
  shift
done
exec "$PYTHON" -m pytest_prefill.serve.launch.reference --port "$PORT" --ttft 0.01 --gap 0.002
"""
EXITS_AT_START = """#!/bin/sh
echo $$ >> "$PIDS"
echo "engine: no such model" >&2
exit 3
"""


def write_engine(folder, script: str) -> str:
    """``script`` as an executable file in ``folder``; its path."""
    path = folder / "engine.sh"
    path.write_text(script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def pids_of(path) -> list[int]:
    try:
        return [int(line) for line in path.read_text().split()]
    except FileNotFoundError:
        return []


def wait_for_pids(path, count: int, seconds: float = 60.0) -> list[int]:
    """The PIDs the engine wrote, once ``count`` of them are there."""
    deadline = time.monotonic() + seconds
    while len(pids := pids_of(path)) < count:
        assert time.monotonic() < deadline, f"the engine did not start within {seconds:g} s"
        time.sleep(0.1)
    return pids


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def environment(pids) -> dict[str, str]:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "PIDS": str(pids),
        "PYTHON": sys.executable,
        "PYTHONPATH": root + (os.pathsep + path if path else ""),
    }


def signalled(
    argv: list[str], env: dict[str, str], signum: int, when: str
) -> tuple[subprocess.Popen[str], str, str]:
    """``argv`` run and sent ``signum`` once a line of its stderr holds ``when``: the process
    (ended), what its stderr said until then, and what it said after (stdout and stderr)."""
    command = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    before = []
    try:
        assert command.stderr is not None
        for line in command.stderr:
            before.append(line)
            if when in line:
                break
        command.send_signal(signum)
        out, err = command.communicate(timeout=120)
    finally:
        if command.poll() is None:
            command.kill()
    return command, "".join(before), out + err


def verify_launch(folder, script: str, *more: str) -> list[str]:
    """``verify --launch vllm`` with ``script`` (in ``folder``) as vLLM's Python, on an empty
    model folder ``folder/model``: one flag set of 16 tokens, a 1 s TTFT bound, unpinned."""
    (folder / "model").mkdir()
    engine = write_engine(folder, script)
    return [
        sys.executable,
        "-m",
        "pytest_prefill",
        "verify",
        "--launch",
        "vllm",
        "--program",
        engine,
        "--model",
        str(folder / "model"),
        "--flags",
        "tokens=16",
        "--slo",
        "ttft:1s",
        "--no-pin",
        *more,
    ]
