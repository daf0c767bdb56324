"""Traces corrupted one field at a time, for the oracle's tests (tests/test_oracle.py and the
paged KV's in tests/test_paged.py): a real trace with one request's record changed."""

from __future__ import annotations

from pytest_prefill.sim import RequestRecord, Trace

RECORD_FIELDS = (
    "id",
    "arrival",
    "prompt_len",
    "output_len",
    "prefill_start",
    "prefill_end",
    "kv_ready",
    "decode_resource",
    "token_times",
    "prefill_resource",
    "cached_tokens",
    "preempted_at",
)


def with_record(trace: Trace, rid: str, **changes) -> Trace:
    """``trace`` with request ``rid``'s record rebuilt from its fields and ``changes``."""
    rec = trace.requests[rid]
    fields = {name: getattr(rec, name) for name in RECORD_FIELDS}
    fields.update(changes)
    requests = {**trace.requests, rid: RequestRecord(**fields)}
    return Trace(trace.policy, trace.events, requests, trace.chunk, engine=trace.engine)
