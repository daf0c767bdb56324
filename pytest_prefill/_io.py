"""Atomic file writes: a reader never sees half a file, and Ctrl-C leaves nothing behind."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def write_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".part", dir=folder)
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a result is for others too
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> None:
    """``data`` as indented, strict JSON (NaN and infinities are refused), written atomically."""
    write_atomic(path, json.dumps(data, indent=2, sort_keys=False, allow_nan=False) + "\n")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
