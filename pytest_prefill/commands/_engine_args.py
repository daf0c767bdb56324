"""``--engine NAME`` on every command that simulates: the engine profile whose rules the
simulator runs (DESIGN.md, "Engine semantics (v3)"), checked when the command line is parsed."""

from __future__ import annotations

import argparse

from pytest_prefill.sim import PROFILES, EngineProfile, simulated_engine


def add_engine_argument(parser: argparse.ArgumentParser, default: str) -> None:
    """``--engine NAME`` (one of the profiles), defaulting to ``default``; :func:`check_engine`
    turns it into ``args.profile``."""
    parser.add_argument(
        "--engine",
        metavar="NAME",
        help=f"the engine profile the simulator schedules as: {', '.join(PROFILES)} (default "
        f"{default}; 'lab' is the lab's loop, first token after a decode step)",
    )
    parser.set_defaults(engine_default=default)


def check_engine(args: argparse.Namespace) -> EngineProfile:
    """``args.engine`` as the profile the simulator runs (set as ``args.profile``);
    ``args.engine_given`` says whether it was typed or is the command's default.

    Raises:
        ValueError: for an unknown profile (listing the allowed ones) or one whose knobs are
            not simulated yet.
    """
    args.engine_given = args.engine is not None
    name = args.engine if args.engine is not None else args.engine_default
    try:
        args.profile = simulated_engine(name)
    except ValueError as err:
        raise ValueError(f"--engine: {err}") from None
    return args.profile


def engine_note(args: argparse.Namespace) -> str:
    """What a header adds after the profile's line: that it is the command's default."""
    if args.engine_given:
        return ""
    return f"(this command's default; --engine {', '.join(n for n in PROFILES)} to change it)"
