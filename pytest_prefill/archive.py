"""The per-machine results archive: ``<results>/<machine-key>/machine.json`` plus one JSON file
per run, ``NNNN_<commit8>_<YYYYmmdd_HHMMSS>[_dirty].json``. Standard library only.

Writes are atomic and concurrent writers never share a run number; reading skips (and reports
through ``warn``) any file that is corrupt or not a pytest-prefill run, never crashing on it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
import re
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pytest_prefill._io import write_atomic, write_json_atomic
from pytest_prefill.advice import recommend
from pytest_prefill.costs import cost_from_json
from pytest_prefill.machine import KEY_PATTERN
from pytest_prefill.scheduler import CostModel

RUN_KIND = "pytest-prefill/run"
SCHEMA_VERSION = 1
MACHINE_FILE = "machine.json"
RUN_NAME = re.compile(r"^(\d{4,})_([0-9a-z]{8})_(\d{8}_\d{6})(_dirty)?\.json$")
NO_COMMIT = "nocommit"  # eight characters, like a short hash, for a tree outside git

Warn = Callable[[str], None]


def _ignore(_: str) -> None:
    pass


def json_safe(value: Any, field: str = "value") -> Any:
    """``value`` as strict JSON: NaN becomes null, infinities the strings "inf" / "-inf",
    tuples lists. Anything else that JSON cannot hold is a ValueError naming ``field``."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return value
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(f"{field}: JSON object keys must be strings, got {key!r}")
            out[key] = json_safe(item, f"{field}.{key}")
        return out
    if isinstance(value, (list, tuple)):
        return [json_safe(item, f"{field}[{i}]") for i, item in enumerate(value)]
    raise ValueError(f"{field}: {type(value).__name__} cannot be stored as JSON")


