"""The per-machine results archive: ``<results>/<machine-key>/machine.json`` plus one JSON file
per run, ``NNNN_<commit8>_<YYYYmmdd_HHMMSS>[_dirty].json``. Standard library only.

Writes are atomic and concurrent writers never share a run number; reading skips (and reports
through ``warn``) any file that is corrupt or not a pytest-prefill run, never crashing on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_prefill._io import abandoned, json_safe, lock, read_json, write_json_atomic
from pytest_prefill.machine import KEY_PATTERN
from pytest_prefill.plan.advice import STAR_CONTEXTS, Trust, recommend
from pytest_prefill.plan.cost_document import (
    RUN_KIND,
    SCHEMA_VERSIONS,
    check_schema,
    cost_from_json,
)
from pytest_prefill.sim import CostModel

SCHEMA_VERSION = SCHEMA_VERSIONS[RUN_KIND]
MACHINE_FILE = "machine.json"
RUN_NAME = re.compile(r"^(\d{4,9})_([0-9a-z]{8})_(\d{8}_\d{6})(_dirty)?\.json$")
NO_COMMIT = "nocommit"  # eight characters, like a short hash, for a tree outside git

Warn = Callable[[str], None]


def _ignore(_: str) -> None:
    pass


def git_state(root: str | os.PathLike[str]) -> tuple[str, bool]:
    """The checkout's short commit (8 characters) and whether its tracked files are modified;
    ``("nocommit", False)`` outside a git work tree or without git."""

    def git(*args: str, timeout: float) -> str:
        done = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=timeout, check=True
        )
        return done.stdout.strip()

    try:
        short = git("rev-parse", "--short=8", "HEAD", timeout=10)[:8].lower()
        status = git("status", "--porcelain", "--untracked-files=no", timeout=30)
    except (OSError, subprocess.SubprocessError):
        return NO_COMMIT, False
    if not re.fullmatch(r"[0-9a-f]{8}", short):
        return NO_COMMIT, False
    return short, bool(status)


def run_filename(number: int, commit: str, when: datetime.datetime, dirty: bool) -> str:
    """``NNNN_<commit8>_<YYYYmmdd_HHMMSS>[_dirty].json``."""
    if not re.fullmatch(r"[0-9a-z]{8}", commit):
        raise ValueError(f"commit must be 8 lower-case letters or digits, got {commit!r}")
    if number < 1:
        raise ValueError(f"number must be >= 1, got {number!r}")
    return f"{number:04d}_{commit}_{when.strftime('%Y%m%d_%H%M%S')}{'_dirty' if dirty else ''}.json"


def machine_dir(results: str | os.PathLike[str], key: str) -> Path:
    """``<results>/<key>``; ValueError for a key that is not a plain folder name."""
    if not isinstance(key, str) or not KEY_PATTERN.match(key):
        raise ValueError(f"machine key must be lower-case letters, digits and dashes, got {key!r}")
    return Path(results) / key


def _shareable_mode() -> int:
    """rw for everyone the umask allows (a temporary file is created 0600; archived results
    are meant to be read and committed by others)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def write_machine(results: str | os.PathLike[str], info: Mapping[str, Any]) -> Path:
    """Write ``machine.json`` for ``info["key"]`` atomically (replacing an older description)."""
    path = machine_dir(results, info["key"]) / MACHINE_FILE
    write_json_atomic(path, json_safe(dict(info), "machine"))
    os.chmod(path, _shareable_mode())
    return path


RESERVATION = re.compile(r"^\.(\d{4,9})\.reserved$")
IN_PROGRESS = re.compile(r"^\.(\d{4,9}\.reserved|tmp-.*\.part)$")
NUMBERED = re.compile(r"^(\d{4,9})_")  # a run file, or an attachment beside it
# An in-progress file whose lock is free is a dead writer's, once it is older than this: its
# writer creates it and locks it in the same breath, so a younger one might be just born.
STALE_AFTER = 30.0


def _numbers(folder: Path) -> set[int]:
    """Every number something in ``folder`` holds: runs, attachments (even one left without
    its run by an older version), reservations. None of them is given out again."""
    taken = set()
    for name in os.listdir(folder):
        match = NUMBERED.match(name) or RESERVATION.match(name)
        if match:
            taken.add(int(match.group(1)))
    return taken


