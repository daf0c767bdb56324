"""This machine's CPU as a compute device: its dense GEMM FLOP/s per dtype and its memory
bandwidth measured with torch (a square GEMM, a stream add), each the median of repeats with
its spread, as a ``Device`` (key ``cpu``), saved and read back as JSON."""

from __future__ import annotations

import dataclasses
import datetime
import os
from collections.abc import Mapping
from typing import Any

from pytest_prefill._io import read_json, write_json_atomic
from pytest_prefill.machine import cpu_model
from pytest_prefill.measure.timing import Measurement, measure
from pytest_prefill.plan.compute.cpu import Cache
from pytest_prefill.plan.compute.devices import Device
from pytest_prefill.plan.compute.transfer import DEVICE_FIELDS, device_from_fields
from pytest_prefill.sim import check_int

KIND = "pytest-prefill device probe"
SCHEMA_VERSION = 1

# The presets run in fp32 on a CPU (measure/models' default there); the device value needs a
# bf16 peak too, which a CPU without bf16 units runs on a slow path: it is timed at a size that
# keeps it to seconds.
GEMM_SIZE = 2048  # fp32: large enough that one core reaches its plateau
BF16_GEMM_SIZE = 256
STREAM_BYTES = 256 * 2**20  # per array: far beyond any CPU cache
# The last-level cache: a stream whose three arrays take 3/8 of it stays there between repeats
# (what a pass whose working set fits finds); read from sysfs, none where it says nothing.
CACHE_FOLDER = "/sys/devices/system/cpu/cpu0/cache"
CACHE_SHARE = 8
DEFAULT_REPEATS = 10
DEFAULT_WARMUP = 2
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
FIELDS = DEVICE_FIELDS


@dataclasses.dataclass(frozen=True, slots=True)
class Probe:
    """A probed CPU: the ``Device`` and what it was measured from (``measurements`` by name:
    ``gemm_fp32``, ``gemm_bf16``, ``stream_add``, ``stream_copy``; ``sizes`` the GEMM side per
    dtype and the stream's bytes per array; ``provenance`` threads, versions, date)."""

    device: Device
    measurements: Mapping[str, Measurement]
    sizes: Mapping[str, int]
    provenance: Mapping[str, Any]

    @property
    def cache(self) -> Cache | None:
        """The last-level cache and the bandwidth a stream held in it reached (None: the probe
        found no cache to measure)."""
        stream = self.measurements.get("stream_cache_add")
        if stream is None or "cache_bytes" not in self.sizes:
            return None
        moved = 3.0 * (self.sizes["cache_stream_bytes"] // 4) * 4
        return Cache(float(self.sizes["cache_bytes"]), moved / stream.median)

    def to_dict(self) -> dict[str, Any]:
        device = {name: getattr(self.device, name) for name in FIELDS}
        device["peak_flops"] = dict(self.device.peak_flops)
        return {
            "kind": KIND,
            "schema_version": SCHEMA_VERSION,
            "device": device,
            "sizes": dict(self.sizes),
            "measurements": {k: m.to_dict() for k, m in self.measurements.items()},
            "provenance": dict(self.provenance),
        }

    @classmethod
    def from_dict(cls, data: Any) -> Probe:
        """Inverse of :meth:`to_dict`.

        Raises:
            ValueError: for anything that is not a device probe, or a field out of range.
        """
        if not isinstance(data, Mapping) or data.get("kind") != KIND:
            kind = data.get("kind") if isinstance(data, Mapping) else type(data).__name__
            raise ValueError(f"not a device probe: kind is {kind!r}, expected {KIND!r}")
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(
                f"device probe schema_version must be {SCHEMA_VERSION}, "
                f"got {data.get('schema_version')!r}"
            )
        try:
            return _probe_from(data)
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"corrupt device probe: missing or malformed {err!s}") from None


