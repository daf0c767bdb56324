"""The device catalog and the lookup by name (plan/compute/devices.py)."""

from __future__ import annotations

import math

import pytest

from pytest_prefill.plan.compute.devices import (
    ALIASES,
    CATALOG,
    CUSTOM_REQUIRED,
    DRIVER_RATIO,
    Device,
    GiB,
    custom_device,
    device_named,
)

pytestmark = pytest.mark.sim

REQUIRED_KEYS = (
    "a100-40",
    "a100-80",
    "h100-sxm",
    "h100-pcie",
    "h200",
    "b200",
    "l4",
    "l40s",
    "mi300x",
)


def test_the_catalog_holds_the_devices_the_design_names_each_cited() -> None:
    assert set(REQUIRED_KEYS) <= set(CATALOG)
    for key, device in CATALOG.items():
        assert device.key == key
        assert (
            "datasheet" in device.source
            or "data sheet" in device.source
            or "specifications" in device.source
        )
        assert device.peak_flops["bf16"] > 0


def test_fp8_is_absent_exactly_on_ampere() -> None:
    for device in CATALOG.values():
        assert device.has_fp8 == (device.architecture != "ampere")
        if device.has_fp8:
            assert device.peak("fp8") == pytest.approx(2 * device.peak("bf16"), rel=0.02)


def test_h100_memory_is_what_the_driver_reports_and_the_rule_scales_others() -> None:
    assert CATALOG["h100-sxm"].memory_bytes == pytest.approx(79.18 * GiB)
    assert CATALOG["h200"].memory_bytes == pytest.approx(141 * DRIVER_RATIO * GiB)
    assert "79.18/80" in CATALOG["h200"].source


def test_names_aliases_and_nvidia_smi_names_resolve() -> None:
    assert device_named("h100").key == "h100-sxm"
    assert device_named("NVIDIA H100 80GB HBM3").key == "h100-sxm"
    assert device_named("  A100_80GB ").key == "a100-80"
    for alias, key in ALIASES.items():
        assert device_named(alias) is CATALOG[key]


def test_an_unknown_name_is_one_line_listing_the_catalog() -> None:
    with pytest.raises(ValueError) as err:
        device_named("v100")
    message = str(err.value)
    assert "\n" not in message and "'v100'" in message
    assert all(key in message for key in CATALOG)


def test_custom_figures_make_a_device() -> None:
    device = device_named(
        "custom:tflops=989,tbs=3.35,gib=79.18,fp8tflops=1979,linkgbs=450,linkus=2"
    )
    assert device.peak("bf16") == 989e12 and device.peak("fp8") == 1979e12
    assert device.memory_bandwidth == pytest.approx(3.35e12)
    assert device.memory_bytes == pytest.approx(79.18 * GiB)
    assert device.link_bandwidth == pytest.approx(450e9) and device.link_latency == pytest.approx(
        2e-6
    )
    assert not custom_device("custom:tflops=1,tbs=1,gib=1").has_fp8


@pytest.mark.parametrize("missing", CUSTOM_REQUIRED)
def test_a_custom_spec_missing_a_field_names_it(missing: str) -> None:
    given = ",".join(f"{k}=1" for k in CUSTOM_REQUIRED if k != missing)
    with pytest.raises(ValueError, match=f"missing {missing}") as err:
        custom_device(f"custom:{given}")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "spec",
    [
        "custom:tflops=0,tbs=1,gib=1",
        "custom:tflops=nan,tbs=1,gib=1",
        "custom:tflops=1,tbs=1,gib=1,foo=2",
        "custom:tflops=1,tflops=2,tbs=1,gib=1",
        "custom:tflops=1,tbs=1,gib=1,linkus=-1",
        "h100",
    ],
)
def test_bad_custom_figures_are_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        custom_device(spec)


def test_fp8_peak_on_a_device_without_it_is_one_line() -> None:
    with pytest.raises(ValueError, match="no fp8 peak") as err:
        CATALOG["a100-80"].peak("fp8")
    assert "\n" not in str(err.value)


def test_a_device_validates_its_figures() -> None:
    good = CATALOG["h100-sxm"]
    with pytest.raises(ValueError, match="bf16"):
        Device("x", "x", "cpu", {"fp8": 1.0}, 1.0, 1.0, 1.0, 0.0, "s")
    with pytest.raises(ValueError, match="memory_bandwidth"):
        Device("x", "x", "cpu", {"bf16": 1.0}, math.inf, 1.0, 1.0, 0.0, "s")
    with pytest.raises(ValueError, match="lower-case"):
        Device("X", "x", "cpu", {"bf16": 1.0}, 1.0, 1.0, 1.0, 0.0, "s")
    with pytest.raises(TypeError):
        good.peak_flops["bf16"] = 1.0  # type: ignore[index]
