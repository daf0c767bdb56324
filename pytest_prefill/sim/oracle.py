"""The oracle: what an event should last by the cost model, and every DESIGN.md invariant a
trace must keep, each checked from what the trace shows (not from how the simulator made it)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Iterator

from .cost import CostModel, run_step_start
from .events import KINDS, LINK, Event
from .oracle_paged import Attempts, blocks_in_use
from .profiles import EngineProfile
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
        return run_step_start(0.0, first, cost.decode_per_kv_token * rows, n)
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
    trace: Trace,
    load: Iterable[Request],
    cost: CostModel | None = None,
    engine: EngineProfile | None = None,
    decode_cost: CostModel | None = None,
) -> list[str]:
    """Every DESIGN.md invariant that ``trace`` breaks for ``load``, as sentences (empty: none).

    Checked: events are of known kinds and take time; no resource runs two things at once;
    the trace has the load's requests, each prefilled exactly ``prompt_len`` tokens and given
    exactly ``output_len`` tokens at strictly increasing times, nothing before its arrival,
    prefill start < end <= KV ready; the first-token rule of ``engine`` (default: the trace's
    own profile): ``decode`` — every token ends a step of an event that lists the request
    among its decode rows, after its KV was ready; ``prefill`` — the first token ends the
    iteration that completed its prompt, every later one a step that lists it; each step's KV
    read (each row's prompt and tokens emitted) and each piece's context count what the
    request had by then; the summary's GPU-seconds equal the events' busy time; no iteration
    over the engine's token budget (a lone whole prompt longer than it excepted) and never
    more than its sequence cap in progress on a worker. With ``cost``: each event lasts what
    the cost model says, and no worker holds more KV than ``cost.kv_capacity_tokens``. With
    ``decode_cost`` too (a disaggregated run on decode devices of their own): the decode
    workers' events are timed and their blocks bounded by it, the prefill workers' by ``cost``.
    """
    profile = trace.engine if engine is None else engine
    requests = {r.id: r for r in load}
    problems = _event_shapes(trace.events)
    if set(trace.requests) != set(requests):
        problems.append("the trace's requests are not the load's requests")
    records = {rid: rec for rid, rec in trace.requests.items() if rid in requests}
    prefill_first = profile.first_token == "prefill"
    attempts = Attempts(records, requests, profile) if profile.kv == "paged" else None
    found, decode_from = _prefill_and_tokens(
        trace.events, records, requests, prefill_first, attempts
    )
    problems += found
    compute = [e for e in trace.events if e.resource != LINK]
    busy = math.fsum(e.duration for e in compute)
    # each event's duration is a difference of two float times: off by up to an ulp of them
    slack = math.fsum(2 * math.ulp(e.end) for e in compute) + 1e-12
    if abs(busy - trace.summary().gpu_seconds) > 1e-9 * busy + slack:
        problems.append(
            f"events' busy time {busy!r} differs from the summary's gpu_seconds "
            f"{trace.summary().gpu_seconds!r}"
        )
    spans = _spans(records.values(), decode_from)
    if profile.max_batched_tokens is not None:
        lone = profile.kv == "paged" and trace.policy != "chunked"  # a whole attempt, alone
        problems += _token_budget(compute, requests, profile.max_batched_tokens, lone)
    if profile.seq_cap is not None:
        problems += _most_held(spans, lambda rec: 1, profile.seq_cap, "requests in progress")
    if cost is not None:
        decoders = _decode_workers(records.values()) if decode_cost is not None else set()
        own = decode_cost if decode_cost is not None else cost
        problems += _durations([e for e in trace.events if e.resource not in decoders], cost)
        problems += _durations([e for e in trace.events if e.resource in decoders], own)
        capacity = cost.kv_capacity_tokens
        if attempts is not None:
            pools = {worker: own.kv_capacity_tokens for worker in decoders}
            problems += blocks_in_use(trace.events, records, requests, profile, capacity, pools)
        elif not math.isinf(capacity):
            need = lambda rec: rec.prompt_len + rec.output_len  # noqa: E731
            problems += _most_held(spans, need, capacity, "KV tokens")
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
    events: Iterable[Event],
    records: dict[str, RequestRecord],
    requests: dict[str, Request],
    prefill_first: bool,
    attempts: Attempts | None = None,
) -> tuple[list[str], dict[str, float]]:
    """Prefill progress, contexts, KV reads and token ends, walked in time order; also when
    each request's first decode step on a worker started (its admission there at the latest).
    Under paged KV, ``attempts`` follows each request's prefill attempts (preemptions, cache
    hits)."""
    problems: list[str] = []
    prefilled: dict[str, int] = {}
    emitted: dict[str, list[float]] = {rid: [] for rid in records}
    decode_from: dict[str, float] = {}
    for e in sorted(events, key=lambda e: e.start):
        for k, (rid, tokens) in enumerate(e.prefill):
            if rid in requests and e.start < requests[rid].arrival:
                problems.append(f"{rid} is worked on at {e.start}, before it arrives")
            if e.kind == "transfer":
                continue
            if attempts is not None and rid in requests:
                attempts.before(rid, e.start, len(emitted.get(rid, ())))
                context = e.contexts[k] if k < len(e.contexts) else None
                if attempts.piece(e, rid, tokens, context) and prefill_first and rid in emitted:
                    emitted[rid].append(e.end)
                continue
            done = prefilled.get(rid, 0)
            if e.contexts and k < len(e.contexts) and e.contexts[k] != done:
                problems.append(
                    f"{rid}'s piece at {e.start} has context {e.contexts[k]}, not {done}"
                )
            prefilled[rid] = done + tokens
            r = requests.get(rid)
            if prefill_first and rid in emitted and r is not None and done + tokens == r.prompt_len:
                emitted[rid].append(e.end)  # the pass that completes a prompt emits a token
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
                decode_from.setdefault(rid, start)
                if attempts is not None:
                    attempts.row(rid, start, len(emitted[rid]))
                expected += rec.prompt_len + len(emitted[rid])
                emitted[rid].append(end)
            if e.decode_ids and all(rid in records for rid in e.decode_ids) and kv != expected:
                problems.append(
                    f"{e.resource} step at {start} reads {kv} KV tokens, rows hold {expected}"
                )
    for rid, r in requests.items():
        rec = records.get(rid)
        if rec is not None:
            done = r.prompt_len if attempts is not None else prefilled.get(rid, 0)
            problems += _request(r, rec, done, emitted[rid], prefill_first)
    if attempts is not None:
        problems += attempts.finish()
    return problems, decode_from


def _request(
    r: Request, rec: RequestRecord, prefilled: int, ends: list[float], prefill_first: bool
) -> list[str]:
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
    if prefill_first:
        if times and not close(times[0], rec.prefill_end):
            problems.append(f"{r.id}'s first token is not at the end of the pass completing it")
        if len(times) > 1 and not times[1] > rec.kv_ready:
            problems.append(f"{r.id}'s second token is not after its KV cache was ready")
    elif times and not times[0] > rec.kv_ready:
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


def _decode_workers(records: Iterable[RequestRecord]) -> set[str]:
    """The workers that decoded requests prefilled elsewhere (a disaggregated decode pool)."""
    return {rec.decode_resource for rec in records if rec.decode_resource != rec.prefill_resource}


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


Span = tuple[str, float, float, RequestRecord]  # (worker, from, to, the request)


def _spans(records: Iterable[RequestRecord], decode_from: dict[str, float]) -> list[Span]:
    """Where each request is held, and at least when: on its worker from its prefill start to
    its finish; under disaggregation on its prefill worker until its KV is ready (to its finish
    if it never left), and on its decode worker from its first decode step there."""
    spans: list[Span] = []
    for rec in records:
        if rec.prefill_resource == rec.decode_resource:
            spans.append((rec.prefill_resource, rec.prefill_start, rec.finish, rec))
            continue
        spans.append((rec.prefill_resource, rec.prefill_start, rec.kv_ready, rec))
        begin = decode_from.get(rec.id, rec.finish)
        spans.append((rec.decode_resource, begin, rec.finish, rec))
    return spans


def _most_held(
    spans: list[Span], weight: Callable[[RequestRecord], int], limit: float, what: str
) -> list[str]:
    """No worker ever holds more than ``limit`` of ``what`` (each span weighing ``weight``)."""
    changes: dict[str, list[tuple[float, int, int]]] = {}
    for resource, begin, end, rec in spans:
        amount = weight(rec)
        changes.setdefault(resource, []).extend([(begin, 1, amount), (end, 0, -amount)])
    problems = []
    for resource, marks in changes.items():
        held = 0
        for t, _, delta in sorted(marks):  # releases (0) before admissions (1) at one instant
            held += delta
            if held > limit:
                problems.append(f"{resource} holds {held} {what} at {t}, over {limit:.0f}")
                break
    return problems


def _token_budget(
    events: Iterable[Event], requests: dict[str, Request], limit: int, lone: bool = False
) -> list[str]:
    """Every iteration holds at most ``limit`` tokens (a decode row one, a prompt token one),
    but for a lone whole prompt longer than the budget, which runs alone (``lone``: any lone
    piece, as paged KV's whole-prompt policies schedule what is left of a prompt after its
    cache hits, or a prompt and its emitted tokens after a preemption)."""
    problems = []
    for e in events:
        tokens = e.prefill_tokens + e.decode_rows
        if tokens <= limit:
            continue
        (rid, n), *others = e.prefill or (("", 0),)
        whole = rid in requests and (lone or n == requests[rid].prompt_len)
        if not (whole and not others and not e.decode_rows):
            problems.append(
                f"{e.resource} {e.kind} at {e.start} holds {tokens} tokens, over the budget "
                f"of {limit}"
            )
    return problems
