"""``--engine NAME`` and ``--prefix-caching on|off`` on every command that simulates: the
engine profile whose rules the simulator runs (DESIGN.md, "Engine semantics (v3)"), its prefix
cache overridden, checked when the command line is parsed."""

from __future__ import annotations

import argparse
import dataclasses

from pytest_prefill.plan.question import engine_for_workload
from pytest_prefill.plan.workloads import Workload
from pytest_prefill.sim import PROFILES, EngineProfile, simulated_engine


def add_engine_argument(
    parser: argparse.ArgumentParser, default: str, shown: str | None = None
) -> None:
    """``--engine NAME`` (one of the profiles), defaulting to ``default`` (``shown``: the
    default as the help says it, when it depends on other flags); :func:`check_engine` turns it
    into the profile."""
    parser.add_argument(
        "--engine",
        metavar="NAME",
        help=f"the engine profile the simulator schedules as: {', '.join(PROFILES)} (default "
        f"{shown or default}; 'lab' is the lab's loop, first token after a decode step)",
    )
    parser.add_argument(
        "--prefix-caching",
        choices=("on", "off"),
        help="override the profile's prefix cache: on (paged KV, blocks reused from a trace's "
        "hash_ids) or off (default: the profile's own)",
    )
    parser.set_defaults(engine_default=default)


def check_engine(args: argparse.Namespace, default: str | None = None) -> EngineProfile:
    """``args.engine`` as the profile the simulator runs, else ``default`` (else the
    command's own default, set by :func:`add_engine_argument`).

    Raises:
        ValueError: for an unknown profile (listing the allowed ones) or one whose knobs are
            not simulated yet.
    """
    name = args.engine if args.engine is not None else default or args.engine_default
    try:
        profile = simulated_engine(name)
    except ValueError as err:
        raise ValueError(f"--engine: {err}") from None
    caching = getattr(args, "prefix_caching", None)
    if caching is not None:
        try:
            profile = simulated_engine(with_prefix_caching(profile, caching == "on"))
        except ValueError as err:
            raise ValueError(f"--prefix-caching {caching}: {err}") from None
    return profile


def with_prefix_caching(
    profile: EngineProfile, on: bool, block_tokens: int | None = None
) -> EngineProfile:
    """``profile`` with its prefix cache on (and KV paged: the cache holds KV blocks; the
    prefix blocks ``block_tokens`` long when given) or off."""
    if not on:
        return dataclasses.replace(profile, prefix_caching=False)
    block = block_tokens or profile.prefix_block_tokens
    return dataclasses.replace(profile, kv="paged", prefix_caching=True, prefix_block_tokens=block)


def engine_for(profile: EngineProfile, workload: Workload) -> EngineProfile:
    """The checked ``profile`` with the prefix blocks of ``workload`` (Mooncake's 512 tokens)
    when its prefix cache is on (``--prefix-caching on`` or the profile's own)."""
    try:
        return engine_for_workload(profile, workload)
    except ValueError as err:
        raise ValueError(f"the prefix cache with {workload.name}: {err}") from None


def engine_note(args: argparse.Namespace) -> str:
    """What a header adds after the profile's line: that it is the command's default."""
    if args.engine is not None:  # typed, not the command's default
        return ""
    return f"(this command's default; --engine {', '.join(n for n in PROFILES)} to change it)"
