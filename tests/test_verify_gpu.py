"""``verify --gpu NAME --model CONFIG``: each knee predicted from the compute derived for the model
on the device (capacity's derivation, over the workload's token range) instead of a calibration.
Against the reference server (``serve.launch.reference``, its requests counted): no calibration
request is sent, the predicted knee is the one the library's derivation gives, the basis line is
capacity's for the same model and device, the refusals are one line naming the flags, and the
JSON reads back with its basis (``VerifyResult.from_dict``, ``--rank``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_errors import usage_error
from hostile import write_words

from pytest_prefill.cli import build_parser, main
from pytest_prefill.commands.verify import workload_of
from pytest_prefill.plan.compute.derive import TokenRange, derive_cost
from pytest_prefill.plan.compute.devices import device_named
from pytest_prefill.plan.compute.efficiency import efficiency_for
from pytest_prefill.plan.compute.host import tabled_host
from pytest_prefill.plan.device_memory import DEFAULT_UTILIZATION, kv_capacity
from pytest_prefill.plan.model_spec import load_model_spec
from pytest_prefill.serve.calibration.experiments import WARMUP_REQUESTS
from pytest_prefill.serve.calibration.server_model import Scheduling, ServerModel, server_profile
from pytest_prefill.serve.client.wire import Url
from pytest_prefill.serve.launch import reference
from pytest_prefill.sim import PROFILES, CostModel, in_arrival_order
from pytest_prefill.verify import verification
from pytest_prefill.verify.knee import predict_knee
from pytest_prefill.verify.probe_rule import probe_load
from pytest_prefill.verify.result import Derived, VerifyResult, read_verify
from pytest_prefill.verify.verification import UNMEASURED, VerifyOptions

LLAMA = str(Path(__file__).parent / "data" / "llama-3.1-8b.json")
LLAMA_70B = str(Path(__file__).parent / "data" / "llama-3.1-70b.json")
GPU = "l4"  # an 8B model's decode on an L4 is slow enough for a knee of a few req/s
ENGINE = "vllm"
BUDGET = 256
WORKLOAD = ["--workload", "poisson", "--num-prompts", "40", "--seed", "3"]
FLAGS = ["--flags", f"tokens={BUDGET}", "--slo", "ttft:2s,tpot:100ms", *WORKLOAD]
# two short probes of 8 requests: the reference server answers at once, so they never miss
PROBES = ["--max-probes", "2", "--short-probes", "--margin", "0.15", "--probe-requests", "8"]
PROBES += ["--ignore-steal"]


@contextlib.contextmanager
def counted_reference() -> Iterator[tuple[Url, dict[str, int]]]:
    """The reference server in a thread of its own, with the tokens it was asked for counted
    (``generation_tokens``: the sum of every completion's ``max_tokens``)."""
    counts = {"prompt_tokens": 0, "generation_tokens": 0}
    behaviour = reference.Behaviour(ttft=0.01, gap=0.001)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> asyncio.Server:
        return await asyncio.start_server(
            lambda r, w: reference._handle(r, w, behaviour, counts), "127.0.0.1", 0
        )

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)
    try:
        yield Url("http", "127.0.0.1", server.sockets[0].getsockname()[1], ""), counts
    finally:
        loop.call_soon_threadsafe(server.close)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


def _verify_argv(url: Url, words: str, out: Path, *more: str) -> list[str]:
    where = ["--url", str(url), "--engine", ENGINE, "--tokenizer", words]
    derived = ["--gpu", GPU, "--model", LLAMA]
    return ["verify", *where, *derived, *FLAGS, *PROBES, "--json", str(out), *more]


def _derived_run(folder: Path, *more: str) -> tuple[list[str], Path, int, str]:
    """``verify --gpu`` (and ``more``) run against the counted reference server, calibrate_server
    replaced by one that fails the test: its argv, its --json, the generation tokens the
    server was asked for, and what it printed."""
    words = write_words(folder)
    out = folder / "verify.json"

    async def no_calibration(*_: object, **__: object) -> None:
        raise AssertionError("verify --gpu sent a calibration")

    printed = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, counted_reference() as (url, counts):
        patch.setattr(verification, "calibrate_server", no_calibration)
        argv = _verify_argv(url, words, out, *more)
        with contextlib.redirect_stdout(printed):
            status = main(argv)
    assert status == 0, printed.getvalue()
    return argv, out, counts["generation_tokens"], printed.getvalue()


@pytest.fixture(scope="module")
def derived_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path, int, str]:
    """:func:`_derived_run` once for the module's tests."""
    return _derived_run(tmp_path_factory.mktemp("verify-gpu"))


