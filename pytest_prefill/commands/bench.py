"""``prefill-bench bench``: replay a workload against a running OpenAI-compatible server (as
vLLM's ``bench serve`` does) and print vLLM's serving metrics; optionally write the result JSON,
the per-request records, and archive the run with the server's identity."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
from typing import Any

from pytest_prefill._io import write_atomic, write_json_atomic
from pytest_prefill.commands._args import (
    MAX_SECONDS,
    add_archive_arguments,
    non_negative_int,
    output_path,
    positive_int,
    save_tables,
)
from pytest_prefill.commands._options import add_defaulted
from pytest_prefill.commands._serve_args import add_server_arguments, target_from_args
from pytest_prefill.commands._workload_args import (
    MAX_RATE,
    add_workload_arguments,
    positive_float,
    workload_from_args,
    workload_lines,
)
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.report.bench import bench_text, max_concurrency_of
from pytest_prefill.serve.load.loadgen import Bounds, Schedule
from pytest_prefill.serve.load.records import BenchRun
from pytest_prefill.serve.load.server_metrics import run_counted

HELP = "replay a workload against a running server and report vLLM's serving metrics"


def arrivals_type(text: str) -> Schedule:
    """``trace``, ``burst``, ``poisson:RATE`` or ``gamma:RATE:BURSTINESS``; the rate bounded
    as ``--request-rate`` is (one request in :data:`MAX_SECONDS` to :data:`MAX_RATE` a
    second)."""
    kind, *numbers = text.split(":")
    try:
        values = [float(n) for n in numbers]
        if values and not 1 / MAX_SECONDS <= values[0] <= MAX_RATE:
            raise ValueError(
                f"the rate must be from {1 / MAX_SECONDS:g} to {MAX_RATE:g} requests/s"
            )
        if kind in ("trace", "burst") and not values:
            return Schedule(kind)
        if kind == "poisson" and len(values) == 1:
            return Schedule(kind, request_rate=values[0])
        if kind == "gamma" and len(values) == 2:
            return Schedule(kind, request_rate=values[0], burstiness=values[1])
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: {err}") from None
    raise argparse.ArgumentTypeError(
        f"must be trace, burst, poisson:RATE or gamma:RATE:BURSTINESS, got {text!r}"
    )


def slo_type(text: str) -> SLO:
    try:
        return SLO.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def percentiles_type(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(p) for p in text.split(","))
    except ValueError:
        values = ()
    if not values or any(not 0 < p < 100 for p in values):
        raise argparse.ArgumentTypeError(
            f"must be percentiles in (0, 100) like 50,90,99, got {text!r}"
        )
    return tuple(sorted(set(values) | {50.0}))


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("schedule and bounds")
    group.add_argument(
        "--arrivals",
        type=arrivals_type,
        default=Schedule(),
        metavar="KIND",
        help="trace (the workload's own arrival times, the default), burst (all at once), "
        "poisson:RATE, gamma:RATE:BURSTINESS (vLLM's burstiness: < 1 burstier)",
    )
    group.add_argument(
        "--max-concurrency",
        type=positive_int,
        metavar="N",
        help="at most N requests in flight (with --arrivals burst: a fixed concurrency)",
    )
    group.add_argument("--max-requests", type=positive_int, metavar="N", help="send the first N")
    group.add_argument(
        "--max-duration",
        type=positive_float,
        metavar="S",
        help="send nothing after S seconds (requests in flight finish)",
    )
    warmup_help = "requests sent one at a time first, not counted (default {default})"
    add_defaulted(group, "--warmup", non_negative_int, 1, warmup_help, "N")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_server_arguments(parser)
    add_workload_arguments(parser, default="poisson")
    add_run_arguments(parser)
    out = parser.add_argument_group("output")
    out.add_argument(
        "--slo", type=slo_type, metavar="BOUNDS", help="goodput for e.g. ttft:1s,tpot:100ms"
    )
    out.add_argument(
        "--percentiles",
        type=percentiles_type,
        default=(50.0, 90.0, 99.0),
        metavar="P,P",
        help="percentiles to report (default 50,90,99)",
    )
    out.add_argument(
        "--json", type=output_path, metavar="PATH", help="write vLLM-style result JSON"
    )
    out.add_argument(
        "--records", type=output_path, metavar="PATH", help="write one JSON line per request"
    )
    out.add_argument(
        "--save", action="store_true", help="archive the run (and its records) under --results"
    )
    add_archive_arguments(parser)


def check(args: argparse.Namespace) -> None:
    """Refuse outputs that would overwrite one another (``--json X --records X``)."""
    outputs = [(flag, getattr(args, flag[2:])) for flag in ("--json", "--records")]
    seen: dict[str, str] = {}
    for flag, path in outputs:
        if path is None:
            continue
        real = os.path.realpath(path)
        if real in seen:
            raise ValueError(f"{seen[real]} and {flag} name the same file ({path}); give two")
        seen[real] = flag


def arrivals_line(schedule: Schedule, cap: int | None) -> str:
    """What the run offers: the schedule's rate (a Poisson or gamma rate replaces the trace's
    own times, so the Workload line's rate is not the one sent) and the concurrency cap."""
    kind = schedule.arrivals
    if kind in ("poisson", "gamma"):
        what = f"{kind} at {schedule.request_rate:g} req/s offered (replacing the trace's times)"
    elif kind == "burst":
        what = "all at once (burst)"
    else:
        what = "the workload's own arrival times"
    held = (
        f"; at most {cap} in flight: a send waits for a free place, so a server slower than "
        "the rate is offered less (the warning below says so)"
        if cap
        else ""
    )
    return f"Arrivals: {what}{held}"


