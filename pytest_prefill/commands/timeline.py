"""``prefill-bench timeline``: draw the lab scenario under shared, chunked and disaggregated
serving as an SVG timeline, or export it as a Chrome trace-event JSON for Perfetto (and, with
``--text``, show it in the terminal)."""

from __future__ import annotations

import argparse
import json
import textwrap
from typing import Any

from pytest_prefill._io import ascii_float, write_atomic
from pytest_prefill.commands._args import (
    MAX_TIMELINE_ITERATIONS,
    bounded_int,
    check_chunked_iterations,
    lab_scenario_given,
    lab_scenario_of,
    non_negative_float,
    output_path,
    positive_int,
)
from pytest_prefill.commands._deploy_args import Deploying, check_deploy_args
from pytest_prefill.commands._engine_args import check_engine
from pytest_prefill.commands._measure_args import add_lab_simulation_arguments
from pytest_prefill.commands._options import add_defaulted
from pytest_prefill.commands._planning_cost import add_planning_arguments, instance_spec
from pytest_prefill.plan.advice import choose_chunk
from pytest_prefill.plan.engine_commands import refusal
from pytest_prefill.plan.sweep import LabTimeline, lab_timeline
from pytest_prefill.report.png import need_matplotlib, svg_to_png
from pytest_prefill.report.timeline import (
    MIN_WINDOW,
    check_window,
    focus_window,
    layout,
    render_text,
)
from pytest_prefill.report.timeline_svg import render_svg
from pytest_prefill.report.trace_events import MAX_TRACE_ITEMS, chrome_trace, trace_items
from pytest_prefill.sim import CostModel, EngineProfile

HELP = "draw the lab scenario's timeline under shared, chunked and disaggregated serving"


def window_type(text: str) -> tuple[float, float]:
    """``START:END`` in seconds, 0 <= START < END, at least a nanosecond apart."""
    start, sep, end = text.partition(":")
    try:
        return check_window((ascii_float(start), ascii_float(end)) if sep else ())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be START:END in seconds with 0 <= START < END, finite and at least "
            f"{MIN_WINDOW:g} s apart, got {text!r}"
        ) from None


OUT_SUFFIXES = (".svg", ".png", ".json")
# Bars an SVG or the text draws per policy: a million-chunk prompt would otherwise be a 167 MB
# SVG. The default shows any lab scenario's window whole; what is left out is noted.
DEFAULT_MAX_BARS = 2_000
MAX_BARS = 100_000


def out_type(text: str) -> str:
    """A path ending in .svg (the drawing), .png (the same drawing as pixels: needs the plot
    extra) or .json (Chrome trace events), where a file can be written."""
    if not text.lower().endswith(OUT_SUFFIXES):
        raise argparse.ArgumentTypeError(
            f"must end in .svg (an SVG drawing), .png (the drawing as an image) or .json "
            f"(Chrome trace events for Perfetto), got {text!r}"
        )
    if text.lower().endswith(".png"):
        try:
            need_matplotlib()
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return output_path(text)


def until_type(text: str) -> float:
    """SECONDS > 0: the window 0 to SECONDS."""
    value = non_negative_float(text)
    if value < MIN_WINDOW:
        raise argparse.ArgumentTypeError(f"must be a number >= {MIN_WINDOW:g}, got {text!r}")
    return value


def width_type(text: str) -> int:
    value = bounded_int(10_000, "characters")(text)
    if value < 40:
        raise argparse.ArgumentTypeError(f"must be at least 40 characters, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out",
        type=out_type,
        metavar="FILE.svg|FILE.png|FILE.json",
        help="write the timeline here: .svg draws it; .png draws it as an image (needs "
        'matplotlib: pip install ".[plot]"); .json writes the same trace as Chrome '
        "trace events (open it in https://ui.perfetto.dev to zoom); any other extension is "
        "an error",
    )
    add_lab_simulation_arguments(parser)
    parser.add_argument(
        "--chunk",
        type=positive_int,
        metavar="TOKENS",
        help="chunk size for the chunked policy (default: C* rounded, within the prompt; 16 "
        "when C* < 1 or the per-token cost was refused)",
    )
    view = parser.add_mutually_exclusive_group()
    view.add_argument(
        "--window",
        type=window_type,
        metavar="START:END",
        help="seconds to show (default: the prompt's arrival to its first token "
        "under every policy, plus a margin)",
    )
    view.add_argument("--until", type=until_type, metavar="SECONDS", help="show 0 to SECONDS")
    parser.add_argument(
        "--max-bars",
        type=bounded_int(MAX_BARS, "bars"),
        default=DEFAULT_MAX_BARS,
        metavar="N",
        help=f"draw at most N bars per policy, the earliest (the rest is noted as not shown; "
        f"default {DEFAULT_MAX_BARS:,}, at most {MAX_BARS:,})",
    )
    parser.add_argument("--text", action="store_true", help="also print the timeline as text")
    width_help = "characters per line of --text (default {default}; 40 to 10,000)"
    add_defaulted(parser, "--width", width_type, 100, width_help)
    add_planning_arguments(parser)


