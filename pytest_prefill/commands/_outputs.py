"""What each command's output flag writes, and the one check of every output path after parsing:
its folder exists, it names none of the command's inputs nor lies inside a folder the command
reads, and an existing file of another kind is replaced only with ``--force``
(:func:`pytest_prefill._io.check_output`)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from pytest_prefill._io import KIND_NAMES, check_output, content_kind


def _picture(path: str) -> str:
    return "a PNG picture" if path.lower().endswith(".png") else "an SVG picture"


def _timeline(path: str) -> str:
    return "a Chrome trace" if path.lower().endswith(".json") else _picture(path)


def _document(kind: str) -> Callable[[str], str]:
    return lambda path: KIND_NAMES.get(kind, f"a {kind} document")


def _plain(words: str) -> Callable[[str], str]:
    return lambda path: words


# (command, flag's dest) -> what it writes there, in :func:`content_kind`'s words, from its path.
# tests/test_outputs.py checks that every output flag of every command is here.
OUTPUTS: dict[tuple[str, str], Callable[[str], str]] = {
    ("simulate", "json"): _document("pytest-prefill/chunk-sweep"),
    ("capacity", "json"): _document("pytest-prefill/capacity"),
    ("capacity", "plot"): _picture,
    ("calibrate", "json"): _document("pytest-prefill/calibration"),
    ("demo", "json"): _document("pytest-prefill/falsifier"),
    ("timeline", "out"): _timeline,
    ("fidelity", "json"): _document("pytest-prefill/fidelity"),
    ("bench", "json"): _plain("a JSON document"),
    ("bench", "records"): _plain("JSON lines"),
    ("calibrate-server", "json"): _document("pytest-prefill/calibration"),
    ("fidelity-server", "json"): _document("pytest-prefill/server-fidelity"),
    ("verify", "json"): _document("pytest-prefill/verify"),
}
# Input folders read whole below their top: the archive (--results) lists every file in its
# machines' folders, not what sits beside them. Other folders' files are read by name.
READ_BELOW = {"results": 1}
# What an output may write that is not the tool's own kind of file: such a file in an input
# folder may be one the folder's reader reads (a model's config.json is "a JSON document").
GENERIC = ("a JSON document", "JSON lines")
FORCE_HELP = (
    "replace an existing output file of another kind (a calibration, an answer, a trace); "
    "without it such a file is refused"
)


def has_outputs(command: str) -> bool:
    """Whether ``command`` writes a file a flag names (and so takes ``--force``)."""
    return any(name == command for name, _ in OUTPUTS)


def check_outputs(args: argparse.Namespace) -> None:
    """Every output path ``args`` gives, checked by :func:`check_output` against what its flag
    writes and against every other path the command line names (an input, or another output).

    Raises:
        ValueError: naming the path.
    """
    force = bool(getattr(args, "force", False))
    outputs = {dest: getattr(args, dest, None) for name, dest in OUTPUTS if name == args.command}
    given = {dest: path for dest, path in outputs.items() if path}
    for dest, path in given.items():
        inputs = {_flag(other): value for other, value in _paths(args) if other != dest}
        writes = OUTPUTS[args.command, dest](path)
        _check_outside_folders(args, dest, path, writes)
        check_output(path, writes=writes, inputs=inputs, force=force, flag=_flag(dest))


def _check_outside_folders(args: argparse.Namespace, dest: str, path: str, writes: str) -> None:
    """``path`` (``dest``'s output, which writes ``writes``) replaces nothing a folder another
    argument gives as an input holds: in the archive's machine folders (read whole) it may not
    be at all; in any other folder (a model's, a tokenizer's: their files are read by name) it
    may be a new file, or replace an earlier output of the tool's own kind, nothing else.

    Raises:
        ValueError: naming both flags and the folder, even with ``--force``.
    """
    target = Path(os.path.realpath(path))
    for other, folder in _paths(args, os.path.isdir):
        top = Path(os.path.realpath(folder))
        if other == dest or not target.is_relative_to(top):
            continue
        depth = len(target.relative_to(top).parts)
        if other in READ_BELOW:
            refused = depth > READ_BELOW[other]
        else:
            ours = writes not in GENERIC and content_kind(target) == writes
            refused = target.is_file() and not ours
        if refused:
            raise ValueError(
                f"{_flag(dest)} {path} is inside {_flag(other)}'s folder {folder}, which this "
                "command reads, and would replace what it holds; write it outside that folder"
            )


def _paths(
    args: argparse.Namespace, kind: Callable[[str], bool] = os.path.isfile
) -> Iterator[tuple[str, str]]:
    """(dest, path) for every argument that names an existing file (``kind``: or a folder), not
    the command line kept whole in ``argv``, nor the parser's own ``_run``/``_check``."""
    for dest, value in vars(args).items():
        if dest == "argv" or dest.startswith("_"):
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        for item in values:
            if isinstance(item, (str, os.PathLike)) and item and kind(os.fspath(item)):
                yield dest, os.fspath(item)


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")
