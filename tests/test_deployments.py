"""Deployments in an engine's own settings: the token budgets searched around C*, which kinds
each engine is given, the settings a deployment passes to the simulator, and parsing them."""

from __future__ import annotations

import dataclasses
import math

import pytest

from pytest_prefill.plan.advice import typical_star
from pytest_prefill.plan.deployments import (
    Deployment,
    default_deployments,
    default_splits,
    deployments_like,
    search_budgets,
    search_chunks,
)
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.sim import LAB, PRESETS, get_profile

pytestmark = pytest.mark.sim

COST = PRESETS["datacenter-illustrative"].cost
SLO_1S = SLO.parse("ttft:1s,tpot:100ms")
VLLM = get_profile("vllm")
# vLLM's scheduling knobs with KV reserved and no prefix cache: every kind of deployment runs
VLLM_PLAIN = dataclasses.replace(VLLM, kv="reserve", prefix_caching=False)


def test_budgets_are_the_powers_of_two_around_c_star_and_the_profiles_own():
    star = typical_star(COST)
    expected = {2 ** round(math.log2(star * f)) for f in (0.5, 1.0, 2.0)} | {2048}
    assert search_budgets(COST, VLLM) == tuple(sorted(expected))


def test_vllm_is_given_its_budgets_and_splits_and_no_time_budget():
    deployments = default_deployments(COST, 4, SLO_1S, VLLM_PLAIN)
    colocated = [d for d in deployments if d.policy != "disaggregated"]
    assert {d.policy for d in colocated} == {"chunked"}
    assert [d.max_batched_tokens for d in colocated] == list(search_budgets(COST, VLLM))
    assert not any(d.chunk_budget or d.chunk for d in deployments)
    split = [d for d in deployments if d.policy == "disaggregated"]
    assert [d.prefill_workers for d in split] == list(default_splits(4))
    assert all(d.max_batched_tokens == VLLM.max_batched_tokens for d in split)


def test_the_lab_keeps_its_own_set():
    labels = [d.label for d in default_deployments(COST, 4, SLO_1S, LAB)]
    assert labels[0] == "shared ×4" and "chunked ≤100ms ×4" in labels
    assert [d.chunk for d in default_deployments(COST, 4, SLO_1S) if d.chunk] == list(
        search_chunks(COST)
    )
    assert default_deployments(COST, 4, SLO_1S) == default_deployments(COST, 4, SLO_1S, LAB)


@pytest.mark.parametrize("name", ["llama.cpp", "transformers"])
def test_an_engine_without_a_split_is_given_no_split(name):
    deployments = default_deployments(COST, 4, SLO_1S, get_profile(name))
    assert deployments and not any(d.policy == "disaggregated" for d in deployments)


def test_distserve_is_given_its_colocated_baseline_and_the_splits():
    deployments = default_deployments(COST, 3, SLO_1S, get_profile("distserve"))
    assert [d.label for d in deployments] == [
        "shared ×3",
        "disaggregated 1P:2D",
        "disaggregated 2P:1D",
    ]


def test_a_deployments_settings_replace_the_profiles_in_the_simulation():
    deployment = Deployment("chunked", 2, max_batched_tokens=512)
    options = deployment.simulate_options(VLLM)
    assert options["replicas"] == 2
    engine = options["engine"]
    assert engine.max_batched_tokens == 512 and engine.max_seqs == VLLM.max_seqs
    assert engine == dataclasses.replace(VLLM, max_batched_tokens=512)
    assert Deployment("shared", 2).simulate_options(VLLM)["engine"] is VLLM


@pytest.mark.parametrize(
    ("text", "label", "tokens", "seqs"),
    [
        ("chunked,tokens=1024", "chunked ≤1024 tok ×4", 1024, None),
        ("chunked,tokens=1024,seqs=64", "chunked ≤1024 tok ×4, ≤64 seqs", 1024, 64),
        ("disaggregated:1:3,tokens=8192", "disaggregated 1P:3D ≤8192 tok", 8192, None),
        ("shared,seqs=8", "shared ×4, ≤8 seqs", None, 8),
    ],
)
def test_engine_settings_parse(text, label, tokens, seqs):
    deployment = Deployment.parse(text, 4)
    assert (deployment.label, deployment.max_batched_tokens, deployment.max_seqs) == (
        label,
        tokens,
        seqs,
    )


def test_a_bare_chunked_under_an_engine_with_a_budget_takes_it():
    assert Deployment.parse("chunked", 2, VLLM).max_batched_tokens == VLLM.max_batched_tokens
    with pytest.raises(ValueError, match="needs its size"):
        Deployment.parse("chunked", 2, LAB)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("chunked,tokens=0", "max_batched_tokens must be"),
        ("chunked,budget=5", "after a comma, tokens=N"),
        ("chunked,tokens=x", "after a comma, tokens=N"),
        ("shared,seqs=0", "max_seqs must be"),
    ],
)
def test_bad_engine_settings_are_named_errors(text, message):
    with pytest.raises(ValueError, match=message):
        Deployment.parse(text, 4)


def test_deployments_like_keeps_a_splits_settings_on_another_count():
    given = [Deployment("disaggregated", 4, prefill_workers=1, max_batched_tokens=1024)]
    moved = deployments_like(given, 3, COST, SLO_1S, VLLM)
    assert [d.label for d in moved] == [
        "disaggregated 1P:2D ≤1024 tok",
        "disaggregated 2P:1D ≤1024 tok",
    ]
    assert deployments_like([], 2, COST, SLO_1S, VLLM) == default_deployments(COST, 2, SLO_1S, VLLM)


def test_kinds_the_simulator_refuses_under_a_profile_are_left_out_with_the_reason():
    from pytest_prefill.plan.deployments import refused_kinds
    from pytest_prefill.plan.engine_commands import refusal

    paged = dataclasses.replace(VLLM, kv="paged", prefix_caching=True)
    everything = default_deployments(COST, 4, SLO_1S, VLLM_PLAIN)
    reason = refusal("disaggregated", paged)
    kept = default_deployments(COST, 4, SLO_1S, paged)
    if reason is None:  # the simulator runs splits with paged KV: nothing is left out
        assert kept == everything
    else:
        assert refused_kinds(everything, paged) == {"disaggregated": reason}
        assert kept == tuple(d for d in everything if d.policy != "disaggregated")
    assert refused_kinds(everything, VLLM_PLAIN) == {}
