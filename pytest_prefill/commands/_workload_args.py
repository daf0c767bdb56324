"""``--workload`` and its flags, shared by ``simulate`` and ``capacity``, resolved by the one
rule (:func:`pytest_prefill.plan.workloads.resolve_workload`)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable

from pytest_prefill._io import ascii_float
from pytest_prefill.commands._args import (
    MAX_CHUNKED_ITERATIONS,
    MAX_PROMPT_LEN,
    MAX_SECONDS,
    bounded_int,
    non_negative_int,
)
from pytest_prefill.plan.workloads import (
    NAMED_WORKLOADS,
    POISSON_DEFAULTS,
    POISSON_OUTPUT_LEN,
    POISSON_PROMPT_LEN,
    Workload,
    resolve_workload,
)

QWEN3_CONTEXT = 40_960  # max_position_embeddings of Qwen3-0.6B, the model the presets describe
# The command line's bounds on a workload (the library takes any): a simulation's memory grows
# with its requests (10^6 of them: about a gigabyte), and beyond MAX_SECONDS of arrivals float
# seconds no longer resolve a microsecond, so latencies (token time minus arrival) go wrong.
MAX_REQUESTS = 1_000_000
MAX_RATE = 1e6  # requests/s, and the largest --rate-scale
MIN_RATE_SCALE = 1e-6


def positive_float(text: str) -> float:
    try:
        value = ascii_float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def bounded_float(low: float, high: float, unit: str) -> Callable[[str], float]:
    """An argparse type for a number in [``low``, ``high``]."""

    def parse(text: str) -> float:
        value = positive_float(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(
                f"must be from {low:g} to {high:g}{unit} (the command line's bound), got {text!r}"
            )
        return value

    return parse


def window_type(text: str) -> tuple[float, float | None]:
    """``START:END`` seconds (``START:`` runs to the end of the trace)."""
    start, sep, end = text.partition(":")
    try:
        low = ascii_float(start) if start else 0.0
        high = ascii_float(end) if end else None
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
        f'"output_length": n}}), plain or .gz (default: {default})',
    )
    group.add_argument(
        "--request-rate",
        type=bounded_float(1 / MAX_SECONDS, MAX_RATE, " requests/s"),
        metavar="REQ/S",
        help="poisson: its rate (default 1); a trace: arrivals rescaled to this mean rate",
    )
    group.add_argument(
        "--num-prompts",
        type=bounded_int(MAX_REQUESTS, "requests"),
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
        type=bounded_float(MIN_RATE_SCALE, MAX_RATE, ""),
        metavar="X",
        help="multiply the arrival rate by X (not with --request-rate)",
    )
    group.add_argument(
        "--seed", type=non_negative_int, help="poisson's seed (default 0; poisson only)"
    )
    add_random_length_arguments(group)
    group.add_argument(
        "--max-model-len",
        type=bounded_int(MAX_PROMPT_LEN, "tokens"),
        metavar="TOKENS",
        help="cap longer prompts at this many tokens (default: --model's context where the "
        "command takes --model, else 40960, Qwen3-0.6B's; the answer says how many it capped)",
    )


def add_random_length_arguments(group: argparse._ArgumentGroup) -> None:
    """vLLM's random dataset lengths, for ``poisson``: ``--random-input-len
    --random-output-len --random-range-ratio``."""
    group.add_argument(
        "--random-input-len",
        type=bounded_int(MAX_PROMPT_LEN, "tokens"),
        metavar="N",
        help=f"poisson: prompts of N tokens (default {POISSON_PROMPT_LEN}; vLLM's random dataset)",
    )
    group.add_argument(
        "--random-output-len",
        type=bounded_int(MAX_PROMPT_LEN, "tokens"),
        metavar="N",
        help=f"poisson: outputs of N tokens (default {POISSON_OUTPUT_LEN})",
    )
    group.add_argument(
        "--random-range-ratio",
        type=ratio_type,
        metavar="R",
        help="poisson: draw each length uniformly from [N*(1-R), N*(1+R)], R in [0, 1) "
        "(default 0: every length N), as vLLM's",
    )


def ratio_type(text: str) -> float:
    """A range ratio: a number in [0, 1)."""
    try:
        value = ascii_float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1), got {text!r}")
    return value


RANDOM_FLAGS = ("random_input_len", "random_output_len", "random_range_ratio")


def random_lengths(args: argparse.Namespace) -> tuple[int, int, float] | None:
    """The poisson lengths the --random-* flags give (None: none was given)."""
    if all(getattr(args, name, None) is None for name in RANDOM_FLAGS):
        return None
    return (
        args.random_input_len or POISSON_PROMPT_LEN,
        args.random_output_len or POISSON_OUTPUT_LEN,
        args.random_range_ratio or 0.0,
    )


def check_workload_args(
    args: argparse.Namespace, chunks: Iterable[int] = (), max_model_len: int | None = None
) -> None:
    """What the command line can refuse before reading or generating anything (ValueError naming
    the flag): a flag this workload does not take, and for ``poisson`` a span over
    :data:`MAX_SECONDS` or ``chunks`` that would split its prompts, capped at ``max_model_len``
    (a command with ``--model`` passes its own), into more than
    :data:`MAX_CHUNKED_ITERATIONS` iterations in one run. Without it an unset
    ``--max-model-len`` becomes Qwen3-0.6B's context."""
    if max_model_len is None and args.max_model_len is None:
        args.max_model_len = QWEN3_CONTEXT  # the parse step's default, where --model is not
    if args.seed is not None and args.workload != "poisson":
        raise ValueError(f"--seed is poisson's seed; workload {args.workload!r} takes none")
    given = [name for name in RANDOM_FLAGS if getattr(args, name, None) is not None]
    if given and args.workload != "poisson":
        flag = "--" + given[0].replace("_", "-")
        raise ValueError(f"{flag} shapes poisson's prompts; workload {args.workload!r} has its own")
    if args.workload != "poisson":
        return
    count = args.num_prompts or POISSON_DEFAULTS["num_prompts"]
    rate = args.request_rate or POISSON_DEFAULTS["request_rate"]
    if count / rate > MAX_SECONDS:
        raise ValueError(
            f"--num-prompts {count:,} at {rate:g} req/s spans about {count / rate:,.0f} s; the "
            f"command line simulates at most {MAX_SECONDS:,.0f} s of arrivals (raise "
            "--request-rate or lower --num-prompts)"
        )
    inputs, _, ratio = random_lengths(args) or (POISSON_PROMPT_LEN, 0, 0.0)
    prompt = min(int(inputs * (1 + ratio)), max_model_len or args.max_model_len)
    check_chunked_run([prompt] * int(count), chunks)


