"""The capacity search for a person: the table, the SVG plot, the JSON document, and
``prefill-bench capacity`` end to end."""

from __future__ import annotations

import importlib.util
import json
import math
import xml.etree.ElementTree as ET

import pytest

from pytest_prefill.cli import main
from pytest_prefill.plan.capacity import capacity
from pytest_prefill.plan.deployments import Deployment
from pytest_prefill.plan.executors import InlineExecutor
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.plan.question import ServingQuestion
from pytest_prefill.plan.sizing import devices_needed
from pytest_prefill.plan.workloads import poisson
from pytest_prefill.report.capacity import (
    HEADERS,
    SCHEMA,
    capacity_document,
    capacity_svg,
    capacity_table,
    capacity_text,
    devices_needed_line,
    headroom_line,
)
from pytest_prefill.sim import PRESETS

pytestmark = pytest.mark.sim

SVG = "{http://www.w3.org/2000/svg}"
COST = PRESETS["datacenter-illustrative"].cost
SLO_TIGHT = SLO.parse("ttft:200ms,tpot:50ms")


@pytest.fixture(scope="module")
def result():
    load = poisson(
        20.0,
        60,
        prompt_len=lambda rng: rng.randint(64, 3000),
        output_len=lambda rng: rng.randint(1, 60),
    )
    deployments = [Deployment("shared", 1), Deployment("chunked", 1, chunk=450)]
    return capacity(
        ServingQuestion(load, COST, SLO_TIGHT, executor=InlineExecutor()),
        1,
        deployments=deployments,
    )


def test_the_table_has_one_row_per_deployment_best_first(result):
    lines = capacity_table(result).splitlines()
    assert all(h in lines[0] for h in HEADERS[:3])
    body = lines[2:]
    assert len(body) == len(result.results)
    assert body[0].startswith(result.ranked()[0].deployment.label)
    best = result.ranked()[0]
    assert f"{best.max_rate:,.3g}" in body[0]


@pytest.mark.parametrize("target", [0.99, 0.95])
def test_the_latency_columns_follow_the_target(target):
    load = poisson(20.0, 40, prompt_len=lambda rng: rng.randint(64, 3000), output_len=20)
    found = capacity(
        ServingQuestion(load, COST, SLO_TIGHT, target=target, executor=InlineExecutor()),
        1,
        deployments=[Deployment("shared", 1)],
    )
    p = round(100 * target)
    header, _, row = capacity_table(found).splitlines()[:3]
    assert f"TTFT p{p} ms" in header and f"TPOT p{p} ms" in header and "p90" not in header
    best = found.ranked()[0].best
    assert best is not None
    assert f"{best.metrics.ttft.percentile(p) * 1e3:,.1f}" in row
    assert f"{best.metrics.tpot.percentile(p) * 1e3:,.1f}" in row


def test_the_text_says_where_numbers_come_from_and_what_to_do(result):
    text = capacity_text(result, "preset 'datacenter-illustrative'")
    assert text.startswith("Cost model: preset 'datacenter-illustrative'")
    assert "Simulated from the cost model, not measured." in text
    assert f"-> {result.recommendation()}" in text


def test_the_plot_is_svg_with_a_line_and_a_mark_per_probe(result):
    root = ET.fromstring(capacity_svg(result))
    assert root.tag == f"{SVG}svg"
    assert len(root.findall(f"{SVG}polyline")) == len(result.results)
    probes = [
        e
        for e in root.iter()
        if "probe" in (e.get("class") or "") and e.find(f"{SVG}title") is not None
    ]
    assert len(probes) == result.simulations
    texts = " ".join(t.text or "" for t in root.iter(f"{SVG}text"))
    assert "target 90%" in texts
    for r in result.results:
        assert r.deployment.label in texts


