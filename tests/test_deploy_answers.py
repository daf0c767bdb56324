"""Capacity's answer with the deployment described (--model, --device-memory, tp): the command
sizes the engine, every answer line says what it rests on, and the KV capacity vLLM's rule gives
is the one the simulation runs with (preemptions appear when it binds)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pytest_prefill.cli import main
from pytest_prefill.plan.device_memory import GiB, kv_capacity
from pytest_prefill.plan.hardware import Hardware
from pytest_prefill.plan.model_spec import load_model_spec
from pytest_prefill.sim import PRESETS, PROFILES, Request, simulate

pytestmark = pytest.mark.sim

ARGV = ["capacity", "--slo", "ttft:2s,tpot:100ms", "--num-prompts", "40", "--workers", "1"]


def test_the_answer_names_tp_kv_and_the_full_command(capsys):
    argv = [*ARGV, "--cost", "datacenter-illustrative", "--model", "llama-3-8b"]
    assert main([*argv, "--device-memory", "80", "--devices", "2", "--no-devices-needed"]) == 0
    out = capsys.readouterr().out
    command = next(line for line in out.splitlines() if "Type:" in line)
    assert "vllm serve meta-llama/Meta-Llama-3-8B" in command
    assert "--tensor-parallel-size" in command and "--gpu-memory-utilization 0.9" in command
    tokens = kv_capacity(load_model_spec("llama-3-8b"), 80 * GiB, tp=1).tokens
    assert f"KV at TP=1: {tokens:,} tokens per replica" in out
    assert "preset datacenter-illustrative: not your hardware" in out
    assert "compute measured on qwen3-0.6b, memory from llama-3-8b" in out
    assert "TP2" in out  # the search tried TP 2 on two devices


def test_without_cost_or_model_the_answer_says_what_it_assumed(capsys):
    assert main([*ARGV, "--no-devices-needed"]) == 0
    out = capsys.readouterr().out
    assert "no --cost given: the preset lab-laptop" in out and "calibrate-server" in out
    assert "KV unbounded" in out


def test_vllms_kv_capacity_binds_and_preempts():
    hardware = Hardware(load_model_spec("llama-3-8b"), 24 * GiB)
    engine = dataclasses.replace(PROFILES["vllm"], prefix_caching=False)
    cost = hardware.instance_cost(PRESETS["datacenter-illustrative"].cost, 1, 16)
    capacity = int(cost.kv_capacity_tokens)
    # more concurrent KV than the capacity holds: prompts that together overflow it
    load = [Request(f"r{i}", 0.001 * i, capacity // 8, 2000) for i in range(16)]
    bound = simulate("chunked", load, cost, engine=engine)
    free = simulate(
        "chunked", load, dataclasses.replace(cost, kv_capacity_tokens=float("inf")), engine=engine
    )
    assert bound.summary().preemptions > 0
    assert free.summary().preemptions == 0


def test_device_memory_defaults_to_what_the_cost_model_records(tmp_path, capsys):
    argv = [*ARGV, "--model", "llama-3-8b", "--devices", "2", "--no-devices-needed"]
    assert main(argv) == 0  # the lab-laptop preset: a 16 GB laptop GPU, so TP 2 only
    out = capsys.readouterr().out
    assert "16 GiB devices (the lab-laptop preset's RTX 3080 Ti Laptop 16 GB)" in out
    assert "KV at TP=1" not in out and "KV at TP=2" in out
    calibration = {
        "cost_model": PRESETS["datacenter-illustrative"].cost.to_dict(),
        "provenance": {"device_name": "NVIDIA H100 80GB HBM3", "device_memory_bytes": 80 * GiB},
    }
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(calibration))
    argv = [*ARGV, "--cost", str(path), "--model", "llama-3-8b", "--no-devices-needed"]
    assert main(argv) == 0
    assert (
        "80 GiB devices (the calibration's device, NVIDIA H100 80GB HBM3)"
        in capsys.readouterr().out
    )
