"""The devices a traffic needs: the search over device counts (doubling, then bisection), its
answer checked against fresh simulations at that count and the one below, the reuse of a
capacity search's own probes, its bound, and bad input."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_prefill.plan.capacity import capacity
from pytest_prefill.plan.deployments import Deployment, default_deployments, deployments_like
from pytest_prefill.plan.executors import InlineExecutor
from pytest_prefill.plan.metrics import SLO, serving_metrics
from pytest_prefill.plan.question import ServingQuestion
from pytest_prefill.plan.sizing import devices_needed, smallest_count
from pytest_prefill.plan.workloads import poisson
from pytest_prefill.sim import PRESETS, simulate

pytestmark = pytest.mark.sim

COST = PRESETS["datacenter-illustrative"].cost
SLO_1S = SLO.parse("ttft:1s,tpot:100ms")
# 1,024-token prompts at 150 req/s: about 1.5 s of prefill a second, more than one device does
LOAD = poisson(150.0, 150, prompt_len=1024, output_len=16, seed=3)


def shared_only(devices: int) -> list[Deployment]:
    return [Deployment("shared", devices)]


def attains(deployment: Deployment, load=LOAD, slo=SLO_1S) -> float:
    """Attainment at the load's own rate, simulated afresh (no search code)."""
    trace = simulate(deployment.policy, load, COST, **deployment.simulate_options())
    return serving_metrics(trace, slo=slo).attainment


@given(
    threshold=st.integers(1, 300),
    start=st.integers(1, 300),
    limit=st.integers(1, 300),
    guess=st.one_of(st.none(), st.integers(1, 300)),
)
def test_the_count_search_finds_the_threshold_of_a_monotone_test(threshold, start, limit, guess):
    start = min(start, limit)
    asked: list[int] = []

    def meets(n: int) -> bool:
        asked.append(n)
        return n >= threshold

    found = smallest_count(meets, start, limit, guess)  # a guess changes the path only
    assert found == (threshold if threshold <= limit else None)
    assert all(1 <= n <= limit for n in asked)
    # doubling then bisecting (twice, from a guess): logarithms of the range, never a walk
    assert len(asked) <= 3 * (limit.bit_length() + 1) + 1
    if guess == threshold < start <= limit:  # a right guess: the start, the guess, one below
        assert len(asked) <= 3


def test_the_answer_meets_at_its_count_and_the_count_below_misses():
    needed = devices_needed(
        ServingQuestion(LOAD, COST, SLO_1S, executor=InlineExecutor()), shared_only
    )
    assert needed.devices is not None and needed.devices > 1
    assert attains(Deployment("shared", needed.devices)) >= 0.9
    assert attains(Deployment("shared", needed.devices - 1)) < 0.9
    checked = {c.devices: c.meets for c in needed.checks}
    assert checked[needed.devices] and not checked[needed.devices - 1]
    assert needed.deployment == Deployment("shared", needed.devices)


def test_every_kind_of_deployment_is_tried_and_the_first_that_meets_ends_a_count():
    kinds = lambda n: default_deployments(COST, n, SLO_1S)  # noqa: E731
    needed = devices_needed(ServingQuestion(LOAD, COST, SLO_1S, executor=InlineExecutor()), kinds)
    assert needed.devices is not None
    at = [c for c in needed.checks if c.devices == needed.devices][0]
    assert at.best is not None and attains(at.best) >= 0.9
    below = [c for c in needed.checks if c.devices == needed.devices - 1]
    if below:  # every deployment of the count below was simulated, and none meets
        assert below[0].simulations == len(kinds(needed.devices - 1))
        assert all(attains(d) < 0.9 for d in kinds(needed.devices - 1))


