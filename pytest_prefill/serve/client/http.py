"""A small asyncio HTTP/1.1 client for streaming LLM servers. Standard library only.

Why this and not aiohttp or httpx: one connection per request with ``Connection: close``
(llama.cpp's server closes kept-alive connections, a pool then fails with "Server disconnected";
and a pooled connection's teardown would land inside the next request's timing), no dependency,
and the least work between a byte's arrival and its timestamp. Each connection is an asyncio
``Protocol`` whose ``data_received`` only stamps the bytes with ``time.perf_counter()`` (the
client's monotonic clock) and keeps them; the HTTP framing (chunked or close-delimited) and the
Server-Sent Events are parsed once the response is complete, in one pass each (linear in the
bytes, however small the pieces they came in). So with hundreds of streams, a token is stamped
when the event loop first sees its bytes, not after every other stream's JSON has been parsed
(``reference`` measures the error that is left).

Every response is bounded (see "Bad input and faults" in ``docs/faults.md``): the bytes of a
connection, framing and the bookkeeping of each read included (:data:`MAX_RESPONSE_BYTES`), the
headers' size, the nesting of JSON (:data:`MAX_JSON_DEPTH`), and the time (:class:`Timeouts`:
to connect, of silence, to read the headers, to read a body that is not a stream, and a
request's total).

Failures are :class:`ServerError` with one line that says what happened and where: a refused or
unreachable connection (within the connect timeout), a server silent for the stall timeout
mid-response, a bound crossed, a status that is not 2xx, a body that is not what was asked
for."""

from __future__ import annotations

import array
import asyncio
import dataclasses
import json
import math
import re
import ssl
import time
from collections.abc import Iterator, Mapping
from typing import Any

from pytest_prefill.serve.client.wire import (
    DEFAULT_TIMEOUTS,
    NestingError,
    ServerError,
    Timeouts,
    Url,
    loads,
)

MAX_HEADER_BYTES = 64 * 1024
# Bytes a connection may receive in all, the HTTP framing included; each read's arrival time is
# charged STAMP_BYTES against it too (its cost in memory), so a server that sends one byte per
# TCP segment reaches the bound sooner instead of costing ~100 bytes of memory per byte.
MAX_RESPONSE_BYTES = 64 * 2**20
STAMP_BYTES = 16
_ENDS = (b"data: [DONE]\n\n", b"data: [DONE]\r\n\r\n", b"\r\n0\r\n\r\n")
_CHUNK_LINE = 1024  # a chunk-size line longer than this is not one
# HTTP chunks in one response: a stream sends one per event (a token or a few), a model list a
# handful; a million is far past both. Parsing costs ~2-4 us a chunk, so the bound holds a
# response in 1-byte chunks (legal, and 64 MiB of it is 11 million) to a few seconds.
MAX_CHUNKS = 1_000_000


@dataclasses.dataclass(frozen=True, slots=True)
class StreamEvent:
    """One Server-Sent Event's data, and when the bytes that completed it arrived."""

    time: float
    data: str


class _Exchange(asyncio.Protocol):
    """One request and its response on a connection of its own: the bytes received, and when
    each read ended (its offset in the bytes and its time)."""

    def __init__(self, request: bytes, where: str, timeouts: Timeouts, streamed: bool) -> None:
        self.request, self.where, self.timeouts, self.streamed = request, where, timeouts, streamed
        self.received = bytearray()
        self.ends = array.array("q")
        self.times = array.array("d")
        self.head_end: int | None = None  # where the body starts, once the headers are whole
        self.sent = math.nan
        self.first: float | None = None
        self.last = time.perf_counter()
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.sent = self.last = time.perf_counter()
        transport.write(self.request)
        self._arm(min(self.timeouts.stall, self.timeouts.request))

    def data_received(self, data: bytes) -> None:
        self.last = now = time.perf_counter()
        if self.first is None:
            self.first = now
            if self.timer is not None:  # the header and read bounds start now
                self.timer.cancel()
            self._check()
        before = len(self.received)
        self.received += data
        self.ends.append(len(self.received))
        self.times.append(now)
        if len(self.received) + STAMP_BYTES * len(self.ends) > MAX_RESPONSE_BYTES:
            self._fail(
                f"{self.where}: response over {MAX_RESPONSE_BYTES:,} bytes (bytes received, "
                f"framing included, and {STAMP_BYTES} bytes per network read)"
            )
        elif self.head_end is None:
            self._find_head(before)
        elif self.received.endswith(_ENDS) and self.transport is not None:
            self.transport.close()  # the stream is complete: don't wait for the server to close

    def _find_head(self, before: int) -> None:
        at = self.received.find(b"\r\n\r\n", max(0, before - 3), MAX_HEADER_BYTES + 4)
        if at >= 0:
            self.head_end = at + 4
            if self.received.endswith(_ENDS) and self.transport is not None:
                self.transport.close()
        elif len(self.received) > MAX_HEADER_BYTES:
            self._fail(f"{self.where}: response headers over {MAX_HEADER_BYTES} bytes")

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
        self.timer = asyncio.get_running_loop().call_later(max(delay, 1e-3), self._check)

    def _bounds(self, now: float) -> list[tuple[float, str]]:
        """(seconds left, what crossing it means) for each time bound that applies now."""
        t = self.timeouts
        bounds = [
            (
                t.stall - (now - self.last),
                f"the server sent nothing for {t.stall:g} s mid-response (stalled; raise the "
                "stall timeout, --stall-timeout, if it is only slow)",
            ),
            (
                t.request - (now - self.sent),
                f"the request took over {t.request:g} s in all (a response that does not end; "
                "raise the request timeout, --request-timeout, if it is only long)",
            ),
        ]
        if self.first is not None and self.head_end is None:
            bounds.append(
                (
                    t.header - (now - self.first),
                    f"the response headers took over {t.header:g} s to arrive (the header timeout)",
                )
            )
        if self.first is not None and not self.streamed:
            bounds.append(
                (
                    t.read - (now - self.first),
                    f"the response took over {t.read:g} s to read (the read timeout)",
                )
            )
        return bounds

    def _check(self) -> None:
        # one timer at a time, not one per read: a read costs only a timestamp
        bounds = self._bounds(time.perf_counter())
        left, reason = min(bounds)
        if left > 0:
            self._arm(left)
        else:
            self._fail(f"{self.where}: {reason}")

    def _fail(self, message: str) -> None:
        if not self.done.done():
            self.done.set_exception(ServerError(message))
        if self.transport is not None:
            self.transport.abort()


