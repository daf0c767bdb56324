"""The load check without an engine: a factor on every cost in seconds scales every iteration
by it; a run the simulator made with its costs times k is fitted back to k and kept, one at the
calibration's own speed is refused (the interval holds 1), one slower than any factor searched
is refused loudly, too few requests fit nothing; and a run against the reference server keeps
every request, its fit and its JSON."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random

import pytest

from pytest_prefill.serve.calibration.calibration_fit import RequestOverhead
from pytest_prefill.serve.calibration.server_model import (
    TIME_TERMS,
    Scheduling,
    ServerModel,
    scaled_cost,
    server_profile,
    simulate_records,
)
from pytest_prefill.serve.load.records import BenchRun, ServerRecord
from pytest_prefill.sim import CostModel, Request
from pytest_prefill.verify.load_check import (
    FACTORS,
    MIN_REQUESTS,
    LoadCheck,
    LoadFactor,
    LoadRun,
    factor_at,
    fit_load_factor,
    run_load_check,
    run_speeds,
    speed_range,
)

COST = CostModel(
    prefill_pass_overhead=0.01,
    prefill_per_token=2e-4,
    decode_step_base=0.01,
    decode_per_seq=5e-4,
    decode_per_kv_token=1e-7,
    prefill_per_pair=5e-8,
    fusion_penalty=0.3,
)
WAY = RequestOverhead(0.004, 0.003, 0.001, "test")
SCHEDULING = Scheduling(server_profile("vllm", 256, 8))
MODEL = ServerModel(COST, WAY, SCHEDULING)


def _load(n: int, rate: float = 12.0) -> list[Request]:
    rng, t, load = random.Random(7), 0.0, []
    for i in range(n):
        load.append(Request(f"q{i}", t, rng.choice((64, 200, 400, 700)), rng.choice((8, 24, 40))))
        t += rng.expovariate(rate)
    return load


def _made_at(factor: float, n: int = 60) -> list[ServerRecord]:
    """A run the simulator makes with every cost times ``factor``, as a server's records."""
    skeletons = [
        ServerRecord(r.id, r.arrival, r.arrival, r.prompt_len, r.output_len, (0.0,) * r.output_len)
        for r in _load(n)
    ]
    skeletons = [dataclasses.replace(s, chunk_tokens=(1,) * s.output_len) for s in skeletons]
    made = simulate_records(skeletons, MODEL.scaled(factor))
    return [
        dataclasses.replace(s, chunk_times=m.token_times, output_tokens=s.output_len)
        for s, m in zip(skeletons, made)
    ]


def test_a_factor_scales_every_term_in_seconds_and_so_every_iteration():
    k = 1.37
    scaled = scaled_cost(COST, k)
    for field in dataclasses.fields(CostModel):
        want = getattr(COST, field.name) * (k if field.name in TIME_TERMS else 1)
        assert getattr(scaled, field.name) == pytest.approx(want)
    assert scaled.prefill_pass(300, 128) == pytest.approx(k * COST.prefill_pass(300, 128))
    assert scaled.decode_step(5, 2000) == pytest.approx(k * COST.decode_step(5, 2000))
    fused = COST.iteration([(200, 56)], 4, 1600)
    assert scaled.iteration([(200, 56)], 4, 1600) == pytest.approx(k * fused)
    assert scaled_cost(COST, 1.0) is COST


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True, "2"])
def test_a_factor_must_be_a_positive_number(bad):
    with pytest.raises(ValueError, match="factor"):
        scaled_cost(COST, bad)


@pytest.mark.parametrize("k", [0.8, 1.2, 1.5])
def test_a_run_made_with_the_costs_times_k_is_fitted_back_to_k_and_kept(k):
    fit = fit_load_factor([_made_at(k)], MODEL, resamples=200)
    assert fit.estimate == pytest.approx(k, abs=0.005)
    assert fit.low <= k + 0.005 and fit.high >= k - 0.005
    assert fit.kept and fit.factor == fit.estimate
    assert fit.measured_latency != pytest.approx(fit.simulated_latency)  # k = 1 misses it
    assert "kept" in fit.sentence()


def test_a_run_at_the_calibrations_speed_is_refused_and_leaves_the_cost_alone():
    fit = fit_load_factor([_made_at(1.0)], MODEL, resamples=200)
    assert fit.estimate == pytest.approx(1.0, abs=0.005)
    assert not fit.kept and fit.factor == 1.0 and "holds 1" in fit.reason
    assert fit.measured_latency == pytest.approx(fit.simulated_latency)


def test_a_server_slower_than_any_factor_searched_is_refused_loudly():
    fit = fit_load_factor([_made_at(FACTORS[-1] * 1.4)], MODEL, resamples=200)
    assert fit.estimate == FACTORS[-1] and not fit.kept and fit.factor == 1.0
    assert "outside the factors searched" in fit.reason


def test_two_runs_are_fitted_together_between_their_own_factors():
    slow, fast = _made_at(1.4), _made_at(1.0, n=50)
    both = fit_load_factor([slow, fast], MODEL, resamples=200)
    assert 1.0 < both.estimate < 1.4 and both.requests == len(slow) + len(fast)
    alone = [fit_load_factor([run], MODEL, resamples=200) for run in (slow, fast)]
    assert alone[1].estimate < both.estimate < alone[0].estimate


