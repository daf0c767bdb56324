"""``prefill-bench simulate``: the chunk sweep and policy comparison, with vLLM's serving
metrics, for the lab scenario or any workload (``--workload``)."""

from __future__ import annotations

import argparse
import datetime

from pytest_prefill import __version__
from pytest_prefill._io import write_json_atomic
from pytest_prefill.commands._args import (
    check_chunked_iterations,
    lab_scenario_given,
    lab_scenario_of,
    output_path,
    positive_int,
)
from pytest_prefill.commands._deploy_args import Deploying, check_deploy_args
from pytest_prefill.commands._engine_args import check_engine, engine_for, engine_note
from pytest_prefill.commands._measure_args import add_lab_simulation_arguments
from pytest_prefill.commands._planning_cost import add_planning_arguments, instance_spec
from pytest_prefill.commands._workload_args import (
    add_workload_arguments,
    check_chunked_run,
    check_workload_args,
    workload_from_args,
    workload_lines,
)
from pytest_prefill.commands.capacity import DEFAULT_ENGINE
from pytest_prefill.plan.advice import FittedCost, recommend, star_text
from pytest_prefill.plan.capacity import engine_document
from pytest_prefill.plan.deployments import search_chunks
from pytest_prefill.plan.engine_commands import refusal
from pytest_prefill.plan.metrics import SLO, ServingMetrics, serving_metrics
from pytest_prefill.plan.sweep import SweepRow, chunk_sweep, default_chunks, engine_header
from pytest_prefill.report.metrics import serving_table
from pytest_prefill.report.sweep import GPU_SECONDS, sweep_rows_json, sweep_table
from pytest_prefill.sim import CostModel, EngineProfile, Request, simulate

HELP = "simulate a workload (default: the lab scenario) under every policy; sweep the chunk"


# A workload runs under vllm by default, as capacity and the plugin do; the lab scenario keeps
# the lab's loop, the one its preset was measured on and its table was published for.
ENGINE_SHOWN = "vllm with --workload, lab for the lab scenario"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_lab_simulation_arguments(parser, ENGINE_SHOWN)
    parser.add_argument(
        "--chunk",
        type=positive_int,
        action="append",
        metavar="TOKENS",
        help="chunk size to simulate (repeatable; default: C*, powers of two, the whole prompt)",
    )
    parser.add_argument(
        "--json", type=output_path, metavar="PATH", help="also write the table as JSON here"
    )
    add_workload_arguments(parser, default="lab")  # --prompt-len/--streams/--arrival: lab only
    parser.add_argument(
        "--slo",
        type=_slo_type,
        metavar="BOUNDS",
        help="also report goodput and attainment for these bounds, e.g. ttft:1s,tpot:100ms",
    )
    add_planning_arguments(parser)


def check(args: argparse.Namespace) -> Deploying:
    """Before any work: the engine profile, the lab scenario's flags only with the lab
    workload, the workload's own flags, and the chunked iterations a run would take where the
    flags alone decide them; the deployment the flags name."""
    profile = check_engine(args, DEFAULT_ENGINE if args.workload != "lab" else None)
    given = lab_scenario_given(args)
    if args.workload != "lab" and given:
        raise ValueError(
            f"{', '.join(given)} {'shapes' if len(given) == 1 else 'shape'} the lab scenario; "
            f"workload {args.workload!r} brings its own prompts (drop "
            f"{'it' if len(given) == 1 else 'them'}, or use --workload lab)"
        )
    check_chunked_iterations(args.prompt_len, args.chunk or [])
    deploying = check_deploy_args(args, profile)
    check_workload_args(args, args.chunk or [], deploying.max_model_len)
    return deploying


def _slo_type(text: str) -> SLO:
    try:
        return SLO.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _load(
    args: argparse.Namespace, deploying: Deploying, cost: CostModel
) -> tuple[list[Request], list[str], list[int], dict, EngineProfile]:
    """The requests, the lines that describe them, the chunks to sweep, the JSON scenario and
    the engine profile (with a trace's prefix blocks, when its cache is on)."""
    workload = workload_from_args(args, deploying.max_model_len)  # refuses the lab's flags
    engine = engine_for(deploying.profile, workload)
    if args.workload == "lab":
        load = lab_scenario_of(args).requests()
        lines = [
            f"Scenario: {args.streams} live streams decoding, a {args.prompt_len}-token prompt "
            f"arrives at {args.arrival * 1e3:.0f} ms. Simulated, not measured."
        ]
        chunks = args.chunk or default_chunks(cost, args.prompt_len)
        scenario = {"streams": args.streams, "prompt_len": args.prompt_len, "arrival": args.arrival}
        return load, lines, chunks, scenario, engine
    load = list(workload.requests)
    chunks = args.chunk or list(search_chunks(cost))
    check_chunked_run((r.prompt_len for r in load), chunks)
    scenario = {
        "workload": workload.name,
        "description": workload.description,
        "requests": len(load),
        "capped_prompts": workload.capped,
        "max_model_len": workload.max_model_len,
        "attribution": workload.attribution,
    }
    lines = [*workload_lines(workload), "Simulated, not measured."]
    return load, lines, chunks, scenario, engine


