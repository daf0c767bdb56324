"""Files in and out. Writes are atomic (a reader never sees half a file, Ctrl-C leaves nothing
behind), go through a symlink to its target, and refuse anything that is not a regular file or a
new path; JSON is read with a size limit and every way it can be bad named by path. Numbers
that JSON cannot hold are written one way everywhere: infinities as the strings "inf" / "-inf",
NaN as null (:func:`json_number`, :func:`json_safe`), and read back by :func:`number_from_json`."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from typing import Any

# A calibration or run file is kilobytes to a few megabytes; anything near this is not one, and
# parsing it would cost seconds and gigabytes.
MAX_JSON_BYTES = 64 * 2**20

try:
    import fcntl
except ImportError:  # Windows: no advisory locks
    fcntl = None  # type: ignore[assignment]

_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def file_kind(mode: int) -> str:
    """'a regular file', 'a folder', 'a FIFO', ... for an ``os.stat`` mode."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def check_destination(path: str | os.PathLike[str]) -> str:
    """The file a write to ``path`` will create or replace (a symlink's target, followed), checked
    now, so that a command can refuse a bad destination before it measures anything.

    Raises:
        ValueError: naming ``path``, when it is empty, exists and is not a regular file (a
            folder, a FIFO, a device), lies under something that is not a folder, or is in a
            folder where no file can be created.
    """
    text = os.fspath(path)
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"the output path is empty ({text!r}); give a file path")
    target = os.path.realpath(text)
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except NotADirectoryError:
        raise ValueError(f"{text}: cannot be written (a file is used there as a folder)") from None
    except OSError as err:  # a loop of symlinks, no permission
        raise ValueError(f"{text}: cannot be written ({err.strerror})") from None
    if mode is not None and not stat.S_ISREG(mode):
        shown = text if target == os.path.abspath(text) else f"{text} (-> {target})"
        raise ValueError(
            f"{shown} is {file_kind(mode)}; write to a regular file or a new path instead"
        )
    folder = os.path.dirname(target)
    while not os.path.isdir(folder):  # the folders a write would create
        if os.path.lexists(folder):
            raise ValueError(f"{text}: {folder} is not a folder")
        folder = os.path.dirname(folder)
    try:
        fd, probe = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=folder)
    except OSError as err:
        raise ValueError(f"{text}: cannot create a file in {folder} ({err.strerror})") from None
    os.close(fd)
    os.unlink(probe)
    return target


# What a file the tool wrote says it is (its JSON "kind"), in words.
KIND_NAMES = {
    "pytest-prefill/calibration": "a calibration",
    "pytest-prefill/capacity": "a capacity answer",
    "pytest-prefill/run": "an archived run",
    "pytest-prefill/machine": "a machine record",
    "pytest-prefill/falsifier": "a falsifier result",
    "pytest-prefill/fidelity": "a fidelity result",
    "pytest-prefill/server-fidelity": "a server fidelity result",
    "pytest-prefill/verify": "a verify result",
}
_SNIFF_BYTES = 64 * 1024
_DOCUMENT_KIND = re.compile(rb'"kind"\s*:\s*"(pytest-prefill/[a-z-]+)"')
_TRACE_HEADERS = (b"TIMESTAMP,ContextTokens,GeneratedTokens",)
_TRACE_KEYS = (b'"timestamp"', b'"input_length"', b'"output_length"')


