"""A simulation that stops once its SLO verdict is decided (sim/stop.py): its pass/fail is the
full run's attainment >= target, for every policy and engine; what it keeps is the full run's
up to where it stopped; and the per-request SLO test is the one serving metrics use."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import cost_models, examples, loads, policies

from pytest_prefill.plan.metrics import SLO, serving_metrics
from pytest_prefill.plan.verdict import allowed_misses
from pytest_prefill.sim import PRESETS, Request, StopRule, meets, simulate, slo_values

pytestmark = pytest.mark.sim

ENGINES = ("lab", "vllm", "sglang", "distserve")
bounds = st.sampled_from([None, 0.01, 0.05, 0.2, 1.0, 5.0])


def options(policy: str, engine: str) -> dict[str, object]:
    return {"chunk": 128, "engine": engine} if policy == "chunked" else {"engine": engine}


@st.composite
def slos(draw: st.DrawFn) -> SLO:
    ttft, tpot, e2el = draw(bounds), draw(bounds), draw(bounds)
    if ttft is tpot is e2el is None:
        ttft = draw(st.sampled_from([0.01, 0.2, 1.0]))
    return SLO(ttft=ttft, tpot=tpot, e2el=e2el)


@examples(120)
@given(
    load=loads(max_requests=16),
    cost=cost_models(),
    policy=policies,
    engine=st.sampled_from(ENGINES),
    slo=slos(),
    target=st.sampled_from([0.5, 0.75, 0.9, 0.95, 1.0]),
)
def test_a_stopped_run_passes_exactly_when_the_full_run_attains_the_target(
    load, cost, policy, engine, slo, target
):
    full = simulate(policy, load, cost, **options(policy, engine))
    attained = serving_metrics(full, slo=slo).attainment >= target
    allowed = allowed_misses(target, len(load))
    rule = StopRule(ttft=slo.ttft, tpot=slo.tpot, e2el=slo.e2el, allowed_misses=allowed)
    stopped = simulate(policy, load, cost, stop=rule, **options(policy, engine))
    full_misses = sum(
        not meets(slo.bounds, *slo_values(r.arrival, r.first_token, r.finish, r.output_len))
        for r in full.requests.values()
    )
    if stopped.stopped is None:  # it ran to the end: every request judged
        assert stopped.misses == full_misses
        assert (stopped.misses <= allowed) == attained
        assert stopped.summary() == full.summary()
    else:
        assert stopped.stopped == ("passed" if attained else "failed")
        if stopped.stopped == "failed":
            assert allowed < stopped.misses <= full_misses
        else:
            assert stopped.misses <= full_misses <= allowed
        # what it kept is the full run's, up to where it stopped
        for rid, record in stopped.requests.items():
            assert record == full.requests[rid]
        assert len(stopped.requests) < len(load)


@examples(40)
@given(load=loads(), cost=cost_models(), policy=policies)
def test_without_a_stop_rule_nothing_changes(load, cost, policy):
    trace = simulate(policy, load, cost, chunk=64)
    assert trace.stopped is None and trace.misses == 0
    same = simulate(policy, load, cost, chunk=64, stop=None)
    assert same == trace and same.summary() == trace.summary()


def test_a_run_fails_as_soon_as_one_request_waits_past_the_ttft_bound():
    cost = PRESETS["lab-laptop"].cost
    # one long prompt, then short ones behind it: when its pass ends, every request (the
    # long one too: its first token comes after a decode step) has waited past the bound
    load = [Request("long", 0.0, 4000, 50)]
    load += [Request(f"s{i}", 0.001 * (i + 1), 16, 40) for i in range(40)]
    ttft = cost.prefill_pass(4000) / 4
    full = simulate("shared", load, cost)
    rule = StopRule(ttft=ttft, allowed_misses=0)
    stopped = simulate("shared", load, cost, stop=rule)
    assert stopped.stopped == "failed" and stopped.misses == len(load)
    assert not stopped.requests  # none had finished: nothing more was simulated
    assert "stopped failed" in repr(stopped)
    with pytest.raises(ValueError, match="stopped early"):
        stopped.summary()
    assert serving_metrics(full, slo=SLO(ttft=ttft)).attainment < 1


def test_a_run_stops_at_the_first_finish_that_fixes_the_verdict():
    load = [Request(f"r{i}", 0.01 * i, 100, 20 + i) for i in range(20)]
    cost = PRESETS["lab-laptop"].cost
    strict = simulate("chunked", load, cost, chunk=64, stop=StopRule(e2el=1e-6))
    assert strict.stopped == "failed" and strict.misses == 1  # no miss allowed: the first
    assert list(strict.requests) == ["r0"]
    rule = StopRule(e2el=1e3, allowed_misses=len(load) - 1)  # every request meets it
    lenient = simulate("chunked", load, cost, chunk=64, stop=rule)
    assert lenient.stopped == "passed" and lenient.misses == 0  # one met: 19 cannot fail it
    assert list(lenient.requests) == ["r0"]
    everyone = simulate("chunked", load, cost, chunk=64, stop=dataclasses.replace(rule, e2el=1e-6))
    assert everyone.stopped is None and everyone.misses == len(load)  # fixed at the very end


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({}, "at least one bound"),
        ({"ttft": 0.0}, "StopRule.ttft"),
        ({"tpot": math.inf}, "StopRule.tpot"),
        ({"e2el": "1s"}, "StopRule.e2el"),
        ({"ttft": 1.0, "allowed_misses": -1}, "allowed_misses"),
        ({"ttft": 1.0, "allowed_misses": 1.5}, "allowed_misses"),
        ({"ttft": 1.0, "allowed_misses": True}, "allowed_misses"),
    ],
)
def test_a_bad_stop_rule_is_named(fields, match):
    with pytest.raises(ValueError, match=match):
        StopRule(**fields)


def test_simulate_names_a_stop_that_is_not_a_stop_rule():
    with pytest.raises(ValueError, match="stop must be a StopRule"):
        simulate("shared", [Request("a", 0.0, 8, 2)], PRESETS["lab-laptop"].cost, stop=0.5)


def test_the_slo_test_is_vllms():
    # TPOT = (E2EL - TTFT) / (output_len - 1); a one-token request's TPOT counts as 0
    assert slo_values(1.0, 1.5, 3.5, 5) == (0.5, 0.5, 2.5)
    assert slo_values(1.0, 1.5, 1.5, 1) == (0.5, None, 0.5)
    assert meets((("tpot", 1e-9),), 0.5, None, 0.5)
    assert meets((("ttft", 0.5), ("e2el", 2.5)), 0.5, 0.5, 2.5)  # a bound met with equality
    assert not meets((("ttft", 0.5), ("tpot", 0.4)), 0.5, 0.5, 2.5)
