"""``prefill-bench``: the command line. Thin glue: each subcommand lives in a module of
``pytest_prefill/commands/`` named for its feature (``COMMANDS`` maps the name typed to the
module) with ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``, and optionally
``check(args)``: what can be refused from the command line alone, called right after parsing,
before any work (a ``ValueError`` there is a usage error); what it returns, when not None (what
it derived from the flags), ``run`` takes as its second argument: no state rides on ``args``.
None of them may import torch or numpy at import time."""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from pytest_prefill import __version__
from pytest_prefill.commands._outputs import FORCE_HELP, check_outputs, has_outputs
from pytest_prefill.plan.executors import ExecutorLost
from pytest_prefill.serve.client.wire import ServerError
from pytest_prefill.serve.launch.process import stop_all

# name -> module; the order is the order of ``prefill-bench --help``.
COMMANDS = {
    "simulate": "pytest_prefill.commands.simulate",
    "capacity": "pytest_prefill.commands.capacity",
    "calibrate": "pytest_prefill.commands.calibrate",
    "demo": "pytest_prefill.commands.falsifier",
    "timeline": "pytest_prefill.commands.timeline",
    "compare": "pytest_prefill.commands.compare",
    "runs": "pytest_prefill.commands.runs",
    "fidelity": "pytest_prefill.commands.fidelity",
    "bench": "pytest_prefill.commands.bench",
    "calibrate-server": "pytest_prefill.commands.server_calibration",
    "fidelity-server": "pytest_prefill.commands.server_fidelity",
    "verify": "pytest_prefill.commands.verify",
    "make-model": "pytest_prefill.commands.make_model",
}


class Parser(argparse.ArgumentParser):
    """argparse with a short usage error: the one line that says what is wrong and where the
    usage is (a subcommand's usage block runs to 14 lines and buries the error)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (usage: {self.prog} --help)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand's parser; with ``command`` (a name in ``COMMANDS``), that one's only:
    the other modules are not imported (a command starts a fifth of a second sooner)."""
    parser = Parser(
        prog="prefill-bench",
        description="Measure prefill/decode interference and compare serving policies.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module_name in COMMANDS.items():
        if command is not None and name != command:
            continue
        module = importlib.import_module(module_name)
        sub_parser = sub.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(sub_parser)
        if has_outputs(name):
            sub_parser.add_argument("--force", action="store_true", help=FORCE_HELP)
        sub_parser.set_defaults(_run=module.run, _check=getattr(module, "check", None))
    return parser


def _unrecognized(parser: argparse.ArgumentParser, command: str, unknown: list[str]) -> NoReturn:
    """The usage error for flags ``command`` does not take, from that command's parser (its
    usage, not the top level's), with the nearest flag it does take."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command_parser: argparse.ArgumentParser = sub.choices[command]
    flags = [f for a in command_parser._actions for f in a.option_strings if f.startswith("--")]
    message = f"unrecognized arguments: {' '.join(unknown)}"
    for token in unknown:
        near = difflib.get_close_matches(token.split("=", 1)[0], flags, n=1, cutoff=0.6)
        if token.startswith("-") and near:
            message += f" (did you mean {near[0]}?)"
            break
    command_parser.error(message)


INTERRUPTED = 130  # a shell's status for a command ended by SIGINT


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        _unrecognized(parser, args.command, unknown)
    args.argv = argv  # the command line, for what a run archives (calibrate --save)
    try:
        check_outputs(args)
        checked = args._check(args) if args._check is not None else None
    except ValueError as err:
        parser.exit(2, f"prefill-bench {args.command}: error: {err}\n")
    try:
        return int((args._run(args) if checked is None else args._run(args, checked)) or 0)
    except BrokenPipeError:  # e.g. `prefill-bench simulate | head`: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("interrupted; nothing half-written was left on disk", file=sys.stderr)
        return INTERRUPTED
    except ValueError as err:
        parser.exit(2, f"prefill-bench {args.command}: error: {err}\n")
    except (ExecutorLost, ServerError) as err:
        # a search's workers died; a server unreachable, not OpenAI-compatible, stalled: not
        # the command line's fault, so not a usage error
        parser.exit(1, f"prefill-bench {args.command}: error: {err}\n")
    except OSError as err:
        if err.filename is None:  # not a file the command was told to write or read
            raise
        parser.exit(1, f"prefill-bench {args.command}: error: {err}\n")


def entry() -> None:
    """The ``prefill-bench`` program: :func:`main`, exiting with its status. Interrupted
    (status 130) it leaves at once, skipping the interpreter's exit hooks: one of them joins a
    process pool's manager thread, which a Ctrl-C that stopped the pool's workers can leave
    waiting on a queue forever (CI saw ``capacity`` still alive 30 s after "interrupted")."""
    status = main()
    if status == INTERRUPTED:
        sys.stdout.flush()
        sys.stderr.flush()
        stop_all()  # the exit hooks are skipped: a server still running is stopped here
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    entry()
