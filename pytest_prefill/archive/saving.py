"""Writing runs into the archive: a run's number given out once however many writers race
(reserved under a lock), its file written atomically with its attachments beside it, what a
dead writer left swept, and the run document a command or the plugin saves. Reading them back
is :mod:`.runs`'s. Standard library only."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pytest_prefill._io import abandoned, json_safe, lock, write_json_atomic
from pytest_prefill.archive.runs import (
    MACHINE_FILE,
    NO_COMMIT,
    SCHEMA_VERSION,
    Warn,
    ignore_warning,
    machine_dir,
)
from pytest_prefill.plan.advice import FittedCost, recommend
from pytest_prefill.plan.cost_document import (
    RUN_KIND,
)

RESERVATION = re.compile(r"^\.(\d{4,9})\.reserved$")
IN_PROGRESS = re.compile(r"^\.(\d{4,9}\.reserved|tmp-.*\.part)$")
# a run file, or an attachment beside it: the run's stem (a stray "999999999_x.json" is neither)
NUMBERED = re.compile(r"^(\d{4,9})_[0-9a-z]{8}_\d{8}_\d{6}")
LAST_NUMBER = 999_999_999  # run names hold at most nine digits (archive.runs.RUN_NAME)
# An in-progress file whose lock is free is a dead writer's, once it is older than this: its
# writer creates it and locks it in the same breath, so a younger one might be just born.
STALE_AFTER = 30.0


# Where the tree travels without its .git (a copy sent to a lent device), the commit it was
# copied from: ``<hex>`` or ``<hex>-dirty`` (scripts/device-check.sh sets it).
COMMIT_VARIABLE = "PYTEST_PREFILL_COMMIT"


def commit_from_environment() -> tuple[str, bool] | None:
    """(short commit, dirty) from ``COMMIT_VARIABLE``, or None when unset or not a commit."""
    given = os.environ.get(COMMIT_VARIABLE, "").strip().lower()
    dirty = given.endswith("-dirty")
    given = given.removesuffix("-dirty")
    if not re.fullmatch(r"[0-9a-f]{8,40}", given):
        return None
    return given[:8], dirty


def git_state(root: str | os.PathLike[str]) -> tuple[str, bool]:
    """The checkout's short commit (8 characters) and whether its tracked files are modified;
    outside a git work tree or without git, the commit ``COMMIT_VARIABLE`` names, else
    ``("nocommit", False)``."""

    def git(*args: str, timeout: float) -> str:
        done = subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, timeout=timeout, check=True
        )
        return done.stdout.strip()

    try:
        short = git("rev-parse", "--short=8", "HEAD", timeout=10)[:8].lower()
        status = git("status", "--porcelain", "--untracked-files=no", timeout=30)
    except (OSError, subprocess.SubprocessError):
        return commit_from_environment() or (NO_COMMIT, False)
    if not re.fullmatch(r"[0-9a-f]{8}", short):
        return commit_from_environment() or (NO_COMMIT, False)
    return short, bool(status)


def run_filename(number: int, commit: str, when: datetime.datetime, dirty: bool) -> str:
    """``NNNN_<commit8>_<YYYYmmdd_HHMMSS>[_dirty].json``."""
    if not re.fullmatch(r"[0-9a-z]{8}", commit):
        raise ValueError(f"commit must be 8 lower-case letters or digits, got {commit!r}")
    if number < 1:
        raise ValueError(f"number must be >= 1, got {number!r}")
    return f"{number:04d}_{commit}_{when.strftime('%Y%m%d_%H%M%S')}{'_dirty' if dirty else ''}.json"


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


def _numbers(folder: Path) -> set[int]:
    """Every number something in ``folder`` holds: runs, attachments (even one left without
    its run by an older version), reservations. None of them is given out again."""
    taken = set()
    for name in os.listdir(folder):
        match = NUMBERED.match(name) or RESERVATION.match(name)
        if match:
            taken.add(int(match.group(1)))
    return taken


def sweep_abandoned(folder: str | os.PathLike[str], *, warn: Warn = ignore_warning) -> list[str]:
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
    if number > LAST_NUMBER:
        raise ValueError(f"{folder}: run numbers are used up (the last is {LAST_NUMBER})")
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


def cost_block(fitted: FittedCost, source: str, label: str | None = None) -> dict[str, Any]:
    """A run's ``cost``: the cost model its tables used (``fitted``), where it came from, its C*
    and the recommendation (the one rule's words), and the calibration's trust figures."""
    cost, trust = fitted.cost, fitted.trust
    return {
        "source": source,
        "label": label or source,
        "cost_model": cost.to_dict(),
        "chunk_star": cost.chunk_star(),
        "refused": sorted(fitted.refused),
        "chunk_star_by_context": {
            str(c): json_safe(cost.chunk_star(context=c)) for c in fitted.contexts
        },
        "recommendation": recommend(fitted).to_dict(),
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