def check_chunked_run(prompt_lens: Iterable[int], chunks: Iterable[int]) -> None:
    """ValueError naming the chunk when one run of these prompts at that chunk would take more
    than :data:`MAX_CHUNKED_ITERATIONS` chunked iterations (the bound is per run: a thousand
    1,024-token prompts at chunk 1 are a million iterations)."""
    lens = list(prompt_lens)
    for chunk in chunks:
        iterations = sum(-(-n // chunk) for n in lens)
        if iterations > MAX_CHUNKED_ITERATIONS:
            raise ValueError(
                f"chunk {chunk:,} would split the workload's {len(lens):,} prompts into "
                f"{iterations:,} iterations; the command line simulates at most "
                f"{MAX_CHUNKED_ITERATIONS:,} a run (give a larger chunk or fewer prompts)"
            )


def workload_from_args(args: argparse.Namespace, max_model_len: int | None = None) -> Workload:
    """The workload the flags name, its prompts capped at ``max_model_len`` (default
    ``--max-model-len``) (ValueError naming the flag's argument otherwise, or when its arrivals
    span more than :data:`MAX_SECONDS`)."""
    workload = resolve_workload(
        args.workload,
        request_rate=args.request_rate,
        num_prompts=args.num_prompts,
        window=args.window,
        rate_scale=args.rate_scale,
        seed=args.seed or 0,
        max_model_len=max_model_len or args.max_model_len,
        lengths=random_lengths(args),
    )
    last = max(r.arrival for r in workload.requests)
    if last > MAX_SECONDS:
        raise ValueError(
            f"workload {args.workload!r}: its arrivals span {last:,.0f} s; the command line "
            f"simulates at most {MAX_SECONDS:,.0f} s (beyond, float seconds cannot resolve a "
            "millisecond of latency): use --window, or a larger --rate-scale or --request-rate"
        )
    return workload


def capped_line(workload: Workload, origin: str | None = None) -> str | None:
    """The line that says how many prompts were cut to the model's context and, when given,
    where that length came from (None: none was cut)."""
    if not workload.capped:
        return None
    share = workload.capped / len(workload.requests)
    return (
        f"  {workload.capped:,} prompt(s) longer than {workload.max_model_len:,} tokens "
        f"({share:.1%} of them; --max-model-len{f': {origin}' if origin else ''}) were capped at it"
    )


def workload_lines(workload: Workload) -> list[str]:
    """What to print about a workload: what it is, prompts capped, the data's attribution."""
    lines = [f"Workload: {workload.description}"]
    capped = capped_line(workload)
    if capped:
        lines.append(capped)
    lines += workload.notes
    if workload.attribution:
        lines.append(f"  data: {workload.attribution}")
    return lines
