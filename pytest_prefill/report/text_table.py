"""The one layout of the report layer's text tables: the first column left, the others right
(numbers line up), cells printed as given (tabulate parses no numbers)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tabulate import tabulate


def text_table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    return tabulate(
        rows,
        headers=headers,
        tablefmt="simple",
        disable_numparse=True,
        colalign=("left",) + ("right",) * (len(headers) - 1),
    )
