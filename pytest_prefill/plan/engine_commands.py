"""The one table of what each engine is on its command line: how it is started, the flags its
token budget and sequence cap are typed as, which flags make an instance one side of a
prefill:decode split, which flags of a running server to read back (its facts), and its paged
cache's default block; and the one line a capacity answer tells a user to type. The simulator's
profiles (``sim.profiles``) keep only the scheduling knobs. Standard library only."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pytest_prefill.sim import PRESETS, CostModel, EngineProfile, Request, simulate

MODEL = "MODEL"  # the user's model: what the line leaves for them to fill in
_NIXL = '--kv-transfer-config \'{"kv_connector":"NixlConnector","kv_role":"kv_both"}\''


@dataclasses.dataclass(frozen=True, slots=True)
class EngineCommand:
    """How one instance of an engine is started (``start``, None: no command line, e.g. a
    simulator), the flags that make an instance a prefill or a decode instance of a split
    (``split``, None: the engine runs no split), what routes requests across colocated
    instances (``router``) and across a split's (``split_router``, None: ``router``), where
    this was read (``source``) and the kinds of colocated deployment it can be told to run
    (``kinds``): ``budgets`` (token budgets), ``shared``, ``chunks`` (chunk sizes and a time
    budget: the lab's own knobs); ``tp_flag`` sets an instance's tensor-parallel size and
    ``memory_flag`` the fraction of each device's memory it takes and ``length_flag`` the longest
    sequence it serves (None: the engine has none); ``budget_flag`` and ``seqs_flag`` the token
    budget and sequence cap as typed (None: no flag); ``fp8_weights`` and ``fp8_kv`` the flags
    that store the weights and the KV cache in fp8 (None: the engine has none); ``read_back``: per fact of a running
    server (``tp``, ``max_seqs``, ``kv_block_tokens``, ``kv_blocks``, ``kv_capacity_tokens``)
    the flags that show it, first spelling wins, read from the engine's own argument parser;
    ``kv_block_tokens``: its paged cache's block when no flag sets it (None: not known)."""

    start: str | None
    split: tuple[str, str] | None
    router: str
    source: str
    kinds: tuple[str, ...] = ("budgets",)
    split_router: str | None = None
    tp_flag: str | None = None
    memory_flag: str | None = None
    length_flag: str | None = None
    budget_flag: str | None = None
    seqs_flag: str | None = None
    fp8_weights: str | None = None
    fp8_kv: str | None = None
    read_back: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    kv_block_tokens: int | None = None

    def router_of(self, split: bool) -> str:
        """What routes requests across the instances of a split (``split``) or colocated ones."""
        return (self.split_router or self.router) if split else self.router


ENGINE_COMMANDS: dict[str, EngineCommand] = {
    "lab": EngineCommand(
        None,
        ("", ""),
        "the simulator's least-loaded router",
        "the lab's loop is a model, not an engine to start",
        ("shared", "chunks"),
    ),
    "vllm": EngineCommand(
        f"vllm serve {MODEL}",
        (_NIXL, _NIXL),
        "a least-loaded router",
        "vLLM docs, features/disagg_prefill.md and features/nixl_connector_usage.md "
        "(disaggregated prefill is experimental; both sides take the same NixlConnector "
        "config, the proxy decides the roles)",
        split_router="a proxy that sends each request to a prefill instance, then a decode "
        "one (vLLM's toy_proxy_server.py, or llm-d / Dynamo)",
        tp_flag="--tensor-parallel-size",
        memory_flag="--gpu-memory-utilization",
        length_flag="--max-model-len",
        budget_flag="--max-num-batched-tokens",
        seqs_flag="--max-num-seqs",
        fp8_weights="--quantization fp8",
        fp8_kv="--kv-cache-dtype fp8",
        read_back={  # vllm/engine/arg_utils.py
            "tp": ("--tensor-parallel-size", "-tp"),
            "max_seqs": ("--max-num-seqs",),
            "kv_block_tokens": ("--block-size",),
            "kv_blocks": ("--num-gpu-blocks-override",),
        },
    ),
    "sglang": EngineCommand(
        f"python -m sglang.launch_server --model-path {MODEL} --enable-mixed-chunk",
        ("--disaggregation-mode prefill", "--disaggregation-mode decode"),
        "sglang_router",
        "SGLang docs, advanced_features/pd_disaggregation and server_arguments "
        "(--enable-mixed-chunk: prefill chunks ride with decode rows, as simulated; SGLang "
        "runs them apart without it)",
        split_router="sglang_router --pd-disaggregation",
        tp_flag="--tp",
        memory_flag="--mem-fraction-static",
        length_flag="--context-length",
        budget_flag="--chunked-prefill-size",
        seqs_flag="--max-running-requests",
        fp8_weights="--quantization fp8",
        fp8_kv="--kv-cache-dtype fp8_e4m3",
        read_back={  # python/sglang/srt/server_args.py
            "tp": ("--tp", "--tp-size", "--tensor-parallel-size"),
            "max_seqs": ("--max-running-requests",),
            "kv_block_tokens": ("--page-size",),
            "kv_capacity_tokens": ("--max-total-tokens",),
        },
    ),
    "llama.cpp": EngineCommand(
        f"llama-server -m {MODEL}.gguf",
        None,
        "a least-loaded load balancer in front of the servers",
        "llama.cpp tools/server/README.md (no prefill/decode split)",
        budget_flag="-b",
        seqs_flag="-np",
        read_back={  # common/arg.cpp
            "max_seqs": ("-np", "--parallel"),
            "kv_capacity_tokens": ("-c", "--ctx-size"),
        },
    ),
    "transformers": EngineCommand(
        f"transformers serve {MODEL} --continuous-batching",
        None,
        "a least-loaded load balancer in front of the servers",
        "transformers cli/serve.py (--continuous-batching, --cb-max-batch-tokens; no split)",
        budget_flag="--cb-max-batch-tokens",
        read_back={  # cli/serve.py; its sequence cap is no CLI flag: serve/launch/
            # transformers_capped.py takes --max-requests-per-batch before the command
            "max_seqs": ("--max-requests-per-batch",),
            "kv_blocks": ("--cb-num-blocks",),
            "kv_block_tokens": ("--cb-block-size",),
        },
        kv_block_tokens=256,  # its paged cache's block when --cb-block-size is unset
    ),
    "distserve": EngineCommand(
        None,
        ("", ""),
        "DistServe's own placement of prefill and decode instances",
        "DistServe (LLMServe/DistServe): its launcher takes a placement, not flags; its "
        "colocated baseline runs prefill first, unchunked",
        ("shared",),
    ),
}


def engine_command(profile: EngineProfile) -> EngineCommand:
    """How ``profile``'s engine is started; a profile of another name has no command line
    and may split (a model of an engine the harness does not know)."""
    known = ENGINE_COMMANDS.get(profile.name)
    if known is not None:
        return known
    kinds = ("budgets",) if profile.max_batched_tokens is not None else ("shared", "chunks")
    return EngineCommand(None, ("", ""), "a least-loaded router", "a profile of your own", kinds)


def engine_flags(profile: EngineProfile) -> dict[str, int]:
    """``profile``'s knobs in its engine's command-line terms (vLLM ``--max-num-batched-tokens``
    / ``--max-num-seqs``, SGLang ``--chunked-prefill-size`` / ``--max-running-requests``,
    llama.cpp ``-b`` / ``-np``, ``transformers serve`` ``--cb-max-batch-tokens``). Knobs left
    unbounded are left out (a sequence cap is typed no higher than the token budget, as vLLM
    requires); an engine without flags gives none."""
    known = ENGINE_COMMANDS.get(profile.name)
    flags: dict[str, int] = {}
    if known is None:
        return flags
    if known.budget_flag is not None and profile.max_batched_tokens is not None:
        flags[known.budget_flag] = profile.max_batched_tokens
    if known.seqs_flag is not None and profile.max_seqs is not None:
        flags[known.seqs_flag] = min(profile.max_seqs, profile.seq_cap or profile.max_seqs)
    return flags


def flags_text(profile: EngineProfile) -> str:
    """:func:`engine_flags` as they are typed: ``--max-num-batched-tokens 2048 ...``."""
    return " ".join(f"{flag} {value}" for flag, value in engine_flags(profile).items())


def splits(profile: EngineProfile) -> bool:
    """Whether ``profile``'s engine runs prefill and decode on separate instances."""
    return engine_command(profile).split is not None


@dataclasses.dataclass(frozen=True, slots=True)
class LaunchSettings:
    """What a launch line sets beyond the profile's knobs and TP: the fraction of each
    device's memory an instance takes (None: the engine's default), the ``model`` it serves
    (None: ``MODEL``, for the user to fill in), at most ``max_model_len`` tokens a sequence
    (None: the model's context) and whether its weights (``fp8_weights``) and its KV cache
    (``fp8_kv``) are stored in fp8, as the answer assumed."""

    memory_fraction: float | None = None
    model: str | None = None
    max_model_len: int | None = None
    fp8_weights: bool = False
    fp8_kv: bool = False


ENGINE_DEFAULTS = LaunchSettings()  # the engine's memory fraction, MODEL, the model's context


def launch_line(
    profile: EngineProfile,
    prefill: int | None,
    devices: int,
    tp: int = 1,
    settings: LaunchSettings = ENGINE_DEFAULTS,
) -> str:
    """The command to type for ``devices`` instances of ``profile`` (its flags as they stand:
    replace the profile's knobs first), or a split of ``prefill`` prefill instances and the
    rest decode, each instance on ``tp`` devices, with ``settings``; a sentence instead of a
    command for an engine without one."""
    command = engine_command(profile)
    line = _typed(command, profile, tp, settings)
    if command.start is None:
        knobs = _settings(profile, tp)
        if prefill is None:
            return f"{devices} × {profile.name}{knobs}, behind {command.router_of(False)}"
        return (
            f"{prefill} prefill + {devices - prefill} decode instances of {profile.name}"
            f"{knobs}, placed by {command.router_of(True)}"
        )
    if prefill is None:
        return f"{line}  (× {devices}, {_per(tp)}, behind {command.router_of(False)})"
    prefill_flag, decode_flag = _split_flags(command, profile)
    return (
        f"{line} {prefill_flag}  (× {prefill}, prefill)  +  {line} {decode_flag}  "
        f"(× {devices - prefill}, decode), behind {command.router_of(True)}"
    )


def pool_line(
    profile: EngineProfile,
    role: str,
    instances: int,
    tp: int = 1,
    settings: LaunchSettings = ENGINE_DEFAULTS,
) -> str:
    """The command for one pool of a split (``role``: ``"prefill"`` or ``"decode"``) of
    ``instances`` instances on ``tp`` devices each, with the engine's flag that makes an
    instance that side of the split and what places requests across the two pools; the rest
    as :func:`launch_line`."""
    if role not in ("prefill", "decode"):
        raise ValueError(f"role must be 'prefill' or 'decode', got {role!r}")
    command = engine_command(profile)
    flag = _split_flags(command, profile)[0 if role == "prefill" else 1]
    if command.start is None:
        return f"{instances} {role} instances of {profile.name}{_settings(profile, tp)}"
    line = _typed(command, profile, tp, settings)
    return f"{line} {flag}  (× {instances}, {_per(tp)}, {role}; behind {command.router_of(True)})"


def _split_flags(command: EngineCommand, profile: EngineProfile) -> tuple[str, str]:
    if command.split is None:
        raise ValueError(f"engine {profile.name!r} runs no prefill:decode split")
    return command.split


def _per(tp: int) -> str:
    return "one per device" if tp == 1 else f"one per {tp} devices"


def _settings(profile: EngineProfile, tp: int) -> str:
    return f" ({profile.label()}{f', TP {tp}' if tp > 1 else ''})"


def _typed(
    command: EngineCommand,
    profile: EngineProfile,
    tp: int,
    settings: LaunchSettings,
) -> str:
    """The engine's start command with its flags: the profile's knobs, TP, memory fraction and
    longest sequence ("" for an engine with no command line)."""
    fraction, length = settings.memory_fraction, settings.max_model_len
    sizing = []
    if tp > 1 or fraction is not None:
        if command.tp_flag is not None:
            sizing.append(f"{command.tp_flag} {tp}")
        if fraction is not None and command.memory_flag is not None:
            sizing.append(f"{command.memory_flag} {fraction:g}")
    if length is not None and command.length_flag is not None:
        sizing.append(f"{command.length_flag} {length}")
    storage, missing = _fp8(command, settings)
    flags = " ".join(part for part in (flags_text(profile), *sizing, *storage) if part)
    if tp > 1 and command.tp_flag is None and command.start is not None:
        flags += f"  (tensor parallel over {tp} devices: {profile.name} has no flag for it)"
    if missing and command.start is not None:
        flags += f"  ({' and '.join(missing)} in fp8: {profile.name} has no flag for it)"
    if command.start is None:
        return ""
    model = settings.model
    start = command.start.replace(MODEL, model) if model else command.start
    return " ".join(part for part in (start, flags) if part)


def _fp8(command: EngineCommand, settings: LaunchSettings) -> tuple[list[str], list[str]]:
    """The flags storing what ``settings`` has in fp8, and what of it the engine has no flag
    for."""
    flags, missing = [], []
    for wanted, flag, what in (
        (settings.fp8_weights, command.fp8_weights, "weights"),
        (settings.fp8_kv, command.fp8_kv, "KV cache"),
    ):
        if wanted and flag is not None:
            flags.append(flag)
        elif wanted:
            missing.append(what)
    return flags, missing


def refusal(
    policy: str, profile: EngineProfile, cost: CostModel | None = None, **options: Any
) -> str | None:
    """Why the simulator refuses ``policy`` (with ``options``) under ``profile`` on ``cost``
    (default a preset with unbounded KV) — e.g. a knob it does not run for that policy yet —
    or None when it runs it: one small request simulated, so the answer is the simulator's
    own and follows it as it learns. With the profile's prefix cache on, the request carries a
    prefix block (a load with something to share: the stricter case)."""
    if profile.prefix_caching:
        size = profile.prefix_block_tokens
        probe = [Request("probe", 0.0, size, 1, prefix_blocks=("probe",))]
    else:
        probe = [Request("probe", 0.0, 1, 1)]
    device = cost if cost is not None else PRESETS["lab-laptop"].cost
    try:
        simulate(policy, probe, device, engine=profile, **options)
    except ValueError as err:
        return str(err)
    return None