def _requests(args: argparse.Namespace, max_model_len: int | None) -> list[Request]:
    """The requests whose token range a derived cost model covers."""
    if args.workload == "lab":
        return lab_scenario_of(args).requests()
    return list(workload_from_args(args, max_model_len).requests)


def _metrics(
    rows: list[SweepRow],
    load: list[Request],
    cost: CostModel,
    slo: SLO | None,
    engine: EngineProfile,
) -> list[ServingMetrics]:
    """vLLM's serving metrics of each row's run (simulated again: the sweep keeps summaries)."""
    return [
        serving_metrics(simulate(row.policy, load, cost, chunk=row.chunk, engine=engine), slo=slo)
        for row in rows
    ]


def run(args: argparse.Namespace, deploying: Deploying | None = None) -> int:
    if deploying is None:  # called without the command line's check
        deploying = check(args)
    length = deploying.max_model_len
    deploying, spec = instance_spec(args, deploying, lambda: _requests(args, length), "\n")
    assert spec.cost is not None
    cost, origin = spec.cost, spec.source
    load, lines, chunks, scenario, engine = _load(args, deploying, cost)
    if args.workload == "lab":
        check_chunked_iterations(args.prompt_len, chunks)
    rows = chunk_sweep(cost, load, chunks, engine=engine)
    metrics = _metrics(rows, load, cost, args.slo, engine)
    star = cost.chunk_star()
    print(f"Cost model: {origin}")
    print("\n".join(lines))
    note = engine_note(args) if args.workload != "lab" else ""  # the lab scenario's is lab
    print(" ".join(filter(None, [engine_header(engine), note])))
    print(f"C* = {star_text(star)} tokens")
    if spec.trust is not None:
        print(f"  (the calibration's trust figures: {spec.trust.text()})")
    fitted = FittedCost(cost, frozenset(spec.refused), spec.contexts, spec.trust)
    print(str(recommend(fitted)))  # line and warnings
    print()
    print(sweep_table(rows))
    if not any(row.policy == "disaggregated" for row in rows):
        print(f"(no disaggregated row: {refusal('disaggregated', engine)})")
    print()
    print("TTFT p99 here is nearest-rank (a request's own TTFT); TTFT cost = TTFT p99 / shared's;")
    print("stall gain = shared's max stall / this max stall.")
    print(f"{GPU_SECONDS}.")
    print("vLLM's max_num_batched_tokens ~ chunk + decode rows.")
    print()
    print("Serving metrics (vLLM's definitions; times in ms). Their percentiles interpolate, as")
    print("vLLM's do; the table above takes the simulator's nearest-rank TTFT p99, so the two")
    print("p99s of one run can differ slightly.")
    print(serving_table([(row.label, m) for row, m in zip(rows, metrics)]))
    if args.json:
        document = _document(args, engine, origin, cost, scenario, rows, metrics)
        write_json_atomic(args.json, document)
        print(f"wrote {args.json}")
    return 0


def _document(
    args: argparse.Namespace,
    engine: EngineProfile,
    origin: str,
    cost: CostModel,
    scenario: dict,
    rows: list[SweepRow],
    metrics: list[ServingMetrics],
) -> dict:
    """The sweep as ``--json`` writes it."""
    return {
        "kind": "pytest-prefill/chunk-sweep",
        "schema_version": 1,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "version": __version__,
        "cost_source": origin,
        "cost_model": cost.to_dict(),
        "scenario": scenario,
        "engine": engine_document(engine),
        "slo": args.slo.to_dict() if args.slo else None,
        "rows": [
            {**row, "serving_metrics": m.to_dict()}
            for row, m in zip(sweep_rows_json(rows), metrics)
        ],
    }
