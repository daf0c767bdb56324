"""Test wiring: ``pytester`` for the plugin tests, and one torch thread for the model tests."""

from __future__ import annotations

import dataclasses

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture(scope="module")
def one_torch_thread():
    """Other processes share this machine's cores: one torch thread keeps model tests quick."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# The server tests' engine: `transformers serve --continuous-batching` on 127.0.0.1, serving a
# random-weight model made here, one thread, budget 256 tokens an iteration and 64 blocks of
# KV (256 tokens each); started once per session and stopped by its PID.
SERVED_PRESET = "small"
SERVED_BUDGET = 256
SERVED_BLOCKS = 64


def _serving_missing() -> str | None:
    import importlib.util
    import shutil
    import sys

    missing = [
        m
        for m in ("fastapi", "uvicorn", "torch", "transformers")
        if importlib.util.find_spec(m) is None
    ]
    if missing:
        return f"the serving extra is not installed ({', '.join(missing)} missing): pip install '.[measure,serve]'"
    here = shutil.which("transformers", path=str(__import__("pathlib").Path(sys.executable).parent))
    if here is None and shutil.which("transformers") is None:
        return "the transformers command is not on PATH: pip install 'transformers[serving]'"
    return None


@dataclasses.dataclass(frozen=True)
class Served:
    server: object  # serve.process.ServerProcess
    folder: str
    budget: int = SERVED_BUDGET
    kv_tokens: int = SERVED_BLOCKS * 256


@pytest.fixture(scope="session")
def transformers_server(tmp_path_factory):
    """The running server and the model folder it serves."""
    reason = _serving_missing()
    if reason:
        pytest.skip(reason)
    from pytest_prefill.serve.launch.model_folder import make_model
    from pytest_prefill.serve.launch.process import free_port, running_server, transformers_serve

    folder = tmp_path_factory.mktemp("served") / SERVED_PRESET
    make_model(SERVED_PRESET, folder)
    port = free_port()
    argv, env = transformers_serve(
        str(folder), port, max_batch_tokens=SERVED_BUDGET, num_blocks=SERVED_BLOCKS
    )
    with running_server(argv, port, env=env, timeout=300) as server:
        yield Served(server, str(folder))
