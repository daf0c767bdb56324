"""Efficiency tables: the value's validation, the JSON loader, the GEMM-size bins, the transfer
rule (own table, same architecture, nearest generation, none for a CPU), and the shipped tables
within physical bounds with their source and licence."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from pytest_prefill.plan.compute.devices import CATALOG, Device, custom_device
from pytest_prefill.plan.compute.efficiency import (
    CUSTOM_ALLREDUCE_MAX_BYTES,
    ONE_SHOT_BYTES,
    OP_NAMES,
    TABLES,
    TRANSFER_FILE,
    AttentionCall,
    Efficiency,
    EfficiencyChoice,
    efficiency_for,
    link_kind,
    load_table,
    load_tables,
    load_transfer_errors,
    load_transfer_worst,
    table_from_json,
)

pytestmark = pytest.mark.sim

BINS = ((16.0, 0.3), (256.0, 0.6), (math.inf, 0.8))


def table(device: str = "a100-80", engine: str = "vllm-0.14.0", **changes: object) -> Efficiency:
    values: dict[str, object] = dict(
        device=device,
        engine=engine,
        gemm_t0=5e-6,
        compute_bins=BINS,
        memory_efficiency=0.7,
        attention_compute_efficiency=0.5,
        attention_memory_efficiency=0.6,
        allreduce_latency=6e-6,
        allreduce_bandwidth=1.5e11,
        held_out_error=0.08,
        source="test",
    )
    values.update(changes)
    return Efficiency(**values)  # type: ignore[arg-type]


def document(**changes: object) -> dict[str, object]:
    values: dict[str, object] = {
        "device": "h100-sxm",
        "engine": "vllm-0.24.0",
        "gemm_t0": 5e-6,
        "compute_bins": [[64, 0.5], [None, 0.8]],
        "memory_efficiency": 0.7,
        "attention_compute_efficiency": 0.5,
        "attention_memory_efficiency": 0.6,
        "allreduce_latency": 6e-6,
        "allreduce_bandwidth": 1.5e11,
        "held_out_error": 0.08,
        "source": {"repository": "r", "commit": "c", "path": "p", "licence": "Apache-2.0"},
    }
    values.update(changes)
    return values


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("device", ""),
        ("gemm_t0", -1e-6),
        ("gemm_t0", math.nan),
        ("memory_efficiency", 0.0),
        ("memory_efficiency", 1.2),
        ("attention_compute_efficiency", math.inf),
        ("attention_memory_efficiency", -0.1),
        ("allreduce_bandwidth", 0.0),
        ("allreduce_latency", -1.0),
        ("held_out_error", math.nan),
        ("decode_attention_per_head", -1e-9),
        ("gemm_sharpness", 0.5),
        ("gemm_sharpness", math.nan),
        ("prefill_tile", -1),
        ("prefill_tile", 1.5),
        ("prefill_head_dim_bins", ((128.0, 0.5),)),  # the last bound is not infinite
        ("prefill_head_dim_bins", ((128.0, 0.0), (math.inf, 0.5))),  # an efficiency of 0
        ("allreduce_rank_latency", -1e-7),
        ("allreduce_custom_latency", math.inf),
        ("allreduce_custom_bandwidth", -1.0),
        ("allreduce_fully_connected", 1),
    ],
)
def test_a_field_out_of_bounds_is_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        table(**{field: value})


@pytest.mark.parametrize(
    "bins",
    [
        (),
        ((16.0, 0.3),),  # the last bound is not infinite
        ((256.0, 0.3), (16.0, 0.5), (math.inf, 0.8)),  # not ascending
        ((16.0, 1.5), (math.inf, 0.8)),  # an efficiency above 1
    ],
)
def test_bins_must_ascend_to_infinity_with_efficiencies_in_range(bins: object) -> None:
    with pytest.raises(ValueError, match="compute_bins"):
        table(compute_bins=bins)


def test_compute_efficiency_is_the_first_bin_whose_bound_holds_m() -> None:
    t = table()
    for m in (1, 16):
        assert t.compute_efficiency(m) == 0.3
    for m in (17, 256):
        assert t.compute_efficiency(m) == 0.6
    assert t.compute_efficiency(10**9) == 0.8
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="m must"):
            t.compute_efficiency(bad)  # type: ignore[arg-type]


def test_the_roofline_is_the_max_when_infinitely_sharp_and_between_max_and_sum_else() -> None:
    compute, memory = 3e-6, 4e-6
    assert table().roofline(compute, memory) == memory  # no sharpness given: the max
    assert table(gemm_sharpness=1.0).roofline(compute, memory) == pytest.approx(compute + memory)
    soft = table(gemm_sharpness=2.0).roofline(compute, memory)
    assert soft == pytest.approx(math.hypot(compute, memory))  # (c^2 + m^2)^(1/2)
    assert memory < soft < compute + memory


def test_a_gemm_costs_t0_plus_the_roofline_of_its_compute_and_memory_times() -> None:
    t = table(gemm_sharpness=3.0)
    flops, moved, peak, bandwidth = 1e12, 1e9, 1e15, 2e12
    compute, memory = flops / (0.8 * peak), moved / (0.7 * bandwidth)  # m = 1000: the 0.8 bin
    assert t.gemm_seconds(1000, flops, moved, peak, bandwidth) == pytest.approx(
        5e-6 + (compute**3 + memory**3) ** (1 / 3)
    )


def test_prefill_attention_takes_its_head_size_bins_efficiency_else_the_shared_one() -> None:
    bins = ((64.0, 0.3), (128.0, 0.6), (math.inf, 0.7))
    t = table(prefill_head_dim_bins=bins)
    assert [t.prefill_attention_efficiency(d) for d in (64, 96, 128, 256)] == [0.3, 0.6, 0.6, 0.7]
    assert table().prefill_attention_efficiency(128) == 0.5  # no bins: attention_compute
    call = AttentionCall(sequences=2, heads=8, head_dim=64, moved=1e8)
    seconds = t.prefill_attention_seconds(1e7, call, 1e15, 2e12)
    assert seconds == pytest.approx(4 * 8 * 64 * 1e7 / (0.3 * 1e15) + 1e8 / (0.7 * 2e12))


def test_the_prefill_kernel_computes_the_diagonals_tiles_whole() -> None:
    # a tile of 128: each new token's row computes 64 pairs more than the causal count
    assert table(prefill_tile=128).prefill_computed_pairs(1000.0, 10) == 1000 + 10 * 64
    assert table().prefill_computed_pairs(1000.0, 10) == 1000  # no tile recorded: exact


def test_loader_reads_a_document_and_names_the_file_and_field_when_wrong(tmp_path: Path) -> None:
    loaded = table_from_json(document(), "x.json")
    assert loaded.compute_bins == ((64, 0.5), (math.inf, 0.8))
    assert loaded.source == "r@c p, Apache-2.0"
    assert loaded.attention_t0 == 0.0  # optional host terms default to none
    assert loaded.gemm_sharpness == math.inf and loaded.prefill_head_dim_bins == ()
    fitted = table_from_json(
        document(
            gemm_sharpness=2.5, prefill_tile=128, prefill_head_dim_bins=[[128, 0.6], [None, 0.7]]
        ),
        "x.json",
    )
    assert fitted.prefill_head_dim_bins == ((128, 0.6), (math.inf, 0.7))
    assert (fitted.gemm_sharpness, fitted.prefill_tile) == (2.5, 128)
    with pytest.raises(ValueError, match=r"x\.json: prefill_head_dim_bins"):
        table_from_json(document(prefill_head_dim_bins=[[128, 0.6]]), "x.json")
    with pytest.raises(ValueError, match=r"x\.json: missing field\(s\) gemm_t0"):
        table_from_json({k: v for k, v in document().items() if k != "gemm_t0"}, "x.json")
    with pytest.raises(ValueError, match=r"x\.json: memory_efficiency"):
        table_from_json(document(memory_efficiency=2.0), "x.json")
    with pytest.raises(ValueError, match=r"x\.json: source"):
        table_from_json(document(source={"repository": "r"}), "x.json")
    with pytest.raises(ValueError, match=r"x\.json: compute_bins"):
        table_from_json(document(compute_bins=[[64, 0.5, 1]]), "x.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match=r"broken\.json: not a readable JSON table"):
        load_table(broken)
    good = tmp_path / "good.json"
    good.write_text(json.dumps(document()), encoding="utf-8")
    assert load_tables(tmp_path / "nothing") == ()
    good_only = tmp_path / "only"
    good_only.mkdir()
    (good_only / "t.json").write_text(json.dumps(document()), encoding="utf-8")
    (good_only / TRANSFER_FILE).write_text(json.dumps({"same_architecture": {"median": 0.1}}))
    assert [t.device for t in load_tables(good_only)] == ["h100-sxm"]
    assert load_transfer_errors(good_only) == {"same_architecture": 0.1}
    assert load_transfer_worst(good_only) == {}  # no by_op recorded


def test_the_worst_op_of_a_transfer_kind_is_read_and_a_bad_figure_named(tmp_path) -> None:
    by_op = {"gemm": {"median": 0.05}, "prefill_attention": {"median": 0.2}}
    kinds = {"same_architecture": {"median": 0.1, "by_op": by_op}}
    (tmp_path / TRANSFER_FILE).write_text(json.dumps(kinds), encoding="utf-8")
    assert load_transfer_worst(tmp_path) == {"same_architecture": ("prefill_attention", 0.2)}
    by_op["gemm"]["median"] = float("nan")
    (tmp_path / TRANSFER_FILE).write_text(json.dumps(kinds), encoding="utf-8")
    with pytest.raises(ValueError, match=r"same_architecture\.by_op\.gemm\.median"):
        load_transfer_worst(tmp_path)


def test_a_borrowed_tables_error_class_names_its_worst_op_from_the_shipped_file() -> None:
    errors, worst = load_transfer_errors(TABLES), load_transfer_worst(TABLES)
    for key, device in CATALOG.items():
        if device.architecture not in ("ampere", "ada", "hopper", "blackwell"):
            continue
        choice = efficiency_for(device)
        if choice.transferred_from is None:
            continue
        kind = next(k for k in errors if k.replace("_", " ") in choice.error_class)
        op, median = worst[kind]
        named = f"({OP_NAMES[op]} ~{median:.0%})"
        assert (named in choice.error_class) == (median > errors[kind]), key


ERRORS = {"same_architecture": 0.08, "cross_generation": 0.2}


def choose(device_key: str, tables: list[Efficiency], engine: str = "vllm") -> EfficiencyChoice:
    return efficiency_for(
        CATALOG[device_key], engine, tables=tables, catalog=CATALOG, transfer_errors=ERRORS
    )


def test_a_device_with_its_own_table_uses_it_and_says_so() -> None:
    tables = [table("a100-80"), table("h100-sxm", "vllm-0.24.0")]
    choice = choose("h100-sxm", tables)
    assert choice.table.device == "h100-sxm" and choice.transferred_from is None
    assert "fitted on this device" in choice.error_class and "8%" in choice.error_class


def test_a_device_without_a_table_borrows_its_architecture_before_another_generation() -> None:
    tables = [table("a100-80"), table("h100-sxm", "vllm-0.24.0"), table("b200", "vllm-0.24.0")]
    choice = choose("h200", tables)  # hopper: H100 is its architecture
    assert choice.transferred_from == "h100-sxm"
    assert choice.error_class.startswith("same architecture") and "8%" in choice.error_class
    # ada has none of its own; ampere and hopper are one generation either side, and the
    # L40S's datasheet (362 TFLOP/s, 0.86 TB/s) is nearer the A100's than the H100's
    choice = choose("l40s", tables)
    assert choice.transferred_from == "a100-80"
    assert choice.error_class.startswith("cross generation") and "20%" in choice.error_class
    assert choose("a100-40", tables).transferred_from == "a100-80"


def test_a_borrowed_allreduce_bandwidth_goes_with_the_link() -> None:
    tables = [table("h100-sxm", "vllm-0.24.0")]
    choice = choose("h100-pcie", tables)  # NVLink table, PCIe device
    ratio = CATALOG["h100-pcie"].link_bandwidth / CATALOG["h100-sxm"].link_bandwidth
    assert choice.table.allreduce_bandwidth == pytest.approx(tables[0].allreduce_bandwidth * ratio)
    assert choice.table.memory_efficiency == tables[0].memory_efficiency  # fractions carry over


CUSTOM = dict(
    allreduce_rank_latency=1e-7,
    allreduce_custom_latency=4e-6,
    allreduce_custom_bandwidth=1.2e11,
)


def test_an_allreduce_without_a_custom_bandwidth_is_the_ring_alone() -> None:
    plain = table(allreduce_rank_latency=2e-7)
    for size, n in ((1e3, 2), (3e5, 4), (5e7, 8)):
        ring = 2 * (n - 1) / n * size
        assert plain.allreduce_seconds(size, n) == pytest.approx(
            6e-6 + 2e-7 * (n - 1) + ring / 1.5e11
        )


@pytest.mark.parametrize("n", [2, 4, 8])
def test_the_custom_allreduce_reads_every_peer_one_shot_then_the_ring_two_shot(n: int) -> None:
    t = table(**CUSTOM)
    fixed = 4e-6 + 1e-7 * (n - 1)
    small = 64 * 2**10  # one-shot on any group: each rank reads its n-1 peers' buffers
    assert t.allreduce_seconds(small, n) == pytest.approx(fixed + (n - 1) * small / 1.2e11)
    two_shot = 2 * 2**20  # past every one-shot size: a reduce-scatter and an all-gather
    expected = (n - 1) * two_shot if n == 2 else 2 * (n - 1) / n * two_shot
    assert two_shot > max(ONE_SHOT_BYTES.values())
    assert t.allreduce_seconds(two_shot, n) == pytest.approx(fixed + expected / 1.2e11)


def test_the_custom_allreduce_stops_at_its_buffer_and_off_a_fully_connected_link() -> None:
    t = table(**CUSTOM)
    big = CUSTOM_ALLREDUCE_MAX_BYTES  # not under the buffer: NCCL's ring
    assert t.allreduce_seconds(big, 4) == pytest.approx(6e-6 + 3e-7 + 1.5 * big / 1.5e11)
    below = CUSTOM_ALLREDUCE_MAX_BYTES - 2**20
    assert t.allreduce_seconds(below, 4) == pytest.approx(4e-6 + 3e-7 + 1.5 * below / 1.2e11)
    pcie = table(allreduce_fully_connected=False, **CUSTOM)  # more than two on PCIe: NCCL
    assert pcie.allreduce_seconds(1e4, 4) == pytest.approx(6e-6 + 3e-7 + 1.5e4 / 1.5e11)
    assert pcie.allreduce_seconds(1e4, 2) == t.allreduce_seconds(1e4, 2)
    for unsupported in (3, 16):  # group sizes vLLM's custom all-reduce does not take
        ring = 2 * (unsupported - 1) / unsupported * 1e4
        expected = 6e-6 + 1e-7 * (unsupported - 1) + ring / 1.5e11
        assert t.allreduce_seconds(1e4, unsupported) == pytest.approx(expected)


def test_a_borrowed_custom_allreduce_goes_with_the_link_and_its_kind() -> None:
    donor = table("h100-sxm", "vllm-0.24.0", **CUSTOM)
    choice = choose("h100-pcie", [donor]).table
    ratio = CATALOG["h100-pcie"].link_bandwidth / CATALOG["h100-sxm"].link_bandwidth
    assert choice.allreduce_custom_bandwidth == pytest.approx(1.2e11 * ratio)
    assert choice.allreduce_fully_connected is False  # a PCIe link: no custom path past two
    back = choose("h100-sxm", [table("l40s", "vllm-0.24.0", allreduce_fully_connected=False)])
    assert back.table.allreduce_fully_connected is True


def test_a_table_file_holds_the_allreduce_regimes() -> None:
    fields = {**CUSTOM, "allreduce_fully_connected": False}
    loaded = table_from_json(document(**fields), "t.json")
    assert {name: getattr(loaded, name) for name in fields} == fields
    with pytest.raises(ValueError, match="t.json: allreduce_fully_connected"):
        table_from_json(document(allreduce_fully_connected="yes"), "t.json")


def test_a_borrowed_allreduce_across_link_kinds_is_said_to_be_one() -> None:
    nvlink = choose("h100-pcie", [table("h100-sxm", "vllm-0.24.0")])  # NVLink table, PCIe link
    assert (link_kind(CATALOG["h100-pcie"]), link_kind(CATALOG["h100-sxm"])) == ("pcie", "nvlink")
    assert "all-reduce: a cross-link transfer (nvlink figures on a pcie link)" in (
        nvlink.error_class
    )
    pcie = choose("l4", [table("l40s", "vllm-0.24.0")])  # both PCIe: nothing to say
    assert pcie.transferred_from == "l40s" and "cross-link" not in pcie.error_class


def test_a_borrowed_allreduce_comes_from_a_table_of_the_devices_own_link_kind() -> None:
    sxm = table("h100-sxm", "vllm-0.24.0", allreduce_latency=3e-6, allreduce_bandwidth=3e11)
    l40s = table("l40s", "vllm-0.24.0", allreduce_latency=9e-6, allreduce_bandwidth=2e10)
    choice = choose("h100-pcie", [sxm, l40s])
    # the compute from the architecture's table, the all-reduce from the PCIe one
    assert choice.transferred_from == "h100-sxm"
    assert choice.table.compute_bins == sxm.compute_bins
    ratio = CATALOG["h100-pcie"].link_bandwidth / CATALOG["l40s"].link_bandwidth
    assert choice.table.allreduce_latency == l40s.allreduce_latency
    assert choice.table.allreduce_bandwidth == pytest.approx(l40s.allreduce_bandwidth * ratio)
    assert "all-reduce from l40s, a pcie link as this device's" in choice.error_class
    assert "cross-link" not in choice.error_class


def test_within_an_architecture_the_nearest_datasheet_wins() -> None:
    tables = [table("h100-sxm", "vllm-0.24.0"), table("h200", "vllm-0.24.0")]
    pcie = CATALOG["h100-pcie"]
    distance = {
        key: abs(math.log(pcie.memory_bandwidth / CATALOG[key].memory_bandwidth))
        + abs(math.log(pcie.peak_flops["bf16"] / CATALOG[key].peak_flops["bf16"]))
        for key in ("h100-sxm", "h200")
    }
    assert choose("h100-pcie", tables).transferred_from == min(distance, key=distance.__getitem__)


def test_the_newest_engine_version_is_chosen_and_an_unknown_engine_is_refused() -> None:
    tables = [table("h100-sxm", "vllm-0.14.0"), table("h100-sxm", "vllm-0.24.0")]
    assert choose("h100-sxm", tables).table.engine == "vllm-0.24.0"
    assert choose("h100-sxm", tables, "vllm-0.14.0").table.engine == "vllm-0.14.0"
    with pytest.raises(ValueError, match="engine 'trtllm' has no efficiency table; tables: vllm"):
        choose("h100-sxm", tables, "trtllm")


def test_a_cpu_is_refused_and_a_custom_device_takes_the_nearest_datasheet() -> None:
    tables = [table("a100-80"), table("h100-sxm", "vllm-0.24.0")]
    cpu = dataclasses.replace(CATALOG["a100-80"], key="cpu", architecture="cpu")
    with pytest.raises(ValueError, match="calibrate it on the device"):
        efficiency_for(cpu, tables=tables, catalog=CATALOG, transfer_errors=ERRORS)
    custom = custom_device("custom:tflops=900,tbs=3,gib=79")
    choice = efficiency_for(custom, tables=tables, catalog=CATALOG, transfer_errors=ERRORS)
    assert choice.transferred_from == "h100-sxm"


def test_a_choice_names_its_table_device_when_transferred() -> None:
    with pytest.raises(ValueError, match="transferred_from"):
        EfficiencyChoice(table("a100-80"), "h100-sxm", "x")
    with pytest.raises(ValueError, match="error_class"):
        EfficiencyChoice(table("a100-80"), None, " ")


SHIPPED = load_tables()


def _achieved(t: Efficiency, device: Device, m: int, nk: int = 8192) -> float:
    """The fraction of ``device``'s bf16 peak a GEMM of (m, nk, nk) reaches by table ``t``."""
    flops, moved = 2.0 * m * nk * nk, 2.0 * (2 * m * nk + nk * nk)
    peak = device.peak_flops["bf16"]
    seconds = t.gemm_seconds(m, flops, moved, peak, device.memory_bandwidth)
    return flops / seconds / peak


