"""``--workload`` and its flags, shared by ``simulate`` and ``capacity``, resolved by the one
rule (:func:`pytest_prefill.plan.workloads.resolve_workload`)."""

from __future__ import annotations

import argparse
import math

from pytest_prefill.commands._args import non_negative_int, positive_int
from pytest_prefill.plan.workloads import NAMED_WORKLOADS, Workload, resolve_workload

QWEN3_CONTEXT = 40_960  # max_position_embeddings of Qwen3-0.6B, the model the presets describe


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def window_type(text: str) -> tuple[float, float | None]:
    """``START:END`` seconds (``START:`` runs to the end of the trace)."""
    start, sep, end = text.partition(":")
    try:
        low = float(start) if start.strip() else 0.0
        high = float(end) if end.strip() else None
    except ValueError:
        low, high = math.nan, None
    if not sep or not (math.isfinite(low) and low >= 0) or (high is not None and not high > low):
        raise argparse.ArgumentTypeError(
            f"must be START:END seconds with 0 <= START < END (END may be empty), got {text!r}"
        )
    return low, high


def add_workload_arguments(parser: argparse.ArgumentParser, default: str) -> None:
    """``--workload`` with ``--request-rate --num-prompts --window --rate-scale --seed
    --max-model-len``."""
    group = parser.add_argument_group("workload")
    group.add_argument(
        "--workload",
        default=default,
        metavar="NAME|PATH",
        help=f"{'|'.join(NAMED_WORKLOADS)}, a .csv (Azure columns TIMESTAMP,ContextTokens,"
        'GeneratedTokens) or a .jsonl (a line: {"timestamp": ms, "input_length": n, '
        f'"output_length": n}}) (default: {default})',
    )
    group.add_argument(
        "--request-rate",
        type=positive_float,
        metavar="REQ/S",
        help="poisson: its rate (default 1); a trace: arrivals rescaled to this mean rate",
    )
    group.add_argument(
        "--num-prompts",
        type=positive_int,
        metavar="N",
        help="poisson: how many requests (default 1000); a trace: its first N after --window",
    )
    group.add_argument(
        "--window",
        type=window_type,
        metavar="START:END",
        help="seconds of the trace to keep, from its first arrival (e.g. 0:600)",
    )
    group.add_argument(
        "--rate-scale",
        type=positive_float,
        metavar="X",
        help="multiply the arrival rate by X (not with --request-rate)",
    )
    group.add_argument("--seed", type=non_negative_int, default=0, help="poisson's seed")
    group.add_argument(
        "--max-model-len",
        type=positive_int,
        default=QWEN3_CONTEXT,
        metavar="TOKENS",
        help="cap longer prompts at this many tokens (default 40960, Qwen3-0.6B's context)",
    )


def workload_from_args(args: argparse.Namespace) -> Workload:
    """The workload the flags name (ValueError naming the flag's argument otherwise)."""
    return resolve_workload(
        args.workload,
        request_rate=args.request_rate,
        num_prompts=args.num_prompts,
        window=args.window,
        rate_scale=args.rate_scale,
        seed=args.seed,
        max_model_len=args.max_model_len,
    )


def capped_line(workload: Workload) -> str | None:
    """The line that says how many prompts were cut to the model's context (None: none)."""
    if not workload.capped:
        return None
    return (
        f"  {workload.capped:,} prompt(s) longer than {workload.max_model_len:,} tokens "
        "(--max-model-len) were capped at it"
    )


def workload_lines(workload: Workload) -> list[str]:
    """What to print about a workload: what it is, prompts capped, the data's attribution."""
    lines = [f"Workload: {workload.description}"]
    capped = capped_line(workload)
    if capped:
        lines.append(capped)
    if workload.attribution:
        lines.append(f"  data: {workload.attribution}")
    return lines
