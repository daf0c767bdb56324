"""What an engine does with a request it can never hold (sim/refusals.py), and a decode worker
whose preempted request keeps its sequence slot (sim/paged_decode.py): before, arrivals could
take every slot while waiting behind the preempted request for blocks, and the worker stopped
with ``paged KV: work left, none planned``. A capacity search counts a refused request as a
miss and says in one line how many never fit which pool, and why."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from strategies import V2

from pytest_prefill.cli import main
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.plan.verdict import run_verdict
from pytest_prefill.sim import (
    EngineProfile,
    Request,
    blocks_for,
    check_invariants,
    never_fit,
    simulate,
)

pytestmark = pytest.mark.sim

DATA = Path(__file__).parent / "data"
BLOCK = 16
TWO_SEQS = EngineProfile(
    "two-seqs", first_token="prefill", kv="paged", kv_block_tokens=BLOCK, max_seqs=2
)
# r1 is preempted by r0's growth; r2 and r3 arrive and take both slots while it waits.
SLOTS_TAKEN = [
    Request("r0", 0.02, 16, 26),
    Request("r1", 0.072, 16, 35),
    Request("r2", 0.077, 48, 4),
    Request("r3", 0.197, 16, 3),
]


def test_a_preempted_request_keeps_its_decode_slot_and_every_request_finishes() -> None:
    room = max(r.prompt_len + r.output_len for r in SLOTS_TAKEN) + BLOCK
    cost = dataclasses.replace(V2, kv_capacity_tokens=float(room))
    trace = simulate("disaggregated", SLOTS_TAKEN, cost, engine=TWO_SEQS)
    assert trace.summary().preemptions >= 1
    assert check_invariants(trace, SLOTS_TAKEN, cost) == []
    assert {rid: r.output_len for rid, r in trace.requests.items()} == {
        r.id: r.output_len for r in SLOTS_TAKEN
    }


def test_the_capacity_cli_runs_the_split_whose_decode_slots_arrivals_took(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, cost, out = tmp_path / "t.jsonl", tmp_path / "cost.json", tmp_path / "s.json"
    trace.write_text(
        "".join(
            json.dumps(
                {
                    "timestamp": r.arrival * 1000,
                    "input_length": r.prompt_len,
                    "output_length": r.output_len,
                }
            )
            + "\n"
            for r in SLOTS_TAKEN
        )  # fmt: skip
    )
    room = max(r.prompt_len + r.output_len for r in SLOTS_TAKEN) + BLOCK
    cost.write_text(json.dumps({**V2.to_dict(), "kv_capacity_tokens": room}))
    argv = [
        "capacity", "--workload", str(trace), "--cost", str(cost), "--deployment",
        "disaggregated:1:1,seqs=2", "--devices", "2", "--slo", "ttft:10s,tpot:1s",
        "--prefix-caching", "off", "--no-devices-needed", "--workers", "1", "--json", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    (result,) = json.loads(out.read_text())["results"]
    assert result["status"] in ("found", "never missed") and result["max_rate"] > 0


def _kv(r: Request) -> int:
    return blocks_for(r.prompt_len + r.output_len - 1, BLOCK) * BLOCK


def test_never_fit_names_the_first_pool_a_request_does_not_fit() -> None:
    load = [Request("small", 0.0, 100, 10), Request("long", 0.1, 900, 10)]
    prefill = dataclasses.replace(V2, kv_capacity_tokens=2000.0)
    decode = dataclasses.replace(V2, kv_capacity_tokens=500.0)
    (unfit,) = never_fit(load, prefill, TWO_SEQS, decode, disaggregated=True)
    assert unfit == ("long", "decode", _kv(load[1]), 500 // BLOCK * BLOCK)
    assert never_fit(load, decode, TWO_SEQS) == (unfit._replace(pool="worker"),)
    assert never_fit(load, prefill, TWO_SEQS, decode) == ()  # colocated: the decode cost unused


@pytest.mark.parametrize("stop", [True, False])
def test_a_refused_request_is_a_miss_and_the_rest_are_simulated(stop: bool) -> None:
    load = [Request(f"r{i}", 0.05 * i, 100, 8) for i in range(19)]
    load.append(Request("long", 0.5, 1000, 8))
    decode = dataclasses.replace(V2, kv_capacity_tokens=600.0)
    options = {"engine": TWO_SEQS, "decode_cost": decode}
    slo = SLO(ttft=10.0, tpot=1.0)
    trace, verdict = run_verdict("disaggregated", load, V2, options, slo, 0.9, stop=stop)
    assert trace is not None and "long" not in trace.requests
    assert (verdict.refused, verdict.requests, verdict.allowed) == (1, 20, 2)
    assert verdict.passed and verdict.misses >= 1
    _, strict = run_verdict("disaggregated", load, V2, options, slo, 1.0, stop=stop)
    assert not strict.passed and strict.stopped == "failed"  # none may miss: failed unrun


def test_capacity_counts_requests_the_decode_pool_never_fits_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lengths = [(2000, 50)] * 20 + [(110_000, 50), (120_000, 20)]
    trace = tmp_path / "trace.jsonl"
    rows = [
        {"timestamp": 500 * i, "input_length": p, "output_length": o}
        for i, (p, o) in enumerate(lengths)
    ]
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    path = tmp_path / "search.json"
    argv = [
        "capacity",
        "--workload",
        str(trace),
        "--model",
        str(DATA / "llama-3.1-70b.json"),
        "--deployment",
        "disaggregated:1:1,p=h100:tp4,d=l40s:tp4",
        "--slo",
        "ttft:60s,tpot:200ms",
        "--workers",
        "1",
        "--json",
        str(path),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    (result,) = json.loads(path.read_text())["results"]
    room = result["deployment"]["decode_cost"]["kv_capacity_tokens"] // BLOCK * BLOCK
    need = [blocks_for(p + o - 1, BLOCK) * BLOCK for p, o in lengths]
    expected = sum(n > room for n in need)
    assert 0 < expected < len(lengths)  # the case the test is about: some, not all
    assert [u["pool"] for u in result["refused"]] == ["decode"] * expected
    lines = [line for line in out.splitlines() if "can never fit" in line]
    assert len(lines) == 1
    assert f"{expected:,} of {len(lengths):,} requests can never fit one decode worker" in lines[0]
