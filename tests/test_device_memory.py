"""KV sizing by vLLM version (plan/vllm_memory, plan/device_memory): the rule each version
selects, and our KV tokens against published vLLM start-up logs, memory as the catalog's
driver-reported figure."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_prefill.cli import main
from pytest_prefill.plan.compute.devices import device_named
from pytest_prefill.plan.device_memory import LOGIT_BYTES, GiB, activation_reserve, kv_capacity
from pytest_prefill.plan.hardware import Hardware
from pytest_prefill.plan.model_spec import ARCHITECTURES, ModelSpec, model_from_config
from pytest_prefill.plan.vllm_memory import (
    DEFAULT_VLLM_VERSION,
    NEWEST_CITED,
    RULES,
    SAMPLER_COPIES,
    reserve_rule,
)

pytestmark = pytest.mark.sim

# config.json shapes as published on the Hugging Face hub (Qwen/Qwen3-32B, Apache-2.0;
# meta-llama/Llama-3.3-70B-Instruct, whose fp8 checkpoint RedHatAI/Llama-3.3-70B-Instruct-FP8-
# dynamic stores the linear layers in one byte: modelled as quantization fp8).
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
LLAMA_33_70B_FP8 = {
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
    "torch_dtype": "bfloat16",
    "quantization_config": {"quant_method": "fp8"},
}

# Qwen/Qwen3-8B's config.json (Apache-2.0) differs from Qwen3-32B's in these: 8.19 B parameters,
# 15.26 GiB in bf16 (its log: 15.27).
QWEN3_8B = QWEN3_32B | {
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
}

LLM_D = (
    "https://github.com/llm-d/llm-d-benchmark/blob/main/config_explorer/"
    "empirical-vllm-memory-results.md"
)
# vLLM 0.19.1 serving Qwen/Qwen3-8B on one A100-SXM4-40GB, every flag its default (TP 1,
# utilization 0.9, max-model-len 40960, block 16, max_num_seqs 256 under 70 GiB): "Available KV
# cache memory: 19.36 GiB", "GPU KV cache size: 140,960 tokens"
TOKENKAKI = (
    "https://github.com/dariustanrd/tokenkaki/blob/02862f7eed9088742d6e24cc413c3bcb9e97ba58/"
    "blogposts/content/1_vllm/yy-mm-dd-behind-the-api-1-vllm-draft.md"
)


@dataclasses.dataclass(frozen=True)
class Log:
    """One published vLLM start-up: its model, GPU (catalog key), TP, version, flags, the
    "Available KV cache memory" it printed (GiB per device), whether it set a constant, its
    "GPU KV cache size" where the source prints it (``tokens``), and, for a held-out log the
    rule misses by more than 2%, why (``miss``)."""

    case: str
    config: dict
    gpu: str
    tp: int
    version: str
    utilization: float
    max_num_seqs: int  # vLLM's default on an H100 (get_batch_defaults): 1024
    block: int
    available_gib: float
    fitted: bool
    url: str = LLM_D
    tokens: int | None = None
    miss: str = ""


PUBLISHED = [
    Log("Llama-3.1-8B", ARCHITECTURES["llama-3.1-8b"], "h100", 1, "0.11", 0.9, 1024, 128, 51.38,
        fitted=True),  # sets SAMPLER_COPIES (mean of three)
    Log("Qwen3-0.6B", ARCHITECTURES["qwen3-0.6b"], "h100", 1, "0.11", 0.9, 1024, 128, 64.45,
        fitted=True),  # sets SAMPLER_COPIES, NON_TORCH_TP1
    Log("Qwen3-32B TP2", QWEN3_32B, "h100", 2, "0.11", 0.9, 1024, 128, 34.49,
        fitted=True),  # sets SAMPLER_COPIES, NON_TORCH_TP (NCCL)
    Log("Qwen3-32B TP1", QWEN3_32B, "h100", 1, "0.11", 0.9, 1024, 128, 4.45,
        fitted=False),
    Log("Llama-3.3-70B-FP8 TP2", LLAMA_33_70B_FP8, "h100", 2, "0.11", 0.9, 1024, 128, 32.00,
        fitted=False),
    Log("Qwen3-8B A100-40GB", QWEN3_8B, "a100-40", 1, "0.19", 0.9, 256, 16, 19.36,
        fitted=False, url=TOKENKAKI, tokens=140_960,
        miss="the rule's reserve (1.53 GiB: 9.68 logit copies at 256 seqs, fitted at 1,024 on "
        "H100 logs) is above the 1.00 GiB this log leaves beside the weights (0.9 x 39.59 GiB "
        "- 15.27 - 19.36), so ours is 2.7% low; held out, not tuned to"),
]  # fmt: skip


def published_tokens(log: Log, model: ModelSpec) -> int:
    """The "GPU KV cache size: N tokens" vLLM prints for the log's "Available KV cache memory"
    (vllm/v1/core/kv_cache_utils.py get_num_blocks: available // page_size // num_layers
    blocks, a page one layer's block of 2 × block × kv_heads/TP × head_size × dtype bytes)."""
    page = 2 * log.block * max(1, model.kv_heads // log.tp) * model.head_dim
    page *= model.kv_dtype_bytes
    return int(log.available_gib * GiB // page // model.layers) * log.block


def ours(log: Log) -> tuple[int, int]:
    model = model_from_config(log.config, log.case, log.url)
    kv = kv_capacity(
        model,
        device_named(log.gpu).memory_bytes,  # the driver-reported figure (79.18 GiB on an H100)
        utilization=log.utilization,
        tp=log.tp,
        block_tokens=log.block,
        max_num_seqs=log.max_num_seqs,
        vllm_version=log.version,
    )
    logged = log.tokens if log.tokens is not None else published_tokens(log, model)
    return kv.tokens, logged


def _case(log: Log):
    marks = [pytest.mark.xfail(strict=True, reason=log.miss)] if log.miss else []
    return pytest.param(log, id=log.case, marks=marks)


@pytest.mark.parametrize("log", [_case(log) for log in PUBLISHED])
def test_kv_tokens_are_within_2_percent_of_each_published_log(log):
    """A held-out log the rule misses is marked so (strict: were the rule to reach it, the mark
    would have to go)."""
    got, published = ours(log)
    assert got % log.block == 0
    assert got == pytest.approx(published, rel=0.02)


def test_four_cases_within_2_percent_one_of_them_held_out_and_misses_only_held_out():
    within = [log for log in PUBLISHED if not log.miss]
    assert len(within) >= 4 and any(not log.fitted for log in within)
    assert all(not log.fitted for log in PUBLISHED if log.miss)  # no fitted case misses
    assert len({(log.case, log.gpu, log.tp, log.version) for log in PUBLISHED}) == len(PUBLISHED)


@pytest.mark.parametrize(
    "log", [log for log in PUBLISHED if log.tokens is not None], ids=lambda log: log.case
)
def test_a_printed_token_count_is_the_block_arithmetic_of_the_printed_memory(log):
    """The transcription checks itself: the "GPU KV cache size" a log printed is what vLLM's
    block arithmetic gives from its "Available KV cache memory" (rounded to 0.01 GiB there)."""
    model = model_from_config(log.config, log.case, log.url)
    assert log.tokens == pytest.approx(published_tokens(log, model), rel=0.001)


def test_the_sampler_copies_are_the_mean_of_the_fitted_logs_torch_peaks():
    """The fitted logs' "torch peak memory increase" (4.76, 5.56, 5.64 GiB) in copies of their
    max_num_seqs × vocab float32 logits."""
    peaks = {"Llama-3.1-8B": 4.76, "Qwen3-0.6B": 5.56, "Qwen3-32B TP2": 5.64}
    copies = [
        peaks[log.case] * GiB / (log.max_num_seqs * log.config["vocab_size"] * LOGIT_BYTES)
        for log in PUBLISHED
        if log.fitted
    ]
    assert SAMPLER_COPIES == pytest.approx(sum(copies) / len(copies), abs=0.01)


def test_each_version_selects_the_newest_rule_at_or_before_it():
    assert reserve_rule("0.11").since == (0, 11)
    assert reserve_rule("0.20.2").since == (0, 11)
    assert reserve_rule("0.21").since == (0, 21)
    assert reserve_rule("v0.27.1").since == (0, 21)
    assert reserve_rule().since == max(rule.since for rule in RULES)
    assert DEFAULT_VLLM_VERSION == NEWEST_CITED
    assert all("Apache-2.0" in rule.source for rule in RULES)


def test_from_0_21_the_cuda_graph_estimate_is_held_back_and_nothing_else_changes():
    model = model_from_config(QWEN3_32B, "qwen3-32b", "test")
    h100 = device_named("h100").memory_bytes
    for tp in (1, 2):
        old = kv_capacity(model, h100, tp=tp, vllm_version="0.11")
        new = kv_capacity(model, h100, tp=tp, vllm_version="0.21")
        assert new.reserve - old.reserve == pytest.approx(reserve_rule("0.21").graph_bytes)
        assert new.kv_bytes_per_device == pytest.approx(
            old.kv_bytes_per_device - reserve_rule("0.21").graph_bytes
        )
        assert new.tokens < old.tokens
    assert reserve_rule("0.11").graph_bytes == 0


def test_nccl_is_counted_beyond_tp_1():
    for rule in RULES:
        sampler = rule.sampler_copies * 256 * 1000 * LOGIT_BYTES
        tp1 = activation_reserve(1, 1000, 256, rule) - sampler - rule.graph_bytes
        tp2 = activation_reserve(2, 1000, 256, rule) - sampler - rule.graph_bytes
        assert tp2 > tp1 == rule.non_torch(1)


@pytest.mark.parametrize("bad", ["0.10", "1", "latest", "0.x", "", None])
def test_a_version_no_rule_covers_is_refused_in_one_line(bad):
    with pytest.raises(ValueError, match="vllm_version") as err:
        kv_capacity(model_from_config(QWEN3_32B, "q", "t"), 80 * GiB, vllm_version=bad)
    assert "\n" not in str(err.value)


def test_the_hardware_passes_its_version_to_the_sizing():
    model = model_from_config(QWEN3_32B, "q", "t")
    memory = device_named("h100").memory_bytes
    for version in ("0.11", "0.21"):
        kv = Hardware(model, memory, vllm_version=version).kv(2, 16)
        assert kv is not None
        assert kv.tokens == kv_capacity(model, memory, tp=2, vllm_version=version).tokens
    with pytest.raises(ValueError, match="vllm_version"):
        Hardware(model, memory, vllm_version="0.9")


def test_the_cli_flag_refuses_an_uncovered_version_with_a_usage_error(capsys):
    argv = ["capacity", "--slo", "ttft:2s,tpot:100ms", "--model", "llama-3-8b", "--gpu", "h100"]
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--vllm-version", "0.9"])
    assert exit_.value.code == 2
    assert "--vllm-version" in capsys.readouterr().err
