"""Published end-to-end vLLM runs on a real GPU, replayed through the simulator on a cost model
derived from the model's config and the device (no calibration): per run the request
throughput, TTFT and TPOT error, beside BLIS's 6.7% E2E / 17.6% TTFT median against vLLM on
H100 (its end-to-end fitted default).

The runs: Qwen2-7B-Instruct on one NVIDIA A100 80GB, vLLM 0.10.1.1 (`vllm serve` with
--max-model-len 16384, chunked prefill at 2048 batched tokens, prefix caching on), `benchmark_serving.py
--dataset-name random --random-input-len 1024 --random-output-len 1024 --num-prompts N`
(request rate inf: every request at once), at two KV cache sizes (gpu-memory-utilization 0.25:
5,867 blocks of 16; 0.5: 29,053 blocks, as the server's logs say); and Qwen2.5-32B on the same
GPU (Test 7), a model four times larger, and Qwen2-72B at tensor parallelism 2 on two of them
(Test 8), both predicted with the 7B run's host cost. Test 8's setup had no GPU peer-to-peer
(the same setup's 7B TP 2 log, log/vllm-7B-2gpuA10080GB-0.5GRAM-same-node.log: "Custom
allreduce is disabled because your platform lacks GPU P2P capability"), so its all-reduces went
through the host, not over the NVLink the catalog gives the A100: its table is shown, not a
verdict on the derived TP model. Source:
github.com/dennislee22/vLLM-benchmarking, README.md (Tests 4, 5, 7 and 8) and log/, commit
b474d1e053c35c9aef8c02aae4efbc0d8675f033 (the figures are the author's measurements, quoted).
Caveat: the author ran the sizes one after another with the benchmark's fixed seed, so the
server's prefix cache held earlier runs' prompts (its logs show 37-54% hit rates); the replay
has no shared prefixes, so its TTFT is the uncached one.

The configurations: the derived device time alone; what a user gets from ``capacity --gpu a100-80
--model CONFIG`` (the same derivation over the workload's range at the engine's sequence cap, with
the host cost the runtime adds by default: vLLM's tabled one, plan/compute/host.py, read off the
one-request run through the physics, so it is judged on the other 15); and with a host cost per
step taken from the one-request run through the replay (the fitted cost model). ``PREFILL_COMPARE_TABLES=DIR`` prints the
same for another folder of efficiency tables (a refit), beside the shipped ones; only the
shipped tables are asserted.

    PYTHONPATH=. python -m pytest -q -s -m sim benchmarks/test_compute_published.py
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path
from typing import NamedTuple

import pytest
from tabulate import tabulate

from pytest_prefill.commands import _compute_args
from pytest_prefill.plan.compute.derive import HostCost, TokenRange, derive_cost
from pytest_prefill.plan.compute.devices import CATALOG
from pytest_prefill.plan.compute.efficiency import (
    TABLES,
    efficiency_for,
    load_tables,
    load_transfer_errors,
)
from pytest_prefill.plan.compute.host import RUNS
from pytest_prefill.plan.hardware import Hardware
from pytest_prefill.plan.metrics import serving_metrics
from pytest_prefill.plan.model_spec import model_from_config
from pytest_prefill.sim import Request, get_profile, simulate

pytestmark = pytest.mark.sim

SOURCE = (
    "github.com/dennislee22/vLLM-benchmarking@b474d1e053c35c9aef8c02aae4efbc0d8675f033 README.md"
)
BLIS = {"e2e": 0.067, "ttft": 0.176}  # BLIS's median held-out error against vLLM on H100
COMPARE = os.environ.get("PREFILL_COMPARE_TABLES")  # another folder of tables, printed beside

# Qwen/Qwen2-7B-Instruct's config fields: the run the tabled vLLM host cost is read off (Test 5)
QWEN2_7B = dict(RUNS["vllm"].model_config)
# Qwen/Qwen2.5-32B's config.json (Apache-2.0)
QWEN25_32B = {
    **QWEN2_7B,
    "hidden_size": 5120,
    "intermediate_size": 27648,
    "num_hidden_layers": 64,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
}

# Qwen/Qwen2-72B's config.json (Tongyi Qianwen licence; its shapes only)
QWEN2_72B = {
    **QWEN2_7B,
    "hidden_size": 8192,
    "intermediate_size": 29568,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
}


class Run(NamedTuple):
    """One published result block: N prompts of 1024 tokens at once, the tokens generated,
    and the measured duration (s), mean TTFT (ms) and mean TPOT (ms)."""

    kv_blocks: int
    prompts: int
    generated: int
    duration: float
    ttft_ms: float
    tpot_ms: float


RUNS = (  # (Test 4: gpu-memory-utilization 0.25; Test 5: 0.5), 1000-prompt runs had failures
    Run(5867, 20, 20377, 15.22, 463.10, 14.36),
    Run(5867, 30, 30639, 16.74, 1033.68, 15.19),
    Run(5867, 50, 51119, 21.86, 693.75, 18.46),
    Run(5867, 75, 76719, 35.99, 1140.94, 24.02),
    Run(5867, 100, 101578, 47.81, 6772.41, 28.69),
    Run(5867, 200, 200083, 97.25, 28904.67, 29.87),
    Run(5867, 500, 501465, 231.04, 95836.65, 31.56),
    Run(29053, 1, 1024, 12.05, 36.23, 11.75),
    Run(29053, 10, 10240, 14.30, 488.52, 13.47),
    Run(29053, 20, 20399, 14.70, 195.24, 14.12),
    Run(29053, 30, 30615, 15.56, 241.74, 14.93),
    Run(29053, 50, 51119, 21.70, 2580.51, 18.47),
    Run(29053, 75, 76697, 25.64, 2598.85, 22.21),
    Run(29053, 100, 101590, 30.31, 3983.10, 25.26),
    Run(29053, 200, 200419, 45.11, 3158.70, 40.34),
    Run(29053, 500, 502621, 119.23, 34943.37, 52.41),
)
BLOCK_TOKENS = 16
PROMPT = 1024
# Test 7: Qwen2.5-32B on the same A100, 9.70 GiB of KV cache (its log is not published: the
# blocks are 9.70 GiB over the model's 262,144 bytes per token, in whole blocks of 16)
RUNS_32B = (
    Run(2483, 10, 10240, 54.96, 2017.23, 51.64),
    Run(2483, 50, 51200, 160.30, 21486.84, 79.95),
    Run(2483, 75, 76800, 226.03, 61850.53, 76.73),
    Run(2483, 100, 102400, 282.30, 97867.77, 77.73),
)
# Test 8: Qwen2-72B at --tensor-parallel-size 2 on two A100s of one node, 6.77 GiB of KV cache
# each (blocks: 6.77 GiB over half the model's bytes per token, whole blocks of 16)
RUNS_72B_TP2 = (
    Run(2772, 1, 1024, 59.43, 93.18, 58.00),
    Run(2772, 10, 10240, 78.74, 3842.51, 73.04),
    Run(2772, 30, 30156, 148.43, 10949.72, 104.71),
    Run(2772, 50, 50373, 209.24, 26588.12, 123.66),
    Run(2772, 100, 99612, 452.91, 142448.58, 139.24),
)


def _replay(run: Run, cost) -> tuple[float, float, float]:
    """Simulated request throughput (req/s), mean TTFT and mean TPOT (s) of ``run``."""
    import dataclasses

    output = max(2, round(run.generated / run.prompts))
    load = [Request(f"r{i}", 0.0, PROMPT, output) for i in range(run.prompts)]
    capped = dataclasses.replace(cost, kv_capacity_tokens=run.kv_blocks * BLOCK_TOKENS)
    metrics = serving_metrics(simulate("chunked", load, capped, engine="vllm"))
    return run.prompts / metrics.duration, metrics.ttft.mean, metrics.tpot.mean


def _table(cost, runs: tuple[Run, ...], title: str) -> dict[str, list[float]]:
    """Replay ``runs`` on ``cost``, print each run's error, return the errors by metric."""
    rows, errors = [], {"throughput": [], "ttft": [], "tpot": [], "e2e": []}
    for run in runs:
        throughput, ttft, tpot = _replay(run, cost)
        measured = (run.prompts / run.duration, run.ttft_ms / 1e3, run.tpot_ms / 1e3)
        relative = [p / m - 1 for p, m in zip((throughput, ttft, tpot), measured)]
        for key, value in zip(("throughput", "ttft", "tpot"), relative):
            errors[key].append(abs(value))
        errors["e2e"].append(abs(1 / (1 + relative[0]) - 1))  # the batch's duration
        rows.append(
            (
                f"{run.kv_blocks * BLOCK_TOKENS:,}",
                run.prompts,
                f"{measured[0]:.2f} / {throughput:.2f}",
                f"{relative[0]:+.0%}",
                f"{measured[1] * 1e3:,.0f} / {ttft * 1e3:,.0f}",
                f"{relative[1]:+.0%}",
                f"{measured[2] * 1e3:.1f} / {tpot * 1e3:.1f}",
                f"{relative[2]:+.0%}",
            )
        )
    header = ("KV tokens", "prompts", "req/s pub/sim", "err", "TTFT ms", "err", "TPOT ms", "err")
    print(f"\n{title}")
    print(tabulate(rows, headers=header))
    medians = {key: statistics.median(values) for key, values in errors.items()}
    print(
        f"median |error|: throughput {medians['throughput']:.1%}, duration (E2E) "
        f"{medians['e2e']:.1%} (BLIS {BLIS['e2e']:.1%}), mean TTFT {medians['ttft']:.1%} "
        f"(BLIS {BLIS['ttft']:.1%}), mean TPOT {medians['tpot']:.1%}; throughput within 25%: "
        f"{sum(e <= 0.25 for e in errors['throughput'])} of {len(runs)} runs"
    )
    return errors