def test_a_calibrations_host_cost_carries_into_the_prediction_said_a_transfer(tmp_path) -> None:
    # a calibration of the same model on the same device whose decode step is 1 s: the host's
    # share is nearly all of it, and the derived prediction gets it back (test_compute_cli's)
    calibration = {
        "cost_model": {
            "prefill_pass_overhead": 0.01,
            "prefill_per_token": 1e-5,
            "decode_step_base": 1.0,
        },
        "provenance": {"model": LLAMA, "device_name": device_named(GPU).name},
    }
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(calibration))
    # no knee predicted: the probes start at the workload's own rate, made 20 req/s to be short
    _, out, _, printed = _derived_run(tmp_path, "--host-from", str(path), "--request-rate", "20")
    derived = read_verify(str(out)).derived
    assert derived is not None and derived.cost.decode_step_base == pytest.approx(1.0)
    assert f"host: from --host-from {path} (llama-3.1-8b on {GPU}, TP 1): a transfer" in (
        derived.basis
    )
    # a 1 s step breaks the SLO's TPOT bound whatever the rate: no knee is predicted
    result = read_verify(str(out))
    assert derived.cost.decode_step_base > result.slo.tpot
    predicted = result.results[0].predicted
    assert predicted is not None and predicted.rate == 0 and predicted.status == "misses alone"
    assert "Cost model: derived:" in printed


def test_no_calibration_request_is_sent(derived_run) -> None:
    _, out, asked, _ = derived_run
    result = read_verify(str(out))
    (flag_set,) = result.results
    assert flag_set.calibration is None and flag_set.load_check is None
    assert flag_set.measured is not None and flag_set.measured.probes
    probes = sum(r.output_len for p in flag_set.measured.probes for r in p.run.records)
    # the warm-up's one-token answers and the probes': nothing else reached the server
    assert asked == WARMUP_REQUESTS + probes


def _expected_cost(argv: list[str], tp: int = 1, kv_tokens: int | None = None) -> CostModel:
    """The cost model the library derives for LLAMA on GPU at ``tp`` over the workload of
    ``argv``, with the KV cache vLLM's rule sizes on the device there (else ``kv_tokens``)."""
    load, _, _ = workload_of(build_parser("verify").parse_args(argv))
    device, model = device_named(GPU), load_model_spec(LLAMA)
    rows = PROFILES[ENGINE].max_seqs
    assert rows is not None
    span = TokenRange.of([r.prompt_len for r in load], [r.output_len for r in load], rows)
    choice = efficiency_for(device, ENGINE)
    host = tabled_host(ENGINE)  # no --host-from: the engine's tabled host cost
    cost = derive_cost(model, device, choice, span, tp=tp, host=host).cost
    block = PROFILES[ENGINE].kv_block_tokens
    kv = kv_capacity(model, device.memory_bytes, tp=tp, block_tokens=block, max_num_seqs=rows)
    capacity = kv.tokens if kv_tokens is None else kv_tokens
    return dataclasses.replace(
        cost, kv_bytes_per_token=model.kv_bytes_per_token, kv_capacity_tokens=float(capacity)
    )


def test_the_predicted_knee_is_the_one_the_derived_compute_gives(derived_run) -> None:
    argv, out, _, _ = derived_run
    result = read_verify(str(out))
    load, _, _ = workload_of(build_parser("verify").parse_args(argv))
    cost = _expected_cost(argv)
    assert result.derived is not None and result.derived.cost == cost
    (flag_set,) = result.results
    probes = probe_load(in_arrival_order(load), result.rule, flag_set.requests)
    # the KV cache simulated is the one derived: the server at --url said none (--kv-tokens)
    scheduling = Scheduling(server_profile(ENGINE, BUDGET), cost.kv_capacity_tokens)
    server = ServerModel(cost, UNMEASURED, scheduling)
    expected = predict_knee(probes, server, result.slo, result.rule.target)
    assert flag_set.predicted is not None and flag_set.predicted.status == "found"
    assert flag_set.predicted.rate == pytest.approx(expected.rate, rel=1e-9)
    assert flag_set.scheduling == scheduling
    tokens = f"{cost.kv_capacity_tokens:,.0f}"
    assert result.derived.sizing == (
        f"TP 1; KV cache {tokens} tokens: vLLM's rule on {GPU} at TP 1, utilization "
        f"{DEFAULT_UTILIZATION:g} (vLLM's default)"
    )


def test_tp_derives_the_compute_and_the_kv_cache_at_the_servers_tp(tmp_path) -> None:
    more = ("--tp", "2", "--gpu-memory-utilization", "0.8")
    argv, out, _, printed = _derived_run(tmp_path, *more)
    result = read_verify(str(out))
    assert result.derived is not None
    cost = _expected_cost(argv, tp=2)
    model, device = load_model_spec(LLAMA), device_named(GPU)
    rows, block = PROFILES[ENGINE].max_seqs, PROFILES[ENGINE].kv_block_tokens
    kv = kv_capacity(
        model, device.memory_bytes, utilization=0.8, tp=2, block_tokens=block, max_num_seqs=rows
    )
    assert result.derived.cost == dataclasses.replace(cost, kv_capacity_tokens=float(kv.tokens))
    assert result.results[0].scheduling.kv_capacity_tokens == kv.tokens
    assert "utilization 0.8 (--gpu-memory-utilization)" in result.derived.sizing
    # the basis is the derivation's at the server's TP, not capacity's TP 1 header
    assert ", TP 2, " in result.derived.basis and ", TP 1, " not in result.derived.basis
    assert f"Simulated server: {result.derived.sizing}" in " ".join(printed.split())


