"""What to send each kind of server so a request has exactly its prompt and output lengths, and
how to read its streamed chunks: tokens per chunk (from cumulative usage where the server gives
it), usage totals, server-side timings. Standard library only.

Endpoints: ``completions`` (OpenAI ``/v1/completions``), ``chat`` (``/v1/chat/completions``)
and ``llama`` (llama.cpp's native ``/completion``, which takes token ids and returns
``timings``). Engines differ in how they pin the output length: vLLM and SGLang take
``min_tokens`` and ``ignore_eos``; ``transformers serve`` rejects unknown fields and reads a
per-request ``generation_config`` JSON string instead; llama.cpp takes ``n_predict`` and
``ignore_eos``; any other OpenAI server gets ``max_tokens`` only (its usage says what came).

Counting the tokens of a stream's events (:func:`tally`), bounded by what was asked: when
tokens arrived, how many each time, and the usage the server claims."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pytest_prefill.serve.client.http import StreamEvent
from pytest_prefill.serve.client.wire import NestingError, loads
from pytest_prefill.sim.checks import check_int

ENDPOINTS = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
    "llama": "/completion",
}
ENGINES = ("transformers", "vllm", "sglang", "llama.cpp", "openai")
# Engines whose completions endpoint takes a list of token ids as the prompt.
TAKES_TOKEN_IDS = ("vllm", "sglang", "llama.cpp")


def check_choice(field: str, value: Any, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ValueError(f"{field} must be one of {', '.join(allowed)}, got {value!r}")
    return str(value)


def request_body(
    engine: str,
    endpoint: str,
    model: str | None,
    prompt: str | Sequence[int],
    output_len: int,
) -> dict[str, Any]:
    """The JSON body of one streaming request for ``output_len`` tokens (greedy).

    Raises:
        ValueError: for an unknown engine or endpoint, token ids to an endpoint that takes
            text only, or an ``output_len`` < 1.
    """
    check_choice("engine", engine, ENGINES)
    check_choice("endpoint", endpoint, tuple(ENDPOINTS))
    check_int("output_len", output_len)
    ids = not isinstance(prompt, str)
    if endpoint == "llama":
        return {
            "prompt": list(prompt) if ids else prompt,
            "n_predict": output_len,
            "ignore_eos": True,
            "cache_prompt": False,
            "temperature": 0,
            "stream": True,
        }
    if ids and (endpoint == "chat" or engine not in TAKES_TOKEN_IDS):
        raise ValueError(f"a {engine} {endpoint} request takes a text prompt, not token ids")
    body: dict[str, Any] = {"model": model, "stream": True, "max_tokens": output_len}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = list(prompt) if ids else prompt
    body["stream_options"] = {"include_usage": True}
    if engine == "transformers":
        config = {"max_new_tokens": output_len, "eos_token_id": -1, "do_sample": False}
        body["generation_config"] = json.dumps(config)
        return body
    body["temperature"] = 0
    if engine in ("vllm", "sglang", "llama.cpp"):
        body.update(min_tokens=output_len, ignore_eos=True)
        body["stream_options"]["continuous_usage_stats"] = True
    return body


@dataclasses.dataclass(frozen=True, slots=True)
class Chunk:
    """One streamed event, read: ``tokens`` it carries (None: unknown, the server gave no
    count), the usage totals when it has them, llama.cpp's ``timings``, ``done`` on the last."""

    tokens: int | None
    text: bool
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    timings: Mapping[str, Any] | None = None
    done: bool = False


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def parse_chunk(endpoint: str, data: str, counted: int) -> Chunk:
    """Read one event's data; ``counted`` is the tokens counted so far on this stream (a
    cumulative count becomes this chunk's count).

    Raises:
        ValueError: naming the problem, for data that is not a JSON object of the endpoint's
            shape (or nests deeper than ``wire.MAX_JSON_DEPTH``), or an error object the
            server streamed.
    """
    try:
        event = loads(data, "a streamed event")
    except NestingError:
        raise
    except ValueError:
        raise ValueError(f"a streamed event is not JSON: {data[:80]!r}") from None
    if not isinstance(event, dict):
        raise ValueError(f"a streamed event is not a JSON object: {data[:80]!r}")
    if "error" in event:
        raise ValueError(f"the server streamed an error: {str(event['error'])[:200]}")
    if endpoint == "llama":
        return _llama_chunk(event, counted)
    choices = event.get("choices")
    if not isinstance(choices, list):
        raise ValueError(f"a streamed event has no 'choices' list: {data[:80]!r}")
    usage: dict[str, Any] = event["usage"] if isinstance(event.get("usage"), dict) else {}
    text = any(
        bool(choice.get("text") if endpoint == "completions" else _delta(choice))
        for choice in choices
        if isinstance(choice, dict)
    )
    finished = any(isinstance(c, dict) and c.get("finish_reason") for c in choices)
    output = _count(usage.get("completion_tokens"))
    if text:
        # with continuous usage the count is cumulative; without it, unknown
        tokens = None if output is None else max(output - counted, 0)
    else:
        tokens = 0
    return Chunk(
        tokens, text, _count(usage.get("prompt_tokens")), output, None, finished or not choices
    )


