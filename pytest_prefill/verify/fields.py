"""Reading a verify document back: each object read field by field, a missing or mistyped field
a ValueError naming where it sits (``flag_sets[1].measured.probes[0]: rate must be a number``).
Numbers follow the one convention of the package's documents (``_io.json_number``: "inf",
"-inf", and null for NaN). Standard library only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from pytest_prefill._io import number_from_json

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_REQUIRED: Any = object()
_Record = TypeVar("_Record", bound="DataclassInstance")
_Value = TypeVar("_Value")


def written(record: Any, **derived: Any) -> dict[str, Any]:
    """A dataclass record as a document: its fields, and beside them the values derived from
    them that a reader wants at hand (:meth:`Fields.values_of` reads the fields back and
    ignores the rest)."""
    return {**dataclasses.asdict(record), **derived}


class Fields:
    """One object of a document at ``where``.

    Raises:
        ValueError: naming ``where``, when ``data`` is not an object.
    """

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: must be an object, got {type(data).__name__}")
        self.data, self.where = data, where

    def _get(self, key: str, default: Any) -> Any:
        if key in self.data:
            return self.data[key]
        if default is _REQUIRED:
            raise ValueError(f"{self.where}: missing {key!r}")
        return default

    def fail(self, key: str, what: str, value: Any) -> ValueError:
        return ValueError(f"{self.where}.{key}: must be {what}, got {value!r:.60}")

    def number(self, key: str, default: Any = _REQUIRED) -> float:
        """A number; null is NaN (how NaN is written)."""
        value = self._get(key, default)
        if value is None:
            return math.nan
        try:
            return number_from_json(value, f"{self.where}.{key}")
        except ValueError:
            raise self.fail(key, 'a number, "inf" or "-inf"', value) from None

    def _typed(self, key: str, default: Any, kind: type[_Value], what: str) -> _Value:
        """The value under ``key`` when it is a ``kind`` (true and false are not integers); a
        ValueError saying ``what`` it must be."""
        value = self._get(key, default)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise self.fail(key, what, value)
        return value

    def optional(self, key: str, read: Callable[[str], _Value]) -> _Value | None:
        """``read(key)``, or None where ``key`` is absent or null."""
        return None if self._get(key, None) is None else read(key)

    def integer(self, key: str, default: Any = _REQUIRED) -> int:
        return self._typed(key, default, int, "an integer")

    def optional_integer(self, key: str) -> int | None:
        return self.optional(key, self.integer)

    def text(self, key: str, default: Any = _REQUIRED) -> str:
        return self._typed(key, default, str, "a string")

    def optional_text(self, key: str) -> str | None:
        return self.optional(key, self.text)

    def flag(self, key: str, default: Any = _REQUIRED) -> bool:
        return self._typed(key, default, bool, "true or false")

    def child(self, key: str) -> Fields | None:
        """The object under ``key`` (None: absent or null)."""
        value = self._get(key, None)
        return None if value is None else Fields(value, f"{self.where}.{key}")

    def raw(self, key: str, default: Any = None) -> Any:
        """The value under ``key`` as written (JSON data kept as it is)."""
        return self._get(key, default)

    def items(self, key: str) -> list[Any]:
        """The list under ``key`` (empty: absent or null)."""
        value = self._get(key, None)
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(key, "a list", value)
        return value

    def children(self, key: str) -> list[Fields | None]:
        """Each object of the list under ``key`` (None where an item is null)."""
        return [
            None if item is None else Fields(item, f"{self.where}.{key}[{i}]")
            for i, item in enumerate(self.items(key))
        ]

    def numbers(self, key: str) -> tuple[float, ...]:
        """The list of numbers under ``key`` (null: NaN)."""
        return tuple(
            Fields({f"{key}[{i}]": item}, self.where).number(f"{key}[{i}]")
            for i, item in enumerate(self.items(key))
        )

    def values_of(self, cls: type[_Record]) -> _Record:
        """An instance of the dataclass ``cls`` with each field read by its type (``float``,
        ``int``, ``bool``, ``str``, ``str | None``, ``int | None``); a field with a default
        takes it where the document lacks it."""
        readers = {
            "float": self.number,
            "int": self.integer,
            "bool": self.flag,
            "str": self.text,
        }
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            kind = str(field.type)
            if kind.endswith(" | None"):
                values[field.name] = self.optional(
                    field.name, readers[kind.removesuffix(" | None")]
                )
                continue
            default = field.default if field.default is not dataclasses.MISSING else _REQUIRED
            values[field.name] = readers[kind](field.name, default)
        record: _Record = self.build(cls, **values)
        return record

    def build(self, make: Any, *args: Any, **kwargs: Any) -> Any:
        """``make(*args, **kwargs)``, its ValueError (or TypeError: a field it does not take)
        prefixed with where this object sits."""
        try:
            return make(*args, **kwargs)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{self.where}: {err}") from None
