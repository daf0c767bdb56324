"""Under xdist the device lock is held for any device under test, not only ``--prefill-device
cpu``: gpu and server tests hold it exclusively, and while the session times anything every
other test holds it shared (nothing runs on the host beside a timing)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_prefill.plugin.session import lock_mode

pytestmark = pytest.mark.sim


def _state(device=None, times_device=False, measures_server=False):
    return SimpleNamespace(
        settings=SimpleNamespace(device=device),
        times_device=times_device,
        measures_server=measures_server,
    )


@pytest.mark.parametrize("device", [None, "cuda", "cuda:1", "cpu"])
def test_gpu_and_server_tests_hold_the_lock_exclusively_on_any_device(device):
    assert lock_mode(_state(device), gpu=True, server=False) is True
    assert lock_mode(_state(device), gpu=False, server=True) is True


@pytest.mark.parametrize("device", [None, "cuda", "cuda:1"])
def test_other_tests_share_the_lock_while_a_cuda_device_is_timed(device):
    assert lock_mode(_state(device, times_device=True), gpu=False, server=False) is False


def test_other_tests_share_the_lock_on_the_cpu_and_beside_a_server():
    assert lock_mode(_state("cpu"), gpu=False, server=False) is False
    assert lock_mode(_state(None, measures_server=True), gpu=False, server=False) is False


@pytest.mark.parametrize("device", [None, "cuda"])
def test_a_session_that_times_nothing_takes_no_lock(device):
    assert lock_mode(_state(device), gpu=False, server=False) is None
