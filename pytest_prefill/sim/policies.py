"""The policies (DESIGN.md, "Simulation semantics"): their names, the options each takes, and how
a worker runs each one."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from .checks import check_int, check_number

POLICIES = ("shared", "coscheduled", "chunked", "disaggregated")


class WorkerMode(NamedTuple):
    """How a worker runs a policy: its mode and its prompt tokens per iteration."""

    mode: str
    chunk: float


def worker_mode(policy: str, chunk: int | None = None) -> WorkerMode:
    """The worker mode of ``policy`` (the one mapping): ``shared`` runs prefill passes ahead of
    decode steps; ``coscheduled`` fuses whole prompts with the decode rows, ``chunked`` up to
    ``chunk`` prompt tokens (None: as many as the iteration's budget allows); the decode
    workers of ``disaggregated`` only decode."""
    if policy == "disaggregated":
        return WorkerMode("decode", math.inf)
    if policy in ("shared", "coscheduled"):
        return WorkerMode(policy, math.inf)
    tokens = float(chunk) if policy == "chunked" and chunk is not None else math.inf
    return WorkerMode("chunked", tokens)


def check_options(
    policy: Any,
    chunk: Any = None,
    chunk_budget: Any = None,
    replicas: Any = 1,
    prefill_workers: Any = 1,
    decode_workers: Any = 1,
    max_batched_tokens: int | None = None,
) -> None:
    """ValueError naming the field for an unknown policy, a missing or bad chunk or budget,
    both at once, replicas for a disaggregated run, or a count < 1 (shared by every entry
    point that runs a policy). ``chunked`` needs a chunk, a chunk budget or an engine token
    budget (``max_batched_tokens``: then each iteration takes what the budget leaves)."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}; got {policy!r}")
    if chunk is not None and chunk_budget is not None:
        raise ValueError("chunk and chunk_budget exclude each other: give one of them")
    if policy == "chunked" and chunk is None and chunk_budget is None:
        if max_batched_tokens is None:
            raise ValueError(
                "chunk must be a positive integer (prompt tokens per iteration) for "
                "'chunked', or chunk_budget a positive number of seconds per iteration (or "
                "run under an engine profile with max_batched_tokens)"
            )
    if chunk is not None:
        check_int("chunk", chunk)
    if chunk_budget is not None:
        check_number("chunk_budget", chunk_budget, positive=True)
    check_int("replicas", replicas)
    check_int("prefill_workers", prefill_workers)
    check_int("decode_workers", decode_workers)
    if policy == "disaggregated" and replicas != 1:
        raise ValueError(
            "replicas applies to colocated policies; size a disaggregated deployment with "
            f"prefill_workers and decode_workers (got replicas={replicas})"
        )
