"""A reference server whose token times are known, and the client's timestamp error measured
against it. The server (standard library, asyncio) speaks enough of the OpenAI API for the load
generator — ``/v1/models``, ``/health``, streaming ``/v1/completions`` — and emits each request's
tokens on a fixed schedule (the first after ``ttft`` seconds, then one every ``gap``), stamping
each chunk with the monotonic time just before it was written. It can also misbehave on demand
(stall mid-stream, answer every path with 404) so the client's failures can be tested.

Run it in its own process so its work is not the client's: ``python -m
pytest_prefill.serve.launch.reference --port 8100 --ttft 0.02 --gap 0.01``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pytest_prefill.serve.client.api import request_body, tally
from pytest_prefill.serve.client.http import stream_events
from pytest_prefill.serve.client.wire import Timeouts, Url
from pytest_prefill.sim import percentile

MODEL = "reference"


@dataclasses.dataclass(frozen=True)
class Behaviour:
    """The schedule (seconds) and faults: the first token ``ttft`` plus ``per_token`` per
    prompt token after the request, then one every ``gap``; after ``stall_after`` tokens a
    stream goes silent for ``stall_seconds``; ``not_openai`` answers every path with 404;
    ``model`` is the id ``/v1/models`` lists (a folder, as ``transformers serve DIR`` lists);
    ``metrics`` serves ``/metrics`` (Prometheus text: vLLM's prompt and generation token
    counters, counted as it serves)."""

    ttft: float = 0.02
    gap: float = 0.01
    per_token: float = 0.0
    stall_after: int | None = None
    stall_seconds: float = 0.0
    not_openai: bool = False
    model: str = MODEL
    metrics: bool = False


def _exposition(counts: dict[str, int]) -> bytes:
    lines = []
    for name, value in counts.items():
        lines += [
            f"# TYPE vllm:{name} counter",
            f'vllm:{name}_total{{model_name="{MODEL}"}} {value}',
        ]
    body = ("\n".join(lines) + "\n").encode()
    head = (
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, Any]:
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


def _json_response(status: int, payload: Any) -> bytes:
    body = json.dumps(payload).encode()
    reason = {200: "OK", 404: "Not Found", 400: "Bad Request"}.get(status, "Error")
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def _chunk(data: bytes) -> bytes:
    """One piece of a chunked body (an empty one ends the body)."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _sse(payload: Any) -> bytes:
    return _chunk(f"data: {json.dumps(payload)}\n\n".encode())


async def _stream(
    writer: asyncio.StreamWriter, body: Any, behaviour: Behaviour, counts: dict[str, int]
) -> None:
    tokens = int(body.get("max_tokens") or 16)
    prompt = body.get("prompt")
    prompt_tokens = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
    counts["prompt_tokens"] += prompt_tokens
    counts["generation_tokens"] += tokens
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    start = time.perf_counter()
    for i in range(tokens):
        due = start + behaviour.ttft + behaviour.per_token * prompt_tokens + i * behaviour.gap
        if behaviour.stall_after is not None and i >= behaviour.stall_after:
            due += behaviour.stall_seconds
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        choice = {"index": 0, "text": f" w{i % 10}"}
        writer.write(_sse({"choices": [choice], "sent": time.perf_counter()}))
        await writer.drain()
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens}
    final = {"choices": [{"index": 0, "text": "", "finish_reason": "length"}], "usage": usage}
    writer.write(_sse(final) + _chunk(b"data: [DONE]\n\n") + _chunk(b""))
    await writer.drain()


async def _handle(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    behaviour: Behaviour,
    counts: dict[str, int],
) -> None:
    try:
        method, path, body = await _read_request(reader)
        if behaviour.not_openai:
            writer.write(_json_response(404, {"detail": "Not Found"}))
        elif path == "/v1/models":
            writer.write(_json_response(200, {"object": "list", "data": [{"id": behaviour.model}]}))
        elif path == "/health":
            writer.write(_json_response(200, {"status": "ok"}))
        elif path == "/metrics" and behaviour.metrics:
            writer.write(_exposition(counts))
        elif method == "POST" and path == "/v1/completions" and isinstance(body, dict):
            await _stream(writer, body, behaviour, counts)
        else:
            writer.write(_json_response(404, {"detail": "Not Found"}))
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError, ValueError):
        pass
    finally:
        writer.close()


