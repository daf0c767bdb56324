"""A replica's KV cache capacity from its devices' memory, as vLLM sizes it at start-up
(DESIGN.md, "Deployments: model, memory, parallelism"). Standard library only.

vLLM (v1) reads the device's total memory, asks for ``total × gpu_memory_utilization``, loads
the weights (``1/TP`` of them per device), runs one dummy batch to measure the peak activation
and the memory outside torch, and gives the KV cache what is left
(``vllm/v1/worker/gpu_worker.py``, ``Worker.determine_available_memory``: ``requested_memory -
profile_result.non_kv_cache_memory``). The cache is cut into blocks of ``block_size`` tokens of
one layer, ``2 · block_size · kv_heads_per_device · head_size · dtype bytes`` each
(``vllm/v1/kv_cache_interface.py``, ``AttentionSpec.page_size_bytes``), one set per layer:
``num_blocks = available // page_size // num_layers`` (``vllm/v1/core/kv_cache_utils.py``,
``get_num_blocks``), and "GPU KV cache size: N tokens" is ``num_blocks × block_size``. A device
of a TP group holds ``max(1, kv_heads // TP)`` KV heads of every token (vLLM's
``ModelConfig.get_num_kv_heads``), so with the heads split the replica holds TP times the
tokens one device's memory would.
"""

from __future__ import annotations

import dataclasses
import math

from pytest_prefill.plan.model_spec import ModelSpec

GiB = 2**30
DEFAULT_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization
# What vLLM's profiling run takes beside the weights, as published vLLM v0.11 logs on an H100
# (79.18 GiB visible, default settings) show it for dense text models: "torch peak memory
# increase" 4.76 GiB (Llama-3.1-8B), 5.56 (Qwen3-0.6B), 5.64 (Qwen3-32B at TP 1 and 2): about
# constant per model, whatever its size; their mean is the estimate. "non-torch forward increase"
# 0.13 GiB at TP=1 and 0.54-0.55 GiB at TP=2 (NCCL's buffers). A stated estimate: a server's own
# "Available KV cache memory" or "GPU KV cache size" wins when known.
ACTIVATION_ESTIMATE = 5.4 * GiB
NON_TORCH_ESTIMATE = {1: 0.13 * GiB}
NON_TORCH_TP_ESTIMATE = 0.55 * GiB


def activation_reserve(tp: int) -> float:
    """The estimated bytes per device vLLM's profiling run holds back beside the weights."""
    return ACTIVATION_ESTIMATE + NON_TORCH_ESTIMATE.get(tp, NON_TORCH_TP_ESTIMATE)


@dataclasses.dataclass(frozen=True, slots=True)
class KVCapacity:
    """One replica's KV cache: ``tokens`` (whole blocks of ``block_tokens``) over ``tp``
    devices of ``device_memory`` bytes at ``utilization``, after ``weight_bytes`` per device
    and ``reserve`` bytes per device for activations (an estimate unless a server said)."""

    tokens: int
    block_tokens: int
    tp: int
    device_memory: float
    utilization: float
    weight_bytes: float
    reserve: float
    kv_bytes_per_device: float

    @property
    def blocks(self) -> int:
        return self.tokens // self.block_tokens

    def describe(self) -> str:
        """``431,872 tokens per replica (TP=1: 80 GiB × 0.9 − 14.96 GiB weights − 5.13 GiB
        reserve, estimated, = 51.9 GiB of KV per device; vLLM's rule)``."""
        return (
            f"{self.tokens:,} tokens per replica (TP={self.tp}: "
            f"{self.device_memory / GiB:g} GiB × {self.utilization:g} − "
            f"{self.weight_bytes / GiB:.2f} GiB weights − {self.reserve / GiB:.2f} GiB "
            f"activation reserve (estimated) = {self.kv_bytes_per_device / GiB:.2f} GiB of KV "
            "per device; vLLM's rule)"
        )


def check_tp(tp: object) -> int:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp (tensor-parallel size) must be an integer >= 1, got {tp!r}")
    return tp


def kv_capacity(
    model: ModelSpec,
    device_memory: float,
    *,
    utilization: float = DEFAULT_UTILIZATION,
    tp: int = 1,
    block_tokens: int = 16,
    reserve: float | None = None,
) -> KVCapacity:
    """The KV tokens one replica of ``model`` holds on ``tp`` devices of ``device_memory``
    bytes each, as vLLM sizes them (the module's docstring cites the code).

    Args:
        reserve: bytes per device beside the weights (default :func:`activation_reserve`).

    Raises:
        ValueError: naming the field, for memory or a utilization out of range, a bad TP or
            block size, or memory that leaves no KV block after the weights and the reserve.
    """
    check_tp(tp)
    if not (isinstance(device_memory, (int, float)) and math.isfinite(device_memory)):
        raise ValueError(f"device memory must be a finite number of bytes, got {device_memory!r}")
    if device_memory <= 0:
        raise ValueError(f"device memory must be > 0, got {device_memory!r}")
    if not (isinstance(utilization, (int, float)) and 0 < utilization <= 1):
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization!r}")
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
        raise ValueError(f"block_tokens must be an integer >= 1, got {block_tokens!r}")
    held_back = activation_reserve(tp) if reserve is None else float(reserve)
    weights = model.weight_bytes / tp
    available = math.floor(device_memory * utilization) - weights - held_back
    heads = max(1, model.kv_heads // tp)
    page = 2 * block_tokens * heads * model.head_dim * model.dtype_bytes  # one layer's block
    blocks = int(available // page // model.layers) if available > 0 else 0
    if blocks < 1:
        raise ValueError(
            f"device memory {device_memory / GiB:g} GiB × {utilization:g} holds no KV cache for "
            f"{model.name} at TP={tp}: its weights take {weights / GiB:.2f} GiB per device and "
            f"the activation reserve {held_back / GiB:.2f} GiB (raise --device-memory or "
            "--gpu-memory-utilization, or use a larger TP)"
        )
    return KVCapacity(
        blocks * block_tokens,
        block_tokens,
        tp,
        float(device_memory),
        float(utilization),
        weights,
        held_back,
        float(available),
    )