def test_the_plot_zooms_to_the_decision_band_and_marks_the_workloads_rate(result):
    from pytest_prefill.report.capacity import attainment_floor

    root = ET.fromstring(capacity_svg(result))
    floor = attainment_floor(result.target)
    assert 0 < floor < result.target  # 60% for a 90% target: the band, not 0-100%
    labels = {t.text for t in root.iter(f"{SVG}text")}
    assert f"≤{floor:.0%}" in labels and "0%" not in labels and "100%" in labels
    (mark,) = [t for t in root.iter(f"{SVG}text") if (t.text or "").startswith("this workload")]
    assert f"{result.base_rate:.3g} req/s" in mark.text
    # every probe lies within the plot: those below the floor on its bottom edge
    frame = root.findall(f"{SVG}rect")[1]
    bottom = float(frame.get("y")) + float(frame.get("height"))
    ys = [
        float(c.get("cy")) for c in root.iter(f"{SVG}circle") if c.find(f"{SVG}title") is not None
    ]
    assert max(ys) <= bottom + 1e-6
    lowest = min(p.attainment for r in result.results for p in r.probes)
    if lowest < floor:
        assert max(ys) == pytest.approx(bottom, abs=0.1)


@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="no matplotlib")
def test_the_plot_and_the_timeline_are_written_as_png(tmp_path, capsys):
    import struct

    timeline = tmp_path / "t.png"
    assert main(["timeline", "--out", str(timeline)]) == 0
    header = timeline.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    svg = tmp_path / "t.svg"
    assert main(["timeline", "--out", str(svg)]) == 0
    root = ET.fromstring(svg.read_text())
    assert struct.unpack(">II", header[16:24]) == (int(root.get("width")), int(root.get("height")))
    plot = tmp_path / "c.png"
    argv = ["capacity", "--workload", "poisson", "--num-prompts", "20", "--devices", "1"]
    argv += ["--slo", "ttft:2s,tpot:200ms", "--no-devices-needed", "--workers", "1"]
    assert main([*argv, "--deployment", "chunked", "--plot", str(plot)]) == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_png_without_matplotlib_is_one_line_saying_what_to_install(tmp_path, monkeypatch, capsys):
    import importlib.util as util

    real = util.find_spec
    monkeypatch.setattr(
        util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a)
    )
    with pytest.raises(SystemExit) as exit_:
        main(["timeline", "--out", str(tmp_path / "t.png")])
    assert exit_.value.code == 2
    assert 'pip install ".[plot]"' in capsys.readouterr().err
    assert not (tmp_path / "t.png").exists()


def test_the_document_is_strict_json_with_every_probe(result):
    document = capacity_document(result, "somewhere")
    text = json.dumps(document, allow_nan=False)
    back = json.loads(text)
    assert back["kind"] == SCHEMA and back["cost_source"] == "somewhere"
    assert sum(len(r["probes"]) for r in back["results"]) == result.simulations
    probes = [p for r in back["results"] for p in r["probes"]]
    first = next(p["metrics"] for p in probes if p["metrics"] is not None)  # None: it stopped
    assert "p90_ttft_ms" in first and "request_goodput" in first


def test_headroom_is_the_best_rate_over_the_workloads_own(result):
    best = result.ranked()[0]
    assert result.headroom == best.max_rate / result.base_rate
    line = headroom_line(result)
    assert f"{result.base_rate:,.3g} req/s" in line and best.deployment.label in line
    assert f"{result.headroom:,.3g}× this traffic" in line
    assert headroom_line(result) in capacity_text(result, "x")


def test_headroom_below_one_says_how_far_short_the_devices_fall():
    load = poisson(400.0, 60, prompt_len=3000, output_len=4)  # 12 s of prefill a second
    result = capacity(ServingQuestion(load, COST, SLO.parse("ttft:1s"), executor=InlineExecutor()), 1, deployments=[Deployment("shared", 1)])  # fmt: skip
    assert 0 < result.headroom < 1
    assert f"{1 / result.headroom:,.3g}× what the best" in headroom_line(result)


