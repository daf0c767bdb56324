"""Flags shared by the commands that measure (``calibrate``, ``demo``, ``fidelity``,
``simulate``/``timeline --cost measure``), the glue that turns them into a loaded model and a
calibration, and ``--cost`` resolved by the one rule (:mod:`pytest_prefill.archive.cost_spec`).
Importing this module imports no torch."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pytest_prefill.archive.cost_spec import CostSpec, resolve_cost
from pytest_prefill.commands._args import (
    add_archive_arguments,
    add_lab_scenario_arguments,
    machine_of,
    non_negative_int,
    positive_int,
)
from pytest_prefill.commands._engine_args import add_engine_argument
from pytest_prefill.measure.models import DEFAULT_MODEL, DTYPES, MODEL_PRESETS, validate_device
from pytest_prefill.measure.timing import DEFAULT_REPEATS, DEFAULT_WARMUP
from pytest_prefill.sim import PRESETS

SMALL_PRESETS = ("tiny", "small", "medium")  # minutes at most on a CPU (fidelity of small: 5 min)


def device_type(text: str) -> str:
    try:
        return validate_device(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_model_arguments(
    parser: argparse.ArgumentParser, default: str | None = None, deploy_help: str | None = None
) -> None:
    """``--model --device --dtype``; ``default`` words the model's default in the help. With
    ``deploy_help`` --model is the deployment's model too (default None: unset)."""
    parser.add_argument(
        "--model",
        default=None if deploy_help else DEFAULT_MODEL,
        metavar="SPEC",
        help=deploy_help
        or f"a preset ({', '.join(MODEL_PRESETS)}; random weights), a local model directory, "
        f"or a Hugging Face id already in the offline cache (default {default or DEFAULT_MODEL})",
    )
    parser.add_argument(
        "--device",
        type=device_type,
        default=None,
        help="cpu, cuda or cuda:N (default cuda when present, else cpu)",
    )
    parser.add_argument(
        "--dtype",
        choices=sorted(DTYPES),
        default=None,
        help="default bfloat16 on CUDA, float32 on CPU",
    )


def add_timing_arguments(parser: argparse.ArgumentParser) -> None:
    """``--repeats --warmup --dry-run``."""
    parser.add_argument(
        "--repeats",
        type=positive_int,
        default=None,
        help=f"timed calls per measurement (default {DEFAULT_REPEATS})",
    )
    parser.add_argument(
        "--warmup",
        type=non_negative_int,
        default=None,
        help=f"untimed calls first (default {DEFAULT_WARMUP})",
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="at most 3 repeats and 1 warmup; prompt lengths are unchanged",
    )


THREADS_HELP = (
    "torch CPU threads (default 1 on the CPU, where intra-op threads stall whenever another "
    "process holds a core; torch's own on CUDA); recorded in the calibration's provenance"
)


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """``--threads`` (torch CPU threads); :func:`load` applies it."""
    parser.add_argument("--threads", type=positive_int, default=None, help=THREADS_HELP)


def add_measuring_arguments(parser: argparse.ArgumentParser, default: str | None = None) -> None:
    """What every command that times the model takes: :func:`add_model_arguments` (``default``
    words the model's default), :func:`add_timing_arguments` and :func:`add_threads_argument`."""
    add_model_arguments(parser, default)
    add_timing_arguments(parser)
    add_threads_argument(parser)


def apply_threads(args: argparse.Namespace, device: Any = None) -> None:
    """Set torch's threads: ``--threads``, else 1 when ``device`` is the CPU."""
    threads = getattr(args, "threads", None)
    on_cpu = device is not None and getattr(device, "type", str(device)) == "cpu"
    if threads or on_cpu:
        import torch

        torch.set_num_threads(threads or 1)


def progress(text: str) -> None:
    """A progress line on stderr."""
    print(f"  .. {text}", file=sys.stderr, flush=True)


