"""``simulate()`` against the naive reference simulator (tests/reference_sim.py): every policy,
pools, replicas, KV capacity, chunk budgets, long outputs, every cost term non-zero, and the
engine knobs (first-token rule, token budget, sequence cap), every one set. Both work in exact
integer ticks on the same constants, so they must agree exactly: the same iterations with the
same pieces, rows and KV reads at the same times, the same token times."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_sim import reference

from pytest_prefill.sim import (
    LAB,
    CostModel,
    EngineProfile,
    Request,
    check_invariants,
    from_ticks,
    simulate,
)

pytestmark = pytest.mark.sim

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def v2_costs(draw: st.DrawFn, *, zero_terms: bool = True) -> CostModel:
    """Cost models with every v2 term drawn, zero or not (``zero_terms=False``: all non-zero)."""

    def term(values):
        pool = [v for v in values if v or zero_terms]
        return draw(st.sampled_from(pool))

    return CostModel(
        prefill_pass_overhead=draw(st.sampled_from([1e-4, 2e-3, 2.5e-2])),
        prefill_per_token=draw(st.sampled_from([1e-6, 1.5e-5, 6e-5])),
        decode_step_base=draw(st.sampled_from([1e-3, 1e-2, 3.1e-2])),
        decode_per_seq=term([0.0, 1e-5, 3e-4]),
        decode_per_kv_token=term([0.0, 1e-9, 2e-8, 3e-7]),
        kv_bytes_per_token=term([0.0, 1e3, 1.1e5]),
        link_bandwidth=draw(st.sampled_from([math.inf, 1e9, 25e9])),
        link_latency=term([0.0, 1e-5, 1e-3]),
        prefill_per_pair=term([0.0, 1e-10, 3e-9]),
        fusion_penalty=term([0.0, 0.25, 0.7, 1.0]),
        prefill_floor=term([0.0, 5e-3, 4e-2]),  # 4e-2: over every decode step drawn
    )


@st.composite
def v2_loads(draw: st.DrawFn) -> list[Request]:
    count = draw(st.integers(1, 9))
    return [
        Request(
            f"r{i}",
            draw(st.sampled_from([0.0, 0.0005, 0.01, 0.04, 0.1, 0.35, 1.2])),
            draw(st.integers(1, 700)),
            draw(st.integers(1, 200)),
        )
        for i in range(count)
    ]


@st.composite
def engines(draw: st.DrawFn, *, every_knob: bool = False) -> EngineProfile:
    """Engine profiles with every knob drawn (``every_knob``: the prefill rule, a token budget
    and a sequence cap all set), budgets from one token to more than any prompt."""
    if not every_knob and draw(st.booleans()):
        return LAB
    rules = ["prefill"] if every_knob else ["prefill", "decode"]
    budgets = [1, 3, 16, 64, 250, 701] + ([] if every_knob else [None])
    seqs = [1, 2, 3, 7] + ([] if every_knob else [None])
    return EngineProfile(
        "drawn",
        first_token=draw(st.sampled_from(rules)),
        max_batched_tokens=draw(st.sampled_from(budgets)),
        max_seqs=draw(st.sampled_from(seqs)),
    )


@st.composite
def setups(draw: st.DrawFn, *, zero_terms: bool = True, every_knob: bool = False):
    load = draw(v2_loads())
    cost = draw(v2_costs(zero_terms=zero_terms))
    engine = draw(engines(every_knob=every_knob))
    if draw(st.booleans()):  # a KV capacity every request fits, often tight
        largest = max(r.prompt_len + r.output_len for r in load)
        extra = draw(st.sampled_from([0, 1, 100, 1000]))
        cost = CostModel.from_dict({**cost.to_dict(), "kv_capacity_tokens": largest + extra})
    policy = draw(st.sampled_from(["shared", "coscheduled", "chunked", "disaggregated"]))
    options: dict = {"engine": engine}
    if policy == "chunked":
        choice = draw(st.sampled_from(["chunk", "chunk_budget", "engine budget"]))
        if choice == "chunk" or (choice == "engine budget" and engine.max_batched_tokens is None):
            options["chunk"] = draw(st.integers(1, 700))
        elif choice == "chunk_budget":
            options["chunk_budget"] = draw(st.sampled_from([1e-3, 8e-3, 2e-2, 6e-2]))
    if policy == "disaggregated":
        options["prefill_workers"] = draw(st.integers(1, 3))
        options["decode_workers"] = draw(st.integers(1, 3))
    else:
        options["replicas"] = draw(st.integers(1, 3))
    return policy, load, cost, options


def assert_agrees(policy, load, cost, options):
    trace = simulate(policy, load, cost, **options)
    ref = reference(policy, load, cost, **options)
    f = from_ticks
    got: dict[str, list] = {}
    for e in trace.steps():
        pieces = tuple(
            (rid, t, c) for (rid, t), c in zip(e.prefill, e.contexts or (0,) * len(e.prefill))
        )
        got.setdefault(e.resource, []).append(
            (e.start, e.end, e.kind, pieces, e.decode_ids, e.kv_tokens)
        )
    want: dict[str, list] = {}
    for name, start, end, kind, pieces, ids, kv in ref.events:
        want.setdefault(name, []).append((f(start), f(end), kind, pieces, ids, kv))
    for steps in want.values():
        steps.sort(key=lambda s: s[0])
    assert got == want
    for r in load:
        rec = trace.requests[r.id]
        start, end, ready, where = ref.prefill[r.id]
        assert (rec.prefill_start, rec.prefill_end, rec.kv_ready) == (f(start), f(end), f(ready))
        assert (rec.prefill_resource, rec.decode_resource) == (where, ref.decoder[r.id])
        assert rec.token_times == tuple(f(t) for t in ref.tokens[r.id])
    assert check_invariants(trace, load, cost, decode_cost=options.get("decode_cost")) == []


@SETTINGS
@given(setup=setups())
def test_simulate_is_the_reference(setup):
    assert_agrees(*setup)


@SETTINGS
@given(setup=setups(zero_terms=False))
def test_simulate_is_the_reference_with_every_cost_term_non_zero(setup):
    assert_agrees(*setup)


@SETTINGS
@given(setup=setups(zero_terms=False, every_knob=True))
def test_simulate_is_the_reference_with_every_knob_set_and_every_cost_term_non_zero(setup):
    assert_agrees(*setup)


TIGHT = EngineProfile("tight", first_token="prefill", max_batched_tokens=100, max_seqs=3)


@pytest.mark.parametrize("engine", [LAB, TIGHT], ids=["lab", "tight"])
@pytest.mark.parametrize("policy", ["shared", "coscheduled", "chunked", "disaggregated"])
def test_long_outputs_on_several_workers_take_every_fast_path(policy, engine):
    """Long decode runs cut by arrivals on a worker mid-run, finishing together, KV waits."""
    load = [
        Request(f"r{i}", 0.013 * i * (i % 3), 37 * i + 5, 150 + 40 * (i % 4)) for i in range(12)
    ]
    cost = CostModel(
        prefill_pass_overhead=2e-3,
        prefill_per_token=1.5e-5,
        decode_step_base=1e-2,
        decode_per_seq=1e-4,
        decode_per_kv_token=2e-8,
        kv_bytes_per_token=1.1e5,
        link_bandwidth=25e9,
        link_latency=1e-5,
        prefill_per_pair=1e-9,
        fusion_penalty=0.3,
        kv_capacity_tokens=1500,
    )
    options: dict = {"chunk": 64} if policy == "chunked" else {}
    options["engine"] = engine
    if policy == "disaggregated":
        options.update(prefill_workers=2, decode_workers=3)
    else:
        options.update(replicas=2)
    assert_agrees(policy, load, cost, options)


@st.composite
def paged_loads(draw: st.DrawFn, name: str) -> tuple[EngineProfile, list[Request]]:
    """A paged engine (blocks of 1 to 16 tokens, the prefix cache on or off) and a load with
    shared prefixes: each request's hash ids continue one of a few chains, so leading blocks
    repeat."""
    block = draw(st.sampled_from([1, 4, 16]))
    entry = block * draw(st.sampled_from([1, 2, 8]))
    engine = dataclasses.replace(
        draw(engines()),
        name=name,
        kv="paged",
        kv_block_tokens=block,
        prefix_caching=draw(st.booleans()),
        prefix_block_tokens=entry,
    )
    chains = [[f"c{k}-{i}" for i in range(60)] for k in range(3)]
    load = []
    for r in draw(v2_loads()):
        chain = chains[draw(st.integers(0, 2))]
        cut = draw(st.integers(0, 59))
        ids = chain[:cut] + [f"{r.id}-{i}" for i in range(60 - cut)]
        load.append(dataclasses.replace(r, prefix_blocks=tuple(ids[: -(-r.prompt_len // entry)])))
    return engine, load


@st.composite
def paged_setups(draw: st.DrawFn):
    """Paged KV, often tight (a few requests wide, preemptions), with shared prefixes."""
    engine, load = draw(paged_loads("drawn-paged"))
    block = engine.kv_block_tokens
    cost = draw(v2_costs())
    if draw(st.integers(0, 3)):  # a KV capacity every request fits, often tight
        largest = max(-(-(r.prompt_len + r.output_len - 1) // block) for r in load)
        blocks = largest + draw(st.sampled_from([0, 1, 5, 40, 400]))
        cost = CostModel.from_dict({**cost.to_dict(), "kv_capacity_tokens": blocks * block})
    policy = draw(st.sampled_from(["shared", "coscheduled", "chunked", "disaggregated"]))
    if policy == "disaggregated":  # paged there: unbounded KV, the cache on prefill workers
        cost = CostModel.from_dict({**cost.to_dict(), "kv_capacity_tokens": math.inf})
        workers = {"prefill_workers": draw(st.integers(1, 3)), "decode_workers": 2}
        return policy, load, cost, {"engine": engine, **workers}
    options: dict = {"engine": engine, "replicas": draw(st.integers(1, 3))}
    if engine.prefix_caching and draw(st.booleans()):
        options["router"] = "prefix"
    if policy == "chunked" and (engine.max_batched_tokens is None or draw(st.booleans())):
        options["chunk"] = draw(st.integers(1, 700))
    return policy, load, cost, options


def assert_paged_agrees(policy, load, cost, options):
    assert_agrees(policy, load, cost, options)
    trace = simulate(policy, load, cost, **options)
    ref = reference(policy, load, cost, **options)
    for r in load:
        rec = trace.requests[r.id]
        assert rec.cached_tokens == ref.cached.get(r.id, 0)
        assert rec.preempted_at == tuple(from_ticks(t) for t in ref.preempted.get(r.id, ()))


@SETTINGS
@given(setup=paged_setups())
def test_simulate_is_the_reference_under_paged_kv_with_shared_prefixes(setup):
    assert_paged_agrees(*setup)


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("policy", ["shared", "coscheduled", "chunked"])
def test_paged_kv_a_few_requests_wide_preempts_as_the_reference_does(policy, caching):
    load, cost = few_wide(1600)
    engine = EngineProfile(
        "tight-paged",
        first_token="prefill",
        max_batched_tokens=256,
        kv="paged",
        kv_block_tokens=16,
        prefix_caching=caching,
        prefix_block_tokens=16,
    )
    options = {"engine": engine, "replicas": 2, **({"chunk": 64} if policy == "chunked" else {})}
    assert simulate(policy, load, cost, **options).preemptions > 0
    assert_paged_agrees(policy, load, cost, options)


def few_wide(kv_tokens: int) -> tuple[list[Request], CostModel]:
    """Twelve requests sharing two leading prefix blocks, a few of them wide in ``kv_tokens``
    of KV per worker: bursts, long outputs, preemptions under paged KV."""
    load = [
        Request(f"r{i}", 0.013 * i * (i % 3), 37 * i + 5, 150 + 40 * (i % 4), (0, 1, i))
        for i in range(12)
    ]
    cost = CostModel(
        prefill_pass_overhead=2e-3,
        prefill_per_token=1.5e-5,
        decode_step_base=1e-2,
        decode_per_seq=1e-4,
        decode_per_kv_token=2e-8,
        prefill_per_pair=1e-9,
        fusion_penalty=0.3,
        kv_capacity_tokens=kv_tokens,
    )
    return load, cost
