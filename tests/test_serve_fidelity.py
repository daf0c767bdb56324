"""Fidelity against a server, without a server: the replay plays the server's engine profile
(the first token from the prompt's last pass, the budget, the sequence cap) by the amounts the
cost model says; runs made by the simulator itself are predicted exactly under the same
scheduling, and a wrong first-token rule or budget shows in the TTFTs."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math

import pytest

from pytest_prefill.serve.calibration.calibration_fit import RequestOverhead, ttft_alone
from pytest_prefill.serve.calibration.server_calibration import ServerCalibration, ServerSweep
from pytest_prefill.serve.calibration.server_model import (
    Scheduling,
    ServerModel,
    server_profile,
    simulate_records,
)
from pytest_prefill.serve.fidelity.fidelity import (
    cells_of,
    counter_check,
    judge,
    knob,
    other_engine,
    run_server_fidelity,
    wrong_schedulings,
)
from pytest_prefill.serve.fidelity.fidelity_interval import Interval, interval_of
from pytest_prefill.serve.fidelity.judgement import (
    SEPARATION,
    THRESHOLD,
    TTFT_THRESHOLD,
    Cell,
    CounterCheck,
    Judgement,
    discriminating,
)
from pytest_prefill.serve.load.records import BenchRun, ServerRecord
from pytest_prefill.sim import PROFILES, CostModel, EngineProfile, Request

COST = CostModel(
    prefill_pass_overhead=0.02, prefill_per_token=3e-4, decode_step_base=0.02, decode_per_seq=0.005
)
NONE = RequestOverhead(0.0, math.nan, 0.0, "none")


def _skeleton(load: list[Request]) -> list[ServerRecord]:
    return [
        ServerRecord(
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
        _skeleton(load), simulate_records(_skeleton(load), ServerModel(COST, NONE, scheduling))
    ):
        times = tuple(skeleton.arrival + (t - skeleton.arrival) * stretch for t in sim.token_times)
        records.append(dataclasses.replace(skeleton, chunk_times=times, output_tokens=len(times)))
    return BenchRun(tuple(records), {}, {}, "now")


LOAD = [Request(f"r{i}", 0.3 * i, 100 + 150 * (i % 4), 12) for i in range(10)]


def _scheduling(budget: int = 256, max_seqs: int | None = None, **knobs) -> Scheduling:
    return Scheduling(server_profile("transformers", budget, max_seqs)).replace(**knobs)


def test_the_prefill_rule_emits_the_first_token_at_the_prompts_last_pass():
    (sim,) = simulate_records(_skeleton(LOAD[:1]), ServerModel(COST, NONE, _scheduling()))
    assert sim.token_times[0] == pytest.approx(COST.prefill_pass(100))
    assert len(sim.token_times) == 12
    (late,) = simulate_records(
        _skeleton(LOAD[:1]), ServerModel(COST, NONE, _scheduling(first_token="decode"))
    )
    assert len(late.token_times) == 12
    assert late.token_times[0] - sim.token_times[0] == pytest.approx(COST.decode_step(1, 101))


def test_a_prompt_alone_takes_the_passes_the_budget_gives_as_the_calibration_counts_them():
    for budget in (64, 256, 1000):
        (sim,) = simulate_records(
            _skeleton([Request("long", 0.0, 600, 2)]), ServerModel(COST, NONE, _scheduling(budget))
        )
        passes = math.ceil(600 / budget)
        expected = passes * COST.prefill_pass_overhead + 600 * COST.prefill_per_token
        assert sim.token_times[0] == pytest.approx(expected)
        assert sim.token_times[0] == pytest.approx(ttft_alone(COST, 0.0, 600, budget))


def test_the_overhead_delays_arrivals_and_tokens_by_its_two_parts():
    way = RequestOverhead(0.03, 0.01, 0.0, "test")
    (plain,) = simulate_records(_skeleton(LOAD[:1]), ServerModel(COST, NONE, _scheduling()))
    (late,) = simulate_records(_skeleton(LOAD[:1]), ServerModel(COST, way, _scheduling()))
    shift = way.arrival_delay + way.from_engine
    assert late.token_times == pytest.approx([t + shift for t in plain.token_times])


def test_the_sequence_cap_holds_a_request_until_one_leaves():
    load = [Request("a", 0.0, 64, 6), Request("b", 0.0, 64, 6)]
    a, b = simulate_records(_skeleton(load), ServerModel(COST, NONE, _scheduling(max_seqs=1)))
    assert b.token_times[0] > a.token_times[-1]
    a2, b2 = simulate_records(_skeleton(load), ServerModel(COST, NONE, _scheduling()))
    assert b2.token_times[0] < a2.token_times[-1]


def _calibration() -> ServerCalibration:
    from pytest_prefill.measure.calibration_document import Calibration

    calibration = Calibration(COST, {}, (), {}, ())
    return ServerCalibration(calibration, NONE, (), ServerSweep(256))


def test_runs_the_simulator_made_are_predicted_exactly_and_the_wrong_rules_fail():
    right = _scheduling()
    runs = {"w": [_measured(LOAD, right), _measured(LOAD, right, 1.001)]}
    result = judge(_calibration(), right, [], runs)
    assert result.verdict == "HOLDS" and result.error < 0.002 and result.noise < 0.001
    late = Judgement.of(
        cells_of(runs, ServerModel.of(_calibration(), right.replace(first_token="decode")))
    )
    assert late.ttft_error > 0.1 and late.verdict == "FAILS"
    assert set(result.wrong) == set(wrong_schedulings(right)) and all(
        c.overall.ttft_error >= result.judgement.ttft_error for c in result.wrong.values()
    )


def test_prompts_alone_tell_the_first_token_rule_apart_on_their_ttfts():
    """Each alone, a 100-140-token prompt's first token is one pass (0.05-0.06 s); at the next
    decode step it is a step (0.025 s) later: over 20% apart on the TTFT cells only."""
    right = _scheduling()
    alone = [Request(f"a{i}", 2.0 * i, 100 + 20 * (i % 3), 12) for i in range(10)]
    runs = {"w": [_measured(alone, right), _measured(alone, right, 1.001)]}
    result = judge(_calibration(), right, [], runs)
    rule = result.wrong["first token at decode"]
    assert rule.cells == (("w", "ttft", "median"), ("w", "ttft", "p90"))
    assert rule.verdict == "FAILS" and rule.right is not None and rule.right.verdict == "HOLDS"
    assert result.verdict == "HOLDS" and "the first-token rule" not in result.cannot_tell()
    from pytest_prefill.report.server_fidelity import summary_lines

    (line,) = [x for x in summary_lines(result) if x.startswith("  first token at decode")]
    judged = sum(c.judged for c in result.cells)
    assert f"on 2 of {judged} judged cells (w TTFT median, TTFT p90): " in line
    assert "the right profile" in line and line.endswith(")") and "-> FAILS (" in line


def test_a_run_with_no_judged_cell_fails_and_its_document_is_strict_json():
    right = _scheduling()
    runs = {"w": [_measured(LOAD, right), _measured(LOAD, right, 1.5)]}  # 50% apart: all noisy
    result = judge(_calibration(), right, [], runs)
    assert not any(c.judged for c in result.cells) and result.verdict == "FAILS"
    document = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert document["judgement"]["error"] is None and document["verdict"] == "FAILS"
    assert document["scheduling"]["engine"] == "transformers"
    assert document["scheduling"]["kv_capacity_tokens"] == "inf"


def test_the_judgement_needs_both_figures_within_their_thresholds():
    assert Judgement(0.05, 0.05).verdict == "HOLDS"
    assert Judgement(0.05, 0.2).verdict == "FAILS"
    assert Judgement(0.2, 0.05).verdict == "FAILS"
    assert Judgement(math.nan, 0.05).verdict == "FAILS"


def test_the_wrong_schedulings_are_one_knob_replaced_and_another_engines_profile():
    right = _scheduling(256, 8)
    wrong = wrong_schedulings(right)
    rule, budget, engine = wrong.values()
    assert rule.profile == dataclasses.replace(right.profile, first_token="decode")
    assert budget.profile == dataclasses.replace(right.profile, max_batched_tokens=256 * 16)
    shipped = PROFILES[other_engine("transformers")]
    assert engine.profile.name == shipped.name != right.profile.name
    assert (engine.budget, engine.profile.max_seqs) == (
        shipped.max_batched_tokens,
        shipped.max_seqs,
    )
    assert engine.kv_capacity_tokens == right.kv_capacity_tokens
    assert [knob(label) for label in wrong] == [
        "the first-token rule",
        "the token budget",
        "the engine profile",
    ]
    assert right.profile.name == "transformers" and right.profile.changed() == (
        "max_batched_tokens",
        "max_seqs",
    )


def test_an_interval_decides_holds_fails_or_undecided():
    def j(low: float, high: float, ttft_low: float = 0.01, ttft_high: float = 0.02) -> Judgement:
        mid, ttft_mid = (low + high) / 2, (ttft_low + ttft_high) / 2
        return Judgement(
            mid, ttft_mid, 0.15, 0.10, Interval(low, high), Interval(ttft_low, ttft_high)
        )

    assert j(0.05, 0.12).verdict == "HOLDS"
    assert j(0.16, 0.30).verdict == "FAILS"
    assert j(0.10, 0.20).verdict == "UNDECIDED"  # straddles the threshold
    assert j(0.05, 0.12, 0.05, 0.12).verdict == "UNDECIDED"  # the TTFT interval straddles
    assert j(0.05, 0.12, 0.11, 0.20).verdict == "FAILS"  # the TTFT interval is over
    document = j(0.10, 0.20).to_dict()
    assert document["verdict"] == "UNDECIDED" and document["interval"]["high"] == 0.20


def test_the_bootstrap_interval_is_tight_on_exact_runs_and_covers_the_error_on_biased_ones():
    right = _scheduling()
    exact = {"w": [_measured(LOAD, right), _measured(LOAD, right, 1.001)]}
    result = judge(_calibration(), right, [], exact)
    interval = result.judgement.interval
    assert interval is not None and interval.high < 0.01 and result.verdict == "HOLDS"
    slow = {
        "w": [_measured(LOAD, right, 1.4), _measured(LOAD, right, 1.42)]
    }  # the server 40% slower
    biased = judge(_calibration(), right, [], slow)
    low, high = biased.judgement.interval.low, biased.judgement.interval.high
    assert low <= biased.error <= high and low > 0.15 and biased.verdict == "FAILS"
    again = judge(_calibration(), right, [], slow)
    assert again.judgement.interval == biased.judgement.interval  # seeded: the same resamples


def test_a_counter_check_that_does_not_fail_where_the_right_one_holds_is_named():
    right = _scheduling()
    exact = {"w": [_measured(LOAD, right), _measured(LOAD, right, 1.001)]}
    result = judge(_calibration(), right, [], exact)
    passing = Judgement(0.01, 0.01, interval=Interval(0.0, 0.02), ttft_interval=Interval(0.0, 0.02))
    tied = dataclasses.replace(
        result, wrong={**result.wrong, "budget 4,096": CounterCheck(passing, (), 0.01)}
    )
    assert "the token budget" in tied.cannot_tell()
    assert all(
        knob(label) not in result.cannot_tell()
        for label, j in result.wrong.items()
        if j.verdict == "FAILS"
    )
    failing = dataclasses.replace(
        tied,
        judgement=Judgement(
            0.5, 0.5, interval=Interval(0.4, 0.6), ttft_interval=Interval(0.4, 0.6)
        ),
    )
    assert failing.cannot_tell() == []  # only a HOLDS can be undermined


def test_held_out_workloads_hold_long_prompts_and_a_burst_and_the_fallback_is_loud(monkeypatch):
    from pytest_prefill.serve.fidelity import held_out

    monkeypatch.setattr(held_out, "azure_trace_path", lambda name: None)
    workloads = held_out.held_out_workloads(_calibration(), count=12)
    names = [w.name for w in workloads]
    assert names == ["poisson x0.5", "poisson x1", "long prompts", "burst", "short alone"]
    long = workloads[2].requests
    assert sum(r.prompt_len >= 4 * 256 for r in long) == len(long) // 2
    assert {r.arrival for r in workloads[3].requests} == {0.0}
    alone = workloads[4].requests  # each arrives after the one before has been served alone
    for before, after in zip(alone, alone[1:]):
        served = held_out.service_time(_calibration(), [(before.prompt_len, before.output_len)])
        assert after.arrival - before.arrival > served and before.prompt_len < 256
    traced = [w for w in workloads if w.name != "short alone"]  # its lengths are fixed
    assert all(w.fallback and "FALLBACK" in w.fallback for w in traced)
    chosen = held_out.held_out_workloads(_calibration(), count=12, source="mix")
    assert all(w.fallback is None for w in chosen)
    with pytest.raises(ValueError, match="no Azure trace"):
        held_out.held_out_workloads(_calibration(), count=12, source="azure-conv")


def test_a_single_run_and_a_scheduling_the_server_cannot_have_are_refused():
    with pytest.raises(ValueError, match="runs"):
        asyncio.run(run_server_fidelity(None, ServerSweep(256), _scheduling(), runs=1))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="engine 'openai'.*allowed: transformers"):
        server_profile("openai", 256)
    with pytest.raises(ValueError, match="budget"):
        server_profile("llama.cpp", 1)
    with pytest.raises(ValueError, match="max_seqs"):
        server_profile("llama.cpp", 256, 0)
    with pytest.raises(ValueError, match="max_batched_tokens"):
        Scheduling(EngineProfile("lab"))
    with pytest.raises(ValueError, match="kv_capacity_tokens"):
        Scheduling(server_profile("vllm", 256), 0)


def _cells(errors: list[float], scale: list[float] | None = None) -> list[Cell]:
    """One judged cell per error (its simulation that far from a measured 1.0, twice), a TTFT
    cell every other one; ``scale`` multiplies each simulation."""
    scale = scale or [1.0] * len(errors)
    return [
        Cell(f"w{i}", "ttft" if i % 2 else "e2el", "median", ((1 + e) * k,) * 2, (1.0, 1.0))
        for i, (e, k) in enumerate(zip(errors, scale))
    ]


def _draws(cells: list[Cell], spread: float = 0.01) -> list[dict]:
    """Resampled |errors|: each cell's own, moved by up to ``spread`` from draw to draw."""
    return [{c.key: abs(c.error) + spread * (d % 5 - 2) / 2 for c in cells} for d in range(100)]


