"""How a capacity search runs its deployments' rate searches on an executor: in two waves, the
second seeded and pruned by the first, with each probe stopped once its verdict is fixed and
the answer's figures from full runs. Standard library only; nothing here prints.

The rules, each applied here and tested to leave the answer unchanged (tests/test_search_loop.py):

1. **Stop when decided.** A probe asks only "does this deployment at this rate meet the SLO
   for the target?" (:mod:`~pytest_prefill.plan.verdict`) and stops once it has FAILED, where
   the simulator can. A pass runs to its end (stopping it would save at most the last
   ``(1 - target) × N`` requests, and it may be the answer): the figures at a reported rate
   come from a full run, never a second one. (A highest pass without figures, from a
   simulator that stopped it, is run again in full.)
2. **Brackets from an estimate, then from a neighbour.** The first wave (the baseline the
   recommendation compares with, then the others with the highest estimates,
   :data:`FIRST_WAVE` in all) starts at the rate its prefill instances could just keep up with
   (:func:`throughput_estimate`), or the workload's own rate when that is no higher; every other
   deployment starts near the first wave's best rate, where one miss prunes it
   (:func:`seed_near`). Each grows or falls by 1, 2, 4 … steps
   of the same lattice of rates (:class:`~pytest_prefill.plan.rate_search.RateSearch`) until it
   has a bracket, never below the workload's own rate from a seed.
3. **Prune what cannot come close.** A second-wave deployment whose lowest miss leaves it
   below the first wave's best rate less the recommendation's margin (the highest lattice rate
   under its lowest miss, the most it can serve when attainment falls with rate, is below it)
   can neither win nor be named "within 5%": it is not bisected further, and its row says so.
   The baseline is never pruned (its rate is the one the answer is compared with).

The waves are fixed by the order of the deployments, never by which simulation finished first,
so the same search gives the same probes inline and on a pool.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import heapq
import math
import time
from collections.abc import Callable, Sequence

from pytest_prefill.plan.deployments import Deployment
from pytest_prefill.plan.rate_search import (
    Probe,
    Probing,
    RateSearch,
    probe_result,
    target_percentile,
)

FIRST_WAVE = 2  # deployments searched before the others (the baseline, the best estimated)
ESTIMATE_STRIDE = 4  # lattice steps a search seeded by an estimate first moves by
PROGRESS_EVERY = 10.0  # seconds between progress lines while no deployment finishes
Progress = Callable[[str], None]
ProbeFunction = Callable[..., Probe]


@dataclasses.dataclass(frozen=True, slots=True)
class Shortcuts:
    """Which of the rules above a search takes (all by default); each off gives the same
    answer with more simulations (the tests compare). ``alone``: a deployment with more
    requests missing alone than may miss is not searched (:mod:`~pytest_prefill.plan.verdict`)."""

    stop: bool = True
    seed: bool = True
    prune: bool = True
    alone: bool = True


ALL_SHORTCUTS = Shortcuts()
NO_SHORTCUTS = Shortcuts(stop=False, seed=False, prune=False, alone=False)


@dataclasses.dataclass(frozen=True)
class Problem:
    """What every probe of a search shares: what it simulates (``probing``), the attainment
    ``target`` it is judged against, the recommendation's margin and the shortcuts taken."""

    probing: Probing
    target: float
    margin: float  # the recommendation's "within" margin, relative
    shortcuts: Shortcuts = dataclasses.field(default_factory=Shortcuts)


def first_wave(
    searches: Sequence[RateSearch],
    baseline: Deployment | None,
    estimate: Callable[[RateSearch], float | None],
) -> list[RateSearch]:
    """The baseline's search (when it is searched), then the others by their ``estimate``
    (highest first; ties and no estimate keep the given order), up to :data:`FIRST_WAVE`."""
    head = [s for s in searches if s.deployment == baseline]
    rest = sorted(
        (s for s in searches if s.deployment != baseline), key=lambda s: -(estimate(s) or 0.0)
    )
    return (head + rest)[: max(FIRST_WAVE, len(head))]


