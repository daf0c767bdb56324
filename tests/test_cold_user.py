"""What a GPU user trying the derived-compute commands cold trips on, each pinned: the line a
capacity answer says to type carries every flag the answer assumed (fp8 weights, fp8 KV); a
model that does not fit names only the flags of the command run; ``verify --tp`` is checked
before the memory is sized at it; a custom GPU's bad figure is quoted as typed; a ``--host-from``
whose device is not in the catalog says what it needs; a fit far under a percent is not "0%"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_errors import usage_error

from pytest_prefill.cli import main
from pytest_prefill.plan.compute.derive import TokenRange, derive_cost, fit_percent
from pytest_prefill.plan.compute.devices import PCIE_LATENCY, custom_device, device_named
from pytest_prefill.plan.compute.efficiency import efficiency_for, link_kind
from pytest_prefill.plan.compute.host import tabled_host
from pytest_prefill.plan.model_spec import load_model_spec
from pytest_prefill.sim import PROFILES

pytestmark = pytest.mark.sim

DATA = Path(__file__).parent / "data"
LLAMA = str(DATA / "llama-3.1-8b.json")
LLAMA_70B = str(DATA / "llama-3.1-70b.json")
FP8 = ["--quantization", "fp8", "--kv-cache-dtype", "fp8"]
SEARCH = ["--slo", "ttft:2s,tpot:100ms", "--num-prompts", "40", "--workers", "1"]
SEARCH += ["--no-devices-needed"]
VERIFY = ["verify", "--url", "http://127.0.0.1:9", "--slo", "ttft:2s,tpot:100ms"]
VERIFY += ["--flags", "tokens=256", "--workload", "poisson", "--num-prompts", "40"]


def _typed(out: str) -> str:
    """The ``Type:`` line and the pool lines under it."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("Type: "))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].lstrip().startswith("["))
    return "\n".join(lines[start:end])


@pytest.mark.parametrize("fp8", [True, False])
def test_the_typed_command_carries_the_fp8_flags_the_answer_assumed(fp8, capsys) -> None:
    argv = ["capacity", "--gpu", "h100", "--model", LLAMA, *SEARCH]
    argv += ["--deployment", "chunked,tokens=2048", *(FP8 if fp8 else [])]
    assert main(argv) == 0
    typed = _typed(capsys.readouterr().out)
    assert ("--quantization fp8" in typed) is fp8
    assert ("--kv-cache-dtype fp8" in typed) is fp8


def test_each_pool_of_a_split_across_kinds_carries_the_fp8_flags(capsys) -> None:
    argv = ["capacity", "--gpu", "h100,l40s", "--model", LLAMA, *SEARCH, *FP8]
    argv += ["--deployment", "disaggregated:1:1,p=h100,d=l40s"]
    assert main(argv) == 0
    pools = _typed(capsys.readouterr().out).splitlines()
    assert len(pools) == 2
    for line in pools:
        assert "--quantization fp8" in line and "--kv-cache-dtype fp8" in line


def test_the_json_command_carries_the_fp8_flags(tmp_path, capsys) -> None:
    out = tmp_path / "answer.json"
    argv = ["capacity", "--gpu", "h100", "--model", LLAMA, *SEARCH, *FP8]
    assert main([*argv, "--deployment", "chunked,tokens=2048", "--json", str(out)]) == 0
    command = json.loads(out.read_text())["command"]
    assert "--quantization fp8" in command and "--kv-cache-dtype fp8" in command


@pytest.mark.parametrize(
    ("argv", "own", "foreign"),
    [
        (
            [*VERIFY, "--gpu", "l4", "--model", LLAMA_70B],
            ["--gpu-memory-utilization", "--tp"],
            ["--device-memory", "--devices"],
        ),
        (
            ["simulate", "--gpu", "l4", "--model", LLAMA_70B],
            ["--device-memory", "--gpu-memory-utilization", "prefill-bench capacity"],
            ["--tp", "use a larger TP"],
        ),
        (
            ["timeline", "--gpu", "l4", "--model", LLAMA_70B, "--text"],
            ["--device-memory", "--gpu-memory-utilization", "prefill-bench capacity"],
            ["--tp", "use a larger TP"],
        ),
        (
            ["capacity", "--gpu", "l4", "--model", LLAMA_70B, "--devices", "1", *SEARCH],
            ["--device-memory", "--gpu-memory-utilization", "--devices"],
            ["--tp "],
        ),
    ],
)
def test_a_model_too_big_names_only_the_commands_own_flags(argv, own, foreign, capsys) -> None:
    line = usage_error(argv, capsys)
    assert "holds no KV cache for llama-3.1-70b" in line
    for flag in own:
        assert flag in line
    for flag in foreign:
        assert flag not in line


def test_verify_refuses_a_tp_no_server_runs_before_sizing_memory_at_it(capsys) -> None:
    line = usage_error([*VERIFY, "--gpu", "l4", "--model", LLAMA_70B, "--tp", "3"], capsys)
    assert "--tp 3" in line and "1, 2, 4, 8" in line
    assert "holds no KV cache" not in line


@pytest.mark.parametrize("value", ["abc", "1e3x"])
def test_a_custom_gpu_figure_that_is_no_number_is_quoted_as_typed(value, capsys) -> None:
    gpu = f"custom:tflops={value},tbs=1,gib=40"
    line = usage_error(["simulate", "--gpu", gpu, "--model", LLAMA], capsys)
    assert f"tflops must be a positive finite number, got {value!r}" in line


def test_a_host_from_on_a_device_outside_the_catalog_says_what_it_needs(tmp_path, capsys) -> None:
    terms = dict(prefill_pass_overhead=0.01, prefill_per_token=1e-5, decode_step_base=0.01)
    provenance = {"model": "llama-3.1-8b", "device_name": "AMD EPYC (CPU, 1 torch threads)"}
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"cost_model": terms, "provenance": provenance}))
    argv = ["simulate", "--gpu", "h100", "--model", LLAMA, "--host-from", str(path)]
    line = usage_error(argv, capsys)
    assert line.startswith(f"prefill-bench simulate: error: --host-from {path}: ")
    assert "AMD EPYC (CPU, 1 torch threads)" in line and "catalog" in line
    assert "custom:" not in line  # a --gpu form: no use in a calibration's provenance


