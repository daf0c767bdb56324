"""What a server runs with (serve/server_facts), read from the flags the user says it runs with,
its endpoints and the model folder it serves; a server calibration carries them in its cost
model, and capacity keeps them as the deployment's facts."""

from __future__ import annotations

import json

import pytest
from test_serve_calibration import _samples

from pytest_prefill.cli import main
from pytest_prefill.plan.model_spec import TINY, load_model_spec
from pytest_prefill.serve.calibration.calibration import fit_server
from pytest_prefill.serve.calibration.server_calibration import ServerSweep
from pytest_prefill.serve.client.identity import (
    ServerFacts,
    ServerIdentity,
    flag_values,
    server_facts,
)

pytestmark = pytest.mark.sim


def _identity(engine, flags=None, model="m", details=None):
    return ServerIdentity("http://x", (model,), engine, "given", None, flags, details or {})


@pytest.mark.parametrize(
    ("flags", "names", "value"),
    [
        ("--max-num-seqs 8 --block-size 16", ("--max-num-seqs",), 8),
        ("--max-num-seqs=8", ("--max-num-seqs",), 8),
        ("-tp 2", ("--tensor-parallel-size", "-tp"), 2),
        ("--max-num-seqs x", ("--max-num-seqs",), None),
        (None, ("--max-num-seqs",), None),
    ],
)
def test_flag_values(flags, names, value):
    assert flag_values(flags, names) == value


def test_vllm_flags_give_its_seq_cap_tp_and_kv_blocks():
    flags = (
        "--max-num-seqs 8 --tensor-parallel-size 2 --block-size 16 --num-gpu-blocks-override 10920"
    )
    facts = server_facts(_identity("vllm", flags))
    assert (facts.max_seqs, facts.tp, facts.kv_block_tokens) == (8, 2, 16)
    assert facts.kv_capacity_tokens == 10920 * 16


def test_transformers_blocks_and_llama_cpp_props():
    facts = server_facts(_identity("transformers", "--continuous-batching --cb-num-blocks 64"))
    assert facts.kv_capacity_tokens == 64 * facts.kv_block_tokens
    props = server_facts(_identity("llama.cpp", details={"total_slots": 4, "n_ctx": 32768}))
    assert (props.max_seqs, props.kv_capacity_tokens) == (4, 32768)


def test_the_model_folder_gives_the_kv_bytes(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "qwen3", "torch_dtype": "float32", **TINY})
    )
    facts = server_facts(_identity("transformers", model=str(tmp_path)))
    assert facts.kv_bytes_per_token == load_model_spec(str(tmp_path)).kv_bytes_per_token
    assert facts.kv_bytes_per_token == 2 * TINY["num_hidden_layers"] * 2 * 16 * 4


def test_a_server_calibration_carries_the_facts_in_its_cost_model():
    facts = ServerFacts(kv_bytes_per_token=6144, kv_capacity_tokens=16384, max_seqs=8)
    provenance = {"source": "server", "deployment": facts.to_dict()}
    cost = fit_server(_samples(256), ServerSweep(256), provenance).calibration.cost
    assert (cost.kv_bytes_per_token, cost.kv_capacity_tokens) == (6144, 16384)
    assert ServerFacts.from_dict(facts.to_dict()) == facts


def test_capacity_keeps_a_server_calibrations_facts(tmp_path, capsys):
    facts = ServerFacts(kv_capacity_tokens=16384, max_seqs=8, sources={"max_seqs": "flag"})
    provenance = {"source": "server", "deployment": facts.to_dict()}
    path = tmp_path / "server.json"
    result = fit_server(_samples(256), ServerSweep(256), provenance)
    path.write_text(json.dumps(result.to_dict()))
    argv = ["capacity", "--cost", str(path), "--slo", "ttft:5s", "--num-prompts", "30"]
    assert main([*argv, "--workers", "1", "--no-devices-needed"]) == 0
    out = capsys.readouterr().out
    assert "Server facts kept as the deployment's" in out and "at most 8 requests" in out
    assert "≤8 seqs" in out and "--max-num-seqs 8" in out


def test_a_server_calibration_without_kv_points_at_server_flags_not_model(tmp_path, capsys):
    """KV unbounded under a server calibration: the fix is the server's flags recorded by
    calibrate-server, not --model/--device-memory (the server's memory is its own)."""
    facts = ServerFacts(max_seqs=8, sources={"max_seqs": "flag"})
    provenance = {"source": "server", "deployment": facts.to_dict()}
    path = tmp_path / "server.json"
    path.write_text(json.dumps(fit_server(_samples(256), ServerSweep(256), provenance).to_dict()))
    argv = ["capacity", "--cost", str(path), "--slo", "ttft:5s", "--num-prompts", "30"]
    assert main([*argv, "--workers", "1", "--no-devices-needed"]) == 0
    out = capsys.readouterr().out
    assert "KV unbounded" in out and "--server-flags" in out
    assert "give --model and --device-memory" not in out
