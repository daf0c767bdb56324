"""Traces as a Chrome trace-event document (the JSON that Perfetto and chrome://tracing open):
one process per policy, one thread per worker or link with an event per iteration, and one
thread per request with an instant at each of its tokens. The same ``Trace.events`` the SVG
timeline draws. Standard library only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pytest_prefill.sim import Trace

US = 1e6  # trace-event timestamps are microseconds
# What a Chrome trace of ours may hold (events, token instants and the request ids listed in
# them, each about a hundred bytes of JSON): Perfetto opens a million at ease, and a bigger file
# costs gigabytes to build and minutes to open.
MAX_TRACE_ITEMS = 1_000_000


def trace_items(traces: Sequence[Trace]) -> int:
    """How many items :func:`chrome_trace` would write for ``traces``: an event per iteration and
    the ids of the requests it decodes, an arrival and an instant per token of every request
    (counted without building anything)."""
    total = 0
    for trace in traces:
        total += sum(1 + len(e.decode_ids) for e in trace.events)
        total += sum(1 + r.output_len for r in trace.requests.values())
    return total


def _meta(kind: str, pid: int, tid: int, name: str) -> dict[str, Any]:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}


def _iteration_events(trace: Trace, pid: int, tids: dict[str, int]) -> list[dict[str, Any]]:
    events = []
    for event in trace.events:
        args: dict[str, Any] = {"count": event.count}
        if event.prefill:
            args["prefill_tokens"] = {rid: tokens for rid, tokens in event.prefill}
        if event.decode_ids:
            args["decode_rows"] = len(event.decode_ids)
            args["decode_ids"] = list(event.decode_ids)
        if event.kv_tokens:
            args["kv_tokens"] = event.kv_tokens
        name = event.kind if event.count == 1 else f"{event.kind} x{event.count}"
        events.append(
            {
                "name": name,
                "cat": event.kind,
                "ph": "X",
                "ts": event.start * US,
                "dur": (event.end - event.start) * US,
                "pid": pid,
                "tid": tids[event.resource],
                "args": args,
            }
        )
    return events


def _token_events(trace: Trace, pid: int, first_tid: int) -> list[dict[str, Any]]:
    events = []
    for offset, (rid, record) in enumerate(sorted(trace.requests.items())):
        tid = first_tid + offset
        events.append(_meta("thread_name", pid, tid, f"tokens of {rid}"))
        events.append(
            {
                "name": f"{rid} arrives",
                "cat": "request",
                "ph": "i",
                "s": "t",
                "ts": record.arrival * US,
                "pid": pid,
                "tid": tid,
            }
        )
        for n, when in enumerate(record.token_times, 1):
            events.append(
                {
                    "name": f"{rid} token {n}",
                    "cat": "token",
                    "ph": "i",
                    "s": "t",
                    "ts": when * US,
                    "pid": pid,
                    "tid": tid,
                }
            )
    return events


def chrome_trace(traces: Sequence[Trace], title: str = "") -> dict[str, Any]:
    """A Chrome trace-event document of ``traces`` (JSON-able, finite numbers only).

    Raises:
        ValueError: when ``traces`` is not a non-empty sequence of ``Trace``.
    """
    if isinstance(traces, (str, bytes)) or not isinstance(traces, Sequence) or not traces:
        raise ValueError("traces must be a non-empty sequence of Trace")
    out: list[dict[str, Any]] = []
    for pid, trace in enumerate(traces, 1):
        if not isinstance(trace, Trace):
            raise ValueError(f"traces[{pid - 1}] must be a Trace, got {type(trace).__name__}")
        label = trace.policy if trace.chunk is None else f"{trace.policy} (chunk {trace.chunk})"
        out.append(_meta("process_name", pid, 0, label))
        out.append(
            {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}}
        )
        tids = {resource: i for i, resource in enumerate(trace.resources, 1)}
        for resource, tid in tids.items():
            out.append(_meta("thread_name", pid, tid, resource))
        out += _iteration_events(trace, pid, tids)
        out += _token_events(trace, pid, len(tids) + 1)
    return {
        "traceEvents": out,
        "displayTimeUnit": "ms",
        "otherData": {"title": title, "source": "pytest-prefill (simulated, not measured)"},
    }