def load(args: argparse.Namespace, default: str = DEFAULT_MODEL) -> Any:
    """The model the flags name, ``default`` where --model is unset (a command whose --model is
    also the deployment's) (ValueError with the reason when it cannot be had)."""
    from pytest_prefill.measure.models import load_model

    model = args.model if args.model is not None else default
    progress(f"loading {model} ...")
    try:
        loaded = load_model(model, device=args.device, dtype=args.dtype)
    except ImportError as err:
        raise ValueError(
            f"measuring needs torch, transformers and numpy ({err}); install them, e.g. "
            "pip install '.[measure]'"
        ) from None
    apply_threads(args, loaded.device)
    _say_up_front(args, model, loaded)
    return loaded


def _say_up_front(args: argparse.Namespace, model: str, loaded: Any) -> None:
    """What a user would otherwise learn an hour later: the CPU was used, and it is slow."""
    if getattr(loaded.device, "type", str(loaded.device)) != "cpu":
        return
    if args.device is None:
        progress("no CUDA device found: measuring on the CPU (--device cpu says so explicitly)")
    if model not in SMALL_PRESETS:
        progress(
            f"{model} on a CPU is slow: a full calibration can take most of an hour "
            "(--model small takes minutes, tiny seconds; --dry-run cuts the repeats)"
        )


def measure(args: argparse.Namespace) -> Any:
    """A fresh ``Calibration`` of the model the flags name."""
    from pytest_prefill.lab.packed import calibration_runner
    from pytest_prefill.measure.calibrate import calibrate

    loaded = load(args)
    return calibrate(
        loaded,
        repeats=args.repeats,
        warmup=args.warmup,
        dry_run=args.dry_run,
        progress=progress,
        runner=calibration_runner(loaded),
    )


def measured_origin(calibration: Any) -> str:
    """The line that says where a fresh calibration's numbers come from."""
    info = calibration.provenance
    return (
        f"measured now: {info['model']} on {info['device_name']}, {info['dtype']}, "
        f"{info['repeats']} repeats{' (dry run)' if info['dry_run'] else ''}"
    )


def measure_cost(args: argparse.Namespace) -> tuple[Any, str]:
    """A fresh calibration of the model the flags name: (cost model, origin line)."""
    calibration = measure(args)
    return calibration.cost, measured_origin(calibration)


def add_lab_simulation_arguments(
    parser: argparse.ArgumentParser, engine_shown: str | None = None
) -> None:
    """What ``simulate`` and ``timeline`` both take: ``--cost``, the lab scenario's shape and
    ``--engine`` (default the lab's loop; ``engine_shown``: the default as the help says it)."""
    add_cost_argument(parser)
    add_lab_scenario_arguments(parser)
    add_engine_argument(parser, "lab", engine_shown)


def add_cost_argument(parser: argparse.ArgumentParser, default: str | None = "lab-laptop") -> None:
    """``--cost SPEC`` plus the archive flags ``archive`` needs; with ``measure``, the model,
    timing and threads flags apply (add them too)."""
    shown = f"(default: {default})" if default else "(default: a quick calibration made now)"
    parser.add_argument(
        "--cost",
        default=default,
        metavar="SPEC",
        help=f"cost model: a preset ({', '.join(PRESETS)}), a calibration or run JSON path, "
        "'archive' (the latest calibration archived for --machine under --results) or "
        f"'measure' (a fresh calibration of --model on --device) {shown}",
    )
    add_archive_arguments(parser)


def resolve_cost_args(args: argparse.Namespace, cost: str | None = None) -> CostSpec:
    """``cost`` (default ``--cost``) by the one rule; ``measure`` is measured here
    (ValueError naming the spec when it cannot be resolved)."""

    def warn(message: str) -> None:
        print(f"prefill-bench: {message}", file=sys.stderr)

    device = getattr(args, "device", None)
    text = cost if cost is not None else args.cost
    spec = resolve_cost(text, results=args.results, machine=machine_of(args, device), warn=warn)
    if spec.kind != "measure":
        return spec
    calibration = measure(args)
    return spec.measured(
        calibration.cost,
        measured_origin(calibration),
        calibration.refused(),
        calibration.contexts,
        calibration.trust(),
    )
