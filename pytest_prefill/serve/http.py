"""A small asyncio HTTP/1.1 client for streaming LLM servers. Standard library only.

Why this and not aiohttp or httpx: one connection per request with ``Connection: close``
(llama.cpp's server closes kept-alive connections, a pool then fails with "Server disconnected";
and a pooled connection's teardown would land inside the next request's timing), no dependency,
and the least work between a byte's arrival and its timestamp. Each connection is an asyncio
``Protocol`` whose ``data_received`` only stamps the bytes with ``time.perf_counter()`` (the
client's monotonic clock) and keeps them; the HTTP framing (chunked or close-delimited) and the
Server-Sent Events are parsed once the response is complete. So with hundreds of streams, a
token is stamped when the event loop first sees its bytes, not after every other stream's JSON
has been parsed (``reference`` measures the error that is left).

Failures are :class:`ServerError` with one line that says what happened and where: a refused or
unreachable connection (within the connect timeout), a server silent for the stall timeout
mid-response, a status that is not 2xx, a body that is not what was asked for."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import ssl
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

MAX_HEADER_BYTES = 64 * 1024
MAX_BODY_BYTES = 64 * 2**20
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_STALL_TIMEOUT = 60.0
_ENDS = (b"data: [DONE]\n\n", b"data: [DONE]\r\n\r\n", b"\r\n0\r\n\r\n")


class ServerError(Exception):
    """A server could not be reached, stalled, or answered with something unusable."""


def _positive(field: str, value: Any) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float))
    if not (ok and math.isfinite(value) and value > 0):
        raise ValueError(f"{field} must be a positive number of seconds, got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds: to connect; of silence mid-response before giving up (a stalled server)."""

    connect: float = DEFAULT_CONNECT_TIMEOUT
    stall: float = DEFAULT_STALL_TIMEOUT

    def __post_init__(self) -> None:
        _positive("connect timeout", self.connect)
        _positive("stall timeout", self.stall)


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


@dataclasses.dataclass(frozen=True, slots=True)
class StreamEvent:
    """One Server-Sent Event's data, and when the bytes that completed it arrived."""

    time: float
    data: str


class _Exchange(asyncio.Protocol):
    """One request and its response on a connection of its own: every piece of the response
    with its arrival time."""

    def __init__(self, request: bytes, where: str, stall: float) -> None:
        self.request, self.where, self.stall = request, where, stall
        self.pieces: list[tuple[float, bytes]] = []
        self.size = 0
        self.sent = math.nan
        self.last = time.perf_counter()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.sent = self.last = time.perf_counter()
        transport.write(self.request)
        self._arm(self.stall)

    def data_received(self, data: bytes) -> None:
        self.last = now = time.perf_counter()
        self.pieces.append((now, data))
        self.size += len(data)
        if self.size > MAX_BODY_BYTES:
            self._fail(f"{self.where}: response over {MAX_BODY_BYTES} bytes")
        elif data.endswith(_ENDS) and self.transport is not None:
            self.transport.close()  # the stream is complete: don't wait for the server to close

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if not self.done.done():
            if exc is not None:
                reason = getattr(exc, "strerror", None) or exc
                self.done.set_exception(ServerError(f"{self.where}: connection lost ({reason})"))
            else:
                self.done.set_result(None)

    def _arm(self, delay: float) -> None:
        self.timer = asyncio.get_running_loop().call_later(delay, self._check)

    def _check(self) -> None:
        # one timer per stall interval, not one per read: a read costs only a timestamp
        silent = time.perf_counter() - self.last
        if silent < self.stall:
            self._arm(self.stall - silent)
            return
        self._fail(
            f"{self.where}: the server sent nothing for {self.stall:g} s mid-response "
            "(stalled; raise the stall timeout if it is only slow)"
        )

    def _fail(self, message: str) -> None:
        if not self.done.done():
            self.done.set_exception(ServerError(message))
        if self.transport is not None:
            self.transport.abort()


@dataclasses.dataclass(frozen=True)
class Response:
    """A complete response: status, headers (lower-case names), and the body's pieces with
    their arrival times (de-chunked). ``sent`` is when the request was written."""

    status: int
    headers: Mapping[str, str]
    body: tuple[tuple[float, bytes], ...]
    sent: float

    def content(self) -> bytes:
        return b"".join(data for _, data in self.body)

    def json(self) -> Any:
        try:
            return json.loads(self.content())
        except ValueError:
            return None

    def text(self, limit: int = 200) -> str:
        text = self.content().decode("utf-8", "replace").strip().replace("\n", " ")
        return text[:limit] + ("…" if len(text) > limit else "")

    def events(self) -> list[StreamEvent]:
        """The Server-Sent Events' data lines, each stamped with the arrival of the piece that
        completed it (``[DONE]`` ends them and is not included)."""
        out: list[StreamEvent] = []
        pending = b""
        for now, data in self.body:
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.startswith(b"data:"):
                    value = line[5:].strip().decode("utf-8", "replace")
                    if value == "[DONE]":
                        return out
                    out.append(StreamEvent(now, value))
        return out


