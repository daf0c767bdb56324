"""The Chrome trace-event export (what ``timeline --out FILE.json`` writes for Perfetto) holds
exactly the simulated trace: every iteration once, every token once, at the trace's times."""

from __future__ import annotations

import json

import pytest

from pytest_prefill.cli import main
from pytest_prefill.plan.sweep import lab_timeline
from pytest_prefill.report.trace_events import chrome_trace
from pytest_prefill.sim import PRESETS

pytestmark = pytest.mark.sim


def test_every_iteration_and_every_token_appears_once_at_its_time():
    drawn = lab_timeline(PRESETS["lab-laptop"].cost, "preset")
    document = json.loads(json.dumps(chrome_trace(drawn.traces, drawn.title), allow_nan=False))
    events = document["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(names.values()) == sorted(
        [t.policy if t.chunk is None else f"{t.policy} (chunk {t.chunk})" for t in drawn.traces]
    )
    for pid, trace in enumerate(drawn.traces, 1):
        spans = [e for e in events if e["pid"] == pid and e["ph"] == "X"]
        assert len(spans) == len(trace.events)
        for span, event in zip(spans, trace.events):
            assert span["ts"] == pytest.approx(event.start * 1e6)
            assert span["dur"] == pytest.approx((event.end - event.start) * 1e6)
            assert span["cat"] == event.kind and span["args"]["count"] == event.count
        tokens = [e for e in events if e["pid"] == pid and e.get("cat") == "token"]
        assert len(tokens) == sum(r.output_len for r in trace.requests.values())


def test_an_empty_or_foreign_trace_list_is_refused():
    with pytest.raises(ValueError, match="traces"):
        chrome_trace([])
    with pytest.raises(ValueError, match="traces"):
        chrome_trace(["shared"])  # type: ignore[list-item]


def test_the_command_writes_json_for_json_and_svg_for_svg(tmp_path, capsys):
    as_json, as_svg = tmp_path / "t.json", tmp_path / "t.svg"
    assert main(["timeline", "--out", str(as_json)]) == 0
    assert main(["timeline", "--out", str(as_svg)]) == 0
    assert "traceEvents" in json.loads(as_json.read_text())
    assert as_svg.read_text().lstrip().startswith(("<svg", "<?xml"))
    assert "perfetto" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["t.gif", "t.svgz", "t", "t.json.txt"])
def test_any_other_extension_is_a_usage_error_that_names_the_allowed_ones(name, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["timeline", "--out", str(tmp_path / name)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--out" in err and ".svg" in err and ".json" in err
    assert list(tmp_path.iterdir()) == []