def test_kv_tokens_is_the_servers_kv_cache_beside_derived_compute(tmp_path) -> None:
    argv, out, _, _ = _derived_run(tmp_path, "--kv-tokens", "5000")
    result = read_verify(str(out))
    assert result.derived is not None
    assert result.derived.cost == _expected_cost(argv, kv_tokens=5000)
    assert result.results[0].scheduling.kv_capacity_tokens == 5000
    assert result.derived.sizing == "TP 1; KV cache 5,000 tokens: --kv-tokens (the server's)"


def test_the_basis_is_capacitys_for_the_same_model_and_device(derived_run, capsys) -> None:
    _, out, _, printed = derived_run
    capacity = ["capacity", "--gpu", GPU, "--model", LLAMA, "--slo", "ttft:2s,tpot:100ms"]
    capacity += [*WORKLOAD, "--workers", "1", "--no-devices-needed"]
    assert main([*capacity, "--deployment", f"chunked,tokens={BUDGET}"]) == 0
    header = next(
        line for line in capsys.readouterr().out.splitlines() if line.startswith("Cost model: ")
    )
    basis = header.removeprefix("Cost model: ")
    error_class = efficiency_for(device_named(GPU), ENGINE).error_class  # held out, borrowed
    assert basis.startswith(f"derived: {device_named(GPU).name} (") and error_class in basis
    assert f"host: {tabled_host(ENGINE).source}" in basis  # no --host-from
    document = json.loads(out.read_text())
    assert document["derived"]["basis"] == basis
    assert " ".join(printed.split()).count(" ".join(f"Cost model: {basis}".split())) == 1


def test_the_json_reads_back_and_rank_says_its_basis(derived_run, capsys) -> None:
    _, out, _, _ = derived_run
    document = json.loads(out.read_text())
    result = VerifyResult.from_dict(document)
    assert result.derived is not None and result.to_dict()["derived"] == document["derived"]
    assert VerifyResult.from_dict(result.to_dict()).derived == result.derived
    assert main(["verify", "--rank", str(out)]) == 0
    ranked = capsys.readouterr().out
    assert f"run 1 ({ENGINE}): knees predicted from derived compute" in ranked
    assert result.derived.basis in ranked


def test_a_derived_block_without_its_cost_is_refused_naming_the_field(derived_run) -> None:
    document = json.loads(derived_run[1].read_text())
    del document["derived"]["cost_model"]
    with pytest.raises(ValueError, match=r"verify\.derived: missing 'cost_model'"):
        VerifyResult.from_dict(document)


URL = ["verify", "--url", "http://127.0.0.1:9", *FLAGS]


@pytest.mark.parametrize(
    ("more", "words"),
    [
        (["--gpu", "h100"], "--gpu needs --model"),
        (["--gpu", "v100", "--model", "tiny"], "--gpu: unknown gpu 'v100'"),
        (["--gpu", "h100", "--model", "tiny", "--cost", "cal.json"], "--gpu and --cost"),
        (["--gpu", "h100", "--model", "tiny", "--calibrate-once"], "drop --calibrate-once"),
        (["--host-from", "cal.json"], "--host-from: only with --gpu"),
        (["--quantization", "fp8", "--kv-cache-dtype", "fp8"], "--kv-cache-dtype: only with"),
        (["--gpu", "a100", "--model", "tiny", "--quantization", "fp8"], "has no fp8 peak"),
        (["--model", "tiny"], "--model goes with --launch, not --url (with --url, --model is"),
        (["--tp", "2"], "--tp: only with --gpu"),
        (["--gpu-memory-utilization", "0.8"], "--gpu-memory-utilization: only with --gpu"),
        (["--gpu", "h100", "--model", LLAMA, "--tp", "3"], "divides"),
        (["--gpu", "h100", "--model", LLAMA, "--tp", "16"], "1, 2, 4, 8"),
        (["--gpu", "l4", "--model", LLAMA_70B], "weights"),
    ],
)
def test_what_gpu_cannot_go_with_is_one_line(more: list[str], words: str, capsys) -> None:
    assert words in usage_error([*URL, *more], capsys)


def test_rank_refuses_a_gpu(tmp_path, capsys) -> None:
    line = usage_error(["verify", "--rank", str(tmp_path / "x.json"), "--gpu", "h100"], capsys)
    assert "--gpu" in line and "no use beside it" in line


def test_verify_refuses_derived_compute_beside_a_calibration() -> None:
    cost = derive_cost(
        load_model_spec("tiny"),
        device_named("h100"),
        efficiency_for(device_named("h100"), ENGINE),
        TokenRange(16, 64, 128, 8),
    ).cost
    derived = Derived(cost, "derived: test")
    with pytest.raises(ValueError, match="takes no calibration"):
        VerifyOptions(derived=derived, calibrate_once=True)