def _request_bytes(
    url: Url, method: str, path: str, body: bytes | None, headers: Mapping[str, str]
) -> bytes:
    lines = [
        f"{method} {url.join(path)} HTTP/1.1",
        f"Host: {url.host}:{url.port}",
        "Connection: close",
        "User-Agent: pytest-prefill",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    if body is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


def _split_head(exchange: _Exchange) -> tuple[int, dict[str, str], list[tuple[float, bytes]]]:
    raw = b""
    for i, (now, data) in enumerate(exchange.pieces):
        raw += data
        head, sep, rest = raw.partition(b"\r\n\r\n")
        if sep:
            body = ([(now, rest)] if rest else []) + exchange.pieces[i + 1 :]
            break
        if len(raw) > MAX_HEADER_BYTES:
            raise ServerError(f"{exchange.where}: response headers over {MAX_HEADER_BYTES} bytes")
    else:
        raise ServerError(f"{exchange.where}: the connection closed before a whole response")
    status, *fields = head.decode("latin-1").split("\r\n")
    parts = status.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ServerError(f"{exchange.where}: not an HTTP response ({status[:60]!r})")
    headers = {}
    for field in fields:
        name, _, value = field.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers, body


def _dechunk(where: str, body: list[tuple[float, bytes]]) -> list[tuple[float, bytes]]:
    """The payload of a chunked body, each payload piece stamped with the arrival of the piece
    that completed it."""
    out: list[tuple[float, bytes]] = []
    pending = b""
    size: int | None = None
    for now, data in body:
        pending += data
        piece = b""
        while True:
            if size is None:
                line, sep, rest = pending.partition(b"\r\n")
                if not sep:
                    break
                try:
                    size = int(line.split(b";")[0].strip() or b"x", 16)
                except ValueError:
                    raise ServerError(f"{where}: bad chunk size {line[:20]!r}") from None
                pending = rest
                if size == 0:
                    return out + ([(now, piece)] if piece else [])
            if len(pending) < size + 2:
                break
            piece += pending[:size]
            pending = pending[size + 2 :]
            size = None
        if piece:
            out.append((now, piece))
    raise ServerError(f"{where}: the connection closed mid-body")


async def exchange(
    url: Url,
    method: str,
    path: str,
    payload: Any = None,
    *,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """Send one request on a fresh connection and return the whole response.

    Raises:
        ServerError: when the server cannot be reached, stalls, or does not speak HTTP.
    """
    body = None if payload is None else json.dumps(payload).encode()
    where = f"{method} {url}{path}"
    request = _request_bytes(url, method, path, body, headers or {})
    loop = asyncio.get_running_loop()
    context = ssl.create_default_context() if url.scheme == "https" else None
    try:
        transport, protocol = await asyncio.wait_for(
            loop.create_connection(
                lambda: _Exchange(request, where, timeouts.stall), url.host, url.port, ssl=context
            ),
            timeouts.connect,
        )
    except asyncio.TimeoutError:
        raise ServerError(
            f"{url}: no connection within {timeouts.connect:g} s (is the server up?)"
        ) from None
    except OSError as err:
        raise ServerError(f"{url}: cannot connect ({err.strerror or err})") from None
    try:
        await protocol.done
    finally:
        transport.abort()  # a no-op once the connection is closed; else nothing half-read stays
    status, fields, rest = _split_head(protocol)
    if "chunked" in fields.get("transfer-encoding", "").lower():
        rest = _dechunk(where, rest)
    return Response(status, fields, tuple(rest), protocol.sent)


async def request_json(
    url: Url,
    method: str,
    path: str,
    payload: Any = None,
    *,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    headers: Mapping[str, str] | None = None,
) -> tuple[int, Any]:
    """``(status, parsed JSON body)`` of one request (the body is None when it is not JSON).

    Raises:
        ServerError: when the server cannot be reached, stalls, or does not speak HTTP.
    """
    response = await exchange(url, method, path, payload, timeouts=timeouts, headers=headers)
    return response.status, response.json()


async def stream_events(
    url: Url,
    path: str,
    payload: Any,
    *,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    headers: Mapping[str, str] | None = None,
) -> tuple[float, list[StreamEvent]]:
    """POST ``payload`` to ``path``; when the stream is over, ``(the time the request was
    written, its Server-Sent Events)``.

    Raises:
        ServerError: for an unreachable server, a status that is not 2xx (with the server's
            message), a body that is not an event stream, or silence longer than the stall
            timeout.
    """
    response = await exchange(url, "POST", path, payload, timeouts=timeouts, headers=headers)
    where = f"POST {url}{path}"
    if not 200 <= response.status < 300:
        raise ServerError(f"{where}: HTTP {response.status}: {response.text()}")
    kind = response.headers.get("content-type", "")
    if "text/event-stream" not in kind:
        raise ServerError(
            f"{where}: expected an event stream, got {kind or 'no content type'}: {response.text()}"
        )
    return response.sent, response.events()
