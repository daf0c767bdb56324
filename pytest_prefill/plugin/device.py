"""The device under test: why it cannot be used here (asked once per process, without
importing torch when ``nvidia-smi`` has already answered), and the lock that keeps xdist
workers from timing it at the same time."""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator

from pytest_prefill.machine import device_index


def why_no_device(device: str | None, driver_sees_gpu: bool) -> str | None:
    """Why ``device`` (None: the default, the first CUDA device) cannot be timed here, or
    None. ``driver_sees_gpu``: nvidia-smi reported a GPU (without one, torch is not asked)."""
    missing = "torch is not installed, so nothing can be timed (pip install '.[measure]')"
    if device == "cpu":
        # the CPU always exists; only the runner's libraries can be missing
        return None if importlib.util.find_spec("torch") else missing
    unless = "--prefill-device not given (--prefill-device cpu runs the hardware suite on the CPU)"
    if device is None and not driver_sees_gpu:
        # nvidia-smi has answered: importing torch (seconds) only to hear it again is waste
        return (
            f"no GPU (nvidia-smi sees none) and {unless}; --prefill-device cuda asks torch "
            "instead (e.g. a ROCm build)"
        )
    try:
        import torch
    except ImportError:
        return missing
    if not torch.cuda.is_available():
        if device:
            return (
                f"--prefill-device {device}: no CUDA device found "
                "(torch.cuda.is_available() is False)"
            )
        return f"no CUDA device found (torch.cuda.is_available() is False) and {unless}"
    count = torch.cuda.device_count()
    if device and device_index(device) >= count:
        return f"--prefill-device {device}: only {count} CUDA device(s) visible"
    return None


class DeviceLock:
    """A re-entrant reader/writer lock on a file in the session folder: gpu tests (and the
    calibration) hold it exclusively; with ``--prefill-device cpu`` every other test holds it
    shared, so nothing else this session runs on the CPU while it is being timed."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd: int | None = None
        self.modes: list[int] = []

    @contextlib.contextmanager
    def hold(self, exclusive: bool) -> Iterator[None]:
        import fcntl

        outer = self.modes[-1] if self.modes else None
        want = fcntl.LOCK_EX if exclusive or outer == fcntl.LOCK_EX else fcntl.LOCK_SH
        if self.fd is None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)  # a remote worker's host
            self.fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
        if want != outer:
            fcntl.flock(self.fd, want)  # a shared lock held here is converted
        self.modes.append(want)
        try:
            yield
        finally:
            self.modes.pop()
            if self.modes and self.modes[-1] != want:
                fcntl.flock(self.fd, self.modes[-1])
            elif not self.modes:
                fcntl.flock(self.fd, fcntl.LOCK_UN)
                os.close(self.fd)
                self.fd = None
