"""Test wiring: ``pytester`` for the plugin tests, and one torch thread for the model tests."""

from __future__ import annotations

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
