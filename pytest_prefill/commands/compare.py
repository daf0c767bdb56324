"""``prefill-bench compare A B``: two machines' (or two runs') calibrations side by side."""

from __future__ import annotations

import argparse
import sys

from pytest_prefill.comparison import comparison_report, load_side

HELP = "compare two calibrations (run files, calibration files, or machine keys) side by side"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "a",
        metavar="A",
        help="a run file, a calibration file, or a machine "
        "key (its latest calibrated run under --results)",
    )
    parser.add_argument("b", metavar="B", help="the other side, in the same forms")
    parser.add_argument(
        "--results",
        default="results",
        metavar="DIR",
        help="the results archive that machine keys refer to (default results/)",
    )


def run(args: argparse.Namespace) -> int:
    def warn(message: str) -> None:
        print(f"prefill-bench compare: {message}", file=sys.stderr)

    a = load_side(args.a, args.results, "A", warn=warn)
    b = load_side(args.b, args.results, "B", warn=warn)
    print(comparison_report(a, b), end="")
    return 0
