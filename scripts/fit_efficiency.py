"""Fit the efficiency tables (pytest_prefill/plan/compute/tables/) from aiconfigurator's public
per-operation measurements, kept OUTSIDE the repository. Two steps:

    # 1. the raw data: aiconfigurator's systems/data (Apache-2.0), e.g. from a clone at COMMIT:
    #    git -C aiconfigurator archive COMMIT aic-core/src/aiconfigurator_core/systems/data | ...
    #    then CSVs per (device, vLLM version) -- needs pyarrow, nothing else does:
    python scripts/fit_efficiency.py extract --data DIR/systems/data --commit COMMIT \\
        --out /work/compute-data/ops
    # Vidur's GEMM profiles (MIT), a second lab's data the tables are tested on, never fitted on:
    python scripts/fit_efficiency.py extract-vidur --data VIDUR/data/profiling/compute \\
        --commit COMMIT --out /work/compute-data/vidur
    # 2. the tables (numpy) and transfer.json (each kind of device transfer's measured error):
    PYTHONPATH=. python scripts/fit_efficiency.py fit --ops /work/compute-data/ops
    # or only the shipped tables' all-reduce figures (their other figures as they are):
    PYTHONPATH=. python scripts/fit_efficiency.py refit-allreduce --ops /work/compute-data/ops
    # or only their attention figures:
    PYTHONPATH=. python scripts/fit_efficiency.py refit-attention --ops /work/compute-data/ops
    # and then transfer.json again: the shipped tables borrowed as the runtime borrows them
    PYTHONPATH=. python scripts/fit_efficiency.py transfer --ops /work/compute-data/ops

Per (device, engine version): a GEMM of (m, n, k) costs ``t0 + (c^q + w^q)^(1/q)``, c =
2mnk / (eta_c(m) P), w = 2(mk + kn + mn) / (eta_m W), q the fitted sharpness of the roofline;
prefill attention (causal, batch b, length s, head size d) ``ta + b tp + 4 h d b (s(s+1)/2 +
s tile/2) / (eta_p(d) P) + 2 b s (2h + 2kvh) d / (eta_m W)`` (tile: the kernels' 128-token
diagonal tiles run whole; eta_p by head-size bin); decode attention (batch b,
``s`` cached tokens) ``ta + b h td + max(4 h d b s / (eta_ac P), 2 b s 2 kvh d / (eta_am W))``; an
all-reduce as ALLREDUCE_MODEL says. P and W are the catalog's datasheet peaks. Rows that move at most 128 MiB (cache-resident in a timing loop)
are left out. The fit minimises the mean absolute log error; a GEMM-size bin whose rows are not
compute-bound in the fit is refused and takes the next larger bin's eta_c."""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pytest_prefill.plan.compute.devices import CATALOG
from pytest_prefill.plan.compute.efficiency import (
    CUSTOM_ALLREDUCE_DEVICES,
    CUSTOM_ALLREDUCE_MAX_BYTES,
    ONE_SHOT_BYTES,
    AttentionCall,
    Efficiency,
    efficiency_for,
    link_kind,
    load_tables,
)

# the all-reduce's form, in the docstring above and in each table's "model"
ALLREDUCE_MODEL = (
    "an all-reduce of ``B`` bytes over ``n`` devices, vLLM's custom all-reduce under its 8 MiB "
    "buffer (two devices, or more over NVLink) ``custom_latency + rank_latency (n-1) + bytes / "
    "(custom_fraction L)``, bytes ``(n-1) B`` one-shot (the sizes vLLM's kernel picks it for) "
    "else ``2 (n-1)/n B``; NCCL's ring above ``latency + rank_latency (n-1) + 2 (n-1)/n B / "
    "(fraction L)``; L the catalog's link bandwidth (so the fractions carry to another link), "
    "fitted per link kind (NVLink, PCIe)"
)
ALLREDUCE_PLACEHOLDER = "an all-reduce as ALLREDUCE_MODEL says"
REPOSITORY = "github.com/ai-dynamo/aiconfigurator"
LICENCE = "Apache-2.0"
DATA_PATH = "aic-core/src/aiconfigurator_core/systems/data"
DEVICES = {  # aiconfigurator's system name -> our catalog key
    "a100_sxm": "a100-80",
    "h100_sxm": "h100-sxm",
    "h200_sxm": "h200",
    "b200_sxm": "b200",
    "l40s": "l40s",
}
BIN_BOUNDS = (16.0, 64.0, 256.0, 1024.0, 4096.0, math.inf)
HEAD_DIM_BOUNDS = (64.0, 128.0, 192.0, 256.0, math.inf)  # prefill attention's kernels by head size
# query/key tile of the prefill kernels: the causal diagonal's tiles run whole (a table's
# prefill_tile, which the runtime adds as tokens * tile / 2 pairs)
PREFILL_TILE = 128
# aiconfigurator times one op in a loop: an op whose operands fit in the on-chip L2 (40 MB on
# the A100, 50 MB on Hopper, 96 MB on the L40S, more on the B200) reads them from the cache on
# every iteration, where a serving step, streaming every layer's weights and KV cache, finds
# them in DRAM. Rows that move no more than this are measuring the cache: left out of fit and test.
CACHE_RESIDENT_BYTES = 128 * 2**20
LAUNCH_BOUND = 0.1  # a GEMM whose roofline is under this share of its time measures its launch
MIN_BOUND_ROWS = 20  # rows a GEMM-size bin needs, compute-bound in the fit, to keep its own eta_c
MIN_GEMM_DIM = 256  # n and k of every GEMM in a layer of a model of 0.5B parameters or more
ALLREDUCE_REFUSAL = 0.25  # held-out median error past which the all-reduce fit is flagged
OPS = ("gemm", "prefill_attention", "decode_attention", "allreduce")
TABLES = Path(__file__).resolve().parents[1] / "pytest_prefill/plan/compute/tables"


# ---- extraction (pyarrow) -------------------------------------------------------------------


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in version.split("."))


