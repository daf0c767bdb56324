"""Starting and stopping a local server for a measurement: ``transformers serve`` with
continuous batching, llama.cpp's ``llama-server``, or the reference server; bound to
127.0.0.1, ready when its health endpoint answers, stopped by its PID (its own process group,
so nothing it started outlives it). Standard library only."""

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
from collections.abc import Iterator, Mapping, Sequence
from types import FrameType

from pytest_prefill.plan.engine_commands import ENGINE_COMMANDS
from pytest_prefill.serve.client.http import request_json
from pytest_prefill.serve.client.wire import ServerError, Timeouts, Url
from pytest_prefill.serve.launch.pinning import Pinning

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
        status, _ = await request_json(url, "GET", path, timeouts=Timeouts(2.0, 5.0))
        return status == 200

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