async def serve(port: int, behaviour: Behaviour, ready: Any = None) -> None:
    """Serve on 127.0.0.1:``port`` (0: any free port) until cancelled; ``ready`` is called
    with the port once it listens."""
    async with running(behaviour, port) as url:
        if ready is not None:
            ready(url.port)
        await asyncio.Event().wait()


@contextlib.asynccontextmanager
async def running(behaviour: Behaviour = Behaviour(), port: int = 0) -> AsyncIterator[Url]:
    """A reference server in this event loop (for tests: its timing is the client's too)."""
    counts = {"prompt_tokens": 0, "generation_tokens": 0}
    server = await asyncio.start_server(
        lambda r, w: _handle(r, w, behaviour, counts), "127.0.0.1", port, backlog=2048
    )
    try:
        yield Url("http", "127.0.0.1", server.sockets[0].getsockname()[1], "")
    finally:
        server.close()


@dataclasses.dataclass(frozen=True)
class TimestampError:
    """The client's stamps minus the server's, over every token of ``streams`` concurrent
    streams (seconds), and the client's CPU seconds per token."""

    streams: int
    tokens: int
    p50: float
    p99: float
    maximum: float
    cpu_per_token: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


async def _one_stream(url: Url, tokens: int, errors: list[float]) -> None:
    body = request_body("openai", "completions", MODEL, "a b c", tokens)
    _, stream = await stream_events(url, "/v1/completions", body, timeouts=Timeouts(5, 60))
    events = list(stream)
    counted = await tally("completions", events, 0.0)  # the load generator's own reading
    stamps = [float(e.data[e.data.rfind('"sent": ') + 8 :].rstrip("}")) for e in events[:-1]]
    errors.extend(t - sent for t, sent in zip(counted.times, stamps))


async def measure_timestamp_error(url: Url, streams: int, tokens: int) -> TimestampError:
    """Open ``streams`` streams of ``tokens`` tokens at once against a reference server and
    compare each token's client stamp with the server's write time (one monotonic clock: the
    server must run on this machine)."""
    errors: list[float] = []
    cpu = time.process_time()
    await asyncio.gather(*(_one_stream(url, tokens, errors) for _ in range(streams)))
    cpu = time.process_time() - cpu
    ordered = sorted(errors)
    if not ordered:
        raise ValueError("no token was stamped by the reference server")
    p99 = percentile(ordered, 99)
    return TimestampError(
        streams, len(ordered), statistics.median(ordered), p99, ordered[-1], cpu / len(ordered)
    )


def timestamp_errors(
    streams: Sequence[int] = (1, 64, 512),
    *,
    tokens: int = 100,
    ttft: float = 0.02,
    gap: float = 0.05,
) -> list[TimestampError]:
    """:func:`measure_timestamp_error` at each count of concurrent streams, against a reference
    server started in its own process (and stopped by its PID)."""
    from pytest_prefill.serve.launch.process import free_port, reference_server, running_server

    port = free_port()
    argv, env = reference_server(port, ttft, gap)
    with running_server(argv, port, env=env, ready_path="/health", timeout=30) as server:
        return [asyncio.run(measure_timestamp_error(server.url, n, tokens)) for n in streams]


# The Behaviour fields main() takes as flags (--stall-after for stall_after), and the types of
# those whose default does not give it.
_FLAGS = ("ttft", "gap", "per_token", "stall_after", "stall_seconds", "not_openai", "model")
_FLAG_TYPES: dict[str, type] = {"stall_after": int}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pytest_prefill.serve.launch.reference")
    parser.add_argument("--port", type=int, default=0)
    defaults = Behaviour()
    for name in _FLAGS:  # each flag a Behaviour field of its name, with its default
        flag, default = "--" + name.replace("_", "-"), getattr(defaults, name)
        if isinstance(default, bool):
            parser.add_argument(flag, action="store_true")
        else:
            parser.add_argument(flag, type=_FLAG_TYPES.get(name, type(default)), default=default)
    args = parser.parse_args(argv)
    behaviour = Behaviour(**{name: getattr(args, name) for name in _FLAGS})

    def ready(port: int) -> None:
        print(f"listening on 127.0.0.1:{port} (pid {os.getpid()})", flush=True)

    try:
        asyncio.run(serve(args.port, behaviour, ready))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
