"""The derived cost model (plan/compute/derive.py) and its stdlib least squares (fit.py)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pytest_prefill.plan.compute.derive import (
    HostCost,
    TokenRange,
    derive_cost,
    geometric,
    host_from_calibration,
)
from pytest_prefill.plan.compute.devices import device_named
from pytest_prefill.plan.compute.efficiency import Efficiency, EfficiencyChoice
from pytest_prefill.plan.compute.fit import fit_terms, solve
from pytest_prefill.plan.compute.physics import Physics
from pytest_prefill.plan.model_spec import load_model_spec

pytestmark = pytest.mark.sim

DATA = Path(__file__).parent / "data"
TABLE = Efficiency(
    device="h100-sxm",
    engine="test",
    gemm_t0=4e-6,
    compute_bins=((64, 0.3), (1024, 0.6), (math.inf, 0.7)),
    memory_efficiency=0.8,
    attention_compute_efficiency=0.5,
    attention_memory_efficiency=0.7,
    allreduce_latency=1e-5,
    allreduce_bandwidth=300e9,
    held_out_error=0.1,
    source="test table",
)
CHOICE = EfficiencyChoice(TABLE, None, "test table: 10% median held out")
SPAN = TokenRange(64, 16_000, 20_000, 256)


def test_solve_recovers_a_linear_system_and_says_singular() -> None:
    assert solve([[2.0, 1.0], [1.0, 3.0]], [5.0, 10.0]) == pytest.approx([1.0, 3.0])
    assert solve([[1.0, 2.0], [2.0, 4.0]], [1.0, 2.0]) is None


def test_fit_recovers_exact_terms() -> None:
    xs = [float(x) for x in range(1, 30)]
    fit = fit_terms({"a": [1.0] * len(xs), "b": xs}, [0.5 + 0.25 * x for x in xs])
    assert fit.coefficients["a"] == pytest.approx(0.5) and fit.coefficients["b"] == pytest.approx(
        0.25
    )
    assert fit.max_relative_error < 1e-9 and not fit.refused


def test_fit_refuses_a_negative_an_unexercised_and_an_invisible_term() -> None:
    xs = [float(x) for x in range(1, 30)]
    targets = [10.0 - 0.01 * x for x in xs]  # falls: its slope is not a cost
    fit = fit_terms({"a": [1.0] * len(xs), "b": xs, "c": [0.0] * len(xs)}, targets)
    assert fit.coefficients["b"] == 0 and "negative" in fit.refused["b"]
    assert fit.coefficients["c"] == 0 and "exercises" in fit.refused["c"]
    tiny = fit_terms({"a": [1.0] * len(xs), "b": xs}, [1.0 + 1e-6 * x for x in xs])
    assert "under" in tiny.refused["b"]


def test_a_token_range_validates() -> None:
    with pytest.raises(ValueError, match="prompt_max"):
        TokenRange(100, 10, 200, 4)
    with pytest.raises(ValueError, match="max_rows"):
        TokenRange(1, 10, 20, 0)
    span = TokenRange.of([10, 300, 20], [5, 1, 400], 64)
    assert (span.prompt_min, span.prompt_max, span.context_max) == (10, 300, 420)


def test_geometric_spans_its_bounds() -> None:
    points = geometric(3, 5000)
    assert points[0] == 3 and points[-1] == 5000 and points == sorted(set(points))


@pytest.mark.parametrize(("name", "tp"), [("llama-3.1-8b", 1), ("llama-3.1-70b", 4)])
def test_the_derived_model_tracks_the_physics_within_its_stated_error(name: str, tp: int) -> None:
    model = load_model_spec(str(DATA / f"{name}.json"))
    device = device_named("h100")
    derived = derive_cost(model, device, CHOICE, SPAN, tp=tp)
    physics = Physics(model, device, TABLE, tp)
    cost = derived.cost
    for rows, context in ((1, 64), (16, 2000), (256, 20_000)):
        truth = physics.decode_step(rows, rows * context)
        assert abs(
            cost.decode_step(rows, rows * context) - truth
        ) <= derived.decode_error * truth * (1 + 1e-9)
    for tokens in (64, 1000, 16_000):
        truth = physics.prefill_pass([(tokens, 0)])
        assert abs(cost.prefill_pass(tokens) - truth) <= derived.prefill_error * truth * (1 + 1e-9)
    assert cost.kv_bytes_per_token == model.kv_bytes_per_token
    assert cost.link_bandwidth == device.link_bandwidth
    assert derived.basis.startswith("derived: NVIDIA H100") and f"TP {tp}" in derived.basis


def test_host_cost_is_added_to_every_step_and_row() -> None:
    model = load_model_spec(str(DATA / "llama-3.1-8b.json"))
    device = device_named("h100")
    bare = derive_cost(model, device, CHOICE, SPAN).cost
    host = HostCost(per_step=1e-3, per_layer=1e-5, per_request=2e-5, source="test")
    with_host = derive_cost(model, device, CHOICE, SPAN, host=host).cost
    fixed = 1e-3 + 1e-5 * model.layers
    assert with_host.decode_step_base == pytest.approx(bare.decode_step_base + fixed)
    assert with_host.prefill_pass_overhead == pytest.approx(bare.prefill_pass_overhead + fixed)
    assert with_host.decode_per_seq == pytest.approx(bare.decode_per_seq + 2e-5)
    implied = host_from_calibration(with_host, bare, "a calibration")
    assert implied.per_step == pytest.approx(fixed) and implied.per_request == pytest.approx(2e-5)
    with pytest.raises(ValueError, match="per_step"):
        HostCost(per_step=-1.0)


def test_more_devices_of_tp_make_a_big_model_faster() -> None:
    model = load_model_spec(str(DATA / "llama-3.1-70b.json"))
    device = device_named("h100")
    two = derive_cost(model, device, CHOICE, SPAN, tp=2).cost
    eight = derive_cost(model, device, CHOICE, SPAN, tp=8).cost
    assert eight.prefill_pass(4096) < two.prefill_pass(4096)
    assert eight.decode_step(64, 64_000) < two.decode_step(64, 64_000)
