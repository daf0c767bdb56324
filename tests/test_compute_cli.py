"""``--gpu`` on the planning commands: with --model and no --cost the cost model is derived from
the model's shapes and the device, the device's memory sizes the KV cache, and bad input is one
line (plan/compute/, commands/_deploy_args.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from pytest_prefill.cli import main
from pytest_prefill.plan.capacity import BURST_MARGIN, burst_warning, queueing_horizon
from pytest_prefill.plan.compute.devices import CATALOG
from pytest_prefill.plan.device_memory import kv_capacity
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.plan.model_spec import load_model_spec
from pytest_prefill.sim import PROFILES

pytestmark = pytest.mark.sim

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).parent.parent
LLAMA = str(DATA / "llama-3.1-8b.json")
CAPACITY = [
    "capacity",
    "--slo",
    "ttft:2s,tpot:100ms",
    "--num-prompts",
    "40",
    "--workers",
    "1",
    "--no-devices-needed",
    "--deployment",
    "chunked,tokens=2048",
]


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(lines) == 1
    return lines[0]


def test_capacity_on_a_gpu_derives_its_compute_and_sizes_kv_from_the_catalog(capsys) -> None:
    assert main([*CAPACITY, "--gpu", "h100", "--model", LLAMA]) == 0
    out = capsys.readouterr().out
    assert "Cost model: derived: NVIDIA H100 SXM5 80GB" in out
    assert "efficiency vllm" in out and "held out" in out  # the compute's error class
    assert "79.18 GiB devices (--gpu h100-sxm" in out
    model = load_model_spec(LLAMA)
    seqs = PROFILES["vllm"].max_seqs
    tokens = kv_capacity(model, CATALOG["h100-sxm"].memory_bytes, max_num_seqs=seqs).tokens
    assert f"KV at TP=1: {tokens:,} tokens per replica" in out
    assert "[derived for NVIDIA H100 SXM5 80GB from llama-3.1-8b's shapes" in out
    assert "not your hardware" not in out


def test_a_given_device_memory_wins_over_the_catalog(capsys) -> None:
    assert main([*CAPACITY, "--gpu", "h100", "--model", LLAMA, "--device-memory", "40"]) == 0
    out = capsys.readouterr().out
    assert "40 GiB devices (--device-memory)" in out and "derived: NVIDIA H100" in out


def test_a_moe_model_at_tp_2_answers(capsys) -> None:
    mixtral = str(DATA / "mixtral-8x7b.json")
    argv = [*CAPACITY[:-2], "--deployment", "chunked,tokens=2048,tp=2", "--devices", "2"]
    assert main([*argv, "--gpu", "h100", "--model", mixtral]) == 0
    out = capsys.readouterr().out
    assert "8 experts, 2 per token" in out and "compute at TP=2: derived at that TP" in out


def test_simulate_and_timeline_take_a_gpu(capsys) -> None:
    assert main(["simulate", "--gpu", "a100", "--model", LLAMA]) == 0
    assert "Cost model: derived: NVIDIA A100 SXM4 80GB" in capsys.readouterr().out
    assert main(["timeline", "--gpu", "l40s", "--model", LLAMA, "--text"]) == 0
    assert "derived: NVIDIA L40S" in capsys.readouterr().out


def test_a_given_cost_is_kept_with_a_gpu_for_memory(capsys) -> None:
    assert main(["simulate", "--gpu", "h100", "--model", LLAMA, "--cost", "lab-laptop"]) == 0
    out = capsys.readouterr().out
    assert "derived:" not in out and "79.18 GiB devices (--gpu h100-sxm" in out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--gpu", "v100", "--model", LLAMA], "unknown gpu 'v100': the catalog has a100-40"),
        (["--gpu", "custom:tflops=900,gib=80", "--model", LLAMA], "custom gpu: missing tbs"),
        (["--gpu", "a100", "--model", LLAMA, "--quantization", "fp8"], "has no fp8 peak"),
        (["--gpu", "h100"], "--gpu needs --model"),
    ],
)
def test_bad_input_is_one_line(argv: list[str], words: str, capsys) -> None:
    assert words in usage_error(["simulate", *argv], capsys)


@pytest.mark.parametrize(
    ("config_name", "field", "words"),
    [
        (
            "qwen3-30b-a3b.json",
            "moe_intermediate_size",
            ("num_experts=128", "'moe_intermediate_size'"),
        ),
        ("mixtral-8x7b.json", "num_local_experts", ("num_experts_per_tok=2", "num_local_experts")),
    ],
)
def test_a_moe_config_missing_an_expert_field_is_one_line(
    config_name: str, field: str, words: tuple[str, ...], tmp_path, capsys
) -> None:
    config = json.loads((DATA / config_name).read_text())
    del config[field]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    line = usage_error(["simulate", "--gpu", "h100", "--model", str(path)], capsys)
    assert all(word in line for word in words)


def test_a_custom_gpu_answers_with_its_figures(capsys) -> None:
    spec = "custom:tflops=989,tbs=3.35,gib=79.18,fp8tflops=1979"
    assert main(["simulate", "--gpu", spec, "--model", LLAMA]) == 0
    assert "custom device (tflops=989,tbs=3.35,gib=79.18,fp8tflops=1979)" in capsys.readouterr().out


def test_a_burst_is_flagged_with_the_prompts_that_would_show_queueing() -> None:
    slo = SLO(ttft=2.0)
    arrivals = [i * 1.0 for i in range(200)]  # 1 req/s for 199 s
    outputs = [100] * 200
    assert burst_warning(arrivals, outputs, slo, 1.0, 5.0) is None  # 39.8 s >= 2 s / 0.1
    line = burst_warning(arrivals, outputs, slo, 1.0, 5900.0)
    assert line is not None and "burst" in line and "\n" not in line
    prompts = math.ceil(2.0 / BURST_MARGIN * 5900.0) + 1
    assert f"about {prompts:,} prompts" in line
    assert queueing_horizon(SLO(tpot=0.05), 100) == pytest.approx(5.0)
    assert burst_warning(arrivals, outputs, slo, 1.0, 0.0) is None


def test_capacity_warns_when_its_prompts_arrive_as_one_burst(capsys) -> None:
    argv = [*CAPACITY, "--cost", "datacenter-illustrative"]
    assert main(argv) == 0
    assert "the probe measured one burst draining" in capsys.readouterr().out


def test_a_calibrations_host_cost_carries_into_a_derived_answer(tmp_path, capsys) -> None:
    # a calibration of llama-3.1-8b on an H100 whose decode step is 1 s: far above the device
    # part, so the host's share is nearly all of it, and the same model and device get it back
    calibration = {
        "cost_model": {
            "prefill_pass_overhead": 0.01,
            "prefill_per_token": 1e-5,
            "decode_step_base": 1.0,
        },
        "provenance": {"model": "llama-3.1-8b", "device_name": "NVIDIA H100 80GB HBM3"},
    }
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(calibration))
    out_json = tmp_path / "out.json"
    argv = ["simulate", "--gpu", "h100", "--model", "llama-3.1-8b", "--json", str(out_json)]
    assert main([*argv, "--host-from", str(path)]) == 0
    assert f"host: from --host-from {path} (llama-3.1-8b on h100-sxm, TP 1): a transfer" in (
        capsys.readouterr().out
    )
    cost = json.loads(out_json.read_text())["cost_model"]
    assert cost["decode_step_base"] == pytest.approx(1.0)
    line = usage_error(["simulate", "--model", LLAMA, "--host-from", str(path)], capsys)
    assert "--host-from carries" in line


@pytest.mark.parametrize("command", ["simulate", "capacity"])
def test_a_custom_gpu_with_commas_is_one_kind_on_every_command(command, capsys) -> None:
    spec = "custom:tflops=989,tbs=3.35,gib=79.18"
    argv = [command, "--gpu", spec, "--model", LLAMA]
    if command == "capacity":
        argv += ["--deployment", "chunked:512", "--slo", "ttft:10s", "--num-prompts", "40"]
    assert main(argv) == 0
    assert "custom device (tflops=989,tbs=3.35,gib=79.18)" in capsys.readouterr().out


def test_gpu_kinds_keep_a_custom_spec_whole() -> None:
    from pytest_prefill.commands._kind_args import gpu_kinds

    spec = "custom:tflops=1,tbs=2,gib=3"
    assert gpu_kinds(spec) == [spec]
    assert gpu_kinds(f"h100, {spec},l40s") == ["h100", spec, "l40s"]
    assert gpu_kinds(" h100 ,, l40s ") == ["h100", "l40s"]


def test_a_custom_gpu_in_a_search_across_kinds_is_one_line(capsys) -> None:
    argv = ["capacity", "--gpu", "custom:tflops=400,tbs=2,gib=40,h100", "--model", LLAMA]
    line = usage_error([*argv, "--slo", "ttft:10s"], capsys)
    assert "--gpu custom:tflops=400,tbs=2,gib=40" in line and "answered alone" in line


@pytest.mark.parametrize("name", ["missing.json", "README.md", "tests/data/mixtral-8x7b.json"])
def test_a_host_from_that_is_no_calibration_is_one_line_naming_the_flag(name, capsys) -> None:
    path = str(ROOT / name) if name != "missing.json" else "missing.json"
    line = usage_error(["simulate", "--gpu", "h100", "--model", LLAMA, "--host-from", path], capsys)
    assert line.startswith(f"prefill-bench simulate: error: --host-from {path}: ")
