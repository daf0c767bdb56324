"""A mini serving engine: executes a workload under a policy with the simulator's own scheduling
rules (``scheduler.Worker``; DESIGN.md, "Simulation semantics") and records what it did as the
simulator's ``Trace``. The work is done by a backend: the model's packed pass in real time
(:class:`ModelBackend`), or the cost model on a fake clock (:func:`replay`, which must give
exactly ``simulate()``'s trace — the engine's loop is checked against the simulator's that way).

torch is imported lazily (only by :class:`ModelBackend` and the real-time entry points).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from pytest_prefill.sim import (
    LINK,
    CostModel,
    EventLog,
    Plan,
    Request,
    TickCost,
    Trace,
    Worker,
    check_options,
    disaggregated_prefill,
    from_ticks,
    piece_sums,
    to_ticks,
    validate_load,
    worker_mode,
)


class Clock(Protocol):
    def now(self) -> float: ...

    def wait_until(self, t: float) -> None: ...


class Backend(Protocol):
    def run(self, plan: Plan) -> float | None:
        """Do the planned iteration's work; return its exact duration if known (a simulated
        backend), else None (the engine reads the clock)."""
        ...


class RealClock:
    """Seconds since ``origin`` on the system-wide monotonic clock (comparable across
    processes on one machine); idles by sleeping."""

    def __init__(self, origin: float | None = None) -> None:
        self.origin = time.perf_counter() if origin is None else origin

    def now(self) -> float:
        return time.perf_counter() - self.origin

    def wait_until(self, t: float) -> None:
        while True:
            left = t - self.now()
            if left <= 0:
                return
            time.sleep(left if left < 1e-3 else left - 2e-4)


class FakeClock:
    """A clock that moves only when told, counting the simulator's exact ticks and read in
    seconds: a replay then meets every boundary (and every tie) the simulator meets, where
    float sums would drift a few units in the last place. Idling jumps to the target time."""

    def __init__(self) -> None:
        self.ticks = 0

    def now(self) -> float:
        return from_ticks(self.ticks)

    def wait_until(self, t: float) -> None:
        self.ticks = max(self.ticks, to_ticks(t, up=True))


class CostBackend:
    """Executes an iteration by advancing a fake clock by the cost model's duration for it, in
    ticks, priced as the simulator prices it."""

    def __init__(self, cost: CostModel, clock: FakeClock) -> None:
        self.cost, self.clock, self.tick = cost, clock, TickCost(cost)

    def run(self, plan: Plan) -> float | None:
        tokens, pairs, _ = piece_sums(plan.pieces())
        rows, kv = plan.decode_rows, plan.kv_tokens
        ticks = self.tick.price(tokens, pairs, plan.context_tokens, rows, kv)
        self.clock.ticks += ticks
        # The simulator keys runs of equal decode steps on the formula's duration when it is
        # constant (no per-KV-token term) and on end - start otherwise; so does the engine.
        if plan.kind == "decode" and self.cost.decode_per_kv_token == 0:
            return from_ticks(ticks)
        return None


class Arrivals(Protocol):
    def ready(self, now: float) -> list[Request]:
        """Requests that have arrived by ``now`` and were not handed out yet, in order."""
        ...

    def wait(self, clock: Clock) -> bool:
        """Idle until the next arrival; False when none is left."""
        ...


class ScheduledArrivals:
    """Arrivals known in advance: ``(time, request)`` in time order."""

    def __init__(self, schedule: Sequence[tuple[float, Request]]) -> None:
        self.schedule, self.i = list(schedule), 0

    def due(self, when: float, now: float) -> bool:
        return when <= now

    def advance(self, clock: Clock, when: float) -> None:
        clock.wait_until(when)

    def ready(self, now: float) -> list[Request]:
        out = []
        while self.i < len(self.schedule) and self.due(self.schedule[self.i][0], now):
            out.append(self.schedule[self.i][1])
            self.i += 1
        return out

    def wait(self, clock: Clock) -> bool:
        if self.i >= len(self.schedule):
            return False
        self.advance(clock, self.schedule[self.i][0])
        return True


class TickArrivals(ScheduledArrivals):
    """Arrivals at exact ticks on a :class:`FakeClock`, compared with its ticks as the
    simulator compares them: ``(ticks, request)`` in time order."""

    def __init__(self, schedule: Sequence[tuple[int, Request]], clock: FakeClock) -> None:
        super().__init__(schedule)
        self.clock = clock

    def due(self, when: float, now: float) -> bool:
        return when <= self.clock.ticks

    def advance(self, clock: Clock, when: float) -> None:
        self.clock.ticks = max(self.clock.ticks, int(when))


def drive(
    worker: Worker,
    backend: Backend,
    clock: Clock,
    arrivals: Arrivals,
    events: EventLog,
    admit: Callable[[Request], None],
) -> None:
    """Run ``worker`` until its arrivals are exhausted and it has nothing left to do: at each
    boundary admit what has arrived, compose the iteration, execute it, record it."""
    while True:
        now = clock.now()
        for r in arrivals.ready(now):
            admit(r)
        plan = worker.compose(now)
        if plan is None:
            if not arrivals.wait(clock):
                return
            continue
        step = backend.run(plan)
        end = clock.now()
        events.add(
            worker.name,
            now,
            end,
            plan.kind,
            plan.prefill_ids(),
            plan.decode_ids,
            plan.kv_tokens,
            plan.context_tokens,
            step=step or 0.0,
            contexts=plan.contexts(),
        )
        worker.finish_at(end)


def check_lab_run(
    policy: str, chunk: int | None, prefill_workers: int, decode_workers: int
) -> None:
    """``simulate``'s option checks, and the engine's own limit: one worker per pool."""
    check_options(policy, chunk, prefill_workers=prefill_workers, decode_workers=decode_workers)
    if prefill_workers != 1 or decode_workers != 1:
        raise ValueError(
            "the engine runs one prefill worker and one decode worker; "
            f"got prefill_workers={prefill_workers!r}, decode_workers={decode_workers!r}"
        )


def run_single(
    policy: str,
    requests: Sequence[Request],
    backend: Backend,
    clock: Clock,
    chunk: int | None = None,
    arrivals: Arrivals | None = None,
) -> Trace:
    """``shared``, ``coscheduled`` or ``chunked`` on one worker (``requests`` already sorted,
    arriving at their own times unless ``arrivals`` says otherwise)."""
    worker = Worker("worker", *worker_mode(policy, chunk))
    events = EventLog()
    drive(
        worker,
        backend,
        clock,
        arrivals or ScheduledArrivals([(r.arrival, r) for r in requests]),
        events,
        worker.admit,
    )
    records = {
        r.id: worker.record(
            r, worker.prefill_start[r.id], worker.prefill_end[r.id], worker.prefill_end[r.id]
        )
        for r in requests
    }
    return Trace(policy, events.finish(["worker"]), records, chunk)


@dataclasses.dataclass(frozen=True)
class PrefillResult:
    """What the prefill side of a disaggregated run did, per request: (prefill start, prefill
    end, KV ready), plus its prefill and link events."""

    times: Mapping[str, tuple[float, float, float]]
    events: tuple[Any, ...]


def disaggregated_trace(
    requests: Sequence[Request],
    times: Mapping[str, tuple[float, float, float]],
    events: Iterable[Any],
    decoder: Worker,
    chunk: int | None = None,
) -> Trace:
    """Assemble the trace of a disaggregated run from its two sides."""
    order = ["prefill0", LINK, decoder.name]
    rank = {name: i for i, name in enumerate(order)}
    ordered = tuple(sorted(events, key=lambda e: (rank[e.resource], e.start)))
    records = {r.id: decoder.record(r, *times[r.id], "prefill0") for r in requests}
    return Trace("disaggregated", ordered, records, chunk)


def replay(
    policy: str,
    load: Iterable[Request],
    cost: CostModel,
    *,
    chunk: int | None = None,
    prefill_workers: int = 1,
    decode_workers: int = 1,
) -> Trace:
    """Run the engine with the cost model as its backend on a fake clock. Must equal
    ``simulate(policy, load, cost, chunk=chunk)`` exactly (tests pin it).

    Raises:
        ValueError: as ``simulate`` does; and for pools of more than one worker.
    """
    check_lab_run(policy, chunk, prefill_workers, decode_workers)
    if not isinstance(cost, CostModel):
        raise ValueError(f"cost must be a CostModel, got {type(cost).__name__}")
    requests = validate_load(load)
    clock = FakeClock()
    backend = CostBackend(cost, clock)
    if policy != "disaggregated":
        arrivals = TickArrivals([(to_ticks(r.arrival, up=True), r) for r in requests], clock)
        return run_single(policy, requests, backend, clock, chunk, arrivals)
    # The stages only feed forward (prefill pool -> link -> decode), so on a fake clock they
    # can run one after the other; the prefill pool and link are the simulator's own.
    schedule, times, early = disaggregated_prefill(requests, cost)
    events = EventLog()
    decode_clock = FakeClock()
    decoder = Worker("decode0", "decode")
    drive(
        decoder,
        CostBackend(cost, decode_clock),
        decode_clock,
        TickArrivals(schedule, decode_clock),
        events,
        decoder.join,
    )
    everything = early + events.finish(["decode0"])
    return disaggregated_trace(requests, times, everything, decoder, chunk)


def make_prompts(requests: Sequence[Request], vocab: int, seed: int) -> dict[str, Any]:
    """Random prompt token ids per request: the same requests and seed give the same prompts."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return {
        r.id: torch.randint(0, int(vocab), (r.prompt_len,), generator=generator) for r in requests
    }