def test_a_capacity_search_answers_its_own_count_without_simulating_it_again():
    known = capacity(
        ServingQuestion(LOAD, COST, SLO_1S, executor=InlineExecutor()),
        8,
        deployments=shared_only(8),
    )
    needed = devices_needed(
        ServingQuestion(LOAD, COST, SLO_1S, executor=InlineExecutor()),
        shared_only,
        start=8,
        known=known,
    )
    first = needed.checks[0]
    assert first.devices == 8 and first.simulations == 0
    at_rate = [p for p in known.results[0].probes if p.scale == 1.0]
    assert first.meets == (known.results[0].max_rate >= known.base_rate)
    if at_rate:  # the search ran the workload's own rate: its attainment, else one run more
        assert first.attainment == at_rate[0].attainment
    json.dumps(needed.to_dict(), allow_nan=False)  # an attainment not known is null
    alone = devices_needed(
        ServingQuestion(LOAD, COST, SLO_1S, executor=InlineExecutor()), shared_only, start=8
    )
    assert alone.devices == needed.devices


def test_the_search_stops_at_its_bound_and_says_so():
    # 15 ms: a prompt's prefill alone (11.2 ms) fits, but the first token waits a decode step
    lines: list[str] = []
    needed = devices_needed(ServingQuestion(LOAD, COST, SLO.parse("ttft:15ms"), executor=InlineExecutor(), progress=lines.append), shared_only, max_devices=5)  # fmt: skip
    assert needed.devices is None and needed.deployment is None
    assert [c.devices for c in needed.checks] == [1, 2, 4, 5]
    assert len(lines) == len(needed.checks) and all("misses" in line for line in lines)


def test_a_count_no_deployment_fits_misses():
    splits_only = [Deployment("disaggregated", 2, prefill_workers=1)]
    kinds = lambda n: deployments_like(splits_only, n, COST)  # noqa: E731
    needed = devices_needed(
        ServingQuestion(LOAD, COST, SLO_1S, executor=InlineExecutor()), kinds, max_devices=16
    )
    one = [c for c in needed.checks if c.devices == 1]
    assert not one or (one[0].best is None and not one[0].meets)


def test_deployments_like_keeps_the_kinds_on_another_count():
    given_ = [
        Deployment("shared", 4),
        Deployment("chunked", 4, chunk=512),
        Deployment("disaggregated", 4, prefill_workers=1),
    ]
    labels = [d.label for d in deployments_like(given_, 3, COST)]
    assert labels == ["shared ×3", "chunked 512 ×3", "disaggregated 1P:2D", "disaggregated 2P:1D"]
    assert [d.label for d in deployments_like(given_, 1, COST)] == ["shared ×1", "chunked 512 ×1"]
    assert deployments_like([], 2, COST, SLO_1S) == default_deployments(COST, 2, SLO_1S)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"start": 0}, "start must be an integer >= 1"),
        ({"max_devices": 0}, "max_devices must be an integer >= 1"),
        ({"start": 9, "max_devices": 8}, "must not be above max_devices"),
        ({"target": 1.5}, "target attainment must be in"),
    ],
)
def test_bad_input_is_a_named_error(kwargs, message):
    asked = {k: kwargs.pop(k) for k in ("target",) if k in kwargs}
    with pytest.raises(ValueError, match=message):
        question = ServingQuestion(LOAD, COST, SLO_1S, executor=InlineExecutor(), **asked)
        devices_needed(question, shared_only, **kwargs)


def test_both_searches_refuse_what_is_not_a_question():
    with pytest.raises(ValueError, match="question must be a ServingQuestion"):
        devices_needed((LOAD, COST, SLO_1S), shared_only)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="question must be a ServingQuestion"):
        capacity((LOAD, COST, SLO_1S), 1)  # type: ignore[arg-type]


def test_a_count_that_meets_names_the_first_deployment_in_order_that_meets_on_any_executor():
    from pytest_prefill.plan.executors import local_executor

    kinds = lambda n: default_deployments(COST, n, SLO_1S)  # noqa: E731
    inline = devices_needed(ServingQuestion(LOAD, COST, SLO_1S, executor=InlineExecutor()), kinds)
    assert inline.devices is not None
    order = list(kinds(inline.devices))
    first = next(d for d in order if attains(d) >= 0.9)
    assert inline.deployment == first
    with local_executor(2) as pool:
        pooled = devices_needed(ServingQuestion(LOAD, COST, SLO_1S, executor=pool), kinds)
    assert [(c.devices, c.best, c.meets) for c in pooled.checks] == [
        (c.devices, c.best, c.meets) for c in inline.checks
    ]
