"""argparse value types shared by the subcommands: a bad value is a usage error that says
what is allowed."""

from __future__ import annotations

import argparse
import math


def _number(text: str, kind: type, allowed: str) -> float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}") from None


def positive_int(text: str) -> int:
    value = int(_number(text, int, "a positive integer"))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = int(_number(text, int, "an integer >= 0"))
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text, float, "a finite number >= 0")
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value
