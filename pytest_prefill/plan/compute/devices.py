"""The devices compute is derived for: a catalog of accelerators with their datasheet figures
(dense FLOP/s per dtype, memory bandwidth, memory as the driver reports it, the device link), a
user's own figures (``custom:tflops=…,tbs=…,gib=…``), and the lookup by name. Standard library
only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from types import MappingProxyType

GiB = 2**30
TERA = 1e12
GB = 1e9

# Memory as the driver reports it. vLLM sizes its KV cache from torch.cuda.mem_get_info()'s
# total (its log's "total_gpu_memory"), which is below the marketed figure: an "80GB" H100 SXM
# reports 79.18 GiB (vLLM's log on that card). The rule for a card without such a figure
# here: the marketed size read as GiB, times the H100's ratio 79.18 / 80 (the driver and ECC
# reservation scale with the memory); each entry says which rule gave its figure.
DRIVER_RATIO = 79.18 / 80
REPORTED = "as the driver reports it (the total vLLM and PyTorch read; cited beside the datasheet)"
BY_RATIO = "marketed GiB x 79.18/80 (the H100's driver ratio; no log cited)"

# A device link's latency is not on any datasheet: a stated assumption, one per link kind,
# until a measurement says (NCCL's small-message latency is a few microseconds over NVLink or
# Infinity Fabric, about ten over PCIe).
NVLINK_LATENCY = 5e-6
PCIE_LATENCY = 10e-6
LATENCY_NOTE = "link latency assumed (no datasheet gives it)"


@dataclasses.dataclass(frozen=True, slots=True)
class Device:
    """One accelerator (or a CPU) as compute and memory see it.

    ``peak_flops``: dense (no sparsity) FLOP/s per dtype; a dtype absent is one the device has
    no tensor-core path for (no ``"fp8"`` key: no FP8). ``memory_bandwidth`` and
    ``link_bandwidth`` in bytes/s (the link: one direction, device to device, aggregate over
    its lanes); ``memory_bytes`` as the driver reports it; ``link_latency`` in seconds.

    Raises:
        ValueError: naming the field, for a key that is not lower-case, no bf16 peak, or a
            figure that is not a positive finite number (the latency may be 0).
    """

    key: str
    name: str
    architecture: str
    peak_flops: Mapping[str, float]
    memory_bandwidth: float
    memory_bytes: float
    link_bandwidth: float
    link_latency: float
    source: str

    def __post_init__(self) -> None:
        if not self.key or self.key != self.key.strip().lower():
            raise ValueError(f"device key must be a lower-case name, got {self.key!r}")
        if "bf16" not in self.peak_flops:
            raise ValueError(f"device {self.key}: peak_flops needs a 'bf16' entry")
        for dtype, value in self.peak_flops.items():
            _positive(f"device {self.key}: peak_flops[{dtype!r}]", value)
        for name in ("memory_bandwidth", "memory_bytes", "link_bandwidth"):
            _positive(f"device {self.key}: {name}", getattr(self, name))
        latency = self.link_latency
        if not (isinstance(latency, (int, float)) and math.isfinite(latency) and latency >= 0):
            raise ValueError(
                f"device {self.key}: link_latency must be >= 0 seconds, got {latency!r}"
            )
        object.__setattr__(self, "peak_flops", MappingProxyType(dict(self.peak_flops)))

    @property
    def has_fp8(self) -> bool:
        return "fp8" in self.peak_flops

    def peak(self, dtype: str) -> float:
        """Dense FLOP/s for ``dtype`` ("bf16", "fp8", ...).

        Raises:
            ValueError: in one line, for a dtype the device has no peak for.
        """
        if dtype not in self.peak_flops:
            raise ValueError(
                f"{self.name} has no {dtype} peak (it has: {', '.join(self.peak_flops)}): "
                f"{dtype} compute is not available on it"
            )
        return self.peak_flops[dtype]

    def describe(self) -> str:
        """``NVIDIA H100 SXM5 80GB: 989 TFLOP/s bf16, 1979 fp8, 3.35 TB/s, 79.18 GiB``."""
        peaks = ", ".join(
            f"{v / TERA:.4g} TFLOP/s {k}" if i == 0 else f"{v / TERA:.4g} {k}"
            for i, (k, v) in enumerate(self.peak_flops.items())
        )
        return (
            f"{self.name}: {peaks}, {self.memory_bandwidth / TERA:.3g} TB/s, "
            f"{self.memory_bytes / GiB:.2f} GiB"
        )


def _positive(field: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{field} must be a positive finite number, got {value!r}")
    return float(value)


A100_DATASHEET = "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com, 2021)"
H100_DATASHEET = "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com, 2023)"

# Each catalog device's source, by its key.
_DATASHEETS: Mapping[str, str] = MappingProxyType(
    {
        "a100-40": A100_DATASHEET,
        "a100-80": A100_DATASHEET,
        "h100-sxm": H100_DATASHEET,
        "h100-pcie": H100_DATASHEET,
        "h200": "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com, 2024)",
        "b200": "NVIDIA HGX B200 specifications (nvidia.com/data-center/hgx, 2025)",
        "l4": "NVIDIA L4 Tensor Core GPU datasheet (2023); memory: PyTorch's out-of-memory message "
        "on an L4 ('a total capacity of 22.03 GiB')",
        "l40s": "NVIDIA L40S GPU datasheet (2023); memory: vLLM's log on an L40S "
        "(github.com/vllm-project/vllm/issues/15815: 44.42 GiB; nvidia-smi 46,068 MiB)",
        "mi300x": "AMD Instinct MI300X data sheet (amd.com, 2023); link: 7 Infinity Fabric "
        "links x 128 GB/s, halved",
    }
)

# One row a device, figures as the datasheets print them: key, name, architecture, dense bf16
# and fp8 TFLOP/s (None: no FP8), memory TB/s, the marketed memory in GB, the GiB the driver
# reports where a log cites it (None: the marketed size by DRIVER_RATIO), the link's GB/s in
# one direction (a datasheet's NVLink figure is both directions: halved here), and whether the
# link is NVLink-class (else PCIe).
_Row = tuple[str, str, str, float, float | None, float, float, float | None, float, bool]
_ROWS: tuple[_Row, ...] = (
    ("a100-40", "NVIDIA A100 SXM4 40GB", "ampere", 312, None, 1.555, 40, None, 300, True),
    ("a100-80", "NVIDIA A100 SXM4 80GB", "ampere", 312, None, 2.039, 80, None, 300, True),
    ("h100-sxm", "NVIDIA H100 SXM5 80GB", "hopper", 989.4, 1978.9, 3.35, 80, 79.18, 450, True),
    ("h100-pcie", "NVIDIA H100 PCIe 80GB", "hopper", 756.5, 1513, 2.0, 80, None, 64, False),
    ("h200", "NVIDIA H200 SXM 141GB", "hopper", 989.4, 1978.9, 4.8, 141, None, 450, True),
    ("b200", "NVIDIA B200 180GB (HGX)", "blackwell", 2250, 4500, 8.0, 180, None, 900, True),
    ("l4", "NVIDIA L4 24GB", "ada", 121, 242.5, 0.3, 24, 22.03, 32, False),
    ("l40s", "NVIDIA L40S 48GB", "ada", 362.05, 733, 0.864, 48, 44.42, 32, False),
    ("mi300x", "AMD Instinct MI300X 192GB", "cdna3", 1307.4, 2614.9, 5.3, 192, None, 448, True),
)


def _device_from_row(row: _Row) -> Device:
    key, name, arch, bf16, fp8, tbs, marketed_gb, reported_gib, link_gbs, nvlink = row
    gib, memory_rule = (
        (marketed_gb * DRIVER_RATIO, BY_RATIO) if reported_gib is None else (reported_gib, REPORTED)
    )
    peaks = {"bf16": bf16 * TERA} | ({"fp8": fp8 * TERA} if fp8 is not None else {})
    return Device(
        key=key,
        name=name,
        architecture=arch,
        peak_flops=peaks,
        memory_bandwidth=tbs * TERA,
        memory_bytes=gib * GiB,
        link_bandwidth=link_gbs * GB,
        link_latency=NVLINK_LATENCY if nvlink else PCIE_LATENCY,
        source=f"{_DATASHEETS[key]}; dense peaks (sparsity halved); memory {memory_rule}; "
        f"{LATENCY_NOTE}",
    )


_DEVICES = tuple(_device_from_row(row) for row in _ROWS)

CATALOG: Mapping[str, Device] = MappingProxyType({d.key: d for d in _DEVICES})

ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "a100": "a100-80",
        "a100-80gb": "a100-80",
        "a100-sxm": "a100-80",
        "a100-40gb": "a100-40",
        "h100": "h100-sxm",
        "h100-80gb": "h100-sxm",
        "h100-sxm5": "h100-sxm",
        "h100-80gb-hbm3": "h100-sxm",
        "h200-sxm": "h200",
        "h200-141gb": "h200",
        "b200-180gb": "b200",
        "l40s-48gb": "l40s",
        "l4-24gb": "l4",
        "mi300": "mi300x",
    }
)


def _normal(name: str) -> str:
    key = "-".join(name.strip().lower().replace("_", " ").split())
    for prefix in ("nvidia-", "amd-", "instinct-"):
        key = key.removeprefix(prefix)
    return key


def device_named(name: str) -> Device:
    """The catalog device ``name`` names (its key, an alias such as ``h100``, or the name as
    nvidia-smi prints it, e.g. ``NVIDIA H100 80GB HBM3``), or a ``custom:…`` spec.

    Raises:
        ValueError: in one line listing the catalog, for a name it does not hold.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(
            f"gpu must be a catalog name ({', '.join(CATALOG)}) or custom:…, got {name!r}"
        )
    if name.strip().lower().startswith("custom:"):
        return custom_device(name)
    key = _normal(name)
    key = ALIASES.get(key, key)
    if key == "cpu":
        raise ValueError(
            "cpu: this machine's CPU has no datasheet and is not in the catalog; one --gpu cpu "
            "reads its peaks from the calibration --host-from names"
        )
    if key not in CATALOG:
        raise ValueError(
            f"unknown gpu {name!r}: the catalog has {', '.join(CATALOG)} (aliases: "
            f"{', '.join(ALIASES)}), or give custom:tflops=…,tbs=…,gib=…"
        )
    return CATALOG[key]


