"""``prefill-bench fidelity``: every policy run for real on the engine (disaggregation as two
processes) and in the simulator with the engine-calibrated cost model; the simulator's error set
against the measured run-to-run spread."""

from __future__ import annotations

import argparse
from typing import Any

from pytest_prefill._io import write_json_atomic
from pytest_prefill.commands._args import output_path
from pytest_prefill.commands._measure_args import (
    add_model_arguments,
    add_threads_argument,
    add_timing_arguments,
    load,
    positive_int,
    progress,
)

HELP = "run every policy for real and in the simulator; print the simulator's error"


def runs_type(text: str) -> int:
    value = positive_int(text)
    if value < 3:
        raise argparse.ArgumentTypeError(f"must be >= 3 (a spread needs runs), got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.set_defaults(model="tiny")
    add_timing_arguments(parser)
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
    add_threads_argument(parser)
    parser.add_argument(
        "--no-azure", action="store_true", help="skip the Poisson load with Azure conv lengths"
    )
    parser.add_argument(
        "--json", type=output_path, metavar="PATH", help="also write the result JSON here"
    )


def run(args: argparse.Namespace) -> int:
    from pytest_prefill import fidelity as fid

    loaded = load(args)
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
        f"{result.median_abs_error:.1%} over {len(result.cells)} cells (threshold "
        f"{fid.THRESHOLD:.0%}){'' if result.passed else '; exit status 1'}"
    )
    if args.json:
        write_json_atomic(args.json, result.to_dict())
        print(f"wrote {args.json}")
    return 0 if result.passed else 1  # FAILS (median error over the threshold): CI gates on it


def fidelity_report(result: Any, loaded: Any) -> str:
    from pytest_prefill import fidelity_tables as tables

    info = result.provenance
    single = result.calibrations["single worker"].cost
    worker = result.calibrations["disaggregated worker"].cost
    lines = [
        f"Fidelity: {loaded.name} ({loaded.source}) on {info['device_name']}, {info['dtype']}; "
        f"torch {info['torch']}, transformers {info['transformers']}; {info['date']}",
        f"{result.runs} real runs per scenario and policy; calibration {info['repeats']} repeats "
        f"after {info['warmup']} warmup{' (dry run)' if info['dry_run'] else ''}; "
        f"chunked policy: chunk {result.chunk}",
        "",
        "Equal total resources:",
        *(f"  {policy}: {setup}" for policy, setup in result.setups.items()),
        "  each is simulated with a cost model calibrated on the engine in the same setting "
        "(the disaggregated one by the two worker processes themselves, on their cores):",
        f"  single worker:        {_cost_line(single)}",
        f"  disaggregated worker: {_cost_line(worker)}",
        "",
        "Scenarios:",
        *(f"  {s.name}: {s.note}" for s in result.scenarios),
        *(f"  ({reason})" for reason in result.skipped),
        "",
        tables.fidelity_table(result),
        "",
        tables.summary_table(result),
        "",
        tables.weakest_text(result),
        "",
        "Each real iteration vs. the cost model for its exact composition (measured - "
        "predicted) / predicted:",
        tables.iteration_table(result),
        "",
        "Fused iterations (chunk + decode rows in one packed pass), measured directly:",
        tables.fused_table(result),
        "",
        "Prefill pass: linear cost model vs. a fit with attention's T^2 term:",
        tables.prefill_shape_table(result),
        "",
        "KV link (shared memory between the two worker processes):",
        tables.link_table(result),
    ]
    return "\n".join(lines)


def _cost_line(cost: Any) -> str:
    return (
        f"pass overhead {cost.prefill_pass_overhead * 1e3:.2f} ms, "
        f"{cost.prefill_per_token * 1e6:.1f} us/prompt token, decode step "
        f"{cost.decode_step_base * 1e3:.2f} ms + {cost.decode_per_seq * 1e3:.2f} ms/extra row + "
        f"{cost.decode_per_kv_token * 1e9:.0f} ns/cached token"
    )
