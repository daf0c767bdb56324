"""What the HTTP client speaks in: its errors, its time bounds (:class:`Timeouts`), a server's
address (:class:`Url`) and JSON read with bounded nesting. Standard library only."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import urllib.parse
from typing import Any

# JSON nested deeper than this (a model list, a streamed event) is refused: no server's answer
# nests more than a few levels, and reading 10^5 levels overflows Python's stack.
MAX_JSON_DEPTH = 64
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_STALL_TIMEOUT = 60.0
DEFAULT_HEADER_TIMEOUT = 30.0
DEFAULT_READ_TIMEOUT = 60.0
DEFAULT_REQUEST_TIMEOUT = 600.0


class ServerError(Exception):
    """A server could not be reached, stalled, or answered with something unusable."""


class NestingError(ValueError):
    """JSON nested deeper than :data:`MAX_JSON_DEPTH`."""


def _positive(field: str, value: Any) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    if not (ok and math.isfinite(value) and value > 0):
        raise ValueError(f"{field} must be a positive number of seconds, got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds: ``connect``; ``stall``, of silence mid-response before giving up (a stalled
    server, or one that queues the request that long); ``header``, from a response's first byte
    to the end of its headers; ``read``, from the first byte to the end of a response that is
    not a stream (a model list, ``/tokenize``); ``request``, from sending a request to the end
    of its response, a stream's included (one that never ends, a byte at a time)."""

    connect: float = DEFAULT_CONNECT_TIMEOUT
    stall: float = DEFAULT_STALL_TIMEOUT
    header: float = DEFAULT_HEADER_TIMEOUT
    read: float = DEFAULT_READ_TIMEOUT
    request: float = DEFAULT_REQUEST_TIMEOUT

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            _positive(f"{field.name} timeout", getattr(self, field.name))


DEFAULT_TIMEOUTS = Timeouts()


@dataclasses.dataclass(frozen=True, slots=True)
class Url:
    """A parsed ``http://`` or ``https://`` base URL (path without the trailing slash)."""

    scheme: str
    host: str
    port: int
    path: str

    @classmethod
    def parse(cls, text: str) -> Url:
        """Raises: ValueError naming the URL, for anything but an http(s) URL with a host."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"url must be like http://127.0.0.1:8000, got {text!r}")
        parts = urllib.parse.urlsplit(text.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"url must be like http://127.0.0.1:8000, got {text!r}")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ValueError(f"url {text!r}: the port is not a number in 0..65535") from None
        return cls(parts.scheme, parts.hostname, port, parts.path.rstrip("/"))

    def join(self, path: str) -> str:
        """The request target for ``path`` under this URL's own path."""
        return f"{self.path}/{path.lstrip('/')}"

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}{self.path}"


_JSON_NESTING = re.compile(r'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]')


def json_depth_over(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON ``text`` nests arrays and objects deeper than ``limit`` (brackets in
    strings do not count). Stops reading at the first level past ``limit``."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for match in _JSON_NESTING.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            if depth > limit:
                return True
        elif token in "]}":
            depth -= 1
    return False


def loads(text: str | bytes, what: str) -> Any:
    """``json.loads`` of a server's answer, refusing JSON nested deeper than
    :data:`MAX_JSON_DEPTH`.

    Raises:
        ValueError: naming ``what``, for text that is not JSON; :class:`NestingError` (a
            ValueError) for JSON that nests too deeply.
    """
    if isinstance(text, (bytes, bytearray)):
        text = text.decode("utf-8", "replace")
    if json_depth_over(text):
        raise NestingError(f"{what} nests arrays or objects deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(text)
    except RecursionError:  # not reached after the check above; kept as the last line of defence
        raise NestingError(f"{what} nests arrays or objects too deeply to read") from None
