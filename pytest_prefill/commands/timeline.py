"""``prefill-bench timeline``: draw the lab scenario under shared, chunked and disaggregated
serving as an SVG timeline (and, with ``--text``, in the terminal)."""

from __future__ import annotations

import argparse
import math
import textwrap

from pytest_prefill._io import write_atomic
from pytest_prefill.commands._args import non_negative_float, positive_int
from pytest_prefill.commands._measure_args import (
    add_model_arguments,
    add_timing_arguments,
    measure_cost,
)
from pytest_prefill.costs import load_cost
from pytest_prefill.scheduler import PRESETS, CostModel, simulate
from pytest_prefill.timeline import focus_window, layout, render_svg, render_text
from pytest_prefill.workloads import lab_scenario

HELP = "draw the lab scenario's timeline under shared, chunked and disaggregated serving"


def window_type(text: str) -> tuple[float, float]:
    """``START:END`` in seconds, 0 <= START < END."""
    start, sep, end = text.partition(":")
    try:
        window = (float(start), float(end))
    except ValueError:
        window = (math.nan, math.nan)
    if not sep or not 0 <= window[0] < window[1] < math.inf:
        raise argparse.ArgumentTypeError(
            f"must be START:END in seconds with 0 <= START < END, got {text!r}"
        )
    return window


def positive_float(text: str) -> float:
    value = non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", metavar="FILE.svg", help="write the SVG timeline here")
    parser.add_argument(
        "--cost",
        default="lab-laptop",
        metavar="SPEC",
        help=f"cost model: a preset ({', '.join(PRESETS)}), a calibration/run JSON path, or "
        "'measure' (a fresh calibration of --model on --device) (default: lab-laptop)",
    )
    parser.add_argument(
        "--prompt-len",
        type=positive_int,
        default=2048,
        help="tokens of the arriving prompt (default 2048)",
    )
    parser.add_argument(
        "--chunk",
        type=positive_int,
        metavar="TOKENS",
        help="chunk size for the chunked policy (default: C*, rounded, >= 1)",
    )
    parser.add_argument(
        "--streams", type=positive_int, default=2, help="live streams already decoding (default 2)"
    )
    parser.add_argument(
        "--arrival",
        type=non_negative_float,
        default=0.1,
        help="when the prompt arrives, seconds (default 0.1)",
    )
    view = parser.add_mutually_exclusive_group()
    view.add_argument(
        "--window",
        type=window_type,
        metavar="START:END",
        help="seconds to show (default: the prompt's arrival to its first token "
        "under every policy, plus a margin)",
    )
    view.add_argument("--until", type=positive_float, metavar="SECONDS", help="show 0 to SECONDS")
    parser.add_argument(
        "--max-bars",
        type=positive_int,
        metavar="N",
        help="draw at most N bars per policy (the rest is noted as not shown)",
    )
    parser.add_argument("--text", action="store_true", help="also print the timeline as text")
    parser.add_argument(
        "--width",
        type=positive_int,
        default=100,
        help="characters per line of --text (default 100)",
    )
    add_model_arguments(parser)  # used by --cost measure
    add_timing_arguments(parser)


def default_chunk(cost: CostModel, prompt_len: int) -> int:
    """C* rounded, at least 1 and at most the prompt (the whole prompt when C* is infinite)."""
    star = cost.chunk_star()
    return (
        max(1, min(prompt_len, round(star)))
        if math.isfinite(star)
        else (prompt_len if star > 0 else 1)
    )


def run(args: argparse.Namespace) -> int:
    if not args.out and not args.text:
        raise ValueError("give --out FILE.svg, --text, or both")
    cost, origin = measure_cost(args) if args.cost == "measure" else load_cost(args.cost)
    load = lab_scenario(streams=args.streams, prompt_len=args.prompt_len, arrival=args.arrival)
    chunk = args.chunk or default_chunk(cost, args.prompt_len)
    traces = [
        simulate("shared", load, cost),
        simulate("chunked", load, cost, chunk=chunk),
        simulate("disaggregated", load, cost),
    ]
    window = args.window or ((0.0, args.until) if args.until else focus_window(traces, "long"))
    star = cost.chunk_star()
    how = (
        "given"
        if args.chunk
        else f"C* = {star:,.0f}, rounded" + (", capped at the prompt" if star > chunk + 1 else "")
        if star >= 1
        else f"C* = {star:,.0f}: the pass overhead eats the decode step, so no chunk rides free"
    )
    title = (
        f"{args.streams} live stream{'s' * (args.streams != 1)} decoding; a "
        f'{args.prompt_len:,}-token prompt ("long") arrives at {args.arrival * 1e3:,.0f} ms. '
        f"Chunk {chunk:,} ({how}). Simulated from a cost model, not measured.\n"
        f"Cost model: {origin}"
    )
    # render both before writing or printing anything, so bad input leaves no half output
    text = args.text and render_text(
        traces, width=args.width, window=window, max_bars=args.max_bars
    )
    svg = args.out and render_svg(traces, window=window, max_bars=args.max_bars, title=title)
    if args.out:
        write_atomic(args.out, svg)
    if args.text:
        for line in title.split("\n"):
            print(textwrap.fill(line, args.width))
        print()
        print(text)
    if args.out:
        panels = layout(traces, window, args.max_bars).panels
        left_out = any(p.notes for p in panels)
        print(
            f"wrote {args.out}: shared, chunked (chunk {chunk:,}), disaggregated; "
            f"{window[0] * 1e3:,.0f}–{window[1] * 1e3:,.0f} ms shown"
            + ("" if left_out else ", nothing left out")
        )
        for panel in panels:
            for note in panel.notes:
                print(f"  {panel.title}: {note}")
    return 0