class ModelBackend:
    """Executes iterations with the packed pass: greedy decoding of real tokens from random,
    seeded prompts. A decode row feeds the request's latest token and emits the next one (the
    prefill's own prediction is the first decode step's input), so a request's cache holds
    ``prompt_len + steps`` tokens, as the cost model counts them."""

    def __init__(self, packed: Any, requests: Sequence[Request], *, seed: int = 0) -> None:
        self.packed = packed
        self.prompts = make_prompts(requests, packed.config.vocab_size, seed)
        self.caches: dict[str, Any] = {}
        self.tokens: dict[str, list[int]] = {r.id: [] for r in requests}
        self.steps: dict[str, int] = {r.id: 0 for r in requests}
        self.output_len: dict[str, int] = {r.id: r.output_len for r in requests}
        self._next: dict[str, int] = {}  # the input of each request's next decode row
        self._sync = _synchronizer(packed.device)

    def adopt(self, request: Request, cache: Any, next_token: int) -> None:
        """Take over a request prefilled elsewhere (disaggregation)."""
        self.caches[request.id] = cache
        self._next[request.id] = next_token

    def run(self, plan: Plan) -> float | None:
        import torch

        from pytest_prefill.lab.packed import Segment

        segments = []
        for r, done, n in plan.prefill:
            if r.id not in self.caches:
                self.caches[r.id] = self.packed.new_cache(r.prompt_len + r.output_len)
            last = done + n == r.prompt_len
            segments.append(
                Segment(
                    self.caches[r.id],
                    self.prompts[r.id][done : done + n],
                    "last" if last else "none",
                )
            )
        for rid in plan.decode_ids:
            segments.append(Segment(self.caches[rid], torch.tensor([self._next[rid]])))
        logits = self.packed.forward(segments)
        picks = [i for i, s in enumerate(segments) if s.logits == "last"]
        if picks:
            chosen = torch.stack([logits[i] for i in picks]).argmax(dim=-1).tolist()
            owners = [r.id for r in plan.completed] + list(plan.decode_ids)
            for rid, token in zip(owners, chosen):  # noqa: B905
                self._next[rid] = token
        for rid in plan.decode_ids:
            self.tokens[rid].append(self._next[rid])
            self.steps[rid] += 1
            if self.steps[rid] == self.output_len[rid]:
                del self.caches[rid]  # done: free its KV
        self._sync()
        return None


def _synchronizer(device: Any) -> Callable[[], None]:
    if getattr(device, "type", str(device)).startswith("cuda"):
        import torch

        return lambda: torch.cuda.synchronize(device)
    return lambda: None


@dataclasses.dataclass(frozen=True)
class EngineRun:
    """A real run: its trace, the greedy tokens each request emitted, and how the machine was
    used (``setup``: a sentence, e.g. cores and threads per worker)."""

    trace: Trace
    tokens: Mapping[str, tuple[int, ...]]
    setup: str


def warm_up(packed: Any, *, rows: int = 64) -> None:
    """A few passes so that first-call allocations do not land in a measured run."""
    import torch

    from pytest_prefill.lab.packed import Segment

    cache = packed.new_cache(rows + 4)
    packed.forward([Segment(cache, torch.zeros(rows, dtype=torch.long))])
    for _ in range(3):
        packed.forward([Segment(cache, torch.zeros(1, dtype=torch.long))])
