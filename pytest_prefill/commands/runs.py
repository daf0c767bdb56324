"""``prefill-bench runs [MACHINE]``: the archived runs, with the ids ``compare`` takes."""

from __future__ import annotations

import argparse
import sys

from pytest_prefill.archive.runs import RunFile, machine_dir, machines, runs
from pytest_prefill.commands._args import DEFAULT_RESULTS, machine_key_type, results_type
from pytest_prefill.report.runs import runs_table, summarize_run

HELP = "list the archived runs (of one machine, or of every machine) with their ids"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "machine",
        metavar="MACHINE",
        nargs="?",
        type=machine_key_type,
        help="a machine key (default: every machine under --results)",
    )
    parser.add_argument(
        "--results",
        type=results_type,
        default=DEFAULT_RESULTS,
        metavar="DIR",
        help=f"the results archive (default {DEFAULT_RESULTS}/)",
    )


def duplicate_numbers(found: list[RunFile]) -> dict[int, list[str]]:
    """Run numbers that more than one file carries (two archives merged), with the files."""
    by_number: dict[int, list[str]] = {}
    for r in found:
        by_number.setdefault(r.number, []).append(r.path.name)
    return {n: names for n, names in by_number.items() if len(names) > 1}


def run(args: argparse.Namespace) -> int:
    def warn(message: str) -> None:
        print(f"prefill-bench runs: {message}", file=sys.stderr)

    keys = [args.machine] if args.machine else machines(args.results)
    if not keys:
        raise ValueError(
            f"no machines archived under {args.results}: a run is archived by "
            "`prefill-bench calibrate --save`, `fidelity --save`, `bench --save`, or a pytest "
            "session with --prefill-save"
        )
    for n, key in enumerate(keys):
        found = runs(args.results, key, warn=warn)
        if args.machine and not found:
            known = ", ".join(machines(args.results)) or "none"
            raise ValueError(
                f"no runs archived for machine {key!r} under {machine_dir(args.results, key)} "
                f"(machines there: {known})"
            )
        if n:
            print()
        print(f"{key}: {len(found)} run(s) in {machine_dir(args.results, key)}")
        label = None if args.machine else key
        if found:
            print(runs_table([summarize_run(r, label) for r in found]))
        for number, paths in duplicate_numbers(found).items():
            warn(
                f"run {number:04d} of {key} is listed {len(paths)} times ({', '.join(paths)}): "
                "compare needs the file name for it"
            )
    if not args.machine:
        print("\ncompare takes these ids: prefill-bench compare KEY/0001 KEY/0002")
    else:
        print(
            f"\ncompare takes these ids: prefill-bench compare --machine {args.machine} 0001 0002"
        )
    return 0