def _write_csv(path: Path, header: Sequence[str], rows: list[tuple[float, ...]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


def extract(data: Path, commit: str, out: Path) -> None:
    """CSVs per (device, vLLM version) with gemm, attention and all-reduce rows in seconds."""
    import pyarrow.parquet as pq

    def rows(path: Path) -> list[dict[str, object]]:
        return pq.read_table(path).to_pylist() if path.is_file() else []

    for system, key in DEVICES.items():
        versions = sorted(
            (p.name for p in (data / system / "gemm/vllm").glob("*")), key=_version_key
        )
        comm = sorted((p.name for p in (data / system / "comm/vllm").glob("*")), key=_version_key)
        for version in versions:
            attention = data / system / "attention/vllm" / version
            gemm_file = data / system / "gemm/vllm" / version / "gemm_perf.parquet"
            if not (
                gemm_file.is_file() and (attention / "context_attention_perf.parquet").is_file()
            ):
                continue
            folder = out / key / f"vllm-{version}"
            gemm = [
                (r["m"], r["n"], r["k"], r["latency"] / 1e3)
                for r in rows(gemm_file)
                if r["gemm_dtype"] == "bfloat16"
            ]
            _write_csv(folder / "gemm.csv", ("m", "n", "k", "seconds"), gemm)
            for op, name, length in (
                ("prefill_attention", "context", "isl"),
                ("decode_attention", "generation", "step"),
            ):
                kept = [
                    (r["batch_size"], r[length], r["num_heads"], r["num_key_value_heads"],
                     r["head_dim"], r["latency"] / 1e3)
                    for r in rows(attention / f"{name}_attention_perf.parquet")
                    if r["kv_cache_dtype"] == "bfloat16" and r.get("window_size", 0) == 0
                ]  # fmt: skip
                header = ("batch", "tokens", "heads", "kv_heads", "head_dim", "seconds")
                _write_csv(folder / f"{op}.csv", header, kept)
            older = [v for v in comm if _version_key(v) <= _version_key(version)] or comm
            comm_file = data / system / "comm/vllm" / older[-1] / "custom_allreduce_perf.parquet"
            allreduce = [
                (r["num_gpus"], r["message_size"] * 2, r["latency"] / 1e3)
                for r in rows(comm_file)
                if r["backend"] == "vllm_graph" and r["allreduce_dtype"] == "bfloat16"
            ]
            _write_csv(folder / "allreduce.csv", ("devices", "bytes", "seconds"), allreduce)
            paths = [
                f"{DATA_PATH}/{system}/gemm/vllm/{version}/gemm_perf.parquet",
                f"{DATA_PATH}/{system}/attention/vllm/{version}/",
                f"{DATA_PATH}/{system}/comm/vllm/{older[-1]}/custom_allreduce_perf.parquet",
            ]
            source = {"repository": REPOSITORY, "commit": commit, "licence": LICENCE}
            (folder / "source.json").write_text(json.dumps(source | {"paths": paths}, indent=1))


VIDUR_REPOSITORY = "github.com/microsoft/vidur"
VIDUR_DEVICES = {"a100": "a100-80", "h100": "h100-sxm"}  # Vidur's profiled GPUs in our catalog


def vidur_gemms(row: dict[str, str]) -> list[tuple[str, int, int, int, float]]:
    """A Vidur mlp.csv row's four GEMMs: (op, m, n, k, seconds by the median time)."""
    heads, kv_heads = int(row["n_head"]), int(row["n_kv_head"])
    hidden, expanded = int(row["n_embd"]), int(row["n_expanded_embd"])
    tp, m = int(row["num_tensor_parallel_workers"]), int(row["num_tokens"])
    head_dim = hidden // heads
    up = expanded * (2 if row["use_gated_mlp"] == "True" else 1)
    shapes = {
        "attn_pre_proj": ((heads + 2 * kv_heads) * head_dim // tp, hidden),
        "attn_post_proj": (hidden, heads * head_dim // tp),
        "mlp_up_proj": (up // tp, hidden),
        "mlp_down_proj": (hidden, expanded // tp),
    }
    return [
        (op, m, n, k, float(row[f"time_stats.{op}.median"]) / 1e3)
        for op, (n, k) in shapes.items()
        if row.get(f"time_stats.{op}.median")
    ]


def extract_vidur(data: Path, commit: str, out: Path) -> None:
    """Vidur's per-model GEMM profiles (data/profiling/compute/<gpu>/<org>/<model>/mlp.csv, MIT)
    as one gemm.csv per device: an independent lab's measurements to test the tables on."""
    for gpu, key in VIDUR_DEVICES.items():
        rows: list[tuple[float, ...]] = []
        paths = sorted((data / gpu).glob("*/*/mlp.csv"))
        for path in paths:
            with path.open(encoding="utf-8") as f:
                for row in csv.DictReader(f):
                    rows += [(m, n, k, seconds) for _, m, n, k, seconds in vidur_gemms(row)]
        if not rows:
            continue
        _write_csv(out / key / "gemm.csv", ("m", "n", "k", "seconds"), rows)
        source = {
            "repository": VIDUR_REPOSITORY,
            "commit": commit,
            "licence": "MIT",
            "paths": [
                f"data/profiling/compute/{gpu}/{p.parent.parent.name}/{p.parent.name}/mlp.csv"
                for p in paths
            ],
        }
        (out / key / "source.json").write_text(json.dumps(source, indent=1))


# ---- the per-op data and the physics (numpy) --------------------------------------------------


@dataclass(frozen=True)
class OpData:
    """One (device, engine) folder's rows: ``inputs`` by column, ``seconds`` measured."""

    device: str
    engine: str
    ops: dict[str, tuple[dict[str, np.ndarray], np.ndarray]]
    source: dict[str, object]
    gemm_floor: float = math.nan  # a GEMM's fixed cost: the launch-bound rows' median seconds


def load_ops(folder: Path) -> OpData:
    ops: dict[str, tuple[dict[str, np.ndarray], np.ndarray]] = {}
    for op in OPS:
        path = folder / f"{op}.csv"
        if not path.is_file():
            continue
        table = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
        header = path.read_text(encoding="utf-8").splitlines()[0].split(",")
        if len(table) == 0:
            continue
        columns = {name: table[:, i] for i, name in enumerate(header[:-1])}
        keep = (
            np.ones(len(table), bool)
            if op == "allreduce"
            else moved_bytes(op, columns) > (CACHE_RESIDENT_BYTES)
        )
        if op == "gemm":  # a transformer layer's shapes: aiconfigurator also times n, k = 32
            layer = (columns["n"] >= MIN_GEMM_DIM) & (columns["k"] >= MIN_GEMM_DIM)
            floor = launch_floor(columns, table[:, -1], folder.parent.name, layer)
            keep &= layer
        if keep.any():  # an op with no row left (every one cache-resident) is absent
            ops[op] = ({k: v[keep] for k, v in columns.items()}, table[keep, -1])
    source = json.loads((folder / "source.json").read_text(encoding="utf-8"))
    return OpData(folder.parent.name, folder.name, ops, source, floor)


def launch_floor(
    columns: dict[str, np.ndarray], seconds: np.ndarray, device: str, layer: np.ndarray
) -> float:
    """A GEMM's fixed cost, from the rows the DRAM-bound fit cannot see: the median time of the
    layer-shaped GEMMs whose roofline at the datasheet peaks is under LAUNCH_BOUND of their
    measured time (the cache holding their operands does not change a launch)."""
    if device not in CATALOG:
        return math.nan
    flops, memory = gemm_terms(columns, device)
    launch = layer & (np.maximum(flops, memory) < LAUNCH_BOUND * seconds)
    return float(np.median(seconds[launch])) if launch.any() else math.nan


def moved_bytes(op: str, c: dict[str, np.ndarray]) -> np.ndarray:
    """The bytes an op's row moves at bf16 (the memory terms of the model below)."""
    if op == "gemm":
        return 2 * (c["m"] * c["k"] + c["k"] * c["n"] + c["m"] * c["n"])
    b, s, h, kvh, hd = c["batch"], c["tokens"], c["heads"], c["kv_heads"], c["head_dim"]
    if op == "decode_attention":
        return 2 * b * (s + 1) * 2 * kvh * hd
    return 2 * b * s * (2 * h + 2 * kvh) * hd


def load_all(root: Path) -> list[OpData]:
    """Every (device, engine) under ``root`` whose device is in the catalog."""
    found = [p for p in sorted(root.glob("*/*")) if (p / "source.json").is_file()]
    return [load_ops(p) for p in found if p.parent.name in CATALOG]


def newest(data: Sequence[OpData]) -> dict[str, OpData]:
    """Each device's newest engine version."""
    chosen: dict[str, OpData] = {}
    for item in sorted(data, key=lambda d: _version_key(d.engine.partition("-")[2])):
        chosen[item.device] = item
    return chosen


def _sigmoid(x: np.ndarray | float) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=float)))


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


@dataclass(frozen=True)
class Params:
    """The fitted efficiencies; the device's peaks come from the catalog at prediction time."""

    t0: float
    eta_c: tuple[float, ...]  # one per BIN_BOUNDS
    eta_m: float
    eta_ac: float
    eta_am: float
    ar_latency: float
    ar_link_fraction: float  # bus bandwidth / the catalog's link bandwidth: carries to a device
    attention_t0: float = 0.0
    prefill_per_sequence: float = 0.0
    decode_per_sequence: float = 0.0
    gemm_sharpness: float = math.inf  # q of the roofline (c^q + m^q)^(1/q); inf: the max
    eta_hd: tuple[float, ...] = ()  # prefill attention's eta per HEAD_DIM_BOUNDS (else eta_ac)
    ar_by_link: tuple[tuple[str, AllReduceFit], ...] = ()  # (link kind, its fit)


@dataclass(frozen=True)
class AllReduceFit:
    """One link kind's all-reduce: NCCL's ring (``latency`` + ``rank_latency`` per rank past
    the first + ring bytes at ``fraction`` of the link) and vLLM's custom all-reduce below
    CUSTOM_ALLREDUCE_MAX_BYTES (``custom_latency`` + the same rank term + its one- or two-shot
    bytes at ``custom_fraction`` of the link; 0: no custom path)."""

    latency: float
    fraction: float
    rank_latency: float = 0.0
    custom_latency: float = 0.0
    custom_fraction: float = 0.0


def allreduce_figures(p: Params, device: str) -> tuple[AllReduceFit, bool]:
    """The all-reduce's figures for ``device``: its link kind's (NVLink or PCIe) when fitted,
    else the other kind's, with True: a cross-link transfer."""
    kind = link_kind(CATALOG[device])
    for fitted, figures in p.ar_by_link:
        if fitted == kind:
            return figures, False
    if p.ar_by_link:
        return p.ar_by_link[0][1], True
    return AllReduceFit(p.ar_latency, p.ar_link_fraction), False


def allreduce_seconds(
    fit: AllReduceFit, n: np.ndarray, size: np.ndarray, link: float, fully_connected: bool
) -> np.ndarray:
    """An all-reduce of ``size`` bytes over ``n`` devices (plan/compute/efficiency.py's
    form): vLLM's custom all-reduce where it runs (below its buffer's size; two devices, or
    more on a fully connected link: NVLink), one-shot (each rank reads its n-1 peers' whole
    buffers) up to the sizes vLLM's kernel picks it for, else two-shot (a reduce-scatter and
    an all-gather: the ring's bytes); NCCL's ring above."""
    ring = 2 * (n - 1) / n * size
    ranks = fit.rank_latency * (n - 1)
    nccl = fit.latency + ranks + ring / (fit.fraction * link)
    if fit.custom_fraction <= 0:
        return nccl
    supported = np.isin(n, CUSTOM_ALLREDUCE_DEVICES) & ((n == 2) | fully_connected)
    custom = supported & (size < CUSTOM_ALLREDUCE_MAX_BYTES)
    one_shot = (
        (n == 2) | ((n <= 4) & (size < ONE_SHOT_BYTES[4])) | ((n <= 8) & (size < ONE_SHOT_BYTES[8]))
    )
    moved = np.where(one_shot, (n - 1) * size, ring)
    by_custom = fit.custom_latency + ranks + moved / (fit.custom_fraction * link)
    return np.where(custom, by_custom, nccl)


def roofline(compute: np.ndarray, memory: np.ndarray, q: float) -> np.ndarray:
    """Compute and memory time overlapped: ``(c^q + m^q)^(1/q)``, the max as q grows."""
    if math.isinf(q):
        return np.maximum(compute, memory)
    return (compute**q + memory**q) ** (1 / q)


def gemm_terms(c: dict[str, np.ndarray], device: str) -> tuple[np.ndarray, np.ndarray]:
    d = CATALOG[device]
    m, n, k = c["m"], c["n"], c["k"]
    return 2 * m * n * k / d.peak_flops["bf16"], 2 * (m * k + k * n + m * n) / d.memory_bandwidth


def attention_terms(
    c: dict[str, np.ndarray], device: str, decode: bool
) -> tuple[np.ndarray, np.ndarray]:
    d = CATALOG[device]
    b, s, h, hd = c["batch"], c["tokens"], c["heads"], c["head_dim"]
    if decode:
        pairs = b * (s + 1)
    else:  # the causal diagonal's tiles are computed whole: s * tile / 2 pairs more
        pairs = b * (s * (s + 1) / 2 + s * PREFILL_TILE / 2)
    op = "decode_attention" if decode else "prefill_attention"
    flops = 4 * h * hd * pairs / d.peak_flops["bf16"]
    return flops, moved_bytes(op, c) / d.memory_bandwidth


def bin_index(m: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.array(BIN_BOUNDS), m, side="left")


def predict(op: str, p: Params, c: dict[str, np.ndarray], device: str) -> np.ndarray:
    if op == "gemm":
        flops, memory = gemm_terms(c, device)
        eta_c = np.array(p.eta_c)[bin_index(c["m"])]
        return p.t0 + roofline(flops / eta_c, memory / p.eta_m, p.gemm_sharpness)
    if op == "allreduce":
        figures, _ = allreduce_figures(p, device)
        target = CATALOG[device]
        full = link_kind(target) == "nvlink"
        return allreduce_seconds(figures, c["devices"], c["bytes"], target.link_bandwidth, full)
    decode = op == "decode_attention"
    flops, memory = attention_terms(c, device, decode)
    per_sequence = p.decode_per_sequence if decode else p.prefill_per_sequence
    fixed = p.attention_t0 + c["batch"] * (c["heads"] if decode else 1) * per_sequence
    if decode:
        return fixed + np.maximum(flops / p.eta_ac, memory / p.eta_am)
    eta = np.array(p.eta_hd)[head_dim_index(c["head_dim"])] if p.eta_hd else p.eta_ac
    return fixed + flops / eta + memory / p.eta_m


def head_dim_index(head_dim: np.ndarray) -> np.ndarray:
    return np.searchsorted(np.array(HEAD_DIM_BOUNDS), head_dim, side="left")


# ---- fitting -----------------------------------------------------------------------------------


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, iterations: int) -> np.ndarray:
    """Minimise ``f`` from ``x0`` (a plain Nelder-Mead, restarted once from its answer)."""
    x = np.asarray(x0, dtype=float)
    for _ in range(2):
        simplex = [x] + [x + np.eye(len(x))[i] * 0.5 for i in range(len(x))]
        values = [f(s) for s in simplex]
        for _ in range(iterations):
            order = np.argsort(values)
            simplex, values = [simplex[i] for i in order], [values[i] for i in order]
            if values[-1] - values[0] < 1e-7 * (1 + abs(values[0])):
                break
            centre = np.mean(simplex[:-1], axis=0)
            worst = simplex[-1]
            reflected = centre + (centre - worst)
            fr = f(reflected)
            if fr < values[0]:
                expanded = centre + 2 * (centre - worst)
                fe = f(expanded)
                simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
            elif fr < values[-2]:
                simplex[-1], values[-1] = reflected, fr
            else:
                contracted = centre + 0.5 * (worst - centre)
                fc = f(contracted)
                if fc < values[-1]:
                    simplex[-1], values[-1] = contracted, fc
                else:
                    simplex = [simplex[0] + 0.5 * (s - simplex[0]) for s in simplex]
                    values = [f(s) for s in simplex]
        x = simplex[int(np.argmin(values))]
    return x


def _log_loss(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Mean absolute log error: robust to the odd slow shape, aimed at the median."""
    return float(np.mean(np.abs(np.log(predicted / measured))))


Rows = list[tuple[str, dict[str, np.ndarray], np.ndarray]]  # (device, columns, seconds)


def fit_gemm(
    rows: Rows, floor: float = math.nan
) -> tuple[float, tuple[float, ...], float, float, list[str]]:
    """t0, eta_c per bin, eta_m and the roofline's sharpness q over GEMM rows (of one device or
    several), and the refusals; t0 is ``floor`` (the launch-bound rows' time) when known."""
    bins = len(BIN_BOUNDS)

    def unpack(x: np.ndarray) -> tuple[float, np.ndarray, float, float]:
        t0 = floor if math.isfinite(floor) else float(np.exp(x[0])) * 1e-6
        eta_m = float(_sigmoid(x[1 + bins]))
        return t0, _sigmoid(x[1 : 1 + bins]), eta_m, 1 + float(np.exp(x[-1]))

    terms = [gemm_terms(c, device) for device, c, _ in rows]
    flops = np.concatenate([f for f, _ in terms])
    memory = np.concatenate([m for _, m in terms])
    index = np.concatenate([bin_index(c["m"]) for _, c, _ in rows])
    measured = np.log(np.concatenate([s for _, _, s in rows]))

    def loss(x: np.ndarray) -> float:
        t0, eta_c, eta_m, q = unpack(x)
        predicted = t0 + roofline(flops / eta_c[index], memory / eta_m, q)
        return float(np.mean(np.abs(np.log(predicted) - measured)))

    x0 = np.array([math.log(2.0)] + [_logit(0.6)] * bins + [_logit(0.7), math.log(2.0)])
    t0, eta_c, eta_m, q = unpack(nelder_mead(loss, x0, 2000))
    refused: list[str] = []
    kept = list(eta_c)
    for i in reversed(range(bins)):
        bound_rows = 0
        for device, c, _ in rows:
            flops, memory = gemm_terms(c, device)
            inside = bin_index(c["m"]) == i
            bound = flops / eta_c[i] > np.maximum(memory / eta_m, t0)  # the larger term
            bound_rows += int(np.sum(inside & bound))
        if bound_rows < MIN_BOUND_ROWS and i < bins - 1:
            kept[i] = kept[i + 1]
            refused.append(
                f"m <= {BIN_BOUNDS[i]:g}: {bound_rows} compute-bound rows (< {MIN_BOUND_ROWS}); "
                f"takes the next bin's eta_c"
            )
    return t0, tuple(float(e) for e in kept), eta_m, q, refused


def fit_params(
    items: Sequence[OpData], mask: Callable[[str, str], np.ndarray] | None = None
) -> Params:
    """Fit every efficiency on ``items`` (one device, or several pooled); ``mask(device, op)``
    picks the rows to fit on (all when None)."""

    def rows(op: str) -> Rows:
        out: Rows = []
        for item in items:
            if op not in item.ops:
                continue
            c, seconds = item.ops[op]
            keep = np.ones(len(seconds), bool) if mask is None else mask(item.device, op)
            out.append((item.device, {k: v[keep] for k, v in c.items()}, seconds[keep]))
        return out

    floors = [item.gemm_floor for item in items if math.isfinite(item.gemm_floor)]
    t0, eta_c, eta_m, q, _ = fit_gemm(
        rows("gemm"), float(np.median(floors)) if floors else math.nan
    )
    attention = fit_attention(rows("prefill_attention"), rows("decode_attention"), eta_m)
    by_link = fit_allreduce_by_link(rows("allreduce"))
    first = by_link[0][1] if by_link else AllReduceFit(0.0, 1.0)
    latency, bandwidth = first.latency, first.fraction
    fixed, eta_hd = attention[2:5], attention[5]
    return Params(
        t0,
        eta_c,
        eta_m,
        *attention[:2],
        latency,
        bandwidth,
        *fixed,
        q,
        eta_hd,  # type: ignore[arg-type]
        tuple(by_link),
    )


def fit_attention(prefill: Rows, decode: Rows, eta_m: float) -> tuple[object, ...]:
    """Decode's eta_ac, eta_am, the attention call's fixed cost and its cost per sequence
    (prefill, decode), and prefill's eta per head-size bin, fitted jointly on both kinds of
    attention call."""
    hd_bins = len(HEAD_DIM_BOUNDS)

    def unpack(x: np.ndarray) -> Params:
        fixed = np.exp(x[:3]) * 1e-6
        eta_ac, eta_am = _sigmoid(x[3:5])
        eta_hd = tuple(float(e) for e in _sigmoid(x[5:]))
        return Params(
            0, (1,), eta_m, float(eta_ac), float(eta_am), 0, 1, *map(float, fixed), eta_hd=eta_hd
        )

    def stacked(rows: Rows, decode: bool) -> tuple[np.ndarray, ...]:
        if not rows:  # a folder without this kind of attention: nothing to fit on
            return tuple(np.empty(0) for _ in range(4))
        terms = [attention_terms(c, d, decode) for d, c, _ in rows]
        count = np.concatenate([c["batch"] * (c["heads"] if decode else 1) for _, c, _ in rows])
        flops = np.concatenate([f for f, _ in terms])
        memory = np.concatenate([m for _, m in terms])
        return count, flops, memory, np.log(np.concatenate([s for _, _, s in rows]))

    p_count, p_flops, p_memory, p_measured = stacked(prefill, False)
    d_count, d_flops, d_memory, d_measured = stacked(decode, True)
    p_bin = np.concatenate(
        [head_dim_index(c["head_dim"]) for _, c, _ in prefill] or [np.empty(0, int)]
    )

    def loss(x: np.ndarray) -> float:
        t0, per_prefill, per_decode = np.exp(x[:3]) * 1e-6
        eta_ac, eta_am = _sigmoid(x[3:5])
        eta_hd = _sigmoid(x[5:])[p_bin]
        p_time = t0 + p_count * per_prefill + p_flops / eta_hd + p_memory / eta_m
        d_time = t0 + d_count * per_decode + np.maximum(d_flops / eta_ac, d_memory / eta_am)
        errors = np.concatenate(
            [np.abs(np.log(p_time) - p_measured), np.abs(np.log(d_time) - d_measured)]
        )
        return float(np.mean(errors))

    x0 = np.array(
        [math.log(10.0), math.log(1.0), math.log(0.3), _logit(0.5), _logit(0.7)]
        + [_logit(0.5)] * hd_bins
    )
    p = unpack(nelder_mead(loss, x0, 2000))
    eta_hd, _ = populated_head_dims(p.eta_hd, np.bincount(p_bin, minlength=hd_bins))
    return (
        p.eta_ac,
        p.eta_am,
        p.attention_t0,
        p.prefill_per_sequence,
        p.decode_per_sequence,
        eta_hd,
    )


def populated_head_dims(
    etas: Sequence[float], counts: Sequence[int]
) -> tuple[tuple[float, ...], list[str]]:
    """A head-size bin with under MIN_BOUND_ROWS prefill rows in the fit has no eta the data
    supports: it takes the nearest populated bin's (the larger on a tie), and is named."""
    populated = [i for i, n in enumerate(counts) if n >= MIN_BOUND_ROWS]
    if not populated:
        return tuple(etas), []
    kept, refused = list(etas), []
    for i, n in enumerate(counts):
        if n >= MIN_BOUND_ROWS:
            continue
        nearest = min(populated, key=lambda j: (abs(j - i), -j))
        kept[i] = etas[nearest]
        refused.append(
            f"prefill attention, head size <= {HEAD_DIM_BOUNDS[i]:g}: {n} rows "
            f"(< {MIN_BOUND_ROWS}); takes the eta of head size <= {HEAD_DIM_BOUNDS[nearest]:g}"
        )
    return tuple(kept), refused


def head_dim_refusals(item: OpData) -> list[str]:
    """The head-size bins :func:`populated_head_dims` refused on ``item``'s rows."""
    counts = np.bincount(
        head_dim_index(item.ops["prefill_attention"][0]["head_dim"]),
        minlength=len(HEAD_DIM_BOUNDS),
    )
    return populated_head_dims([0.0] * len(counts), counts)[1]


def fit_allreduce_by_link(rows: Rows) -> list[tuple[str, AllReduceFit]]:
    """(link kind, its all-reduce fit) for each kind of link among the rows' devices: an
    NVLink's figures are not a PCIe link's."""
    kinds = sorted({link_kind(CATALOG[d]) for d, _, _ in rows})
    return [
        (kind, fit_allreduce([r for r in rows if link_kind(CATALOG[r[0]]) == kind]))
        for kind in kinds
    ]


def fit_allreduce(rows: Rows) -> AllReduceFit:
    """:class:`AllReduceFit`'s five figures (seconds; bandwidths as fractions of each device's
    catalog link), minimising the mean absolute log error over every row."""

    def unpack(x: np.ndarray) -> AllReduceFit:
        latency, rank, custom = (float(v) * 1e-6 for v in np.exp(x[[0, 2, 3]]))
        return AllReduceFit(latency, float(np.exp(x[1])), rank, custom, float(np.exp(x[4])))

    def loss(x: np.ndarray) -> float:
        p = Params(0, (1,), 1, 1, 1, 0, 1, ar_by_link=(("any", unpack(x)),))
        return float(
            np.mean(
                np.concatenate(
                    [np.abs(np.log(predict("allreduce", p, c, d) / s)) for d, c, s in rows]
                )
            )
        )

    x0 = [math.log(20.0), math.log(0.7), math.log(0.2), math.log(5.0), math.log(0.5)]
    return unpack(nelder_mead(loss, np.array(x0), 3000))


def relative_errors(p: Params, item: OpData, op: str, keep: np.ndarray | None = None) -> np.ndarray:
    c, seconds = item.ops[op]
    if keep is not None:
        c, seconds = {k: v[keep] for k, v in c.items()}, seconds[keep]
    return np.abs(predict(op, p, c, item.device) / seconds - 1)


def shape_half(item: OpData, op: str) -> np.ndarray:
    """A fixed half of an op's shapes (by a hash of the row's inputs): True = fit, False = test."""
    c, seconds = item.ops[op]
    keys = np.stack([c[k] for k in c], axis=1)
    return np.array([zlib.crc32(row.tobytes()) % 2 == 0 for row in keys], dtype=bool)


def held_out(item: OpData) -> dict[str, float]:
    """Within-device: fit on half the shapes of each op, the median error on the other half."""
    p = fit_params([item], mask=lambda _device, op: shape_half(item, op))
    return {
        op: float(np.median(relative_errors(p, item, op, ~shape_half(item, op))))
        for op in OPS
        if op in item.ops
    }


# ---- tables ------------------------------------------------------------------------------------


def _figure(value: float) -> float:
    """Four significant digits: the fit is not better than that."""
    return float(f"{value:.4g}")


def _bins(bounds: Sequence[float], etas: Sequence[float]) -> list[list[float | None]]:
    """[bound, eta] pairs as a table file holds them (the last bound null: JSON has no inf)."""
    return [[None if math.isinf(b) else b, round(e, 4)] for b, e in zip(bounds, etas)]


def efficiency_of(p: Params, device: str, engine: str, source: str = "fit") -> Efficiency:
    """The runtime's table (plan/compute/efficiency.py) for fitted ``p`` on ``device``,
    unrounded: what a shipped table file holds, to four figures."""
    return Efficiency(
        device=device,
        engine=engine,
        gemm_t0=p.t0,
        compute_bins=tuple(zip(BIN_BOUNDS, p.eta_c)),
        memory_efficiency=p.eta_m,
        attention_compute_efficiency=p.eta_ac,
        attention_memory_efficiency=p.eta_am,
        **allreduce_fields(allreduce_figures(p, device)[0], device),
        held_out_error=0.0,
        source=source,
        attention_t0=p.attention_t0,
        prefill_attention_per_sequence=p.prefill_per_sequence,
        decode_attention_per_head=p.decode_per_sequence,
        gemm_sharpness=p.gemm_sharpness,
        prefill_head_dim_bins=tuple(zip(HEAD_DIM_BOUNDS, p.eta_hd)),
        prefill_tile=PREFILL_TILE,
    )


def model_text() -> str:
    """The model a table's "model" field states: the docstring's paragraph, in one line."""
    paragraph = __doc__.split("\n\n")[2].replace("\n", " ") if __doc__ else ""
    return paragraph.replace(ALLREDUCE_PLACEHOLDER, ALLREDUCE_MODEL)


def allreduce_fields(fit: AllReduceFit, device: str) -> dict[str, float | bool]:
    """The runtime table's all-reduce fields for ``fit`` on ``device`` (its link)."""
    d = CATALOG[device]
    return {
        "allreduce_latency": fit.latency,
        "allreduce_bandwidth": fit.fraction * d.link_bandwidth,
        "allreduce_rank_latency": fit.rank_latency,
        "allreduce_custom_latency": fit.custom_latency,
        "allreduce_custom_bandwidth": fit.custom_fraction * d.link_bandwidth,
        "allreduce_fully_connected": link_kind(d) == "nvlink",
    }


def allreduce_refusal(error: float) -> str:
    return (
        f"all-reduce: the model misses this device's measurements by {error:.0%} median held "
        f"out (> {ALLREDUCE_REFUSAL:.0%}): the figures are a rough fit, not a model of its "
        "all-reduce"
    )


def attention_fields(p: Params) -> dict[str, object]:
    """A table file's attention fields for fitted ``p``."""
    return {
        "attention_compute_efficiency": round(p.eta_ac, 4),
        "attention_memory_efficiency": round(p.eta_am, 4),
        "prefill_head_dim_bins": _bins(HEAD_DIM_BOUNDS, p.eta_hd),
        "prefill_tile": PREFILL_TILE,
        "attention_t0": _figure(p.attention_t0),
        "prefill_attention_per_sequence": _figure(p.prefill_per_sequence),
        "decode_attention_per_head": _figure(p.decode_per_sequence),
    }


def table_document(item: OpData, p: Params, errors: dict[str, float], refused: list[str]) -> dict:
    bins = _bins(BIN_BOUNDS, p.eta_c)
    source = item.source
    if errors.get("allreduce", 0.0) > ALLREDUCE_REFUSAL:
        refused = [*refused, allreduce_refusal(errors["allreduce"])]
    return {
        "device": item.device,
        "engine": item.engine,
        "gemm_t0": _figure(p.t0),
        "compute_bins": bins,
        "gemm_sharpness": _figure(p.gemm_sharpness),
        "memory_efficiency": round(p.eta_m, 4),
        **attention_fields(p),
        **{
            name: value if isinstance(value, bool) else _figure(value)
            for name, value in allreduce_fields(
                allreduce_figures(p, item.device)[0], item.device
            ).items()
        },
        "held_out_error": round(max(errors.values()), 4),
        "held_out_by_op": {op: round(e, 4) for op, e in errors.items()},
        "refused": refused,
        "model": model_text(),
        "source": {
            "repository": source["repository"],
            "commit": source["commit"],
            "path": "; ".join(source["paths"]),  # type: ignore[arg-type]
            "licence": source["licence"],
        },
    }


def runtime_seconds(table: Efficiency, op: str, row: dict[str, float], device: str = "") -> float:
    """One per-op row's time by the runtime's own formulas (plan/compute/efficiency.py, what
    physics.py calls), on ``device``'s datasheet (default: the table's own device)."""
    target = CATALOG[device or table.device]
    peak, bandwidth = target.peak_flops["bf16"], target.memory_bandwidth
    if op == "gemm":
        m, n, k = row["m"], row["n"], row["k"]
        moved = 2 * (m * k + k * n + m * n)
        return table.gemm_seconds(int(m), 2 * m * n * k, moved, peak, bandwidth)
    if op == "allreduce":
        return table.allreduce_seconds(row["bytes"], int(row["devices"]))
    b, s, h, kvh = row["batch"], row["tokens"], row["heads"], row["kv_heads"]
    d = int(row["head_dim"])
    if op == "decode_attention":
        call = AttentionCall(b, h, d, 2 * b * (s + 1) * 2 * kvh * d)
        return table.decode_attention_seconds(b * (s + 1), call, peak, bandwidth)
    call = AttentionCall(b, h, d, 2 * b * s * (2 * h + 2 * kvh) * d)
    pairs = table.prefill_computed_pairs(b * s * (s + 1) / 2, b * s)
    return table.prefill_attention_seconds(pairs, call, peak, bandwidth)


def runtime_errors(table: Efficiency, item: OpData, op: str, device: str = "") -> np.ndarray:
    """|predicted / measured - 1| of every row of ``item``'s ``op`` by :func:`runtime_seconds`."""
    columns, seconds = item.ops[op]
    names = list(columns)
    predicted = [
        runtime_seconds(table, op, dict(zip(names, values)), device)
        for values in zip(*(columns[n].tolist() for n in names))
    ]
    return np.abs(np.array(predicted) / seconds - 1)


def shipped_transfer_errors(
    tables: Sequence[Efficiency], chosen: dict[str, OpData]
) -> dict[str, dict[str, object]]:
    """Every ordered pair of devices with data: the donor's table as the runtime picks it
    (:func:`efficiency_for`, its newest for vLLM) borrowed for the target as the runtime
    borrows it (its all-reduce scaled to the target's link), the target's per-op rows
    predicted on its datasheet; the pooled median and p90 per kind (same architecture / cross
    generation), and per op."""
    errors: dict[str, list[np.ndarray]] = {"same_architecture": [], "cross_generation": []}
    by_op: dict[str, dict[str, list[np.ndarray]]] = {kind: {} for kind in errors}
    for donor in chosen:
        table = efficiency_for(CATALOG[donor], tables=tables, transfer_errors={}).table
        for target, item in chosen.items():
            if donor == target:
                continue
            borrowed = efficiency_for(CATALOG[target], tables=[table], transfer_errors={}).table
            same = CATALOG[donor].architecture == CATALOG[target].architecture
            kind = "same_architecture" if same else "cross_generation"
            for op in item.ops:
                e = runtime_errors(borrowed, item, op, target)
                errors[kind].append(e)
                by_op[kind].setdefault(op, []).append(e)
    return {
        kind: {
            **_median_p90(np.concatenate(parts)),
            "by_op": {op: _median_p90(np.concatenate(e)) for op, e in by_op[kind].items()},
        }
        for kind, parts in errors.items()
        if parts
    }


TRANSFER_METHOD = (
    "every ordered pair of devices with per-op data: the donor's shipped table (its newest "
    "vLLM) borrowed for the other device as the runtime borrows it (plan/compute/efficiency.py "
    "efficiency_for: its all-reduce scaled to the other's link), the other's rows predicted on "
    "its own datasheet by the runtime's formulas; pooled over GEMM, attention, all-reduce"
)


def write_transfer(ops_root: Path, tables: Path) -> None:
    """transfer.json in ``tables``: the measured error of each kind of transfer of the tables
    there (:func:`shipped_transfer_errors`), and the fitting method's leave one device out."""
    chosen = newest(load_all(ops_root))
    transfer = shipped_transfer_errors(load_tables(tables), chosen)
    lodo = lodo_summary(leave_one_device_out(chosen))
    first = next(iter(chosen.values())).source
    document = {
        **transfer,
        "method": TRANSFER_METHOD,
        "leave_one_device_out": lodo,
        "leave_one_device_out_method": "each device's newest vLLM rows predicted by one fit on "
        "every other device's (pooled), with its own datasheet peaks; same_architecture: "
        "another device of its architecture among those fitted on",
        "source": {k: first[k] for k in ("repository", "commit", "licence")},
    }
    (tables / "transfer.json").write_text(json.dumps(document, indent=1) + "\n")
    print(
        "transfer:",
        json.dumps({k: {m: v[m] for m in ("median", "p90")} for k, v in transfer.items()}),
    )


def kind_of(target: str, others: Sequence[str]) -> str:
    """Leave-one-device-out's kind: a device of the left-out one's architecture among the
    others (same architecture), or none (cross generation)."""
    same = any(CATALOG[o].architecture == CATALOG[target].architecture for o in others)
    return "same_architecture" if same else "cross_generation"


@dataclass(frozen=True)
class LeftOut:
    """One device left out: the efficiencies fitted on every other device, and each op's
    relative errors on the left-out device's rows."""

    device: str
    kind: str
    params: Params
    errors: dict[str, np.ndarray]
    cross_link: bool = False  # no device of its link kind among the others: said, not hidden


def leave_one_device_out(chosen: dict[str, OpData]) -> list[LeftOut]:
    """Each device in turn: fit on every other device's rows (pooled), predict its rows with
    its own datasheet peaks."""
    out = []
    for target, item in chosen.items():
        others = [d for k, d in chosen.items() if k != target]
        p = fit_params(others)
        errors = {op: relative_errors(p, item, op) for op in item.ops}
        kind = kind_of(target, [d.device for d in others])
        out.append(LeftOut(target, kind, p, errors, allreduce_figures(p, target)[1]))
    return out


def lodo_summary(left: Sequence[LeftOut]) -> dict[str, dict[str, dict[str, float]]]:
    """Per op, the median and p90 relative error over every left-out device ("all") and by
    kind (same architecture, cross generation)."""
    summary: dict[str, dict[str, dict[str, float]]] = {}
    for op in OPS:
        for group in ("all", "same_architecture", "cross_generation"):
            parts = [x.errors[op] for x in left if op in x.errors and group in ("all", x.kind)]
            if parts:
                e = np.concatenate(parts)
                summary.setdefault(op, {})[group] = _median_p90(e)
    links = {"same_link": False, "cross_link": True}
    for group, cross in links.items():
        parts = [
            x.errors["allreduce"] for x in left if "allreduce" in x.errors and x.cross_link == cross
        ]
        if parts:
            summary.setdefault("allreduce", {})[group] = _median_p90(np.concatenate(parts))
    return summary


def _median_p90(e: np.ndarray) -> dict[str, float]:
    return {"median": round(float(np.median(e)), 4), "p90": round(float(np.quantile(e, 0.9)), 4)}


def print_lodo(summary: dict[str, dict[str, dict[str, float]]]) -> None:
    groups = ("all", "same_architecture", "cross_generation")
    print("leave one device out, per op: median / p90 relative error")
    print(f"  {'op':<18}" + "".join(f"{g:>22}" for g in groups))
    for op, by in summary.items():
        cells = [f"{by[g]['median']:.1%} / {by[g]['p90']:.1%}" if g in by else "-" for g in groups]
        print(f"  {op:<18}" + "".join(f"{c:>22}" for c in cells))
    by = summary.get("allreduce", {})
    for group in ("same_link", "cross_link"):
        if group in by:
            note = " (no device of its link kind fitted on: a cross-link transfer)"
            print(
                f"  allreduce, {group.replace('_', ' ')}: {by[group]['median']:.1%} / "
                f"{by[group]['p90']:.1%}" + (note if group == "cross_link" else "")
            )


def fit_all(ops_root: Path, out: Path) -> None:
    data = load_all(ops_root)
    if not data:
        raise SystemExit(f"no per-op data under {ops_root}: run the extract step first")
    out.mkdir(parents=True, exist_ok=True)
    for item in data:
        p = fit_params([item])
        *_, refused = fit_gemm([(item.device, *item.ops["gemm"])], item.gemm_floor)
        refused += head_dim_refusals(item)
        errors = held_out(item)
        document = table_document(item, p, errors, refused)
        path = out / f"{item.device}-{item.engine}.json"
        path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
        print(f"{path.name}: held out {', '.join(f'{k} {v:.1%}' for k, v in errors.items())}")
    write_transfer(ops_root, out)


def allreduce_only(item: OpData, keep: np.ndarray | None = None) -> Params:
    """Params holding only ``item``'s all-reduce fit (on the rows ``keep`` picks, else all)."""
    c, seconds = item.ops["allreduce"]
    keep = np.ones(len(seconds), bool) if keep is None else keep
    rows = [(item.device, {k: v[keep] for k, v in c.items()}, seconds[keep])]
    return Params(0, (1,), 1, 1, 1, 0, 1, ar_by_link=tuple(fit_allreduce_by_link(rows)))


def _with_fields_after(document: dict, key: str, fields: dict) -> dict:
    """``document`` with ``fields`` set, those it lacks placed after ``key``."""
    out: dict = {}
    for name, value in document.items():
        out[name] = fields.get(name, value)
        if name == key:
            out |= {k: v for k, v in fields.items() if k not in document}
    return out


def refit_allreduce(ops_root: Path, tables: Path) -> None:
    """Refit only the all-reduce figures of the tables in ``tables`` (each on its own device's
    and engine version's rows under ``ops_root``), leaving every other figure as it is: the
    all-reduce's fit is apart from the GEMMs' and attention's."""
    for path in sorted(p for p in tables.glob("*.json") if p.name != "transfer.json"):
        document = json.loads(path.read_text(encoding="utf-8"))
        item = load_ops(ops_root / document["device"] / document["engine"])
        if "allreduce" not in item.ops:
            continue
        half = shape_half(item, "allreduce")
        held = float(
            np.median(relative_errors(allreduce_only(item, half), item, "allreduce", ~half))
        )
        figures, _ = allreduce_figures(allreduce_only(item), item.device)
        fields = {
            name: value if isinstance(value, bool) else _figure(value)
            for name, value in allreduce_fields(figures, item.device).items()
        }
        document = _with_fields_after(document, "allreduce_bandwidth", fields)
        by_op = document["held_out_by_op"] | {"allreduce": round(held, 4)}
        document["held_out_by_op"] = by_op
        document["held_out_error"] = round(max(by_op.values()), 4)
        document["refused"] = [r for r in document["refused"] if not r.startswith("all-reduce")]
        if held > ALLREDUCE_REFUSAL:
            document["refused"].append(allreduce_refusal(held))
        start = document["model"].index("an all-reduce of ``B``")
        end = document["model"].index(". P and W")
        document["model"] = document["model"][:start] + ALLREDUCE_MODEL + document["model"][end:]
        path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
        print(f"{path.name}: all-reduce held out {held:.1%}")


def attention_only(
    item: OpData, eta_m: float, keep: Callable[[str], np.ndarray] | None = None
) -> Params:
    """Params holding only ``item``'s attention fit (prefill and decode jointly, the prefill's
    bytes at the table's ``eta_m``), on the rows ``keep(op)`` picks, else all."""

    def rows(op: str) -> Rows:
        if op not in item.ops:
            return []
        c, seconds = item.ops[op]
        mask = np.ones(len(seconds), bool) if keep is None else keep(op)
        return [(item.device, {k: v[mask] for k, v in c.items()}, seconds[mask])]

    eta_ac, eta_am, t0, per_prefill, per_decode, eta_hd = fit_attention(
        rows("prefill_attention"), rows("decode_attention"), eta_m
    )
    return Params(0, (1,), eta_m, eta_ac, eta_am, 0, 1, t0, per_prefill, per_decode, eta_hd=eta_hd)  # type: ignore[arg-type]


ATTENTION = ("prefill_attention", "decode_attention")


def _with_attention_model(text: str) -> str:
    """A table's model text with its prefill attention clause the current fit's."""
    clause = slice_between(model_text(), "prefill attention (", "; decode attention")
    return text.replace(slice_between(text, "prefill attention (", "; decode attention"), clause)


def slice_between(text: str, start: str, end: str) -> str:
    """``text`` from ``start`` up to (not including) ``end``."""
    first = text.index(start)
    return text[first : text.index(end, first)]


def refit_attention(ops_root: Path, tables: Path) -> None:
    """Refit only the attention figures of the tables in ``tables`` (each on its own device's
    and engine version's rows under ``ops_root``, the prefill's bytes at the table's memory
    efficiency), leaving the GEMM and all-reduce figures as they are; the held-out errors
    recomputed on half the shapes, as the full fit does."""
    for path in sorted(p for p in tables.glob("*.json") if p.name != "transfer.json"):
        document = json.loads(path.read_text(encoding="utf-8"))
        item = load_ops(ops_root / document["device"] / document["engine"])
        present = [op for op in ATTENTION if op in item.ops]
        if not present:
            continue
        eta_m = float(document["memory_efficiency"])
        half = attention_only(item, eta_m, lambda op, item=item: shape_half(item, op))
        held = {
            op: round(float(np.median(relative_errors(half, item, op, ~shape_half(item, op)))), 4)
            for op in present
        }
        fields = attention_fields(attention_only(item, eta_m))
        document = _with_fields_after(document, "attention_memory_efficiency", fields)
        by_op = document["held_out_by_op"] | held
        document["held_out_by_op"] = by_op
        document["held_out_error"] = round(max(by_op.values()), 4)
        kept = [r for r in document["refused"] if not r.startswith("prefill attention")]
        document["refused"] = kept
        document["refused"] += head_dim_refusals(item) if "prefill_attention" in item.ops else []
        document["model"] = _with_attention_model(document["model"])
        path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
        print(f"{path.name}: attention held out {held}")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="step", required=True)
    ex = sub.add_parser("extract")
    ex.add_argument("--data", type=Path, required=True, help="aiconfigurator's systems/data")
    ex.add_argument("--commit", required=True)
    ex.add_argument("--out", type=Path, required=True)
    vidur = sub.add_parser("extract-vidur")
    vidur.add_argument("--data", type=Path, required=True, help="Vidur's data/profiling/compute")
    vidur.add_argument("--commit", required=True)
    vidur.add_argument("--out", type=Path, required=True)
    fit = sub.add_parser("fit")
    fit.add_argument("--ops", type=Path, required=True)
    fit.add_argument("--out", type=Path, default=TABLES)
    allreduce = sub.add_parser("refit-allreduce", help="only the tables' all-reduce figures")
    allreduce.add_argument("--ops", type=Path, required=True)
    allreduce.add_argument("--tables", type=Path, default=TABLES)
    attention = sub.add_parser("refit-attention", help="only the tables' attention figures")
    attention.add_argument("--ops", type=Path, required=True)
    attention.add_argument("--tables", type=Path, default=TABLES)
    transfer = sub.add_parser("transfer", help="transfer.json from the tables as they are")
    transfer.add_argument("--ops", type=Path, required=True)
    transfer.add_argument("--tables", type=Path, default=TABLES)
    args = parser.parse_args(argv)
    if args.step == "extract":
        extract(args.data, args.commit, args.out)
    elif args.step == "extract-vidur":
        extract_vidur(args.data, args.commit, args.out)
    elif args.step == "refit-allreduce":
        refit_allreduce(args.ops, args.tables)
    elif args.step == "refit-attention":
        refit_attention(args.ops, args.tables)
    elif args.step == "transfer":
        write_transfer(args.ops, args.tables)
    else:
        fit_all(args.ops, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
