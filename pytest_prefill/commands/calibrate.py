"""``prefill-bench calibrate``: measure this machine's cost model, print the tables, C* and the
recommendation, and optionally write the calibration JSON."""

from __future__ import annotations

import argparse
import os

from pytest_prefill._io import write_json_atomic
from pytest_prefill.commands._args import add_output_arguments, non_negative_float, save_calibration
from pytest_prefill.commands._measure_args import (
    add_measuring_arguments,
    apply_threads,
    load,
    measured_origin,
    progress,
)

HELP = "measure prefill and decode costs on this machine and fit a cost model"
SAVED = (
    "also archive it as a run under --results/<machine key>/ (what --cost archive, "
    "--prefill-cost archive, compare and runs read)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_measuring_arguments(parser)
    parser.add_argument(
        "--point-budget",
        type=non_negative_float,
        default=None,
        metavar="SECONDS",
        help="skip a prefill or chunk point predicted to take longer than this in all "
        "(default 60; a large model on a CPU would otherwise take hours)",
    )
    parser.add_argument(
        "--runner",
        choices=("packed", "hf"),
        default=None,
        help="time the engine's packed pass (default where the architecture has one: it can "
        "fuse a chunk with decode rows, for fusion_penalty) or the Hugging Face forward",
    )
    add_output_arguments(parser, "also write the calibration JSON here", SAVED)


def run(args: argparse.Namespace) -> int:
    from pytest_prefill.lab.packed import calibration_runner
    from pytest_prefill.measure.calibrate import calibrate
    from pytest_prefill.report.calibration import calibration_report

    if args.save and os.path.exists(args.results) and not os.path.isdir(args.results):
        raise ValueError(f"--results {args.results}: not a folder")  # before measuring
    apply_threads(args)
    loaded = load(args)
    packed = None if args.runner is None else args.runner == "packed"
    calibration = calibrate(
        loaded,
        repeats=args.repeats,
        warmup=args.warmup,
        dry_run=args.dry_run,
        progress=progress,
        runner=calibration_runner(loaded, packed=packed),
        budget=args.point_budget,
    )
    print(calibration_report(calibration))
    if args.json:
        write_json_atomic(args.json, calibration.to_dict())
        print(f"\nwrote {args.json}")
    if args.save:
        print(f"\narchived: {save_calibration(args, calibration, measured_origin(calibration))}")
    return 0
