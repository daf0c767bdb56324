"""The deployment's model (plan/model_spec) and the KV cache its devices hold (plan/device_memory):
counts derived from the shapes, vLLM's sizing rule against figures vLLM itself printed, and a
config.json missing a field named in one line."""

from __future__ import annotations

import json

import pytest

from pytest_prefill.plan.device_memory import (
    LOGIT_BYTES,
    SAMPLER_COPIES,
    GiB,
    activation_reserve,
    default_max_num_seqs,
    kv_capacity,
)
from pytest_prefill.plan.model_spec import (
    ARCHITECTURES,
    LLAMA_3_8B,
    REQUIRED,
    load_model_spec,
    model_from_config,
)
from pytest_prefill.sim import PRESETS

pytestmark = pytest.mark.sim

QWEN3_32B = {
    "model_type": "qwen3",
    "hidden_size": 5120,
    "intermediate_size": 25600,
    "num_hidden_layers": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "max_position_embeddings": 40960,
    "torch_dtype": "bfloat16",
}


def test_llama_3_8b_counts_its_published_parameters_and_kv_bytes():
    model = load_model_spec("llama-3-8b")
    # Meta-Llama-3-8B's safetensors index: 8,030,261,248 parameters
    assert model.parameters == 8_030_261_248
    assert model.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert model.weight_bytes == model.parameters * 2
    assert model.max_position_embeddings == 8192


def test_the_qwen3_preset_gives_the_cost_presets_kv_bytes():
    model = load_model_spec("qwen3-0.6b")
    assert model.kv_bytes_per_token == PRESETS["lab-laptop"].cost.kv_bytes_per_token
    assert model.tied_embeddings and model.qk_norm


def test_a_folder_and_its_config_file_are_the_same_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_3_8B))
    folder, file = load_model_spec(str(tmp_path)), load_model_spec(str(tmp_path / "config.json"))
    assert folder == file
    assert folder.parameters == load_model_spec("llama-3-8b").parameters


def test_transformers_defaults_fill_kv_heads_and_head_dim():
    config = {k: v for k, v in LLAMA_3_8B.items() if k != "num_key_value_heads"}
    model = model_from_config(config, "mha", "test")
    assert model.kv_heads == model.attention_heads
    assert model.head_dim == LLAMA_3_8B["hidden_size"] // LLAMA_3_8B["num_attention_heads"]


@pytest.mark.parametrize("key", [*REQUIRED, "torch_dtype"])
def test_a_config_missing_a_field_names_it(key, tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({k: v for k, v in LLAMA_3_8B.items() if k != key})
    )
    with pytest.raises(ValueError, match=repr("torch_dtype" if key == "torch_dtype" else key)):
        load_model_spec(str(tmp_path))


@pytest.mark.parametrize(
    ("spec", "words"),
    [("no-such-model", "not a preset"), ("", "must be a preset")],
)
def test_an_unknown_model_names_the_presets(spec, words):
    with pytest.raises(ValueError, match=words):
        load_model_spec(spec)


def test_a_mixture_of_experts_missing_an_expert_field_names_it():
    with pytest.raises(ValueError, match="num_local_experts=8.*'num_experts_per_tok'") as err:
        model_from_config({**LLAMA_3_8B, "num_local_experts": 8}, "moe", "test")
    assert "\n" not in str(err.value)


def test_every_preset_reads():
    for name in ARCHITECTURES:
        assert load_model_spec(name).parameters > 0


# --- vLLM's KV sizing -------------------------------------------------------------------------


