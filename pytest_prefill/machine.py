"""Which machine a run happened on: its accelerator, CPU and software, and the key that names
its folder in the results archive. Standard library only; never imports torch (it asks
``nvidia-smi`` and ``/proc`` instead, and reads package versions from their metadata)."""

from __future__ import annotations

import dataclasses
import glob
import importlib.metadata
import os
import platform
import re
import shutil
import socket
import subprocess
from collections.abc import Sequence
from typing import Any

MACHINE_KIND = "pytest-prefill/machine"
MACHINE_SCHEMA_VERSION = 1

# Device names the plugin accepts: the ones the model runner can place a model on.
DEVICE_PATTERN = re.compile(r"^(cpu|cuda|cuda:\d+)$")
DEVICE_FORMS = "cpu, cuda, cuda:N"

# A machine key is a folder name: lower-case letters, digits and dashes.
KEY_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]*$")

# Packages whose versions belong in a run's provenance.
PACKAGES = (
    "pytest-prefill",
    "torch",
    "transformers",
    "numpy",
    "pytest",
    "pytest-benchmark",
    "pytest-xdist",
)


@dataclasses.dataclass(frozen=True, slots=True)
class Accelerator:
    """One GPU as the driver reports it (no torch involved)."""

    index: int
    name: str
    driver: str | None = None
    memory_mib: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def slug(text: str) -> str:
    """``text`` as a folder-safe key: lower case, runs of anything else become one dash."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def check_device(text: str) -> str:
    """``text`` if it names a device form the plugin understands, else ValueError."""
    if not isinstance(text, str) or not DEVICE_PATTERN.match(text):
        raise ValueError(f"device must be one of {DEVICE_FORMS}; got {text!r}")
    return text


def device_index(device: str | None) -> int:
    """The index in ``cuda:N`` (0 when none is given)."""
    if device and ":" in device:
        return int(device.split(":", 1)[1])
    return 0


def nvidia_accelerators(timeout: float = 10.0) -> list[Accelerator]:
    """The NVIDIA GPUs that ``nvidia-smi`` (or, without it, ``/proc/driver/nvidia``) reports;
    empty when there are none or the driver is not installed."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [
                    smi,
                    "--query-gpu=index,name,driver_version,memory.total",
                    "--format=csv,noheader,nounits",
                ],
                capture_output=True,
                text=True,
                timeout=timeout,
                check=True,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        found = []
        for line in out.splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 4 and parts[0].isdigit():
                memory = int(parts[3]) if parts[3].isdigit() else None
                found.append(Accelerator(int(parts[0]), parts[1], parts[2] or None, memory))
        if found:
            return found
    return _proc_nvidia()


def _proc_nvidia() -> list[Accelerator]:
    driver = None
    try:
        with open("/proc/driver/nvidia/version", encoding="utf-8") as handle:
            match = re.search(r"Kernel Module\s+(\S+)", handle.read())
            driver = match.group(1) if match else None
    except OSError:
        pass
    found = []
    for index, path in enumerate(sorted(glob.glob("/proc/driver/nvidia/gpus/*/information"))):
        try:
            with open(path, encoding="utf-8") as handle:
                match = re.search(r"^Model:\s*(.+)$", handle.read(), re.MULTILINE)
        except OSError:
            continue
        if match:
            found.append(Accelerator(index, match.group(1).strip(), driver))
    return found


def cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo``, ``sysctl`` on macOS, else ``platform``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.lower().startswith(("model name", "hardware", "cpu model")):
                    name = line.split(":", 1)[1].strip()
                    if name:
                        return name
    except OSError:
        pass
    if platform.system() == "Darwin":
        try:
            return (
                subprocess.run(
                    ["sysctl", "-n", "machdep.cpu.brand_string"],
                    capture_output=True,
                    text=True,
                    timeout=5,
                    check=True,
                ).stdout.strip()
                or platform.machine()
            )
        except (OSError, subprocess.SubprocessError):
            pass
    return platform.processor() or platform.machine() or "unknown-cpu"


def cpu_key(model: str) -> str:
    """``cpu-`` plus the CPU name without trademarks, clock speed or core counts."""
    text = re.sub(r"\((r|tm|c)\)", " ", model, flags=re.IGNORECASE)
    text = re.sub(r"@.*$", " ", text)
    text = re.sub(r"\b\d+-core\b|\bprocessor\b|\bcpu\b", " ", text, flags=re.IGNORECASE)
    return "cpu-" + (slug(text) or "unknown")


def machine_key(device: str | None, accelerators: Sequence[Accelerator], cpu: str) -> str:
    """The archive folder of a run on ``device``: the accelerator's name when the device under
    test is a GPU the driver reports (``nvidia-h200``), else the CPU's (``cpu-amd-epyc-7763``).

    ``device`` None means "the default device": the first GPU if there is one, else the CPU.
    """
    if device is None or device.startswith("cuda"):
        wanted = device_index(device)
        for accelerator in accelerators:
            if accelerator.index == wanted:
                return slug(accelerator.name) or "unknown-gpu"
    return cpu_key(cpu)


def package_versions(names: Sequence[str] = PACKAGES) -> dict[str, str | None]:
    """Installed versions from package metadata (None when absent); imports nothing."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine_info(
    device: str | None = None, accelerators: Sequence[Accelerator] | None = None
) -> dict[str, Any]:
    """The ``machine.json`` document: host, OS, CPU, accelerators with driver, Python and the
    versions of torch, transformers and the test tools; ``key`` names the archive folder."""
    if accelerators is None:
        accelerators = nvidia_accelerators()
    cpu = cpu_model()
    return {
        "kind": MACHINE_KIND,
        "schema_version": MACHINE_SCHEMA_VERSION,
        "key": machine_key(device, accelerators, cpu),
        "host": socket.gethostname(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu": {"model": cpu, "logical_cores": os.cpu_count()},
        "accelerators": [a.to_dict() for a in accelerators],
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "packages": package_versions(),
    }
