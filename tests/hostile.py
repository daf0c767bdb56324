"""Servers written to misbehave, for the client's fault tests (tests/test_serve_faults.py).

Each runs on 127.0.0.1 in a thread of its own, so that a blocking command (``cli.main``) can be
pointed at it as well as a coroutine, and answers every request with a handler: an async
function of ``(method, path, body, writer)``. A handler's misbehaviour is bounded in time
(:data:`MOST_SECONDS`), and the server stops, its connections cut, when the ``with`` ends."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from pytest_prefill.serve.client.prompts import Prompts
from pytest_prefill.serve.client.wire import Url

Handler = Callable[[str, str, Any, asyncio.StreamWriter], Awaitable[None]]
MOST_SECONDS = 30.0  # no handler misbehaves for longer than this
MODEL = "hostile"
WORDS = Prompts(
    tuple(f" w{chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(80)), tuple(range(80)), "test"
)
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
)


def write_words(folder) -> str:
    """A tokenizer folder (make-model's word list) for ``--tokenizer``."""
    (folder / "prefill-words.json").write_text(
        json.dumps({"words": list(WORDS.words), "ids": list(WORDS.ids)})
    )
    return str(folder)


def json_response(payload: Any, status: int = 200) -> bytes:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    head = (
        f"HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def sse(payload: Any) -> bytes:
    """One Server-Sent Event as one HTTP chunk (``payload``: JSON, or bytes as they are)."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return chunk(b"data: " + data + b"\n\n")


def token(text: str = " w", usage: dict[str, int] | None = None) -> bytes:
    event: dict[str, Any] = {"choices": [{"index": 0, "text": text}]}
    if usage is not None:
        event["usage"] = usage
    return sse(event)


def done(usage: dict[str, int]) -> bytes:
    final = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": usage}
    return sse(final) + chunk(b"data: [DONE]\n\n") + chunk(b"")


async def models_ok(writer: asyncio.StreamWriter) -> None:
    writer.write(json_response({"object": "list", "data": [{"id": MODEL}]}))


async def trickle(writer: asyncio.StreamWriter, data: bytes, every: float) -> None:
    """Write ``data`` a byte at a time, one every ``every`` seconds (for at most
    :data:`MOST_SECONDS`)."""
    for i in range(min(len(data), int(MOST_SECONDS / every))):
        writer.write(data[i : i + 1])
        await writer.drain()
        await asyncio.sleep(every)


async def forever(writer: asyncio.StreamWriter, piece: bytes, every: float) -> None:
    """Write ``piece`` every ``every`` seconds for :data:`MOST_SECONDS` (a stream that does not
    end, as far as any test waits)."""
    for _ in range(int(MOST_SECONDS / every)):
        writer.write(piece)
        await writer.drain()
        await asyncio.sleep(every)


async def _read(reader: asyncio.StreamReader) -> tuple[str, str, Any]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    body = await reader.readexactly(length) if length else b""
    return method, path, json.loads(body) if body else None


async def _serve(handler: Handler, ready: Any, stop: asyncio.Event) -> None:
    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            method, path, body = await _read(reader)
            await handler(method, path, body, writer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass  # the client gave up, or the test is over
        finally:
            writer.close()

    server = await asyncio.start_server(connection, "127.0.0.1", 0)
    ready(server.sockets[0].getsockname()[1], asyncio.get_running_loop())
    async with server:
        await stop.wait()


@contextlib.contextmanager
def serving(handler: Handler) -> Iterator[Url]:
    """A server answering with ``handler``, in a thread, for the ``with`` block."""
    found: dict[str, Any] = {}
    up = threading.Event()
    stop: list[asyncio.Event] = []

    def ready(port: int, loop: asyncio.AbstractEventLoop) -> None:
        found.update(port=port, loop=loop)
        up.set()

    async def main() -> None:
        stop.append(asyncio.Event())
        await _serve(handler, ready, stop[0])

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    assert up.wait(10), "the hostile server did not start"
    try:
        yield Url("http", "127.0.0.1", found["port"], "")
    finally:
        found["loop"].call_soon_threadsafe(stop[0].set)
        thread.join(10)


def streaming(stream: Callable[[asyncio.StreamWriter, Any], Awaitable[None]]) -> Handler:
    """A handler that lists one model and answers a completion with ``stream(writer, body)``
    (after the event stream's headers)."""

    async def handle(method: str, path: str, body: Any, writer: asyncio.StreamWriter) -> None:
        if path == "/v1/models":
            await models_ok(writer)
        elif method == "POST":
            writer.write(SSE_HEAD)
            await stream(writer, body)
        else:
            writer.write(json_response({"detail": "Not Found"}, 404))

    return handle
