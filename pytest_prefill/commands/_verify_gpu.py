"""``verify --gpu NAME --model CONFIG``: each knee predicted from the compute derived for
``--model`` on ``--gpu`` (DESIGN.md, "Compute from the model and the device") instead of a
calibration of the server — the derivation a capacity answer on that device runs, over the
workload's token range, with its basis line — so that the knee the server then shows tests the
derived compute. Nothing is calibrated and no load check is run (it would scale the compute to
the server's speed)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from pytest_prefill.commands._deploy_args import (
    GPU_HELP,
    add_gpu_arguments,
    check_deploy_args,
    derived_spec,
)
from pytest_prefill.sim import PROFILES, Request
from pytest_prefill.verify.result import Derived

VERIFY_GPU = (
    ", and each knee is predicted from it, nothing calibrated and no load check run (the "
    "server's KV cache is still --kv-tokens or the launcher's)"
)
DERIVED_ONLY = ("host_from", "quantization", "kv_cache_dtype")


def add_verify_gpu_arguments(parser: argparse.ArgumentParser) -> None:
    """``--gpu --host-from --quantization --kv-cache-dtype`` as the planning commands take
    them (``--model`` is verify's own: the served model's folder, config.json or preset)."""
    group = parser.add_argument_group("derived compute (with --model, instead of calibrating)")
    add_gpu_arguments(group, GPU_HELP + VERIFY_GPU)
    # the deployment's memory flags of the planning commands: verify's KV is the server's
    parser.set_defaults(device_memory=None, gpu_memory_utilization=None)


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
    check_deploy_args(args, PROFILES[engine or "vllm"])


def derived_prediction(args: argparse.Namespace, engine: str, load: Sequence[Request]) -> Derived:
    """The compute derived for ``--model`` on ``--gpu`` under ``engine``'s efficiency tables
    over the token range of ``load`` (what the probes draw from), at TP 1, and capacity's basis
    line for it.

    Raises:
        ValueError: naming the flag, as :func:`check_verify_gpu`, or for a range the fit cannot
            support.
    """
    deploying = check_deploy_args(args, PROFILES[engine])
    prompts, outputs = [r.prompt_len for r in load], [r.output_len for r in load]
    _, spec = derived_spec(args, deploying, prompts, outputs)
    assert spec.cost is not None  # derived: a cost model
    return Derived(spec.cost, spec.source)
