"""The load generator: replay a workload against a running server with streaming requests, at
the workload's own arrival times (or scaled), at a Poisson or gamma rate, all at once, and under
a cap on requests in flight; warm up first; stop at a request count or a time bound; report
progress; record every token's arrival (``records``). Standard library only: asyncio and the
client in ``http``."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import math
import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pytest_prefill.serve.client.api import (
    ENDPOINTS,
    TAKES_TOKEN_IDS,
    Tally,
    check_choice,
    request_body,
    tally,
)
from pytest_prefill.serve.client.http import stream_events
from pytest_prefill.serve.client.identity import ServerIdentity
from pytest_prefill.serve.client.prompts import Prompts
from pytest_prefill.serve.client.wire import DEFAULT_TIMEOUTS, ServerError, Timeouts, Url
from pytest_prefill.serve.load.records import BenchRun, ServerRecord
from pytest_prefill.sim import Request, validate_load
from pytest_prefill.sim.checks import check_int

ARRIVALS = ("trace", "poisson", "gamma", "burst")
PROGRESS_INTERVAL = 2.0
INTERRUPTED = "interrupted before it finished"
Progress = Callable[[str], object]


def _positive(field: str, value: Any, *, integer: bool = False) -> None:
    kind = int if integer else (int, float)
    ok = not isinstance(value, bool) and isinstance(value, kind)
    if not (ok and math.isfinite(value) and value > 0):
        what = "a positive integer" if integer else "a positive number"
        raise ValueError(f"{field} must be {what}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Target:
    """Where requests go and how they are written: the server (``identity``), the endpoint
    (``api.ENDPOINTS``), the prompts' words, whether prompts go as token ids (where the
    endpoint takes them), timeouts and extra headers (an API key). ``salt`` enters every
    prompt's words (with the request's id and length): a fresh one per target, so no prompt
    shares a prefix with another request's, or with this request's in an earlier run, that a
    server's prefix cache could serve instead of computing it. ``prefix_block_tokens``: a
    request that names its prompt's blocks (``Request.prefix_blocks``, a trace's hash ids) is
    sent with those blocks' fixed words in front (``Prompts.shared_text``), so a server's
    prefix cache hits where the trace says it may; None sends every prompt salted whole."""

    url: Url
    identity: ServerIdentity
    prompts: Prompts
    endpoint: str = "completions"
    token_ids: bool = False
    timeouts: Timeouts = DEFAULT_TIMEOUTS
    headers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    salt: str = dataclasses.field(default_factory=lambda: os.urandom(8).hex())
    prefix_block_tokens: int | None = None

    def __post_init__(self) -> None:
        check_choice("endpoint", self.endpoint, tuple(ENDPOINTS))
        engine = self.identity.engine
        if self.token_ids and self.endpoint != "llama" and engine not in TAKES_TOKEN_IDS:
            raise ValueError(f"token_ids: a {engine} server takes text prompts on {self.endpoint}")

    def body(
        self, request_id: str, prompt_len: int, output_len: int, blocks: Sequence[int | str] = ()
    ) -> dict[str, Any]:
        key = f"{self.salt}/{request_id}/{prompt_len}"
        prompt: str | list[int]
        block = self.prefix_block_tokens
        if blocks and block is not None:
            words = self.prompts.shared_token_ids if self.token_ids else self.prompts.shared_text
            prompt = words(key, prompt_len, blocks, block, self.salt)
        elif self.token_ids:
            prompt = self.prompts.token_ids(key, prompt_len)
        else:
            prompt = self.prompts.text(key, prompt_len)
        return request_body(
            self.identity.engine, self.endpoint, self.identity.model, prompt, output_len
        )


@dataclasses.dataclass(frozen=True)
class Schedule:
    """When requests go out. ``arrivals``: ``trace`` (the workload's own times divided by
    ``rate_scale``), ``poisson`` or ``gamma`` (at ``request_rate`` per second; gamma's shape is
    ``burstiness``, vLLM's: below 1 burstier than Poisson), ``burst`` (all at once). At most
    ``max_concurrency`` requests are in flight (a request waits for a free place: with
    ``burst`` this is a fixed concurrency)."""

    arrivals: str = "trace"
    rate_scale: float = 1.0
    request_rate: float | None = None
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        check_choice("arrivals", self.arrivals, ARRIVALS)
        _positive("rate_scale", self.rate_scale)
        _positive("burstiness", self.burstiness)
        if self.max_concurrency is not None:
            _positive("max_concurrency", self.max_concurrency, integer=True)
        if self.arrivals in ("poisson", "gamma"):
            if self.request_rate is None:
                raise ValueError(f"request_rate is needed for {self.arrivals} arrivals")
            _positive("request_rate", self.request_rate)
        elif self.request_rate is not None:
            raise ValueError(
                f"request_rate applies to poisson or gamma arrivals, not {self.arrivals}"
            )

    def send_times(self, load: Sequence[Request]) -> list[float]:
        """Seconds after the start at which each request (in arrival order) is due."""
        if not load:
            return []
        if self.arrivals == "trace":
            first = load[0].arrival
            return [(r.arrival - first) / self.rate_scale for r in load]
        if self.arrivals == "burst":
            return [0.0] * len(load)
        rng = random.Random(self.seed)
        rate = float(self.request_rate or 0)
        shape = 1.0 if self.arrivals == "poisson" else self.burstiness
        times, t = [], 0.0
        for _ in load:
            times.append(t)
            t += rng.gammavariate(shape, 1.0 / (rate * shape))
        return times

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Bounds:
    """``max_requests``: the first N of the workload; ``max_duration``: no request is sent
    after this many seconds (those in flight finish); ``warmup``: requests sent one at a time
    before the run and not counted (the workload's first ones, under other ids)."""

    max_requests: int | None = None
    max_duration: float | None = None
    warmup: int = 1

    def __post_init__(self) -> None:
        if self.max_requests is not None:
            _positive("max_requests", self.max_requests, integer=True)
        if self.max_duration is not None:
            _positive("max_duration", self.max_duration)
        check_int("warmup", self.warmup, minimum=0)


async def send_one(target: Target, request: Request, scheduled: float, t0: float) -> ServerRecord:
    """Send ``request`` now and read its stream to the end; a failure is the record's error."""
    body = target.body(request.id, request.prompt_len, request.output_len, request.prefix_blocks)
    arrival = time.perf_counter() - t0
    counted = Tally()
    error = None
    try:
        _, events = await stream_events(
            target.url,
            ENDPOINTS[target.endpoint],
            body,
            timeouts=target.timeouts,
            headers=target.headers,
        )
        counted = await tally(target.endpoint, events, t0, request.output_len)
    except (ServerError, ValueError) as err:
        error = str(err)
    if error is None and not counted.times:
        error = "the stream ended without a token"
    return ServerRecord(
        request.id,
        scheduled,
        arrival,
        request.prompt_len,
        request.output_len,
        tuple(counted.times),
        tuple(counted.counts),
        counted.prompt_tokens,
        counted.output_tokens,
        counted.timings,
        error,
        counted.assumed,
    )


class _Progress:
    """What the run has done so far: counts for the progress line, and every request issued
    with its record once it has one (what an interrupted run keeps)."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total, self.progress = total, progress
        self.done = self.failed = self.tokens = self.in_flight = 0
        self.start = time.perf_counter()
        self.issued: list[tuple[Request, float]] = []
        self.records: dict[str, ServerRecord] = {}

    def finished(self, record: ServerRecord) -> None:
        self.done += 1
        self.failed += not record.ok
        self.tokens += record.tokens_received
        self.records[record.id] = record

    def so_far(self) -> list[ServerRecord]:
        """A record for every request issued: its own, or one that says it was cut off."""
        return [
            self.records.get(r.id)
            or ServerRecord(r.id, at, at, r.prompt_len, r.output_len, error=INTERRUPTED)
            for r, at in self.issued
        ]

    def line(self) -> str:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        failed = f", {self.failed} failed" if self.failed else ""
        return (
            f"{self.done}/{self.total} done{failed}, {self.in_flight} in flight, "
            f"{elapsed:.0f} s, {self.done / elapsed:.2f} req/s, {self.tokens / elapsed:.0f} tok/s"
        )

    async def report(self) -> None:
        while self.progress is not None:
            await asyncio.sleep(PROGRESS_INTERVAL)
            self.progress(self.line())


async def _issue(
    target: Target,
    load: Sequence[Request],
    due: Sequence[float],
    schedule: Schedule,
    bounds: Bounds,
    state: _Progress,
) -> tuple[list[ServerRecord], str | None]:
    limit = asyncio.Semaphore(schedule.max_concurrency or len(load) or 1)
    t0 = state.start
    tasks: list[asyncio.Task[ServerRecord]] = []
    stopped = None

    async def one(request: Request, scheduled: float) -> ServerRecord:
        try:
            state.in_flight += 1
            record = await send_one(target, request, scheduled, t0)
        finally:
            state.in_flight -= 1
            limit.release()
        state.finished(record)
        return record

    try:
        for request, at in zip(load, due):
            if bounds.max_duration is not None and at > bounds.max_duration:
                stopped = f"time bound: no request sent after {bounds.max_duration:g} s"
                break  # due after the bound: not waited for
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await limit.acquire()
            if bounds.max_duration is not None and time.perf_counter() - t0 > bounds.max_duration:
                limit.release()
                stopped = f"time bound: no request sent after {bounds.max_duration:g} s"
                break
            state.issued.append((request, at))
            tasks.append(asyncio.create_task(one(request, at)))
        return list(await asyncio.gather(*tasks)), stopped
    except asyncio.CancelledError:
        for task in tasks:
            task.cancel()
        raise


async def run_load(
    target: Target,
    load: Sequence[Request],
    *,
    schedule: Schedule = Schedule(),
    bounds: Bounds = Bounds(),
    progress: Progress | None = None,
    stop: asyncio.Event | None = None,
) -> BenchRun:
    """Warm up, then send ``load`` (sorted by arrival, cut to ``bounds.max_requests``) on
    ``schedule`` and record every request. When ``stop`` is set (a Ctrl-C handler sets it) the
    run ends at once and returns what it measured, marked ``interrupted``: the requests
    finished keep their records, those in flight say they were cut off.

    Raises:
        ValueError: for an invalid load (see ``scheduler.validate_load``) or an empty one.
    """
    ordered = validate_load(load)
    if bounds.max_requests is not None:
        ordered = ordered[: bounds.max_requests]
    if not ordered:
        raise ValueError("load must hold at least one request")
    state = _Progress(len(ordered), progress)
    warm: list[ServerRecord] = []
    started: list[str] = []
    work = asyncio.ensure_future(_measure(target, ordered, schedule, bounds, state, warm, started))
    stopping = asyncio.ensure_future((stop or asyncio.Event()).wait())
    try:
        await asyncio.wait((work, stopping), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # this run_load itself was cancelled
        work.cancel()
        raise
    finally:
        stopping.cancel()
    if work.done():
        records, why = work.result()
        interrupted = False
    else:
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        records, why, interrupted = state.so_far(), "interrupted", True
    settings = {
        "endpoint": target.endpoint,
        "token_ids": target.token_ids,
        "prompts": target.prompts.source,
        "prompt_salt": target.salt,
        "prefix_block_tokens": target.prefix_block_tokens,
        "schedule": schedule.to_dict(),
        "bounds": dataclasses.asdict(bounds),
        "timeouts": dataclasses.asdict(target.timeouts),
    }
    when = started[0] if started else _now()
    return BenchRun(
        tuple(records),
        target.identity.to_dict(),
        settings,
        when,
        tuple(warm),
        why,
        interrupted=interrupted,
    )


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


async def _measure(
    target: Target,
    ordered: Sequence[Request],
    schedule: Schedule,
    bounds: Bounds,
    state: _Progress,
    warm: list[ServerRecord],
    started: list[str],
) -> tuple[list[ServerRecord], str | None]:
    """The warm-up (into ``warm``), then the run (when it began into ``started``)."""
    for i, request in enumerate(ordered[: bounds.warmup]):
        twin = dataclasses.replace(request, id=f"warmup{i}-{request.id}")
        warm.append(await send_one(target, twin, 0.0, time.perf_counter()))
    started.append(_now())
    state.start = time.perf_counter()
    reporter = asyncio.create_task(state.report())
    try:
        due = schedule.send_times(ordered)
        return await _issue(target, ordered, due, schedule, bounds, state)
    finally:
        reporter.cancel()


def bench(target: Target, load: Sequence[Request], **kwargs: Any) -> BenchRun:
    """:func:`run_load` from synchronous code (its own event loop)."""
    return asyncio.run(run_load(target, load, **kwargs))


async def open_target(
    url: Url,
    *,
    engine: str | None = None,
    endpoint: str | None = None,
    tokenizer: str | None = None,
    token_ids: bool = False,
    flags: str | None = None,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    headers: Mapping[str, str] | None = None,
) -> Target:
    """The server at ``url``, identified, with prompts of exact lengths: from ``tokenizer`` (a
    model folder), else from the served model's own folder when its id is one (as
    ``transformers serve MODEL_DIR`` names it), else from the server's ``/tokenize``.
    llama.cpp gets its native endpoint and token ids unless told otherwise.

    Raises:
        ValueError: naming what is wrong, for a tokenizer folder without words or a server
            with no way to find one-token words.
        ServerError: when the server cannot be reached or is not OpenAI-compatible.
    """
    from pytest_prefill.serve.client.identity import identify
    from pytest_prefill.serve.client.prompts import prompts_from_folder, prompts_from_server

    headers = dict(headers or {})
    identity = await identify(url, engine=engine, flags=flags, timeouts=timeouts, headers=headers)
    chosen = endpoint or ("llama" if identity.engine == "llama.cpp" else "completions")
    folder = tokenizer or (identity.model if os.path.isdir(identity.model) else None)
    if folder is not None:
        prompts = prompts_from_folder(folder)
    else:
        prompts = await prompts_from_server(url, identity.engine, timeouts, headers)
    ids = token_ids or chosen == "llama"
    return Target(url, identity, prompts, chosen, ids, timeouts, headers)
