"""A calibration on this machine's CPU carried to another model on it (plan/compute/transfer.py,
``--gpu cpu --host-from``): a calibration made from a known CPU, known efficiencies and a known
host cost transfers to another model exactly, and bad input is one line naming the field."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pytest_prefill.cli import main
from pytest_prefill.measure.calibration_points import DECODE_TERMS, PREFILL_TERMS
from pytest_prefill.plan.compute.derive import HostCost, TokenRange, derive_cost
from pytest_prefill.plan.compute.devices import Device, device_named
from pytest_prefill.plan.compute.transfer import (
    DEVICE_FIELDS,
    PROBE_FIELD,
    SET_BY,
    calibration_span,
    carry,
    cpu_efficiency,
    linear_device,
    probed_device,
    transfer,
)
from pytest_prefill.plan.model_spec import load_model_spec
from tests.cli_errors import usage_error
from tests.test_compute_cpu import CPU

pytestmark = pytest.mark.sim

EFFICIENCIES = {"compute": 0.6, "attention_compute": 0.3, "attention_memory": 0.5}
HOST = HostCost(per_layer=2e-3, per_request_layer=1e-3, source="known")
MEASURED = TokenRange(16, 1024, 1500, 6)
TARGET = TokenRange(32, 2048, 4096, 16)
TERMS = PREFILL_TERMS + DECODE_TERMS


def _fp32(name: str):
    return dataclasses.replace(load_model_spec(name), dtype="float32")


def _made(model, span: TokenRange, host: HostCost = HOST):
    """What the known CPU, efficiencies and host give ``model`` over ``span``."""
    device = linear_device(CPU, model.dtype)
    return derive_cost(model, device, cpu_efficiency(device, EFFICIENCIES), span, host=host)


def test_a_calibration_made_from_known_terms_carries_them_back() -> None:
    small = _fp32("small")
    made = _made(small, MEASURED)
    assert not made.refused  # every term the efficiencies are set by is exercised
    carried = carry(made.cost, small, CPU, MEASURED, "known")
    for name, eta in EFFICIENCIES.items():
        assert carried.efficiencies[name] == pytest.approx(eta, rel=1e-9)
    assert carried.host.per_layer == pytest.approx(HOST.per_layer, rel=1e-9)
    assert carried.host.per_request_layer == pytest.approx(HOST.per_request_layer, rel=1e-9)
    assert carried.clamped == ()


def test_the_transfer_to_a_larger_model_is_what_the_known_terms_give_it() -> None:
    small, medium = _fp32("small"), _fp32("medium")
    calibration = _made(small, MEASURED).cost
    derived = transfer(calibration, small, medium, CPU, (MEASURED, TARGET), "known")
    truth = _made(medium, TARGET).cost
    for term in TERMS:
        assert getattr(derived.cost, term) == pytest.approx(getattr(truth, term), rel=1e-9)
    # the host is per layer: the larger model's decode step carries 6/4 of small's host
    assert medium.layers != small.layers
    assert "a transfer" in derived.basis and "a transfer" in derived.host.source


def test_a_calibration_faster_than_the_probed_peak_holds_the_peak_and_says_so() -> None:
    small = _fp32("small")
    made = _made(small, MEASURED).cost
    faster = dataclasses.replace(made, prefill_per_token=made.prefill_per_token / 100)
    carried = carry(faster, small, CPU, MEASURED, "known")
    assert carried.efficiencies["compute"] == 1.0 and "compute" in carried.clamped
    derived = transfer(faster, small, _fp32("medium"), CPU, (MEASURED, TARGET), "known")
    assert "compute 1.00 (held at the peak)" in derived.basis


def test_a_term_the_calibration_refused_leaves_the_peak() -> None:
    small = _fp32("small")
    refused = dataclasses.replace(_made(small, MEASURED).cost, decode_per_kv_token=0.0)
    carried = carry(refused, small, CPU, MEASURED, "known")
    assert carried.efficiencies["attention_memory"] == 1.0
    assert "attention_memory" not in carried.clamped
    assert set(carried.efficiencies) == set(SET_BY)


def _probe_record(device: Device = CPU) -> dict:
    fields = {name: getattr(device, name) for name in DEVICE_FIELDS}
    return {"device": {**fields, "peak_flops": dict(device.peak_flops)}}


def test_the_probed_device_is_read_back_from_the_provenance() -> None:
    assert probed_device({PROBE_FIELD: _probe_record()}, "here") == CPU


@pytest.mark.parametrize(
    ("provenance", "named"),
    [
        ({}, "provenance.device_probe is missing"),
        ({PROBE_FIELD: []}, "provenance.device_probe must be an object"),
        ({PROBE_FIELD: {}}, "'device' must be an object"),
        (
            {
                PROBE_FIELD: {
                    "device": {
                        k: v
                        for k, v in _probe_record()["device"].items()
                        if k != "memory_bandwidth"
                    }
                }
            },
            "device.memory_bandwidth is missing",
        ),
        (
            {PROBE_FIELD: {"device": {**_probe_record()["device"], "memory_bandwidth": -1}}},
            "memory_bandwidth must be a positive finite number",
        ),
        ("not an object", "no provenance object"),
    ],
)
def test_a_provenance_without_a_usable_probe_is_one_line_naming_the_field(
    provenance, named
) -> None:
    with pytest.raises(ValueError, match="^here: ") as info:
        probed_device(provenance, "here")
    assert named in str(info.value) and "\n" not in str(info.value)


def test_a_calibrations_span_is_the_range_its_points_cover() -> None:
    points = [
        {"kind": "prefill", "x": 16, "context": 0},
        {"kind": "chunk", "x": 256, "context": 768},
        {"kind": "decode_kv", "x": 1500, "rows": 1},
        {"kind": "decode_batch", "x": 6, "context": 200},
        {"kind": "fused", "x": 8, "context": 0, "rows": 9},
    ]
    assert calibration_span(points, "here") == TokenRange(16, 1024, 1500, 6)
    with pytest.raises(ValueError, match="^here: measurements hold no prompt or no decode step"):
        calibration_span(points[:2], "here")
    with pytest.raises(ValueError, match="^here: a malformed measurement"):
        calibration_span([{"kind": "prefill"}], "here")
    with pytest.raises(ValueError, match="^here: measurements must be a list"):
        calibration_span({"kind": "prefill"}, "here")


def _calibration(tmp_path, provenance: dict) -> str:
    small = _fp32("small")
    cost = _made(small, MEASURED).cost
    points = [
        {"kind": "prefill", "x": 16, "context": 0},
        {"kind": "prefill", "x": 1024, "context": 0},
        {"kind": "decode_kv", "x": 1500, "rows": 1},
        {"kind": "decode_batch", "x": 6, "context": 200},
    ]
    document = {"cost_model": cost.to_dict(), "provenance": provenance, "measurements": points}
    path = tmp_path / "small-server.json"
    path.write_text(json.dumps(document))
    return str(path)


SIMULATE = [
    "simulate",
    "--gpu",
    "cpu",
    "--model",
    "medium",
    "--workload",
    "poisson",
    "--num-prompts",
    "8",
]


def test_gpu_cpu_answers_from_a_cpu_calibration_and_says_it_is_a_transfer(tmp_path, capsys) -> None:
    provenance = {"model": "small", "dtype": "float32", PROBE_FIELD: _probe_record()}
    path = _calibration(tmp_path, provenance)
    out = tmp_path / "out.json"
    assert main([*SIMULATE, "--host-from", path, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "a transfer from small's calibration on this CPU" in printed
    assert f"host: from --host-from {path}" in printed and "measured error class" in printed


@pytest.mark.parametrize(
    ("provenance", "named"),
    [
        ({"model": "small"}, "provenance.device_probe is missing"),
        ({PROBE_FIELD: _probe_record()}, "its provenance.model"),
    ],
)
def test_gpu_cpu_with_a_calibration_missing_a_field_is_one_line(
    tmp_path, capsys, provenance, named
) -> None:
    path = _calibration(tmp_path, provenance)
    line = usage_error([*SIMULATE, "--host-from", path], capsys)
    assert named in line and "--host-from" in line


def test_a_cpu_calibration_carried_to_a_catalog_gpu_is_one_line(tmp_path, capsys) -> None:
    provenance = {"model": "small", "dtype": "float32", PROBE_FIELD: _probe_record()}
    path = _calibration(tmp_path, provenance)
    argv = [*SIMULATE[:2], "h100", *SIMULATE[3:], "--host-from", path]
    line = usage_error(argv, capsys)
    assert f"--host-from {path}: a calibration on this machine's CPU" in line
    assert "--gpu cpu" in line


def test_gpu_cpu_without_a_calibration_says_where_the_peaks_come_from(capsys) -> None:
    line = usage_error(SIMULATE, capsys)
    assert "--gpu: cpu" in line and "--host-from" in line and "--device-probe" in line


def test_cpu_is_not_a_catalog_device_for_a_search_across_kinds() -> None:
    with pytest.raises(ValueError, match="cpu: this machine's CPU has no datasheet"):
        device_named("cpu")