def vllm_tokens(available_gib: float, layers: int, kv_heads: int, head_dim: int, block: int):
    """vLLM's "GPU KV cache size: N tokens" from its "Available KV cache memory: X GiB"
    (vllm/v1/core/kv_cache_utils.py get_num_blocks: available // page_size // num_layers blocks,
    a page being 2 * block * kv_heads * head_size * dtype bytes, one layer's block)."""
    page = 2 * block * kv_heads * head_dim * 2
    return int(available_gib * GiB // page // layers) * block


# Published vLLM v0.11 logs, H100 (79.18 GiB visible), default flags (so max_num_seqs 1024,
# vllm/engine/arg_utils.py get_batch_defaults), --gpu-memory-utilization 0.9, --block-size 128:
# per device, the profiling run's "torch peak memory increase" and "Available KV cache memory".
H100_GIB, LOG_SEQS = 79.18, 1024
VLLM_LOGS = [
    pytest.param(LLAMA_3_8B, 1, 4.76, 51.38, id="Llama-3.1-8B"),  # Llama-3-8B's shapes
    pytest.param(ARCHITECTURES["qwen3-0.6b"], 1, 5.56, 64.45, id="Qwen3-0.6B"),
    pytest.param(QWEN3_32B, 2, 5.64, 34.49, id="Qwen3-32B-TP2"),
]


def _copies(config, torch_peak_gib):
    """How many float32 copies of the sampler's max_num_seqs × vocab logits a log's torch peak
    is (vllm/v1/worker/gpu_model_runner.py profile_run ends with _dummy_sampler_run over them)."""
    return torch_peak_gib * GiB / (LOG_SEQS * config["vocab_size"] * LOGIT_BYTES)


def test_the_sampler_copies_are_the_mean_of_the_logs():
    copies = [_copies(p.values[0], p.values[2]) for p in VLLM_LOGS]
    assert SAMPLER_COPIES == pytest.approx(sum(copies) / len(copies), abs=0.01)
    # the peak follows the vocabulary, not the model's size: 0.6B and 32B, one vocabulary
    assert max(copies) / min(copies) < 1.02


@pytest.mark.parametrize(("config", "tp", "torch_peak_gib", "available_gib"), VLLM_LOGS)
def test_kv_tokens_per_replica_are_within_2_percent_of_what_vllm_printed(
    config, tp, torch_peak_gib, available_gib
):
    """The KV cache vLLM sized from the same log, with the sampler's copies fitted on the OTHER
    logs only (leave one out), so the log checked did not set the estimate. What remains from
    the log itself: none at TP 1; at TP 2 the 0.55 GiB outside torch (NCCL), which only this log
    shows (1.6% of its available memory)."""
    model = model_from_config(config, "m", "test")
    others = [p.values for p in VLLM_LOGS if p.values[0] is not config]
    copies = sum(_copies(c, peak) for c, _, peak, _ in others) / len(others)
    non_torch = activation_reserve(tp, model.vocab_size, LOG_SEQS) - (
        SAMPLER_COPIES * LOG_SEQS * model.vocab_size * LOGIT_BYTES
    )
    reserve = copies * LOG_SEQS * model.vocab_size * LOGIT_BYTES + non_torch
    memory = H100_GIB * GiB
    ours = kv_capacity(model, memory, tp=tp, block_tokens=128, reserve=reserve)
    theirs = vllm_tokens(available_gib, model.layers, model.kv_heads // tp, model.head_dim, 128)
    assert ours.tokens == pytest.approx(theirs, rel=0.02)
    assert ours.tokens % 128 == 0
    fitted = kv_capacity(model, memory, tp=tp, block_tokens=128, vllm_version="0.11")
    assert default_max_num_seqs(memory) == LOG_SEQS
    assert fitted.tokens == pytest.approx(theirs, rel=0.02)


def test_the_reserve_follows_the_sequence_cap():
    model = load_model_spec("llama-3.1-8b")
    at256 = kv_capacity(model, 80 * GiB, max_num_seqs=256)
    at1024 = kv_capacity(model, 80 * GiB, max_num_seqs=1024)
    sampler = SAMPLER_COPIES * (1024 - 256) * model.vocab_size * LOGIT_BYTES
    assert at1024.reserve - at256.reserve == pytest.approx(sampler)
    assert at256.tokens > at1024.tokens
    assert default_max_num_seqs(40 * GiB) == 256 and default_max_num_seqs(80 * GiB) == 1024


def test_kv_capacity_is_vllms_formula():
    model = load_model_spec("llama-3-8b")
    for tp in (1, 2, 4, 8):
        got = kv_capacity(model, 80 * GiB, tp=tp, max_num_seqs=256)
        reserve = activation_reserve(tp, model.vocab_size, 256)
        available = 80 * GiB * 0.9 - model.weight_bytes / tp - reserve
        blocks = int(available * tp // (16 * model.kv_bytes_per_token))
        assert got.tokens == blocks * 16  # the heads divide: TP times one device's tokens


def test_kv_heads_fewer_than_tp_are_replicated():
    model = load_model_spec("llama-3-8b")  # 8 KV heads
    at8, at16 = kv_capacity(model, 80 * GiB, tp=8), kv_capacity(model, 80 * GiB, tp=16)
    # at TP 16 each device still holds one whole head per token: no more tokens than at TP 8
    # beyond the weights it frees
    per_device = 2 * model.layers * model.head_dim * 2
    assert at16.tokens == int(at16.kv_bytes_per_device // (16 * per_device)) * 16
    assert at16.tokens < 2 * at8.tokens


def test_memory_smaller_than_the_weights_is_refused():
    with pytest.raises(ValueError, match="holds no KV cache for llama-3-8b at TP=1"):
        kv_capacity(load_model_spec("llama-3-8b"), 16 * GiB)
    assert kv_capacity(load_model_spec("llama-3-8b"), 16 * GiB, tp=2).tokens > 0


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("utilization", {"utilization": 1.5}),
        ("tp", {"tp": 0}),
        ("block_tokens", {"block_tokens": 0}),
    ],
)
def test_bad_sizing_arguments_name_the_field(field, kwargs):
    with pytest.raises(ValueError, match=field.split("_")[0]):
        kv_capacity(load_model_spec("tiny"), 80 * GiB, **kwargs)
