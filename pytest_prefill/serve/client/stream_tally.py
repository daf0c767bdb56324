"""Counting the tokens of a stream's events (``api.parse_chunk``), bounded by what was asked:
when tokens arrived, how many each time, and the usage the server claims. Standard library only."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from pytest_prefill.serve.client.api import parse_chunk
from pytest_prefill.serve.client.http import StreamEvent

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
