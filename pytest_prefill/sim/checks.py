"""The input checks every entry point shares: a number, a whole count, an optional cap. Each
raises ValueError naming the field and what is allowed."""

from __future__ import annotations

import math
from typing import Any


def check_number(
    field: str, value: Any, *, positive: bool = False, allow_inf: bool = False
) -> float:
    """Return ``value`` as a float, or raise ValueError naming ``field`` and what is allowed.

    The one number check of the package: rejects bools, non-numbers, NaN, negative values (and
    0 when ``positive``), infinity unless ``allow_inf``, and ints too large for a float."""
    allowed = "a positive number" if positive else "a finite number >= 0"
    if allow_inf:
        allowed += " (inf allowed)"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field} must be {allowed}, got {value!r}")
    try:
        value = float(value)
    except OverflowError:  # an int beyond the float range
        raise ValueError(
            f"{field} must be {allowed}, got an integer of {len(str(value))} digits"
        ) from None
    if math.isnan(value) or (math.isinf(value) and not (allow_inf and value > 0)):
        raise ValueError(f"{field} must be {allowed}, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{field} must be {allowed}, got {value!r}")
    return value


def check_int(field: str, value: Any, *, minimum: int = 1) -> int:
    """Return ``value`` if it is an int >= ``minimum``, else raise ValueError naming ``field``
    (the one integer check of the package)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{field} must be an integer >= {minimum}, got {value!r}")
    return value


def check_whole_or_inf(field: str, value: Any) -> float:
    """Return ``value`` as a float if it is a whole number >= 1 or inf (a chunk, a capacity),
    else raise ValueError naming ``field``."""
    whole = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1
    if not (value == math.inf or (whole and value == int(value))):
        raise ValueError(f"{field} must be a whole number of tokens >= 1 or inf, got {value!r}")
    return float(value)


def check_cap(field: str, value: Any) -> int | None:
    """Return ``value`` if it is None (no cap) or an int >= 1, else raise ValueError naming
    ``field`` (the engine knobs ``max_batched_tokens`` and ``max_seqs``)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{field} must be None (no cap) or an integer >= 1, got {value!r}")
    return value
