"""Fidelity against a server, without a server: runs made by the simulator itself are predicted
exactly under the same scheduling, and a wrong first-token rule or budget shows in the TTFTs by
the amounts the cost model says."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest

from pytest_prefill.serve.calibration import ServerCalibration, ServerSweep
from pytest_prefill.serve.calibration_fit import RequestOverhead
from pytest_prefill.serve.fidelity import (
    Judgement,
    cells_of,
    judge,
    run_server_fidelity,
    wrong_schedulings,
)
from pytest_prefill.serve.records import BenchRun, RequestRecord
from pytest_prefill.serve.simulated import Scheduling, simulate_records
from pytest_prefill.sim import CostModel, Request, simulate

COST = CostModel(
    prefill_pass_overhead=0.02, prefill_per_token=3e-4, decode_step_base=0.02, decode_per_seq=0.005
)
NONE = RequestOverhead(0.0, math.nan, 0.0, "none")


def _skeleton(load: list[Request]) -> list[RequestRecord]:
    return [
        RequestRecord(
            r.id,
            r.arrival,
            r.arrival,
            r.prompt_len,
            r.output_len,
            (0.0,) * r.output_len,
            (1,) * r.output_len,
        )
        for r in load
    ]


def _measured(load: list[Request], scheduling: Scheduling, stretch: float = 1.0) -> BenchRun:
    """A run the simulator makes under ``scheduling``, its times after arrival stretched."""
    records = []
    for skeleton, sim in zip(
        _skeleton(load), simulate_records(_skeleton(load), COST, NONE, scheduling)
    ):
        times = tuple(skeleton.arrival + (t - skeleton.arrival) * stretch for t in sim.token_times)
        records.append(dataclasses.replace(skeleton, chunk_times=times, output_tokens=len(times)))
    return BenchRun(tuple(records), {}, {}, "now")


LOAD = [Request(f"r{i}", 0.3 * i, 100 + 150 * (i % 4), 12) for i in range(10)]


def test_the_prefill_rule_emits_the_first_token_at_the_prompts_last_pass():
    (sim,) = simulate_records(_skeleton(LOAD[:1]), COST, NONE, Scheduling("prefill", 256))
    assert sim.token_times[0] == pytest.approx(COST.prefill_pass(100))
    assert len(sim.token_times) == 12
    lab = simulate("chunked", [LOAD[0]], COST, chunk=254).requests["r0"]
    (late,) = simulate_records(_skeleton(LOAD[:1]), COST, NONE, Scheduling("decode", 256))
    assert late.token_times == pytest.approx(lab.token_times)
    assert late.token_times[0] - sim.token_times[0] == pytest.approx(COST.decode_step(1, 101))


def _calibration() -> ServerCalibration:
    from pytest_prefill.measure.calibrate import Calibration

    calibration = Calibration(COST, {}, (), {}, ())
    return ServerCalibration(calibration, NONE, (), ServerSweep(256))


def test_runs_the_simulator_made_are_predicted_exactly_and_the_wrong_rules_fail():
    right = Scheduling("prefill", 256)
    runs = {"w": [_measured(LOAD, right), _measured(LOAD, right, 1.001)]}
    result = judge(_calibration(), right, [], runs)
    assert result.verdict == "HOLDS" and result.error < 0.002 and result.noise < 0.001
    late = Judgement.of(cells_of(runs, _calibration(), Scheduling("decode", 256)))
    assert late.ttft_error > 0.1 and late.verdict == "FAILS"
    assert set(result.wrong) == set(wrong_schedulings(right)) and all(
        j.ttft_error >= result.judgement.ttft_error for j in result.wrong.values()
    )


def test_the_judgement_needs_both_figures_within_their_thresholds():
    assert Judgement(0.05, 0.05).verdict == "HOLDS"
    assert Judgement(0.05, 0.2).verdict == "FAILS"
    assert Judgement(0.2, 0.05).verdict == "FAILS"
    assert Judgement(math.nan, 0.05).verdict == "FAILS"


def test_a_single_run_is_refused():
    with pytest.raises(ValueError, match="runs"):
        asyncio.run(run_server_fidelity(None, ServerSweep(256), Scheduling(), runs=1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="first_token"):
        Scheduling("sometimes")
    with pytest.raises(ValueError, match="budget"):
        Scheduling("prefill", 1)