def content_kind(path: str | os.PathLike[str]) -> str | None:
    """What the regular file at ``path`` holds, in words, read from its first bytes: a picture,
    a Chrome trace, one of the tool's documents (:data:`KIND_NAMES`), a workload trace, other
    JSON or JSON lines, or "a file of another kind"; None when it is absent or empty."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_SNIFF_BYTES)
    except (FileNotFoundError, IsADirectoryError):
        return None
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    first = text.split(b"\n", 1)[0]
    if not text:
        return None
    if text.startswith(b"\x89PNG"):
        return "a PNG picture"
    if text.startswith(b"\x1f\x8b"):
        return "gzip-compressed data"
    if b"<svg" in text[:1024]:
        return "an SVG picture"
    if first.strip() in _TRACE_HEADERS or all(key in first for key in _TRACE_KEYS):
        return "a workload trace"
    if b'"traceEvents"' in text[:256]:
        return "a Chrome trace"
    if (match := _DOCUMENT_KIND.search(text)) is not None:
        kind = match.group(1).decode()
        return KIND_NAMES.get(kind, f"a {kind} document")
    if text.startswith(b"{") and first.rstrip().endswith(b"}") and b"\n{" in text:
        return "JSON lines"
    return "a JSON document" if text[:1] in (b"{", b"[") else "a file of another kind"


def check_output(
    path: str | os.PathLike[str],
    *,
    writes: str | None = None,
    inputs: Mapping[str, str | os.PathLike[str]] | None = None,
    force: bool = False,
    flag: str | None = None,
) -> str:
    """The file a command's output flag will write, checked before any work: as
    :func:`check_destination`, and its folder must exist (none is created); it must not be one
    of ``inputs`` (what each names, e.g. ``{"--cost": "cal.json"}``); and an existing file of a
    kind other than ``writes`` (:func:`content_kind`'s words; None: not checked) is replaced
    only with ``force``. ``flag``: the output's flag, named beside the input's when it is one.

    Raises:
        ValueError: naming ``path``, for each of these.
    """
    target = check_destination(path)
    text = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise ValueError(
            f"{text}: the folder {folder} does not exist (none is created: make it first)"
        )
    for given_flag, given in (inputs or {}).items():
        with contextlib.suppress(OSError):
            if os.path.samefile(target, given):
                named = f"{flag} {text}" if flag else text
                raise ValueError(f"{named} is also {given_flag}'s input; write to another path")
    if writes is not None and not force:
        kind = content_kind(target)
        if kind is not None and kind != writes:
            raise ValueError(
                f"{text} holds {kind} and this writes {writes}: give another path, or --force "
                "to replace it"
            )
    return target


def write_atomic(path: str | os.PathLike[str], text: str | bytes) -> None:
    """Write ``text`` (or bytes) to ``path`` through a temporary file in the same folder and a rename.

    A symlink is written through (its target is replaced; the link stays); an existing file
    keeps its permissions. The temporary file is locked (``flock``) while it is written, so a
    sweep of abandoned ones (:func:`abandoned`) never takes a live one.

    Raises:
        ValueError: as :func:`check_destination` does.
        OSError: when writing fails (a full disk, say); nothing is left behind.
    """
    target = check_destination(path)
    folder = os.path.dirname(target)
    os.makedirs(folder, exist_ok=True)
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = 0o666 & ~_umask()  # mkstemp makes 0600; a result is for others too
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=folder)
    try:
        binary = isinstance(text, bytes)
        with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as handle:
            lock(fd)
            os.chmod(tmp, mode)
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
            os.replace(tmp, target)  # while the lock is held
    except BaseException as err:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.filename is None:  # a full disk names no file
            raise OSError(err.errno, err.strerror or str(err), os.fspath(path)) from None
        raise


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """``data`` as indented, strict JSON (NaN and infinities are refused), written atomically."""
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n")


def lock(fd: int) -> None:
    """Hold an exclusive advisory lock on ``fd`` until it is closed (or the process dies)."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX)


def abandoned(path: str | os.PathLike[str]) -> bool:
    """Whether the in-progress file ``path`` (a temporary or reservation file whose writer
    holds a lock on it) has lost its writer: True only when nobody holds its lock. Without
    ``flock`` (Windows) nothing is ever called abandoned."""
    if fcntl is None:
        return False
    try:
        fd = os.open(
            path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        )
    except OSError:
        return False
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False  # its writer is alive
        return True
    finally:
        os.close(fd)


def read_json(path: str | os.PathLike[str], what: str = "JSON file") -> Any:
    """The parsed JSON document at ``path`` (``what`` it is supposed to be names a missing one;
    a path ending in ``.gz`` is read through gzip).

    Raises:
        ValueError: naming ``path``, when it does not exist, is not a regular file (a folder,
            ``/dev/zero``), exceeds :data:`MAX_JSON_BYTES`, is not UTF-8, is not JSON, nests
            too deeply, or holds an integer too large for a float.
    """
    text = os.fspath(path)
    try:
        # O_NONBLOCK: opening a FIFO nobody writes to must not hang before it is refused
        fd = os.open(text, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with open(fd, "rb", buffering=0) as handle:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise ValueError(f"{text}: {file_kind(mode)}, not a JSON file")
            raw = handle.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError:
        raise ValueError(f"{what} {text!r} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"{text}: a folder, not a JSON file") from None
    except OSError as err:
        raise ValueError(f"{text}: cannot be read ({err.strerror})") from None
    if text.endswith(".gz"):
        raw = _gunzip(raw, text)
    if len(raw) > MAX_JSON_BYTES:
        raise ValueError(
            f"{text}: over {MAX_JSON_BYTES // 2**20} MiB, far more than any "
            "calibration or run; not read"
        )
    try:
        return json.loads(raw.decode("utf-8"), parse_int=_json_int)
    except UnicodeDecodeError as err:
        raise ValueError(
            f"{text}: not UTF-8 (byte {raw[err.start]:#04x} at offset {err.start})"
        ) from None
    except RecursionError:
        raise ValueError(f"{text}: nests arrays or objects too deeply to read") from None
    except ValueError as err:  # json.JSONDecodeError, or _json_int's refusal
        raise ValueError(f"{text}: not readable JSON ({err})") from None


def _gunzip(raw: bytes, text: str) -> bytes:
    """``raw`` (a gzip file's bytes) decompressed, at most :data:`MAX_JSON_BYTES` + 1 of them
    (what is over is refused by the caller, never inflated in full)."""
    import gzip
    import io
    import zlib

    try:
        with gzip.GzipFile(fileobj=io.BytesIO(raw)) as unzipped:
            return unzipped.read(MAX_JSON_BYTES + 1)
    except (OSError, EOFError, zlib.error) as err:
        raise ValueError(f"{text}: not a readable gzip file ({err})") from None


def _json_int(digits: str) -> int:
    value = int(digits)
    try:
        float(value)
    except OverflowError:
        raise ValueError(f"an integer of {len(digits)} digits is too large for a number") from None
    return value


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def json_number(value: float) -> float | str | None:
    """``value`` as strict JSON: itself when finite, "inf" / "-inf" when infinite, null for NaN.
    The one convention of every document the package writes."""
    if math.isnan(value):
        return None
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def number_from_json(value: Any, field: str, *, null: float | None = None) -> float:
    """A number written by :func:`json_number` (or by Python's ``json``: ``Infinity``), as a
    float. ``null`` is what a JSON null stands for: documents written before the one convention
    (capacity and fidelity results) wrote an infinite value as null, so their readers pass
    ``null=math.inf``; elsewhere a null is NaN only if ``null`` says so.

    Raises:
        ValueError: naming ``field``, for anything but a number, "inf", "-inf" (or null when
            ``null`` is given).
    """
    if value is None and null is not None:
        return null
    if value in ("inf", "-inf"):
        return math.inf if value == "inf" else -math.inf
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f'{field} must be a number, "inf" or "-inf", got {value!r}')
    return float(value)


def json_safe(value: Any, field: str = "value") -> Any:
    """``value`` as strict JSON: NaN becomes null, infinities the strings "inf" / "-inf",
    tuples lists. Anything else that JSON cannot hold is a ValueError naming ``field``."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return json_number(value)
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


# --- numbers as a person writes them -------------------------------------------------------------
# int() and float() also take "1_000", surrounding blanks and the digits of every script
# ("١٢"); a number we read from a command line, an SLO or a trace is plain ASCII.

_ASCII_INT = re.compile(r"[+-]?[0-9]+", re.ASCII)
_ASCII_FLOAT = re.compile(
    r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|[+-]?(?:inf|infinity|nan)",
    re.ASCII | re.IGNORECASE,
)


def ascii_int(text: str) -> int:
    """``text`` as an integer written in ASCII digits with an optional sign.

    Raises:
        ValueError: for anything else (``1_000``, ``١٢``, ``1.0``, blanks around it).
    """
    if not isinstance(text, str) or not _ASCII_INT.fullmatch(text):
        raise ValueError(f"not an integer in ASCII digits: {text!r}")
    return int(text)


def ascii_float(text: str) -> float:
    """``text`` as a number written in ASCII (digits, a point, an exponent; ``inf``/``nan`` are
    read and left to the caller's range check).

    Raises:
        ValueError: for anything else (``1_000``, ``١٢``, blanks around it).
    """
    if not isinstance(text, str) or not _ASCII_FLOAT.fullmatch(text):
        raise ValueError(f"not a number in ASCII digits: {text!r}")
    return float(text)
