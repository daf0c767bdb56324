"""``prefill-bench fidelity``: every policy run for real on the engine (disaggregation as two
processes) and in the simulator with the engine-calibrated cost model; the simulator's error set
against the measured run-to-run spread."""

from __future__ import annotations

import argparse
from typing import Any

from pytest_prefill._io import write_json_atomic
from pytest_prefill.commands._args import (
    add_output_arguments,
    save_tables,
)
from pytest_prefill.commands._measure_args import (
    add_measuring_arguments,
    load,
    positive_int,
    progress,
)
from pytest_prefill.measure.models import DEFAULT_MODEL

HELP = "run every policy for real and in the simulator; print the simulator's error"
SAVED = (
    "also archive the run under --results/<machine key>/ (tables, verdict, the whole result), "
    "where runs and compare find it"
)
# The CPU default: a compute-bound Qwen3 shape (the tiny preset is interpreter-bound, and its
# timings say more about Python than about the cost model's physics).
DEFAULT_CPU_MODEL = "small"


def runs_type(text: str) -> int:
    value = positive_int(text)
    if value < 3:
        raise argparse.ArgumentTypeError(f"must be >= 3 (a spread needs runs), got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_measuring_arguments(parser, f"{DEFAULT_CPU_MODEL} on the CPU, {DEFAULT_MODEL} on CUDA")
    parser.set_defaults(model=None)
    parser.add_argument(
        "--runs",
        type=runs_type,
        default=3,
        help="real runs per scenario and policy (>= 3; default 3)",
    )
    parser.add_argument(
        "--chunk",
        type=positive_int,
        default=None,
        metavar="TOKENS",
        help="chunk for the chunked policy (default 256)",
    )
    parser.add_argument(
        "--prompt-len",
        type=positive_int,
        action="append",
        metavar="TOKENS",
        help="lab-scenario prompt length (repeatable; default 256, 1024, 2048)",
    )
    parser.add_argument(
        "--no-azure", action="store_true", help="skip the Poisson load with Azure conv lengths"
    )
    add_output_arguments(parser, "also write the result JSON here", SAVED)


def run(args: argparse.Namespace) -> int:
    from pytest_prefill.lab import fidelity as fid
    from pytest_prefill.lab.fidelity_result import THRESHOLD
    from pytest_prefill.report.fidelity import fidelity_report

    loaded = load(args, DEFAULT_CPU_MODEL if (args.device or "cpu") == "cpu" else DEFAULT_MODEL)
    result = fid.run_fidelity(
        loaded,
        runs=args.runs,
        chunk=args.chunk or fid.DEFAULT_CHUNK,
        prompt_lens=tuple(args.prompt_len or fid.DEFAULT_PROMPT_LENS),
        repeats=args.repeats,
        warmup=args.warmup,
        dry_run=args.dry_run,
        azure=not args.no_azure,
        threads=args.threads,
        progress=progress,
    )
    print(fidelity_report(result, loaded))
    print(
        f"\n{'HOLDS' if result.passed else 'FAILS'}: median |relative error| "
        f"{result.median_abs_error:.1%} over {sum(c.judged for c in result.cells)} judged "
        f"cells (threshold "
        f"{THRESHOLD:.0%}){'' if result.passed else '; exit status 1'}"
    )
    if args.json:
        write_json_atomic(args.json, result.to_dict())
        print(f"wrote {args.json}")
    if args.save:
        print(f"archived: {save_fidelity(args, result)}")
    return 0 if result.passed else 1  # FAILS (median error over the threshold): CI gates on it


def save_fidelity(args: argparse.Namespace, result: Any) -> Any:
    """Archive a fidelity run: its printed tables, its verdict, and the whole result."""
    from pytest_prefill.lab.fidelity_result import THRESHOLD
    from pytest_prefill.report import fidelity as tables

    data = result.to_dict()
    rows = [
        ("Fidelity: simulated vs measured", tables.fidelity_table(result), data),
        ("Fidelity: median |error| by policy and metric", tables.summary_table(result), None),
        ("Fidelity: the cost models used", tables.calibration_table(result), None),
        ("Each real iteration vs. the cost model", tables.iteration_table(result), None),
        ("KV link between the disaggregated workers", tables.link_table(result), None),
    ]
    sentence = (
        f"median |relative error| {result.median_abs_error:.1%} over the judged cells "
        f"(threshold {THRESHOLD:.0%}); all cells {result.median_abs_error_all:.1%}"
    )
    verdict = ("fidelity", "HOLDS" if result.passed else "FAILS", sentence)
    return save_tables(args, result.provenance, rows, [verdict])
