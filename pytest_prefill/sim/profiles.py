"""Engine profiles (DESIGN.md, "Engine semantics (v3)"): the few ways a real engine's loop
differs from the lab's, as knobs, and named, frozen bundles of them with the source each
default was read from. ``lab`` is the lab's loop exactly; it is every entry point's default."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .checks import check_cap, check_int

FIRST_TOKEN_RULES = ("prefill", "decode")
KV_RULES = ("reserve", "paged")
DISPATCH_RULES = ("shared", "least-loaded", "round-robin")
KNOBS = (
    "first_token",
    "max_batched_tokens",
    "max_seqs",
    "kv",
    "kv_block_tokens",
    "prefix_caching",
    "prefix_block_tokens",
    "prefill_dispatch",
    "decode_max_kv_tokens",
)


def seq_cap(max_seqs: int | None, max_batched_tokens: int | None) -> int | None:
    """The requests a worker admits at once: ``max_seqs``, and no more than the token budget
    (each running request takes one decode row, as vLLM caps its default ``max_num_seqs``);
    None: no cap. The one home of the rule."""
    caps = [c for c in (max_seqs, max_batched_tokens) if c is not None]
    return min(caps) if caps else None


@dataclasses.dataclass(frozen=True, slots=True)
class EngineProfile:
    """How an engine schedules, as knobs (DESIGN.md, "Engine semantics (v3)").

    ``first_token``: ``"prefill"`` — the iteration that completes a request's prompt emits its
    first output token, and the request then takes part in ``output_len - 1`` decode rows (what
    vLLM, SGLang, TGI, llama.cpp and DistServe do); ``"decode"`` — the lab's rule, the first
    token at the end of the first decode step after the prefill. ``max_batched_tokens``: every
    iteration on a worker holds at most this many tokens (a decode row is one, a prompt token
    one; None: no budget). ``max_seqs``: at most this many requests admitted on a worker at
    once (None: no cap). With a token budget at most ``max_batched_tokens`` requests are
    admitted too (:attr:`seq_cap`), since each running request takes a decode row, as vLLM
    caps its default ``max_num_seqs``. ``kv``: ``"reserve"`` (a request reserves prompt and
    output at admission, strict FCFS) or ``"paged"`` (vLLM's blocks of ``kv_block_tokens``
    allocated as tokens are written, preemption by recompute); ``prefix_caching`` (paged KV
    only): a worker's cache of ``prefix_block_tokens``-token prompt blocks, shared by
    ``Request.prefix_blocks`` hash ids. ``prefill_dispatch``: how a disaggregated run's
    prefill workers share arrivals — ``"shared"`` (one queue, a free worker takes what waits),
    ``"least-loaded"`` (each arrival goes at once to the queue of the worker with the fewest
    requests in its pass plus queued, ties to the lowest index: DistServe's scheduler) or
    ``"round-robin"`` (to each worker's queue in turn). ``decode_max_kv_tokens``: a
    disaggregated run's decode step reads at most this many KV tokens (each row its prompt and
    the tokens it emitted): the rows beyond wait their turn in queue order and a row that stepped
    goes to the back, behind the arrivals (DistServe's simulator caps its decode batches so;
    reserve KV only; None: every row steps). ``citations``: (knob, where its default comes
    from) pairs.

    Raises:
        ValueError: naming the field, for a value outside its allowed ones.
    """

    name: str
    first_token: str = "decode"
    max_batched_tokens: int | None = None
    max_seqs: int | None = None
    kv: str = "reserve"
    kv_block_tokens: int = 16
    prefix_caching: bool = False
    prefix_block_tokens: int = 16
    prefill_dispatch: str = "shared"
    decode_max_kv_tokens: int | None = None
    description: str = ""
    citations: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"EngineProfile.name must be a non-empty string, got {self.name!r}")
        if self.first_token not in FIRST_TOKEN_RULES:
            raise ValueError(
                f"first_token must be one of {', '.join(FIRST_TOKEN_RULES)}; "
                f"got {self.first_token!r}"
            )
        check_cap("max_batched_tokens", self.max_batched_tokens)
        check_cap("max_seqs", self.max_seqs)
        if self.kv not in KV_RULES:
            raise ValueError(f"kv must be one of {', '.join(KV_RULES)}; got {self.kv!r}")
        check_int("kv_block_tokens", self.kv_block_tokens)
        if not isinstance(self.prefix_caching, bool):
            raise ValueError(f"prefix_caching must be True or False, got {self.prefix_caching!r}")
        check_int("prefix_block_tokens", self.prefix_block_tokens)
        if self.prefill_dispatch not in DISPATCH_RULES:
            raise ValueError(
                f"prefill_dispatch must be one of {', '.join(DISPATCH_RULES)}; "
                f"got {self.prefill_dispatch!r}"
            )
        check_cap("decode_max_kv_tokens", self.decode_max_kv_tokens)
        pairs = self.citations
        if not isinstance(pairs, tuple) or not all(
            isinstance(p, tuple) and len(p) == 2 and p[0] in KNOBS and isinstance(p[1], str)
            for p in pairs
        ):
            raise ValueError(
                f"citations must be a tuple of (knob, source) pairs, knobs among {KNOBS}"
            )

    @property
    def sources(self) -> Mapping[str, str]:
        """Each knob's source citation: engine, version, file or doc, and the case taken."""
        return dict(self.citations)

    @property
    def seq_cap(self) -> int | None:
        """The requests a worker admits at once: ``max_seqs``, and no more than the token
        budget (each running request takes one decode row); None: no cap."""
        return seq_cap(self.max_seqs, self.max_batched_tokens)

    def changed(self) -> tuple[str, ...]:
        """The knobs that differ from the named profile's defaults (empty for a profile of
        another name)."""
        base = PROFILES.get(self.name)
        if base is None:
            return ()
        return tuple(k for k in KNOBS if getattr(self, k) != getattr(base, k))

    def label(self) -> str:
        """One line for a report header: the profile, its first-token rule and its caps."""
        budget = (
            "no token budget"
            if self.max_batched_tokens is None
            else (f"{self.max_batched_tokens} tokens an iteration")
        )
        seqs = "no sequence cap" if self.seq_cap is None else f"at most {self.seq_cap} requests"
        rule = "from the prefill" if self.first_token == "prefill" else "after a decode step"
        changed = self.changed()
        note = f" (changed: {', '.join(changed)})" if changed else ""
        return f"engine {self.name}{note}: first token {rule}; {budget}; {seqs}"


_VLLM = "vLLM (vllm-project/vllm, commit 99d7eb5, the v0.11 line)"
_SGLANG = "SGLang (sgl-project/sglang main, python/sglang/srt/server_args.py, late 2025)"
_LLAMA = (
    "llama.cpp as vendored in llama-cpp-python 0.3.36 (tools/server/README.md, "
    "common/common.h, tools/server/server.cpp)"
)
_HF = "transformers 5.24.0 (generation/continuous_batching)"
_DIST = "DistServe's simulator (LLMServe/DistServe, commit 82831f1, simdistserve/)"

PROFILES: dict[str, EngineProfile] = {
    p.name: p
    for p in (
        EngineProfile(
            "lab",
            description="the lab's loop: today's simulator, every number unchanged",
            citations=(
                ("first_token", "DESIGN.md, Simulation semantics: the lab's convention"),
                ("max_batched_tokens", "the lab's loop has no token budget"),
                ("max_seqs", "the lab's loop has no sequence cap"),
            ),
        ),
        EngineProfile(
            "vllm",
            first_token="prefill",
            max_batched_tokens=2048,
            max_seqs=256,
            kv="paged",
            kv_block_tokens=16,
            prefix_caching=True,
            prefix_block_tokens=16,
            description="vllm serve (the OpenAI API server) on an A100 or a GPU under 70 GiB",
            citations=(
                (
                    "first_token",
                    f"{_VLLM}: the V1 scheduler (vllm/v1/core/sched/scheduler.py) keeps the "
                    "token sampled in the step that computes a prompt's last tokens (earlier "
                    "chunks' samples are dropped); vLLM's TTFT (vllm/benchmarks/serve.py) is "
                    "to that token",
                ),
                (
                    "max_batched_tokens",
                    f"{_VLLM}: vllm/engine/arg_utils.py, EngineArgs: the OPENAI_API_SERVER "
                    "default is 2048 on a GPU under 70 GiB or an A100 (8192 on H100/H200/"
                    "MI300x-class GPUs of 70 GiB or more; the LLM class 8192 / 16384; a CPU "
                    "2048 x world size); this profile takes vllm serve under 70 GiB or A100. "
                    "Decode rows go first, prompt tokens fill the rest, chunked (V1 scheduler)",
                ),
                (
                    "max_seqs",
                    f"{_VLLM}: vllm/engine/arg_utils.py: default_max_num_seqs 256 (1024 on "
                    "70 GiB or more, not A100), capped at max_num_batched_tokens; "
                    "vllm/config/scheduler.py refuses max_num_batched_tokens < max_num_seqs",
                ),
                (
                    "kv",
                    f"{_VLLM}: paged KV (vllm/v1/core/kv_cache_manager.py, block_pool.py): "
                    "blocks allocated as the scheduler (vllm/v1/core/sched/scheduler.py) "
                    "schedules tokens, running requests first; one that cannot get its "
                    "block preempts the last of the running queue by recompute "
                    "(PreemptionMode.RECOMPUTE, the V1 only mode), prepended to the waiting "
                    "queue; no waiting request is scheduled in a step that preempted",
                ),
                (
                    "kv_block_tokens",
                    f"{_VLLM}: vllm/config/cache.py CacheConfig.block_size: None -> 16 on "
                    "CUDA (vllm/platforms/cuda.py check_and_update_config)",
                ),
                (
                    "prefix_caching",
                    f"{_VLLM}: vllm/engine/arg_utils.py: enable_prefix_caching defaults on in "
                    "V1 for generative models; a hit never covers the whole prompt "
                    "(kv_cache_manager.get_computed_blocks: at most num_tokens - 1); freed "
                    "blocks join the free queue tail first (LRU eviction)",
                ),
                (
                    "prefix_block_tokens",
                    f"{_VLLM}: the prefix cache hashes whole KV blocks (block_size, 16); a "
                    "trace with coarser hash ids (Mooncake's 512) sets its own",
                ),
            ),
        ),
        EngineProfile(
            "sglang",
            first_token="prefill",
            max_batched_tokens=8192,
            description=(
                "sglang.launch_server on an 80 GB GPU (H100, A100-80G); prefill batches run "
                "ahead of decode batches unless --enable-mixed-chunk"
            ),
            citations=(
                (
                    "first_token",
                    f"{_SGLANG}: the prefill batch that completes a prompt samples its first "
                    "token (a chunked prompt's earlier chunks sample none)",
                ),
                (
                    "max_batched_tokens",
                    f"{_SGLANG}: ServerArgs._handle_gpu_memory_settings: chunked_prefill_size "
                    "2048 under 35 GiB, 4096 under 60 GiB, 8192 under 90 GiB and under 160 "
                    "GiB, 16384 above (4096 when the GPU memory is unknown); this profile "
                    "takes an 80 GB GPU",
                ),
                (
                    "max_seqs",
                    f"{_SGLANG}: max_running_requests None: the scheduler derives it from the "
                    "KV pool (max_total_num_tokens // 2, the request pool's size): KV memory, "
                    "which the cost model's kv_capacity_tokens bounds",
                ),
                (
                    "kv",
                    f"{_SGLANG}: page_size 1 and the radix (prefix) cache on by default; not "
                    "simulated yet: reservation here",
                ),
            ),
        ),
        EngineProfile(
            "llama.cpp",
            first_token="prefill",
            max_batched_tokens=2048,
            max_seqs=4,
            description="llama-server with its defaults (-b 2048, -np auto: 4 slots)",
            citations=(
                (
                    "first_token",
                    f"{_LLAMA}: a slot samples its first token from the batch that evaluates "
                    "its prompt's last token",
                ),
                (
                    "max_batched_tokens",
                    f"{_LLAMA}: -b, --batch-size: logical maximum batch size, default 2048 "
                    "(common_params.n_batch); update_slots adds each generating slot's token "
                    "first, then batches pending prompts without exceeding n_batch",
                ),
                (
                    "max_seqs",
                    f"{_LLAMA}: -np, --parallel: default -1 = auto, which server.cpp turns "
                    "into 4 slots with a unified KV cache",
                ),
            ),
        ),
        EngineProfile(
            "transformers",
            first_token="prefill",
            max_batched_tokens=8192,
            max_seqs=1024,
            description="transformers serve --continuous-batching (ContinuousBatchingConfig)",
            citations=(
                (
                    "first_token",
                    f"{_HF}: the batch that completes a prompt samples its first token",
                ),
                (
                    "max_batched_tokens",
                    f"{_HF}: ContinuousBatchingConfig.max_batch_tokens None -> "
                    "PagedAttentionMemoryHandler._default_max_batch_tokens = 8192 (cache.py); "
                    "the FIFO scheduler (scheduler.py) schedules decodes first, then splits "
                    "prompts to fill the budget; flag --cb-max-batch-tokens",
                ),
                (
                    "max_seqs",
                    f"{_HF}: max_requests_per_batch None -> 1024 (initialization.py "
                    "FALLBACK_DEFAULTS; generate_batch lowers it to the number of requests); "
                    "no CLI flag (serve/launch/transformers_capped.py sets it)",
                ),
                (
                    "kv",
                    f"{_HF}: paged cache (page_size 256) with block sharing (prefix caching) "
                    "allowed; not simulated yet: reservation here",
                ),
            ),
        ),
        EngineProfile(
            "distserve",
            first_token="prefill",
            prefill_dispatch="least-loaded",
            decode_max_kv_tokens=50_000,
            description="DistServe's simulator: no token budget, no batch-size cap",
            citations=(
                (
                    "first_token",
                    f"{_DIST}: base/organize_data.py: TTFT ends at the request's first "
                    "wait_decode, the end of its prefill; TPOT = decoding latency / output_len",
                ),
                (
                    "max_batched_tokens",
                    f"{_DIST}: benchmarks/simulate_dist.py: prefill_max_tokens = the KV pool's "
                    "max_num_tokens (estimators/profile_data/max_num_tokens.csv: 66,144 for "
                    "OPT-13B TP1): KV memory, which kv_capacity_tokens bounds",
                ),
                (
                    "decode_max_kv_tokens",
                    f"{_DIST}: base/worker.py _enter_decodes: decode_max_tokens = 50000 (marked "
                    "a hack there): rows join a decode batch from the queue's head while the "
                    "sum of their context_len + 1 (a row's KV read here) stays within it; the "
                    "rows that stepped rejoin the queue's tail",
                ),
                (
                    "max_seqs",
                    f"{_DIST}: prefill_max_batch_size = decode_max_batch_size = 10**7 ('inf')",
                ),
                (
                    "prefill_dispatch",
                    f"{_DIST}: base/scheduler.py _find_best_worker_and_queue: each arrival "
                    "to the prefill worker with the least _prefill_ips + len(prefill_queue) "
                    "(its pass's requests plus its queue; min() keeps the first on a tie)",
                ),
            ),
        ),
    )
}
LAB = PROFILES["lab"]


def get_profile(name: str) -> EngineProfile:
    """The engine profile called ``name``; ValueError listing the allowed ones otherwise."""
    try:
        return PROFILES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown engine profile {name!r}; allowed: {', '.join(PROFILES)}"
        ) from None


def resolve_engine(engine: Any) -> EngineProfile:
    """``engine`` as a profile: a name from ``PROFILES`` or an :class:`EngineProfile`.

    Raises:
        ValueError: for an unknown name or anything else, listing the allowed names.
    """
    if isinstance(engine, EngineProfile):
        return engine
    if isinstance(engine, str):
        return get_profile(engine)
    raise ValueError(
        f"engine must be a profile name ({', '.join(PROFILES)}) or an EngineProfile, "
        f"got {type(engine).__name__}"
    )