def sweep_abandoned(folder: str | os.PathLike[str], *, warn: Warn = _ignore) -> list[str]:
    """Remove the temporary and reservation files of writers that died (``kill -9``, a
    power cut) in ``folder``: those no live process holds a lock on, older than
    :data:`STALE_AFTER` seconds. Returns their names."""
    swept = []
    now = time.time()
    for name in sorted(os.listdir(folder)):
        if not IN_PROGRESS.match(name):
            continue
        path = os.path.join(folder, name)
        try:
            if now - os.lstat(path).st_mtime < STALE_AFTER or not abandoned(path):
                continue
            os.unlink(path)
        except FileNotFoundError:  # another sweeper was first
            continue
        except OSError as err:
            warn(f"could not remove the abandoned {path} ({err.strerror})")
            continue
        swept.append(name)
    return swept


def _reserve(folder: Path) -> tuple[int, Path, int]:
    """The next free number, reserved by an exclusive create of ``.NNNN.reserved`` and held by
    a lock on it: (number, reservation path, its open descriptor)."""
    number = max(_numbers(folder), default=0) + 1
    while True:
        reservation = folder / f".{number:04d}.reserved"
        try:
            fd = os.open(reservation, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            number += 1
            continue
        lock(fd)
        # A writer that finished between our scan and our reservation holds this number.
        if any(NUMBERED.match(n) and int(n[: n.index("_")]) == number for n in os.listdir(folder)):
            os.unlink(reservation)
            os.close(fd)
            number += 1
            continue
        return number, reservation, fd


def _locked_temp(folder: Path, text: str) -> tuple[str, int]:
    """``text`` in a new locked, synced, shareable temporary file: (its path, descriptor)."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=folder)
    try:
        lock(fd)
        os.chmod(tmp, _shareable_mode())
        data = memoryview(text.encode("utf-8"))
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return tmp, fd


def write_run(
    results: str | os.PathLike[str],
    key: str,
    run: Mapping[str, Any],
    *,
    commit: str,
    dirty: bool,
    when: datetime.datetime,
    attachments: Mapping[str, str] | None = None,
) -> Path:
    """Write ``run`` as the next numbered run file of machine ``key`` and return its path.

    The number is reserved with an exclusive create (``.NNNN.reserved``, locked while the
    writer lives) and re-checked against the finished files before the complete file is
    hard-linked into place, so two processes writing at once get different numbers and a
    reader never sees half a file. Numbers are never given out twice, even after a writer was
    killed. Each write first sweeps what killed writers left (:func:`sweep_abandoned`). The
    document gets ``kind``, ``schema_version`` and ``number`` added.

    ``attachments`` maps a suffix (``"timeline.svg"``) to a text stored beside the run as
    ``<run file stem>_<suffix>``; the document lists them under ``attachments`` (suffix -> file
    name). They are written to temporary files first and renamed into place only after the run
    file exists, so an attachment never outlives a run that was not written.
    """
    for suffix in attachments or {}:
        if not re.fullmatch(r"[a-z0-9_-]+\.[a-z0-9]+", suffix) or suffix.endswith(".json"):
            raise ValueError(
                f"attachment suffix must look like 'timeline.svg' (not .json), got {suffix!r}"
            )
    folder = machine_dir(results, key)
    folder.mkdir(parents=True, exist_ok=True)
    number, reservation, reservation_fd = _reserve(folder)
    temps: list[tuple[str, int]] = []
    try:
        sweep_abandoned(folder)
        final = folder / run_filename(number, commit, when, dirty)
        attached = {suffix: f"{final.stem}_{suffix}" for suffix in attachments or {}}
        document = {
            "kind": RUN_KIND,
            "schema_version": SCHEMA_VERSION,
            "number": number,
            **{k: v for k, v in run.items() if k not in ("kind", "schema_version")},
        }
        if attached:
            document["attachments"] = attached
        text = json.dumps(json_safe(document, "run"), indent=2, allow_nan=False) + "\n"
        for content in (attachments or {}).values():
            temps.append(_locked_temp(folder, content))
        run_tmp, run_fd = _locked_temp(folder, text)
        temps.append((run_tmp, run_fd))
        try:
            os.link(run_tmp, final)  # fails rather than replace an existing file
        except OSError:
            if final.exists():
                raise
            os.replace(run_tmp, final)  # a file system without hard links
        for (tmp, _), name in zip(temps, attached.values()):
            os.replace(tmp, folder / name)
    finally:
        for tmp, fd in temps:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        os.unlink(reservation)
        os.close(reservation_fd)
    return final


def cost_block(
    cost: CostModel,
    source: str,
    label: str | None = None,
    refused: Collection[str] = (),
    contexts: Sequence[int] = STAR_CONTEXTS,
    trust: Trust | None = None,
) -> dict[str, Any]:
    """A run's ``cost``: the cost model its tables used, where it came from, its C* and the
    recommendation (the one rule's words), and the calibration's trust figures."""
    return {
        "source": source,
        "label": label or source,
        "cost_model": cost.to_dict(),
        "chunk_star": cost.chunk_star(),
        "refused": sorted(refused),
        "chunk_star_by_context": {str(c): json_safe(cost.chunk_star(context=c)) for c in contexts},
        "recommendation": recommend(cost, refused, contexts, trust).to_dict(),
        "trust": None if trust is None else trust.to_dict(),
    }


def run_document(
    *,
    created: datetime.datetime,
    machine: Mapping[str, Any],
    commit: str,
    dirty: bool,
    settings: Mapping[str, Any],
    cost: Mapping[str, Any] | None = None,
    calibration: Mapping[str, Any] | None = None,
    model: Mapping[str, Any] | None = None,
    tables: Sequence[Mapping[str, Any]] = (),
    verdicts: Sequence[Mapping[str, Any]] = (),
    benchmarks: Sequence[Mapping[str, Any]] = (),
    pytest: Mapping[str, Any] | None = None,
    command: str | None = None,
    timeline: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The document of one run, as :func:`write_run` stores it (it adds kind, schema version
    and number). ``pytest`` describes a pytest session (args, exit status, outcomes),
    ``command`` the ``prefill-bench`` command line that made the run otherwise."""
    return {
        "created": created.isoformat(timespec="seconds"),
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine_key": machine["key"],
        "machine": dict(machine),
        "commit": commit,
        "dirty": dirty,
        "command": command,
        "settings": dict(settings),
        "model": model,
        "cost": cost,
        "calibration": calibration,
        "tables": [{k: e.get(k) for k in ("title", "text", "data", "test")} for e in tables],
        "verdicts": [
            {k: e.get(k) for k in ("name", "verdict", "sentence", "detail", "test", "asserted")}
            for e in verdicts
        ],
        "benchmarks": [
            {"test": e.get("test"), **{k: v for k, v in e.items() if k not in ("kind", "seq")}}
            for e in benchmarks
        ],
        "pytest": pytest,
        "timeline": timeline,
    }


def save_run(
    results: str | os.PathLike[str],
    document: Mapping[str, Any],
    *,
    when: datetime.datetime,
    attachments: Mapping[str, str] | None = None,
) -> Path:
    """Write ``machine.json`` and the run (a :func:`run_document`) under
    ``<results>/<document's machine key>/``; the run's path.

    Raises:
        ValueError: naming the field, when ``document`` lacks what a run needs (``machine``
            an object, ``machine_key``, ``commit``, ``dirty`` a bool).
    """
    if not isinstance(document, Mapping):
        raise ValueError(f"document must be a run document (a mapping), got {document!r:.60}")
    machine = document.get("machine")
    if not isinstance(machine, Mapping):
        raise ValueError(f"document.machine must be an object, got {machine!r:.60}")
    if not isinstance(document.get("dirty"), bool):
        raise ValueError(f"document.dirty must be true or false, got {document.get('dirty')!r}")
    for field in ("machine_key", "commit"):
        if not isinstance(document.get(field), str):
            raise ValueError(f"document.{field} must be a string, got {document.get(field)!r}")
    write_machine(results, {**machine, "key": document["machine_key"]})
    return write_run(
        results,
        document["machine_key"],
        document,
        commit=document["commit"],
        dirty=document["dirty"],
        when=when,
        attachments=attachments,
    )


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
        if name == MACHINE_FILE or name.startswith(".") or not name.endswith(".json"):
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


def runs(results: str | os.PathLike[str], key: str, *, warn: Warn = _ignore) -> list[RunFile]:
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
    warn: Warn = _ignore,
    with_calibration: bool = False,
) -> RunFile | None:
    """The newest readable run (with a calibration, if asked), or None. Reads run files from
    the newest back only until it finds one."""
    for run in _newest_first(results, key, warn):
        if not with_calibration or run.calibration is not None:
            return run
    return None


def archived_cost(
    results: str | os.PathLike[str], key: str, *, warn: Warn = _ignore
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
    results: str | os.PathLike[str], key: str, number: int, *, warn: Warn = _ignore
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


def resolve_run(ref: str, results: str | os.PathLike[str], *, warn: Warn = _ignore) -> RunFile:
    """A run named by ``ref``: a run file's path, or a machine key meaning its latest run
    (looked up under ``results``).

    Raises:
        ValueError: when ``ref`` is neither, or names a machine without runs.
    """
    if ref.endswith(".json") or os.sep in ref or os.path.exists(ref):
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
