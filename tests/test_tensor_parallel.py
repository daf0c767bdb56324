"""Tensor parallelism (plan/tensor_parallel, plan/deployments' tp, plan/hardware): the scaling
rule fitted on Vidur's profiles predicts a held-out TP size, a cost model at TP N follows the
rule's formula, deployments count devices as instances × TP, and bad TPs are one-line errors at
parse time."""

from __future__ import annotations

import json

import pytest
from cli_errors import usage_error

from pytest_prefill.plan.deployments import Deployment
from pytest_prefill.plan.device_memory import GiB
from pytest_prefill.plan.hardware import Hardware
from pytest_prefill.plan.model_spec import LLAMA_3_8B, load_model_spec
from pytest_prefill.plan.tensor_parallel import (
    LINEAR_PROFILES,
    Fit,
    LinearProfile,
    cost_at_tp,
    fit_rule,
    held_out_error,
    tp_rule,
)
from pytest_prefill.sim import PRESETS, PROFILES

pytestmark = pytest.mark.sim


HELD_OUT = [((2, 8), 4), ((2, 4), 8), ((4, 8), 2)]


@pytest.mark.parametrize("key", list(LINEAR_PROFILES))
@pytest.mark.parametrize(("fit_sizes", "held_out"), HELD_OUT)
def test_the_rule_fitted_on_two_tp_sizes_predicts_the_third_within_10_percent(
    key, fit_sizes, held_out
):
    assert held_out_error(LINEAR_PROFILES[key], fit_sizes, held_out) < 0.10


def test_the_fit_recovers_the_constants_of_a_profile_the_rule_wrote():
    rho, fixed_ms = 0.05, 0.03
    measured = LINEAR_PROFILES[("a100", "meta-llama/Meta-Llama-3-8B")].times_ms[1]
    truth = Fit(rho, fixed_ms)
    times = {n: tuple(truth.predict_ms(t, n) for t in measured) for n in (1, 2, 4, 8)}
    fit = fit_rule(LinearProfile(4096, times), (2, 4, 8))
    assert fit.rho == pytest.approx(rho) and fit.fixed_ms == pytest.approx(fixed_ms)
    assert held_out_error(LinearProfile(4096, times), (2, 4), 8) == pytest.approx(0, abs=1e-12)


def test_without_a_fixed_latency_the_rule_is_amdahls():
    for n in (2, 4, 8):
        assert Fit(0.1, 0.0).predict_ms(3.0, n) == pytest.approx(3.0 * (0.1 + 0.9 / n))
    assert Fit(0.1, 5.0).predict_ms(3.0, 8) == 3.0  # a layer no longer than σ does not divide


def test_a_cost_model_at_tp_n_follows_the_rule():
    model = load_model_spec("llama-3-8b")
    cost, rule = PRESETS["datacenter-illustrative"].cost, tp_rule(load_model_spec("llama-3-8b"))
    assert cost_at_tp(cost, model, 1, rule) is cost
    at2 = cost_at_tp(cost, model, 2, rule)
    latency, bandwidth = rule.link(2)
    shrink = 1 / (2 * rule.efficiency(2))
    per_token = 2 * model.layers * model.hidden_size * 2 / bandwidth
    assert at2.prefill_per_token == pytest.approx(cost.prefill_per_token * shrink + per_token)
    kept = rule.fixed_share * cost.prefill_pass_overhead
    assert at2.prefill_pass_overhead == pytest.approx(
        kept + (cost.prefill_pass_overhead - kept) * shrink + 2 * model.layers * latency
    )
    assert 0 < rule.fixed_share < 1
    assert at2.decode_step_base < cost.decode_step_base


def test_devices_are_instances_times_tp():
    d = Deployment.parse("chunked,tokens=2048,tp=2", 8)
    assert (d.tp, d.instances, d.simulate_options()["replicas"]) == (2, 4, 4)
    assert d.label == "chunked ≤2048 tok ×4 TP2"
    split = Deployment.parse("disaggregated:1:3,tp=2", 8)
    assert (split.prefill_workers, split.decode_workers) == (1, 3)
    assert "--tensor-parallel-size 2" in d.command(PROFILES["vllm"])


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("chunked,tokens=2048,tp=3", "tp=3 does not divide the 8 devices"),
        ("shared,tp=0", "tp must"),
    ],
)
def test_a_tp_that_does_not_divide_the_devices_is_refused(text, words):
    with pytest.raises(ValueError, match=words):
        Deployment.parse(text, 8)


def test_hardware_tries_the_tp_sizes_where_the_weights_fit():
    model = load_model_spec("llama-3-8b")
    assert Hardware(model, 80 * GiB).tp_sizes(8) == (1, 2, 4, 8)
    assert Hardware(model, 16 * GiB).tp_sizes(8) == (2, 4, 8)  # 14.96 GiB of weights


def _config(tmp_path, drop=None):
    (tmp_path / "config.json").write_text(
        json.dumps({k: v for k, v in LLAMA_3_8B.items() if k != drop})
    )
    return str(tmp_path)


CAPACITY = [
    "capacity",
    "--slo",
    "ttft:2s,tpot:100ms",
    "--devices",
    "8",
    "--cost",
    "datacenter-illustrative",
]


def test_a_config_missing_a_field_is_one_line_at_parse_time(tmp_path, capsys):
    folder = _config(tmp_path, drop="hidden_size")
    line = usage_error([*CAPACITY, "--model", folder, "--device-memory", "80"], capsys)
    assert "--model" in line and "'hidden_size'" in line


def test_a_tp_that_does_not_divide_the_devices_is_one_line(tmp_path, capsys):
    argv = [*CAPACITY, "--model", _config(tmp_path), "--device-memory", "80"]
    line = usage_error([*argv, "--deployment", "chunked,tokens=2048,tp=3"], capsys)
    assert "tp=3 does not divide the 8 devices" in line


def test_memory_smaller_than_the_weights_is_one_line(tmp_path, capsys):
    argv = [*CAPACITY, "--devices", "1", "--model", _config(tmp_path), "--device-memory", "8"]
    line = usage_error(argv, capsys)
    assert "holds no KV cache for" in line and "weights take 14.96 GiB" in line


def test_a_model_without_device_memory_is_one_line(capsys):
    line = usage_error([*CAPACITY, "--model", "llama-3-8b"], capsys)
    assert "needs --device-memory" in line


def test_a_cost_measured_at_tp_2_is_used_as_it_is_there_and_only_there():
    model = load_model_spec("llama-3-8b")
    cost = PRESETS["datacenter-illustrative"].cost
    hardware = Hardware(model, 80 * GiB, measured_tp=2, server_kv_tokens=500_000)
    at2 = hardware.instance_cost(cost, 2, 16)
    assert at2.prefill_per_token == cost.prefill_per_token
    assert at2.kv_capacity_tokens == 500_000  # the server's own figure wins
    assert hardware.tp_sizes(8) == (2,)
    with pytest.raises(ValueError, match="measured at TP=2 is used at that TP only"):
        hardware.instance_cost(cost, 1, 16)
