"""Pools of their own (plan/pools.py; ``simulate(..., decode_cost=)``): the grammar, devices
per kind, the link between kinds, and a split whose decode pool runs on another cost model
(its own steps' prices, its own KV bound)."""

from __future__ import annotations

import dataclasses

import pytest
from strategies import V2

from pytest_prefill.plan.compute.devices import device_named
from pytest_prefill.plan.model_spec import load_model_spec
from pytest_prefill.plan.pools import PoolSpec, link_between, parse_pools
from pytest_prefill.sim import (
    PROFILES,
    EngineProfile,
    Request,
    check_invariants,
    iteration_cost,
    simulate,
)

PREFILL_FIRST = EngineProfile("pf", first_token="prefill")
PROFILES_VLLM = PROFILES["vllm"]


def test_the_issues_example_parses_into_two_pools_counted_per_kind():
    split = parse_pools("disaggregated:2:4,p=h100:tp2,d=l40s:tp1")
    assert (split.prefill.kind, split.prefill.tp, split.prefill.instances) == ("h100-sxm", 2, 2)
    assert (split.decode.kind, split.decode.tp, split.decode.instances) == ("l40s", 1, 4)
    assert split.devices_by_kind() == {"h100-sxm": 4, "l40s": 4}
    assert split.simulate_options() == {"prefill_workers": 2, "decode_workers": 4}
    same = parse_pools("disaggregated:1:3,p=h200")  # the other pool takes its kind, TP 1
    assert same.devices_by_kind() == {"h200": 4}


def test_the_kv_crosses_the_slower_of_the_two_kinds_links():
    h100, l40s = device_named("h100"), device_named("l40s")
    bandwidth, latency = link_between(h100, l40s)
    assert bandwidth == min(h100.link_bandwidth, l40s.link_bandwidth)
    assert latency == max(h100.link_latency, l40s.link_latency)
    split = parse_pools("disaggregated:1:1,p=h100,d=l40s")
    prefill, decode = split.costs(lambda pool: V2)
    assert (prefill.link_bandwidth, prefill.link_latency) == (bandwidth, latency)
    assert decode == V2


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("disaggregated:2:4,p=h900", "prefill pool: unknown gpu 'h900': the catalog has"),
        ("disaggregated:2:4,d=h100:tp3", "decode pool: tp=3 does not divide llama-3.1-8b's 32"),
        ("disaggregated:2", "expected disaggregated:P:D,p=KIND"),
        ("disaggregated:1:1,p=h100:tpx", "TP is tpN"),
        ("disaggregated:0:1,p=h100", "prefill pool: instances must be an integer >= 1"),
        ("disaggregated:1:1,q=h100", "p=KIND\\[:tpN\\] or d=KIND\\[:tpN\\] once each"),
    ],
)
def test_bad_pools_are_one_line_naming_the_field(text, message):
    with pytest.raises(ValueError, match=message) as err:
        parse_pools(text, load_model_spec("llama-3.1-8b"))
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="pool role must be"):
        PoolSpec("both", "h100", 1, 1)


def test_each_pool_is_priced_by_its_own_cost_model():
    slow = dataclasses.replace(V2, decode_step_base=3 * V2.decode_step_base)
    load = [Request(f"r{i}", 0.01 * i, 200 + 50 * i, 12) for i in range(6)]
    trace = simulate(
        "disaggregated", load, V2, engine=PREFILL_FIRST, decode_workers=2, decode_cost=slow
    )
    assert check_invariants(trace, load) == []
    for e in trace.events:
        if e.kind == "transfer":
            continue
        priced = slow if e.resource.startswith("decode") else V2
        assert e.duration == pytest.approx(iteration_cost(e, priced), rel=1e-9)


