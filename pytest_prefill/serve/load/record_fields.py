"""Reading back what a run against a server wrote (a request's record, a run's settings): each
field checked, a ValueError naming where it sits (``probes[0].records[3].chunk_times[1]: must
be ...``). ``verify.fields`` reads the verify document around them; it sits above this layer.
Standard library only."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# Tokens one request may count, read back: beyond any model's context window (a larger count
# read from a document is a broken one, and would be expanded token by token).
MAX_RECORD_TOKENS = 10_000_000

_REQUIRED: Any = object()


class RecordFields:
    """One object's fields read at ``where``: each a ValueError naming it when missing, of the
    wrong type or out of range."""

    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        self.data, self.where = data, where

    def fail(self, key: str, what: str, value: Any) -> ValueError:
        return ValueError(f"{self.where}.{key}: must be {what}, got {value!r:.60}")

    def get(self, key: str, value: Any = _REQUIRED) -> Any:
        if value is not _REQUIRED:
            return value
        if key not in self.data:
            raise ValueError(f"{self.where}: missing {key!r}")
        return self.data[key]

    def time(self, key: str, value: Any = _REQUIRED) -> float:
        """Seconds since the run started: a finite number, at least 0."""
        value = self.get(key, value)
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not (ok and math.isfinite(value) and value >= 0):
            raise self.fail(key, "a finite number of seconds, at least 0", value)
        return float(value)

    def count(self, key: str, value: Any = _REQUIRED, least: int = 0) -> int:
        """A count of tokens: an integer from ``least`` to :data:`MAX_RECORD_TOKENS`."""
        value = self.get(key, value)
        ok = isinstance(value, int) and not isinstance(value, bool)
        if not (ok and least <= value <= MAX_RECORD_TOKENS):
            raise self.fail(
                key, f"an integer, at least {least} and at most {MAX_RECORD_TOKENS:,}", value
            )
        return int(value)

    def seq(self, key: str) -> list[Any]:
        value = self.data.get(key, [])
        if not isinstance(value, list) or len(value) > MAX_RECORD_TOKENS:
            raise self.fail(key, f"a list of at most {MAX_RECORD_TOKENS:,} items", value)
        return value

    def text(self, key: str, value: Any = _REQUIRED) -> str:
        value = self.get(key, value)
        if not isinstance(value, str):
            raise self.fail(key, "a string", value)
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, "true or false", value)
        return value

    def mapping(self, key: str, value: Any = _REQUIRED) -> dict[str, Any]:
        value = self.get(key, value)
        if not isinstance(value, Mapping):
            raise self.fail(key, "an object", value)
        return dict(value)

    def optional(self, key: str, read: Any) -> Any:
        """``read(key, value)``, or None where ``key`` is absent or null."""
        value = self.data.get(key)
        return None if value is None else read(key, value)
