"""How well the efficiency tables predict per-operation times they were not fitted on.

On the raw per-op data (aiconfigurator's public vLLM measurements, extracted by
``scripts/fit_efficiency.py extract`` to ``$PREFILL_COMPUTE_DATA``, default
/work/compute-data/ops; skipped when absent): leave one device out -- fit on every other
device, predict the left-out device's GEMMs, prefill and decode attention and all-reduces with
its own datasheet peaks -- and the transfer rule's single donor (same architecture, else the
nearest generation), each op's median and p90 relative error against the pre-registered target
(median <= 10%, p90 <= 25%); the named transfers A100 <-> H100 (across a generation) and
H100 <-> H200 (one architecture) at one vLLM version; and within each device, half the shapes
predicting the other half. On Vidur's GEMM profiles (MIT; another lab, engine and kernels; ``extract-vidur`` to
``$PREFILL_VIDUR_DATA``, default /work/compute-data/vidur): the shipped tables' prediction of every
GEMM of eight models' layers at TP 1-8, never fitted on. On the shipped tables alone: each table's recorded held-out error
and the measured error of each kind of transfer, and an H100 table carried to the H200 by its
datasheet against the H200's own table on a Llama-3.1-8B layer's GEMMs.

    PYTHONPATH=. python -m pytest -q -s -m sim benchmarks/test_compute_held_out.py
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest
from tabulate import tabulate

from pytest_prefill.plan.compute.devices import CATALOG
from pytest_prefill.plan.compute.efficiency import (
    TABLES,
    Efficiency,
    efficiency_for,
    load_tables,
    load_transfer_errors,
)

pytestmark = pytest.mark.sim

DATA = Path(os.environ.get("PREFILL_COMPUTE_DATA", "/work/compute-data/ops"))
VIDUR = Path(os.environ.get("PREFILL_VIDUR_DATA", "/work/compute-data/vidur"))
MEDIAN_TARGET, P90_TARGET = 0.10, 0.25
REGRESSION_BOUND = 0.30
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "fit_efficiency.py"


def fitter():
    """scripts/fit_efficiency.py as a module (it holds the numpy fit the tables came from)."""
    spec = importlib.util.spec_from_file_location("fit_efficiency", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fit_efficiency"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def per_op():
    if not DATA.is_dir():
        pytest.skip(f"no raw per-op data at {DATA} (scripts/fit_efficiency.py extract makes it)")
    fit = fitter()
    data = fit.load_all(DATA)
    if len({d.device for d in data}) < 2:
        pytest.skip(f"fewer than two devices' per-op data under {DATA}")
    return fit, data


def _summary(fit, errors: dict[str, list]) -> dict[str, tuple[float, float]]:
    np = fit.np
    return {op: (float(np.median(e)), float(np.quantile(e, 0.9))) for op, e in errors.items() if e}


def _donor(target: str, devices: list[str]) -> str:
    """The device efficiency_for's transfer rule borrows from for ``target`` among ``devices``."""
    stubs = [
        Efficiency(key, "vllm-0", 0.0, ((math.inf, 1.0),), 1, 1, 1, 0, 1, 0, "stub")
        for key in devices
    ]
    choice = efficiency_for(CATALOG[target], tables=stubs, catalog=CATALOG, transfer_errors={})
    assert choice.transferred_from is not None
    return choice.transferred_from


