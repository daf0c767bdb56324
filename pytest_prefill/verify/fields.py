"""Reading a verify document back: each object read field by field, a missing or mistyped field
a ValueError naming where it sits (``flag_sets[1].measured.probes[0]: rate must be a number``).
Numbers follow the one convention of the package's documents (``_io.json_number``: "inf",
"-inf", and null for NaN). Standard library only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from pytest_prefill._io import number_from_json

_REQUIRED: Any = object()


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

    def integer(self, key: str, default: Any = _REQUIRED) -> int:
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, "an integer", value)
        return value

    def optional_integer(self, key: str) -> int | None:
        value = self._get(key, None)
        return None if value is None else self.integer(key)

    def text(self, key: str, default: Any = _REQUIRED) -> str:
        value = self._get(key, default)
        if not isinstance(value, str):
            raise self.fail(key, "a string", value)
        return value

    def optional_text(self, key: str) -> str | None:
        value = self._get(key, None)
        return None if value is None else self.text(key)

    def flag(self, key: str, default: Any = _REQUIRED) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self.fail(key, "true or false", value)
        return value

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

    def values_of(self, cls: Any) -> Any:
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
                value = self._get(field.name, None)
                read = readers[kind.removesuffix(" | None")]
                values[field.name] = None if value is None else read(field.name)
                continue
            default = field.default if field.default is not dataclasses.MISSING else _REQUIRED
            values[field.name] = readers[kind](field.name, default)
        return self.build(cls, **values)

    def build(self, make: Any, *args: Any, **kwargs: Any) -> Any:
        """``make(*args, **kwargs)``, its ValueError (or TypeError: a field it does not take)
        prefixed with where this object sits."""
        try:
            return make(*args, **kwargs)
        except (ValueError, TypeError) as err:
            raise ValueError(f"{self.where}: {err}") from None
