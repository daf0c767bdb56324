"""``--model --device-memory --gpu-memory-utilization`` on the commands that simulate a
deployment (``capacity``, ``simulate``, ``timeline``): the model the deployment serves and the
memory of its devices, checked when the command line is parsed (DESIGN.md, "Deployments:
model, memory, parallelism"). ``--model`` also names what ``--cost measure`` calibrates."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Sequence

from pytest_prefill.archive.cost_spec import CostSpec, resolve_cost
from pytest_prefill.commands._args import at_most
from pytest_prefill.commands._compute_args import (
    EACH_TP,
    carried_by,
    derive_on,
    probed_cpu,
    server_facts_of,
)
from pytest_prefill.commands._workload_args import QWEN3_CONTEXT, positive_float
from pytest_prefill.plan.compute.devices import Device, device_named
from pytest_prefill.plan.compute.transfer import (
    CPU_KEY,
)
from pytest_prefill.plan.deployments import Deployment, default_deployments
from pytest_prefill.plan.device_memory import DEFAULT_UTILIZATION, MEMORY_FIX, GiB, NoKVCache
from pytest_prefill.plan.hardware import Hardware
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.plan.model_spec import ARCHITECTURES, SERVED_IDS, ModelSpec, load_model_spec
from pytest_prefill.plan.vllm_memory import DEFAULT_VLLM_VERSION, reserve_rule
from pytest_prefill.serve.client.identity import ServerFacts
from pytest_prefill.sim import CostModel, EngineProfile

MAX_DEVICE_MEMORY_GIB = 1 << 20  # a TiB of memory per device is far beyond any made
ONE_DEVICE = ("simulate", "timeline")  # commands that simulate one device, at TP 1


memory_type = at_most(positive_float, MAX_DEVICE_MEMORY_GIB, "GiB")


def utilization_type(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    return value


GPU_HELP = (
    "the accelerator the deployment runs on, from the catalog (h100, a100-80, h200, b200, l4, "
    "l40s, mi300x, ...) or your own figures; with --model and no --cost the cost model is "
    "derived from the model's shapes and the device"
)
CAPACITY_KINDS = (
    ", and the device's memory sizes the KV cache (--device-memory still wins). Not --device, "
    "which picks where a calibration measures. capacity takes several, h100,h200,l40s: a search "
    "across kinds within a budget per kind (--devices), each kind's compute derived"
)


def add_gpu_arguments(group: argparse._ArgumentGroup, gpu_help: str) -> None:
    """``--gpu`` (its help ``gpu_help``), ``--host-from``, ``--quantization`` and
    ``--kv-cache-dtype``: what derives the compute from ``--model`` on a device."""
    group.add_argument(
        "--gpu",
        metavar="NAME|custom:tflops=…,tbs=…,gib=…",
        help=gpu_help,
    )
    group.add_argument(
        "--host-from",
        metavar="CALIBRATION.json",
        help="with --gpu: carry the host cost of this calibration (its decode step beyond the "
        "compute derived for its own model and device) into the derived answer for --model on "
        "--gpu: a transfer, said so (its provenance must name a model this tool can read and a "
        "catalog device)",
    )
    group.add_argument(
        "--quantization",
        choices=("fp8",),
        help="as vLLM's flag: fp8 weights for every linear layer (memory and, derived, the fp8 "
        "peak)",
    )
    group.add_argument(
        "--kv-cache-dtype",
        choices=("auto", "fp8"),
        help="as vLLM's flag: fp8 stores the KV cache in one byte per value (default auto: the "
        "model's dtype)",
    )


def add_deploy_arguments(parser: argparse.ArgumentParser) -> None:
    """``--gpu --device-memory --gpu-memory-utilization --quantization --kv-cache-dtype``
    (``--model`` comes with the model flags). ``--cost`` left unset falls back to its default
    only without ``--gpu``: with it, the compute is derived."""
    parser.set_defaults(cost=None, cost_fallback=parser.get_default("cost"))
    group = parser.add_argument_group("the deployment's devices (with --model)")
    add_gpu_arguments(group, GPU_HELP + CAPACITY_KINDS)
    group.add_argument(
        "--device-memory",
        type=memory_type,
        metavar="GiB",
        help="memory of one device; with --model it sizes each instance's KV cache as vLLM "
        "does (memory × utilization − weights ÷ TP − an activation reserve)",
    )
    group.add_argument(
        "--gpu-memory-utilization",
        type=utilization_type,
        metavar="U",
        help=f"fraction of each device's memory the engine takes (default {DEFAULT_UTILIZATION}, "
        "vLLM's)",
    )
    group.add_argument(
        "--vllm-version",
        type=vllm_version_type,
        default=DEFAULT_VLLM_VERSION,
        metavar="X.Y",
        help="the vLLM whose start-up reserve sizes the KV cache (default "
        f"{DEFAULT_VLLM_VERSION}, the newest cited): from 0.21 it also holds back CUDA-graph "
        "memory (plan/vllm_memory.py lists the rules and their sources)",
    )


def vllm_version_type(text: str) -> str:
    try:
        reserve_rule(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


MODEL_HELP = (
    f"the model the deployment serves: a config.json (or a folder holding one) or a preset "
    f"({', '.join(ARCHITECTURES)}); it sets the KV bytes per token, the default "
    "--max-model-len and, with --device-memory, the KV capacity (with --cost measure: the "
    "model to calibrate, default qwen3-0.6b)"
)


@dataclasses.dataclass(frozen=True)
class Deploying:
    """What the deployment flags come to once checked (:func:`check_deploy_args`): the engine
    ``profile``, the ``cost`` spec in effect (``--cost``, else its default; None when the
    compute is derived), whether it is derived (``derive``: ``--gpu`` without ``--cost``) on
    ``gpu_device``, the ``hardware`` of ``--model`` (None without it), the context cap and
    where it comes from, and a server calibration's facts once the cost is read. A later step
    that learns more returns a new one (:func:`dataclasses.replace`); none is changed."""

    profile: EngineProfile
    cost: str | None
    derive: bool = False
    gpu_device: Device | None = None
    hardware: Hardware | None = None
    max_model_len: int | None = None
    max_model_len_origin: str | None = None
    server_facts: ServerFacts | None = None


def check_deploy_args(
    args: argparse.Namespace,
    profile: EngineProfile,
    devices: int | None = None,
    gpu: str | None = None,
) -> Deploying:
    """The deployment under ``profile`` the flags name (``gpu``: the --gpu kind, when not
    ``args.gpu``): its hardware (None without ``--model``) and its max-model-len (given, else
    the model's context, else Qwen3-0.6B's, the presets' model) and where the cap comes from.

    Raises:
        ValueError: naming the flag: a model that cannot be read (a config.json missing a
            field), --device-memory without --model or the reverse, or memory that holds no
            KV cache for the model at any TP that divides ``devices``.
    """
    checked = _gpu(args, profile, gpu if gpu is not None else getattr(args, "gpu", None))
    memory, fraction = args.device_memory, args.gpu_memory_utilization
    if args.model is None or (checked.cost == "measure" and memory is None):  # what to calibrate
        if memory is not None or fraction is not None:
            raise ValueError(
                "--device-memory and --gpu-memory-utilization size --model's memory: give --model"
            )
        length, origin = _max_model_len(args, None)
        return dataclasses.replace(checked, max_model_len=length, max_model_len_origin=origin)
    device = checked.gpu_device
    model = _model(args, device)
    recorded = memory_of_cost(checked.cost) if memory is None else None
    if memory is None and device is not None:
        recorded = device.memory_bytes / GiB, f"--gpu {device.key}, as its driver reports"
    if memory is None and recorded is None:
        raise ValueError(
            f"--model {args.model} needs --device-memory GiB (one device's memory) to size its "
            "KV cache: the cost model records no device memory"
        )
    source = "--device-memory"
    if recorded is not None:
        memory, source = recorded
    hardware = Hardware(
        model,
        memory * GiB,
        fraction or DEFAULT_UTILIZATION,
        memory_source=source,
        max_num_seqs=profile.max_seqs,  # its sequence cap sizes vLLM's sampler reserve
        vllm_version=getattr(args, "vllm_version", DEFAULT_VLLM_VERSION),
    )
    sizes = hardware.tp_sizes(devices or 1)
    if not sizes:
        try:
            hardware.kv(max(1, _largest_tp(devices or 1)), 16)  # raises naming the shortfall
        except NoKVCache as err:
            whose = None if recorded is None else (source, memory)
            raise ValueError(no_room(args, err, whose, kinds=gpu is not None)) from None
    length, origin = _max_model_len(args, model.max_position_embeddings)
    return dataclasses.replace(
        checked, hardware=hardware, max_model_len=length, max_model_len_origin=origin
    )


def no_room(
    args: argparse.Namespace,
    err: NoKVCache,
    whose: tuple[str, float] | None,
    kinds: bool = False,
) -> str:
    """The memory's shortfall with what would make room in this command's own flags;
    ``whose``: where one device's memory came from and how much it is, when the user typed
    none (said first); ``kinds``: a search across kinds, whose memory is each kind's own."""
    command = getattr(args, "command", None)
    # verify's memory is --gpu's (it has no --device-memory); a search across kinds refuses it
    typed = command != "verify" and not kinds
    memory = "--device-memory or --gpu-memory-utilization" if typed else "--gpu-memory-utilization"
    fixes = {
        "capacity": f"raise {memory}, or give more --devices: the search tries a TP of 1, 2, "
        "4 or 8 that divides them",
        "verify": "raise --gpu-memory-utilization, or give a larger --tp (the server's)",
    }
    one_device = (
        f"raise {memory}; {command} runs one device, at TP 1: prefill-bench capacity "
        "--devices N sizes a larger TP"
    )
    fix = fixes.get(command or "", one_device if command in ONE_DEVICE else MEMORY_FIX)
    line = f"{err.shortfall} ({fix})"
    if whose is None:
        return line
    source, gib = whose
    given = "no --device-memory given, so " if typed else ""
    return f"{given}one device's memory was taken from {source} ({gib:g} GiB): {line}"


def _gpu(args: argparse.Namespace, profile: EngineProfile, gpu: str | None) -> Deploying:
    """``gpu``'s device (None: not given), whether the compute is derived (``--gpu`` without
    ``--cost``) and the cost spec in effect (``--cost`` unset takes its default otherwise)."""
    given = getattr(args, "cost", None)
    derive = gpu is not None and given is None
    cost = given if given is not None or derive else getattr(args, "cost_fallback", None)
    checked = Deploying(profile, cost, derive)
    if getattr(args, "host_from", None) and not derive:
        raise ValueError(
            "--host-from carries a calibration's host cost into a derived answer: give --gpu "
            "and --model (and no --cost)"
        )
    if gpu is None:
        return checked
    try:
        is_cpu = gpu.strip().lower() == CPU_KEY
        device = probed_cpu(args) if is_cpu else device_named(gpu)
    except ValueError as err:
        raise ValueError(f"--gpu: {err}") from None
    if args.model is None:
        raise ValueError(
            "--gpu needs --model (a config.json or a preset): the compute and the KV cache are "
            "derived from the model's shapes on that device"
        )
    return dataclasses.replace(checked, gpu_device=device)


def _model(args: argparse.Namespace, device: Device | None) -> ModelSpec:
    """--model with --quantization and --kv-cache-dtype applied; fp8 weights on a --gpu
    without an fp8 peak refused in one line."""
    try:
        model = load_model_spec(args.model)
        changes = {}
        if getattr(args, "quantization", None):
            changes["quantization"] = args.quantization
        if getattr(args, "kv_cache_dtype", None):
            changes["kv_cache_dtype"] = args.kv_cache_dtype
        model = dataclasses.replace(model, **changes)
    except ValueError as err:
        raise ValueError(f"--model: {err}") from None
    if device is not None and model.quantization == "fp8" and not device.has_fp8:
        raise ValueError(
            f"--quantization fp8: {device.name} has no fp8 peak (fp8 GEMMs need Ada, Hopper, "
            "Blackwell or CDNA3); drop it or choose another --gpu"
        )
    return model


def derived_spec(
    args: argparse.Namespace,
    deploying: Deploying,
    prompts: Sequence[int],
    outputs: Sequence[int],
) -> tuple[Deploying, CostSpec]:
    """The cost spec derived from --model on --gpu over the token range of a workload's
    ``prompts`` and ``outputs`` (their lengths), and ``deploying`` with the hardware that then
    derives each TP's."""
    hardware, device = deploying.hardware, deploying.gpu_device
    assert hardware is not None and device is not None
    engine = deploying.profile.name
    host, carried = carried_by(getattr(args, "host_from", None), engine, hardware.model, device)
    derived, spec = derive_on(hardware, device, engine, prompts, outputs, host, carried)
    if getattr(args, "command", None) in ONE_DEVICE:  # its one device runs at TP 1 alone
        source = spec.source.replace(EACH_TP, f"{args.command} runs one device, at TP 1")
        spec = dataclasses.replace(spec, source=source)
    return dataclasses.replace(deploying, hardware=derived), spec


# The presets' devices, as DESIGN.md's "Cost-model presets" names them (datacenter-illustrative
# names none: it is measured nowhere).
PRESET_MEMORY_GIB = {"lab-laptop": (16.0, "the lab-laptop preset's RTX 3080 Ti Laptop 16 GB")}


def memory_of_cost(cost: str | None) -> tuple[float, str] | None:
    """(GiB, where from) of one device as the cost spec records it: a preset's device, a
    calibration's ``device_memory_bytes``; None when it names none."""
    if cost in PRESET_MEMORY_GIB:
        return PRESET_MEMORY_GIB[cost]
    if not cost or not cost.endswith(".json") or not os.path.isfile(cost):
        return None
    try:
        with open(cost, encoding="utf-8") as handle:
            document = json.load(handle)
    except (OSError, ValueError, RecursionError):
        return None
    calibration = document.get("calibration", document) if isinstance(document, dict) else None
    provenance = calibration.get("provenance") if isinstance(calibration, dict) else None
    if not isinstance(provenance, dict):
        return None
    size = provenance.get("device_memory_bytes")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        return None
    return size / GiB, f"the calibration's device, {provenance.get('device_name', '?')}"


def _largest_tp(devices: int) -> int:
    return max(n for n in (1, 2, 4, 8) if devices % n == 0)


def _max_model_len(args: argparse.Namespace, context: int | None) -> tuple[int | None, str | None]:
    """The context cap and where it comes from: --max-model-len, else ``context`` (the
    model's), else Qwen3-0.6B's (None for a command without a workload: timeline)."""
    if not hasattr(args, "max_model_len"):
        return None, None
    if args.max_model_len is not None:
        return args.max_model_len, "--max-model-len"
    if context is not None:
        return context, f"{args.model}'s context"
    return QWEN3_CONTEXT, "Qwen3-0.6B's context, the cost presets' model; --model sets it"


def check_deployment_tp(hardware: Hardware | None, tps: Sequence[int], devices: int) -> None:
    """ValueError when a deployment's TP cannot serve --model (``hardware``) on ``devices``
    (or any TP > 1 is asked for without --model: its all-reduces need the model's shapes)."""
    for tp in tps:
        if hardware is None:
            if tp > 1:
                raise ValueError(
                    f"tp={tp} needs --model and --device-memory (the all-reduces and the KV "
                    "split need the model's shapes)"
                )
            continue
        try:
            hardware.check_tp(tp, devices)
        except NoKVCache as err:
            raise ValueError(
                f"--deployment at tp={tp}: {err.shortfall} (raise --device-memory or "
                "--gpu-memory-utilization, or give it a larger ,tp=N that divides --devices: "
                "e.g. chunked,tokens=2048,tp=4)"
            ) from None
        except ValueError as err:
            raise ValueError(f"tp={tp}: {err}") from None


def deployed_cost(
    hardware: Hardware | None, cost: CostModel, engine: EngineProfile, tp: int = 1
) -> CostModel:
    """``cost`` for one instance of --model (``hardware``) at ``tp`` (``cost`` itself
    without --model)."""
    if hardware is None:
        return cost
    return hardware.instance_cost(cost, tp, engine.kv_block_tokens)


def served_name(spec: str) -> str:
    """What a launch line serves for ``--model``, as given: a preset's Hugging Face id, a
    config.json's folder, a folder; ``MODEL`` where that names nothing a server loads (an
    architecture preset, a config file under another name: its folder is not a model)."""
    if spec in SERVED_IDS:
        return SERVED_IDS[spec]
    if spec in ARCHITECTURES:
        return "MODEL"
    if os.path.isfile(spec):
        if os.path.basename(spec) != "config.json":
            return "MODEL"
        return os.path.dirname(spec) or "."
    return spec


def keep_server_facts(deploying: Deploying, spec: CostSpec) -> tuple[Deploying, str | None]:
    """``deploying`` with a server calibration's facts (and the hardware's measured TP and
    KV); the line that says the search keeps them (None: no server facts)."""
    facts = server_facts_of(spec)
    if facts is None:
        return dataclasses.replace(deploying, server_facts=None), None
    hardware = deploying.hardware
    if hardware is not None:
        hardware = dataclasses.replace(
            hardware,
            measured_tp=facts.tp,
            server_kv_tokens=facts.kv_capacity_tokens,
            max_num_seqs=facts.max_seqs or hardware.max_num_seqs,
        )
    line = (
        f"Server facts kept as the deployment's (the search varies the budget, not the "
        f"hardware): {facts.describe()}"
    )
    return dataclasses.replace(deploying, hardware=hardware, server_facts=facts), line


def search_deployments(
    deploying: Deploying,
    slo: SLO,
    cost: CostModel,
    devices: int,
    given: Sequence[Deployment] | None,
) -> tuple[Deployment, ...]:
    """What a search on ``devices`` within ``slo`` compares: ``given``, else the engine's
    defaults (with --model at every TP that fits, each at its own cost model; a server
    calibration's TP only); a server calibration's sequence cap on each."""
    hardware, facts, profile = deploying.hardware, deploying.server_facts, deploying.profile
    block = profile.kv_block_tokens
    tp = facts.tp if facts is not None else 1
    if given:
        out = hardware.attach(given, cost, block) if hardware is not None else tuple(given)
    elif hardware is not None:
        out = hardware.deployments(cost, devices, slo, profile)
    elif devices % tp == 0:
        out = default_deployments(cost, devices, slo, profile, tp)
    else:
        out = ()
    if facts is not None and facts.max_seqs is not None:
        out = tuple(dataclasses.replace(d, max_seqs=d.max_seqs or facts.max_seqs) for d in out)
    return out


def decode_pool_cost(
    args: argparse.Namespace, deployments: Sequence[Deployment], across_kinds: bool = False
) -> tuple[list[Deployment], CostSpec | None]:
    """``--decode-cost SPEC``: the decode pool's own cost model (a preset or a cost JSON, read
    as ``--cost`` is; not ``measure`` or ``archive``) given to every disaggregated deployment
    of ``deployments``, ``--cost`` then the prefill pool's and the KV link's; and the spec
    (None: not given), which the answer names beside --cost's.

    Raises:
        ValueError: naming --decode-cost: across device kinds (each pool's cost is derived
            there), without a disaggregated --deployment, or a spec that does not resolve.
    """
    text = getattr(args, "decode_cost", None)
    if text is None:
        return list(deployments), None
    if across_kinds:
        raise ValueError(
            "--decode-cost: pools of their own derive each pool's cost from --model and the "
            "catalog; give --decode-cost with --cost and a disaggregated:P:D --deployment"
        )
    if not any(d.policy == "disaggregated" for d in deployments):
        raise ValueError(
            "--decode-cost is the decode pool's cost model: give a disaggregated:P:D --deployment"
        )
    if text in ("measure", "archive"):
        raise ValueError(f"--decode-cost: a preset or a cost JSON path, got {text!r}")
    try:
        spec = resolve_cost(text)
    except ValueError as err:
        raise ValueError(f"--decode-cost: {err}") from None
    cost = spec.cost
    assert cost is not None  # a preset or a file: resolved
    pools = [
        dataclasses.replace(d, decode_cost=cost) if d.policy == "disaggregated" else d
        for d in deployments
    ]
    return pools, spec