@pytest.mark.parametrize(
    ("error", "text"), [(0.0, "under 1%"), (0.004, "under 1%"), (0.005, "1%"), (0.19, "19%")]
)
def test_a_fit_error_under_half_a_percent_is_not_printed_as_zero(error, text) -> None:
    assert fit_percent(error) == text


@pytest.mark.parametrize(
    ("link", "kind"), [("", "pcie"), (",linkus=10", "pcie"), (",linkus=5", "nvlink")]
)
def test_a_custom_gpus_link_is_the_kind_its_latency_says(link, kind) -> None:
    device = custom_device(f"custom:tflops=100,tbs=1,gib=40{link}")
    assert link_kind(device) == kind
    if not link:  # the default: PCIe's latency, no nearer NVLink's by a rounding
        assert device.link_latency == PCIE_LATENCY


def test_a_custom_gpu_on_the_default_link_borrows_no_cross_link_all_reduce(capsys) -> None:
    argv = ["simulate", "--gpu", "custom:tflops=100,tbs=1,gib=40", "--model", LLAMA]
    assert main(argv) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "borrowed from l40s" in header  # a PCIe card's table: the same link
    assert "cross-link" not in header


def test_devices_needed_when_none_would_do_keeps_the_kv_the_gpu_sized(capsys) -> None:
    argv = ["capacity", "--gpu", "h100", "--model", LLAMA, "--slo", "ttft:2s"]
    argv += ["--num-prompts", "40", "--random-input-len", "100000", "--workers", "1"]
    assert main([*argv, "--deployment", "chunked,tokens=2048", "--max-devices", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    needed = next(i for i, line in enumerate(lines) if line.startswith("Devices this traffic"))
    assert "none would do" in lines[needed]
    assert "KV by vLLM" in lines[needed + 1]
    assert "give --model and --device-memory" not in lines[needed + 1]  # both were sized


def test_a_rate_measured_as_one_burst_is_flagged_beside_the_answer(capsys) -> None:
    argv = ["capacity", "--gpu", "h100", "--model", LLAMA, *SEARCH, "--price", "h100=2.5"]
    assert main(argv) == 0  # 40 prompts: any rate an H100 serves them at is one burst
    lines = capsys.readouterr().out.splitlines()
    best = next(i for i, line in enumerate(lines) if line.startswith("-> "))
    assert "one burst draining, not a knee" in lines[best + 1]
    assert any("the probe measured one burst" in line for line in lines[:best])


def test_a_rate_measured_over_enough_arrivals_is_not_flagged(capsys) -> None:
    argv = ["capacity", "--cost", "datacenter-illustrative", "--workload", "azure-conv"]
    argv += ["--window", "0:600", "--slo", "ttft:1s,tpot:100ms", "--workers", "1"]
    assert main([*argv, "--no-devices-needed", "--deployment", "chunked,tokens=2048"]) == 0
    out = capsys.readouterr().out
    assert "-> " in out and "burst" not in out


@pytest.mark.parametrize(
    ("more", "why"),
    [
        (["--gpu", "h100", "--price", "h100=2.5"], "(--price asks for one)"),
        (["--gpu", "h100,l40s"], "(--gpu h100,l40s: give one kind"),
        (["--gpu", "h100", "--devices", "h100=2"], "(--devices KIND=N asks for one)"),
    ],
)
def test_cost_in_a_search_across_kinds_names_what_made_it_one(more, why, capsys) -> None:
    argv = ["capacity", "--model", LLAMA, *SEARCH, *more, "--cost", "datacenter-illustrative"]
    line = usage_error(argv, capsys)
    assert line.startswith("prefill-bench capacity: error: --cost: ") and why in line
    assert "or give one --gpu" not in line  # with --price or a budget per kind, no help


def test_a_deployment_whose_tp_cannot_hold_the_model_says_to_raise_its_tp(capsys) -> None:
    argv = ["capacity", "--gpu", "h100", "--model", LLAMA_70B, *SEARCH, "--devices", "4"]
    line = usage_error([*argv, "--deployment", "chunked,tokens=2048"], capsys)
    assert "--deployment at tp=1: " in line and "holds no KV cache" in line
    assert ",tp=N that divides --devices" in line
    assert "use a larger TP" not in line


def test_a_pool_that_cannot_hold_the_model_says_to_raise_its_tp(capsys) -> None:
    argv = [
        "capacity",
        "--gpu",
        "h100,l40s",
        "--model",
        LLAMA_70B,
        *SEARCH,
        "--devices",
        "h100=2,l40s=8",
    ]
    line = usage_error([*argv, "--deployment", "disaggregated:1:1,p=h100:tp2,d=l40s"], capsys)
    assert "decode pool: " in line and "holds no KV cache" in line
    assert "d=l40s:tpN" in line and "use a larger TP" not in line


def test_a_server_that_is_not_there_is_said_once_per_flag_set(capsys) -> None:
    argv = ["verify", "--url", "http://127.0.0.1:9", "--engine", "vllm", "--gpu", "h100"]
    argv += ["--model", "tiny", "--slo", "ttft:2s,tpot:100ms", "--flags", "tokens=256"]
    assert main([*argv, "--workload", "azure-conv", "--ignore-steal"]) == 1
    ended = [line for line in capsys.readouterr().out.splitlines() if "stopped answering" in line]
    assert ended and all(line.count("cannot connect") == 1 for line in ended)


def test_simulate_says_its_compute_is_derived_at_tp_1_not_at_each_deployments(capsys) -> None:
    assert main(["simulate", "--gpu", "h100", "--model", LLAMA]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert header.startswith("Cost model: derived: ") and ", TP 1, " in header
    assert "simulate runs one device, at TP 1" in header
    assert "each deployment's cost model derived at its own TP" not in header


@pytest.mark.parametrize(("version", "assumed"), [("0.27", False), ("9.9", True)])
def test_a_vllm_newer_than_any_cited_says_its_kv_rule_is_assumed(version, assumed, capsys):
    argv = ["capacity", "--gpu", "h100", "--model", LLAMA, *SEARCH, "--vllm-version", version]
    assert main([*argv, "--deployment", "chunked,tokens=2048"]) == 0
    out = capsys.readouterr().out
    assert f"vLLM {version}'s rule" in out
    assert ("(assumed: the newest cited is 0.27's)" in out) is assumed


def test_each_kinds_compute_line_says_where_the_host_cost_comes_from(capsys) -> None:
    argv = ["capacity", "--gpu", "h100,l40s", "--model", LLAMA, *SEARCH]
    assert main([*argv, "--deployment", "disaggregated:1:1,p=h100,d=l40s"]) == 0
    computes = [line for line in capsys.readouterr().out.splitlines() if "compute: " in line]
    assert len(computes) == 2
    for line in computes:
        assert line.endswith(f"; host: {tabled_host('vllm').source}")


@pytest.mark.parametrize(
    ("more", "words"),
    [
        (["--gpu", "h100"], "--gpu h100 with --launch: the launched server runs on this"),
        (["--gpu", "cpu", "--tp", "2"], "--tp 2 with --launch: a launched server runs at TP 1"),
    ],
)
def test_derived_compute_for_a_launched_server_is_this_cpus_at_tp_1(more, words, capsys) -> None:
    argv = ["verify", "--launch", "transformers", "--model", "tiny", *more]
    line = usage_error([*argv, "--slo", "ttft:1s", "--flags", "tokens=128"], capsys)
    assert words in line


def test_a_tp_deployments_bracket_gives_the_fit_at_its_own_tp(capsys) -> None:
    mixtral = str(DATA / "mixtral-8x7b.json")
    argv = ["capacity", "--gpu", "h100", "--model", mixtral, *SEARCH, "--devices", "2"]
    argv += ["--random-input-len", "1024", "--random-output-len", "128"]
    assert main([*argv, "--deployment", "chunked,tokens=2048,tp=2"]) == 0
    out = capsys.readouterr().out
    device, model = device_named("h100"), load_model_spec(mixtral)
    span = TokenRange.of([1024], [128], PROFILES["vllm"].max_seqs)
    choice, host = efficiency_for(device, "vllm"), tabled_host("vllm")
    at = {tp: derive_cost(model, device, choice, span, tp=tp, host=host) for tp in (1, 2)}
    assert fit_percent(at[1].max_relative_error) != fit_percent(at[2].max_relative_error)
    there = "TP2 compute derived at that TP (the cost model within "
    assert f"{there}{fit_percent(at[2].max_relative_error)} of the physics there)" in out
