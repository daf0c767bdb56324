"""The CPU device probe: a Device whose peaks are its own measurements (rates from medians),
saved and read back, bad input refused in one line. Small sizes; no timing is asserted."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from pytest_prefill.measure.device_probe import (  # noqa: E402
    KIND,
    Probe,
    load_probe,
    probe_device,
    save_probe,
)

SIZES = {"gemm_size": 64, "bf16_size": 32, "stream_bytes": 2**16, "repeats": 3, "warmup": 1}


@pytest.fixture(scope="module")
def probe() -> Probe:
    return probe_device(**SIZES)


def test_the_probe_is_this_cpu_as_a_device(probe):
    device = probe.device
    assert (device.key, device.architecture) == ("cpu", "cpu")
    assert device.source.startswith("measured here: ")
    assert set(device.peak_flops) == {"fp32", "bf16"}
    assert device.link_latency == 0.0
    assert device.memory_bytes > 0


def test_peaks_are_the_work_over_the_median_time(probe):
    for dtype, size in (("fp32", SIZES["gemm_size"]), ("bf16", SIZES["bf16_size"])):
        median = probe.measurements[f"gemm_{dtype}"].median
        assert probe.device.peak_flops[dtype] == pytest.approx(2 * size**3 / median)
    moved = 3 * SIZES["stream_bytes"]
    assert probe.device.memory_bandwidth == pytest.approx(
        moved / probe.measurements["stream_add"].median
    )
    for name, m in probe.measurements.items():
        if name != "stream_cache_add":
            assert m.repeats == SIZES["repeats"] and m.warmup == SIZES["warmup"]
        assert m.minimum <= m.median <= m.maximum


def test_the_cache_stream_is_timed_in_the_last_level_cache(probe):
    from pytest_prefill.measure.device_probe import CACHE_SHARE, last_level_cache

    size = last_level_cache()
    if size is None:
        assert probe.cache is None and "stream_cache_add" not in probe.measurements
        return
    per_array = probe.sizes["cache_stream_bytes"]
    assert probe.sizes["cache_bytes"] == size and 3 * per_array <= size
    stream = probe.measurements["stream_cache_add"]
    assert stream.repeats == SIZES["repeats"] * CACHE_SHARE
    assert probe.cache.size == size
    assert probe.cache.bandwidth == pytest.approx(3 * (per_array // 4) * 4 / stream.median)


def test_the_last_level_cache_is_the_largest_data_or_unified_one(tmp_path):
    from pytest_prefill.measure.device_probe import last_level_cache

    for index, (kind, size) in enumerate(
        (("Data", "48K"), ("Instruction", "64M"), ("Unified", "2M"))
    ):
        (tmp_path / f"index{index}").mkdir()
        (tmp_path / f"index{index}" / "type").write_text(kind + "\n")
        (tmp_path / f"index{index}" / "size").write_text(size + "\n")
    assert last_level_cache(str(tmp_path)) == 2 * 2**20
    assert last_level_cache(str(tmp_path / "absent")) is None


def test_the_threads_setting_is_restored():
    before = torch.get_num_threads()
    probe_device(**SIZES, threads=2)
    assert torch.get_num_threads() == before


def test_a_saved_probe_reads_back_equal(probe, tmp_path):
    path = tmp_path / "cpu.json"
    save_probe(path, probe)
    again = load_probe(path)
    assert again.device == probe.device
    assert again.to_dict() == probe.to_dict()
    assert [p.name for p in tmp_path.iterdir()] == ["cpu.json"]


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda d: d.update(kind="pytest-prefill calibration"), "not a device probe"),
        (lambda d: d.update(schema_version=9), "schema_version"),
        (lambda d: d["device"].pop("memory_bandwidth"), "must hold exactly"),
        (lambda d: d["device"].update(memory_bandwidth=-1.0), "memory_bandwidth"),
        (lambda d: d["device"]["peak_flops"].pop("bf16"), "bf16"),
        (lambda d: d["device"].update(key="CPU"), "lower-case"),
        (lambda d: d.update(sizes={"fp32": 0}), "sizes"),
        (lambda d: d.pop("measurements"), "measurements"),
    ],
)
def test_a_corrupt_or_foreign_file_is_refused_in_one_line(probe, tmp_path, change, words):
    data = json.loads(json.dumps(probe.to_dict()))
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=words) as info:
        load_probe(path)
    assert "\n" not in str(info.value)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ValueError, match="device probe .*does not exist"):
        load_probe(tmp_path / "none.json")


@pytest.mark.parametrize(
    "bad",
    [
        {"gemm_size": 0},
        {"bf16_size": -1},
        {"stream_bytes": 2},
        {"repeats": 0},
        {"warmup": -1},
        {"threads": 0},
        {"gemm_size": 1.5},
    ],
)
def test_bad_arguments_are_refused_naming_the_field(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        probe_device(**{**SIZES, **bad})


def test_the_kind_is_written(probe):
    assert probe.to_dict()["kind"] == KIND
