"""``prefill-bench compare A B``: two machines' (or two runs') calibrations side by side;
``--fail-above PCT`` makes it a CI gate."""

from __future__ import annotations

import argparse
import sys

from pytest_prefill.commands._args import add_archive_arguments, machine_of, non_negative_float
from pytest_prefill.report.comparison import compare, comparison_report, gate_lines, load_side

HELP = "compare two calibrations (run ids, run files, calibration files or machine keys)"
FORMS = (
    "a run id as `prefill-bench runs` lists it (0001: a run of --machine; KEY/0001), a run "
    "file, a calibration file, or a machine key (its latest calibrated run under --results)"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", metavar="A", help=FORMS)
    parser.add_argument("b", metavar="B", help="the other side, in the same forms")
    add_archive_arguments(parser)
    parser.add_argument(
        "--fail-above",
        type=non_negative_float,
        default=None,
        metavar="PCT",
        help="exit 1 when a measured constant differs beyond both runs' spreads and by more "
        "than PCT percent (like pytest-benchmark's --benchmark-compare-fail=median:PCT%%)",
    )


def run(args: argparse.Namespace) -> int:
    def warn(message: str) -> None:
        print(f"prefill-bench compare: {message}", file=sys.stderr)

    machine = None
    if any(ref.isdigit() for ref in (args.a, args.b)):
        machine = machine_of(args)  # a bare run number is a run of this machine (or --machine)
    a = load_side(args.a, args.results, "A", warn=warn, machine=machine)
    b = load_side(args.b, args.results, "B", warn=warn, machine=machine)
    print(comparison_report(a, b), end="")
    if args.fail_above is None:
        return 0
    passed, lines = gate_lines(compare(a, b), args.fail_above)
    print()
    print("\n".join(lines))
    return 0 if passed else 1