def progress(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


def result_document(run: BenchRun, metrics: Any, workload: Any) -> dict[str, Any]:
    return {
        **metrics.to_dict(),
        "max_concurrency": max_concurrency_of(run),  # vLLM's result names
        "max_concurrent_requests": run.peak_concurrency(),
        "workload": workload.description,
        **run.to_dict(),
    }


async def _bench(args: argparse.Namespace, workload: Any) -> BenchRun:
    target = await target_from_args(args)
    if workload.prefix_block_tokens is not None:  # hash ids: equal ids, equal leading tokens
        target = dataclasses.replace(target, prefix_block_tokens=workload.prefix_block_tokens)
        print(
            f"prefix blocks: each hash id sent as the same {workload.prefix_block_tokens} "
            "one-token words; the rest of each prompt salted"
        )
    schedule = args.arrivals
    if args.max_concurrency:
        schedule = Schedule(
            schedule.arrivals,
            schedule.rate_scale,
            schedule.request_rate,
            schedule.burstiness,
            args.max_concurrency,
            args.seed or 0,  # --seed parses to None when not given (it is poisson's)
        )
    bounds = Bounds(args.max_requests, args.max_duration, args.warmup)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    try:  # Ctrl-C ends the run and keeps what it measured (not on Windows: no such handler)
        loop.add_signal_handler(signal.SIGINT, stop.set)
    except (NotImplementedError, RuntimeError):
        pass
    try:
        return await run_counted(
            target,
            workload.requests,
            schedule=schedule,
            bounds=bounds,
            progress=progress,
            stop=stop,
        )
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)


def run(args: argparse.Namespace) -> int:
    workload = workload_from_args(args)
    for line in workload_lines(workload):
        print(line)
    print(arrivals_line(args.arrivals, args.max_concurrency))
    result = asyncio.run(_bench(args, workload))
    if result.interrupted:
        print(
            f"interrupted: {len(result.completed)} request(s) completed are kept; the output is "
            "marked incomplete",
            file=sys.stderr,
        )
    metrics = result.metrics(slo=args.slo, percentiles=args.percentiles)
    text = bench_text(result, metrics)
    print(text)
    document = result_document(result, metrics, workload)
    if args.json:
        write_json_atomic(args.json, document)
        print(f"wrote {args.json}")
    if args.records:
        write_atomic(args.records, result.records_jsonl())
        print(f"wrote {args.records}")
    if args.save:
        provenance = {"device": "server", "threads": None}
        tables = [("bench " + str(args.url), text, document)]
        path = save_tables(
            args, provenance, tables, [], attachments={"requests.jsonl": result.records_jsonl()}
        )
        print(f"archived: {path}")
    if result.interrupted:
        return 130
    return 0 if result.completed else 1
