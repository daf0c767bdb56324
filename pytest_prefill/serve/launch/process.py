"""Starting and stopping a local server for a measurement: ``transformers serve`` with
continuous batching, llama.cpp's ``llama-server``, or the reference server; bound to
127.0.0.1, ready when its health endpoint answers, stopped by its PID (its own process group,
so nothing it started outlives it). Standard library only.

Pinning: keeping a launched server's compute apart from everything else on a small CPU. On a
box of a few cores the engine that computes the passes shares them with its own HTTP frontend,
vLLM's engine-core loop and our load generator; under load those take CPU from the passes, so
the server steps slower than its calibration said (vLLM's CPU build on 2 cores: short prompts'
median TPOT about a fifth lower pinned, and the runs' spread less than half). So a launched
server whose compute is a process of its own (vLLM's worker) is pinned: that process gets the
first core this process may use, to itself; every other process of the server and this process
(the load generator) get the rest, given back when the server stops. A server that serves HTTP
and computes in one process (``transformers serve``, ``llama-server``) is not pinned: its
frontend would share the compute's one core (pinned so, ``transformers serve`` calibrated about
twice as fast as it then served under load). Linux only (``os.sched_setaffinity``); elsewhere,
or with fewer than 2 cores, nothing is pinned and the sentence says so."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import FrameType
from typing import Any

from pytest_prefill.plan.engine_commands import ENGINE_COMMANDS
from pytest_prefill.serve.client.http import exchange
from pytest_prefill.serve.client.wire import ServerError, Timeouts, Url

READY_POLL = 0.25
STOP_GRACE = 10.0
LOG_TAIL = 1500
# The servers this process started and has not stopped yet: stopped at exit, whatever the way
# out (an exception, SIGINT, SIGTERM or SIGHUP; SIGKILL cannot be caught).
_LIVE: dict[int, ServerProcess] = {}
STOPPED_BY = (signal.SIGTERM, signal.SIGHUP)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclasses.dataclass
class ServerProcess:
    """A server this process started: its command, PID, URL and log file; ``pinning``: where
    it and this process run, when a launcher pinned them (undone for this process on stop)."""

    argv: tuple[str, ...]
    process: subprocess.Popen[bytes]
    url: Url
    log: str
    pinning: Pinning | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def log_tail(self) -> str:
        try:
            with open(self.log, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError:
            return ""
        return text[-LOG_TAIL:].strip()

    def stop(self, grace: float = STOP_GRACE) -> int | None:
        """SIGTERM its process group (the server is its leader), SIGKILL after ``grace`` s;
        its exit status."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.process.wait()
        _LIVE.pop(self.pid, None)
        if self.pinning is not None:
            self.pinning.release()
        return self.process.returncode


def stop_all() -> None:
    """Stop every server this process started and still runs (at exit)."""
    for server in list(_LIVE.values()):
        server.stop()


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds: each ``finally`` stops its server, then atexit


def stop_on_signals() -> None:
    """Turn SIGTERM and SIGHUP (``timeout``, a cancelled CI job, a closed terminal) into an exit
    that runs ``finally`` blocks and :func:`stop_all`, where they still have their default
    action and this is the main thread (SIGINT already raises KeyboardInterrupt)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOPPED_BY:
        if signal.getsignal(signum) is signal.SIG_DFL:
            signal.signal(signum, _exit_on_signal)


atexit.register(stop_all)


def _healthy(url: Url, path: str) -> bool:
    async def probe() -> bool:
        response = await exchange(url, "GET", path, timeouts=Timeouts(2.0, 5.0))
        return response.status == 200

    try:
        return asyncio.run(probe())
    except ServerError:
        return False


def start_server(
    argv: Sequence[str],
    port: int,
    *,
    env: Mapping[str, str] | None = None,
    ready_path: str = "/health",
    timeout: float = 180.0,
    log: str | None = None,
) -> ServerProcess:
    """Start ``argv`` (a server that will listen on 127.0.0.1:``port``) and wait until
    ``ready_path`` answers 200.

    Raises:
        ServerError: with the end of its log, when it exits or is not ready within ``timeout``
            seconds (it is stopped first).
    """
    stop_on_signals()
    if log is None:
        handle, log = tempfile.mkstemp(prefix="prefill-server-", suffix=".log")
        os.close(handle)
    with open(log, "wb") as out:
        process = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    server = ServerProcess(tuple(argv), process, Url("http", "127.0.0.1", port, ""), log)
    _LIVE[server.pid] = server
    try:
        _wait_ready(server, ready_path, timeout)
    except BaseException:  # Ctrl-C or a signal while it starts: stopped all the same
        server.stop()
        raise
    return server


def _ended(name: str, why: str, server: ServerProcess) -> str:
    """Why a server did not start, its log's path and last line on the first line (what a
    one-line report keeps), then the log's end."""
    tail = server.log_tail()
    last = tail.splitlines()[-1].strip() if tail else "(empty)"
    return f"{name} {why}; its log {server.log} ends: {last}\n{tail}"