def test_the_devices_line_names_the_count_and_the_count_below(result):
    shared = lambda n: [Deployment("shared", n)]  # noqa: E731
    load = poisson(150.0, 150, prompt_len=1024, output_len=16, seed=3)
    needed = devices_needed(
        ServingQuestion(load, COST, SLO.parse("ttft:1s"), executor=InlineExecutor()), shared
    )
    assert needed.devices is not None and needed.devices > 1
    line = devices_needed_line(needed)
    assert line.startswith(f"Devices this traffic needs: {needed.devices} (shared ×")
    assert f"on {needed.devices - 1} device" in line
    document = capacity_document(result, "x", needed)
    assert json.loads(json.dumps(document, allow_nan=False))["devices_needed"]["devices"] == (
        needed.devices
    )
    beyond = devices_needed(
        ServingQuestion(load, COST, SLO.parse("ttft:15ms"), executor=InlineExecutor()),
        shared,
        max_devices=3,
    )  # reachable alone (11.2 ms of prefill), never with a decode step before the first token
    assert "more than 3 (the search's bound, --max-devices)" in devices_needed_line(beyond)


def run_cli(args, capsys):
    code = main(["capacity", "--cost", "datacenter-illustrative", *args])
    return code, capsys.readouterr()


def test_the_command_prints_the_table_the_recommendation_and_writes_plot_and_json(tmp_path, capsys):
    plot, out = tmp_path / "c.svg", tmp_path / "c.json"
    code, captured = run_cli(
        [
            "--workload", "poisson", "--request-rate", "20", "--num-prompts", "60",
            "--slo", "ttft:200ms,tpot:50ms", "--deployment", "shared",
            "--deployment", "chunked:450", "--workers", "1",
            "--plot", str(plot), "--json", str(out),
        ],
        capsys,
    )  # fmt: skip
    assert code == 0
    assert "deployment" in captured.out and "-> " in captured.out
    assert "shared ×1: " in captured.err  # progress, one line per deployment, on stderr
    assert "Headroom: " in captured.out and "Devices this traffic needs: " in captured.out
    assert "devices needed: 1: " in captured.err
    ET.parse(plot)
    document = json.loads(out.read_text())
    assert document["slo"] == {"ttft": 0.2, "tpot": 0.05}
    assert document["devices_needed"]["checks"][0]["devices"] == 1


def test_the_command_skips_the_devices_search_when_told(capsys):
    code, captured = run_cli(
        [
            "--workload", "poisson", "--request-rate", "20", "--num-prompts", "30",
            "--slo", "ttft:1s", "--deployment", "shared", "--workers", "1",
            "--no-devices-needed",
        ],
        capsys,
    )  # fmt: skip
    assert code == 0 and "Devices this traffic needs" not in captured.out


