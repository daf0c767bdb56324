"""Command-line options whose help states their default, read from the value itself so the two
cannot drift apart."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def add_defaulted(
    group: argparse._ActionsContainer,
    flag: str,
    kind: Callable[[str], Any],
    default: object,
    text: str,
    metavar: str | None = None,
) -> None:
    """``flag``, parsed by ``kind`` and ``default`` when not given, with the help ``text``
    whose ``{default}`` (a format field) states that default: the help cannot drift from it."""
    group.add_argument(
        flag, type=kind, default=default, metavar=metavar, help=text.format(default=default)
    )
