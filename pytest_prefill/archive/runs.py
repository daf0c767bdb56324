"""The per-machine results archive: ``<results>/<machine-key>/machine.json`` plus one JSON file
per run, ``NNNN_<commit8>_<YYYYmmdd_HHMMSS>[_dirty].json`` (or ``.json.gz``, gzip-compressed);
its names, and reading and finding runs. Standard library only.

Reading skips (and reports through ``warn``) any file that is corrupt or not a pytest-prefill
run, never crashing on it. Writing (atomic, and concurrent writers never share a run number) is
:mod:`.saving`'s.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pytest_prefill._io import read_json
from pytest_prefill.machine import KEY_PATTERN
from pytest_prefill.plan.cost_document import (
    RUN_KIND,
    SCHEMA_VERSIONS,
    check_schema,
    cost_from_json,
)
from pytest_prefill.sim import CostModel

SCHEMA_VERSION = SCHEMA_VERSIONS[RUN_KIND]
MACHINE_FILE = "machine.json"
# A run file may be gzip-compressed (``.json.gz``): the committed archive keeps its long runs so.
RUN_NAME = re.compile(r"^(\d{4,9})_([0-9a-z]{8})_(\d{8}_\d{6})(_dirty)?\.json(\.gz)?$")
RUN_SUFFIXES = (".json", ".json.gz")
NO_COMMIT = "nocommit"  # eight characters, like a short hash, for a tree outside git

Warn = Callable[[str], None]


def ignore_warning(_: str) -> None:
    pass


def machine_dir(results: str | os.PathLike[str], key: str) -> Path:
    """``<results>/<key>``; ValueError for a key that is not a plain folder name."""
    if not isinstance(key, str) or not KEY_PATTERN.match(key):
        raise ValueError(f"machine key must be lower-case letters, digits and dashes, got {key!r}")
    return Path(results) / key


@dataclasses.dataclass(frozen=True, slots=True)
class RunFile:
    """One archived run: where it is, its number, and its parsed document."""

    path: Path
    number: int
    data: Mapping[str, Any]

    @property
    def calibration(self) -> Mapping[str, Any] | None:
        cal = self.data.get("calibration")
        return (
            cal if isinstance(cal, Mapping) and isinstance(cal.get("cost_model"), Mapping) else None
        )


def read_run(path: str | os.PathLike[str]) -> RunFile:
    """Parse one run file.

    Raises:
        ValueError: naming the path, when it is not readable JSON (or over
            :data:`pytest_prefill._io.MAX_JSON_BYTES`) or not a pytest-prefill run of a schema
            version this code understands.
    """
    return run_from_document(path, read_json(path, "run file"))


def run_from_document(path: str | os.PathLike[str], data: Any) -> RunFile:
    """The run in ``data``, the parsed document of the file at ``path``.

    Raises:
        ValueError: as :func:`read_run` does.
    """
    path = Path(path)
    if not isinstance(data, dict) or data.get("kind") != RUN_KIND:
        kind = data.get("kind") if isinstance(data, dict) else type(data).__name__
        raise ValueError(
            f"{path}: not a pytest-prefill run file (kind {kind!r}, expected {RUN_KIND!r})"
        )
    check_schema(data, str(path))
    match = RUN_NAME.match(path.name)
    number = int(match.group(1)) if match else data.get("number")
    if isinstance(number, bool) or not isinstance(number, int):
        raise ValueError(f"{path}: no run number (file name or 'number' field)")
    return RunFile(path, number, data)


def _run_files(folder: Path, warn: Warn) -> list[tuple[int, str]]:
    """(number, name) of every run file in ``folder``, oldest first, without reading them; any
    other ``*.json`` there (but machine.json) is reported through ``warn``."""
    found = []
    for name in os.listdir(folder):
        if name == MACHINE_FILE or name.startswith(".") or not name.endswith(RUN_SUFFIXES):
            continue
        match = RUN_NAME.match(name)
        if match:
            found.append((int(match.group(1)), name))
        else:
            warn(
                f"skipped {folder / name}: not a pytest-prefill run file (not named "
                "NNNN_<commit8>_<date>.json)"
            )
    return sorted(found)


def runs(
    results: str | os.PathLike[str], key: str, *, warn: Warn = ignore_warning
) -> list[RunFile]:
    """The readable runs of machine ``key``, oldest first. Any other ``*.json`` file in the
    folder (corrupt, foreign, a newer schema, too large) is reported through ``warn`` and
    skipped."""
    return list(reversed(list(_newest_first(results, key, warn))))


def _newest_first(results: str | os.PathLike[str], key: str, warn: Warn) -> Iterator[RunFile]:
    """The readable runs of machine ``key``, newest first, each read only when asked for."""
    folder = machine_dir(results, key)
    if not folder.is_dir():
        return
    for _, name in reversed(_run_files(folder, warn)):
        try:
            yield read_run(folder / name)
        except ValueError as err:
            warn(f"skipped {err}")


def latest_run(
    results: str | os.PathLike[str],
    key: str,
    *,
    warn: Warn = ignore_warning,
    with_calibration: bool = False,
) -> RunFile | None:
    """The newest readable run (with a calibration, if asked), or None. Reads run files from
    the newest back only until it finds one."""
    for run in _newest_first(results, key, warn):
        if not with_calibration or run.calibration is not None:
            return run
    return None


def archived_cost(
    results: str | os.PathLike[str], key: str, *, warn: Warn = ignore_warning
) -> tuple[CostModel, RunFile]:
    """The cost model of the latest valid calibration archived for machine ``key``; newer
    runs that cannot be read, or whose calibration is invalid, are reported through ``warn``
    and passed over for an older one.

    Raises:
        ValueError: when no run of that machine holds a valid calibration, naming every file
            passed over and why.
    """
    skipped: list[str] = []

    def note(message: str) -> None:
        skipped.append(message)
        warn(message)

    for run in _newest_first(results, key, note):
        if run.calibration is None:
            continue
        try:
            return cost_from_json(run.data, str(run.path)), run
        except ValueError as err:
            note(f"skipped {err}")
    passed_over = f" (passed over: {'; '.join(skipped)})" if skipped else ""
    raise ValueError(
        f"no calibration archived for machine {key!r} under {machine_dir(results, key)}"
        f"{passed_over}; run the hardware suite there first (pytest -m gpu) or give a preset "
        "or a JSON path"
    )


# A run named by its number (``0001``, as ``prefill-bench runs`` lists it) or by machine key and
# number (``nvidia-h200/0001``). All-digit names are run numbers, never machine keys.
RUN_ID = re.compile(r"^(?:([a-z0-9][a-z0-9-]*)/)?(\d{1,9})$")


def run_id(run: RunFile, key: str | None = None) -> str:
    """The id ``compare`` accepts for ``run``: ``NNNN``, or ``KEY/NNNN`` when ``key`` is given."""
    return f"{key}/{run.number:04d}" if key else f"{run.number:04d}"


def find_run(
    results: str | os.PathLike[str], key: str, number: int, *, warn: Warn = ignore_warning
) -> RunFile:
    """Run ``number`` of machine ``key``; only its file is read.

    Raises:
        ValueError: naming the machine folder and the numbers it holds, when there is none;
            naming the files, when several carry that number; naming the file, when it cannot
            be read.
    """
    folder = machine_dir(results, key)
    files = _run_files(folder, warn) if folder.is_dir() else []
    named = [name for held_number, name in files if held_number == number]
    if len(named) > 1:  # e.g. two archives merged: the number alone no longer names one run
        raise ValueError(
            f"run {number:04d} of machine {key!r} is ambiguous: {len(named)} files under "
            f"{folder} carry that number ({', '.join(named)}); name the file instead"
        )
    if named:
        return read_run(folder / named[0])
    held = ", ".join(f"{n:04d}" for n, _ in files) or "none"
    raise ValueError(
        f"no run {number:04d} archived for machine {key!r} under {folder} "
        f"(runs there: {held}; prefill-bench runs lists them)"
    )


def machines(results: str | os.PathLike[str]) -> list[str]:
    """The machine keys with a folder under ``results``, sorted."""
    folder = Path(results)
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and KEY_PATTERN.match(p.name))


def resolve_run(
    ref: str, results: str | os.PathLike[str], *, warn: Warn = ignore_warning
) -> RunFile:
    """A run named by ``ref``: a run file's path, or a machine key meaning its latest run
    (looked up under ``results``).

    Raises:
        ValueError: when ``ref`` is neither, or names a machine without runs.
    """
    if ref.endswith(RUN_SUFFIXES) or os.sep in ref or os.path.exists(ref):
        return read_run(ref)
    if not KEY_PATTERN.match(ref):
        raise ValueError(f"{ref!r} is neither a run file (*.json) nor a machine key")
    run = latest_run(results, ref, warn=warn)
    if run is None:
        raise ValueError(
            f"no runs archived for machine {ref!r} under {results} "
            f"(machines there: {', '.join(machines(results)) or 'none'})"
        )
    return run