def test_the_command_says_how_many_prompts_it_capped(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": i * 100, "input_length": 500 * (i + 1), "output_length": 5} for i in range(8)
    ]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, captured = run_cli(
        [
            "--workload", str(trace), "--max-model-len", "2000", "--slo", "ttft:1s",
            "--deployment", "shared", "--workers", "1",
        ],
        capsys,
    )  # fmt: skip
    assert code == 0 and "4 prompt(s) longer than 2,000 tokens" in captured.out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--slo", "ttft:fast"], "not a duration"),
        (["--slo", "latency:1s"], "is not one of ttft, tpot, e2el"),
        (["--slo", "ttft:1s", "--devices", "0"], "must be a positive integer"),
        (["--slo", "ttft:1s", "--target", "1.5"], "must be in (0, 1]"),
        (["--slo", "ttft:1s", "--target", "0"], "must be a positive number"),
        (["--slo", "ttft:1s", "--deployment", "fastest"], "unknown deployment 'fastest'"),
        (["--slo", "ttft:1s", "--workload", "nothing-here"], "is not one of lab, poisson"),
        (["--slo", "ttft:1s", "--window", "5:2"], "START:END"),
        (["--slo", "ttft:1s", "--window", "0:1e9", "--workload", "poisson",
          "--num-prompts", "3", "--window", "1e6:"], "has no request"),
        (["--slo", "ttft:1s", "--plot", "out.gif"], "must name an .svg or a .png"),
        (["--slo", "ttft:1s", "--cluster", "tcp://127.0.0.1:1", "--workers", "2"], "--workers"),
        (["--slo", "ttft:1s", "--devices", "8", "--max-devices", "4"], "at least --devices"),
        (["--slo", "ttft:1s", "--max-devices", "2000"], "at most 1,024 devices"),
        ([], "--slo"),
    ],
)  # fmt: skip
def test_bad_command_input_is_a_usage_error(capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        run_cli(["--num-prompts", "10", *args], capsys)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err


@pytest.mark.skipif(
    importlib.util.find_spec("distributed") is None,
    reason="needs Dask's distributed (the cluster extra; .ci/run installs it for these tests)",
)
def test_an_unanswering_cluster_is_a_usage_error_within_seconds(capsys):
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    began = time.perf_counter()
    with pytest.raises(SystemExit):
        run_cli(
            ["--slo", "ttft:1s", "--num-prompts", "10", "--cluster", f"tcp://127.0.0.1:{port}"],
            capsys,
        )
    assert "no Dask scheduler answered" in capsys.readouterr().err
    assert time.perf_counter() - began < 15


def test_a_deployment_that_never_meets_the_slo_has_a_row_without_latencies():
    # a deployment that never meets the SLO has no latencies to print
    load = poisson(50.0, 20, prompt_len=3000, output_len=4)
    result = capacity(ServingQuestion(load, COST, SLO.parse("ttft:1us"), executor=InlineExecutor()), 1, deployments=[Deployment("shared", 1)])  # fmt: skip
    table = capacity_table(result)
    assert "none" in table and not math.isnan(result.results[0].max_rate)


def test_simulate_takes_a_workload_and_reports_vllms_metrics(tmp_path, capsys):
    out = tmp_path / "s.json"
    code = main(
        [
            "simulate", "--cost", "datacenter-illustrative", "--workload", "poisson",
            "--request-rate", "30", "--num-prompts", "40", "--slo", "ttft:500ms",
            "--chunk", "512", "--json", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    text = capsys.readouterr().out
    assert "Serving metrics (vLLM's definitions" in text and "goodput req/s" in text
    assert "poisson (40 requests at 30 req/s" in text
    document = json.loads(out.read_text())
    assert document["scenario"]["requests"] == 40 and document["slo"] == {"ttft": 0.5}
    for row in document["rows"]:
        assert row["serving_metrics"]["completed"] == 40
        assert 0 <= row["serving_metrics"]["attainment"] <= 1
        assert row["ttft_p99"] is not None  # the sweep's own keys stay as they are


def test_simulate_still_runs_the_lab_scenario_by_default(capsys):
    assert main(["simulate"]) == 0
    text = capsys.readouterr().out
    assert "Scenario: 2 live streams decoding" in text and "Serving metrics" in text


def test_simulate_refuses_workload_flags_the_lab_does_not_take(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--request-rate", "5"])
    assert "the lab workload is fixed; it takes no request_rate" in capsys.readouterr().err


def test_a_rise_in_attainment_is_printed_as_a_rise():
    """Issue 50 item 12: "rises from 100.0% at 8.09 req/s to 100.0% at 8.82 req/s"."""
    from hypothesis import given
    from hypothesis import strategies as st

    from pytest_prefill.plan.capacity import distinct_percentages

    @given(st.floats(0, 1), st.floats(1e-7, 1))
    def check(a, rise):
        b = min(1.0, a + rise)
        if b - a < 1e-7:
            return
        low, high = distinct_percentages(a, b)
        assert low != high
        assert float(low.rstrip("%")) <= float(high.rstrip("%"))
        assert abs(float(low.rstrip("%")) / 100 - a) <= 0.0005 + 1e-12

    check()
    assert distinct_percentages(0.9996, 0.9998) == ("99.96%", "99.98%")


def test_a_count_the_model_does_not_fit_is_said_so_not_0_percent():
    """Issue 50 item 13: "on 3 devices the best reaches 0.0%" where the model does not fit."""
    from pytest_prefill.plan.sizing import DeviceCount, DevicesNeeded

    fits = Deployment("shared", 4)
    needed = DevicesNeeded(
        4,
        8,
        2.0,
        0.9,
        SLO_TIGHT,
        (DeviceCount(4, fits, 0.95, True, 1, 0.1), DeviceCount(3, None, 0.0, False, 0, 0.0)),
    )
    line = devices_needed_line(needed)
    assert "on 3 devices no deployment fits" in line and "0.0%" not in line
