"""``verify --gpu NAME --model CONFIG``: each knee predicted from the compute derived for
``--model`` on ``--gpu`` (DESIGN.md, "Compute from the model and the device") instead of a
calibration of the server — the derivation a capacity answer on that device runs, over the
workload's token range, with its basis line — so that the knee the server then shows tests the
derived compute. Nothing is calibrated and no load check is run (it would scale the compute to
the server's speed). ``--tp`` derives it at the server's tensor-parallel size, all-reduces
included; the KV cache the knee is simulated with is ``--kv-tokens`` (the server's) when given,
else vLLM's memory rule on the device at that TP and ``--gpu-memory-utilization``, said so."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

from pytest_prefill.commands._args import positive_int
from pytest_prefill.commands._deploy_args import (
    GPU_HELP,
    Deploying,
    add_gpu_arguments,
    check_deploy_args,
    derived_spec,
    no_room,
    utilization_type,
)
from pytest_prefill.plan.compute.derive import Deriver
from pytest_prefill.plan.device_memory import DEFAULT_UTILIZATION, NoKVCache
from pytest_prefill.plan.hardware import MAX_TP
from pytest_prefill.sim import PROFILES, Request
from pytest_prefill.verify.result import Derived

VERIFY_GPU = (
    ", and each knee is predicted from it, nothing calibrated and no load check run (the "
    "KV cache: --kv-tokens, else the launcher's, else vLLM's rule on the device)"
)
DERIVED_ONLY = ("host_from", "quantization", "kv_cache_dtype", "tp", "gpu_memory_utilization")


def add_verify_gpu_arguments(parser: argparse.ArgumentParser) -> None:
    """``--gpu --host-from --quantization --kv-cache-dtype`` as the planning commands take
    them (``--model`` is verify's own: the served model's folder, config.json or preset)."""
    group = parser.add_argument_group("derived compute (with --model, instead of calibrating)")
    add_gpu_arguments(group, GPU_HELP + VERIFY_GPU)
    group.add_argument(
        "--tp",
        type=positive_int,
        metavar="N",
        help="with --gpu: the server's tensor-parallel size (vLLM --tensor-parallel-size; "
        f"default 1, a power of two up to {MAX_TP} dividing the attention heads): the compute "
        "is derived at it, all-reduces included, and the KV cache sized over its devices",
    )
    group.add_argument(
        "--gpu-memory-utilization",
        type=utilization_type,
        metavar="U",
        help="with --gpu, as the server's vLLM flag (default "
        f"{DEFAULT_UTILIZATION}, vLLM's): with the device's memory it sizes the KV cache the "
        "knee is simulated with, unless --kv-tokens gives the server's own",
    )
    # one device's memory is the catalog's (--gpu custom:...,gib=N sets another)
    parser.set_defaults(device_memory=None)


def check_verify_gpu(args: argparse.Namespace, engine: str | None) -> None:
    """Refuse in one line what ``--gpu`` cannot go with, before anything starts: ``--cost`` (a
    second prediction), ``--calibrate-once``, and what the derivation refuses (no ``--model``,
    a device not in the catalog, a model that cannot be read, fp8 on a device without it);
    ``--host-from``, ``--quantization`` and ``--kv-cache-dtype`` without ``--gpu``.
    ``engine``: the one named (--engine, --launch), else vLLM's profile stands for it here.

    Raises:
        ValueError: naming the flags.
    """
    if args.gpu is None:
        given = [f"--{name.replace('_', '-')}" for name in DERIVED_ONLY if getattr(args, name)]
        if given:
            raise ValueError(f"{', '.join(given)}: only with --gpu (derived compute)")
        return
    if args.cost is not None:
        raise ValueError(
            "--gpu and --cost are two predictions (the compute derived for --model on --gpu, a "
            "calibration of the server): give one"
        )
    if args.calibrate_once:
        raise ValueError(
            "--gpu predicts from derived compute, calibrating nothing: drop --calibrate-once"
        )
    if getattr(args, "launch", None) is not None:
        _check_launched(args)
    _check_tp(args, engine or "vllm")


def _check_launched(args: argparse.Namespace) -> None:
    """A launched server runs on this machine's CPU, one process: derived compute predicts it
    only as ``--gpu cpu`` at TP 1.

    Raises:
        ValueError: naming --gpu or --tp.
    """
    if args.gpu.strip().lower() != "cpu":
        raise ValueError(
            f"--gpu {args.gpu} with --launch: the launched server runs on this machine's CPU, "
            "so its knees would test another device's compute against this CPU; give --gpu cpu "
            "(with --host-from), or --url of a server running on that device"
        )
    if (args.tp or 1) > 1:
        raise ValueError(f"--tp {args.tp} with --launch: a launched server runs at TP 1")


def _check_tp(args: argparse.Namespace, engine: str) -> tuple[int, Deploying]:
    """``--tp`` (default 1) once the model is read: one the server could run the model at,
    and the deployment the flags name at it.

    Raises:
        ValueError: naming ``--tp`` and the sizes allowed, or the memory's shortfall.
    """
    tp = args.tp or 1
    if tp > MAX_TP or tp & (tp - 1):  # before the memory is sized at it
        powers = ", ".join(str(1 << k) for k in range(MAX_TP.bit_length()))
        raise ValueError(
            f"--tp {tp}: the compute is derived at a power of two up to {MAX_TP} ({powers}) "
            "that divides the model's attention heads"
        )
    deploying = check_deploy_args(args, PROFILES[engine], devices=tp)
    hardware = deploying.hardware
    assert hardware is not None  # --gpu has --model
    block = PROFILES[engine].kv_block_tokens
    if tp in hardware.tp_sizes(tp, block):
        return tp, deploying
    heads = hardware.model.attention_heads
    if heads % tp == 0:
        try:
            hardware.kv(tp, block)  # raises naming the memory's shortfall
        except NoKVCache as err:
            raise ValueError(no_room(args, err, None)) from None
    allowed = [n for n in (1, 2, 4, 8) if n <= MAX_TP and heads % n == 0]
    raise ValueError(
        f"--tp {tp}: the compute is derived at a power of two up to {MAX_TP} that divides "
        f"{args.model}'s {heads} attention heads: {', '.join(map(str, allowed))}"
    )


def derived_prediction(args: argparse.Namespace, engine: str, load: Sequence[Request]) -> Derived:
    """The compute derived for ``--model`` on ``--gpu`` under ``engine``'s efficiency tables
    over the token range of ``load`` (what the probes draw from), at ``--tp``, with the KV
    cache vLLM's rule gives the device there, and capacity's basis line for it with where the
    KV cache comes from.

    Raises:
        ValueError: naming the flag, as :func:`check_verify_gpu`, or for a range the fit cannot
            support.
    """
    tp, deploying = _check_tp(args, engine)
    prompts, outputs = [r.prompt_len for r in load], [r.output_len for r in load]
    derived, spec = derived_spec(args, deploying, prompts, outputs)
    assert spec.cost is not None and derived.hardware is not None  # derived: a cost model
    block = PROFILES[engine].kv_block_tokens
    cost = derived.hardware.instance_cost(spec.cost, tp, block)
    fraction = args.gpu_memory_utilization or DEFAULT_UTILIZATION
    given = "--gpu-memory-utilization" if args.gpu_memory_utilization else "vLLM's default"
    kv = (
        f"KV cache {cost.kv_capacity_tokens:,.0f} tokens: vLLM's rule on {args.gpu} at TP "
        f"{tp}, utilization {fraction:g} ({given})"
    )
    if getattr(args, "kv_tokens", None):
        kv = f"KV cache {args.kv_tokens:,} tokens: --kv-tokens (the server's)"
        cost = dataclasses.replace(cost, kv_capacity_tokens=float(args.kv_tokens))
    elif args.url is None:  # a launched server sizes its own
        kv = "KV cache: the launched server's own"
    basis = spec.source  # capacity's header line, at TP 1
    deriver = derived.hardware.derived
    if tp != 1 and isinstance(deriver, Deriver):  # the basis of the TP the server runs
        basis = deriver.derive(tp).basis
    return Derived(cost, basis, f"TP {tp}; {kv}")