def _delta(choice: Mapping[str, Any]) -> str:
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return ""
    content = delta.get("content") or delta.get("reasoning_content") or ""
    return content if isinstance(content, str) else ""


def _llama_chunk(event: Mapping[str, Any], counted: int) -> Chunk:
    predicted = _count(event.get("tokens_predicted"))
    timings = event.get("timings") if isinstance(event.get("timings"), dict) else None
    stop = event.get("stop") is True
    text = bool(event.get("content"))
    if predicted is not None and predicted >= counted:
        tokens: int | None = predicted - counted
    else:
        tokens = None if text else 0
    prompt = _count(event.get("tokens_evaluated"))
    return Chunk(tokens, text, prompt, predicted if stop else None, timings, stop)


# A server may send more tokens than asked (an engine that cannot pin the length stops where it
# likes), but not more than this many times as many (plus a few): a claim of 10^9 tokens is
# refused, not stored as 10^9 arrival times.
TOKENS_FACTOR = 4
TOKENS_SLACK = 16


# Reading a finished stream yields to the event loop every this many events, so that the
# other streams' bytes are stamped as they arrive rather than after this one is parsed.
EVENTS_PER_SLICE = 32


@dataclasses.dataclass
class Tally:
    """What a stream's events said: when tokens arrived (seconds after ``t0``) and how many
    each time, the usage totals, llama.cpp's timings, and whether counts were assumed."""

    times: list[float] = dataclasses.field(default_factory=list)
    counts: list[int] = dataclasses.field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    timings: Mapping[str, Any] | None = None
    assumed: bool = False


def most_tokens(output_len: int) -> int:
    """The most output tokens a response to a request for ``output_len`` may claim."""
    return TOKENS_FACTOR * output_len + TOKENS_SLACK


def _check_claim(claimed: int | None, output_len: int | None) -> None:
    if claimed is not None and output_len is not None and claimed > most_tokens(output_len):
        raise ValueError(
            f"the server claims {claimed:,} output tokens for a request of {output_len:,} "
            f"(more than {TOKENS_FACTOR}x as many + {TOKENS_SLACK}); its usage is not believed"
        )


async def tally(
    endpoint: str, events: Iterable[StreamEvent], t0: float, output_len: int | None = None
) -> Tally:
    """Count the tokens of a stream's events (``api.parse_chunk``); ``output_len``, the tokens
    asked for, bounds the count (:func:`most_tokens`).

    Raises:
        ValueError: for an event that is not of the endpoint's shape, a streamed error, or a
            count over the bound.
    """
    out = Tally()
    counted = 0
    for i, event in enumerate(events):
        if i % EVENTS_PER_SLICE == EVENTS_PER_SLICE - 1:
            await asyncio.sleep(0)
        chunk = parse_chunk(endpoint, event.data, counted)
        _check_claim(chunk.output_tokens, output_len)
        if chunk.prompt_tokens is not None:
            out.prompt_tokens = chunk.prompt_tokens
        if chunk.output_tokens is not None:
            out.output_tokens = chunk.output_tokens
        out.timings = chunk.timings or out.timings
        tokens = chunk.tokens
        if tokens is None:  # a text chunk without a count: one token, as vLLM assumes
            tokens, out.assumed = 1, True
        _check_claim(counted + tokens, output_len)
        if tokens > 0:
            out.times.append(event.time - t0)
            out.counts.append(tokens)
            counted += tokens
    return out