def _probe_from(data: Mapping[str, Any]) -> Probe:
    fields = data["device"]
    if not isinstance(fields, Mapping) or set(fields) != set(FIELDS):
        raise ValueError(f"device probe: 'device' must hold exactly {', '.join(FIELDS)}")
    device = device_from_fields(fields, "device probe")
    sizes = {str(k): check_int(f"sizes[{k!r}]", v) for k, v in data["sizes"].items()}
    measurements = {str(k): Measurement.from_dict(v) for k, v in data["measurements"].items()}
    provenance = data["provenance"]
    if not isinstance(provenance, Mapping):
        raise ValueError("device probe: provenance must be an object")
    return Probe(device, measurements, sizes, dict(provenance))


def save_probe(path: str | os.PathLike[str], probe: Probe) -> None:
    """Write ``probe`` as JSON at ``path`` (atomically: nothing half-written)."""
    write_json_atomic(path, probe.to_dict())


def load_probe(path: str | os.PathLike[str]) -> Probe:
    """The probe saved at ``path``.

    Raises:
        ValueError: naming the path or the field, for a missing, unreadable or foreign file.
    """
    return Probe.from_dict(read_json(path, "device probe"))


def probe_at(path: str | os.PathLike[str], *, threads: int = 1) -> tuple[Probe, bool]:
    """The probe saved at ``path``, else this CPU probed now (on ``threads`` torch threads) and
    saved there; True when it was probed now. A calibration records it, so what carries that
    calibration reads the same peaks and never probes again.

    Raises:
        ValueError: naming the path or the field, for a file there that is not a probe.
    """
    if os.path.exists(path):
        return load_probe(path), False
    probe = probe_device(threads=threads)
    save_probe(path, probe)
    return probe, True


def _size(text: str) -> int:
    """``32768K`` (sysfs's cache size) as bytes."""
    text = text.strip().upper()
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    return int(text.rstrip("KMG") or 0) * scale


def last_level_cache(folder: str = CACHE_FOLDER) -> int | None:
    """Bytes of this CPU's largest data (or unified) cache, as sysfs lists it; None when it
    lists none."""
    sizes = []
    for entry in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
        try:
            with open(os.path.join(folder, entry, "type"), encoding="ascii") as handle:
                kind = handle.read().strip()
            with open(os.path.join(folder, entry, "size"), encoding="ascii") as handle:
                size = _size(handle.read())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and size > 0:
            sizes.append(size)
    return max(sizes) if sizes else None


def memory_bytes() -> float:
    """The host's physical memory in bytes."""
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def time_gemm(size: int, dtype: str, *, repeats: int, warmup: int) -> Measurement:
    """Seconds of one ``size`` x ``size`` by ``size`` x ``size`` matmul in ``dtype``."""
    import torch

    torch_dtype = getattr(torch, DTYPES[dtype])
    generator = torch.Generator().manual_seed(0)
    a = torch.randn((size, size), generator=generator).to(torch_dtype)
    b = torch.randn((size, size), generator=generator).to(torch_dtype)
    out = torch.empty((size, size), dtype=torch_dtype)
    with torch.inference_mode():
        return measure(lambda: torch.matmul(a, b, out=out), repeats=repeats, warmup=warmup)


