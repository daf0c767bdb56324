"""The search's verdict (plan/verdict.py): the misses a target allows, judged as attainment is;
the verdict of a run against the full run's attainment; the requests that miss alone, a lower
bound on every run's misses; and the "unreachable" answer with no simulation."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import cost_models, examples

from pytest_prefill.plan.capacity import capacity
from pytest_prefill.plan.deployments import Deployment, default_deployments, refused_kinds
from pytest_prefill.plan.executors import InlineExecutor
from pytest_prefill.plan.metrics import SLO, serving_metrics
from pytest_prefill.plan.question import ServingQuestion
from pytest_prefill.plan.sizing import devices_needed
from pytest_prefill.plan.verdict import (
    allowed_misses,
    alone_bounds,
    alone_misses,
    prefill_passes,
    run_verdict,
    shared_prefix_tokens,
)
from pytest_prefill.plan.workloads import scale_rate
from pytest_prefill.report.capacity import devices_needed_line
from pytest_prefill.sim import PRESETS, Request, get_profile, simulate

pytestmark = pytest.mark.sim

targets = st.one_of(
    st.sampled_from([0.5, 0.7, 0.9, 0.95, 0.99, 0.999, 1.0]),
    st.floats(0.01, 1.0, exclude_min=True),
)


@examples(300)
@given(target=targets, n=st.integers(1, 5000))
def test_allowed_misses_is_the_most_that_keeps_attainment_at_the_target(target, n):
    m = allowed_misses(target, n)
    assert 0 <= m <= n
    assert (n - m) / n >= target  # attainment as ServingMetrics judges it, ties included
    assert m == n or (n - m - 1) / n < target


def test_allowed_misses_follows_the_float_comparison_where_floor_is_one_off():
    assert math.floor((1 - 0.9) * 10) == 0  # 0.999...: one off
    assert allowed_misses(0.9, 10) == 1  # 9/10 >= 0.9 holds


@pytest.mark.parametrize(("target", "n"), [(0, 10), (1.5, 10), (True, 10), (0.9, 0), (0.9, 2.5)])
def test_allowed_misses_names_a_bad_argument(target, n):
    with pytest.raises(ValueError, match="target|requests"):
        allowed_misses(target, n)


@st.composite
def shared_loads(draw: st.DrawFn, max_requests: int = 12) -> list[Request]:
    """Requests of a few conversations: each carries its conversation's leading 16-token blocks
    (shared with the others) and then its own."""
    count = draw(st.integers(1, max_requests))
    out = []
    for i in range(count):
        prompt = draw(st.integers(1, 700))
        blocks = prompt // 16
        common = draw(st.integers(0, blocks))
        talk = draw(st.integers(0, 2))
        ids = [f"c{talk}-{b}" for b in range(common)] + [f"r{i}-{b}" for b in range(common, blocks)]
        arrival = draw(st.sampled_from([0.0, 0.001, 0.05, 0.3, 1.0]))
        out.append(Request(f"r{i}", arrival, prompt, draw(st.integers(1, 30)), tuple(ids)))
    return out


DEPLOYMENTS = [
    Deployment("shared", 2),
    Deployment("chunked", 2, chunk=64),
    Deployment("chunked", 1, chunk_budget=0.02),
    Deployment("chunked", 2, max_batched_tokens=256),
    Deployment("disaggregated", 2, prefill_workers=1, max_batched_tokens=128),
]


@examples(60)
@given(
    load=shared_loads(),
    cost=cost_models(),
    pair=st.sampled_from([0.0, 1e-9]),
    penalty=st.sampled_from([0.0, 0.5]),
    deployment=st.sampled_from(DEPLOYMENTS),
    engine=st.sampled_from(["lab", "vllm", "vllm-nocache"]),
    scale=st.sampled_from([0.5, 1.0, 8.0]),
)
def test_no_request_beats_its_alone_bounds_in_a_run_with_others(
    load, cost, pair, penalty, deployment, engine, scale
):
    """Every request's TTFT, TPOT and E2EL in a run of the whole load are at least the bounds
    alone: so the requests that miss alone miss in every run, at every rate."""
    cost = dataclasses.replace(cost, prefill_per_pair=pair, fusion_penalty=penalty)
    profile = get_profile(engine.removesuffix("-nocache"))
    if engine.endswith("-nocache"):
        profile = dataclasses.replace(profile, prefix_caching=False)
    if refused_kinds([deployment], profile, cost) or (
        deployment.chunk_budget is not None and profile.kv == "paged"
    ):
        return
    if deployment.max_batched_tokens is None and deployment.policy == "shared" and engine != "lab":
        return
    trace = simulate(
        deployment.policy, scale_rate(load, scale), cost, **deployment.simulate_options(profile)
    )
    block = profile.prefix_block_tokens
    cached = shared_prefix_tokens(load, block) if profile.prefix_caching else {}
    for r in load:
        record = trace.requests[r.id]
        hit = cached.get(r.id, 0)
        ttft, tpot, e2el = alone_bounds(
            r, cost, prefill_passes(deployment, profile, r.prompt_len - hit), hit
        )
        assert record.first_token - record.arrival >= ttft
        assert record.finish - record.arrival >= e2el
        if tpot is not None:
            assert (record.finish - record.first_token) / (r.output_len - 1) >= tpot


@examples(40)
@given(
    load=shared_loads(),
    cost=cost_models(),
    ttft=st.sampled_from([0.01, 0.05, 0.2, 1.0]),
    tpot=st.sampled_from([None, 0.005, 0.02, 0.1]),
    target=targets,
    deployment=st.sampled_from(DEPLOYMENTS[:4]),
)
def test_a_full_run_misses_at_least_the_requests_that_miss_alone(
    load, cost, ttft, tpot, target, deployment
):
    slo = SLO(ttft=ttft, tpot=tpot)
    profile = get_profile("lab")
    (alone,) = alone_misses(load, slo, target, [(deployment, cost)], profile)
    trace = simulate(deployment.policy, load, cost, **deployment.simulate_options(profile))
    metrics = serving_metrics(trace, slo=slo)
    assert len(load) - metrics.good >= alone.count
    if alone.unreachable:
        assert metrics.attainment < target


@examples(60)
@given(
    load=shared_loads(),
    cost=cost_models(),
    ttft=st.sampled_from([0.01, 0.05, 0.2, 1.0]),
    tpot=st.sampled_from([None, 0.005, 0.02, 0.1]),
    target=targets,
    deployment=st.sampled_from(DEPLOYMENTS),
    scale=st.sampled_from([0.25, 1.0, 16.0]),
    engine=st.sampled_from(["lab", "vllm"]),
    e2el=st.sampled_from([None, 0.5, 3.0]),
    on_pass=st.booleans(),
)
def test_the_verdict_is_the_full_runs_attainment_against_the_target(
    load, cost, ttft, tpot, target, deployment, scale, engine, e2el, on_pass
):
    """End to end, however the run was stopped: passed exactly when the full run's attainment
    (vLLM's measure) is >= the target; without ``on_pass`` a run that passes is never stopped
    (its trace is the full run's)."""
    slo = SLO(ttft=ttft, tpot=tpot, e2el=e2el)
    profile = get_profile(engine)
    if refused_kinds([deployment], profile, cost) or (
        deployment.chunk_budget is not None and profile.kv == "paged"
    ):
        return
    options = deployment.simulate_options(profile)
    scaled = scale_rate(load, scale)
    trace, verdict = run_verdict(
        deployment.policy, scaled, cost, options, slo, target, on_pass=on_pass
    )
    full = serving_metrics(simulate(deployment.policy, scaled, cost, **options), slo=slo)
    assert verdict.passed == (full.attainment >= target)
    if verdict.passed and not on_pass:
        assert verdict.stopped is None
        assert repr(serving_metrics(trace, slo=slo)) == repr(full)  # NaN where no value
    if verdict.stopped is None:
        assert verdict.misses == full.completed - full.good
    elif verdict.stopped == "failed":
        assert verdict.misses > verdict.allowed


def test_shared_prefix_tokens_counts_the_leading_run_others_carry():
    load = [
        Request("a", 0.0, 64, 1, ("x", "y", "a1", "a2")),
        Request("b", 1.0, 40, 1, ("x", "y", "b1")),  # 2 whole blocks of 16 + 8 tokens
        Request("c", 2.0, 64, 1, ("z", "y", "c1", "c2")),  # y is shared, but not leading
    ]
    assert shared_prefix_tokens(load, 16) == {"a": 32, "b": 32, "c": 0}


LAPTOP = PRESETS["lab-laptop"].cost


def long_prompts(long: int, short: int = 20) -> list[Request]:
    """``long`` prompts of 60,000 tokens (about 3.3 s of prefill alone on the laptop preset)
    among ``short`` short ones, a second apart."""
    return [Request(f"r{i}", float(i), 60_000 if i < long else 100, 4) for i in range(long + short)]


def test_an_slo_more_requests_miss_alone_than_may_miss_is_unreachable_without_simulating():
    load = long_prompts(long=3)  # 3 of 23 miss a 2 s TTFT alone; 90% lets 2 miss
    slo = SLO.parse("ttft:2s,tpot:100ms")
    result = capacity(ServingQuestion(load, LAPTOP, slo, target=0.9, executor=InlineExecutor()), 4)
    assert result.unreachable and result.simulations == 0
    assert result.alone is not None and result.alone.count == 3
    assert "Unreachable: 3 requests" in result.recommendation()
    assert "r0 (60,000 + 4 tokens)" in result.recommendation()
    needed = devices_needed(
        ServingQuestion(load, LAPTOP, slo, target=0.9, executor=InlineExecutor()),
        lambda n: default_deployments(LAPTOP, n, slo),
    )
    assert needed.devices is None and needed.unreachable and needed.checks == ()
    assert devices_needed_line(needed).startswith("Devices this traffic needs: none would do")


def test_as_many_missing_alone_as_may_miss_is_still_searched():
    load = long_prompts(long=2)  # 2 of 22 miss alone; 90% lets 2 miss
    slo = SLO.parse("ttft:2s,tpot:100ms")
    result = capacity(
        ServingQuestion(load, LAPTOP, slo, target=0.9, executor=InlineExecutor()),
        2,
        deployments=[Deployment("shared", 2)],
    )
    assert not result.unreachable and result.simulations > 0
    assert result.results[0].alone == 2
