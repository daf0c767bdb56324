"""A window of a Mooncake trace scaled to a small model, for a prefix cache checked on a server:
its first requests, prompt and output lengths divided (and the hash ids' block with them, so a
block keeps covering the same share of a prompt), prompts capped at the server's context, arrival
times rescaled to a chosen rate. Standard library only."""

from __future__ import annotations

import dataclasses
import os

from pytest_prefill.plan.traces import JSONL_BLOCK_TOKENS, load_jsonl
from pytest_prefill.plan.workloads import arrival_rate
from pytest_prefill.sim import Request

MOONCAKE = os.path.join("mooncake-fast25", "conversation_trace.jsonl")


def mooncake_path() -> str | None:
    """The shared Mooncake conversation trace next to the checkout or the working folder
    (``../shared/data``), or None."""
    checkout = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    for up in (checkout, os.getcwd(), os.path.join(checkout, "..")):
        path = os.path.join(up, "..", "shared", "data", MOONCAKE)
        if os.path.isfile(path):
            return os.path.normpath(path)
    return None


@dataclasses.dataclass(frozen=True)
class ScaledWindow:
    """The requests, the block size of their hash ids, and what was done to them."""

    requests: tuple[Request, ...]
    block_tokens: int
    description: str


def scaled_window(
    path: str, count: int, divisor: int, max_prompt: int, rate: float
) -> ScaledWindow:
    """The first ``count`` requests of the trace at ``path``, lengths / ``divisor`` (at least
    1 token out, prompts at most ``max_prompt``), the block ``JSONL_BLOCK_TOKENS / divisor``,
    arrivals rescaled to ``rate`` requests/s.

    Raises:
        ValueError: for a divisor that does not divide the block, or a trace without hash ids.
    """
    if divisor < 1 or JSONL_BLOCK_TOKENS % divisor:
        raise ValueError(f"divisor must divide the block of {JSONL_BLOCK_TOKENS}, got {divisor}")
    rows = load_jsonl(path, limit=count)
    if not any(r.prefix_blocks for r in rows):
        raise ValueError(f"{path}: no request carries hash_ids")
    base = arrival_rate(rows)
    factor = base / rate if base == base and base > 0 else 1.0
    requests = tuple(
        dataclasses.replace(
            r,
            arrival=r.arrival * factor,
            prompt_len=min(max(r.prompt_len // divisor, 1), max_prompt),
            output_len=max(r.output_len // divisor, 1),
        )
        for r in rows
    )
    block = JSONL_BLOCK_TOKENS // divisor
    description = (
        f"the first {len(requests)} requests of {os.path.basename(path)}, lengths / {divisor} "
        f"(prompts capped at {max_prompt}), hash-id blocks of {block} tokens, arrivals "
        f"rescaled to {rate:g} req/s"
    )
    return ScaledWindow(requests, block, description)
