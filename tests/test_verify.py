"""Verify without an engine: flag sets, the probe rule (binomial standard error at the target),
the measured search's bracket and bound, the SLO the engine is held to, the prediction, the
probes against the reference server (requests sent, records kept), a server that dies mid-search
(one line, the probes kept), a launcher that cannot start, and the report."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import re

import pytest
from cli_errors import usage_error
from poisson_load import poisson_load

from pytest_prefill.plan.metrics import SLO
from pytest_prefill.serve.calibration.calibration_fit import RequestOverhead
from pytest_prefill.serve.calibration.server_model import Scheduling, ServerModel, server_profile
from pytest_prefill.serve.client.identity import identify
from pytest_prefill.serve.client.prompts import Prompts
from pytest_prefill.serve.client.wire import Url
from pytest_prefill.serve.launch.launchers import Launcher
from pytest_prefill.serve.load.loadgen import Target
from pytest_prefill.serve.load.records import BenchRun
from pytest_prefill.sim import PRESETS, Request
from pytest_prefill.verify.knee import (
    KneeSearch,
    MeasuredProbe,
    engine_slo,
    measure_knee,
    predict_knee,
)
from pytest_prefill.verify.knee_interval import agreement
from pytest_prefill.verify.probe_rule import ProbeRule, probe_load
from pytest_prefill.verify.result import FlagSetResult, VerifyResult
from pytest_prefill.verify.verification import FlagSet, Server, VerifyOptions, verify

LAB_LAPTOP = PRESETS["lab-laptop"].cost

WORDS = Prompts(
    tuple(f" w{chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(80)), tuple(range(80)), "test"
)


def _poisson(n: int, rate: float = 2.0, **lengths: int) -> list[Request]:
    return poisson_load(n, rate, **lengths)


def test_a_flag_set_reads_as_a_capacity_deployment_writes_it():
    assert FlagSet.parse("tokens=256") == FlagSet(256)
    assert FlagSet.parse("tokens=512,seqs=8") == FlagSet(512, 8)
    for bad in ("256", "tokens=", "tokens=256,seqs=", "seqs=8", "tokens=1"):
        with pytest.raises(ValueError, match="flag set|budget"):
            FlagSet.parse(bad)


@pytest.mark.parametrize("target,margin", [(0.9, 0.05), (0.9, 0.1), (0.5, 0.05), (0.99, 0.02)])
def test_a_probe_is_long_enough_for_its_standard_error_to_be_within_the_margin(target, margin):
    rule = ProbeRule(target=target, margin=margin, min_requests=1)
    n = rule.requests
    assert rule.standard_error(target, n) <= margin + 1e-12
    assert n == 1 or rule.standard_error(target, n - 1) > margin
    assert str(n) in rule.sentence()


@pytest.mark.parametrize(
    "field,value",
    [("target", 1.0), ("margin", 0), ("tolerance", -1), ("step", 1.0), ("max_probes", 1)],
)
def test_a_probe_rule_refuses_what_cannot_decide(field, value):
    with pytest.raises(ValueError, match=field):
        ProbeRule(**{field: value})


def _fake_probe(scale: float, knee: float, n: int = 20) -> MeasuredProbe:
    good = n if scale <= knee else n // 2
    run = BenchRun((), {}, {}, "now")
    return MeasuredProbe(scale, 2.0 * scale, n, good, 0, None, run)


@pytest.mark.parametrize("start,knee", [(1.0, 1.0), (1.0, 3.7), (5.0, 0.4), (1.0, 1.04)])
def test_the_measured_search_brackets_the_knee_within_tolerance_or_its_probe_bound(start, knee):
    rule = ProbeRule(tolerance=0.1, max_probes=8)
    search = KneeSearch(rule, start)
    while (scale := search.next_scale()) is not None:
        search.observe(_fake_probe(scale, knee))
    result = search.result()
    assert result.probes[0].scale == start  # the first probe is at the predicted rate
    assert len(result.probes) <= rule.max_probes
    if result.status == "found":
        assert result.low is not None and result.high is not None
        assert result.low.scale <= knee < result.high.scale <= result.low.scale * 1.1 + 1e-9
    else:
        assert len(result.probes) == rule.max_probes


def test_the_engine_is_held_to_the_slo_less_the_requests_own_overhead():
    overhead = RequestOverhead(0.3, 0.1, 0.001, "test")
    held = engine_slo(SLO(ttft=1.0, tpot=0.05, e2el=5.0), overhead)
    assert held == SLO(ttft=0.7, tpot=0.05, e2el=4.7)
    assert engine_slo(SLO(ttft=0.2), overhead) is None


def test_the_overhead_only_lowers_the_predicted_knee():
    load = _poisson(40)
    scheduling = Scheduling(server_profile("vllm", 256, 8))
    slo = SLO(ttft=0.5, tpot=0.06)
    none = RequestOverhead(0.0, 0.0, 0.0, "test")
    some = RequestOverhead(0.1, 0.05, 0.0, "test")
    free = predict_knee(load, ServerModel(LAB_LAPTOP, none, scheduling), slo, 0.9)
    paid = predict_knee(load, ServerModel(LAB_LAPTOP, some, scheduling), slo, 0.9)
    assert free.rate > 0 and free.search is not None
    assert paid.rate <= free.rate * (1 + 0.02)
    unreachable = predict_knee(
        load, ServerModel(LAB_LAPTOP, RequestOverhead(1, 0.5, 0, "t"), scheduling), slo, 0.9
    )
    assert unreachable.rate == 0 and "overhead" in (unreachable.reason or "")


def test_probes_take_the_first_requests_the_rule_needs():
    rule = ProbeRule(margin=0.1)
    load = _poisson(50)
    assert [r.id for r in probe_load(load, rule)] == [r.id for r in load[: rule.requests]]
    with pytest.raises(ValueError, match="each probe needs"):
        probe_load(load[:5], rule)


async def _target(url: Url) -> Target:
    return Target(url, await identify(url, engine="openai"), WORDS)


def test_probes_against_the_reference_server_keep_every_request():
    from pytest_prefill.serve.launch.reference import Behaviour, running

    rule = ProbeRule(margin=0.15, max_probes=3, min_requests=4)
    load = probe_load(_poisson(20, rate=20.0), rule)

    async def go():
        async with running(Behaviour(ttft=0.01, gap=0.002)) as url:
            target = await _target(url)

            async def alive():
                return None

            return await measure_knee(target, load, SLO(ttft=1.0), rule, 1.0, alive=alive)

    knee = asyncio.run(go())
    assert knee.status == "never missed" and len(knee.probes) == rule.max_probes
    for probe in knee.probes:
        assert probe.sent == len(load) == probe.good and not probe.failed
        assert len({r.id for r in probe.run.records}) == len(load)
    rates = [p.rate for p in knee.probes]
    assert rates == sorted(rates) and rates[1] == pytest.approx(rates[0] * rule.step)
    json.dumps(knee.to_dict())


def test_a_server_that_dies_mid_search_ends_it_in_one_line_keeping_the_probes():
    from pytest_prefill.serve.launch.process import free_port, reference_server, start_server

    port = free_port()
    argv, env = reference_server(port, 0.01, 0.002)
    server = start_server(argv, port, env=env, timeout=30)
    rule = ProbeRule(margin=0.15, max_probes=4, min_requests=4)
    load = probe_load(_poisson(20, rate=20.0), rule)

    def kill_after_first(line: str) -> None:
        server.stop()

    async def alive():
        return None if server.process.poll() is None else "the server exited"

    async def go():
        target = await _target(server.url)
        return await measure_knee(
            target, load, SLO(ttft=1.0), rule, 1.0, alive=alive, progress=kill_after_first
        )

    try:
        knee = asyncio.run(go())
    finally:
        server.stop()
    assert knee.status == "ended" and "\n" not in (knee.ended or "")
    assert "the server exited" in (knee.ended or "")
    assert len(knee.probes) == 2 and knee.probes[0].attainment == 1.0
    assert knee.probes[1].failed == knee.probes[1].sent


def test_a_launcher_that_cannot_start_ends_its_flag_set_in_one_line(tmp_path):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"not a model")
    launcher = Launcher("llama.cpp", str(model), "/bin/false", ready_timeout=10)
    server = Server(launcher=launcher, engine="llama.cpp")
    with pytest.raises(ValueError, match="sweep"):
        VerifyOptions(rule=ProbeRule(margin=0.1))
    from pytest_prefill.serve.calibration.server_calibration import ServerSweep

    result = verify(
        server,
        [FlagSet(256), FlagSet(512)],
        _poisson(40),
        SLO(ttft=1.0),
        VerifyOptions(rule=ProbeRule(margin=0.1), sweep=ServerSweep(256)),
    )
    assert not result.compared and len(result.results) == 2
    for r in result.results:
        assert r.ended is not None and "did not start" in r.ended and "\n" not in r.ended
    assert result.same_best is None
    json.dumps(result.to_dict())


def test_a_running_server_runs_one_flag_set():
    from pytest_prefill.serve.calibration.server_calibration import ServerSweep

    server = Server(url=Url.parse("http://127.0.0.1:9"))
    with pytest.raises(ValueError, match="launcher"):
        verify(
            server,
            [FlagSet(256), FlagSet(512)],
            _poisson(40),
            SLO(ttft=1.0),
            VerifyOptions(sweep=ServerSweep(256)),
        )
    with pytest.raises(ValueError, match="repeated"):
        options = VerifyOptions(sweep=ServerSweep(256))
        verify(server, [FlagSet(256)] * 2, _poisson(40), SLO(ttft=1.0), options)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="probe_requests"):
            VerifyOptions(sweep=ServerSweep(256), probe_requests=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="options"):
        loose = {"sweep": ServerSweep(256)}  # the options as a mapping, not a VerifyOptions
        verify(server, [FlagSet(256)], _poisson(40), SLO(ttft=1.0), loose)  # type: ignore[arg-type]


def _result(flags: FlagSet, predicted: float, measured_knee: float) -> FlagSetResult:
    from pytest_prefill.verify.knee import MeasuredKnee, Predicted

    search = KneeSearch(ProbeRule(max_probes=8), predicted / 2.0)
    while (scale := search.next_scale()) is not None:
        search.observe(_fake_probe(scale, measured_knee / 2.0))

    prediction = Predicted(predicted, "found", SLO(ttft=1.0))
    knee: MeasuredKnee = search.result()
    return FlagSetResult(flags, predicted=prediction, measured=knee)


def test_the_report_says_whether_the_measured_ranking_agrees():
    from pytest_prefill.report.verify import verify_report

    a, b, c = FlagSet(128), FlagSet(256, 4), FlagSet(512)
    agree = VerifyResult(
        "w",
        SLO(ttft=1.0),
        ProbeRule(),
        (_result(a, 2, 2), _result(b, 4, 4.2), _result(c, 3, 2.9)),
        "vllm",
    )
    assert agree.same_order and agree.same_best and agree.best_verdict == "HOLDS"
    text = verify_report(agree)
    assert "agrees" in text and "≤256 tok, ≤4 seqs > ≤512 tok > ≤128 tok" in text
    swapped = VerifyResult(
        "w", SLO(ttft=1.0), ProbeRule(), (_result(a, 2, 5), _result(b, 4, 4)), "vllm"
    )
    assert swapped.same_best is False and swapped.best_verdict == "FAILS"
    assert "best FAILS (≤128 tok's measured knee lies above ≤256 tok, ≤4 seqs's)" in verify_report(
        swapped
    )
    ratio = agree.results[1].ratio
    measured = agree.results[1].measured
    assert measured is not None and measured.rate <= measured.knee  # interpolated above the pass
    assert math.isfinite(ratio) and ratio == pytest.approx(4 / measured.knee)


def test_the_report_wraps_its_header_explains_replayed_and_has_no_blank_column():
    """The rule's sentence is wrapped (no line of prose wider than the report's width), the
    knee table has no unnamed column when no server ended, and the replayed column is explained
    under the probe table."""
    from pytest_prefill.report.verify import REPLAYED, WIDTH, knee_table, verify_report

    result = VerifyResult(
        "w",
        SLO(ttft=1.0),
        ProbeRule(),
        (_result(FlagSet(128), 2, 2), _result(FlagSet(256), 4, 4)),
        "vllm",
    )
    text = verify_report(result)
    knee, probes = knee_table(result), text.split(knee_table(result))[1]
    prose = [line for line in text.split("\n") if line not in knee and line not in probes]
    assert all(len(line) <= WIDTH for line in prose[:-1])  # the ranking line is the last
    assert text.index("p90 TPOT ms") < text.index(REPLAYED[:40])  # under the probe table
    names, rule = knee.split("\n")[:2]
    columns = [m.span() for m in re.finditer("-+", rule)]  # tabulate's rule: a run per column
    assert all(names[a:b].strip() for a, b in columns)  # every column named
    ended = dataclasses.replace(result.results[0], ended="server died")
    with_end = dataclasses.replace(result, results=(ended, result.results[1]))
    assert knee_table(with_end).split("\n")[0].split()[-1] == "server"


def test_answer_of_reads_a_capacity_answers_colocated_settings(tmp_path):
    from pytest_prefill.commands.verify import answer_of
    from pytest_prefill.plan.capacity import capacity
    from pytest_prefill.plan.deployments import Deployment
    from pytest_prefill.plan.executors import InlineExecutor
    from pytest_prefill.plan.question import ServingQuestion

    deployments = [
        Deployment("chunked", 2, max_batched_tokens=256, max_seqs=8),
        Deployment("chunked", 2, max_batched_tokens=1024),
        Deployment("disaggregated", 2, prefill_workers=1, max_batched_tokens=512),
    ]
    answer = capacity(
        ServingQuestion(
            _poisson(30), LAB_LAPTOP, SLO(ttft=2.0), engine="vllm", executor=InlineExecutor()
        ),
        2,
        deployments=deployments,
    )
    path = tmp_path / "answer.json"
    path.write_text(json.dumps(answer.to_dict()))
    flags, slo, target = answer_of(str(path))
    assert flags == [FlagSet(256, 8), FlagSet(1024)]
    assert slo == SLO(ttft=2.0) and target == answer.target
    path.write_text("{}")
    with pytest.raises(ValueError, match="not a capacity answer"):
        answer_of(str(path))


@pytest.mark.parametrize(
    "argv,needle",
    [
        (["verify", "--url", "http://127.0.0.1:9", "--slo", "ttft:1s"], "--answer"),
        (["verify", "--url", "http://127.0.0.1:9", "--flags", "tokens=256"], "--slo"),
        (["verify", "--launch", "vllm", "--flags", "tokens=256", "--slo", "ttft:1s"], "--model"),
        (
            ["verify", "--url", "http://127.0.0.1:9", "--flags", "tokens=x", "--slo", "ttft:1s"],
            "tokens=N",
        ),
        (["verify", "--flags", "tokens=256", "--slo", "ttft:1s"], "--url"),
        (
            [
                "verify",
                "--url",
                "http://127.0.0.1:9",
                "--flags",
                "tokens=8",
                "--slo",
                "ttft:1s",
                "--no-pin",
            ],
            "--no-pin goes with --launch, not --url",
        ),
    ],
)
def test_the_command_line_refuses_what_it_can_before_starting_anything(argv, needle, capsys):
    assert needle in usage_error(argv, capsys)


def test_equal_leading_hash_ids_give_equal_leading_tokens_and_the_rest_is_salted():
    from pytest_prefill.serve.client.identity import ServerIdentity

    identity = ServerIdentity("http://127.0.0.1:9", ("m",), "vllm", "given")
    target = Target(Url.parse("http://127.0.0.1:9"), identity, WORDS, token_ids=True)
    shared = dataclasses.replace(target, prefix_block_tokens=4)

    def prompt(t: Target, request_id: str, blocks: tuple[int, ...], length: int = 14) -> list:
        return t.body(request_id, length, 2, blocks)["prompt"]

    a, b = prompt(shared, "a", (1, 2, 3, 9)), prompt(shared, "b", (1, 2, 7, 8))
    assert len(a) == len(b) == 14
    assert a[:8] == b[:8] and a[8:12] != b[8:12]  # blocks 1, 2 shared; 3 and 7 differ
    assert a[12:] == prompt(shared, "d", (5, 6, 4, 9))[12:]  # the same id, the same words
    short = prompt(shared, "c", (1,), 10)
    assert short[:4] == a[:4] and short[4:] != a[4:10]  # past its blocks: its own salted words
    assert prompt(target, "a", (1, 2, 3, 9)) != a  # no block size: salted whole
    other_run = dataclasses.replace(shared, salt="another run")
    assert prompt(other_run, "a", (1, 2, 3, 9))[:8] != a[:8]  # a new run starts cold
    text = dataclasses.replace(shared, token_ids=False, identity=identity)
    words = text.body("a", 14, 2, (1, 2, 3, 9))["prompt"]
    assert words == "".join(WORDS.words[WORDS.ids.index(i)] for i in a)


def _two_runs_written(tmp_path):
    """Two verify documents, one flag set each (≤128: knees 2 and 2; ≤512: 4 and 4.2), as
    files; the runs and their paths."""
    runs = [
        VerifyResult("w", SLO(ttft=1.0), ProbeRule(), (_result(FlagSet(128), 2, 2),), "vllm"),
        VerifyResult("w", SLO(ttft=1.0), ProbeRule(), (_result(FlagSet(512), 4, 4.2),), "vllm"),
    ]
    paths = []
    for i, result in enumerate(runs):
        path = tmp_path / f"v{i}.json"
        path.write_text(json.dumps(result.to_dict()))
        paths.append(str(path))
    return runs, paths


def test_rank_puts_several_runs_flag_sets_in_one_ranking(tmp_path, capsys):
    from pytest_prefill.cli import main

    _, paths = _two_runs_written(tmp_path)
    assert main(["verify", "--rank", *paths]) == 0
    out = capsys.readouterr().out
    assert "ranking: predicted ≤512 tok > ≤128 tok" in out and "agrees" in out
    (tmp_path / "bad.json").write_text("{}")
    assert "not a verify result" in usage_error(
        ["verify", "--rank", str(tmp_path / "bad.json")], capsys
    )


def test_rank_never_ranks_flag_sets_of_different_engines_together(tmp_path, capsys):
    from pytest_prefill.cli import main
    from pytest_prefill.report.verify import combined_rankings

    runs, paths = _two_runs_written(tmp_path)
    other = VerifyResult(  # transformers: its best predicted low, measured high
        "w",
        SLO(ttft=1.0),
        ProbeRule(),
        (_result(FlagSet(128), 9.0, 3.0), _result(FlagSet(512), 3.0, 9.0)),
        "transformers",
    )
    path = tmp_path / "tf.json"
    path.write_text(json.dumps(other.to_dict()))
    rankings = combined_rankings([*runs, other])
    together = (runs[0].results[0], runs[1].results[0])
    vllm = VerifyResult("w", SLO(ttft=1.0), ProbeRule(), together, "vllm")
    assert [(engine, verdict) for engine, verdict, _ in rankings] == [
        ("vllm", vllm.best_verdict),
        ("transformers", other.best_verdict),
    ]
    assert other.best_verdict == "FAILS" and rankings[0][1] == "HOLDS"
    assert rankings[0][2].startswith("ranking, vllm: predicted ≤512 tok > ≤128 tok")
    assert rankings[1][2].startswith("ranking, transformers: predicted ≤128 tok > ≤512 tok")
    results = tmp_path / "results"
    argv = ["verify", "--rank", *paths, str(path), "--save", "--results", str(results)]
    assert main([*argv, "--machine", "box"]) == 0
    out = capsys.readouterr().out
    assert "engine" in out and "ranking, vllm:" in out and "ranking, transformers:" in out
    (archived,) = [p for p in (results / "box").glob("0*.json")]
    verdicts = {v["name"]: v["verdict"] for v in json.loads(archived.read_text())["verdicts"]}
    assert verdicts["verify ranking vllm"] == "HOLDS"
    assert verdicts["verify ranking transformers"] == "FAILS"
    assert "knee transformers ≤512 tok" in verdicts and "verify ranking" not in verdicts


def test_the_search_stops_rising_once_its_probe_is_a_burst():
    rule = ProbeRule(max_probes=8, step=1.5)
    search = KneeSearch(rule, 1.0, max_scale=3.0)
    while (scale := search.next_scale()) is not None:
        search.observe(_fake_probe(scale, knee=100.0))
    scales = [p.scale for p in search.probes]
    assert scales == [1.0, 1.5, 2.25, 3.0] and search.result().status == "never missed"
    assert KneeSearch(rule, 10.0, max_scale=3.0).next_scale() == 3.0


def test_rank_save_archives_each_runs_document_without_its_records(tmp_path, capsys):
    from pytest_prefill.cli import main

    runs, paths = _two_runs_written(tmp_path)
    results = tmp_path / "results"
    argv = ["verify", "--rank", *paths, "--save", "--results", str(results)]
    assert main([*argv, "--machine", "box"]) == 0
    assert "archived:" in capsys.readouterr().out
    (archived,) = [p for p in (results / "box").glob("0*.json")]
    document = json.loads(archived.read_text())
    data = document["tables"][0]["data"]
    assert data["files"] == paths and len(data["runs"]) == 2
    for run, result in zip(data["runs"], runs):
        probes = run["flag_sets"][0]["measured"]["probes"]
        assert probes and all("records" not in p for p in probes)
        assert [p["good"] for p in probes] == [p.good for p in result.results[0].measured.probes]
    names = [v["name"] for v in document["verdicts"]]
    assert names == ["knee ≤128 tok", "knee ≤512 tok", "verify ranking"]


def test_a_bracket_whose_sides_are_not_clear_of_the_target_gets_an_anchor_each_side():
    rule = ProbeRule(target=0.9, margin=0.05, tolerance=0.1, max_probes=8)

    def probe(scale: float, attainment: float) -> MeasuredProbe:
        run = BenchRun((), {}, {}, "now")
        return MeasuredProbe(scale, scale, 100, round(attainment * 100), 0, None, run)

    search = KneeSearch(rule, 1.0)
    search.observe(probe(1.0, 0.92))  # met, but within the margin of the target
    search.observe(probe(1.05, 0.88))  # missed, within the margin too: bracketed within 10%
    below = search.next_scale()
    assert below == pytest.approx(1.0 / 1.1)
    search.observe(probe(below, 1.0))
    above = search.next_scale()
    assert above == pytest.approx(1.05 * 1.1)
    search.observe(probe(above, 0.6))
    assert search.next_scale() is None  # both sides clear now
    clear = KneeSearch(rule, 1.0)
    clear.observe(probe(1.0, 1.0))
    clear.observe(probe(1.05, 0.5))
    assert clear.next_scale() is None


def test_a_knee_below_every_probe_reads_as_open_not_as_zero():
    from pytest_prefill.report.verify import knee_table

    result = _result(FlagSet(256), 4, 4)
    measured = result.measured
    assert measured is not None and measured.estimate is not None
    below = dataclasses.replace(measured.estimate, rate=0.0, low=0.0)
    opened = dataclasses.replace(result, measured=dataclasses.replace(measured, estimate=below))
    table = knee_table(VerifyResult("w", SLO(ttft=1.0), ProbeRule(), (opened,), "vllm"))
    lowest = min(p.rate for p in measured.probes)
    assert f"< {lowest:.3g} [0," in table and "inf [" not in table


def test_rank_reads_a_documents_open_interval_kept_as_text():
    from pytest_prefill.report.verify import combined_report

    run = VerifyResult("w", SLO(ttft=1.0), ProbeRule(), (_result(FlagSet(128), 2, 2),), "vllm")
    document = json.loads(json.dumps(run.to_dict()))
    document["flag_sets"][0]["measured"]["estimate"]["high"] = "inf"  # as json_safe writes inf
    text = combined_report([VerifyResult.from_dict(document)])
    assert "inf]" in text and "≤128 tok" in text


def _speeds(*factors: float) -> tuple:
    from pytest_prefill.verify.load_check import LoadFactor

    return tuple(LoadFactor(k, k - 0.01, k + 0.01, 0.9, 200, 1.0, 1.0, 40) for k in factors)


@pytest.mark.parametrize(
    ("factors", "spread"), [((1.0, 1.05), False), ((1.0, 1.2), False), ((0.9, 1.2), True)]
)
def test_the_report_gives_each_probes_speed_and_says_when_they_spread_past_the_goal(
    factors, spread
):
    from pytest_prefill._io import json_safe
    from pytest_prefill.report.verify import combined_report, probe_table, speed_line
    from pytest_prefill.verify.load_check import LoadCheck, LoadFactor

    result = dataclasses.replace(_result(FlagSet(256), 4, 4), speeds=_speeds(*factors))
    line = speed_line(result)
    low, high = min(factors), max(factors)
    assert line is not None and f"x{low:.2f}-x{high:.2f}" in line
    assert f"{high / low - 1:.0%} apart" in line
    assert ("no one factor is within ±10% of every probe's" in line) is spread  # 1.1 / 0.9 apart
    table = probe_table(VerifyResult("w", SLO(ttft=1.0), ProbeRule(), (result,), "vllm"))
    assert "speed [90%]" in table and f"x{factors[0]:.2f} [" in table
    assert speed_line(dataclasses.replace(result, speeds=())) is None
    assert "than the knee was predicted for" not in line  # x1 (no load check): within the range
    for k, said in ((1.5, "faster"), (0.5, "slower")):
        check = LoadCheck(4.0, (), k)
        line = speed_line(dataclasses.replace(result, load_check=check)) or ""
        assert f"x{k:.2f}" in line and f"ran {said} in its probes" in line
    unfitted = LoadFactor(math.nan, math.nan, math.nan, 0.9, 200, 1.0, 1.0, 3, "too few")
    run = VerifyResult("w", SLO(ttft=1.0), ProbeRule(), (result,), "vllm")
    document = json.loads(json.dumps(run.to_dict()))
    document["flag_sets"][0]["speeds"].append(json_safe(unfitted.to_dict()))  # as written
    assert f"x{low:.2f}-{high:.2f}" in combined_report([VerifyResult.from_dict(document)])


def test_a_predicted_tie_names_no_one_best_and_the_report_says_so():
    from pytest_prefill.report.verify import combined_report, ranking_line
    from pytest_prefill.verify.knee import PREDICTION_TOLERANCE
    from pytest_prefill.verify.result import claimed_apart

    a, b, c = FlagSet(128), FlagSet(256), FlagSet(512)
    rule = ProbeRule()
    tie = claimed_apart(rule.within)  # 22% at the goal's ±10%
    tied = VerifyResult(
        "w",
        SLO(ttft=1.0),
        rule,
        (_result(a, 4.61, 4.86), _result(b, 3.0, 3.1), _result(c, 4.61 / (1 + tie / 2), 5.07)),
        "transformers",
    )
    assert tied.tolerance == pytest.approx(tie)
    # the first listed predicts highest, the last measures highest: closer than knee claims
    # can order, the prediction named both, so the best and the order agree
    assert tied.predicted_order[0] == 0 and tied.measured_order[0] == 2
    assert tied.predicted_best == (0, 2) and tied.same_best and tied.same_order
    line = ranking_line(tied)
    assert "predicted ≤128 tok = ≤512 tok > ≤256 tok" in line and "a tie" in line
    assert f"within {tie:.0%}" in line and "±10%" in line
    assert "best HOLDS" in line and tied.to_dict()["predicted_best"] == ["≤128 tok", "≤512 tok"]
    assert tied.to_dict()["ranking_tolerance"] == pytest.approx(tie)
    told = VerifyResult(  # the same knees predicted further apart than that: told, swapped
        "w",
        SLO(ttft=1.0),
        rule,
        (_result(a, 4.61 * (1 + 1.5 * tie), 4.86), _result(c, 4.61, 5.07)),
        "transformers",
    )
    assert told.predicted_best == (0,) and told.same_best is False and not told.same_order
    assert told.best_verdict != "HOLDS" and "a tie" not in ranking_line(told)
    assert f"best {told.best_verdict}" in ranking_line(told)
    for result in (tied, told):  # the documents ranked again say the same
        again = VerifyResult.from_dict(json.loads(json.dumps(result.to_dict())))
        assert combined_report([again]).splitlines()[-1] == ranking_line(result)
    # the tie follows the goal the knees are judged against, never under the search's bracket
    looser = dataclasses.replace(tied, rule=ProbeRule(within=0.05))
    assert looser.tolerance == pytest.approx(1.05 / 0.95 - 1)
    assert dataclasses.replace(tied, rule=ProbeRule(within=0.001)).tolerance == PREDICTION_TOLERANCE
    all_tied = VerifyResult("w", SLO(ttft=1.0), rule, tied.results[::2], "transformers")
    assert all_tied.best_verdict == "UNDECIDED" and "no claim" in ranking_line(all_tied)


def test_an_undecided_verdict_gets_the_probes_left_where_they_decide_it():
    rule = ProbeRule(target=0.9, margin=0.05, tolerance=0.05, max_probes=7, step=1.2)

    steps = [(0.9, 0.98), (0.94, 0.93), (0.99, 0.98), (1.02, 0.82), (math.inf, 0.3)]

    def server(scale: float) -> float:  # run V's vLLM ≤128 tok: 5.22 req/s met less than 5.47
        return next(attainment for below, attainment in steps if scale < below)

    def probe(scale: float) -> MeasuredProbe:
        run = BenchRun((), {}, {}, "now")
        return MeasuredProbe(scale, scale, 250, round(server(scale) * 250), 0, None, run)

    searches = {}
    for judged in (None, 1.0):
        search = KneeSearch(rule, 1.0, judged=judged)
        while (scale := search.next_scale()) is not None:
            search.observe(probe(scale))
        searches[judged] = search
    plain, deciding = searches[None], searches[1.0]
    assert len(plain.probes) == 4  # bracketed within 5%, both sides clear of the target
    assert agreement(1.0, plain.result().estimate).verdict == "UNDECIDED"  # open above
    assert [p.scale for p in deciding.probes[:4]] == [p.scale for p in plain.probes]
    assert [p.scale for p in deciding.probes[4:]] == [pytest.approx(1.05)]  # past the highest
    assert agreement(1.0, deciding.result().estimate).verdict == "HOLDS"
    stubborn = KneeSearch(rule, 1.0, judged=1.0)  # a server at the target at every rate
    while (scale := stubborn.next_scale()) is not None:
        run = BenchRun((), {}, {}, "now")
        good = 36 - len(stubborn.probes) % 2
        stubborn.observe(MeasuredProbe(scale, scale, 40, good, 0, None, run))
    assert len(stubborn.probes) == rule.max_probes
    with pytest.raises(ValueError, match="judged"):
        KneeSearch(rule, 1.0, judged=0.0)


def test_a_flag_sets_ended_line_keeps_the_errors_first_line_whole_or_says_it_was_cut():
    from pytest_prefill.verify.result import one_line

    advice = "the server sent nothing for 60 s mid-response (stalled; raise the stall timeout)"
    said = "calibration request cal0-l1024-live0 failed: POST http://127.0.0.1:1/v1: " + advice
    assert one_line(ValueError(said + "\nthe server's log:\nlines")) == said  # whole, first line
    long = "x" * 1000
    cut = one_line(ValueError(long), limit=100)
    assert len(cut) == 100 and cut.endswith("…") and cut[:-1] == long[:99]
    assert one_line(ValueError("")) == "ValueError"  # an empty error still says what it was


@pytest.mark.parametrize("engine", ["transformers", "llama.cpp"])
def test_the_server_verify_runs_on_is_the_one_its_flags_name(tmp_path, engine):
    from pytest_prefill.cli import build_parser
    from pytest_prefill.commands.verify import _server

    parser = build_parser("verify")
    common = ["verify", "--flags", "tokens=16", "--slo", "ttft:1s", "--stall-timeout", "7"]
    running = parser.parse_args([*common, "--url", "http://127.0.0.1:9", "--kv-tokens", "512"])
    server = _server(running, 4, None)
    assert server.url == Url.parse("http://127.0.0.1:9") and server.launcher is None
    assert server.kv_tokens == 512 and server.tokenizer is None
    assert server.timeouts.stall == 7 and server.prefix_block_tokens == 4
    model, program = tmp_path / "model", str(tmp_path / "llama-server")
    model.mkdir()
    launch = ["--launch", engine, "--model", str(model), "--program", program]
    server = _server(parser.parse_args([*common, *launch]), None, None)
    assert server.url is None and server.kv_tokens is None
    assert server.launcher == Launcher(engine, str(model), program, pin=True)
    assert server.kv_capacity == server.launcher.kv_capacity()  # a launcher sizes its own
    assert server.tokenizer == (None if engine == "llama.cpp" else str(model))
    assert server.timeouts.stall == 7 and server.prefix_block_tokens is None