def test_a_counter_check_far_off_on_two_cells_fails_there_though_it_matches_elsewhere():
    right = _cells([0.02] * 20)
    far = [1.4 if i in (3, 8) else 1.0 for i in range(20)]  # 40% apart on two cells
    other = _cells([0.02] * 20, far)
    check = counter_check(right, other, _draws(right), _draws(other))
    assert check.cells == (right[3].key, right[8].key)
    assert check.overall.verdict == "HOLDS"  # the median over every cell hides the two
    assert check.judgement is not None and check.judgement.error == pytest.approx(1.02 * 1.4 - 1)
    assert check.verdict == "FAILS" and check.apart == pytest.approx(0.4)
    assert check.right is not None and check.right.error == pytest.approx(0.02)
    assert check.right.verdict == "HOLDS"  # the right one holds where the wrong one fails


def test_a_counter_check_that_predicts_alike_everywhere_cannot_be_told_apart():
    right = _cells([0.02] * 8)
    near = _cells([0.02] * 8, [1.05] * 8)  # 5% apart: under every cell's threshold
    check = counter_check(right, near, _draws(right), _draws(near))
    assert check.cells == () and check.judgement is None and check.verdict == "UNDECIDED"
    assert check.apart == pytest.approx(0.05)
    runs = {"w": [_measured(LOAD, _scheduling()), _measured(LOAD, _scheduling(), 1.001)]}
    result = judge(_calibration(), _scheduling(), [], runs)
    untold = dataclasses.replace(result, wrong={**result.wrong, "budget 4,096": check})
    assert result.verdict == "HOLDS" and "the token budget" in untold.cannot_tell()
    from pytest_prefill.report.server_fidelity import summary_lines

    text = "\n".join(summary_lines(untold))
    assert "cannot tell the token budget apart: its predictions differ" in text
    assert "by at most 5.0%" in text
    document = json.loads(json.dumps(untold.to_dict(), allow_nan=False))
    assert document["wrong_scheduling"]["budget 4,096"]["cells"] == []