def _wait_ready(server: ServerProcess, ready_path: str, timeout: float) -> None:
    process, name = server.process, server.argv[0]
    deadline = time.monotonic() + timeout
    while not _healthy(server.url, ready_path):
        if process.poll() is not None:
            server.stop()
            why = f"exited at start with status {process.returncode}"
            raise ServerError(_ended(name, why, server))
        if time.monotonic() > deadline:
            server.stop()
            why = f"not ready within {timeout:g} s (--health-timeout)"
            raise ServerError(_ended(name, why, server))
        time.sleep(READY_POLL)


@contextlib.contextmanager
def running_server(argv: Sequence[str], port: int, **kwargs: object) -> Iterator[ServerProcess]:
    """:func:`start_server` as a context: stopped by its PID on the way out."""
    server = start_server(argv, port, **kwargs)  # type: ignore[arg-type]
    try:
        yield server
    finally:
        server.stop()


# One thread per engine on a small CPU: oversubscribed, torch went from ~40 ms to 500-850 ms a
# token (ENGINES.md).
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _script_python(executable: str) -> str:
    """The Python a console script runs under (its ``#!`` line)."""
    with open(executable, "rb") as f:
        first = f.readline(4096).decode(errors="replace").strip()
    if not first.startswith("#!") or "python" not in first:
        raise ServerError(f"{executable} is not a Python script: cannot set a sequence cap")
    return first[2:].split()[0]


