"""A calibrated server as the simulator sees it: one frozen value (cost, overhead, scheduling),
validated on construction, scaled as one."""

from __future__ import annotations

import dataclasses
import math

import pytest

from pytest_prefill.serve.calibration.calibration_fit import RequestOverhead
from pytest_prefill.serve.calibration.server_model import (
    TIME_TERMS,
    Scheduling,
    ServerModel,
    server_profile,
)
from pytest_prefill.sim import PRESETS

pytestmark = pytest.mark.sim

COST = PRESETS["lab-laptop"].cost
WAY = RequestOverhead(0.004, 0.003, 0.001, "test")
SCHEDULING = Scheduling(server_profile("vllm", 256, 8), kv_capacity_tokens=4096)


def test_each_part_is_checked_by_name():
    for field, bad in (("cost", None), ("overhead", 0.1), ("scheduling", "vllm")):
        parts = {"cost": COST, "overhead": WAY, "scheduling": SCHEDULING, field: bad}
        with pytest.raises(ValueError, match=f"^{field} must be a "):
            ServerModel(**parts)


def test_it_is_frozen():
    model = ServerModel(COST, WAY, SCHEDULING)
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.cost = COST  # type: ignore[misc]


@pytest.mark.parametrize("factor", [0.5, 1.0, 1.37])
def test_scaling_scales_the_times_only(factor):
    model = ServerModel(COST, WAY, SCHEDULING)
    scaled = model.scaled(factor)
    assert scaled.overhead == WAY and scaled.scheduling == SCHEDULING
    for term in TIME_TERMS:
        assert getattr(scaled.cost, term) == pytest.approx(getattr(COST, term) * factor)
    assert scaled.cost.kv_bytes_per_token == COST.kv_bytes_per_token


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan, True])
def test_a_factor_that_is_not_positive_and_finite_is_refused(bad):
    with pytest.raises(ValueError, match="factor must be a positive finite number"):
        ServerModel(COST, WAY, SCHEDULING).scaled(bad)


def test_the_simulated_cost_carries_the_servers_kv_cache():
    model = ServerModel(COST, WAY, SCHEDULING)
    assert model.simulated_cost.kv_capacity_tokens == SCHEDULING.kv_capacity_tokens
    assert (
        dataclasses.replace(model.simulated_cost, kv_capacity_tokens=COST.kv_capacity_tokens)
        == COST
    )