@dataclasses.dataclass(frozen=True)
class Response:
    """A complete response: status, headers (lower-case names), and the body (de-chunked), with
    ``ends`` and ``times``: the body's first ``ends[i]`` bytes had arrived at ``times[i]``.
    ``sent`` is when the request was written."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    ends: array.array[int]
    times: array.array[float]
    sent: float
    where: str = ""

    def content(self) -> bytes:
        return self.body

    def json(self) -> Any:
        """The body as JSON; None when it is not JSON.

        Raises:
            ServerError: for JSON nested deeper than :data:`MAX_JSON_DEPTH`.
        """
        try:
            return loads(self.body, f"{self.where}: the response")
        except NestingError as err:
            raise ServerError(str(err)) from None
        except ValueError:
            return None

    def text(self, limit: int = 200) -> str:
        text = self.body[: 4 * limit].decode("utf-8", "replace").strip().replace("\n", " ")
        return text[:limit] + ("…" if len(text) > limit else "")

    def events(self) -> Iterator[StreamEvent]:
        """The Server-Sent Events' data lines, each stamped with the arrival of the bytes that
        completed it (``[DONE]`` ends them and is not included)."""
        body, ends, times = self.body, self.ends, self.times
        start, piece = 0, 0
        while True:
            stop = body.find(b"\n", start)
            if stop < 0:
                return
            if body.startswith(b"data:", start, stop):
                value = body[start + 5 : stop].strip().decode("utf-8", "replace")
                if value == "[DONE]":
                    return
                while piece < len(ends) - 1 and ends[piece] <= stop:
                    piece += 1
                yield StreamEvent(times[piece], value)
            start = stop + 1


def _request_bytes(
    url: Url, method: str, path: str, body: bytes | None, headers: Mapping[str, str]
) -> bytes:
    """Raises: ValueError naming the header, for one HTTP cannot carry (a character latin-1
    has not, a line break)."""
    for name, value in headers.items():
        try:
            f"{name}: {value}".encode("latin-1")
        except UnicodeEncodeError as err:
            raise ValueError(
                f"header {name}: character {err.object[err.start]!r} cannot be sent in an HTTP "
                "header (latin-1 only)"
            ) from None
        if any(c in f"{name}{value}" for c in "\r\n\0"):
            raise ValueError(f"header {name}: a line break or NUL cannot be sent in a header")
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


def _head(exchange: _Exchange) -> tuple[int, dict[str, str]]:
    if exchange.head_end is None:
        raise ServerError(f"{exchange.where}: the connection closed before a whole response")
    head = bytes(exchange.received[: exchange.head_end - 4])
    status, *fields = head.decode("latin-1").split("\r\n")
    parts = status.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ServerError(f"{exchange.where}: not an HTTP response ({status[:60]!r})")
    headers = {}
    for field in fields:
        name, _, value = field.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


_CHUNK_SIZE = re.compile(rb"[ \t]*([0-9A-Fa-f]{1,15})[ \t]*(?:;[^\r\n]*)?\r\n")


def _dechunk(exchange: _Exchange) -> tuple[bytes, array.array[int], array.array[float]]:
    """The payload of a chunked body, and when it arrived: each chunk's payload is stamped with
    the arrival of the bytes that completed the chunk. One pass over the bytes."""
    raw = exchange.received
    payload = bytearray()
    ends, times = array.array("q"), array.array("d")
    reads, times_of = exchange.ends, exchange.times
    at = exchange.head_end or 0
    piece, last = 0, len(reads) - 1
    with memoryview(raw) as view:  # slices of it are not copies: a 1-byte chunk costs no object
        for count in range(MAX_CHUNKS + 1):
            size_at = _chunk_size(exchange, at)
            if size_at is None:
                break
            if count == MAX_CHUNKS:
                raise ServerError(f"{exchange.where}: more than {MAX_CHUNKS:,} HTTP chunks")
            size, start = size_at
            at = start + size + 2
            if at > len(raw):
                raise ServerError(f"{exchange.where}: the connection closed mid-body")
            payload += view[start : start + size]
            if piece < last and reads[piece] < at:  # completed by a later read than the last
                while piece < last and reads[piece] < at:
                    piece += 1
                ends.append(len(payload))
                times.append(times_of[piece])
            elif ends:
                ends[-1] = len(payload)
            else:
                ends.append(len(payload))
                times.append(times_of[piece])
    return bytes(payload), ends, times


def _chunk_size(exchange: _Exchange, at: int) -> tuple[int, int] | None:
    """The size of the chunk whose size line starts at ``at``, and where its data starts; None
    for the last chunk (size 0)."""
    raw, where = exchange.received, exchange.where
    found = _CHUNK_SIZE.match(raw, at)
    if found is None:
        if raw.find(b"\r\n", at, at + _CHUNK_LINE) < 0 and len(raw) - at < _CHUNK_LINE:
            raise ServerError(f"{where}: the connection closed mid-body")
        raise ServerError(f"{where}: bad chunk size {bytes(raw[at : at + 20])!r}")
    size = int(found.group(1), 16)
    return None if size == 0 else (size, found.end())


def _body(
    exchange: _Exchange, length: str | None
) -> tuple[bytes, array.array[int], array.array[float]]:
    """A body delimited by the connection's close (or by ``length``, the Content-Length
    header), and when each read of it arrived.

    Raises:
        ServerError: when the connection closed before ``length`` bytes came.
    """
    start = exchange.head_end or 0
    body = bytes(exchange.received[start:])
    expected = int(length) if length is not None and length.strip().isdigit() else None
    if expected is not None and len(body) < expected:
        raise ServerError(
            f"{exchange.where}: the connection closed mid-body ({len(body):,} of "
            f"{expected:,} bytes)"
        )
    ends, times = array.array("q"), array.array("d")
    for end, when in zip(exchange.ends, exchange.times):
        if end > start:
            ends.append(end - start)
            times.append(when)
    return body, ends, times


async def exchange(
    url: Url,
    method: str,
    path: str,
    payload: Any = None,
    *,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    headers: Mapping[str, str] | None = None,
    streamed: bool = False,
) -> Response:
    """Send one request on a fresh connection and return the whole response (``streamed``: it
    is an event stream, bounded by the request timeout rather than the read timeout).

    Raises:
        ServerError: when the server cannot be reached, stalls, crosses a bound, or does not
            speak HTTP.
        ValueError: for a header HTTP cannot carry.
    """
    body = None if payload is None else json.dumps(payload).encode()
    where = f"{method} {url}{path}"
    request = _request_bytes(url, method, path, body, headers or {})
    loop = asyncio.get_running_loop()
    context = ssl.create_default_context() if url.scheme == "https" else None
    try:
        transport, protocol = await asyncio.wait_for(
            loop.create_connection(
                lambda: _Exchange(request, where, timeouts, streamed),
                url.host,
                url.port,
                ssl=context,
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
    status, fields = _head(protocol)
    if "chunked" in fields.get("transfer-encoding", "").lower():
        content, ends, times = _dechunk(protocol)
    else:
        content, ends, times = _body(protocol, fields.get("content-length"))
    return Response(status, fields, content, ends, times, protocol.sent, where)


async def stream_events(
    url: Url,
    path: str,
    payload: Any,
    *,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    headers: Mapping[str, str] | None = None,
) -> tuple[float, Iterator[StreamEvent]]:
    """POST ``payload`` to ``path``; when the stream is over, ``(the time the request was
    written, its Server-Sent Events)`` (read as they are iterated).

    Raises:
        ServerError: for an unreachable server, a status that is not 2xx (with the server's
            message), a body that is not an event stream, silence longer than the stall
            timeout, or a bound crossed (a request's total time among them).
    """
    response = await exchange(
        url, "POST", path, payload, timeouts=timeouts, headers=headers, streamed=True
    )
    where = f"POST {url}{path}"
    if not 200 <= response.status < 300:
        raise ServerError(f"{where}: HTTP {response.status}: {response.text()}")
    kind = response.headers.get("content-type", "")
    if "text/event-stream" not in kind:
        raise ServerError(
            f"{where}: expected an event stream, got {kind or 'no content type'}: {response.text()}"
        )
    return response.sent, response.events()
