"""Flags shared by the commands that measure (``calibrate``, ``demo``, ``simulate --cost
measure``), and the glue that turns them into a loaded model and a calibration. Importing this
module imports no torch."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pytest_prefill.commands._args import non_negative_int, positive_int
from pytest_prefill.models import DTYPES, MODEL_PRESETS, validate_device

DEFAULT_MODEL = "qwen3-0.6b"


def device_type(text: str) -> str:
    try:
        return validate_device(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model --device --dtype``."""
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        metavar="SPEC",
        help=f"a preset ({', '.join(MODEL_PRESETS)}; random weights), a local model directory, "
        f"or a Hugging Face id already in the offline cache (default {DEFAULT_MODEL})",
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
        help="timed calls per measurement (default 10)",
    )
    parser.add_argument(
        "--warmup", type=non_negative_int, default=None, help="untimed calls first (default 3)"
    )
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="at most 3 repeats and 1 warmup; prompt lengths are unchanged",
    )


def add_threads_argument(parser: argparse.ArgumentParser) -> None:
    """``--threads`` (torch CPU threads); apply it with :func:`apply_threads`."""
    parser.add_argument(
        "--threads",
        type=positive_int,
        default=None,
        help="torch CPU threads (default: torch's own; on a CPU shared with other work, fewer "
        "threads than cores keeps their contention out of the timings)",
    )


def apply_threads(args: argparse.Namespace) -> None:
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)


def progress(text: str) -> None:
    """A progress line on stderr."""
    print(f"  .. {text}", file=sys.stderr, flush=True)


def load(args: argparse.Namespace) -> Any:
    """The model the flags name (ValueError with the reason when it cannot be had)."""
    from pytest_prefill.models import load_model

    progress(f"loading {args.model} ...")
    try:
        return load_model(args.model, device=args.device, dtype=args.dtype)
    except ImportError as err:
        raise ValueError(
            f"measuring needs torch, transformers and numpy ({err}); install them, e.g. "
            "pip install 'pytest-prefill[measure]'"
        ) from None


def measure_cost(args: argparse.Namespace) -> tuple[Any, str]:
    """A fresh calibration of the model the flags name: (cost model, origin line)."""
    from pytest_prefill.calibrate import calibrate

    loaded = load(args)
    calibration = calibrate(
        loaded, repeats=args.repeats, warmup=args.warmup, dry_run=args.dry_run, progress=progress
    )
    info = calibration.provenance
    origin = (
        f"measured now: {info['model']} on {info['device_name']}, {info['dtype']}, "
        f"{info['repeats']} repeats{' (dry run)' if info['dry_run'] else ''}"
    )
    return calibration.cost, origin
