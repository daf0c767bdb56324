"""``prefill-bench fidelity-server``: calibrate from a running server and predict held-out
workloads on it (calibration and workloads alternating in time), then compare TTFT, TPOT, ITL
and E2EL with the run-to-run spread as the noise floor and a bootstrap interval on every
verdict; exit 1 unless the check HOLDS."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys

from pytest_prefill._io import write_json_atomic
from pytest_prefill.commands._args import (
    add_output_arguments,
    positive_int,
    save_tables,
)
from pytest_prefill.commands._serve_args import (
    add_kv_tokens_argument,
    add_server_arguments,
    target_from_args,
)
from pytest_prefill.commands.server_calibration import (
    add_sweep_arguments,
    check_profiled_engine,
    profile_from_args,
    progress,
    sweep_from_args,
)
from pytest_prefill.plan.traces import azure_trace_path
from pytest_prefill.serve.calibration.experiments import warm_up
from pytest_prefill.serve.calibration.server_model import PROFILED_ENGINES, Scheduling
from pytest_prefill.serve.fidelity.fidelity import (
    DEFAULT_COUNT,
    DEFAULT_RUNS,
    ServerFidelity,
    run_server_fidelity,
)
from pytest_prefill.serve.fidelity.held_out import SOURCES, lengths

HELP = (
    "check the simulator against a running server on held-out workloads (HOLDS, FAILS or UNDECIDED)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_server_arguments(parser)
    add_sweep_arguments(parser)
    group = parser.add_argument_group("fidelity")
    add_kv_tokens_argument(group, "unbounded")
    group.add_argument(
        "--runs",
        type=positive_int,
        default=DEFAULT_RUNS,
        metavar="N",
        help=f"runs per workload ({DEFAULT_RUNS})",
    )
    group.add_argument(
        "--count",
        type=positive_int,
        default=DEFAULT_COUNT,
        metavar="N",
        help=f"requests per workload ({DEFAULT_COUNT})",
    )
    group.add_argument(
        "--workload",
        choices=SOURCES,
        default=None,
        help="the held-out lengths: azure-conv (the Azure conv trace scaled to a small model) "
        "or mix (a fixed mix of prompts 64-512); default azure-conv where the trace is found, "
        "else mix with a warning",
    )
    add_output_arguments(
        parser, json_help="write the fidelity JSON", save_help="archive the tables and the verdict"
    )


async def _fidelity(args: argparse.Namespace) -> ServerFidelity:
    target = await target_from_args(args)
    sweep = sweep_from_args(args)
    kv = math.inf if args.kv_tokens is None else float(args.kv_tokens)
    profile = profile_from_args(args, target)
    if profile is None:
        raise ValueError(
            f"--engine: the server shows no engine with a profile ({target.identity.engine}); "
            f"say which it is: --engine {{{','.join(PROFILED_ENGINES)}}}"
        )
    scheduling = Scheduling(profile, kv)
    if args.workload is None and azure_trace_path("conv") is None:
        print(f"WARNING: {lengths(None, 64, 1, 0)[3]}", file=sys.stderr, flush=True)
    await warm_up(target)
    return await run_server_fidelity(
        target,
        sweep,
        scheduling,
        runs=args.runs,
        count=args.count,
        workload=args.workload,
        progress=progress,
        command=" ".join(getattr(args, "argv", [])),
    )


def check(args: argparse.Namespace) -> None:
    """What the command line can refuse before anything is sent."""
    check_profiled_engine(args, required=True)
    if args.runs < 2:
        raise ValueError(f"--runs must be at least 2 (the spread needs two), got {args.runs}")
    if args.workload == "azure-conv":
        lengths("azure-conv", 64, 1, 0)  # refuses where the trace is not found


def run(args: argparse.Namespace) -> int:
    from pytest_prefill.report.server_fidelity import fidelity_report

    result = asyncio.run(_fidelity(args))
    text = fidelity_report(result)
    print(text)
    document = result.to_dict()
    if args.json:
        write_json_atomic(args.json, document)
        print(f"\nwrote {args.json}")
    if args.save:
        provenance = {"device": "server", "threads": None}
        verdict = [("server fidelity", result.verdict, text.splitlines()[-1])]
        path = save_tables(
            args, provenance, [("fidelity against " + str(args.url), text, document)], verdict
        )
        print(f"\narchived: {path}")
    return 0 if result.verdict == "HOLDS" else 1  # UNDECIDED is not a pass