@pytest.mark.skipif(not SHIPPED, reason="no efficiency tables shipped yet")
def device_link(t: Efficiency) -> float:
    return CATALOG[t.device].link_bandwidth


def test_shipped_tables_are_physical_and_cite_their_source() -> None:
    for t in SHIPPED:
        assert t.device in CATALOG, t.device
        for eta in (
            t.memory_efficiency,
            t.attention_compute_efficiency,
            t.attention_memory_efficiency,
            *(eta for _, eta in t.compute_bins),
            *(eta for _, eta in t.prefill_head_dim_bins),
        ):
            assert 0 < eta <= 1, (t.device, t.engine)
        assert 0 <= t.gemm_t0 < 1e-3  # a launch, not a pass
        assert 0 < t.allreduce_bandwidth
        # the bus bandwidths are at most the link's (NVLink SHARP aside, which they do not
        # model), and the custom path is said to run past two devices only over NVLink
        assert t.allreduce_custom_bandwidth <= device_link(t) >= t.allreduce_bandwidth
        assert t.allreduce_fully_connected == (link_kind(CATALOG[t.device]) == "nvlink")
        assert t.gemm_sharpness >= 1 and t.prefill_tile >= 0
        assert "Apache-2.0" in t.source and "aiconfigurator" in t.source
        # a large GEMM reaches at least the fraction of the peak a small one does (with a soft
        # roofline, eta_c alone is not that fraction: the time the table gives is)
        device = CATALOG[t.device]
        large = _achieved(t, device, 8192)
        assert all(_achieved(t, device, m) <= large for m in (1, 16, 64, 256)), t.engine
    errors = load_transfer_errors(TABLES)
    assert set(errors) == {"same_architecture", "cross_generation"}
    for key in CATALOG:
        if CATALOG[key].architecture in ("ampere", "ada", "hopper", "blackwell"):
            choice = efficiency_for(CATALOG[key])
            assert (choice.transferred_from is None) == any(t.device == key for t in SHIPPED)
