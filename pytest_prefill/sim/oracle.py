"""The oracle: what an event should last by the cost model, and every DESIGN.md invariant a
trace must keep, each checked from what the trace shows (not from how the simulator made it)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator

from .cost import CostModel
from .events import KINDS, LINK, Event
from .requests import Request
from .trace import RequestRecord, Trace


def iteration_cost(event: Event, cost: CostModel) -> float:
    """What ``event`` lasts by ``cost``'s formulas: a KV transfer, a prefill pass, a fused
    iteration, or ``count`` decode steps of which the i-th (from 0) reads
    ``kv_tokens + i * decode_rows`` cached tokens.

    Raises:
        ValueError: for an event kind not in ``KINDS``.
    """
    if event.kind == "decode":
        rows, n = event.decode_rows, event.count
        first = cost.decode_step(rows, event.kv_tokens)
        return n * first + cost.decode_per_kv_token * rows * (n * (n - 1) // 2)
    if event.kind == "transfer":
        return cost.kv_transfer(event.prefill_tokens)
    if event.kind in ("prefill", "fused"):
        return cost.iteration(event.pieces, event.decode_rows, event.kv_tokens)
    raise ValueError(f"event kind must be one of {', '.join(KINDS)}; got {event.kind!r}")


def close(a: float, b: float) -> bool:
    """Equal up to float rounding: a few units in the last place (times are exact inside the
    simulator; coalesced steps are re-derived in floats), never more than 1 ns near zero."""
    return abs(a - b) <= 64 * math.ulp(max(abs(a), abs(b))) + 1e-12


def check_invariants(
    trace: Trace, load: Iterable[Request], cost: CostModel | None = None
) -> list[str]:
    """Every DESIGN.md invariant that ``trace`` breaks for ``load``, as sentences (empty: none).

    Checked: events are of known kinds and take time; no resource runs two things at once;
    the trace has the load's requests, each prefilled exactly ``prompt_len`` tokens and given
    exactly ``output_len`` tokens at strictly increasing times, nothing before its arrival,
    prefill start < end <= KV ready < first token; every token time is the end of a step of
    an event that lists the request among its decode rows, on the worker it was decoded by;
    each step's KV read and each piece's context count what the request had by then; the
    summary's GPU-seconds equal the events' busy time. With ``cost``: each event lasts what
    the cost model says, and no worker holds more KV than ``cost.kv_capacity_tokens``.
    """
    requests = {r.id: r for r in load}
    problems = _event_shapes(trace.events)
    if set(trace.requests) != set(requests):
        problems.append("the trace's requests are not the load's requests")
    records = {rid: rec for rid, rec in trace.requests.items() if rid in requests}
    problems += _prefill_and_tokens(trace.events, records, requests)
    compute = [e for e in trace.events if e.resource != LINK]
    busy = math.fsum(e.duration for e in compute)
    # each event's duration is a difference of two float times: off by up to an ulp of them
    slack = math.fsum(2 * math.ulp(e.end) for e in compute) + 1e-12
    if abs(busy - trace.summary().gpu_seconds) > 1e-9 * busy + slack:
        problems.append(
            f"events' busy time {busy!r} differs from the summary's gpu_seconds "
            f"{trace.summary().gpu_seconds!r}"
        )
    if cost is not None:
        problems += _durations(trace.events, cost)
        problems += _kv_capacity(records.values(), cost.kv_capacity_tokens)
    return problems


def _event_shapes(events: Iterable[Event]) -> list[str]:
    problems: list[str] = []
    by_resource: dict[str, list[Event]] = {}
    for e in events:
        by_resource.setdefault(e.resource, []).append(e)
        if e.kind not in KINDS:
            problems.append(f"event kind {e.kind!r} is not one of {KINDS}")
        if not e.end > e.start or e.count < 1:
            problems.append(f"{e.resource} event at {e.start} has no duration")
        if len(set(e.decode_ids)) != len(e.decode_ids):
            problems.append(f"{e.resource} event at {e.start} lists a decode row twice")
    for resource, evs in by_resource.items():
        evs = sorted(evs, key=lambda e: e.start)
        for a, b in zip(evs, evs[1:]):
            if b.start < a.end:
                problems.append(f"{resource} runs two things at once at {b.start}")
    return problems


def _steps(event: Event) -> Iterator[tuple[float, float, int]]:
    """(start, end, KV read) of each step of ``event``."""
    for i in range(event.count):
        kv = event.kv_tokens + i * event.decode_rows
        yield event.step_start(i), event.step_start(i + 1), kv


def _prefill_and_tokens(
    events: Iterable[Event], records: dict[str, RequestRecord], requests: dict[str, Request]
) -> list[str]:
    problems: list[str] = []
    prefilled: dict[str, int] = {}
    emitted: dict[str, list[float]] = {rid: [] for rid in records}
    for e in sorted(events, key=lambda e: e.start):
        for k, (rid, tokens) in enumerate(e.prefill):
            if rid in requests and e.start < requests[rid].arrival:
                problems.append(f"{rid} is worked on at {e.start}, before it arrives")
            if e.kind == "transfer":
                continue
            done = prefilled.get(rid, 0)
            if e.contexts and k < len(e.contexts) and e.contexts[k] != done:
                problems.append(
                    f"{rid}'s piece at {e.start} has context {e.contexts[k]}, not {done}"
                )
            prefilled[rid] = done + tokens
        for start, end, kv in _steps(e):
            expected = 0
            for rid in e.decode_ids:
                rec = records.get(rid)
                if rec is None:
                    continue
                if rec.decode_resource != e.resource:
                    problems.append(
                        f"{rid} has a token on {e.resource}, decoded by {rec.decode_resource}"
                    )
                expected += rec.prompt_len + len(emitted[rid])
                emitted[rid].append(end)
            if e.decode_ids and all(rid in records for rid in e.decode_ids) and kv != expected:
                problems.append(
                    f"{e.resource} step at {start} reads {kv} KV tokens, rows hold {expected}"
                )
    for rid, r in requests.items():
        rec = records.get(rid)
        if rec is not None:
            problems += _request(r, rec, prefilled.get(rid, 0), emitted[rid])
    return problems


def _request(r: Request, rec: RequestRecord, prefilled: int, ends: list[float]) -> list[str]:
    problems = []
    times = rec.token_times
    if len(times) != r.output_len:
        problems.append(f"{r.id} got {len(times)} tokens, expected {r.output_len}")
    if prefilled != r.prompt_len:
        problems.append(f"{r.id} prefilled {prefilled} tokens, expected {r.prompt_len}")
    if any(b <= a for a, b in zip(times, times[1:])):
        problems.append(f"{r.id}'s token times do not strictly increase")
    if not r.arrival <= rec.prefill_start < rec.prefill_end <= rec.kv_ready:
        problems.append(f"{r.id}: arrival <= prefill start < prefill end <= KV ready fails")
    if times and not times[0] > rec.kv_ready:
        problems.append(f"{r.id}'s first token is not after its KV cache was ready")
    if times and not (close(rec.first_token, times[0]) and close(rec.finish, times[-1])):
        problems.append(f"{r.id}'s first_token/finish are not its first and last token times")
    if len(ends) != len(times) or not all(close(a, b) for a, b in zip(times, ends)):
        stray = [t for t in times if not _near_any(t, ends)]
        problems.append(
            f"{r.id}'s token times are not the ends of the steps that list it"
            + (f" (e.g. {stray[0]!r})" if stray else f" ({len(ends)} steps, {len(times)} tokens)")
        )
    return problems


def _near_any(t: float, ends: list[float]) -> bool:
    i = bisect.bisect_left(ends, t)
    return any(close(t, ends[j]) for j in (i - 1, i) if 0 <= j < len(ends))


def _durations(events: Iterable[Event], cost: CostModel) -> list[str]:
    problems = []
    for e in events:
        if e.kind not in KINDS:
            continue  # reported already
        expected = iteration_cost(e, cost)
        if abs(e.duration - expected) > 1e-9 * expected + 4 * math.ulp(e.end) + 1e-12:
            problems.append(
                f"{e.resource} {e.kind} at {e.start} lasts {e.duration}, cost model says {expected}"
            )
    return problems


def _kv_capacity(records: Iterable[RequestRecord], capacity: float) -> list[str]:
    """Each request holds its prompt_len + output_len tokens of KV on its worker at least from
    its prefill start (or, on a decode worker of its own, from its first token) to its finish
    (on a prefill worker of its own: to its KV's arrival); no worker may ever hold more."""
    if math.isinf(capacity):
        return []
    changes: dict[str, list[tuple[float, int, int]]] = {}
    for rec in records:
        need = rec.prompt_len + rec.output_len
        spans = [(rec.prefill_resource, rec.prefill_start, rec.finish)]
        if rec.prefill_resource != rec.decode_resource:
            spans = [
                (rec.prefill_resource, rec.prefill_start, rec.kv_ready),
                (rec.decode_resource, rec.first_token, rec.finish),
            ]
        for resource, begin, end in spans:
            changes.setdefault(resource, []).extend([(begin, 1, need), (end, 0, -need)])
    problems = []
    for resource, marks in changes.items():
        held = 0
        for t, _, delta in sorted(marks):  # releases (0) before admissions (1) at one instant
            held += delta
            if held > capacity:
                problems.append(f"{resource} holds {held} KV tokens at {t}, over {capacity:.0f}")
                break
    return problems