def test_the_decode_pools_memory_bounds_the_decode_workers_only():
    block = 16
    load = [Request(f"r{i}", 0.0, 10 * block, 10 * block) for i in range(4)]
    paged = EngineProfile("p", first_token="prefill", kv="paged", kv_block_tokens=block)
    roomy = dataclasses.replace(V2, kv_capacity_tokens=float(100 * block))
    tight = dataclasses.replace(V2, kv_capacity_tokens=float(25 * block))  # one at a time
    trace = simulate("disaggregated", load, roomy, engine=paged, decode_cost=tight)
    starts = {rec.prefill_start for rec in trace.requests.values()}
    assert starts == {0.0}  # the prefill pool holds every prompt at once
    spans = sorted((rec.token_times[1], rec.finish) for rec in trace.requests.values())
    assert trace.summary().preemptions > 0 or all(
        later[0] > earlier[1] for earlier, later in zip(spans, spans[1:])
    )
    with pytest.raises(ValueError, match="decode_cost is the decode pool's cost model"):
        simulate("shared", load, V2, decode_cost=V2)
    with pytest.raises(ValueError, match="decode_cost must be a CostModel or None"):
        simulate("disaggregated", load, V2, decode_cost="fast")


def test_a_split_of_pools_runs_through_the_capacity_search_with_each_pools_cost():
    from pytest_prefill.plan.capacity import capacity
    from pytest_prefill.plan.deployments import Deployment
    from pytest_prefill.plan.executors import InlineExecutor
    from pytest_prefill.plan.metrics import SLO
    from pytest_prefill.plan.question import ServingQuestion
    from pytest_prefill.plan.workloads import poisson, scale_rate
    from pytest_prefill.sim import PRESETS

    base = PRESETS["datacenter-illustrative"].cost
    slower = dataclasses.replace(base, decode_step_base=4 * base.decode_step_base)
    split = parse_pools("disaggregated:1:2,p=h100,d=l40s")
    prefill, decode = split.costs(lambda pool: base if pool.role == "prefill" else slower)
    pooled = Deployment.of_pools(split, prefill, decode)
    assert pooled.label == "disaggregated 1P h100-sxm : 2D l40s"
    assert (pooled.devices, pooled.prefill_workers, pooled.decode_workers) == (3, 1, 2)
    assert pooled.simulate_options()["decode_cost"] is decode
    lines = pooled.command(PROFILES_VLLM)
    assert lines.startswith("prefill pool, h100-sxm: vllm serve") and "decode pool, l40s:" in lines
    load = poisson(10.0, 40, prompt_len=lambda r: r.randint(64, 1500), output_len=8, seed=1)
    slo = SLO.parse("ttft:2s,tpot:100ms")
    result = capacity(
        ServingQuestion(load, base, slo, executor=InlineExecutor()),
        3,
        deployments=[pooled],
        tolerance=0.3,
    )
    (found,) = result.results
    first = next(p for p in found.probes if p.metrics is not None)
    trace = simulate(
        "disaggregated", scale_rate(load, first.scale), prefill, **pooled.simulate_options()
    )
    from pytest_prefill.plan.metrics import serving_metrics

    assert first.metrics.attainment == serving_metrics(trace, slo=slo).attainment
    assert result.to_dict()["results"][0]["deployment"]["pools"]["decode"]["kind"] == "l40s"
    with pytest.raises(ValueError, match="devices must be its 3 and prefill_workers its 1"):
        Deployment("disaggregated", 4, prefill_workers=1, pools=split)
    with pytest.raises(ValueError, match="decode_cost applies to disaggregated deployments"):
        Deployment("shared", 2, decode_cost=base)


def test_each_pool_line_carries_its_sides_split_flag_and_the_splits_router():
    from pytest_prefill.plan.deployments import Deployment
    from pytest_prefill.plan.engine_commands import ENGINE_COMMANDS, pool_line
    from pytest_prefill.sim import PRESETS

    base = PRESETS["datacenter-illustrative"].cost
    split = parse_pools("disaggregated:1:2,p=h100,d=l40s")
    pooled = Deployment.of_pools(split, *split.costs(lambda pool: base))
    command = ENGINE_COMMANDS["vllm"]
    assert command.split is not None
    prefill_line, decode_line = pooled.command(PROFILES_VLLM).splitlines()
    for line, flag, role, count in (
        (prefill_line, command.split[0], "prefill", 1),
        (decode_line, command.split[1], "decode", 2),
    ):
        assert flag in line and f"(× {count}, one per device, {role}; " in line
        assert command.router_of(True) in line and command.router_of(False) not in line
    with pytest.raises(ValueError, match="role must be"):
        pool_line(PROFILES_VLLM, "both", 1)
