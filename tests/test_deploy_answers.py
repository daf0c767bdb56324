"""Capacity's answer with the deployment described (--model, --device-memory, tp): the command
sizes the engine, every answer line says what it rests on, and the KV capacity vLLM's rule gives
is the one the simulation runs with (preemptions appear when it binds)."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from pytest_prefill.cli import main
from pytest_prefill.plan.deployments import Deployment
from pytest_prefill.plan.device_memory import GiB, kv_capacity
from pytest_prefill.plan.hardware import Hardware
from pytest_prefill.plan.model_spec import LLAMA_3_1_8B, load_model_spec
from pytest_prefill.plan.workloads import load_jsonl
from pytest_prefill.sim import PRESETS, PROFILES, Request, simulate

pytestmark = pytest.mark.sim

SEQS = PROFILES["vllm"].max_seqs  # the sequence cap the command runs vLLM with
ARGV = ["capacity", "--slo", "ttft:2s,tpot:100ms", "--num-prompts", "40", "--workers", "1"]


def test_the_answer_names_tp_kv_and_the_full_command(capsys):
    argv = [*ARGV, "--cost", "datacenter-illustrative", "--model", "llama-3-8b"]
    assert main([*argv, "--device-memory", "80", "--devices", "2", "--no-devices-needed"]) == 0
    out = capsys.readouterr().out
    command = next(line for line in out.splitlines() if "Type:" in line)
    assert "vllm serve meta-llama/Meta-Llama-3-8B" in command
    assert "--tensor-parallel-size" in command and "--gpu-memory-utilization 0.9" in command
    tokens = kv_capacity(load_model_spec("llama-3-8b"), 80 * GiB, tp=1, max_num_seqs=SEQS).tokens
    assert f"KV at TP=1: {tokens:,} tokens per replica" in out
    assert "preset datacenter-illustrative: not your hardware" in out
    assert "compute illustrative (measured nowhere), for qwen3-0.6b, memory from llama-3-8b" in out
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


SHAPED = os.path.join(os.path.dirname(__file__), "data", "mooncake-shaped.jsonl")


def _shaped_answer(folder, memory_gib, capsys, *extra):
    """capacity on the Mooncake-shaped trace for the config in ``folder`` at ``memory_gib``:
    the printed text and the --json document."""
    out_json = os.path.join(folder, f"answer-{memory_gib}.json")
    argv = [*ARGV[:-4], "--workers", "1", "--workload", SHAPED, "--target", "0.99"]
    argv += ["--cost", "datacenter-illustrative", "--model", str(folder)]
    argv += ["--device-memory", str(memory_gib), "--devices", "8", "--json", out_json, *extra]
    assert main(argv) == 0
    with open(out_json, encoding="utf-8") as handle:
        return capsys.readouterr().out, json.load(handle)


def test_a_llama_3_1_config_answers_with_tp_kv_and_command_at_80_and_40_gib(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_3_1_8B))
    model = load_model_spec(str(tmp_path))
    load = load_jsonl(SHAPED)
    assert max(r.prompt_len for r in load) < model.max_position_embeddings  # nothing to cap
    needed = {}
    two = ("--deployment", "chunked,tokens=2048", "--deployment", "chunked,tokens=2048,tp=2")
    for memory in (80, 40):
        out, document = _shaped_answer(tmp_path, memory, capsys, *two)
        assert "were capped at it" not in out
        for tp in {r["deployment"]["tp"] for r in document["results"]}:
            tokens = kv_capacity(model, memory * GiB, tp=tp, max_num_seqs=SEQS).tokens
            assert f"KV at TP={tp}: {tokens:,} tokens per replica" in out
        best = max(document["results"], key=lambda r: r["max_rate"])["deployment"]
        command = next(line for line in out.splitlines() if "Type:" in line)
        assert f"vllm serve {tmp_path} --max-num-batched-tokens" in command
        assert f"--tensor-parallel-size {best['tp']} --gpu-memory-utilization 0.9" in command
        assert command.split("Type: ", 1)[1] == document["command"]  # the JSON says the same
        assert document["assumptions"]["type"] in out
        needed[memory] = document["devices_needed"]["devices"]
    assert needed[40] >= needed[80]  # less memory never needs fewer devices


def test_a_tp_whose_kv_holds_less_than_the_context_sets_max_model_len(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_3_1_8B))
    model = load_model_spec(str(tmp_path))
    one = ("--deployment", "chunked,tokens=2048", "--no-devices-needed")
    short = kv_capacity(model, 32 * GiB, tp=1, max_num_seqs=SEQS).tokens
    assert short < model.max_position_embeddings <= kv_capacity(model, 80 * GiB).tokens
    out, _ = _shaped_answer(tmp_path, 32, capsys, *one)
    command = next(line for line in out.splitlines() if "Type:" in line)
    assert f"--gpu-memory-utilization 0.9 --max-model-len {short}" in command
    assert "check_enough_kv_cache_memory" in out and "every request here fits" in out
    out, _ = _shaped_answer(tmp_path, 80, capsys, *one)
    assert "--max-model-len" not in out


def test_a_deployments_own_sequence_cap_sizes_its_kv():
    model = load_model_spec("llama-3.1-8b")
    hardware = Hardware(model, 80 * GiB, max_num_seqs=SEQS)
    given = [
        Deployment.parse(text, 2)
        for text in ("chunked,tokens=2048", "chunked,tokens=2048,seqs=1024")
    ]
    own, big = hardware.attach(given, PRESETS["datacenter-illustrative"].cost, 16)
    assert own.cost.kv_capacity_tokens == kv_capacity(model, 80 * GiB, max_num_seqs=SEQS).tokens
    assert big.cost.kv_capacity_tokens == kv_capacity(model, 80 * GiB, max_num_seqs=1024).tokens
    assert big.cost.kv_capacity_tokens < own.cost.kv_capacity_tokens  # a larger sampler reserve


def test_compute_from_another_model_is_said_first_in_words(capsys):
    """A preset's compute with --model another model: the first line says so (and names --gpu);
    the illustrative preset is not called measured; the header says whose KV bytes are used;
    every bracket under the answer lists the same left-out terms."""
    argv = [*ARGV, "--cost", "datacenter-illustrative", "--model", "llama-3-8b"]
    assert main([*argv, "--device-memory", "80", "--devices", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("WARNING: compute and memory come from different models")
    assert "--gpu" in lines[0] and "llama-3-8b" in lines[0] and "qwen3-0.6b" in lines[0]
    assert lines[1].startswith("Cost model:") and "llama-3-8b's" in lines[1]
    out = "\n".join(lines)
    assert "compute measured on" not in out  # datacenter-illustrative is measured nowhere
    brackets = [line.strip() for line in lines if line.strip().startswith("[preset")]
    left_out = {b.split("0 (left out): ")[1].split(";")[0] for b in brackets}
    assert len(brackets) >= 2 and len(left_out) == 1


def test_a_model_the_cost_model_measured_has_no_warning(capsys):
    argv = [*ARGV, "--cost", "datacenter-illustrative", "--model", "qwen3-0.6b"]
    assert main([*argv, "--device-memory", "80", "--devices", "1", "--no-devices-needed"]) == 0
    assert "WARNING" not in capsys.readouterr().out


def test_the_command_serves_the_model_as_given_else_says_model(tmp_path):
    """A folder or a config.json names a model a server loads (as typed); a config under another
    name, or an architecture preset, does not: its folder is no model, so the line says MODEL."""
    from pytest_prefill.commands._deploy_args import served_name

    (tmp_path / "config.json").write_text(json.dumps(LLAMA_3_1_8B))
    (tmp_path / "llama.json").write_text(json.dumps(LLAMA_3_1_8B))
    assert served_name(str(tmp_path)) == str(tmp_path)
    assert served_name(str(tmp_path / "config.json")) == str(tmp_path)
    assert served_name(str(tmp_path / "llama.json")) == "MODEL"
    assert served_name("small") == "MODEL"
    assert served_name("llama-3-8b") == "meta-llama/Meta-Llama-3-8B"