def test_leave_one_device_out(per_op) -> None:
    """The script's leave-one-device-out (fit on the others, predict the left-out device), each
    left-out row predicted again by the runtime's formulas from the same fit: the two agree,
    so the figures printed are the runtime's as well as the script's."""
    fit, data = per_op
    chosen = fit.newest(data)
    left = fit.leave_one_device_out(chosen)
    own = {key: fit.fit_params([item]) for key, item in chosen.items()}
    rule: dict[str, list] = {op: [] for op in fit.OPS}
    borrowed: dict[str, list] = {op: [] for op in fit.OPS}
    rows = []
    for out in left:
        item = chosen[out.device]
        table = fit.efficiency_of(out.params, out.device, item.engine)
        donor = _donor(out.device, [k for k in chosen if k != out.device])
        # what the runtime gives a device with no table: another device's shipped table
        others = [t for t in SHIPPED if t.device != out.device]
        lent = efficiency_for(CATALOG[out.device], tables=others, transfer_errors={}).table
        for op, errors in out.errors.items():
            by_runtime = fit.runtime_errors(table, item, op)
            assert by_runtime.tolist() == pytest.approx(errors.tolist(), rel=1e-9, abs=1e-12), op
            e_rule = fit.relative_errors(own[donor], item, op)
            rule[op].extend(e_rule.tolist())
            e_shipped = fit.runtime_errors(lent, item, op, out.device)
            borrowed[op].extend(e_shipped.tolist())
            rows.append(
                (
                    f"{out.device} {item.engine}",
                    out.kind.replace("_", " "),
                    op,
                    f"{fit.np.median(errors):.1%}",
                    f"{fit.np.quantile(errors, 0.9):.1%}",
                    donor,
                    f"{fit.np.median(e_rule):.1%}",
                    f"{fit.np.quantile(e_rule, 0.9):.1%}",
                    f"{fit.np.median(e_shipped):.1%}",
                    f"{fit.np.quantile(e_shipped, 0.9):.1%}",
                )
            )
    header = ("left out", "kind", "op", "others: median", "p90", "rule's donor", "median", "p90")
    header += ("its shipped table", "p90")
    print("\nLeave one device out (aiconfigurator vLLM per-op data; relative error)")
    print(tabulate(rows, headers=header))
    summary = fit.lodo_summary(left)
    print(
        "\nPer op over every left-out device (target: median <= 10%, p90 <= 25%); "
        "same architecture: another device of its architecture among those fitted on"
    )
    fit.print_lodo(summary)
    by_rule = _summary(fit, rule)
    print(
        "the transfer rule's single donor instead: "
        + ", ".join(f"{op} {m:.1%}/{q:.1%}" for op, (m, q) in by_rule.items())
    )
    print(
        "the donor's shipped table, as the runtime borrows it: "
        + ", ".join(f"{op} {m:.1%}/{q:.1%}" for op, (m, q) in _summary(fit, borrowed).items())
    )
    shipped = json.loads((TABLES / "transfer.json").read_text(encoding="utf-8"))
    same = shipped.get("leave_one_device_out") == summary
    print(f"the shipped transfer.json's leave_one_device_out: {'the same' if same else 'DIFFERS'}")
    overall = {op: (by["all"]["median"], by["all"]["p90"]) for op, by in summary.items()}
    misses = [
        f"{op} {m:.1%}/{q:.1%}"
        for op, (m, q) in overall.items()
        if m > MEDIAN_TARGET or q > P90_TARGET
    ]
    print("target missed (median/p90): " + (", ".join(misses) if misses else "none"))
    # The targets above are reported; what is asserted is the regression bound: every op's
    # median within 30% on a device it never saw (the presets this replaces were 3.7-7x off)
    assert all(m <= REGRESSION_BOUND for m, _ in overall.values()), overall


def test_named_transfers_at_one_engine_version(per_op) -> None:
    fit, data = per_op
    by_key = {(d.device, d.engine): d for d in data}
    rows = []
    for donor, target, kind in (
        ("a100-80", "h100-sxm", "cross generation"),
        ("h100-sxm", "a100-80", "cross generation"),
        ("h100-sxm", "h200", "same architecture"),
        ("h200", "h100-sxm", "same architecture"),
    ):
        engine = "vllm-0.14.0"
        if (donor, engine) not in by_key or (target, engine) not in by_key:
            continue
        p = fit.fit_params([by_key[donor, engine]])
        item = by_key[target, engine]
        errors = fit.np.concatenate([fit.relative_errors(p, item, op) for op in item.ops])
        per = {op: fit.np.median(fit.relative_errors(p, item, op)) for op in item.ops}
        rows.append(
            (
                f"{donor} -> {target}",
                kind,
                f"{fit.np.median(errors):.1%}",
                f"{fit.np.quantile(errors, 0.9):.1%}",
                ", ".join(f"{op} {e:.0%}" for op, e in per.items()),
            )
        )
    print(f"\nNamed transfers ({engine}, the donor's efficiencies on the target's datasheet)")
    print(tabulate(rows, headers=("transfer", "kind", "median", "p90", "median per op")))
    assert rows, "no pair of the named devices at one vLLM version in the data"


def test_within_device_half_the_shapes(per_op) -> None:
    fit, data = per_op
    rows = []
    for item in data:
        errors = fit.held_out(item)
        rows.append(
            (item.device, item.engine, *(f"{errors.get(op, math.nan):.1%}" for op in fit.OPS))
        )
        assert all(e >= 0 for e in errors.values())
    print("\nWithin device: fit on half the shapes, median error on the other half")
    print(tabulate(rows, headers=("device", "engine", *fit.OPS)))


SHIPPED = load_tables()


