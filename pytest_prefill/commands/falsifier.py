"""``prefill-bench demo``: the falsifier. Prints the claim before any measurement, the stall and
decode-per-KV tables, and ends with HOLDS or FAILS."""

from __future__ import annotations

import argparse

from pytest_prefill._io import write_json_atomic
from pytest_prefill.commands._args import output_path, positive_int
from pytest_prefill.commands._measure_args import (
    add_cost_argument,
    add_measuring_arguments,
    apply_threads,
    load,
    progress,
    resolve_cost_args,
)
from pytest_prefill.lab.falsifier import DEFAULT_PROMPT_LEN

HELP = "the falsifier: does chunked prefill shorten a live stream's worst token gap here?"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_measuring_arguments(parser)
    add_cost_argument(parser, default=None)  # C* for the chunk
    parser.add_argument(
        "--prompt-len",
        type=positive_int,
        default=DEFAULT_PROMPT_LEN,
        help=f"tokens of the arriving prompt (default {DEFAULT_PROMPT_LEN}; never shortened)",
    )
    parser.add_argument(
        "--chunk",
        type=positive_int,
        default=None,
        metavar="TOKENS",
        help="chunk size to test (default: C*, from --cost or a quick calibration made now)",
    )
    parser.add_argument(
        "--json", type=output_path, metavar="PATH", help="also write the result JSON here"
    )


def run(args: argparse.Namespace) -> int:
    from pytest_prefill.lab.falsifier import GivenCost
    from pytest_prefill.report.falsifier import run_falsifier

    cost = None
    if args.cost is not None:
        spec = resolve_cost_args(args)
        if spec.cost is not None:  # with its calibration's refusals and trust (the chunk's label)
            cost = GivenCost(spec.cost, spec.refused, spec.trust)
        progress(f"cost model: {spec.source}")
    apply_threads(args)
    loaded = load(args)

    def emit(text: str) -> None:
        print(text + "\n", flush=True)

    result = run_falsifier(
        loaded,
        prompt_len=args.prompt_len,
        chunk=args.chunk,
        cost=cost,
        repeats=args.repeats,
        warmup=args.warmup,
        dry_run=args.dry_run,
        emit=emit,
        progress=progress,
    )
    if args.json:
        write_json_atomic(args.json, result.to_dict())
        print(f"wrote {args.json}")
    return 1 if result.verdict == "FAILS" else 0  # CI gates on the verdict