def test_the_interval_widens_with_the_requests_own_scatter():
    rng = random.Random(1)
    noisy = []
    for r in _made_at(1.3):
        jitter = 1 + rng.uniform(-0.3, 0.3)
        times = tuple(r.arrival + (t - r.arrival) * jitter for t in r.chunk_times)
        noisy.append(dataclasses.replace(r, chunk_times=times))
    fit = fit_load_factor([noisy], MODEL, resamples=300)
    assert fit.low < fit.estimate < fit.high
    exact = fit_load_factor([_made_at(1.3)], MODEL, resamples=300)
    assert exact.high - exact.low < fit.high - fit.low


def test_too_few_requests_fit_nothing_and_say_so():
    fit = fit_load_factor([_made_at(1.2, n=MIN_REQUESTS - 1)], MODEL)
    assert math.isnan(fit.estimate) and not fit.kept and fit.factor == 1.0
    assert f"fewer than {MIN_REQUESTS}" in fit.reason and "no factor" in fit.sentence()
    json.dumps(fit.to_dict())


@pytest.mark.parametrize(
    ("field", "options"), [("level", {"level": 1.5}), ("resamples", {"resamples": 10})]
)
def test_the_fit_refuses_bad_options_naming_them(field, options):
    with pytest.raises(ValueError, match=field):
        fit_load_factor([_made_at(1.0)], MODEL, **options)


def test_a_load_check_against_the_reference_server_keeps_every_request():
    from pytest_prefill.serve.client.identity import identify
    from pytest_prefill.serve.client.prompts import Prompts
    from pytest_prefill.serve.launch.reference import Behaviour, running
    from pytest_prefill.serve.load.loadgen import Target

    words = Prompts(tuple(f" w{chr(97 + i % 26)}{i}" for i in range(80)), tuple(range(80)), "t")
    load = [dataclasses.replace(r, output_len=4) for r in _load(MIN_REQUESTS + 5)]

    async def go():
        async with running(Behaviour(ttft=0.01, gap=0.002)) as url:
            target = Target(url, await identify(url, engine="openai"), words)
            return await run_load_check(target, load, 40.0, MODEL, "lc-")

    found = asyncio.run(go())
    assert found.rate == 40.0 and len(found.run.records) == len(load)
    assert all(r.ok and r.id.startswith("lc-") for r in found.run.records)
    assert found.fit.requests == len(load) and found.fit.measured_latency > 0
    document = json.loads(json.dumps(found.to_dict()))
    assert len(document["records"]) == len(load) and document["fit"]["requests"] == len(load)
    with pytest.raises(ValueError, match="rate"):
        asyncio.run(run_load_check(None, load, 0.0, MODEL, "x"))  # type: ignore[arg-type]


def _run_at(rate: float, factor: float) -> LoadRun:
    fit = LoadFactor(factor, factor - 0.01, factor + 0.01, 0.9, 100, 1.0, 1.0, 40)
    return LoadRun(rate, fit, None)  # type: ignore[arg-type]


def test_the_factor_between_two_runs_is_linear_in_log_rate_and_flat_beyond():
    runs = [_run_at(8.0, 1.4), _run_at(2.0, 1.0)]
    assert factor_at(runs, 4.0) == pytest.approx(1.2)  # halfway in log rate
    assert factor_at(runs, 1.0) == 1.0 and factor_at(runs, 16.0) == 1.4
    assert factor_at([], 3.0) == 1.0
    refused = dataclasses.replace(runs[0].fit, low=0.9, high=1.5, reason="its interval holds 1")
    assert factor_at([dataclasses.replace(runs[0], fit=refused), runs[1]], 8.0) == 1.0


def test_a_load_check_says_its_runs_and_the_factor_the_knee_is_predicted_with():
    check = LoadCheck(10.0, (_run_at(10.0, 1.2), _run_at(8.0, 1.1)), 1.15)
    text = check.sentence()
    assert "at 10 req/s" in text and "at 8 req/s" in text and text.endswith("x1.15")
    assert json.loads(json.dumps({"f": check.factor}))["f"] == 1.15
    for bad in (0.0, math.nan, -1.0):
        with pytest.raises(ValueError, match="factor"):
            LoadCheck(10.0, (), bad)


def _bench(records: list[ServerRecord]) -> BenchRun:
    return BenchRun(tuple(records), {}, {}, "now")


@pytest.mark.parametrize("k", [0.8, 1.3])
def test_each_probe_is_fitted_to_its_own_speed_and_their_range_spans_them(k):
    slow, base, few = _made_at(k), _made_at(1.0), _made_at(k)[: MIN_REQUESTS - 1]
    speeds = run_speeds([_bench(base), _bench(slow), _bench(few)], MODEL)
    assert [s.requests for s in speeds] == [len(base), len(slow), len(few)]
    assert speeds[0].estimate == pytest.approx(1.0, abs=0.02)
    assert speeds[1].estimate == pytest.approx(k, abs=0.02)
    assert math.isnan(speeds[2].estimate)  # too few requests: no factor, and not in the range
    low, high = speed_range(speeds) or (math.nan, math.nan)
    assert (low, high) == (min(s.estimate for s in speeds[:2]), max(s.estimate for s in speeds[:2]))
    assert speed_range(speeds[2:]) is None and speed_range(()) is None
