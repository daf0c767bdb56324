"""``prefill-bench calibrate-server``: the difference method against a running server — prompts
alone, traffic, a long prompt amid live streams — fitted to a cost model (refusing what the
noise cannot support, holding each prompt length out) with the request's overhead kept apart;
the JSON works wherever ``--cost`` does."""

from __future__ import annotations

import argparse
import asyncio
import sys

from pytest_prefill._io import write_json_atomic
from pytest_prefill.commands._args import add_output_arguments, positive_int, save_calibration
from pytest_prefill.commands._options import add_defaulted
from pytest_prefill.commands._serve_args import (
    add_server_arguments,
    max_prompt_type,
    target_from_args,
)
from pytest_prefill.serve.calibration.calibration import calibrate_server
from pytest_prefill.serve.calibration.experiments import warm_up
from pytest_prefill.serve.calibration.server_calibration import ServerCalibration, ServerSweep
from pytest_prefill.serve.calibration.server_model import (
    PROFILED_ENGINES,
    Scheduling,
    server_profile,
)
from pytest_prefill.serve.load.loadgen import Target
from pytest_prefill.sim import EngineProfile

HELP = "fit a cost model to a running server (black box, over HTTP)"


def add_sweep_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("calibration")
    group.add_argument(
        "--budget",
        type=positive_int,
        required=True,
        metavar="TOKENS",
        help="the server's tokens per iteration, decode rows included (vLLM "
        "--max-num-batched-tokens, transformers serve --cb-max-batch-tokens, llama.cpp -b)",
    )
    add_defaulted(
        group, "--repeats", positive_int, 3, "rounds of every experiment ({default})", "N"
    )
    prompt_help = "the longest prompt sent (default {default}; within the server's context)"
    add_defaulted(group, "--max-prompt", max_prompt_type, 2048, prompt_help, "TOKENS")
    group.add_argument(
        "--max-seqs",
        type=positive_int,
        default=None,
        metavar="N",
        help="the server's sequence cap (llama.cpp -np, vLLM --max-num-seqs; default its engine "
        "profile's): with --budget, the engine profile (--engine) the server is simulated with",
    )


def sweep_from_args(args: argparse.Namespace) -> ServerSweep:
    """The default sweep at ``--budget`` and ``--repeats``, cut to ``--max-prompt``, under the
    ``--max-seqs`` cap when given (else the cap the server's command states, if any)."""
    sweep = ServerSweep(args.budget, repeats=args.repeats).within(args.max_prompt)
    return sweep.capped(getattr(args, "max_seqs", None))


def check_profiled_engine(args: argparse.Namespace, required: bool = False) -> None:
    """A named engine without a profile is refused when the simulation needs one."""
    if required and args.engine is not None and args.engine not in PROFILED_ENGINES:
        raise ValueError(
            f"--engine {args.engine}: no engine profile to simulate it with; allowed: "
            f"{', '.join(PROFILED_ENGINES)}"
        )


def profile_from_args(args: argparse.Namespace, target: Target) -> EngineProfile | None:
    """The server's engine profile (``--engine``, else what the server showed) with its
    ``--budget`` and ``--max-seqs``; None for an engine without one."""
    engine = target.identity.engine
    if engine not in PROFILED_ENGINES:
        return None
    return server_profile(engine, args.budget, args.max_seqs)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_server_arguments(parser)
    add_sweep_arguments(parser)
    parser.add_argument(
        "--device-probe",
        metavar="PROBE.json",
        default=None,
        help="the server computes on this machine's CPU: record the CPU's measured peaks (a "
        "GEMM and a stream probe, one thread) in the calibration, so --gpu cpu --host-from can "
        "carry it to another model; read from PROBE.json when it exists, else probed now "
        "(seconds, before the sweep) and written there",
    )
    add_output_arguments(
        parser,
        json_help="write the calibration JSON",
        save_help="archive it as a run under --results",
    )


def progress(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


def probe_record(path: str | None) -> dict[str, object]:
    """``{"device_probe": …}`` for ``--device-probe PATH`` (read, else probed now and
    written), said on stderr; nothing without it."""
    if path is None:
        return {}
    from pytest_prefill.measure.device_probe import probe_at
    from pytest_prefill.plan.compute.transfer import PROBE_FIELD

    probe, now = probe_at(path)
    said = f"probed now, written to {path}" if now else f"read from {path}"
    progress(f"this CPU as a device: {probe.device.describe()} ({said})")
    return {PROBE_FIELD: probe.to_dict()}


async def _calibrate(args: argparse.Namespace) -> ServerCalibration:
    target = await target_from_args(args)
    sweep = sweep_from_args(args)
    extra = probe_record(getattr(args, "device_probe", None))
    await warm_up(target)
    profile = profile_from_args(args, target)
    if profile is not None:
        extra["engine_profile"] = Scheduling(profile).to_dict()
    return await calibrate_server(
        target, sweep, progress, command=" ".join(getattr(args, "argv", [])), **extra
    )


def run(args: argparse.Namespace) -> int:
    from pytest_prefill.report.server_calibration import server_calibration_report

    result = asyncio.run(_calibrate(args))
    print(server_calibration_report(result))
    if args.json:
        write_json_atomic(args.json, result.to_dict())
        print(f"\nwrote {args.json} (use it as --cost {args.json})")
    if args.save:
        origin = f"calibrated from {result.calibration.provenance['device_name']}"
        print(f"\narchived: {save_calibration(args, result.calibration, origin)}")
    return 0
