"""A verify document reads back as the value that wrote it (``from_dict(to_dict(x)) == x``), a
bad one is refused naming the field, and a run ranks the same in its own report and under
``verify --rank``."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_prefill.measure.quiet import HostSteal
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.serve.calibration.server_model import (
    PROFILED_ENGINES,
    Scheduling,
    server_profile,
)
from pytest_prefill.serve.load.records import BenchRun, ServerCounters, ServerRecord
from pytest_prefill.verify.knee import MeasuredKnee, MeasuredProbe, Predicted
from pytest_prefill.verify.knee_interval import KneeEstimate
from pytest_prefill.verify.knee_sizing import Sharpness
from pytest_prefill.verify.load_check import LoadCheck, LoadFactor, LoadRun
from pytest_prefill.verify.probe_rule import FlagSet, ProbeRule
from pytest_prefill.verify.result import FlagSetResult, VerifyResult, read_verify
from tests.strategies import examples

pytestmark = pytest.mark.sim

rates = st.floats(0.01, 100.0)
fractions = st.floats(0.0, 1.0)
words = st.text("abcdefghij ≤,", min_size=1, max_size=12)
SLO_ = SLO(ttft=1.0, tpot=0.15)


@st.composite
def records(draw: st.DrawFn, index: int) -> ServerRecord:
    arrival = draw(st.floats(0.0, 10.0))
    if draw(st.booleans()):
        return ServerRecord(f"r{index}", arrival, arrival, 8, 4, error="refused")
    gaps = draw(st.lists(st.floats(0.001, 0.5), min_size=1, max_size=4))
    times = tuple(arrival + sum(gaps[: i + 1]) for i in range(len(gaps)))
    counts = tuple(draw(st.integers(1, 3)) for _ in times)
    output = sum(counts)
    return ServerRecord(
        f"r{index}", arrival, arrival, 8, output, times, counts, 8, output, None, None, False
    )


@st.composite
def runs(draw: st.DrawFn) -> BenchRun:
    n = draw(st.integers(0, 3))
    host = draw(
        st.none()
        | st.builds(
            HostSteal,
            st.none() | fractions,
            fractions,
            st.floats(0, 60),
            st.booleans(),
            st.lists(fractions, max_size=2).map(tuple),
        )
    )
    counters = draw(st.none() | st.just(ServerCounters({"a": 1.0}, {"a": 3.0})))
    return BenchRun(
        tuple(draw(records(i)) for i in range(n)),
        {"engine": "vllm"},
        {"rate": 1.0},
        "2026-01-01T00:00:00+00:00",
        stopped=draw(st.none() | words),
        server_counters=counters,
        interrupted=draw(st.booleans()),
        host=host,
    )


@st.composite
def probes(draw: st.DrawFn) -> MeasuredProbe:
    run = draw(runs())
    sent = len(run.records)
    good = draw(st.integers(0, sent))
    outcomes = tuple(draw(st.lists(st.booleans(), max_size=sent)))
    metrics = run.metrics(slo=SLO_) if run.completed else None
    return MeasuredProbe(draw(rates), draw(rates), sent, good, sent - good, metrics, run, outcomes)


@st.composite
def knees(draw: st.DrawFn) -> MeasuredKnee:
    found = tuple(draw(st.lists(probes(), max_size=3)))
    low = draw(st.none() | st.sampled_from(found)) if found else None
    high = draw(st.none() | st.sampled_from(found)) if found else None
    bound = st.floats(0.0, 100.0) | st.just(math.inf)
    estimate = draw(
        st.none()
        | st.builds(KneeEstimate, bound, bound, bound, fractions, st.integers(1, 999), rates)
    )
    return MeasuredKnee(found, low, high, draw(fractions), draw(st.none() | words), estimate)


def load_factors() -> st.SearchStrategy[LoadFactor]:
    n = st.integers(0, 1000)
    return st.builds(
        LoadFactor, rates, rates, rates, fractions, n, rates, rates, n, words | st.just("")
    )


@st.composite
def flag_set_results(draw: st.DrawFn) -> FlagSetResult:
    engine = draw(st.sampled_from(PROFILED_ENGINES))
    budget, seqs = draw(st.integers(2, 4096)), draw(st.none() | st.integers(1, 64))
    kv = draw(st.just(math.inf) | st.floats(1.0, 1e6))
    scheduling = Scheduling(server_profile(engine, budget, seqs), kv)
    predicted = st.builds(
        Predicted,
        st.floats(0.0, 100.0),
        words,
        st.none() | st.just(SLO_),
        st.none() | words,
        rates,
        st.none() | st.just({"max_rate": 1.0, "probes": [{"scale": 0.5}]}),
    )
    sharpness = st.builds(
        Sharpness,
        rates,
        st.integers(1, 500),
        fractions,
        fractions,
        fractions,
        fractions,
        fractions,
        st.none() | words,
    )
    check = st.builds(
        LoadCheck,
        rates,
        st.lists(st.builds(LoadRun, rates, load_factors(), runs()), max_size=2).map(tuple),
        st.floats(0.5, 2.5),
    )
    return FlagSetResult(
        FlagSet(budget, seqs),
        tuple(draw(st.lists(words, max_size=3))),
        None,
        draw(st.none() | st.just(scheduling)),
        draw(st.none() | predicted),
        draw(st.none() | knees()),
        draw(st.none() | words),
        draw(st.none() | st.integers(-9, 255)),
        draw(st.integers(0, 500)),
        draw(st.integers(0, 500)),
        draw(st.floats(0.01, 0.5)),
        draw(st.none() | words),
        draw(st.none() | sharpness),
        tuple(draw(st.lists(fractions, max_size=3))),
        draw(st.none() | check),
        tuple(draw(st.lists(load_factors(), max_size=2))),
    )


@st.composite
def verify_results(draw: st.DrawFn) -> VerifyResult:
    rule = ProbeRule(
        target=draw(st.floats(0.5, 0.99)),
        tolerance=draw(st.floats(0.01, 0.5)),
        within=draw(st.floats(0.01, 0.5)),
        start=draw(st.integers(0, 300)),
    )
    results = tuple(draw(st.lists(flag_set_results(), max_size=3)))
    return VerifyResult(draw(words), SLO_, rule, results, draw(words), draw(st.just("") | words))


@examples(60)
@given(verify_results())
def test_a_verify_document_reads_back_as_the_value_that_wrote_it(result):
    document = json.loads(json.dumps(result.to_dict()))  # through JSON, as a file holds it
    again = VerifyResult.from_dict(document)
    assert again == result
    assert again.to_dict() == result.to_dict()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda d: d.update(kind="pytest-prefill/capacity"), "not a verify result"),
        (lambda d: d.pop("slo"), "missing 'slo'"),
        (lambda d: d["flag_sets"][0].pop("flags"), "flag_sets[0]: missing 'flags'"),
        (
            lambda d: d["flag_sets"][0]["flags"].update(budget="8"),
            "flags.budget: must be an integer",
        ),
        (lambda d: d["flag_sets"][0]["flags"].update(budget=1), "budget must be an integer >= 2"),
        (lambda d: d["probe_rule"].update(target=2.0), "probe_rule: target"),
        (
            lambda d: d["flag_sets"][0]["measured"]["probes"][0].update(rate="fast"),
            "flag_sets[0].measured.probes[0].rate: must be a number",
        ),
    ],
)
def test_a_bad_document_is_refused_naming_the_file_and_the_field(tmp_path, change, named):
    probe = MeasuredProbe(1.0, 2.0, 0, 0, 0, None, BenchRun((), {}, {}, "now"))
    knee = MeasuredKnee((probe,), probe, None, 0.05)
    result = VerifyResult(
        "w", SLO_, ProbeRule(), (FlagSetResult(FlagSet(8), measured=knee),), "vllm"
    )
    document = json.loads(json.dumps(result.to_dict()))
    change(document)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ValueError) as caught:
        read_verify(str(path))
    assert str(caught.value).startswith(f"{path}: ") and named in str(caught.value)
    assert "\n" not in str(caught.value)


def _ranked(
    predicted: float, measured: float, low: float, high: float, ended: str | None
) -> FlagSetResult:
    probe = MeasuredProbe(1.0, measured, 0, 0, 0, None, BenchRun((), {}, {}, "now"))
    knee = MeasuredKnee((probe,), probe, None, 0.05, None, KneeEstimate(measured, low, high))
    flags = FlagSet(int(predicted * 10) + 2)
    return FlagSetResult(
        flags, predicted=Predicted(predicted, "found", SLO_), measured=knee, ended=ended
    )


def test_a_run_ranks_the_same_in_its_own_report_and_under_rank(tmp_path):
    """One flag set ended after its knee was measured: it is compared in the run's own
    ranking, and so it is under --rank (which reads the same typed value)."""
    from pytest_prefill.report.verify import combined_rankings, ranking_line

    results = (
        _ranked(10.0, 9.0, 8.5, 9.5, None),
        _ranked(5.0, 6.0, 5.5, 6.5, "≤52 tok: the server died after its probes"),
        _ranked(20.0, 4.0, 3.5, 4.5, None),
    )
    result = VerifyResult("w", SLO_, ProbeRule(), results, "vllm")
    path = tmp_path / "run.json"
    path.write_text(json.dumps(result.to_dict()))
    ((engine, verdict, line),) = combined_rankings([read_verify(str(path))])
    assert engine == "vllm" and verdict == result.best_verdict
    assert line == ranking_line(result)
    assert len(result.compared) == 3
