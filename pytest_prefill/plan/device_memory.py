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
from pytest_prefill.plan.vllm_memory import (
    DEFAULT_VLLM_VERSION,
    NON_TORCH_TP,
    NON_TORCH_TP1,
    SAMPLER_COPIES,
    ReserveRule,
    reserve_rule,
    rule_name,
)

__all__ = [
    "DEFAULT_UTILIZATION",
    "DEFAULT_VLLM_VERSION",
    "LOGIT_BYTES",
    "NON_TORCH_TP",
    "NON_TORCH_TP1",
    "SAMPLER_COPIES",
    "GiB",
    "KVCapacity",
    "activation_reserve",
    "check_tp",
    "default_max_num_seqs",
    "kv_capacity",
]

GiB = 2**30
DEFAULT_UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization
# what would make room, in no command's flags: each command names its own (commands/_deploy_args)
MEMORY_FIX = "more memory per device, a larger share of it for the engine, or a larger TP"


class NoKVCache(ValueError):
    """Memory that holds no KV block after the weights and the reserve: ``shortfall`` says by
    how much, the message adds what would make room (:data:`MEMORY_FIX`)."""

    def __init__(self, shortfall: str) -> None:
        super().__init__(f"{shortfall} ({MEMORY_FIX})")
        self.shortfall = shortfall


LOGIT_BYTES = 4  # the sampler works on float32 logits

# What vLLM's profiling run holds beside the weights, per vLLM version: plan/vllm_memory.py's
# table of reserve rules, with their sources. A stated estimate: a server's own "Available KV
# cache memory" or "GPU KV cache size" wins when known.


def default_max_num_seqs(device_memory: float) -> int:
    """``vllm serve``'s sequence cap when none is given: 1024 on a device of at least 70 GiB,
    256 below (vllm/engine/arg_utils.py, ``EngineArgs.get_batch_defaults``; vLLM also keeps
    256 on an A100 of 80 GB, whose name is not known here)."""
    return 1024 if device_memory >= 70 * GiB else 256


def activation_reserve(
    tp: int, vocab_size: int, max_num_seqs: int, rule: ReserveRule | None = None
) -> float:
    """The estimated bytes per device vLLM holds back beside the weights by ``rule`` (default:
    :data:`~pytest_prefill.plan.vllm_memory.DEFAULT_VLLM_VERSION`'s): the sampler's copies of
    ``max_num_seqs × vocab_size`` float32 logits, the memory outside torch at ``tp``, and the
    CUDA-graph estimate where the version subtracts it."""
    rule = rule if rule is not None else reserve_rule()
    sampler = rule.sampler_copies * max_num_seqs * vocab_size * LOGIT_BYTES
    return sampler + rule.non_torch(tp) + rule.graph_bytes


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
    max_num_seqs: int | None = None
    vllm_version: str = DEFAULT_VLLM_VERSION

    @property
    def blocks(self) -> int:
        return self.tokens // self.block_tokens

    def _seqs(self) -> str:
        if self.max_num_seqs is None:  # a reserve given, not estimated by a rule
            return ""
        graphs = reserve_rule(self.vllm_version).graph_bytes
        held = f" and {graphs / GiB:.2f} GiB of CUDA graphs" if graphs else ""
        return f", the sampler's for {self.max_num_seqs} seqs{held}"

    def describe(self) -> str:
        """``417,120 tokens per replica (TP=1: 79.18 GiB × 0.9 − 14.96 GiB weights − 5.39 GiB
        activation reserve (estimated, …) = 50.92 GiB of KV per device; vLLM 0.27's rule)``."""
        return (
            f"{self.tokens:,} tokens per replica (TP={self.tp}: "
            f"{self.device_memory / GiB:g} GiB × {self.utilization:g} − "
            f"{self.weight_bytes / GiB:.2f} GiB weights − {self.reserve / GiB:.2f} GiB "
            f"activation reserve (estimated{self._seqs()}) = "
            f"{self.kv_bytes_per_device / GiB:.2f} GiB of KV per device; "
            f"{rule_name(self.vllm_version)})"
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
    max_num_seqs: int | None = None,
    vllm_version: str = DEFAULT_VLLM_VERSION,
) -> KVCapacity:
    """The KV tokens one replica of ``model`` holds on ``tp`` devices of ``device_memory``
    bytes each, as vLLM sizes them (the module's docstring cites the code).

    Args:
        reserve: bytes per device beside the weights (default :func:`activation_reserve`).
        max_num_seqs: the engine's sequence cap, which sizes the sampler's share of the reserve
            (None: vLLM's default for the device, :func:`default_max_num_seqs`).
        vllm_version: which vLLM's reserve rule (plan/vllm_memory.py) sizes the reserve.

    Raises:
        ValueError: naming the field, for memory or a utilization out of range, a bad TP or
            block size, a vLLM version no rule covers; :class:`NoKVCache` for memory that
            leaves no KV block after the weights and the reserve.
    """
    check_tp(tp)
    rule = reserve_rule(vllm_version)
    if not (isinstance(device_memory, (int, float)) and math.isfinite(device_memory)):
        raise ValueError(f"device memory must be a finite number of bytes, got {device_memory!r}")
    if device_memory <= 0:
        raise ValueError(f"device memory must be > 0, got {device_memory!r}")
    if not (isinstance(utilization, (int, float)) and 0 < utilization <= 1):
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {utilization!r}")
    if isinstance(block_tokens, bool) or not isinstance(block_tokens, int) or block_tokens < 1:
        raise ValueError(f"block_tokens must be an integer >= 1, got {block_tokens!r}")
    if max_num_seqs is not None and (
        isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int) or max_num_seqs < 1
    ):
        raise ValueError(f"max_num_seqs must be an integer >= 1, got {max_num_seqs!r}")
    seqs = max_num_seqs if max_num_seqs is not None else default_max_num_seqs(device_memory)
    held_back = (
        activation_reserve(tp, model.vocab_size, seqs, rule) if reserve is None else float(reserve)
    )
    weights = model.weight_bytes / tp
    available = math.floor(device_memory * utilization) - weights - held_back
    heads = max(1, model.kv_heads // tp)
    page = 2 * block_tokens * heads * model.head_dim * model.kv_dtype_bytes  # one layer's block
    blocks = int(available // page // model.layers) if available > 0 else 0
    if blocks < 1:
        raise NoKVCache(
            f"device memory {device_memory / GiB:g} GiB × {utilization:g} holds no KV cache for "
            f"{model.name} at TP={tp}: its weights take {weights / GiB:.2f} GiB per device and "
            f"the activation reserve {held_back / GiB:.2f} GiB"
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
        seqs if reserve is None else None,
        vllm_version,
    )