def run_searches(
    pool: concurrent.futures.Executor,
    searches: Sequence[RateSearch],
    problem: Problem,
    baseline: Deployment | None,
    probe: ProbeFunction,
    progress: Progress | None = None,
) -> None:
    """Run every search to its end: the first wave, then the rest seeded and pruned by it,
    started as soon as the first wave's best rate is decided (:func:`decided_best`), while
    the first wave finishes; on ``pool``, at most its ``workers`` simulations at a time
    (when it says), the first wave's before the rest and the rest by their estimates."""
    rules = problem.shortcuts
    estimate = throughput_estimate(problem) if rules.seed else (lambda search: None)
    first = first_wave(searches, baseline, estimate)
    for search in first:
        search.seed = seed_below(search, estimate(search))
        search.gap = ESTIMATE_STRIDE
    rest = [s for s in searches if s not in first]

    def second_wave(finished: set[int]) -> list[RateSearch] | None:
        decided, best = decided_best(first, finished)
        if not decided:
            return None
        floor = None
        if rules.prune and best is not None:
            floor = first[0].scale(best) * (1 - problem.margin)
        for search in rest:
            search.seed = seed_near(search, best, floor) if rules.seed else None
            if search.deployment != baseline:
                search.floor = floor  # the baseline is never pruned
        return sorted(rest, key=lambda s: -(estimate(s) or 0.0))  # the likeliest to go on first

    width = getattr(pool, "workers", None)
    _Driver(pool, problem, probe, progress, width).run(first, second_wave)


def decided_best(first: Sequence[RateSearch], finished: set[int]) -> tuple[bool, int | None]:
    """Whether the highest pass the ``first`` searches will end on is already fixed, and that
    lattice index (None: none passes). A search's final pass is known once it has ended (its
    ``id`` in ``finished``) or its bracket is closed (its pass and miss are neighbours: only a
    check above it may follow, which never moves it); an open one ends below its lowest miss.
    So the best is fixed once a known final pass is at least every open search's most."""
    known: list[int] = []
    most: list[float] = []
    for s in first:
        closed = s.low is not None and s.high is not None and s.high - s.low <= 1
        if id(s) in finished or closed:
            known += [s.low] if s.low is not None else []
        else:
            most.append(s.high - 1 if s.high is not None else math.inf)
    best = max(known, default=None)
    if not most:
        return True, best
    return best is not None and all(k <= best for k in most), best


def throughput_estimate(problem: Problem) -> Callable[[RateSearch], float | None]:
    """A first guess of each deployment's knee, as a rate multiple: the rate its instances
    keep up with when every iteration is full. A colocated instance's iteration holds B tokens
    (its token budget or chunk; a whole prompt without one), a decode row among them for every
    request decoding, and lasts the longer of a decode step and its compute: by Little's law it
    serves B ÷ (iteration × (mean prompt + mean output)) requests a second. A split serves the
    lesser of its prefill instances' B ÷ (pass × mean prompt) and its decode instances' sequence
    cap ÷ (decode step × mean output). Queueing, a prefix cache's hits and per-row and per-KV
    decode costs are left out. A guess: it orders the first wave and places its first probes,
    never the answer."""
    load, engine = problem.probing.load, problem.probing.engine
    prompt = sum(r.prompt_len for r in load) / len(load)
    output = sum(r.output_len for r in load) / len(load)

    def estimate(search: RateSearch) -> float | None:
        d = search.deployment
        cost = d.cost_on(problem.probing.cost)
        knobs = d.engine(engine)
        tokens = d.chunk or knobs.max_batched_tokens or prompt
        compute = (
            cost.prefill_pass_overhead
            + cost.prefill_per_token * tokens
            + cost.prefill_per_pair * tokens * (tokens + 1) / 2
        )
        if d.policy == "disaggregated":
            assert d.prefill_workers is not None
            rate = d.prefill_workers * tokens / (compute * prompt)
            if knobs.max_seqs is not None:
                decode = d.decode_workers * knobs.max_seqs / (cost.decode_step_base * output)
                rate = min(rate, decode)
        else:
            iteration = max(cost.decode_step_base, compute)
            rate = d.instances * tokens / (iteration * (prompt + output))
        return rate / problem.probing.base_rate if rate > 0 else None

    return estimate


def seed_near(search: RateSearch, best: int | None, floor: float | None) -> int | None:
    """Where a second-wave search starts: at the first wave's ``best`` lattice rate, or with
    pruning, at the lowest lattice rate at or above ``floor`` (a miss there prunes it, as the
    rate below is under the floor; a pass puts it within the margin): one simulation settles
    a deployment that cannot come close."""
    if best is None or floor is None:
        return best
    k = best
    while k > search.bottom and search.scale(k - 1) >= floor:
        k -= 1
    return k


def seed_below(search: RateSearch, scale: float | None) -> int | None:
    """The lattice index just below ``scale`` (at most the lattice's top); None (start at the
    workload's own rate) when there is no estimate or it is no higher."""
    if scale is None or not scale > search.start:
        return None
    k = math.floor(math.log2(scale / search.start) / search.step)
    return min(k, search.top) if k > 0 else None