CUSTOM_REQUIRED = ("tflops", "tbs", "gib")
CUSTOM_OPTIONAL = ("fp8tflops", "linkgbs", "linkus")
CUSTOM_FORM = "custom:tflops=<dense bf16 TFLOP/s>,tbs=<memory TB/s>,gib=<memory GiB>[,fp8tflops=…,linkgbs=…,linkus=…]"


def custom_device(spec: str) -> Device:
    """A device from the user's own figures: ``custom:tflops=989,tbs=3.35,gib=79.18`` (dense
    bf16 TFLOP/s, memory TB/s, memory in GiB as the driver reports it), optionally
    ``fp8tflops=`` (without it: no FP8), ``linkgbs=`` (one direction, GB/s; default PCIe 4's
    32) and ``linkus=`` (microseconds; default 10).

    Raises:
        ValueError: in one line naming the field, for one missing, unknown, repeated or not a
            positive number.
    """
    if not isinstance(spec, str) or not spec.strip().lower().startswith("custom:"):
        raise ValueError(f"a custom gpu is {CUSTOM_FORM}, got {spec!r}")
    values: dict[str, float] = {}
    for item in spec.strip()[len("custom:") :].split(","):
        if not item.strip():
            continue
        key, sep, text = (part.strip() for part in item.partition("="))
        key = key.lower()
        if not sep or key not in CUSTOM_REQUIRED + CUSTOM_OPTIONAL:
            raise ValueError(
                f"custom gpu: unknown field {item.strip()!r}; the form is {CUSTOM_FORM}"
            )
        if key in values:
            raise ValueError(f"custom gpu: {key} given twice")
        try:
            number = float(text)
        except ValueError:
            allowed = "a number >= 0" if key == "linkus" else "a positive finite number"
            raise ValueError(f"custom gpu: {key} must be {allowed}, got {text!r}") from None
        values[key] = _positive(f"custom gpu: {key}", number) if key != "linkus" else number
    missing = [key for key in CUSTOM_REQUIRED if key not in values]
    if missing:
        raise ValueError(f"custom gpu: missing {', '.join(missing)}; the form is {CUSTOM_FORM}")
    latency = values.get("linkus", PCIE_LATENCY * 1e6)
    if not (math.isfinite(latency) and latency >= 0):
        raise ValueError(f"custom gpu: linkus must be a number >= 0, got {latency!r}")
    peaks = {"bf16": values["tflops"] * TERA}
    if "fp8tflops" in values:
        peaks["fp8"] = values["fp8tflops"] * TERA
    figures = ",".join(f"{k}={values[k]:g}" for k in values)
    return Device(
        key="custom",
        name=f"custom device ({figures})",
        architecture="custom",
        peak_flops=peaks,
        memory_bandwidth=values["tbs"] * TERA,
        memory_bytes=values["gib"] * GiB,
        link_bandwidth=values.get("linkgbs", 32.0) * GB,
        link_latency=latency / 1e6,  # divided, so 10 µs is PCIE_LATENCY exactly (its link)
        source=f"the user's figures ({figures})",
    )
