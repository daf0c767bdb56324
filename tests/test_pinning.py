"""A launched server's compute kept on a core of its own (serve.pinning)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pytest_prefill.serve.launch.launchers import Launcher, vllm_server
from pytest_prefill.serve.launch.process import (
    Pinning,
    available_cores,
    compute_processes,
    engine_core,
    group_processes,
    pin_server,
    split_cores,
)

CORES = available_cores()
two_cores = pytest.mark.skipif(
    CORES is None or len(CORES) < 2 or not os.path.isdir("/proc"),
    reason="pinning needs Linux (/proc, sched_setaffinity) and 2 or more cores",
)


def _threads_cores(pid: int) -> set[frozenset[int]]:
    return {frozenset(os.sched_getaffinity(int(tid))) for tid in os.listdir(f"/proc/{pid}/task")}


@pytest.mark.parametrize("cores", [[0, 1], [3, 1, 2], [5, 7, 6, 4]])
def test_the_engine_gets_the_first_core_and_everything_else_the_rest(cores):
    mine, rest = split_cores(cores)
    assert mine == (min(cores),)
    assert set(mine) | set(rest) == set(cores) and not set(mine) & set(rest)


@pytest.mark.parametrize("cores", [[], [2]])
def test_fewer_than_two_cores_cannot_be_split(cores):
    with pytest.raises(ValueError, match="2 or more cores"):
        split_cores(cores)


def test_vllms_compute_is_its_worker_and_one_process_servers_have_none_apart():
    processes = [(10, "python"), (11, "python"), (12, "VLLM::EngineCor"), (13, "VLLM::Worker")]
    assert compute_processes("vllm", processes) == [(13, "VLLM::Worker")]
    assert compute_processes("transformers", processes) == []
    assert compute_processes("vllm", processes[:3]) == []


def test_the_vllm_command_binds_its_openmp_thread_only_when_asked():
    _, env = vllm_server("python", "model", 8000, core=3)
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "3"
    _, env = vllm_server("python", "model", 8000)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env


def test_a_launcher_pins_by_default_and_the_vllm_core_is_the_engines(tmp_path):
    launcher = Launcher("vllm", str(tmp_path), "python")
    assert launcher.pin
    _, env = launcher.command(256, 8, 8000)
    core = engine_core()
    assert env.get("VLLM_CPU_OMP_THREADS_BIND") == (None if core is None else str(core))
    _, env = Launcher("vllm", str(tmp_path), "python", pin=False).command(256, 8, 8000)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env


def test_nothing_pinned_says_why_and_gives_back_nothing():
    pinning = Pinning(why_not="this process may use 1 core")
    assert not pinning.pinned and pinning.sentence() == "not pinned: this process may use 1 core"
    pinning.release()  # nothing to give back
    assert pinning.to_dict()["why_not"] == "this process may use 1 core"


@two_cores
def test_a_server_group_is_pinned_apart_and_this_process_gets_its_cores_back():
    # a leader (the frontend) that starts a child naming itself as vLLM's worker does
    worker = "open('/proc/self/comm', 'w').write('VLLM::Worker'); import time; time.sleep(30)"
    code = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {worker!r}]); "
    code += "time.sleep(30)"
    leader = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    before = os.sched_getaffinity(0)
    try:
        for _ in range(200):
            processes = group_processes(leader.pid)
            if len(processes) == 2 and processes[1][1] == "VLLM::Worker":
                break
            subprocess.run(["sleep", "0.05"], check=True)
        assert len(processes) == 2 and processes[0][0] == leader.pid
        pinning = pin_server("vllm", leader.pid)
        assert pinning.pinned, pinning.why_not
        mine, rest = split_cores(sorted(before))
        assert pinning.engine_cores == mine and pinning.other_cores == rest
        assert _threads_cores(processes[1][0]) == {frozenset(mine)}
        assert _threads_cores(leader.pid) == {frozenset(rest)}
        assert _threads_cores(os.getpid()) == {frozenset(rest)}
        assert f"alone on core(s) {mine[0]};" in pinning.sentence()
        pinning.release()
        assert _threads_cores(os.getpid()) == {frozenset(before)}
    finally:
        os.sched_setaffinity(0, before)
        os.killpg(leader.pid, 9)
        leader.wait()


@two_cores
@pytest.mark.parametrize(
    "engine,why",
    [("vllm", "no vllm compute process"), ("transformers", "one process"), ("llama.cpp", "one")],
)
def test_a_server_with_no_compute_process_apart_is_left_as_it_is(engine, why):
    leader = subprocess.Popen(["sleep", "30"], start_new_session=True)
    before = os.sched_getaffinity(0)
    try:
        pinning = pin_server(engine, leader.pid)
        assert not pinning.pinned and why in (pinning.why_not or "")
        assert os.sched_getaffinity(0) == before
        assert _threads_cores(leader.pid) == {frozenset(before)}
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()


@two_cores
def test_stopping_a_pinned_server_gives_this_process_its_cores_back():
    from pytest_prefill.serve.launch.process import free_port, reference_server, start_server

    port = free_port()
    argv, env = reference_server(port, 0.01, 0.002)
    before = os.sched_getaffinity(0)
    server = start_server(argv, port, env=env, timeout=30)
    try:
        mine, rest = split_cores(sorted(before))
        os.sched_setaffinity(0, rest)  # as pin_server leaves this process
        server.pinning = Pinning(mine, rest, client_before=tuple(sorted(before)))
        assert os.sched_getaffinity(0) == set(rest)
    finally:
        server.stop()
    assert _threads_cores(os.getpid()) == {frozenset(before)}
