"""``prefill-bench simulate``: the chunk sweep and policy comparison for the lab scenario."""

from __future__ import annotations

import argparse
import datetime

from pytest_prefill import __version__
from pytest_prefill._io import write_json_atomic
from pytest_prefill.advice import recommend, star_text
from pytest_prefill.commands._args import (
    MAX_SECONDS,
    check_chunked_iterations,
    output_path,
    positive_int,
    prompt_len_type,
    seconds_type,
    streams_type,
)
from pytest_prefill.commands._measure_args import (
    add_cost_argument,
    add_model_arguments,
    add_threads_argument,
    add_timing_arguments,
    resolve_cost_args,
)
from pytest_prefill.report import sweep_rows_json, sweep_table
from pytest_prefill.whatif import chunk_sweep, default_chunks
from pytest_prefill.workloads import lab_scenario

HELP = "simulate the lab scenario under every policy and sweep the chunk size"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cost_argument(parser)
    parser.add_argument(
        "--prompt-len",
        type=prompt_len_type,
        default=2048,
        help="tokens of the arriving prompt (default 2048)",
    )
    parser.add_argument(
        "--chunk",
        type=positive_int,
        action="append",
        metavar="TOKENS",
        help="chunk size to simulate (repeatable; default: C*, powers of two, the whole prompt)",
    )
    parser.add_argument(
        "--streams", type=streams_type, default=2, help="live streams already decoding (default 2)"
    )
    parser.add_argument(
        "--arrival",
        type=seconds_type,
        default=0.1,
        help=f"when the prompt arrives, seconds (default 0.1; at most {MAX_SECONDS:,.0f})",
    )
    parser.add_argument(
        "--json", type=output_path, metavar="PATH", help="also write the table as JSON here"
    )
    add_model_arguments(parser)  # used by --cost measure
    add_timing_arguments(parser)
    add_threads_argument(parser)


def run(args: argparse.Namespace) -> int:
    check_chunked_iterations(args.prompt_len, args.chunk or [])
    spec = resolve_cost_args(args)
    assert spec.cost is not None  # measured by resolve_cost_args
    cost, origin = spec.cost, spec.source
    load = lab_scenario(streams=args.streams, prompt_len=args.prompt_len, arrival=args.arrival)
    chunks = args.chunk or default_chunks(cost, args.prompt_len)
    check_chunked_iterations(args.prompt_len, chunks)
    rows = chunk_sweep(cost, load, chunks)
    star = cost.chunk_star()
    print(f"Cost model: {origin}")
    print(
        f"Scenario: {args.streams} live streams decoding, a {args.prompt_len}-token prompt "
        f"arrives at {args.arrival * 1e3:.0f} ms. Simulated, not measured."
    )
    print(f"C* = {star_text(star)} tokens")
    print(recommend(cost, spec.refused).line)
    print()
    print(sweep_table(rows))
    print()
    print("TTFT cost = TTFT p99 / shared's; stall gain = shared's max stall / this max stall.")
    print("vLLM's max_num_batched_tokens ~ chunk + decode rows.")
    if args.json:
        write_json_atomic(
            args.json,
            {
                "kind": "pytest-prefill/chunk-sweep",
                "schema_version": 1,
                "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                "version": __version__,
                "cost_source": origin,
                "cost_model": cost.to_dict(),
                "scenario": {
                    "streams": args.streams,
                    "prompt_len": args.prompt_len,
                    "arrival": args.arrival,
                },
                "rows": sweep_rows_json(rows),
            },
        )
        print(f"wrote {args.json}")
    return 0
