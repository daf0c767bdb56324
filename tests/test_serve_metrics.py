"""A server's /metrics: the engine samples parsed by prometheus_client's parser and summed over
labels, counters differenced over a run (the prefix cache's hit rate, preemptions), gauges read
after it; a run against the reference server counts exactly the tokens it sent; a server
without /metrics gives nothing and changes nothing."""

from __future__ import annotations

import asyncio
import math

import pytest

from pytest_prefill.serve.client.identity import identify
from pytest_prefill.serve.client.prompts import Prompts
from pytest_prefill.serve.launch.reference import Behaviour, running
from pytest_prefill.serve.load.loadgen import Bounds, Target
from pytest_prefill.sim import Request

pytest.importorskip("prometheus_client")

from pytest_prefill.serve.load.records import ServerCounters  # noqa: E402
from pytest_prefill.serve.load.server_metrics import parse_metrics, run_counted  # noqa: E402

VLLM_TEXT = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{engine="0",model_name="m"} 3.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_queries_total{engine="1",model_name="m"} 200.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 300.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 4.0
vllm:time_to_first_token_seconds_count{model_name="m"} 4.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 0.2
# TYPE process_cpu_seconds counter
process_cpu_seconds_total 12.0
"""

WORDS = Prompts(
    tuple(f" w{chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(80)), tuple(range(80)), "test"
)


def test_engine_counters_and_gauges_are_read_and_summed_over_labels():
    samples = parse_metrics(VLLM_TEXT)
    assert samples["vllm:prefix_cache_queries_total"] == 1200.0  # two engines' samples summed
    assert samples["vllm:num_requests_running"] == 2.0
    assert not any(name.startswith("process_") for name in samples)
    assert not any("time_to_first_token" in name for name in samples)  # histograms left out


def test_counters_are_differenced_over_the_run_and_gauges_read_after_it():
    before = parse_metrics(VLLM_TEXT)
    after = dict(before)
    after["vllm:prefix_cache_queries_total"] += 800.0
    after["vllm:prefix_cache_hits_total"] += 200.0
    after["vllm:num_preemptions_total"] += 1.0
    counters = ServerCounters(before, after)
    assert counters.hit_rate == pytest.approx(200.0 / 800.0)
    assert counters.delta("preemptions") == 1.0 and counters.gauge("kv_usage") == 0.25
    assert counters.delta("prompt_tokens") is None  # this server has no such counter
    assert "25.0%" in counters.line() and "1 preemptions" in counters.line()
    assert math.isnan(ServerCounters(before, before).hit_rate)  # nothing queried


def test_not_prometheus_text_is_refused():
    with pytest.raises(ValueError, match="Prometheus"):
        parse_metrics("vllm:x{ 1 2 3\n")


@pytest.mark.parametrize("metrics", [True, False])
def test_a_run_counts_exactly_what_it_sent_where_the_server_has_metrics(metrics):
    load = [Request(f"r{i}", 0.01 * i, 10 + i, 3) for i in range(5)]

    async def go():
        async with running(Behaviour(ttft=0.005, gap=0.001, metrics=metrics)) as url:
            target = Target(url, await identify(url, engine="openai"), WORDS)
            return await run_counted(target, load, bounds=Bounds(warmup=1))

    run = asyncio.run(go())
    assert len(run.completed) == len(load)
    if not metrics:
        assert run.server_counters is None and run.to_dict()["server_counters"] is None
        return
    counters = run.server_counters
    assert counters is not None
    assert counters.delta("prompt_tokens") == sum(r.prompt_len for r in load)  # warm-up excluded
    assert counters.delta("generation_tokens") == sum(r.output_len for r in load)
    assert run.to_dict()["server_counters"]["summary"]["prompt_tokens"] == sum(
        r.prompt_len for r in load
    )


def test_a_prefix_check_sets_the_servers_hit_rate_beside_the_simulated_one():
    import dataclasses

    from pytest_prefill.measure.calibrate import Calibration
    from pytest_prefill.serve.calibration.calibration_fit import RequestOverhead
    from pytest_prefill.serve.calibration.server_calibration import ServerCalibration, ServerSweep
    from pytest_prefill.serve.calibration.server_model import Scheduling, server_profile
    from pytest_prefill.serve.fidelity.prefix_check import prefix_check
    from pytest_prefill.serve.load.records import BenchRun, ServerRecord
    from pytest_prefill.sim import CostModel, simulated_engine

    cost = CostModel(prefill_pass_overhead=0.01, prefill_per_token=1e-4, decode_step_base=0.01)
    calibration = ServerCalibration(
        Calibration(cost, {}, (), {}, ()),
        RequestOverhead(0.0, 0.0, 0.0, "none"),
        (),
        ServerSweep(256),
    )
    # four requests: the last three share the first's two leading 64-token blocks
    load = [Request(f"m{i}", 2.0 * i, 192, 4, (1, 2, 10 + i)) for i in range(4)]
    records = tuple(
        ServerRecord(
            r.id,
            r.arrival,
            r.arrival,
            192,
            4,
            tuple(r.arrival + 0.1 * k for k in range(1, 5)),
            (1,) * 4,
            192,
            4,
        )
        for r in load
    )
    before = {"vllm:prefix_cache_queries_total": 0.0, "vllm:prefix_cache_hits_total": 0.0}
    after = {"vllm:prefix_cache_queries_total": 768.0, "vllm:prefix_cache_hits_total": 384.0}
    run = BenchRun(records, {}, {}, "now", server_counters=ServerCounters(before, after))
    profile = simulated_engine(
        dataclasses.replace(server_profile("vllm", 256, 8), prefix_block_tokens=64)
    )
    check = prefix_check(run, load, calibration, Scheduling(profile))
    assert check.server_hit_rate == 0.5 and check.requests == 4
    assert check.simulated_hit_rate == pytest.approx(3 * 128 / (4 * 192))  # 2 blocks, 3 hits
    assert check.hit_rate_gap == pytest.approx(check.simulated_hit_rate - 0.5)
    cold = prefix_check(
        run,
        [dataclasses.replace(r, prefix_blocks=()) for r in load],
        calibration,
        Scheduling(profile),
    )
    assert cold.simulated_hit_rate == 0.0
    assert check.simulated_ttft[0] < cold.simulated_ttft[0]  # hits skip prefill
    assert "50.0%" in check.line()
