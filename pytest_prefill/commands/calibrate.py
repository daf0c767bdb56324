"""``prefill-bench calibrate``: measure this machine's cost model, print the tables, C* and the
recommendation, and optionally write the calibration JSON."""

from __future__ import annotations

import argparse

from pytest_prefill._io import write_json_atomic
from pytest_prefill.commands._args import output_path
from pytest_prefill.commands._measure_args import (
    add_model_arguments,
    add_threads_argument,
    add_timing_arguments,
    apply_threads,
    load,
    progress,
)

HELP = "measure prefill and decode costs on this machine and fit a cost model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_timing_arguments(parser)
    add_threads_argument(parser)
    parser.add_argument(
        "--json", type=output_path, metavar="PATH", help="also write the calibration JSON here"
    )


def run(args: argparse.Namespace) -> int:
    from pytest_prefill.calibrate import calibrate

    apply_threads(args)
    loaded = load(args)
    calibration = calibrate(
        loaded, repeats=args.repeats, warmup=args.warmup, dry_run=args.dry_run, progress=progress
    )
    print(calibration.report())
    if args.json:
        write_json_atomic(args.json, calibration.to_dict())
        print(f"\nwrote {args.json}")
    return 0
