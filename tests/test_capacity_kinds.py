"""``capacity`` across device kinds (commands/_kind_args.py): ``--gpu A,B`` with a budget per
kind, pools of their own through ``--deployment``, ``--price`` and its $/Mtok, and bad input
in one line each."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from pytest_prefill.cli import main
from pytest_prefill.plan.compute.devices import device_named
from pytest_prefill.plan.kinds import kind_deployments
from pytest_prefill.plan.pools import link_between
from pytest_prefill.plan.pricing import HOUR, MILLION
from pytest_prefill.sim import CostModel

pytestmark = pytest.mark.sim

DATA = Path(__file__).parent / "data"
LLAMA = str(DATA / "llama-3.1-8b.json")
PROMPT, OUTPUT = 512, 64
BASE = [
    "capacity",
    "--model",
    LLAMA,
    "--slo",
    "ttft:2s,tpot:100ms",
    "--num-prompts",
    "40",
    "--random-input-len",
    str(PROMPT),
    "--random-output-len",
    str(OUTPUT),
    "--random-range-ratio",
    "0",
    "--workers",
    "1",
    "--tolerance",
    "0.3",
]


def search(tmp_path: Path, *argv: str) -> tuple[str, dict]:
    path = tmp_path / "search.json"
    assert main([*BASE, *argv, "--json", str(path)]) == 0
    return "", json.loads(path.read_text())


def usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    printed = capsys.readouterr()
    assert printed.out == "" and "Traceback" not in printed.err  # one line, nothing else
    lines = [line for line in printed.err.splitlines() if line.strip()]
    assert len(lines) == 1 and "error:" in lines[0]
    return lines[0]


def expected_labels(budget: dict[str, int]) -> set[str]:
    colocated, splits = kind_deployments(budget)
    labels = {f"chunked ≤2048 tok ×{c.replicas} {c.kind}" for c in colocated}
    return labels | {f"{s.label} ≤2048 tok" for s in splits}


def test_the_search_compares_each_kind_colocated_and_every_split_the_budget_allows(
    tmp_path, capsys
) -> None:
    _, document = search(tmp_path, "--gpu", "h100,l40s", "--devices", "h100=2,l40s=1")
    out = capsys.readouterr().out
    labels = {r["deployment"]["label"] for r in document["results"]}
    assert labels == expected_labels({"h100-sxm": 2, "l40s": 1})
    assert "within a budget of 2 h100-sxm, 1 l40s" in out
    assert "Ranked by goodput per device" in out
    for result in document["results"]:
        deployment = result["deployment"]
        used: dict[str, int] = {}
        pools = deployment["pools"] or {}
        for pool in pools.values():
            used[pool["kind"]] = used.get(pool["kind"], 0) + pool["instances"] * pool["tp"]
        if not pools:
            used = {deployment["kind"]: deployment["devices"]}
        assert all(n <= {"h100-sxm": 2, "l40s": 1}[k] for k, n in used.items())
    # ranked per device: the printed rows in falling goodput per device
    order = [
        line.split("  ")[0] for line in out.splitlines() if line.startswith(("chunked", "disagg"))
    ]
    per_device = {r["deployment"]["label"]: r["goodput_per_device"] for r in document["results"]}
    ranked = [per_device[label.strip()] for label in order]
    assert ranked == sorted(ranked, reverse=True)
    # each kind's cost derived for it: a split's decode pool runs on its kind's colocated
    # cost, its prefill pool on its kind's with the KV link between the two kinds
    costs = {r["deployment"]["label"]: r["deployment"] for r in document["results"]}
    h100 = CostModel.from_dict(costs["chunked ≤2048 tok ×2 h100-sxm"]["cost"])
    l40s = CostModel.from_dict(costs["chunked ≤2048 tok ×1 l40s"]["cost"])
    assert h100 != l40s
    split = costs["disaggregated 1P h100-sxm : 1D l40s ≤2048 tok"]
    bandwidth, latency = link_between(device_named("h100"), device_named("l40s"))
    linked = dataclasses.replace(h100, link_bandwidth=bandwidth, link_latency=latency)
    assert CostModel.from_dict(split["cost"]) == linked
    assert CostModel.from_dict(split["decode_cost"]) == l40s


def test_devices_n_is_n_of_each_kind(tmp_path, capsys) -> None:
    _, document = search(tmp_path, "--gpu", "h100,l40s", "--devices", "1")
    labels = {r["deployment"]["label"] for r in document["results"]}
    assert labels == expected_labels({"h100-sxm": 1, "l40s": 1})


def test_pools_of_their_own_answer_with_a_command_per_pool(tmp_path, capsys) -> None:
    spec = "disaggregated:2:4,p=h100:tp2,d=l40s:tp1"
    _, document = search(tmp_path, "--deployment", spec)
    out = capsys.readouterr().out
    (result,) = document["results"]
    assert result["deployment"]["pools"] == {
        "prefill": {"kind": "h100-sxm", "tp": 2, "instances": 2},
        "decode": {"kind": "l40s", "tp": 1, "instances": 4},
    }
    assert "disaggregated 2P h100-sxm TP2 : 4D l40s" in out
    commands = [line.strip() for line in out.splitlines() if " pool, " in line]
    assert len(commands) == 2
    prefill, decode = commands
    assert "prefill pool, h100-sxm: vllm serve" in prefill and "--tensor-parallel-size 2" in prefill
    assert "(× 2, one per 2 devices" in prefill
    assert decode.startswith("decode pool, l40s: vllm serve") and "(× 4, one per device" in decode
    assert "compute: derived for NVIDIA H100" in out and "compute: derived for NVIDIA L40S" in out


def test_prices_add_dollars_per_million_tokens_and_rank_by_them(tmp_path, capsys) -> None:
    prices = {"h100-sxm": 2.5, "l40s": 0.9}
    argv = ("--gpu", "h100,l40s", "--devices", "1", "--price", "h100=2.5,l40s=0.9")
    _, document = search(tmp_path, *argv)
    out = capsys.readouterr().out
    assert "Ranked by the price of a million tokens" in out and "$/Mtok in" in out
    priced = document["prices"]
    assert set(priced) == {r["deployment"]["label"] for r in document["results"]}
    for result in document["results"]:
        deployment, rate = result["deployment"], result["max_rate"]
        price = priced[deployment["label"]]
        if not rate:
            assert price["per_mtok"] is None  # inf, written as null
            continue
        pools = deployment["pools"]
        if pools is None:
            hourly = deployment["devices"] * prices[deployment["kind"]]
            assert price["dollars_per_hour"] == pytest.approx(hourly)
            continue
        prefill, decode = (
            pools[r]["instances"] * pools[r]["tp"] * prices[pools[r]["kind"]]
            for r in ("prefill", "decode")
        )
        assert price["input_per_mtok"] == pytest.approx(prefill / (rate * PROMPT * HOUR) * MILLION)
        assert price["output_per_mtok"] == pytest.approx(decode / (rate * OUTPUT * HOUR) * MILLION)
    order = [
        line.split("  ")[0].strip()
        for line in out.splitlines()
        if line.startswith(("chunked", "disagg"))
    ]
    costs = [priced[label]["per_mtok"] for label in order]
    costs = [math.inf if c is None else c for c in costs]
    assert costs == sorted(costs)
    assert f"-> {order[0]} costs the least: $" in out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--deployment", "disaggregated:1:1,p=h900,d=l40s"], "prefill pool: unknown gpu 'h900'"),
        (["--deployment", "disaggregated:1:1,p=h100:tp3"], "tp=3 does not divide llama-3.1-8b's"),
        (
            ["--gpu", "h100,l40s", "--deployment", "disaggregated:1:1,p=h100,d=l40s:tp3"],
            "--deployment: decode pool: tp=3 does not divide llama-3.1-8b's 32 attention heads",
        ),
        (["--gpu", "h100,l40s", "--price", "h100=nan,l40s=1"], "h100=nan: a price is a number"),
        (
            ["--gpu", "h100", "--price", "h100=1", "--deployment", "disaggregated:1:1,d=a100"],
            "--price: no price for a100-80",
        ),
        (
            ["--gpu", "h100,l40s", "--price", "h200=3,h100=1,l40s=1"],
            "'h200' is not a kind searched",
        ),
        (["--gpu", "h100,l40s", "--price", "h100=-1,l40s=1"], "h100=-1: a price is a number >= 0"),
        (["--gpu", "h100,l40s", "--price", "h100=1"], "--price: no price for l40s"),
        (["--gpu", "h100,l40s", "--devices", "h100=2,l4=1"], "l4 is not a kind searched"),
        (["--gpu", "h100,l40s", "--cost", "lab-laptop"], "--cost: a search across device kinds"),
        (["--gpu", "h100,l40s", "--deployment", "shared"], "takes pools of their own"),
    ],
)
def test_bad_input_is_one_line(argv: list[str], words: str, capsys) -> None:
    assert words in usage_error([*BASE, *argv], capsys)
