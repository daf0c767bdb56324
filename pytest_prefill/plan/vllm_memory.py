"""What vLLM holds back from the KV cache beside the weights, per vLLM version: one table of
reserve rules with their sources (DESIGN.md, "Deployments: model, memory, parallelism").
Standard library only.

Every version cited sizes the cache the same way (``vllm/v1/worker/gpu_worker.py``,
``Worker.determine_available_memory``, Apache-2.0): ``total_memory × gpu_memory_utilization``
requested, minus ``profile_result.non_kv_cache_memory`` from ``vllm/utils`` ``memory_profiling``
(the weights, the profiling run's torch peak increase, and the memory outside torch that grew
during it). What the profiling run holds, and what else is subtracted, changed:

- the torch peak is the sampler's: ``profile_run`` (``vllm/v1/worker/gpu_model_runner.py``) ends
  with ``_dummy_sampler_run`` over ``max_num_seqs`` rows of float32 logits and its working
  copies; measured in copies of those logits (:attr:`ReserveRule.sampler_copies`);
- memory outside torch: the forward pass's NCCL buffers at TP > 1 fall inside the profiling
  window and are counted (:attr:`ReserveRule.non_torch_tp`);
- from v0.21.0, ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` is on by default: the profiling
  run captures dummy CUDA graphs and their estimated memory is subtracted too (the startup log
  says "CUDA graph memory profiling is enabled (default since v0.21.0)"); before, graphs were
  captured after the KV cache was sized, from the memory utilization left over.
"""

from __future__ import annotations

import dataclasses
import re

GiB = 2**30

LLM_D_LOGS = (
    "llm-d/llm-d-benchmark config_explorer/empirical-vllm-memory-results.md (vLLM v0.11.0 "
    "startup logs on H100, 79.18 GiB; Apache-2.0)"
)
GRAPH_LOG = (
    "vLLM 0.21.0 log in LMCache/LMCache#3430 (Qwen3-8B, one RTX A5000, default capture sizes: "
    "'Profiling CUDA graph memory: PIECEWISE=51 (largest=512), FULL=35 (largest=256)', "
    "'Estimated CUDA graph memory: 0.52 GiB total')"
)
GRAPH_RANGE = (
    "other published estimates, on other flags: 0.36 GiB (vLLM 0.27.1, 16 capture sizes, "
    "gpustack/runner#251), 0.17 GiB (TP 4, noonghunna/club-3090#127), about 0.65 GiB (utilization "
    "0.95 equivalent to 0.9225 on a 24 GB card, wtdcode/vllm-backport#15)"
)


@dataclasses.dataclass(frozen=True, slots=True)
class ReserveRule:
    """What vLLM from ``since`` (major, minor) holds back per device beside the weights.

    ``sampler_copies``: float32 copies of ``max_num_seqs × vocab`` logits at the profiling peak;
    ``non_torch_tp``: bytes outside torch at TP 1 and at TP > 1 (NCCL counted);
    ``graph_bytes``: the CUDA-graph estimate subtracted (0: graphs not counted); ``source``.
    """

    since: tuple[int, int]
    sampler_copies: float
    non_torch_tp: tuple[float, float]
    graph_bytes: float
    source: str

    @property
    def version(self) -> str:
        return f"{self.since[0]}.{self.since[1]}"

    def non_torch(self, tp: int) -> float:
        return self.non_torch_tp[0] if tp == 1 else self.non_torch_tp[1]


# The v0.11 figures are from llm-d's logs: "torch peak memory increase" 4.76 GiB for
# Llama-3.1-8B (vocab 128,256), 5.56 for Qwen3-0.6B and 5.64 for Qwen3-32B TP 2 (vocab
# 151,936), max_num_seqs 1024 (vLLM's default on an H100): 9.6-9.7 copies of the logits, their
# mean 9.68; "non-torch forward increase" 0.13 GiB at TP 1, 0.54-0.55 at TP 2. The v0.21 rule
# adds the CUDA-graph estimate vLLM printed at default capture sizes for a dense 8B model
# (GRAPH_LOG): it grows with the capture sizes and the model (GRAPH_RANGE), and no published
# v0.21+ log on a catalog device with its KV figure and full flags was found to check it against.
SAMPLER_COPIES = 9.68
NON_TORCH_TP1 = 0.13 * GiB
NON_TORCH_TP = 0.55 * GiB
GRAPH_ESTIMATE = 0.52 * GiB

RULES: tuple[ReserveRule, ...] = (
    ReserveRule(
        (0, 11),
        SAMPLER_COPIES,
        (NON_TORCH_TP1, NON_TORCH_TP),
        0.0,
        "vllm/v1/worker/gpu_worker.py determine_available_memory, vllm/utils memory_profiling "
        f"(vLLM v0.11.0, Apache-2.0); figures: {LLM_D_LOGS}",
    ),
    ReserveRule(
        (0, 21),
        SAMPLER_COPIES,
        (NON_TORCH_TP1, NON_TORCH_TP),
        GRAPH_ESTIMATE,
        "vllm/v1/worker/gpu_worker.py determine_available_memory with "
        "VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS on by default (vLLM v0.21.0, Apache-2.0; PR "
        f"#30515 added the estimate); figures: the v0.11 rule's, and {GRAPH_LOG}; {GRAPH_RANGE}",
    ),
)
NEWEST_CITED = "0.27"  # the newest vLLM whose log is cited (gpustack/runner#251, GRAPH_RANGE)
DEFAULT_VLLM_VERSION = NEWEST_CITED


def rule_name(version: str) -> str:
    """``vLLM 0.27's rule``, and for a vLLM newer than any cited, that the newest cited rule is
    assumed for it."""
    if parse_version(version) <= parse_version(NEWEST_CITED):
        return f"vLLM {version}'s rule"
    return f"vLLM {version}'s rule (assumed: the newest cited is {NEWEST_CITED}'s)"


def parse_version(text: object) -> tuple[int, int]:
    """``"0.11"`` or ``"0.11.2"`` as (0, 11).

    Raises:
        ValueError: for anything else, in one line.
    """
    match = re.fullmatch(r"\s*v?(\d+)\.(\d+)(?:\.\d+)?\s*", text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"vllm_version must be MAJOR.MINOR like 0.11 or 0.21, got {text!r}")
    return int(match.group(1)), int(match.group(2))


def reserve_rule(version: str = DEFAULT_VLLM_VERSION) -> ReserveRule:
    """The rule vLLM ``version`` sizes its KV cache by: the newest at or before it.

    Raises:
        ValueError: for a malformed version, or one older than the oldest rule cited.
    """
    wanted = parse_version(version)
    ruled = [rule for rule in RULES if rule.since <= wanted]
    if not ruled:
        raise ValueError(
            f"vllm_version {version!r} is older than the oldest reserve rule cited "
            f"({RULES[0].version}); give --vllm-version {RULES[0].version} or newer"
        )
    return max(ruled, key=lambda rule: rule.since)
