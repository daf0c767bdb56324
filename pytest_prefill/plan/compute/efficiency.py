"""How much of a device's datasheet peaks an engine's kernels reach: efficiency tables fitted on
public per-operation measurements, and the lookup that borrows a near device's table (saying so,
with that transfer's measured error) when a device has none (DESIGN.md, "Compute from the model
and the device"). Standard library only."""

from __future__ import annotations

import bisect
import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_prefill.plan.compute.devices import Device

TABLES = Path(__file__).resolve().parent / "tables"
TRANSFER_FILE = "transfer.json"  # the measured error of each kind of transfer, not a table

# Release order of the architectures the tables may cover: "nearest generation" is nearest here.
GENERATIONS: tuple[str, ...] = ("volta", "turing", "ampere", "ada", "hopper", "blackwell")


def _finite(name: str, value: object, *, low: float = 0.0, open_low: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and (value > low if open_low else value >= low):  # type: ignore[operator]
        return float(value)  # type: ignore[arg-type]
    bound = f"> {low:g}" if open_low else f">= {low:g}"
    raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")


def _fraction(name: str, value: object) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and 0 < value <= 1:  # type: ignore[operator]
        return float(value)  # type: ignore[arg-type]
    raise ValueError(f"{name} must be an efficiency in (0, 1], got {value!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class Efficiency:
    """The fraction of ``device``'s peaks that ``engine``'s kernels reach, fitted on per-op data.

    ``compute_bins``: ``(upper bound of m, eta_c)`` pairs, m = the tokens (rows) in the GEMM,
    bounds ascending and the last one infinite. A GEMM costs ``gemm_t0 + (c^q + w^q)^(1/q)``,
    c = 2mnk / (eta_c(m) * P), w = bytes / (memory_efficiency * W), bytes = 2(mk + kn + mn) at
    bf16, q = ``gemm_sharpness`` (infinite: the max of the two). One prefill attention call over
    ``b`` sequences costs ``attention_t0 + b * prefill_attention_per_sequence + pair FLOPs /
    (eta_p(head_dim) * P) + Q, K, V, O bytes / (memory_efficiency * W)`` (pair FLOPs 4 * heads *
    head_dim per causal (query, key) pair, the diagonal's tiles whole: ``prefill_tile / 2``
    pairs more per token; eta_p from ``prefill_head_dim_bins``, ``(upper bound of head_dim,
    eta)`` pairs, else attention_compute_efficiency); one decode attention
    call ``attention_t0 + b * heads * decode_attention_per_head + max(pair FLOPs /
    (attention_compute_efficiency * P), cached K and V bytes / (attention_memory_efficiency *
    W))``. An all-reduce of ``B`` bytes over ``n`` devices costs ``allreduce_latency +
    allreduce_rank_latency * (n-1) + 2(n-1)/n * B / allreduce_bandwidth`` (NCCL's ring, bus
    bytes/s); with an ``allreduce_custom_bandwidth`` (0: none), vLLM's custom all-reduce where it
    runs instead (:meth:`allreduce_seconds`). The three attention host terms default to 0 for a
    table that has none. ``held_out_error``: the largest per-op median relative error of this
    table on shapes not used to fit it.

    Raises:
        ValueError: naming the field, for an empty name, a negative or non-finite time, an
            efficiency outside (0, 1], or bins not ascending to infinity.
    """

    device: str
    engine: str
    gemm_t0: float
    compute_bins: tuple[tuple[float, float], ...]
    memory_efficiency: float
    attention_compute_efficiency: float
    attention_memory_efficiency: float
    allreduce_latency: float
    allreduce_bandwidth: float
    held_out_error: float
    source: str
    attention_t0: float = 0.0
    prefill_attention_per_sequence: float = 0.0
    decode_attention_per_head: float = 0.0
    gemm_sharpness: float = math.inf
    prefill_head_dim_bins: tuple[tuple[float, float], ...] = ()
    prefill_tile: int = 0
    allreduce_rank_latency: float = 0.0
    allreduce_custom_latency: float = 0.0
    allreduce_custom_bandwidth: float = 0.0
    allreduce_fully_connected: bool = True

    def __post_init__(self) -> None:
        for name in ("device", "engine", "source"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        _finite("gemm_t0", self.gemm_t0)
        _check_bins(self.compute_bins)
        _fraction("memory_efficiency", self.memory_efficiency)
        _fraction("attention_compute_efficiency", self.attention_compute_efficiency)
        _fraction("attention_memory_efficiency", self.attention_memory_efficiency)
        _finite("allreduce_latency", self.allreduce_latency)
        _finite("allreduce_bandwidth", self.allreduce_bandwidth, open_low=True)
        _finite("allreduce_rank_latency", self.allreduce_rank_latency)
        _finite("allreduce_custom_latency", self.allreduce_custom_latency)
        _finite("allreduce_custom_bandwidth", self.allreduce_custom_bandwidth)
        if not isinstance(self.allreduce_fully_connected, bool):
            raise ValueError(
                "allreduce_fully_connected must be true or false, got "
                f"{self.allreduce_fully_connected!r}"
            )
        _finite("held_out_error", self.held_out_error)
        _finite("attention_t0", self.attention_t0)
        _finite("prefill_attention_per_sequence", self.prefill_attention_per_sequence)
        _finite("decode_attention_per_head", self.decode_attention_per_head)
        if not (_is_number(self.gemm_sharpness) and self.gemm_sharpness >= 1):
            raise ValueError(f"gemm_sharpness must be a number >= 1, got {self.gemm_sharpness!r}")
        tile = self.prefill_tile
        if isinstance(tile, bool) or not isinstance(tile, int) or tile < 0:
            raise ValueError(f"prefill_tile must be a whole number of tokens >= 0, got {tile!r}")
        if self.prefill_head_dim_bins != ():
            _check_bins(self.prefill_head_dim_bins, "prefill_head_dim_bins")

    def compute_efficiency(self, m: int) -> float:
        """eta_c for a GEMM of ``m`` rows: the first bin whose upper bound is >= ``m``."""
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ValueError(f"m must be a positive whole number of tokens, got {m!r}")
        bounds = [bound for bound, _ in self.compute_bins]
        return self.compute_bins[bisect.bisect_left(bounds, m)][1]

    def prefill_attention_efficiency(self, head_dim: int) -> float:
        """Prefill attention's eta for ``head_dim``: the first head-size bin whose bound is >=
        it, else ``attention_compute_efficiency`` (a table without head-size bins)."""
        if not self.prefill_head_dim_bins:
            return self.attention_compute_efficiency
        bounds = [bound for bound, _ in self.prefill_head_dim_bins]
        return self.prefill_head_dim_bins[bisect.bisect_left(bounds, head_dim)][1]

    def roofline(self, compute: float, memory: float) -> float:
        """Compute and memory time overlapped: ``(c^q + m^q)^(1/q)``, the max when q is inf."""
        q, larger = self.gemm_sharpness, max(compute, memory)
        if math.isinf(q) or larger <= 0:
            return larger
        return float(larger * ((compute / larger) ** q + (memory / larger) ** q) ** (1 / q))

    def gemm_seconds(
        self, m: int, flops: float, moved: float, peak: float, bandwidth: float
    ) -> float:
        """A GEMM of ``m`` rows doing ``flops`` and moving ``moved`` bytes on a device of
        ``peak`` FLOP/s and ``bandwidth`` bytes/s."""
        compute = flops / (self.compute_efficiency(max(1, m)) * peak)
        return self.gemm_t0 + self.roofline(compute, moved / (self.memory_efficiency * bandwidth))

    def prefill_attention_seconds(
        self, computed_pairs: float, cost: AttentionCall, peak: float, bandwidth: float
    ) -> float:
        """One prefill attention call computing ``computed_pairs`` (query, key) pairs (the
        diagonal's tiles included: :meth:`prefill_computed_pairs`)."""
        flops = 4.0 * cost.heads * cost.head_dim * computed_pairs
        compute = flops / (self.prefill_attention_efficiency(cost.head_dim) * peak)
        fixed = self.attention_t0 + cost.sequences * self.prefill_attention_per_sequence
        return fixed + compute + cost.moved / (self.memory_efficiency * bandwidth)

    def prefill_computed_pairs(self, causal_pairs: float, tokens: float) -> float:
        """The (query, key) pairs the prefill kernel computes for ``causal_pairs`` causal pairs
        over ``tokens`` new tokens: the diagonal's tiles whole."""
        return causal_pairs + tokens * self.prefill_tile / 2

    def decode_attention_seconds(
        self, pairs: float, cost: AttentionCall, peak: float, bandwidth: float
    ) -> float:
        """One decode attention call over ``pairs`` (query, key) pairs reading ``cost.moved``
        bytes of cached K and V."""
        flops = 4.0 * cost.heads * cost.head_dim * pairs
        compute = flops / (self.attention_compute_efficiency * peak)
        read = cost.moved / (self.attention_memory_efficiency * bandwidth)
        fixed = self.attention_t0 + cost.sequences * cost.heads * self.decode_attention_per_head
        return fixed + max(compute, read)

    def allreduce_seconds(self, size: float, devices: int) -> float:
        """One all-reduce of ``size`` bytes over ``devices`` devices: vLLM's custom all-reduce
        where it runs (a table with a custom bandwidth; under its 8 MiB buffer; two devices, or
        more on a fully connected link), one-shot (each rank reads its peers' whole buffers)
        up to the sizes vLLM's kernel picks it for, else two-shot (the ring's bytes); NCCL's
        ring otherwise."""
        ring = 2 * (devices - 1) / devices * size
        ranks = self.allreduce_rank_latency * (devices - 1)
        if self.allreduce_custom_bandwidth > 0 and custom_allreduce_runs(
            size, devices, self.allreduce_fully_connected
        ):
            moved = (devices - 1) * size if one_shot(size, devices) else ring
            return self.allreduce_custom_latency + ranks + moved / self.allreduce_custom_bandwidth
        return self.allreduce_latency + ranks + ring / self.allreduce_bandwidth


# vLLM's custom all-reduce (vllm/distributed/device_communicators/custom_all_reduce.py,
# csrc/custom_all_reduce.cuh): messages under its 8 MiB buffer, on two devices or a fully
# connected (NVLink) group of the sizes it supports; one-shot below these sizes for up to 4 and
# up to 8 devices
CUSTOM_ALLREDUCE_MAX_BYTES = 8 * 2**20
CUSTOM_ALLREDUCE_DEVICES = (2, 4, 6, 8)
ONE_SHOT_BYTES = {4: 512 * 2**10, 8: 256 * 2**10}


def custom_allreduce_runs(size: float, devices: int, fully_connected: bool) -> bool:
    """Whether vLLM's custom all-reduce takes ``size`` bytes over ``devices`` devices."""
    supported = devices in CUSTOM_ALLREDUCE_DEVICES and (devices == 2 or fully_connected)
    return supported and size < CUSTOM_ALLREDUCE_MAX_BYTES


def one_shot(size: float, devices: int) -> bool:
    """Whether vLLM's custom all-reduce runs one-shot (else two-shot) for this message."""
    return devices == 2 or any(
        devices <= most and size < below for most, below in ONE_SHOT_BYTES.items()
    )


@dataclasses.dataclass(frozen=True, slots=True)
class AttentionCall:
    """One attention call's shape: ``sequences`` in it, ``heads`` (query heads) of
    ``head_dim``, and the bytes it ``moved`` (prefill: Q, K, V, O and any cached K, V; decode:
    the cached K and V read)."""

    sequences: float
    heads: float
    head_dim: int
    moved: float


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _check_bins(bins: object, name: str = "compute_bins") -> None:
    if not isinstance(bins, tuple) or not bins:
        raise ValueError(f"{name} must be a non-empty tuple of (bound, eta), got {bins!r}")
    previous = 0.0
    for index, pair in enumerate(bins):
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise ValueError(f"{name}[{index}] must be a (bound, eta) pair, got {pair!r}")
        bound, eta = pair
        ok = isinstance(bound, (int, float)) and not isinstance(bound, bool)
        if not ok or math.isnan(bound) or bound <= previous:
            raise ValueError(
                f"{name}[{index}] bound must be above the one before ({previous:g}), got {bound!r}"
            )
        _fraction(f"{name}[{index}] eta", eta)
        previous = bound
    if previous != math.inf:
        raise ValueError(f"{name}' last bound must be inf, got {previous!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class EfficiencyChoice:
    """The table a device's compute uses: its own (``transferred_from`` None) or a near device's
    (``transferred_from`` its catalog key), with the error class measured for that choice."""

    table: Efficiency
    transferred_from: str | None
    error_class: str

    def __post_init__(self) -> None:
        if not isinstance(self.table, Efficiency):
            raise ValueError(f"table must be an Efficiency, got {type(self.table).__name__}")
        if self.transferred_from is not None and self.transferred_from != self.table.device:
            raise ValueError(
                f"transferred_from must be the table's device {self.table.device!r} or None, "
                f"got {self.transferred_from!r}"
            )
        if not isinstance(self.error_class, str) or not self.error_class.strip():
            raise ValueError(f"error_class must be a non-empty string, got {self.error_class!r}")


TABLE_FIELDS = (
    "device",
    "engine",
    "gemm_t0",
    "compute_bins",
    "memory_efficiency",
    "attention_compute_efficiency",
    "attention_memory_efficiency",
    "allreduce_latency",
    "allreduce_bandwidth",
    "held_out_error",
    "source",
)
OPTIONAL_FIELDS = (
    "attention_t0",
    "prefill_attention_per_sequence",
    "decode_attention_per_head",
    "gemm_sharpness",
    "prefill_head_dim_bins",
    "prefill_tile",
    "allreduce_rank_latency",
    "allreduce_custom_latency",
    "allreduce_custom_bandwidth",
    "allreduce_fully_connected",
)
SOURCE_FIELDS = ("repository", "commit", "path", "licence")


def table_from_json(document: Mapping[str, Any], where: str) -> Efficiency:
    """The :class:`Efficiency` a table file holds; ``where`` names the file in every error.

    The file's ``source`` is an object with ``repository``, ``commit``, ``path`` and
    ``licence``; the last bin's bound is ``null`` (JSON has no infinity).

    Raises:
        ValueError: ``"<where>: <field> ..."`` for a missing or invalid field.
    """
    if not isinstance(document, Mapping):
        raise ValueError(f"{where}: a table must be a JSON object, got {type(document).__name__}")
    missing = [name for name in TABLE_FIELDS if name not in document]
    if missing:
        raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
    source = document["source"]
    if not isinstance(source, Mapping) or any(
        not isinstance(source.get(key), str) or not source.get(key) for key in SOURCE_FIELDS
    ):
        raise ValueError(f"{where}: source must be an object with {', '.join(SOURCE_FIELDS)}")
    values = {name: document[name] for name in TABLE_FIELDS + OPTIONAL_FIELDS if name in document}
    for name in ("compute_bins", "prefill_head_dim_bins"):
        if name in document:
            values[name] = _bins_from_json(document[name], name, where)
    values["source"] = (
        f"{source['repository']}@{source['commit']} {source['path']}, {source['licence']}"
    )
    try:
        return Efficiency(**values)
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None


def _bins_from_json(bins: object, name: str, where: str) -> tuple[tuple[float, float], ...]:
    """``[[bound, eta], ..., [null, eta]]`` as (bound, eta) pairs, the null bound infinite."""
    if not isinstance(bins, list) or any(not isinstance(b, list) or len(b) != 2 for b in bins):
        raise ValueError(f"{where}: {name} must be a list of [bound, eta] pairs")
    return tuple((math.inf if bound is None else bound, eta) for bound, eta in bins)


def load_table(path: Path) -> Efficiency:
    """Read one table file (see :func:`table_from_json`).

    Raises:
        ValueError: naming the file, for unreadable JSON or an invalid field.
    """
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{Path(path).name}: not a readable JSON table ({error})") from None
    return table_from_json(document, Path(path).name)


def load_tables(folder: Path = TABLES) -> tuple[Efficiency, ...]:
    """Every table in ``folder`` (the shipped ones by default), in file-name order."""
    if not folder.is_dir():
        return ()
    files = sorted(p for p in folder.glob("*.json") if p.name != TRANSFER_FILE)
    return tuple(load_table(path) for path in files)


def _transfer_document(folder: Path) -> object:
    """The transfer file in ``folder`` as JSON ({} when there is none).

    Raises:
        ValueError: naming the file, when it cannot be read as JSON.
    """
    path = folder / TRANSFER_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{TRANSFER_FILE}: not readable JSON ({error})") from None


def load_transfer_errors(folder: Path = TABLES) -> dict[str, float]:
    """The measured median error of each transfer kind (``"same_architecture"``,
    ``"cross_generation"``) from the fit script's leave-one-device-out; {} when not measured."""
    return _transfer_errors(_transfer_document(folder))


def _transfer_errors(document: object) -> dict[str, float]:
    errors: dict[str, float] = {}
    for kind in ("same_architecture", "cross_generation"):
        entry = document.get(kind) if isinstance(document, Mapping) else None
        if entry is not None:
            median = entry.get("median") if isinstance(entry, Mapping) else entry
            errors[kind] = _finite(f"{TRANSFER_FILE}: {kind}.median", median)
    return errors


OP_NAMES = {
    "gemm": "GEMM",
    "prefill_attention": "prefill attention",
    "decode_attention": "decode attention",
    "allreduce": "all-reduce",
}


def load_transfer_worst(folder: Path = TABLES) -> dict[str, tuple[str, float]]:
    """Per transfer kind, the op a borrowed table predicts worst (its median error), from
    ``by_op`` in the transfer file; {} when not recorded.

    Raises:
        ValueError: naming the field, for one that is not a finite number.
    """
    return _transfer_worst(_transfer_document(folder))


def _transfer_worst(document: object) -> dict[str, tuple[str, float]]:
    worst: dict[str, tuple[str, float]] = {}
    for kind in ("same_architecture", "cross_generation"):
        entry = document.get(kind) if isinstance(document, Mapping) else None
        by_op = entry.get("by_op") if isinstance(entry, Mapping) else None
        if not isinstance(by_op, Mapping) or not by_op:
            continue
        medians = {
            str(op): _finite(f"{TRANSFER_FILE}: {kind}.by_op.{op}.median", e.get("median"))
            for op, e in by_op.items()
            if isinstance(e, Mapping)
        }
        if medians:
            op = max(medians, key=lambda name: medians[name])
            worst[kind] = (op, medians[op])
    return worst


def link_kind(device: Device) -> str:
    """``"pcie"`` or ``"nvlink"`` (NVLink, Infinity Fabric): the catalog gives a PCIe link its
    PCIe latency assumption, as it does a custom device's default link."""
    from pytest_prefill.plan.compute.devices import PCIE_LATENCY

    return "pcie" if device.link_latency >= PCIE_LATENCY else "nvlink"


def _distance(a: Device, b: Device) -> float:
    """How far apart two devices' datasheets are: log ratios of bf16 peak and bandwidth."""
    flops_a, flops_b = a.peak_flops.get("bf16"), b.peak_flops.get("bf16")
    flops = abs(math.log(flops_a / flops_b)) if flops_a and flops_b else 0.0
    return flops + abs(math.log(a.memory_bandwidth / b.memory_bandwidth))


def _generation(architecture: str) -> int | None:
    return GENERATIONS.index(architecture) if architecture in GENERATIONS else None


def _engine_tables(tables: Sequence[Efficiency], engine: str) -> list[Efficiency]:
    """The tables of ``engine`` ("vllm" matches "vllm-0.8.5"), newest version per device."""
    if not isinstance(engine, str) or not engine.strip():
        raise ValueError(f"engine must be a non-empty name, got {engine!r}")
    matching = [t for t in tables if t.engine == engine or t.engine.startswith(f"{engine}-")]
    if not matching:
        engines = sorted({t.engine.split("-")[0] for t in tables}) or ["none shipped"]
        raise ValueError(f"engine {engine!r} has no efficiency table; tables: {', '.join(engines)}")
    newest: dict[str, Efficiency] = {}
    for table in sorted(matching, key=lambda t: _version_key(t.engine)):
        newest[table.device] = table
    return list(newest.values())


def _version_key(engine: str) -> tuple[int, ...]:
    version = engine.partition("-")[2]
    return tuple(int(part) if part.isdigit() else -1 for part in version.split("."))


def efficiency_for(
    device: Device,
    engine: str = "vllm",
    *,
    tables: Sequence[Efficiency] | None = None,
    catalog: Mapping[str, Device] | None = None,
    transfer_errors: Mapping[str, float] | None = None,
) -> EfficiencyChoice:
    """The efficiency table for ``device`` under ``engine``: its own when there is one, else the
    nearest device (by datasheet) of its architecture, else of the nearest generation (a custom
    device: the nearest datasheet of any), its all-reduce bandwidth scaled by the two links'
    ratio; the choice says which, with the error measured for that kind of transfer.

    ``tables``, ``catalog`` and ``transfer_errors`` default to the shipped ones.

    Raises:
        ValueError: for an engine with no table, or a device whose architecture no table can
            stand for (a CPU: calibrate it instead).
    """
    tables = load_tables() if tables is None else tables
    if catalog is None:
        from pytest_prefill.plan.compute.devices import CATALOG

        catalog = CATALOG
    errors, worst_ops = dict(transfer_errors or {}), {}
    if transfer_errors is None:  # the shipped file, read once
        document = _transfer_document(TABLES)
        errors, worst_ops = _transfer_errors(document), _transfer_worst(document)
    candidates = _engine_tables(tables, engine)
    own = [t for t in candidates if t.device == device.key]
    if own:
        table = own[0]
        return EfficiencyChoice(
            table, None, f"fitted on this device: {table.held_out_error:.0%} median held out"
        )
    known = [(t, catalog[t.device]) for t in candidates if t.device in catalog]
    same = [pair for pair in known if pair[1].architecture == device.architecture]
    if same:
        kind, pool = "same_architecture", same
    else:
        generation = _generation(device.architecture)
        ranked = [
            (pair, found)
            for pair in known
            if (found := _generation(pair[1].architecture)) is not None
        ]
        if device.architecture == "cpu" or not ranked:
            raise ValueError(
                f"device {device.key!r} ({device.architecture}) has no {engine} efficiency table "
                f"and no GPU to borrow one from; calibrate it on the device instead"
            )
        # an architecture outside the known generations (a custom device): nearest datasheet
        gap = 0 if generation is None else min(abs(g - generation) for _, g in ranked)
        pool = [p for p, g in ranked if generation is None or abs(g - generation) == gap]
        kind = "cross_generation"
    table, donor = min(pool, key=lambda pair: (_distance(device, pair[1]), pair[1].key))
    # the all-reduce goes with the link (NVLink or PCIe), as the data's fit does: from the
    # nearest table of this device's link kind when the donor's link is another
    linked = [pair for pair in known if link_kind(pair[1]) == link_kind(device)]
    lender = table, donor
    if link_kind(device) != link_kind(donor) and linked:
        lender = min(linked, key=lambda pair: (_link_distance(device, pair[1]), pair[1].key))
    table = _with_allreduce_of(table, *lender, device)
    label = kind.replace("_", " ")
    error = _transfer_error(kind, errors, worst_ops) + _allreduce_note(device, donor, lender[1])
    return EfficiencyChoice(table, donor.key, f"{label} transfer from {donor.key}: {error}")


def _transfer_error(
    kind: str, errors: Mapping[str, float], worst_ops: Mapping[str, tuple[str, float]]
) -> str:
    """The measured error of ``kind`` of transfer, and its worst op's where that is larger."""
    measured = errors.get(kind)
    if measured is None:
        return "error not measured"
    error = f"~{measured:.0%} median"
    worst = worst_ops.get(kind)
    if worst is not None and worst[1] > measured:
        error += f" ({OP_NAMES.get(worst[0], worst[0])} ~{worst[1]:.0%})"
    return error


def _allreduce_note(device: Device, donor: Device, lent: Device) -> str:
    """Where a borrowed table's all-reduce figures come from, when not from ``donor`` on this
    device's link kind: another table of its link kind, or one of another link."""
    if link_kind(device) != link_kind(lent):  # its all-reduce figures were fitted on another link
        return (
            f"; all-reduce: a cross-link transfer ({link_kind(lent)} figures on a "
            f"{link_kind(device)} link), its error not measured"
        )
    if lent.key != donor.key:
        return f"; all-reduce from {lent.key}, a {link_kind(lent)} link as this device's"
    return ""


def _link_distance(a: Device, b: Device) -> float:
    """How far apart two devices' links are (log ratio of bandwidth), then their datasheets."""
    return abs(math.log(a.link_bandwidth / b.link_bandwidth)) + _distance(a, b) / 100


def _with_allreduce_of(
    table: Efficiency, lender: Efficiency, lent: Device, device: Device
) -> Efficiency:
    """``table`` with ``lender``'s all-reduce figures (fitted on ``lent``'s link) carried to
    ``device``'s link: the bandwidths scaled by the two links' ratio (efficiencies are fractions
    and carry over; a bandwidth is absolute)."""
    ratio = device.link_bandwidth / lent.link_bandwidth
    return dataclasses.replace(
        table,
        allreduce_latency=lender.allreduce_latency,
        allreduce_bandwidth=lender.allreduce_bandwidth * ratio,
        allreduce_rank_latency=lender.allreduce_rank_latency,
        allreduce_custom_latency=lender.allreduce_custom_latency,
        allreduce_custom_bandwidth=lender.allreduce_custom_bandwidth * ratio,
        allreduce_fully_connected=link_kind(device) == "nvlink",
    )
