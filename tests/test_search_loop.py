"""The capacity search's shortcuts (plan/search_loop.py): stopping a run once its verdict is
fixed, brackets from a neighbour, pruning what cannot come close, skipping what misses alone —
each leaves the answer as it is (the deployment, its rate, the devices needed, the
recommendation line), on loads, SLOs, targets and engines drawn at random; a pool gives the
answer inline gives; the lattice of rates makes the answer independent of the path."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import examples

from pytest_prefill.plan.capacity import CapacityResult, capacity
from pytest_prefill.plan.deployments import default_deployments
from pytest_prefill.plan.executors import InlineExecutor, ShippedLoad, local_executor
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.plan.question import ServingQuestion
from pytest_prefill.plan.rate_search import RateSearch, lattice_step
from pytest_prefill.plan.search_loop import ALL_SHORTCUTS, NO_SHORTCUTS, decided_best
from pytest_prefill.plan.sizing import devices_needed
from pytest_prefill.plan.workloads import poisson
from pytest_prefill.sim import PRESETS, get_profile

pytestmark = pytest.mark.sim

COST = PRESETS["lab-laptop"].cost


def load_of(seed: int, count: int = 40):
    return poisson(
        5.0,
        count,
        prompt_len=lambda rng: rng.randint(64, 4000),
        output_len=lambda rng: rng.randint(2, 80),
        seed=seed,
    )


def answer(result: CapacityResult) -> tuple:
    """What a user acts on: the best deployment and its rate, the line that says it, the
    baseline's rate."""
    best = result.ranked()[0]
    baseline = result.baseline
    return (
        best.deployment.label if best.best is not None else None,
        f"{best.max_rate:.3g}",
        best.status,
        result.recommendation(),
        f"{baseline.max_rate:.3g}" if baseline is not None else None,
    )


def falls_with_rate(results) -> bool:
    """Whether, deployment by deployment, attainment never rises with the rate over every
    full run any of ``results`` made (the same simulation gives the same attainment)."""
    seen: dict[str, dict[float, float]] = {}
    for result in results:
        for r in result.results:
            for p in r.probes:
                if p.metrics is not None:
                    seen.setdefault(r.deployment.label, {})[p.scale] = p.attainment
    for points in seen.values():
        ordered = [points[s] for s in sorted(points)]
        if any(b > a for a, b in zip(ordered, ordered[1:])):
            return False
    return True


ONE_OFF = [dataclasses.replace(ALL_SHORTCUTS, **{f: False}) for f in ("stop", "seed", "prune")]


@examples(6)
@given(
    seed=st.integers(0, 50),
    slo=st.sampled_from(["ttft:1s,tpot:100ms", "ttft:500ms,tpot:60ms", "ttft:3s", "e2el:5s"]),
    target=st.sampled_from([0.9, 0.99]),
    engine=st.sampled_from(["lab", "vllm"]),
    devices=st.sampled_from([2, 3]),
)
def test_every_shortcut_leaves_the_answer_as_it_is(seed, slo, target, engine, devices):
    load, bounds = load_of(seed), SLO.parse(slo)
    runs = {
        rules: capacity(
            ServingQuestion(
                load,
                COST,
                bounds,
                target=target,
                engine=engine,
                shortcuts=rules,
                executor=InlineExecutor(),
            ),
            devices,
        )
        for rules in (ALL_SHORTCUTS, NO_SHORTCUTS, *ONE_OFF)
    }
    full = runs[NO_SHORTCUTS]
    if not falls_with_rate(runs.values()):
        return  # the bisection's assumption fails here: which knee a path finds may differ
    for rules, result in runs.items():
        assert answer(result) == answer(full), rules
    assert runs[ALL_SHORTCUTS].simulations <= full.simulations


@examples(4)
@given(seed=st.integers(0, 50), slo=st.sampled_from(["ttft:500ms,tpot:60ms", "ttft:1s"]))
def test_the_devices_needed_are_the_same_with_runs_stopped_once_decided(seed, slo):
    load, bounds = load_of(seed, 60), SLO.parse(slo)
    profile = get_profile("vllm")
    at = lambda n: default_deployments(COST, n, bounds, profile)  # noqa: E731
    load = [dataclasses.replace(r, arrival=r.arrival / 4) for r in load]  # 20 req/s
    found = {
        rules: devices_needed(
            ServingQuestion(
                load,
                COST,
                bounds,
                target=0.9,
                engine=profile,
                shortcuts=rules,
                executor=InlineExecutor(),
            ),
            at,
            max_devices=8,
        )  # fmt: skip
        for rules in (ALL_SHORTCUTS, NO_SHORTCUTS)
    }
    fast, full = found[ALL_SHORTCUTS], found[NO_SHORTCUTS]
    assert fast.devices == full.devices
    assert fast.deployment == full.deployment
    if full.devices is not None:  # the answer's figure comes from a full run
        (at_answer,) = [c for c in fast.checks if c.devices == fast.devices and c.meets]
        (expected,) = [c for c in full.checks if c.devices == full.devices and c.meets]
        assert at_answer.attainment == expected.attainment


