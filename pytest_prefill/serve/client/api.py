"""What to send each kind of server so a request has exactly its prompt and output lengths, and
how to read its streamed chunks: tokens per chunk (from cumulative usage where the server gives
it), usage totals, server-side timings. Standard library only.

Endpoints: ``completions`` (OpenAI ``/v1/completions``), ``chat`` (``/v1/chat/completions``)
and ``llama`` (llama.cpp's native ``/completion``, which takes token ids and returns
``timings``). Engines differ in how they pin the output length: vLLM and SGLang take
``min_tokens`` and ``ignore_eos``; ``transformers serve`` rejects unknown fields and reads a
per-request ``generation_config`` JSON string instead; llama.cpp takes ``n_predict`` and
``ignore_eos``; any other OpenAI server gets ``max_tokens`` only (its usage says what came)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_prefill.serve.client.wire import NestingError, loads

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
    if isinstance(output_len, bool) or not isinstance(output_len, int) or output_len < 1:
        raise ValueError(f"output_len must be an integer >= 1, got {output_len!r}")
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
