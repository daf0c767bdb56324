"""How long a probe is (``verify.knee_sizing``): rules 1 and 2 (long enough for the knee
predicted on the probe), rule 3 (long enough that the simulator predicts a miss by the margin at
an overload of the goal's size, within a wall-time cap, said loudly when the cap binds), the
probe window's start, and the report's line for a knee that is not decisive."""

from __future__ import annotations

import dataclasses
import math

import pytest
from poisson_load import poisson_load

from pytest_prefill.plan.metrics import SLO
from pytest_prefill.serve.calibration.calibration_fit import RequestOverhead
from pytest_prefill.serve.calibration.server_model import Scheduling, ServerModel, server_profile
from pytest_prefill.sim import PRESETS, Request
from pytest_prefill.verify.knee import predict_knee, simulated_attainment
from pytest_prefill.verify.knee_sizing import GROWTH, Sharpness, predict_sized, sharpness
from pytest_prefill.verify.probe_rule import ProbeRule, probe_load

LAB_LAPTOP = PRESETS["lab-laptop"].cost
NONE = RequestOverhead(0.0, 0.0, 0.0, "test")
SLO_ = SLO(ttft=0.5, tpot=0.06)
SCHEDULING = Scheduling(server_profile("vllm", 256, 8))


def _poisson(n: int, rate: float = 4.0, **lengths: int) -> list[Request]:
    return poisson_load(n, rate, **lengths)


def _ends_in_a_burst(calm: int = 30, burst: int = 6, after: int = 400) -> list[Request]:
    """Spaced arrivals, a burst, spaced again: a probe of the first ``calm + burst`` ends in
    the burst, so near its knee the burst's requests miss together and attainment is flat."""
    load, t = [], 0.0
    for name, count, gap in (("c", calm, 0.25), ("b", burst, 0.005), ("a", after, 0.25)):
        for i in range(count):
            load.append(Request(f"{name}{i}", t, 96, 8))
            t += gap
    return load


@pytest.mark.parametrize("field,value", [("max_seconds", 0), ("start", -1), ("start", 1.5)])
def test_a_probe_rule_refuses_a_bad_cap_or_start(field, value):
    with pytest.raises(ValueError, match=field):
        ProbeRule(**{field: value})


def test_rule_two_asks_for_an_overload_of_the_goal_to_build_one_ttft_of_queue():
    rule = ProbeRule(within=0.1, margin=0.1)
    assert rule.requests_at(20.0, SLO(ttft=1.0)) == 200  # 20 req/s x 1 s / 0.1
    assert ProbeRule(within=0.2).requests_at(20.0, SLO(ttft=1.0)) == 100
    assert rule.requests_at(20.0, SLO(tpot=0.1)) == rule.requests  # no TTFT or E2EL: rule 1


def test_a_probe_window_starts_after_the_skipped_requests_at_time_zero():
    load = _poisson(80)
    rule = ProbeRule(margin=0.1, start=30)
    sent = probe_load(load, rule, 40)
    assert [r.id for r in sent] == [r.id for r in load[30:70]]
    assert sent[0].arrival == 0.0
    gaps = [b.arrival - a.arrival for a, b in zip(load[30:70], load[31:70])]
    assert [b.arrival - a.arrival for a, b in zip(sent, sent[1:])] == pytest.approx(gaps)
    with pytest.raises(ValueError, match="after the first 75"):
        probe_load(load, dataclasses.replace(rule, start=75))


def test_decisive_means_an_overload_of_the_goal_misses_the_target_by_the_margin():
    def at(above: float) -> Sharpness:
        return Sharpness(10.0, 101, above, 1.0, target=0.9, margin=0.05, within=0.1)

    assert at(0.85).decisive and at(0.5).decisive
    assert not at(0.86).decisive and not at(0.9).decisive
    assert at(0.5).seconds == pytest.approx(10.0)  # 100 gaps at 10 req/s
    assert "NOT decisive" in at(0.88).sentence() and "NOT" not in at(0.8).sentence()


def test_sharpness_is_the_simulated_attainment_either_side_of_the_predicted_knee():
    rule = ProbeRule(margin=0.1)
    sent = probe_load(_poisson(120), rule, 120)
    predicted = predict_knee(sent, ServerModel(LAB_LAPTOP, NONE, SCHEDULING), SLO_, rule.target)
    sharp = sharpness(sent, ServerModel(LAB_LAPTOP, NONE, SCHEDULING), SLO_, rule, predicted)
    rate = predicted.rate
    assert rate > 0 and sharp.rate == rate and sharp.requests == len(sent)
    above = simulated_attainment(sent, ServerModel(LAB_LAPTOP, NONE, SCHEDULING), SLO_, rate * 1.1)
    below = simulated_attainment(sent, ServerModel(LAB_LAPTOP, NONE, SCHEDULING), SLO_, rate / 1.1)
    assert (sharp.above, sharp.below) == (above, below)
    at_knee = simulated_attainment(sent, ServerModel(LAB_LAPTOP, NONE, SCHEDULING), SLO_, rate)
    assert at_knee >= rule.target  # the predicted knee is a rate the search saw meet it
    with pytest.raises(ValueError, match="rate"):
        simulated_attainment(sent, ServerModel(LAB_LAPTOP, NONE, SCHEDULING), SLO_, 0.0)


