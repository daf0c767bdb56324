"""Per-operation physics from a model's shapes (plan/compute/physics.py) and the mixture-of-experts
and fp8 fields of a model (plan/model_spec.py)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from pytest_prefill.plan.compute.devices import CATALOG, device_named
from pytest_prefill.plan.compute.efficiency import Efficiency
from pytest_prefill.plan.compute.physics import Physics, expected_experts
from pytest_prefill.plan.model_spec import load_model_spec, model_from_config

pytestmark = pytest.mark.sim

DATA = Path(__file__).parent / "data"

# An efficiency table for the physics' own tests (not fitted on anything): one ηc everywhere
# and no launch cost, so the roofline can be checked by hand.
FLAT = Efficiency(
    device="h100-sxm",
    engine="test",
    gemm_t0=0.0,
    compute_bins=((math.inf, 0.5),),
    memory_efficiency=0.8,
    attention_compute_efficiency=0.5,
    attention_memory_efficiency=0.8,
    allreduce_latency=1e-5,
    allreduce_bandwidth=200e9,
    held_out_error=0.1,
    source="test table",
)


def model(name: str):
    return load_model_spec(str(DATA / f"{name}.json"))


def test_the_moe_fixtures_count_their_published_parameters() -> None:
    mixtral, qwen = model("mixtral-8x7b"), model("qwen3-30b-a3b")
    assert mixtral.parameters / 1e9 == pytest.approx(46.7, abs=0.05)  # Mistral's 46.7B
    assert mixtral.active_parameters / 1e9 == pytest.approx(12.9, abs=0.05)  # and 12.9B active
    assert qwen.parameters / 1e9 == pytest.approx(30.5, abs=0.05)  # Qwen's 30.5B
    assert qwen.active_parameters / 1e9 == pytest.approx(3.3, abs=0.1)  # and 3.3B active
    assert model("llama-3.1-8b").active_parameters == model("llama-3.1-8b").parameters


@pytest.mark.parametrize(
    ("drop", "field"),
    [
        ("num_experts_per_tok", "num_experts_per_tok"),
        ("moe_intermediate_size", "moe_intermediate_size"),
    ],
)
def test_a_moe_config_missing_an_expert_field_names_it(drop: str, field: str) -> None:
    config = {k: v for k, v in model_config("qwen3-30b-a3b").items() if k != drop}
    with pytest.raises(ValueError, match=f"num_experts=128.*{field!r}") as err:
        model_from_config(config, "q", "test")
    assert "\n" not in str(err.value)


def model_config(name: str) -> dict:
    import json

    return json.loads((DATA / f"{name}.json").read_text())


def test_multi_head_latent_attention_is_refused_in_one_line() -> None:
    config = {**model_config("qwen3-30b-a3b"), "n_routed_experts": 64, "kv_lora_rank": 512}
    config.pop("num_experts")
    with pytest.raises(ValueError, match="kv_lora_rank"):
        model_from_config(config, "ds", "test")


def test_fp8_halves_the_linear_weights_and_the_kv_cache() -> None:
    base = model("llama-3.1-8b")
    fp8 = dataclasses.replace(base, quantization="fp8", kv_cache_dtype="fp8")
    assert fp8.kv_bytes_per_token * 2 == base.kv_bytes_per_token
    embeddings = base.embedding_parameters * 2
    assert fp8.weight_bytes - embeddings == pytest.approx(
        (base.weight_bytes - embeddings) / 2, rel=1e-3
    )
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        dataclasses.replace(base, kv_cache_dtype="int4")


def test_expected_experts_is_the_coupon_formula() -> None:
    assert expected_experts(1, 128, 8) == pytest.approx(8)
    assert expected_experts(0, 8, 2) == 0
    assert expected_experts(10_000, 8, 2) == pytest.approx(8)
    assert 8 < expected_experts(2, 128, 8) < 16


def test_a_big_prefill_is_compute_bound_at_the_efficiency_given() -> None:
    spec, device = model("llama-3.1-8b"), device_named("h100")
    physics = Physics(spec, device, FLAT)
    tokens = 8192
    gemms = [op for op in physics.pass_ops(tokens, 0, 0, 1) if op.name.endswith("proj")]
    flops = sum(op.flops for op in gemms)
    seconds = sum(op.seconds for op in gemms) / spec.layers
    assert seconds == pytest.approx(flops / (0.5 * device.peak("bf16")), rel=1e-9)
    # the linear layers' FLOPs are 2 × tokens × the layer's linear weights
    linear = (spec.parameters - spec.embedding_parameters) / spec.layers
    assert flops == pytest.approx(2 * tokens * linear, rel=1e-3)


def test_prefill_attention_computes_the_diagonal_tiles_at_its_head_sizes_efficiency() -> None:
    spec, device = model("llama-3.1-8b"), device_named("h100")
    fitted = dataclasses.replace(
        FLAT, prefill_tile=128, prefill_head_dim_bins=((64.0, 0.9), (math.inf, 0.25))
    )
    tokens = 4096
    pairs = tokens * (tokens + 1) // 2

    def attention(table: Efficiency) -> float:
        return Physics(spec, device, table).attention(pairs, tokens, 0, 1, False).seconds

    per_pair = 4 * spec.attention_heads * spec.head_dim / device.peak("bf16")
    # head size 128 takes the second bin's 0.25, not attention_compute_efficiency's 0.5
    extra = attention(fitted) - attention(FLAT)
    assert extra == pytest.approx(per_pair * ((pairs + tokens * 64) / 0.25 - pairs / 0.5))


def test_a_soft_roofline_makes_a_gemm_near_the_ridge_cost_more_than_the_max() -> None:
    spec, device = model("llama-3.1-8b"), device_named("h100")
    soft = dataclasses.replace(FLAT, gemm_sharpness=2.0)
    m, n, k = 256, 4096, 4096
    hard = Physics(spec, device, FLAT).gemm("g", m, n, k)
    smooth = Physics(spec, device, soft).gemm("g", m, n, k)
    compute = hard.flops / (0.5 * device.peak("bf16"))
    memory = hard.bytes / (0.8 * device.memory_bandwidth)
    assert hard.seconds == pytest.approx(max(compute, memory))
    assert smooth.seconds == pytest.approx(math.hypot(compute, memory))


def test_a_single_decode_step_reads_the_weights_at_the_memory_efficiency() -> None:
    spec, device = model("llama-3.1-8b"), device_named("h100")
    step = Physics(spec, device, FLAT).decode_step(1, 0)
    read = spec.weight_bytes - spec.vocab_size * spec.hidden_size * 2  # not the input embeddings
    assert step == pytest.approx(read / (0.8 * device.memory_bandwidth), rel=0.01)


def test_decode_grows_with_cached_tokens_by_their_kv_bytes() -> None:
    spec, device = model("llama-3.1-8b"), device_named("h100")
    physics = Physics(spec, device, FLAT)
    extra = physics.decode_step(8, 80_000) - physics.decode_step(8, 40_000)
    assert extra == pytest.approx(
        40_000 * spec.kv_bytes_per_token / (0.8 * device.memory_bandwidth), rel=1e-6
    )


def test_tp_splits_the_work_and_adds_two_allreduces_per_layer() -> None:
    spec, device = model("llama-3.1-70b"), device_named("h100")
    one, four = Physics(spec, device, FLAT, 1), Physics(spec, device, FLAT, 4)
    assert four.prefill_pass([(4096, 0)]) < one.prefill_pass([(4096, 0)]) / 2
    allreduce = next(op for op in four.pass_ops(100, 0, 0, 1) if op.name == "allreduce")
    bus = 100 * spec.hidden_size * 2 * 2 * 3 / 4
    assert allreduce.seconds == pytest.approx(spec.layers * 2 * (1e-5 + bus / 200e9))
    assert next(op for op in one.pass_ops(100, 0, 0, 1) if op.name == "allreduce").seconds == 0


def test_moe_decode_reads_only_the_experts_its_rows_touch() -> None:
    spec, device = model("qwen3-30b-a3b"), device_named("h100")
    physics = Physics(spec, device, FLAT)
    one = next(op for op in physics.mlp(1, dense=False) if op.name == "experts_down")
    many = next(op for op in physics.mlp(512, dense=False) if op.name == "experts_down")
    expert = spec.hidden_size * spec.expert_intermediate_size * 2
    assert one.bytes == pytest.approx(
        8 * expert + (spec.expert_intermediate_size + spec.hidden_size) * 8 * 2
    )
    assert many.bytes > 0.99 * 128 * expert  # 512 rows touch every expert
    assert (
        physics.decode_step(1, 0) < physics.decode_step(64, 0) < physics.prefill_pass([(4096, 0)])
    )


def test_fp8_weights_run_at_the_fp8_peak_and_are_refused_without_one() -> None:
    spec = dataclasses.replace(model("llama-3.1-8b"), quantization="fp8")
    bf16 = Physics(model("llama-3.1-8b"), device_named("h100"), FLAT).prefill_pass([(8192, 0)])
    fp8 = Physics(spec, device_named("h100"), FLAT).prefill_pass([(8192, 0)])
    assert fp8 < 0.75 * bf16
    with pytest.raises(ValueError, match="no fp8 peak") as err:
        Physics(spec, CATALOG["a100-80"], FLAT)
    assert "\n" not in str(err.value)


def test_bad_tp_is_refused() -> None:
    with pytest.raises(ValueError, match="tp=3 does not divide"):
        Physics(model("llama-3.1-8b"), device_named("h100"), FLAT, 3)
