"""A SYNTHETIC conversation trace shaped like Mooncake's (FAST'25 artifact,
``conversation_trace.jsonl``), which is not on this machine: JSON lines with ``timestamp``
(ms), ``input_length``, ``output_length`` and ``hash_ids`` (one id per 512-token block of the
prompt; a conversation's turns share their leading blocks). What it copies is the shape that
matters to a capacity search, not the data:

- arrivals bunched at instants (Mooncake's 12,031 requests arrive at 1,180 distinct
  timestamps), one instant carrying 16 prompts of 18,000 tokens at once (Mooncake's busiest
  carries 16 prompts and 287k tokens), a tenth of all requests;
- each conversation's next turn is its previous prompt plus the previous answer plus a new
  message, so its hash ids start with the previous prompt's full blocks; every conversation
  starts with the same two-block system prompt.

``python tests/mooncake_shaped.py > tests/data/mooncake-shaped.jsonl`` writes the shipped file
(a test checks the two agree). Standard library only; the same seed gives the same trace."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Iterator

BLOCK_TOKENS = 512  # Mooncake's hash_ids block
SYSTEM_BLOCKS = 2  # a shared system prompt: hash ids 0 and 1 in every conversation
BURST_PROMPTS, BURST_PROMPT_LEN = 16, 18_000  # the one instant at t = 0
LONG_TURNS = 3  # turns of each burst conversation
SHORT_CONVERSATIONS, SHORT_TURNS = 24, 4
SEED = 0


def _blocks(tokens: int) -> int:
    return -(-tokens // BLOCK_TOKENS)


class _Ids:
    """Fresh hash ids (after the system prompt's)."""

    def __init__(self) -> None:
        self.next = SYSTEM_BLOCKS

    def take(self, count: int) -> list[int]:
        out = list(range(self.next, self.next + count))
        self.next += count
        return out


def _conversation(
    rng: random.Random, ids: _Ids, start_ms: int, first_len: int, turns: int
) -> Iterator[dict[str, object]]:
    """One conversation's turns: each prompt is the last one, its answer and a new message;
    its hash ids keep the last prompt's full blocks and add new ones for the rest."""
    prompt, hashes, stamp = first_len, [], start_ms
    for turn in range(turns):
        if turn == 0:
            hashes = list(range(SYSTEM_BLOCKS)) + ids.take(_blocks(prompt) - SYSTEM_BLOCKS)
        output = rng.randint(50, 400)
        yield {
            "timestamp": stamp,
            "input_length": prompt,
            "output_length": output,
            "hash_ids": hashes,
        }
        kept = hashes[: prompt // BLOCK_TOKENS]  # the last, partial block changes
        prompt = prompt + output + rng.randint(100, 1500)
        hashes = kept + ids.take(_blocks(prompt) - len(kept))
        stamp += rng.randint(10, 40) * 1000  # the user reads and types


def rows(seed: int = SEED) -> list[dict[str, object]]:
    """The trace's rows in time order (ties: conversation order)."""
    rng = random.Random(seed)
    ids = _Ids()
    out: list[dict[str, object]] = []
    for _ in range(BURST_PROMPTS):
        out += _conversation(rng, ids, 0, BURST_PROMPT_LEN, LONG_TURNS)
    instants = [5000 * rng.randint(1, 12) for _ in range(SHORT_CONVERSATIONS // 3)]
    for i in range(SHORT_CONVERSATIONS):  # three conversations start at each instant
        start = instants[i // 3]
        out += _conversation(rng, ids, start, rng.randint(2000, 8000), SHORT_TURNS)
    # bunch the follow-up turns too: round each arrival down to a 5-second instant
    for row in out:
        stamp = row["timestamp"]
        assert isinstance(stamp, int)
        row["timestamp"] = stamp - stamp % 5000 if stamp else 0
    return sorted(out, key=lambda row: row["timestamp"])  # type: ignore[arg-type, return-value]


def text(seed: int = SEED) -> str:
    """The JSONL file's text."""
    return "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in rows(seed))


if __name__ == "__main__":
    sys.stdout.write(text())