def transformers_serve(
    model: str,
    port: int,
    *,
    max_batch_tokens: int = 256,
    num_blocks: int = 64,
    max_requests: int | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The command (and environment) of ``transformers serve --continuous-batching`` on the CPU
    with one thread: decodes first, then prompt tokens up to ``max_batch_tokens`` a batch;
    ``max_requests``: at most this many requests a batch (and so running), set by
    ``serve/launch/transformers_capped.py`` since the CLI has no flag for it (None: its default,
    1024)."""
    if max_requests is not None and max_requests < 1:
        raise ValueError(f"max_requests must be at least 1, got {max_requests}")
    executable = shutil.which("transformers", path=os.path.dirname(sys.executable)) or shutil.which(
        "transformers"
    )
    if executable is None:
        raise ServerError(
            "transformers serve is not installed here (pip install 'transformers[serving]')"
        )
    if max_requests is None:
        argv = [executable]
    else:  # -I: not the script's folder on sys.path (serve/client/http.py would hide the standard http)
        capped = os.path.join(os.path.dirname(os.path.abspath(__file__)), "transformers_capped.py")
        argv = [
            _script_python(executable),
            "-I",
            capped,
            "--max-requests-per-batch",
            str(max_requests),
        ]
    argv += ["serve", os.path.abspath(model), "--continuous-batching"]
    argv += ["--device", "cpu", "--host", "127.0.0.1", "--port", str(port)]
    budget_flag = str(ENGINE_COMMANDS["transformers"].budget_flag)
    argv += [budget_flag, str(max_batch_tokens), "--cb-num-blocks", str(num_blocks)]
    return argv, dict(ONE_THREAD)


def llama_server(
    binary: str,
    gguf: str,
    port: int,
    *,
    batch: int = 256,
    slots: int = 8,
    context: int = 32768,
) -> tuple[list[str], dict[str, str]]:
    """The command of llama.cpp's ``llama-server`` with one thread: ``-b`` tokens an iteration
    (decode rows included), ``-np`` slots sharing a unified ``-c`` token KV cache."""
    argv = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "-c", str(context)]
    llama = ENGINE_COMMANDS["llama.cpp"]
    argv += [str(llama.seqs_flag), str(slots), "-kvu", str(llama.budget_flag), str(batch)]
    argv += ["-ub", str(batch), "-t", "1"]
    argv += ["--no-webui", "--metrics"]
    return argv, dict(ONE_THREAD)


def reference_server(port: int, ttft: float, gap: float) -> tuple[list[str], dict[str, str]]:
    """The command of the reference server (``serve.launch.reference``) in its own process."""
    argv = [sys.executable, "-m", "pytest_prefill.serve.launch.reference", "--port", str(port)]
    argv += ["--ttft", repr(ttft), "--gap", repr(gap)]
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.environ.get("PYTHONPATH")
    return argv, {"PYTHONPATH": package_root + (os.pathsep + path if path else "")}


# The engines whose compute runs in a child process, by that process's name (/proc/PID/comm,
# at most 15 characters): vLLM's CPU worker calls itself "VLLM::Worker".
COMPUTE_NAMES = {"vllm": ("VLLM::Worker",)}


@dataclasses.dataclass(frozen=True)
class Pinning:
    """Where a launched server and the load generator run: ``engine_cores`` hold the
    ``compute`` processes (PID, name) alone; ``other_cores`` the server's ``others`` and this
    process, whose cores before were ``client_before``; ``why_not``: set when nothing was
    pinned, saying why."""

    engine_cores: tuple[int, ...] = ()
    other_cores: tuple[int, ...] = ()
    compute: tuple[tuple[int, str], ...] = ()
    others: tuple[tuple[int, str], ...] = ()
    client_before: tuple[int, ...] = ()
    why_not: str | None = None

    @property
    def pinned(self) -> bool:
        return self.why_not is None

    def sentence(self) -> str:
        if self.why_not is not None:
            return f"not pinned: {self.why_not}"
        names = ", ".join(sorted({name for _, name in self.compute}))
        return (
            f"pinned: the server's compute ({names}) alone on core(s) {_cores(self.engine_cores)}; "
            f"its {len(self.others)} other process(es) and this load generator on "
            f"{_cores(self.other_cores)}"
        )

    def release(self) -> None:
        """Give the load generator its cores back (the server's processes are left: they end
        with it)."""
        if self.client_before:
            _set_all(os.getpid(), self.client_before)

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine_cores": list(self.engine_cores),
            "other_cores": list(self.other_cores),
            "compute": [list(p) for p in self.compute],
            "others": [list(p) for p in self.others],
            "why_not": self.why_not,
            "sentence": self.sentence(),
        }


def _cores(cores: Iterable[int]) -> str:
    return ",".join(str(c) for c in cores)


def available_cores() -> tuple[int, ...] | None:
    """The cores this process may run on, or None where the platform cannot say."""
    getter = getattr(os, "sched_getaffinity", None)
    return None if getter is None else tuple(sorted(getter(0)))


def split_cores(cores: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The engine's core (the first) and the rest.

    Raises:
        ValueError: for fewer than 2 cores (nothing to keep apart).
    """
    ordered = sorted(set(cores))
    if len(ordered) < 2:
        raise ValueError(f"pinning needs 2 or more cores, got {ordered}")
    return (ordered[0],), tuple(ordered[1:])


def engine_core() -> int | None:
    """The core a launched engine will be pinned to (vLLM binds its OpenMP thread there), or
    None when nothing will be pinned."""
    cores = available_cores()
    return None if cores is None or len(cores) < 2 else split_cores(cores)[0][0]


def group_processes(pgid: int) -> list[tuple[int, str]]:
    """The live processes of process group ``pgid`` (PID, name), read from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                stat = handle.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            found.append((int(entry), name))
    return sorted(found)


def compute_processes(engine: str, processes: Sequence[tuple[int, str]]) -> list[tuple[int, str]]:
    """Which of the server's ``processes`` compute the passes apart from its frontend: those
    named as the engine's worker (:data:`COMPUTE_NAMES`); none for an engine that computes in
    the process that serves HTTP."""
    names = COMPUTE_NAMES.get(engine, ())
    return [p for p in processes if p[1] in names]


def _set_all(pid: int, cores: Iterable[int]) -> None:
    """Every thread of ``pid`` onto ``cores`` (a thread keeps its own mask: setting the
    process's sets its first thread only)."""
    wanted = set(cores)
    try:
        threads = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        threads = [pid]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, wanted)
        except (ProcessLookupError, FileNotFoundError):
            continue  # the thread ended meanwhile


def pin_server(engine: str, leader: int) -> Pinning:
    """Pin the server whose process group ``leader`` leads, and this process, as the module
    says; a :class:`Pinning` that says what was done (or why nothing was)."""
    cores = available_cores()
    if cores is None or not hasattr(os, "sched_setaffinity") or not os.path.isdir("/proc"):
        return Pinning(why_not="this platform cannot set CPU affinity")
    if len(cores) < 2:
        return Pinning(why_not=f"this process may use {len(cores)} core")
    if engine not in COMPUTE_NAMES:
        return Pinning(
            why_not=f"{engine} serves HTTP and computes in one process: on one core its frontend "
            "would take the compute's time (see serve/launch/process.py)"
        )
    mine, rest = split_cores(cores)
    processes = group_processes(leader)
    compute = compute_processes(engine, processes)
    if not compute:
        return Pinning(why_not=f"no {engine} compute process found among {processes}")
    others = [p for p in processes if p not in compute]
    try:
        for pid, _ in compute:
            _set_all(pid, mine)
        for pid, _ in others:
            _set_all(pid, rest)
        _set_all(os.getpid(), rest)
    except OSError as err:
        return Pinning(client_before=cores, why_not=f"setting CPU affinity failed: {err}")
    return Pinning(mine, rest, tuple(compute), tuple(others), cores)
