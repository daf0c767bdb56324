"""A hostile run's verify defects: a server dying mid-probe, and two lower bounds judged."""

from __future__ import annotations

import asyncio
import json
import math

from hostile import WORDS
from poisson_load import poisson_load

from pytest_prefill.plan.metrics import SLO
from pytest_prefill.serve.client.identity import identify
from pytest_prefill.serve.load.loadgen import Target
from pytest_prefill.verify.knee import MeasuredKnee, Predicted, measure_knee
from pytest_prefill.verify.probe_rule import FlagSet, ProbeRule, probe_load
from pytest_prefill.verify.result import FlagSetResult, VerifyResult, read_verify


def _dies_during_its_second_probe() -> MeasuredKnee:
    from pytest_prefill.serve.launch.process import free_port, reference_server, start_server

    port = free_port()
    argv, env = reference_server(port, 0.01, 0.002)
    server = start_server(argv, port, env=env, timeout=30)
    rule = ProbeRule(margin=0.15, max_probes=4, min_requests=4)
    load = probe_load(poisson_load(20, 20.0), rule)

    async def alive():
        return None if server.process.poll() is None else "the server exited"

    async def go():
        target = Target(server.url, await identify(server.url, engine="openai"), WORDS)
        return await measure_knee(
            target, load, SLO(ttft=1.0), rule, 1.0, alive=alive, progress=lambda _: server.stop()
        )

    try:
        return asyncio.run(go())
    finally:
        server.stop()


def test_a_probe_the_server_cut_short_is_neither_met_nor_missed(tmp_path):
    knee = _dies_during_its_second_probe()
    assert knee.status == "ended" and len(knee.probes) == 2
    cut = knee.probes[1]
    assert cut.failed == cut.sent  # every request of it failed: the server was gone
    assert knee.high is None  # not counted as "SLO missed"
    assert knee.estimate is None  # no measured knee from a search cut short
    flags = [FlagSet(16), FlagSet(32)]
    results = tuple(
        FlagSetResult(f, predicted=Predicted(rate, "found", SLO(ttft=1.0)), measured=knee)
        for f, rate in zip(flags, (knee.probes[0].rate, 2 * knee.probes[0].rate))
    )
    result = VerifyResult("w", SLO(ttft=1.0), ProbeRule(), results, "vllm")
    assert result.compared == () and result.same_order is None and result.best_verdict is None
    assert all(r.agreement is None and math.isnan(r.ratio) for r in results)
    path = tmp_path / "run.json"
    path.write_text(json.dumps(result.to_dict()))
    again = read_verify(str(path))
    assert again.compared == () and again.same_order is None  # --rank says the same


def test_two_lower_bounds_are_not_judged():
    from pytest_prefill.report.verify import knee_table
    from pytest_prefill.serve.load.records import BenchRun
    from pytest_prefill.verify.knee import MeasuredProbe
    from pytest_prefill.verify.knee_interval import KneeEstimate

    slo = SLO(ttft=1.0)
    probe = MeasuredProbe(1.0, 6.0, 0, 0, 0, None, BenchRun((), {}, {}, "now"))
    open_above = KneeEstimate(math.inf, 6.0, math.inf)
    knee = MeasuredKnee((probe,), probe, None, 0.05, None, open_above)
    assert knee.status == "never missed"
    result = FlagSetResult(
        FlagSet(16), predicted=Predicted(5.0, "never missed", slo), measured=knee
    )
    assert result.lower_bounds and result.agreement is None and math.isnan(result.ratio)
    table = knee_table(VerifyResult("w", slo, ProbeRule(), (result,), "vllm"))
    assert "both lower bounds" in table and "FAILS" not in table and "HOLDS" not in table
    bounded = FlagSetResult(FlagSet(16), predicted=Predicted(5.0, "found", slo), measured=knee)
    assert not bounded.lower_bounds and bounded.agreement is not None


def _plain_openai_server(posted: list[str]):
    """A server that names no engine (its /v1/models says nothing, it has no /version nor
    /props); each POST it gets (a request measured) is noted in ``posted``."""
    from hostile import json_response, models_ok

    async def handle(method, path, body, writer):
        if path == "/v1/models":
            await models_ok(writer)
        else:
            posted.append(path) if method == "POST" else None
            writer.write(json_response({"detail": "Not Found"}, 404))

    return handle


def test_verify_of_a_server_naming_no_engine_stops_before_measuring(tmp_path, capsys):
    import pytest
    from hostile import serving, write_words

    from pytest_prefill.cli import main
    from pytest_prefill.serve.calibration.server_model import PROFILED_ENGINES

    posted: list[str] = []
    with serving(_plain_openai_server(posted)) as url:
        argv = ["verify", "--url", str(url), "--flags", "tokens=16", "--slo", "ttft:1s"]
        argv += ["--tokenizer", write_words(tmp_path)]  # words for prompts: it would calibrate
        with pytest.raises(SystemExit) as exited:
            main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and posted == []  # nothing sent: no calibration, no probe
    assert "--engine" in err[-1] and all(e in err[-1] for e in PROFILED_ENGINES), err


def test_verify_refuses_an_engine_it_cannot_simulate(capsys):
    from cli_errors import usage_error

    argv = ["verify", "--url", "http://127.0.0.1:9", "--flags", "tokens=16", "--slo", "ttft:1s"]
    line = usage_error([*argv, "--engine", "openai"], capsys)
    assert "--engine" in line and "vllm" in line