class _Driver:
    """Keeps one probe of every unfinished search queued or in flight until each is done, at
    most ``width`` in flight (None: all), the earliest-added search's first; a search whose
    most possible scale is below its ``floor`` is pruned."""

    def __init__(
        self,
        pool: concurrent.futures.Executor,
        problem: Problem,
        probe: ProbeFunction,
        progress: Progress | None,
        width: int | None,
    ) -> None:
        self.pool, self.problem, self.probe, self.progress = pool, problem, probe, progress
        self.width = width
        self.pending: dict[concurrent.futures.Future[Probe], tuple[RateSearch, bool]] = {}
        self.queue: list[tuple[int, int, RateSearch, float, bool, bool]] = []  # a heap
        self.rank: dict[int, int] = {}
        self.started: dict[int, float] = {}
        self.finished: set[int] = set()
        self.searches: list[RateSearch] = []
        self.made = 0

    def run(
        self,
        first: Sequence[RateSearch],
        later: Callable[[set[int]], Sequence[RateSearch] | None],
    ) -> None:
        """``first``'s searches, then ``later``'s once it returns them (it is asked after each
        simulation, with the ids of the searches ended)."""
        began = said = time.perf_counter()
        self.add(first)
        wave = later(self.finished)
        self.add(wave or ())
        try:
            while self.pending or self.queue:
                self.pump()
                done, _ = concurrent.futures.wait(
                    self.pending,
                    timeout=PROGRESS_EVERY,
                    return_when=concurrent.futures.FIRST_COMPLETED,
                )
                for future in done:
                    self.deliver(future)
                if wave is None:
                    wave = later(self.finished)
                    self.add(wave or ())
                if self.progress is not None and time.perf_counter() - said >= PROGRESS_EVERY:
                    said = time.perf_counter()
                    self.progress(_running_line(self.searches, self.running(), said - began))
        finally:
            for future in self.pending:
                future.cancel()

    def add(self, searches: Sequence[RateSearch]) -> None:
        for search in searches:
            self.rank[id(search)] = len(self.rank)
            self.started[id(search)] = time.perf_counter()
            self.searches.append(search)
            self.advance(search)

    def submit(self, search: RateSearch, scale: float, stop: bool, rerun: bool) -> None:
        self.made += 1
        heapq.heappush(self.queue, (self.rank[id(search)], self.made, search, scale, stop, rerun))

    def pump(self) -> None:
        """Send queued probes to the pool, earliest-added search first, up to the width."""
        p = self.problem
        while self.queue and (self.width is None or len(self.pending) < self.width):
            _, _, search, scale, stop, rerun = heapq.heappop(self.queue)
            percentile = target_percentile(search.target)  # the latency column printed
            job = (p.probing, search.deployment, scale, percentile)
            future = self.pool.submit(self.probe, *job, target=p.target, stop=stop)
            self.pending[future] = (search, rerun)

    def deliver(self, future: concurrent.futures.Future[Probe]) -> None:
        search, rerun = self.pending.pop(future)
        if rerun:
            search.replace_best(probe_result(future))
            self.end(search)
            return
        search.observe(probe_result(future))
        self.advance(search)

    def advance(self, search: RateSearch) -> None:
        upper = search.upper()
        if search.floor is not None and upper is not None:
            search.pruned = search.pruned or upper < search.floor
        scale = search.next_scale()
        if scale is not None:
            stop = self.problem.shortcuts.stop and not search.wants_full_run()
            self.submit(search, scale, stop, False)
            return
        best = search.at.get(search.low) if search.low is not None else None
        if best is not None and best.metrics is None and not search.pruned:
            self.submit(search, best.scale, False, True)  # the answer's figures: a full run
        else:
            self.end(search)

    def end(self, search: RateSearch) -> None:
        self.finished.add(id(search))
        if self.progress is not None:
            seconds = time.perf_counter() - self.started[id(search)]
            self.progress(_finished_line(search, seconds))

    def running(self) -> int:
        return len({id(s) for s, _ in self.pending.values()} | {id(q[2]) for q in self.queue})


def _running_line(searches: Sequence[RateSearch], running: int, seconds: float) -> str:
    simulations = sum(len(s.probes) for s in searches)
    return f"{simulations} simulations done; {running} deployment(s) searching ({seconds:.0f} s)"


def _finished_line(search: RateSearch, seconds: float) -> str:
    r = search.result()
    stopped = sum(1 for p in r.probes if p.stopped is not None)
    early = f", {stopped} stopped once decided" if stopped else ""
    rate = f"below {r.miss.rate:.3g}" if r.pruned and r.miss is not None else f"{r.max_rate:.3g}"
    return (
        f"{r.deployment.label}: {r.status}, {rate} req/s "
        f"({len(r.probes)} simulations{early}, {seconds:.1f} s)"
    )