def git_state(root: str | os.PathLike[str]) -> tuple[str, bool]:
    """The checkout's short commit (8 characters) and whether its tracked files are modified;
    ``("nocommit", False)`` outside a git work tree or without git."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=8", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return NO_COMMIT, False
    short = commit.stdout.strip()[:8].lower()
    if not re.fullmatch(r"[0-9a-f]{8}", short):
        return NO_COMMIT, False
    return short, bool(status.stdout.strip())


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


def _numbers(folder: Path) -> set[int]:
    taken = set()
    for name in os.listdir(folder):
        match = RUN_NAME.match(name) or re.match(r"^\.(\d{4,})\.reserved$", name)
        if match:
            taken.add(int(match.group(1)))
    return taken


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

    The number is reserved with an exclusive create (``.NNNN.reserved``) and re-checked
    against the finished files before the complete file is hard-linked into place, so two
    processes writing at once get different numbers and a reader never sees half a file.
    The document gets ``kind``, ``schema_version`` and ``number`` added.

    ``attachments`` maps a suffix (``"timeline.svg"``) to a text written, atomically and
    before the run file, beside it as ``<run file stem>_<suffix>``; the document lists them
    under ``attachments`` (suffix -> file name).
    """
    for suffix in attachments or {}:
        if not re.fullmatch(r"[a-z0-9_-]+\.[a-z0-9]+", suffix) or suffix.endswith(".json"):
            raise ValueError(
                f"attachment suffix must look like 'timeline.svg' (not .json), got {suffix!r}"
            )
    folder = machine_dir(results, key)
    folder.mkdir(parents=True, exist_ok=True)
    number = max(_numbers(folder), default=0) + 1
    while True:
        reservation = folder / f".{number:04d}.reserved"
        try:
            os.close(os.open(reservation, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            number += 1
            continue
        # A writer that finished between our scan and our reservation holds this number.
        if any(RUN_NAME.match(n) and int(n[: n.index("_")]) == number for n in os.listdir(folder)):
            os.unlink(reservation)
            number += 1
            continue
        break
    try:
        final = folder / run_filename(number, commit, when, dirty)
        attached = {}
        for suffix, content in (attachments or {}).items():
            path = final.with_name(f"{final.stem}_{suffix}")
            write_atomic(path, content)
            os.chmod(path, _shareable_mode())
            attached[suffix] = path.name
        document = {
            "kind": RUN_KIND,
            "schema_version": SCHEMA_VERSION,
            "number": number,
            **{k: v for k, v in run.items() if k not in ("kind", "schema_version")},
        }
        if attached:
            document["attachments"] = attached
        text = json.dumps(json_safe(document, "run"), indent=2, allow_nan=False) + "\n"
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=folder)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.fsync(handle.fileno())
            os.chmod(tmp, _shareable_mode())
            try:
                os.link(tmp, final)  # fails rather than replace an existing file
            except OSError:
                if final.exists():
                    raise
                os.replace(tmp, final)  # a file system without hard links
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    finally:
        os.unlink(reservation)
    return final


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
        ValueError: naming the path, when it is not readable JSON or not a pytest-prefill run
            of a schema version this code understands.
    """
    path = Path(path)
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not readable JSON ({err})") from None
    if not isinstance(data, dict) or data.get("kind") != RUN_KIND:
        kind = data.get("kind") if isinstance(data, dict) else type(data).__name__
        raise ValueError(
            f"{path}: not a pytest-prefill run file (kind {kind!r}, expected {RUN_KIND!r})"
        )
    version = data.get("schema_version")
    if not isinstance(version, int) or not 1 <= version <= SCHEMA_VERSION:
        raise ValueError(
            f"{path}: schema_version {version!r} is not one this version reads "
            f"(1..{SCHEMA_VERSION})"
        )
    match = RUN_NAME.match(path.name)
    number = int(match.group(1)) if match else data.get("number")
    if not isinstance(number, int):
        raise ValueError(f"{path}: no run number (file name or 'number' field)")
    return RunFile(path, number, data)


def runs(results: str | os.PathLike[str], key: str, *, warn: Warn = _ignore) -> list[RunFile]:
    """The readable runs of machine ``key``, oldest first. Any other ``*.json`` file in the
    folder (corrupt, foreign, a newer schema) is reported through ``warn`` and skipped."""
    folder = machine_dir(results, key)
    if not folder.is_dir():
        return []
    found = []
    for name in sorted(os.listdir(folder)):
        if name == MACHINE_FILE or name.startswith(".") or not name.endswith(".json"):
            continue
        try:
            found.append(read_run(folder / name))
        except ValueError as err:
            warn(f"skipped {err}")
    return sorted(found, key=lambda r: (r.number, r.path.name))


def latest_run(
    results: str | os.PathLike[str],
    key: str,
    *,
    warn: Warn = _ignore,
    with_calibration: bool = False,
) -> RunFile | None:
    """The newest readable run (with a calibration, if asked), or None."""
    found = [r for r in runs(results, key, warn=warn) if not with_calibration or r.calibration]
    return found[-1] if found else None


def archived_cost(
    results: str | os.PathLike[str], key: str, *, warn: Warn = _ignore
) -> tuple[CostModel, RunFile]:
    """The cost model of the latest calibration archived for machine ``key``.

    Raises:
        ValueError: when no readable run of that machine holds a calibration.
    """
    run = latest_run(results, key, warn=warn, with_calibration=True)
    if run is None:
        raise ValueError(
            f"no calibration archived for machine {key!r} under {machine_dir(results, key)}; "
            "run the hardware suite there first (pytest -m gpu) or give a preset or a JSON path"
        )
    return cost_from_json(run.data, str(run.path)), run


# A run named by its number (``0001``, as ``prefill-bench runs`` lists it) or by machine key and
# number (``nvidia-h200/0001``). All-digit names are run numbers, never machine keys.
RUN_ID = re.compile(r"^(?:([a-z0-9][a-z0-9-]*)/)?(\d{1,9})$")


def run_id(run: RunFile, key: str | None = None) -> str:
    """The id ``compare`` accepts for ``run``: ``NNNN``, or ``KEY/NNNN`` when ``key`` is given."""
    return f"{key}/{run.number:04d}" if key else f"{run.number:04d}"


def find_run(
    results: str | os.PathLike[str], key: str, number: int, *, warn: Warn = _ignore
) -> RunFile:
    """Run ``number`` of machine ``key``.

    Raises:
        ValueError: naming the machine folder and the numbers it holds, when there is none.
    """
    found = runs(results, key, warn=warn)
    for run in found:
        if run.number == number:
            return run
    held = ", ".join(run_id(r) for r in found) or "none"
    raise ValueError(
        f"no run {number:04d} archived for machine {key!r} under {machine_dir(results, key)} "
        f"(runs there: {held}; prefill-bench runs lists them)"
    )


def machines(results: str | os.PathLike[str]) -> list[str]:
    """The machine keys with a folder under ``results``, sorted."""
    folder = Path(results)
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and KEY_PATTERN.match(p.name))


@dataclasses.dataclass(frozen=True, slots=True)
class RunSummary:
    """What ``prefill-bench runs`` shows of one run: its id, when, which commit, what made it,
    and what it found (C* and the recommendation of its calibration, its verdicts)."""

    id: str
    created: str
    commit: str
    made_by: str
    chunk_star: float | None
    recommendation: str | None
    verdicts: tuple[tuple[str, str], ...]
    tables: int


def summarize_run(run: RunFile, key: str | None = None) -> RunSummary:
    """A :class:`RunSummary` of ``run``; fields a damaged run lacks are left empty."""
    data = run.data
    commit = str(data.get("commit") or "?") + (" dirty" if data.get("dirty") else "")
    command = data.get("command")
    pytest_info = data.get("pytest")
    if isinstance(command, str):
        made_by = command
    elif isinstance(pytest_info, Mapping):
        args = pytest_info.get("args")
        made_by = "pytest " + " ".join(map(str, args)) if isinstance(args, list) else "pytest"
    else:
        made_by = "?"
    star = recommendation = None
    if run.calibration is not None:
        try:
            cost = cost_from_json(run.calibration, str(run.path))
        except ValueError:
            cost = None
        if cost is not None:
            refused = {
                r.get("constant")
                for r in run.calibration.get("refusals") or []
                if isinstance(r, Mapping)
            }
            advice = recommend(cost, {str(c) for c in refused})
            star, recommendation = advice.chunk_star, advice.policy
    verdicts = tuple(
        (str(v.get("name")), str(v.get("verdict")))
        for v in data.get("verdicts") or []
        if isinstance(v, Mapping)
    )
    tables = data.get("tables")
    return RunSummary(
        run_id(run, key),
        str(data.get("created") or "undated"),
        commit,
        made_by,
        star,
        recommendation,
        verdicts,
        len(tables) if isinstance(tables, list) else 0,
    )


def resolve_run(ref: str, results: str | os.PathLike[str], *, warn: Warn = _ignore) -> RunFile:
    """A run named by ``ref``: a run file's path, or a machine key meaning its latest run
    (looked up under ``results``).

    Raises:
        ValueError: when ``ref`` is neither, or names a machine without runs.
    """
    if ref.endswith(".json") or os.sep in ref or os.path.isfile(ref):
        if not os.path.isfile(ref):
            raise ValueError(f"run file {ref!r} does not exist")
        return read_run(ref)
    if not KEY_PATTERN.match(ref):
        raise ValueError(f"{ref!r} is neither a run file (*.json) nor a machine key")
    run = latest_run(results, ref, warn=warn)
    if run is None:
        known = (
            sorted(p.name for p in Path(results).iterdir() if p.is_dir())
            if Path(results).is_dir()
            else []
        )
        raise ValueError(
            f"no runs archived for machine {ref!r} under {results} "
            f"(machines there: {', '.join(known) or 'none'})"
        )
    return run