def _choice(folder: Path):
    tables, errors = load_tables(folder), load_transfer_errors(folder)
    return efficiency_for(CATALOG["a100-80"], "vllm", tables=tables, transfer_errors=errors)


def _user_facing(model, folder: Path, run: Run, monkeypatch) -> object:
    """The cost model ``capacity --gpu a100-80 --model CONFIG`` runs on for ``run``'s workload
    (commands/_compute_args.py's derive_on: vLLM's sequence cap, the host cost the runtime adds
    when no --host-from is given), on the tables in ``folder`` (the shipped ones as the command
    finds them; another folder's in their place)."""
    device = CATALOG["a100-80"]
    if folder != TABLES:
        choice = _choice(folder)
        monkeypatch.setattr(_compute_args, "efficiency_of", lambda _device, _engine: choice)
    hardware = Hardware(model, device.memory_bytes, max_num_seqs=get_profile("vllm").max_seqs)
    output = max(2, round(run.generated / run.prompts))
    _, spec = _compute_args.derive_on(hardware, device, "vllm", [PROMPT], [output])
    assert spec.cost is not None
    return spec.cost


def _replay_tables(folder: Path, label: str, monkeypatch) -> dict[str, dict[str, list[float]]]:
    """Every configuration of the published runs on the tables in ``folder``: device time only,
    what the capacity command derives (user-facing), the one run's host cost carried to the
    other 15, to Qwen2.5-32B and to Qwen2-72B at TP 2; the errors by configuration."""
    model = model_from_config(QWEN2_7B, "Qwen2-7B-Instruct", "Qwen/Qwen2-7B-Instruct config.json")
    device = CATALOG["a100-80"]
    choice = _choice(folder)
    span = TokenRange(PROMPT, PROMPT, 2 * PROMPT, 256)
    derived = derive_cost(model, device, choice, span)
    print(f"\n== {label} ==\nSource: {SOURCE}\n{derived.basis}")
    out = {"device only": _table(derived.cost, RUNS, f"{label}: derived, device time only")}
    # The host's cost per step from one run (the single request: its decode steps are one
    # row, so measured TPOT less the derived step is the host's), predicting the other 15.
    single = next(run for run in RUNS if run.prompts == 1)
    others = tuple(run for run in RUNS if run is not single)
    user = _user_facing(model, folder, RUNS[0], monkeypatch)
    out["user-facing"] = _table(
        user,
        others,
        f"{label}: what `capacity --gpu a100-80 --model` derives (vLLM's tabled host cost, read "
        "off the one-request run: the other 15)",
    )
    _, _, derived_tpot = _replay(single, derived.cost)
    host = HostCost(
        per_step=max(0.0, single.tpot_ms / 1e3 - derived_tpot),
        source="per step from the published one-request run (its TPOT less the derived step)",
    )
    with_host = derive_cost(model, device, choice, span, host=host)
    print(f"\nhost per step {host.per_step * 1e3:.2f} ms")
    out["host from one run"] = _table(
        with_host.cost, others, f"{label}: derived + host per step from the one-request run"
    )
    model_32b = model_from_config(QWEN25_32B, "Qwen2.5-32B", "Qwen/Qwen2.5-32B config.json")
    assert RUNS_32B[0].kv_blocks == int(9.70 * 2**30 / model_32b.kv_bytes_per_token) // 16
    derived_32b = derive_cost(model_32b, device, choice, span, host=host)
    out["32B"] = _table(
        derived_32b.cost,
        RUNS_32B,
        f"{label}: Qwen2.5-32B on the same A100 (Test 7): derived + the 7B run's host per step",
    )
    model_72b = model_from_config(QWEN2_72B, "Qwen2-72B", "Qwen/Qwen2-72B config.json")
    per_device = model_72b.kv_bytes_per_token / 2
    assert RUNS_72B_TP2[0].kv_blocks == int(6.77 * 2**30 / per_device) // 16
    derived_72b = derive_cost(model_72b, device, choice, span, tp=2, host=host)
    out["72B TP 2"] = _table(
        derived_72b.cost,
        RUNS_72B_TP2,
        f"{label}: Qwen2-72B at TP 2 on two A100s in two pods (Test 8; the link is not NVLink "
        "there): derived + the 7B run's host per step",
    )
    return out


def test_published_a100_qwen2_7b_runs_replayed(monkeypatch) -> None:
    shipped = _replay_tables(TABLES, "shipped tables", monkeypatch)
    folders = [("shipped tables", shipped)]
    if COMPARE:
        folders.append((COMPARE, _replay_tables(Path(COMPARE), COMPARE, monkeypatch)))
    print("\nThroughput median |error| / worst / runs within 25%, per configuration")
    for label, by in folders:
        for name, errors in by.items():
            e = errors["throughput"]
            print(
                f"  {label}, {name}: {statistics.median(e):.1%} / {max(e):.1%} / "
                f"{sum(x <= 0.25 for x in e)} of {len(e)}"
            )
    # issue 45's bar for these A100 runs (the preset was 2.7-6.9x): throughput within 25%, from
    # the config and the datasheet alone as a user gets it, and with the host cost one run shows
    for name in ("device only", "user-facing", "host from one run", "32B"):
        assert max(shipped[name]["throughput"]) <= 0.25, (name, shipped[name]["throughput"])
    assert shipped["72B TP 2"]["throughput"]  # reported only: its link is not the catalog's