def test_the_cells_a_counter_check_is_judged_on_ignore_the_measurement():
    right = _cells([0.0] * 8)
    limits = [SEPARATION * (TTFT_THRESHOLD if c.metric == "ttft" else THRESHOLD) for c in right]
    # just over its cell's limit on cells 0, 1, 4, 5; just under on the others
    other = _cells([0.0] * 8, [1 + x * (1.01 if i % 4 < 2 else 0.99) for i, x in enumerate(limits)])
    chosen = discriminating(right, other)
    assert chosen == [right[i].key for i in (0, 1, 4, 5)]
    for factor in (0.5, 3.0):  # the same simulations against other measurements, as quiet
        moved = [dataclasses.replace(c, measured=(factor, factor)) for c in right]
        assert discriminating(moved, other) == chosen


def test_a_counter_checks_interval_is_the_middle_of_its_cells_median_over_the_same_draws():
    right = _cells([0.01] * 6)
    other = _cells([0.01] * 6, [1.0, 1.5, 1.0, 1.5, 1.0, 1.0])
    rng = __import__("random").Random(1)
    draws = [{c.key: abs(c.error) + rng.uniform(-0.05, 0.05) for c in other} for _ in range(200)]
    check = counter_check(right, other, _draws(right), draws)
    keys = [other[1].key, other[3].key]
    assert check.cells == tuple(keys)
    medians = sorted((d[keys[0]] + d[keys[1]]) / 2 for d in draws)  # median of two: their mean
    from pytest_prefill.sim import linear_percentile

    expected = (linear_percentile(medians, 5), linear_percentile(medians, 95))
    assert check.judgement is not None and check.judgement.interval is not None
    assert (check.judgement.interval.low, check.judgement.interval.high) == pytest.approx(expected)
    assert interval_of(draws, keys) == check.judgement.interval
    # one TTFT cell and one other: the TTFT figure is that cell's alone, against 10%
    assert check.judgement.ttft_error == pytest.approx(abs(other[1].error))


def test_a_counter_checks_judgement_needs_no_ttft_cell():
    alone = Judgement(0.4, math.nan, interval=Interval(0.3, 0.5), ttft_required=False)
    assert alone.verdict == "FAILS"
    assert dataclasses.replace(alone, error=0.05, interval=Interval(0.02, 0.08)).verdict == "HOLDS"
    assert dataclasses.replace(alone, ttft_required=True, error=0.05).verdict == "FAILS"