def default_chunk(cost: CostModel, prompt_len: int) -> int:
    """The chunk drawn when ``--chunk`` is not given: the one rule,
    :func:`pytest_prefill.plan.advice.choose_chunk`."""
    return choose_chunk(cost, prompt_len).chunk


def check(args: argparse.Namespace) -> Deploying:
    """Before any work: the engine profile, an output asked for, and sizes the flags alone
    decide (the chunked iterations; a Chrome trace's token instants, one per output token under
    each policy); the deployment the flags name."""
    profile = check_engine(args)
    _check_drawable(profile)
    lab_scenario_given(args)
    if not args.out and not args.text:
        raise ValueError("give --out FILE.svg (or FILE.json), --text, or both")
    check_chunked_iterations(
        args.prompt_len, [args.chunk] if args.chunk else [], MAX_TIMELINE_ITERATIONS
    )
    if _as_json(args):
        load = lab_scenario_of(args).requests()
        _check_trace_items(3 * sum(1 + r.output_len for r in load), args.out)
    return check_deploy_args(args, profile)


def _check_drawable(profile: EngineProfile, cost: CostModel | None = None) -> None:
    """The three policies the timeline draws, each one the simulator runs under ``profile`` on
    ``cost`` (before it is known: on a preset with unbounded KV)."""
    for policy in ("shared", "chunked", "disaggregated"):
        reason = refusal(policy, profile, cost, chunk=1)
        if reason is not None:
            raise ValueError(f"the timeline draws {policy} under {profile.name}: {reason}")


def _check_long_enough(cost: CostModel, prompt_len: int) -> None:
    """The long prompt's prefill on ``cost`` lasts long enough to draw (the default window runs
    from its arrival to its first token): one line naming the cost's fields otherwise, not the
    window."""
    seconds = cost.prefill_pass(prompt_len)
    if not seconds >= MIN_WINDOW:
        raise ValueError(
            f"the cost's prefill of the {prompt_len:,}-token prompt lasts {seconds:.3g} s "
            f"(prefill_pass_overhead {cost.prefill_pass_overhead:.3g} s, prefill_per_token "
            f"{cost.prefill_per_token:.3g} s): under {MIN_WINDOW:g} s, too short to draw; "
            "give the cost in seconds"
        )


def _document(args: argparse.Namespace, traces: Any, window: Any, title: str) -> str | bytes:
    """What --out holds: Chrome trace events (.json), the drawing (.svg) or its pixels (.png)."""
    if _as_json(args):
        _check_trace_items(trace_items(traces), args.out)
        return json.dumps(chrome_trace(traces, title), allow_nan=False) + "\n"
    drawing = render_svg(traces, window=window, max_bars=args.max_bars, title=title)
    return svg_to_png(drawing) if args.out.lower().endswith(".png") else drawing


def _as_json(args: argparse.Namespace) -> bool:
    return bool(args.out) and args.out.lower().endswith(".json")


def _check_trace_items(items: int, out: str) -> None:
    if items > MAX_TRACE_ITEMS:
        raise ValueError(
            f"--out {out}: the Chrome trace would hold {items:,} events, token instants and "
            f"listed request ids; it holds at most {MAX_TRACE_ITEMS:,} (fewer --streams, a "
            "larger --chunk, or an .svg, which draws the window)"
        )


def _simulated(args: argparse.Namespace, deploying: Deploying) -> LabTimeline:
    """The lab scenario under the three designs, as the flags ask, on ``deploying``."""
    scenario = lab_scenario_of(args)
    deploying, spec = instance_spec(args, deploying, scenario.requests)
    assert spec.cost is not None
    _check_drawable(deploying.profile, spec.cost)
    _check_long_enough(spec.cost, args.prompt_len)
    check_chunked_iterations(
        args.prompt_len,
        [args.chunk or default_chunk(spec.cost, args.prompt_len)],
        MAX_TIMELINE_ITERATIONS,
    )
    return lab_timeline(
        spec.cost,
        spec.source,
        scenario=scenario,
        chunk=args.chunk,
        refused=spec.refused,
        engine=deploying.profile,
    )


def run(args: argparse.Namespace, deploying: Deploying | None = None) -> int:
    if deploying is None:  # called without the command line's check
        deploying = check(args)
    drawn = _simulated(args, deploying)
    traces, chunk, title = list(drawn.traces), drawn.chunk, drawn.title
    window = args.window or ((0.0, args.until) if args.until else focus_window(traces, "long"))
    # render everything before writing or printing anything, so bad input leaves no half output
    text = args.text and render_text(
        traces, width=args.width, window=window, max_bars=args.max_bars
    )
    as_json = _as_json(args)
    if args.out:
        write_atomic(args.out, _document(args, traces, window, title))
    if args.text:
        for line in title.split("\n"):
            print(textwrap.fill(line, args.width))
        print()
        print(text)
    if as_json:
        print(
            f"wrote {args.out}: shared, chunked (chunk {chunk:,}), disaggregated as Chrome "
            "trace events, the whole run (open it in https://ui.perfetto.dev)"
        )
    elif args.out:
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