def time_stream(nbytes: int, *, repeats: int, warmup: int) -> tuple[Measurement, Measurement]:
    """Seconds of ``c = a + b`` (3 arrays of ``nbytes`` moved) and of ``c[:] = a`` (2 moved)
    over fp32 arrays of ``nbytes`` each."""
    import torch

    n = max(1, nbytes // 4)
    a, b, c = torch.rand(n), torch.rand(n), torch.empty(n)
    with torch.inference_mode():
        add = measure(lambda: torch.add(a, b, out=c), repeats=repeats, warmup=warmup)
        copy = measure(lambda: c.copy_(a), repeats=repeats, warmup=warmup)
    return add, copy


def _rate(work: float, m: Measurement) -> str:
    spread = f"[{work / m.maximum:.4g}, {work / m.minimum:.4g}]"
    return f"{work / m.median:.4g} {spread}"


def _cpu_device(
    gemms: Mapping[str, Measurement],
    add: Measurement,
    sizes: Mapping[str, int],
    threads: int,
    repeats: str,
) -> Device:
    """The ``cpu`` device of these measurements: median rates, their spread in its source."""
    import torch

    stream_bytes = sizes["stream_bytes"]
    flops = {dtype: 2.0 * sizes[dtype] ** 3 for dtype in DTYPES}
    moved = 3.0 * (stream_bytes // 4) * 4
    peaks = {dtype: flops[dtype] / gemms[dtype].median for dtype in DTYPES}
    bandwidth = moved / add.median
    said = "; ".join(
        f"{dtype} GEMM {sizes[dtype]}^3: {_rate(flops[dtype], gemms[dtype])} FLOP/s"
        for dtype in DTYPES
    )
    source = (
        f"measured here: {said}; stream add of {stream_bytes / 2**20:g} MiB arrays: "
        f"{_rate(moved, add)} B/s (median [min, max] of {repeats}, "
        f"{threads} torch thread(s), torch {torch.__version__}); no device link: the link is "
        "host memory at the stream's bandwidth, latency 0"
    )
    return Device(
        key="cpu",
        name=f"{cpu_model()} ({threads} torch thread{'s' if threads > 1 else ''})",
        architecture="cpu",
        peak_flops=peaks,
        memory_bandwidth=bandwidth,
        memory_bytes=memory_bytes(),
        link_bandwidth=bandwidth,
        link_latency=0.0,
        source=source,
    )


def _cache_stream(sizes: dict[str, int], *, repeats: int, warmup: int) -> dict[str, Measurement]:
    """The stream add held in the last-level cache (its arrays 1/``CACHE_SHARE`` of it each,
    timed ``CACHE_SHARE`` times as often: each is short); its sizes put in ``sizes``."""
    cache = last_level_cache()
    if cache is None:
        return {}
    sizes["cache_bytes"] = cache
    sizes["cache_stream_bytes"] = max(4096, cache // CACHE_SHARE)
    add, _ = time_stream(
        sizes["cache_stream_bytes"], repeats=repeats * CACHE_SHARE, warmup=warmup + 1
    )
    return {"stream_cache_add": add}


def probe_device(
    *,
    gemm_size: int = GEMM_SIZE,
    bf16_size: int = BF16_GEMM_SIZE,
    stream_bytes: int = STREAM_BYTES,
    repeats: int = DEFAULT_REPEATS,
    warmup: int = DEFAULT_WARMUP,
    threads: int = 1,
) -> Probe:
    """Measure this CPU: fp32 GEMM FLOP/s at ``gemm_size`` (bf16 at ``bf16_size``), and the
    memory bandwidth of a stream add over arrays of ``stream_bytes`` each, on ``threads`` torch
    threads (1: what a calibration on the CPU uses by default). Peaks are median rates; the
    spread of each sits in ``measurements`` and the device's source line.

    Raises:
        ValueError: for a size, repeats, warmup or threads out of range.
    """
    check_int("gemm_size", gemm_size)
    check_int("bf16_size", bf16_size)
    check_int("stream_bytes", stream_bytes, minimum=4)
    check_int("repeats", repeats)
    check_int("warmup", warmup, minimum=0)
    check_int("threads", threads)
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        sizes = {"fp32": gemm_size, "bf16": bf16_size, "stream_bytes": stream_bytes}
        gemms = {
            dtype: time_gemm(sizes[dtype], dtype, repeats=repeats, warmup=warmup)
            for dtype in DTYPES
        }
        add, copy = time_stream(stream_bytes, repeats=repeats, warmup=warmup)
        held = _cache_stream(sizes, repeats=repeats, warmup=warmup)
    finally:
        torch.set_num_threads(before)
    device = _cpu_device(gemms, add, sizes, threads, f"{repeats} after {warmup} warmup")
    measurements = {f"gemm_{d}": m for d, m in gemms.items()}
    measurements |= {"stream_add": add, "stream_copy": copy, **held}
    provenance = {
        "threads": threads,
        "torch": torch.__version__,
        "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
        "repeats": repeats,
        "warmup": warmup,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    return Probe(device, measurements, sizes, provenance)
