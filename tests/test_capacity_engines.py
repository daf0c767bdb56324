"""The capacity search under an engine profile: the simulations run the profile's rules with
each deployment's settings, the answer is the flags to type, and on the synthetic
Mooncake-shaped conversation trace (tests/data/mooncake-shaped.jsonl, SYNTHETIC: see
tests/mooncake_shaped.py) under vLLM's rules disaggregated splits find a rate and more prefill
devices help a bunched burst."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pytest_prefill.plan.capacity import capacity
from pytest_prefill.plan.deployments import Deployment
from pytest_prefill.plan.executors import InlineExecutor
from pytest_prefill.plan.metrics import SLO, serving_metrics
from pytest_prefill.plan.question import ServingQuestion
from pytest_prefill.plan.search_loop import ALL_SHORTCUTS
from pytest_prefill.plan.sizing import devices_needed
from pytest_prefill.plan.workloads import poisson, resolve_workload, scale_rate
from pytest_prefill.sim import PRESETS, get_profile, simulate

pytestmark = pytest.mark.sim

COST = PRESETS["datacenter-illustrative"].cost
VLLM = get_profile("vllm")
# vLLM's scheduling with its prefix cache off (--prefix-caching off): the burst's prompts are
# all computed, so what the prefill devices do is the token budget's doing alone
VLLM_NO_CACHE = dataclasses.replace(VLLM, prefix_caching=False)
MOONCAKE = Path(__file__).parent / "data" / "mooncake-shaped.jsonl"
SLO_2S = SLO.parse("ttft:2s,tpot:100ms")  # issue 17's SLO on the conversation trace


def small_load():
    return poisson(20.0, 40, prompt_len=lambda r: r.randint(64, 3000), output_len=8, seed=1)


def test_every_probe_runs_the_profile_with_the_deployments_settings():
    load = small_load()
    deployment = Deployment("chunked", 1, max_batched_tokens=512)
    result = capacity(
        ServingQuestion(load, COST, SLO_2S, engine="vllm", executor=InlineExecutor()),
        1,
        deployments=[deployment],
        tolerance=0.2,
    )
    (found,) = result.results
    assert result.engine is VLLM and found.probes
    first = next(p for p in found.probes if p.metrics is not None)  # None: stopped early
    trace = simulate(
        "chunked", scale_rate(load, first.scale), COST, engine=deployment.engine(VLLM)
    )  # that probe's arrivals
    assert first.metrics.attainment == serving_metrics(trace, slo=SLO_2S).attainment
    assert result.to_dict()["engine"]["name"] == "vllm"


def test_the_answer_is_the_best_deployments_flags():
    result = capacity(
        ServingQuestion(small_load(), COST, SLO_2S, engine="vllm", executor=InlineExecutor()),
        2,
        tolerance=0.3,
    )
    best = result.ranked()[0]
    command = result.command()
    assert command is not None and command.startswith("vllm serve MODEL")
    tokens = best.deployment.max_batched_tokens or VLLM.max_batched_tokens
    assert f"--max-num-batched-tokens {tokens}" in command
    assert result.to_dict()["command"] == command


def test_a_split_under_an_engine_without_one_is_refused():
    with pytest.raises(ValueError, match="runs no prefill:decode split"):
        capacity(
            ServingQuestion(
                small_load(), COST, SLO_2S, engine="llama.cpp", executor=InlineExecutor()
            ),
            2,
            deployments=[Deployment("disaggregated", 2, prefill_workers=1)],
        )


def test_devices_needed_reuses_a_search_only_under_the_same_engine():
    load = small_load()
    kinds = [Deployment("chunked", 1, max_batched_tokens=2048)]
    searched = capacity(
        ServingQuestion(load, COST, SLO_2S, engine="vllm", executor=InlineExecutor()),
        1,
        deployments=kinds,
    )
    same = devices_needed(
        ServingQuestion(load, COST, SLO_2S, engine="vllm", executor=InlineExecutor()),
        lambda n: kinds,
        max_devices=1,
        known=searched,
    )
    other = devices_needed(
        ServingQuestion(load, COST, SLO_2S, engine="lab", executor=InlineExecutor()),
        lambda n: kinds,
        max_devices=1,
        known=searched,
    )
    assert same.checks[0].simulations == 0 < other.checks[0].simulations
    assert (same.engine, other.engine) == ("vllm", "lab")


# --- the synthetic Mooncake-shaped trace (issue 17's done-when) ------------------------------


def mooncake():
    return resolve_workload(str(MOONCAKE))


def burst_ttfts(prefill_workers: int, devices: int = 8) -> list[float]:
    """TTFT of every request of the trace's busiest instant, under vLLM's rules, split
    ``prefill_workers``:rest."""
    load = list(mooncake().requests)
    first = min(r.arrival for r in load)
    burst = {r.id for r in load if r.arrival == first}
    trace = simulate(
        "disaggregated",
        load,
        COST,
        prefill_workers=prefill_workers,
        decode_workers=devices - prefill_workers,
        engine=VLLM_NO_CACHE,
    )
    return [trace.requests[rid].ttft for rid in sorted(burst)]


def test_the_trace_opens_with_a_burst_of_long_prompts():
    load = mooncake().requests
    first = min(r.arrival for r in load)
    burst = [r for r in load if r.arrival == first]
    assert len(burst) >= 16 and all(r.prompt_len > VLLM.max_batched_tokens for r in burst)


def test_more_prefill_devices_serve_a_bunched_burst_sooner():
    """Each prefill pass holds at most the budget (a longer prompt alone), so the burst's
    prompts queue on the prefill workers; more of them drain it sooner."""
    worst = [max(burst_ttfts(p)) for p in (1, 2, 4, 7)]
    assert all(a > b for a, b in zip(worst, worst[1:])), worst
    means = [sum(burst_ttfts(p)) for p in (1, 2, 4, 7)]
    assert all(a > b for a, b in zip(means, means[1:])), means


@pytest.mark.parametrize("profile", [VLLM_NO_CACHE, VLLM], ids=["vllm-no-cache", "vllm"])
def test_on_8_devices_under_vllm_disaggregated_splits_find_a_rate_and_prefill_helps(profile):
    """Without the prefix cache every split's search brackets a rate, rising with the prefill
    devices. With vLLM's cache on (its default since issue 18) 7 prefill workers may meet the
    SLO even when the whole trace arrives at once (the search never misses): every split still
    serves some rate, and more prefill devices never serve less."""
    from pytest_prefill.plan.engine_commands import refusal

    if refusal("disaggregated", profile, COST) is not None:
        pytest.skip("the simulator runs no split with this profile yet")
    splits = [Deployment("disaggregated", 8, prefill_workers=p) for p in (1, 4, 7)]
    result = capacity(
        ServingQuestion(
            mooncake(),
            COST,
            SLO_2S,
            engine=profile,
            shortcuts=dataclasses.replace(ALL_SHORTCUTS, prune=False),
            executor=InlineExecutor(),
        ),
        8,
        deployments=splits,
        tolerance=0.2,
        verify=False,
    )
    rates = [r.max_rate for r in result.results]  # in the order given: 1P, 4P, 7P
    assert all(rate > 0 for rate in rates) and rates == sorted(rates)
    if not profile.prefix_caching:
        assert all(r.status == "found" for r in result.results) and rates[0] < rates[-1]


def test_a_cache_on_takes_the_traces_block_size_and_finds_hits():
    cached = dataclasses.replace(VLLM, kv="paged", prefix_caching=True)
    workload = mooncake()
    assert workload.prefix_block_tokens == 512
    deployment = Deployment("chunked", 1, max_batched_tokens=2048)
    result = capacity(
        ServingQuestion(workload, COST, SLO_2S, engine=cached, executor=InlineExecutor()),
        1,
        deployments=[deployment],
        tolerance=0.3,
    )
    assert result.engine.prefix_block_tokens == 512
    first = next(p for p in result.results[0].probes if p.metrics is not None)  # ran to the end
    trace = simulate(
        "chunked",
        scale_rate(list(workload.requests), first.scale),
        COST,
        engine=deployment.engine(result.engine),
    )
    cached_tokens = sum(r.cached_tokens for r in trace.requests.values())
    assert first.metrics.cached_tokens == cached_tokens > 0
    assert first.metrics.hit_rate == cached_tokens / sum(r.prompt_len for r in workload.requests)


def test_a_deployment_the_simulator_refuses_under_the_profile_is_named_before_any_work():
    from pytest_prefill.plan.engine_commands import refusal

    cached = dataclasses.replace(VLLM, kv="paged", prefix_caching=True)
    split = Deployment("disaggregated", 2, prefill_workers=1)
    reason = refusal("disaggregated", cached, COST, prefill_workers=1, decode_workers=1)
    if reason is None:
        pytest.skip("the simulator runs this split under paged KV")
    with pytest.raises(ValueError, match="deployment disaggregated 1P:1D"):
        capacity(
            ServingQuestion(small_load(), COST, SLO_2S, engine=cached, executor=InlineExecutor()),
            2,
            deployments=[split],
        )