def test_probes_are_long_enough_for_their_own_knee_and_decisive_or_say_why_not():
    load = _poisson(600)
    rule = ProbeRule(margin=0.1, max_seconds=1e6)
    sized = predict_sized(load, ServerModel(LAB_LAPTOP, NONE, SCHEDULING), SLO_, rule)
    sent, predicted, sharp = sized.requests, sized.predicted, sized.sharpness
    assert [r.id for r in sent] == [r.id for r in load[: len(sent)]]
    assert len(sent) >= rule.requests_at(predicted.rate, SLO_)  # rule 2
    again = predict_knee(sent, ServerModel(LAB_LAPTOP, NONE, SCHEDULING), SLO_, rule.target)
    assert again.rate == pytest.approx(predicted.rate)  # predicted on exactly what is sent
    assert sharp.decisive or sharp.capped == "the workload ends"
    short = predict_sized(load[:40], ServerModel(LAB_LAPTOP, NONE, SCHEDULING), SLO_, rule)
    assert len(short.requests) == 40  # the workload is shorter than the rules ask: all of it


def test_rule_three_lengthens_a_window_that_ends_in_a_burst_unless_the_cap_binds():
    load, slo = _ends_in_a_burst(), SLO(ttft=0.1, tpot=0.06)  # rule 1 binds: 36 requests
    rule = ProbeRule(margin=0.05, max_seconds=1e6)
    capped = dataclasses.replace(rule, max_seconds=1e-3)
    tight = predict_sized(load, ServerModel(LAB_LAPTOP, NONE, SCHEDULING), slo, capped)
    assert len(tight.requests) == rule.requests == 36  # rules 1 and 2 alone: into the burst
    assert not tight.sharpness.decisive and tight.sharpness.above > rule.target - rule.margin
    assert "over 0.001 s" in (tight.sharpness.capped or "")
    assert "NOT decisive" in tight.sharpness.sentence()
    free = predict_sized(load, ServerModel(LAB_LAPTOP, NONE, SCHEDULING), slo, rule)
    assert free.sharpness.decisive and free.sharpness.capped is None
    assert len(free.requests) > len(tight.requests)  # lengthened past the burst
    walk = [len(tight.requests)]
    while walk[-1] < len(free.requests):
        walk.append(math.ceil(walk[-1] * GROWTH))
    assert walk[-1] == len(free.requests)  # a quarter longer a step from rules 1 and 2's


def test_short_probes_take_rule_one_alone():
    rule = ProbeRule(margin=0.1, sustained=False)
    sized = predict_sized(_poisson(300), ServerModel(LAB_LAPTOP, NONE, SCHEDULING), SLO_, rule)
    assert len(sized.requests) == rule.requests


def test_the_command_line_sets_the_probe_start_and_cap_and_refuses_bad_ones(capsys):
    from cli_errors import usage_error

    from pytest_prefill.cli import build_parser

    base = ["verify", "--url", "http://127.0.0.1:9", "--flags", "tokens=256", "--slo", "ttft:1s"]
    args = build_parser("verify").parse_args([*base, "--probe-start", "200"])
    assert (args.probe_start, args.max_probe_seconds, args.tolerance) == (200, 45.0, 0.05)
    assert "--probe-start" in usage_error([*base, "--probe-start", "-1"], capsys)
    assert "--max-probe-seconds" in usage_error([*base, "--max-probe-seconds", "0"], capsys)


def test_the_report_says_loudly_when_a_knee_is_not_decisive():
    from pytest_prefill.report.verify import verify_report
    from pytest_prefill.verify.result import FlagSetResult, VerifyResult
    from pytest_prefill.verify.verification import FlagSet

    flat = Sharpness(10.0, 101, 0.88, 0.93, 0.9, 0.05, 0.1, capped="the workload ends")
    steep = dataclasses.replace(flat, above=0.6, capped=None)
    results = (
        FlagSetResult(FlagSet(128), sharpness=flat),
        FlagSetResult(FlagSet(256), sharpness=steep),
    )
    text = verify_report(VerifyResult("w", SLO(ttft=1.0), ProbeRule(), results, "vllm"))
    warnings = [line for line in text.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "≤128 tok" in warnings[0] and "the workload ends" in warnings[0]
    assert "88% / 93% NOT decisive" in text and "60% / 93%" in text


def test_a_probe_replayed_in_the_simulator_as_it_ran_there_attains_what_it_measured():
    from pytest_prefill.serve.calibration.server_model import simulate_records
    from pytest_prefill.serve.load.records import BenchRun, ServerRecord
    from pytest_prefill.verify.knee import probe_of, replayed_attainment

    rate = 60.0  # loaded: some requests miss, some meet the SLO
    load, slo = _poisson(60, rate=rate), SLO_

    def record(r: Request, times: tuple[float, ...]) -> ServerRecord:
        ones = (1,) * len(times)
        return ServerRecord(r.id, r.arrival, r.arrival, r.prompt_len, len(times), times, ones)

    sent = [record(r, (r.arrival + 1.0,) * r.output_len) for r in load]
    simulated = simulate_records(sent, ServerModel(LAB_LAPTOP, NONE, SCHEDULING))
    as_simulated = [record(r, s.token_times) for r, s in zip(load, simulated)]
    run = BenchRun(tuple(as_simulated), {}, {}, "now")
    probe = probe_of(run, slo, 1.0, rate, [r.id for r in load])
    replayed = replayed_attainment(probe, ServerModel(LAB_LAPTOP, NONE, SCHEDULING), slo)
    assert 0 < probe.attainment < 1 and replayed == pytest.approx(probe.attainment)
    empty = probe_of(BenchRun((), {}, {}, "now"), slo, 1.0, rate)
    assert math.isnan(replayed_attainment(empty, ServerModel(LAB_LAPTOP, NONE, SCHEDULING), slo))