@pytest.mark.skipif(not SHIPPED, reason="no efficiency tables shipped")
def test_shipped_tables_recorded_errors() -> None:
    rows = []
    for path in sorted(TABLES.glob("*.json")):
        document = json.loads(path.read_text(encoding="utf-8"))
        if "held_out_by_op" not in document:
            continue
        by_op = document["held_out_by_op"]
        rows.append((path.stem, *(f"{by_op.get(op, math.nan):.1%}" for op in by_op)))
        assert document["held_out_error"] == max(by_op.values())
    print("\nShipped tables: within-device held-out median error recorded at fit time")
    print(tabulate(rows, headers=("table", "gemm", "prefill attn", "decode attn", "allreduce")))
    transfer = json.loads((TABLES / "transfer.json").read_text(encoding="utf-8"))
    print("Measured transfer error (every ordered device pair, all ops pooled):")
    for kind in ("same_architecture", "cross_generation"):
        by_op = transfer[kind].get("by_op", {})
        ops = ", ".join(f"{op} {e['median']:.1%} / {e['p90']:.1%}" for op, e in by_op.items())
        print(f"  {kind}: median {transfer[kind]['median']:.1%}, p90 {transfer[kind]['p90']:.1%}")
        print(f"    by op: {ops}")
    assert set(load_transfer_errors()) == {"same_architecture", "cross_generation"}


@pytest.mark.skipif(not SHIPPED, reason="no efficiency tables shipped")
def test_the_shipped_transfer_errors_are_the_shipped_tables(per_op) -> None:
    """transfer.json's error of each kind of transfer (what a borrowed table's basis line
    quotes) is the shipped tables' own, borrowed as the runtime borrows them, on the raw data."""
    fit, data = per_op
    recomputed = fit.shipped_transfer_errors(SHIPPED, fit.newest(data))
    transfer = json.loads((TABLES / "transfer.json").read_text(encoding="utf-8"))
    for kind, measured in recomputed.items():
        assert transfer[kind] == measured, kind


def _gemm_seconds(table, device, m: int, n: int, k: int) -> float:
    moved = 2 * (m * k + k * n + m * n)
    flops = 2 * m * n * k
    return table.gemm_seconds(m, flops, moved, device.peak_flops["bf16"], device.memory_bandwidth)


@pytest.mark.skipif(not SHIPPED, reason="no efficiency tables shipped")
def test_shipped_h100_table_on_the_h200_datasheet() -> None:
    newest = {}
    for t in sorted(SHIPPED, key=lambda t: t.engine):
        newest[t.device] = t
    if not {"h100-sxm", "h200"} <= set(newest):
        pytest.skip("needs both the H100 and H200 tables")
    h200 = CATALOG["h200"]
    shapes = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]  # Llama-3.1-8B layer
    errors = []
    for m in (1, 8, 32, 128, 512, 2048, 8192):
        for n, k in shapes:
            carried = _gemm_seconds(newest["h100-sxm"], h200, m, n, k)
            own = _gemm_seconds(newest["h200"], h200, m, n, k)
            errors.append(abs(carried / own - 1))
            # neither beats the datasheet roofline
            assert own >= max(
                2 * m * n * k / h200.peak_flops["bf16"], 2 * n * k / h200.memory_bandwidth
            )
    errors.sort()
    print(
        f"\nH100 table on the H200 datasheet vs the H200's own table, Llama-3.1-8B GEMMs: "
        f"median {errors[len(errors) // 2]:.1%}, max {errors[-1]:.1%}"
    )


@pytest.mark.skipif(not SHIPPED, reason="no efficiency tables shipped")
def test_shipped_tables_predict_vidur_gemms() -> None:
    """Vidur's A100 and H100 GEMMs (m = 1 to 32k tokens, the layer shapes of eight models at
    TP 1-8) predicted by the tables fitted on aiconfigurator's data, by m range."""
    import csv
    import statistics

    folders = sorted(p for p in VIDUR.glob("*") if (p / "gemm.csv").is_file())
    if not folders:
        pytest.skip(f"no Vidur GEMM data at {VIDUR} (scripts/fit_efficiency.py extract-vidur)")
    rows = []
    for folder in folders:
        device = CATALOG[folder.name]
        table = efficiency_for(device).table
        by_range: dict[str, list[float]] = {"m <= 64": [], "64 < m <= 1024": [], "m > 1024": []}
        with (folder / "gemm.csv").open(encoding="utf-8") as f:
            for row in csv.DictReader(f):
                m, n, k = int(float(row["m"])), int(float(row["n"])), int(float(row["k"]))
                error = abs(_gemm_seconds(table, device, m, n, k) / float(row["seconds"]) - 1)
                key = "m <= 64" if m <= 64 else "64 < m <= 1024" if m <= 1024 else "m > 1024"
                by_range[key].append(error)
        every = sorted(e for errors in by_range.values() for e in errors)
        rows.append(
            (
                folder.name,
                table.engine,
                len(every),
                f"{statistics.median(every):.1%}",
                f"{every[int(0.9 * (len(every) - 1))]:.1%}",
                *(f"{statistics.median(e):.1%}" for e in by_range.values() if e),
            )
        )
    print("\nVidur's GEMMs (never fitted on) predicted by the shipped tables: relative error")
    header = ("device", "table", "GEMMs", "median", "p90", *("median " + k for k in by_range))
    print(tabulate(rows, headers=header))