def test_a_pool_gives_the_answer_and_the_probes_inline_gives():
    load, bounds = load_of(7, 60), SLO.parse("ttft:1s,tpot:100ms")
    inline = capacity(
        ServingQuestion(load, COST, bounds, engine="vllm", executor=InlineExecutor()), 3
    )
    with local_executor(2) as pool:
        pooled = capacity(ServingQuestion(load, COST, bounds, engine="vllm", executor=pool), 3)
    assert answer(pooled) == answer(inline)
    for a, b in zip(inline.results, pooled.results):
        assert [p.scale for p in a.probes] == [p.scale for p in b.probes]


def test_pruned_deployments_say_so_and_are_never_the_baseline():
    load, bounds = load_of(3, 60), SLO.parse("ttft:1s,tpot:100ms")
    result = capacity(
        ServingQuestion(load, COST, bounds, engine="vllm", executor=InlineExecutor()), 4
    )
    pruned = [r for r in result.results if r.status == "pruned"]
    baseline = result.baseline
    assert baseline is not None and baseline.status != "pruned"
    best = result.ranked()[0].max_rate
    for r in pruned:  # its lowest miss leaves it out of the recommendation's margin
        assert r.miss is not None and r.miss.rate < best


@pytest.mark.parametrize("tolerance", [0.0001, 0.01, 0.05, 0.2, 1.0])
def test_the_lattice_step_is_the_bisections_old_stopping_width(tolerance):
    step = lattice_step(tolerance)
    assert 2.0**step <= 1 + tolerance and (step == 1.0 or 2.0 ** (2 * step) > 1 + tolerance)


@examples(50)
@given(
    knee=st.integers(-200, 200),
    seed=st.one_of(st.none(), st.integers(-200, 200)),
    start=st.sampled_from([1.0, 0.3, 7.0]),
)
def test_any_seed_finds_the_same_lattice_rate(knee, seed, start):
    """Attainment that falls with rate: a pass up to lattice index ``knee``; from any seed the
    search ends on that index (or at the lattice's end)."""
    search = RateSearch(default_deployments(COST, 1)[0], 0.9, 0.05, start, False, seed)

    class Run:
        def __init__(self, scale: float) -> None:
            self.scale, self.rate = scale, scale
            self.metrics, self.verdict, self.stopped = None, None, None
            self.ok = search.index(scale) <= knee

        def passed(self, target: float) -> bool:
            return self.ok

        attainment = property(lambda self: 1.0 if self.ok else 0.0)

    for _ in range(200):
        scale = search.next_scale()
        if scale is None:
            break
        search.observe(Run(scale))  # type: ignore[arg-type]
    top, bottom = search.top, search.bottom
    if bottom <= knee < top:
        assert (search.low, search.high) == (knee, knee + 1)
    assert len(search.probes) < 60


def _identity(value):
    return value


def test_a_shipped_load_is_the_tuple_here_and_unpickled_once_per_process():
    load = ShippedLoad(load_of(5, 30))
    assert load == tuple(load_of(5, 30)) and isinstance(load, tuple)
    first, again = pickle.loads(pickle.dumps(load)), pickle.loads(pickle.dumps(load))
    assert first == load and type(first) is tuple
    assert again is first  # the same key: unpickled once, then kept
    other = ShippedLoad(load_of(6, 30))
    assert pickle.loads(pickle.dumps(other)) == other
    with local_executor(2) as pool:  # in a worker: the requests themselves
        assert pool.submit(_identity, load).result() == load


@examples(50)
@given(
    knees=st.lists(st.integers(-40, 40), min_size=1, max_size=3),
    seeds=st.lists(st.one_of(st.none(), st.integers(-40, 40)), min_size=3, max_size=3),
    order=st.lists(st.integers(0, 2), max_size=80),
)
def test_the_first_waves_best_once_decided_is_the_one_it_ends_on(knees, seeds, order):
    """The second wave may start as soon as :func:`decided_best` says the first wave's best is
    fixed: whichever order the first wave's searches advance in, the best it says then is the
    best they end on (attainment falling with rate: a pass up to each search's knee)."""
    deployment = default_deployments(COST, 1)[0]
    searches = [RateSearch(deployment, 0.9, 0.05, 1.0, True, seed) for seed in seeds[: len(knees)]]

    def step(i: int) -> bool:
        search = searches[i]
        scale = search.next_scale()
        if scale is None:
            return False
        search.observe(_Run(scale, search.index(scale) <= knees[i]))  # type: ignore[arg-type]
        return True

    finished: set[int] = set()
    said = []
    for i in [*order, *[j for j in range(len(searches)) for _ in range(60)]]:
        i %= len(searches)
        if i not in finished and not step(i):
            finished.add(i)
        said.append(decided_best(searches, {id(searches[j]) for j in finished}))
    assert len(finished) == len(searches)
    ends = [s.low for s in searches if s.low is not None]
    final = max(ends, default=None)
    assert said[-1] == (True, final)
    assert all(best == final for decided, best in said if decided)


class _Run:
    """A probe's stand-in: passes or not, judged from the full run."""

    def __init__(self, scale: float, ok: bool) -> None:
        self.scale, self.rate, self.ok = scale, scale, ok
        self.metrics, self.verdict, self.stopped = None, None, None

    def passed(self, target: float) -> bool:
        return self.ok

    attainment = property(lambda self: 1.0 if self.ok else 0.0)
