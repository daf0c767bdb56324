"""The timeline is drawn from the trace: every GPU-second is in a bar or in a "not shown" note,
nothing is double-booked, and the SVG is well-formed, legible and renders in Chromium."""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import subprocess
import tempfile
import xml.etree.ElementTree as ET
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_prefill.cli import build_parser, main
from pytest_prefill.commands.timeline import default_chunk
from pytest_prefill.plan.workloads import lab_scenario
from pytest_prefill.report.timeline import (
    COLOURS,
    Layout,
    coalesce,
    focus_window,
    layout,
    render_text,
)
from pytest_prefill.report.timeline_svg import CHAR_EM, render_svg
from pytest_prefill.sim import LINK, PRESETS, CostModel, Event, Request, Trace, simulate

pytestmark = pytest.mark.sim

SVG = "{http://www.w3.org/2000/svg}"
LAB = PRESETS["lab-laptop"].cost
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def lab_traces(cost: CostModel = LAB, prompt_len: int = 2048, arrival: float = 0.1) -> list[Trace]:
    load = lab_scenario(prompt_len=prompt_len, arrival=arrival)
    return [
        simulate("shared", load, cost),
        simulate("chunked", load, cost, chunk=default_chunk(cost, prompt_len)),
        simulate("disaggregated", load, cost),
    ]


@st.composite
def costs(draw: st.DrawFn) -> CostModel:
    return CostModel(
        prefill_pass_overhead=draw(st.floats(1e-4, 5e-2)),
        prefill_per_token=draw(st.floats(1e-6, 1e-4)),
        decode_step_base=draw(st.floats(1e-3, 5e-2)),
        decode_per_seq=draw(st.sampled_from([0.0, 1e-4])),
        decode_per_kv_token=draw(st.sampled_from([0.0, 1e-7])),
        kv_bytes_per_token=draw(st.sampled_from([0.0, 1.1e5])),
        link_bandwidth=draw(st.sampled_from([math.inf, 25e9])),
        link_latency=draw(st.sampled_from([0.0, 1e-3])),
    )


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    count = draw(st.integers(1, 6))
    load = [
        Request(
            f"r{i}",
            draw(st.sampled_from([0.0, 0.01, 0.1, 0.4])),
            draw(st.integers(1, 600)),
            draw(st.integers(1, 20)),
        )
        for i in range(count)
    ]
    policy = draw(st.sampled_from(["shared", "coscheduled", "chunked", "disaggregated"]))
    return simulate(policy, load, draw(costs()), chunk=draw(st.integers(1, 300)))


@st.composite
def windows(draw: st.DrawFn) -> tuple[float, float] | None:
    if draw(st.booleans()):
        return None
    start = draw(st.floats(0.0, 1.0))
    return start, start + draw(st.floats(1e-3, 1.0))


def steps(event_or_bar: Event, lo: float, hi: float) -> tuple[int, int]:
    """(iterations of an event wholly before ``lo``, those wholly at or after ``hi``)."""
    e = event_or_bar
    edges = [e.start + i * (e.end - e.start) / e.count for i in range(e.count)] + [e.end]
    before = sum(1 for i in range(e.count) if edges[i + 1] <= lo)
    after = sum(1 for i in range(e.count) if edges[i] >= hi)
    return before, after


def busy(lay: Layout, panel: int) -> tuple[float, int, int]:
    """Seconds and iterations of compute bars, and transfer bars, drawn in one panel."""
    rows = lay.panels[panel].rows
    bars = [b for r in rows if r.name != LINK for b in r.bars]
    transfers = sum(b.count for r in rows if r.name == LINK for b in r.bars)
    return sum(b.duration for b in bars), sum(b.count for b in bars), transfers


@SETTINGS
@given(trace=traces(), window=windows(), max_bars=st.none() | st.integers(1, 12))
def test_drawn_and_dropped_bars_account_for_every_gpu_second(trace, window, max_bars):
    lay = layout([trace], window, max_bars)
    seconds, iterations, transfers = busy(lay, 0)
    dropped = lay.panels[0].dropped
    total = trace.summary().gpu_seconds
    assert math.isclose(
        seconds + sum(d.gpu_seconds for d in dropped), total, rel_tol=1e-9, abs_tol=1e-12
    )
    assert iterations + sum(d.iterations for d in dropped) == sum(
        e.count for e in trace.events if e.resource != LINK
    )
    assert transfers + sum(d.transfers for d in dropped) == sum(
        1 for e in trace.events if e.resource == LINK
    )
    bars = [b for r in lay.panels[0].rows if r.name != LINK for b in r.bars]
    assert math.isclose(
        sum(b.iteration * b.count for b in bars), seconds, rel_tol=1e-9, abs_tol=1e-12
    )


def test_without_a_window_every_bar_is_drawn_and_nothing_is_noted():
    for trace in lab_traces():
        lay = layout([trace])
        assert lay.dropped == () and lay.panels[0].notes == ()
        assert math.isclose(busy(lay, 0)[0], trace.summary().gpu_seconds, rel_tol=1e-12)
        assert "not shown" not in render_svg([trace]) + render_text([trace])


@SETTINGS
@given(trace=traces(), window=windows(), max_bars=st.none() | st.integers(1, 12))
def test_no_resource_is_double_booked_in_what_is_drawn(trace, window, max_bars):
    lay = layout([trace], window, max_bars)
    for row in lay.panels[0].rows:
        assert all(b.end > lay.start and b.start < lay.end for b in row.bars)
        for a, b in zip(row.bars, row.bars[1:]):  # noqa: B905
            assert b.start >= a.end - 1e-12 * max(1.0, a.end)
    assert len([b for r in lay.panels[0].rows for b in r.bars]) <= (max_bars or math.inf)


def expand(trace: Trace) -> Trace:
    """The trace with every coalesced event split into its single iterations."""
    return Trace(trace.policy, tuple(trace.steps()), trace.requests, trace.chunk)


@SETTINGS
@given(trace=traces())
def test_coalescing_keeps_total_time_and_iteration_count(trace):
    for source in (trace, expand(trace)):
        bars = coalesce(source.events)
        assert math.isclose(
            sum(b.duration for b in bars),
            sum(e.duration for e in trace.events),
            rel_tol=1e-9,
            abs_tol=1e-12,
        )
        assert sum(b.count for b in bars) == sum(e.count for e in trace.events)
        assert len(bars) <= len(trace.events)
        for b in bars:
            if b.count > 1:
                assert b.kind == "decode" and f"×{b.count:,}" in b.labels[-1]


def test_coalesced_bars_say_how_many_iterations_they_hold():
    shared = lab_traces()[0]
    long_decode = max(coalesce(shared.events), key=lambda b: b.count)
    assert long_decode.count > 1
    assert f"×{long_decode.count}" in render_svg([shared])


@SETTINGS
@given(trace=traces(), window=windows())
def test_truncation_is_labelled_whenever_something_is_dropped_and_only_then(trace, window):
    lo, hi = window or (0.0, math.inf)
    before = sum(steps(e, lo, hi)[0] for e in trace.events)
    after = sum(steps(e, lo, hi)[1] for e in trace.events)
    lay = layout([trace], window)
    sides = {d.side: d.iterations + d.transfers for d in lay.panels[0].dropped}
    assert sides.get("before", 0) == before and sides.get("after", 0) == after
    anything = bool(before or after)
    svg, text = render_svg([trace], window=window), render_text([trace], window=window)
    assert ("not shown" in svg) == anything and ("not shown" in text) == anything


def test_a_bar_limit_is_labelled_and_hatched():
    traces_ = lab_traces()
    lay = layout(traces_, None, 3)
    for panel in lay.panels:
        assert sum(len(r.bars) for r in panel.rows) <= 3
        assert [d.reason for d in panel.dropped] == ["3"]
        assert panel.shown_until < lay.end
        assert all(t <= panel.shown_until for tr in panel.tokens for t in tr.ticks)
    svg = render_svg(traces_, max_bars=3)
    assert "bar limit 3" in svg and 'fill="url(#hidden)"' in svg


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("prompt_len", [1, 777, 2048, 8192])
def test_the_shared_row_holds_one_continuous_prefill_pass_of_the_prompt(preset, prompt_len):
    cost = PRESETS[preset].cost
    traces_ = lab_traces(cost, prompt_len)
    shared = layout(traces_, focus_window(traces_, "long")).panels[0]
    (worker,) = shared.rows
    passes = [b for b in worker.bars if b.kind != "decode" and "long" in b.request_ids]
    assert len(passes) == 1
    (bar,) = passes
    assert bar.kind == "prefill" and bar.count == 1 and bar.request_ids == ("long",)
    assert math.isclose(bar.duration, cost.prefill_pass(prompt_len), rel_tol=1e-12)


def test_the_shared_workers_stall_is_a_gap_in_the_live_streams_ticks():
    traces_ = lab_traces()
    lay = layout(traces_, focus_window(traces_, "long"))
    prefill = next(
        b for b in lay.panels[0].rows[0].bars if b.kind == "prefill" and "long" in b.request_ids
    )
    for row in lay.panels[0].tokens:
        if row.request.startswith("live"):
            assert any(a <= prefill.start and b >= prefill.end for a, b in row.stalls)
            assert not any(prefill.start < t < prefill.end for t in row.ticks)
    for panel in lay.panels[1:]:  # chunking and disaggregation keep the cadence
        assert all(not row.stalls for row in panel.tokens if row.request.startswith("live"))


def test_the_default_window_shows_the_prompt_from_arrival_to_first_token_everywhere():
    traces_ = lab_traces()
    start, end = focus_window(traces_, "long")
    for trace in traces_:
        record = trace.requests["long"]
        assert start <= record.arrival and record.first_token < end
    assert end < max(t.summary().makespan for t in traces_) / 2


def test_the_svg_parses_as_xml_and_names_every_policy_and_resource():
    traces_ = lab_traces()
    root = ET.fromstring(render_svg(traces_, window=focus_window(traces_, "long"), title="t"))
    assert root.tag == f"{SVG}svg"
    texts = " ".join("".join(t.itertext()) for t in root.iter(f"{SVG}text"))
    for word in (
        "shared",
        "chunked",
        "disaggregated",
        "worker",
        "prefill0",
        "KV link",
        "decode0",
        "live0 tokens",
        "stall",
        "TTFT",
        "not shown",
        "ms",
    ):
        assert word in texts
    fills = {r.get("fill") for r in root.iter(f"{SVG}rect")}
    assert set(COLOURS.values()) <= fills


def text_boxes(svg: str) -> list[tuple[float, float, float, float, str]]:
    """(left, right, top, bottom, text) of each text element, at the widths the renderer assumes."""
    boxes = []
    for t in ET.fromstring(svg).iter(f"{SVG}text"):
        size, text = float(t.get("font-size")), "".join(t.itertext())
        x, y, w = float(t.get("x")), float(t.get("y")), len(text) * size * CHAR_EM
        left = {"start": x, "middle": x - w / 2, "end": x - w}[t.get("text-anchor")]
        boxes.append((left, left + w, y - 0.8 * size, y + 0.2 * size, text))
    return boxes


def assert_no_overlap(svg: str) -> None:
    boxes = text_boxes(svg)
    root = ET.fromstring(svg)
    width = float(root.get("width"))
    for i, a in enumerate(boxes):
        assert 0 <= a[0] and a[1] <= width, f"{a[4]!r} runs off the picture"
        for b in boxes[i + 1 :]:
            overlap = a[0] < b[1] and b[0] < a[1] and a[2] < b[3] and b[2] < a[3]
            assert not overlap, f"{a[4]!r} overlaps {b[4]!r}"


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_labels_do_not_overlap_in_the_default_picture(preset):
    traces_ = lab_traces(PRESETS[preset].cost)
    for window in (focus_window(traces_, "long"), None):
        assert_no_overlap(render_svg(traces_, window=window, title="a title\nsecond line"))


@SETTINGS
@given(trace=traces(), window=windows(), max_bars=st.none() | st.integers(1, 12))
def test_labels_do_not_overlap_for_random_loads(trace, window, max_bars):
    assert_no_overlap(render_svg([trace, trace], window=window, max_bars=max_bars))


def test_text_rendering_fits_its_width_and_shows_the_stall():
    traces_ = lab_traces()
    text = render_text(traces_, width=80, window=focus_window(traces_, "long"))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    live0 = next(line for line in lines if line.startswith("live0 tokens"))
    assert "-" in live0 and "^" in live0
    for label in ("worker", "prefill0", "KV link", "decode0"):
        assert any(line.startswith(label) for line in lines)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"window": (1.0, 1.0)}, "window"),
        ({"window": (-1.0, 1.0)}, "window"),
        ({"window": (2.0, 1.0)}, "window"),
        ({"window": (0.0, math.inf)}, "window"),
        ({"window": (math.nan, 1.0)}, "window"),
        ({"window": "0:1"}, "window"),
        ({"window": (0.0, 1.0, 2.0)}, "window"),
        ({"max_bars": 0}, "max_bars"),
        ({"max_bars": -3}, "max_bars"),
        ({"max_bars": True}, "max_bars"),
        ({"max_bars": 2.5}, "max_bars"),
    ],
)
def test_bad_arguments_raise_value_errors_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name):
        render_svg(lab_traces()[:1], **kwargs)
    with pytest.raises(ValueError, match=name):
        render_text(lab_traces()[:1], **kwargs)


@pytest.mark.parametrize("bad", [[], (), None, "shared", 3])
def test_traces_must_be_a_non_empty_sequence_of_traces(bad):
    with pytest.raises(ValueError, match="traces"):
        render_svg(bad)
    with pytest.raises(ValueError, match="traces"):
        render_svg(lab_traces()[0])  # a Trace, not a list of them
    with pytest.raises(ValueError, match="width"):
        render_text(lab_traces()[:1], width=10)


def test_the_command_writes_the_svg_and_says_what_it_left_out(tmp_path, capsys):
    out = tmp_path / "t.svg"
    assert main(["timeline", "--out", str(out), "--text", "--width", "90"]) == 0
    printed = capsys.readouterr().out
    ET.fromstring(out.read_text(encoding="utf-8"))
    assert f"wrote {out}" in printed and "not shown" in printed and "live0 tokens" in printed
    assert main(["timeline", "--out", str(out), "--until", "20", "--chunk", "256"]) == 0
    assert "nothing left out" in capsys.readouterr().out
    assert "chunk 256" in out.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "argv",
    [
        ["--window", "2:1"],
        ["--window", "1"],
        ["--until", "0"],
        ["--chunk", "0"],
        ["--window", "0:1", "--until", "2"],
        ["--text", "--width", "30"],
        ["--cost", "no-such-preset"],
        [],
    ],
)
def test_the_command_refuses_bad_options(argv, tmp_path, capsys):
    out = ["--out", str(tmp_path / "t.svg")] if argv else []
    with pytest.raises(SystemExit) as exit_info:
        main(["timeline", *out, *argv])
    assert exit_info.value.code == 2
    printed = capsys.readouterr()
    assert "error" in printed.err and printed.out == ""
    assert not (tmp_path / "t.svg").exists()


def png_rows(path: str, rows: int) -> tuple[int, int, list[bytes]]:
    """Width, height and the first ``rows`` RGB(A) scanlines of a non-interlaced 8-bit PNG."""
    with open(path, "rb") as handle:
        data = handle.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height, depth, colour = struct.unpack(">IIBB", data[16:26])
    assert depth == 8 and colour in (2, 6)
    channels = 3 if colour == 2 else 4
    idat, pos = b"", 8
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    raw, stride, out, prev = zlib.decompress(idat), width * channels, [], bytes(width * channels)
    for y in range(min(rows, height)):
        kind, line = (
            raw[y * (stride + 1)],
            bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)]),
        )
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 255
            elif kind == 2:
                line[i] = (line[i] + b) & 255
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out.append(bytes(line))
        prev = line
    return width, height, [bytes(r[i : i + 3]) for r in out for i in range(0, stride, channels)]


@pytest.mark.skipif(
    shutil.which("chromium") is None,
    reason="chromium is not installed (Debian: apt-get install chromium)",
)
def test_chromium_renders_the_default_timeline(tmp_path):
    svg = tmp_path / "t.svg"
    assert main(["timeline", "--out", str(svg)]) == 0
    png = tmp_path / "t.png"
    profile = tempfile.mkdtemp(dir=tmp_path)
    subprocess.run(
        [
            "chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            f"--user-data-dir={profile}",
            f"--screenshot={png}",
            "--window-size=1400,900",
            svg.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    width, height, pixels = png_rows(str(png), 300)  # the first panel is in the top 300 rows
    assert (width, height) == (1400, 900)
    seen = set(pixels)

    def near(hex_colour: str) -> bool:
        target = bytes.fromhex(hex_colour[1:])
        return any(all(abs(p[i] - target[i]) <= 8 for i in range(3)) for p in seen)

    assert near(COLOURS["prefill"]) and near(COLOURS["decode"])  # the shared worker's bars
    assert len(seen) > 20


@SETTINGS
@given(
    trace=traces(),
    window=windows(),
    max_bars=st.none() | st.integers(1, 12),
    width=st.integers(40, 160),
)
def test_every_text_line_fits_the_width(trace, window, max_bars, width):
    text = render_text([trace], width=width, window=window, max_bars=max_bars)
    assert max(len(line) for line in text.splitlines()) <= width


def test_the_command_takes_a_calibration_json_as_cost(tmp_path, capsys):
    cost = PRESETS["datacenter-illustrative"].cost
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps({"cost_model": cost.to_dict()}), encoding="utf-8")
    out = tmp_path / "t.svg"
    assert main(["timeline", "--out", str(out), "--cost", str(path)]) == 0
    svg = out.read_text(encoding="utf-8")
    assert f"chunk {default_chunk(cost, 2048):,} tokens" in svg and str(path) in svg


def test_the_command_accepts_the_measuring_flags():
    args = build_parser().parse_args(
        ["timeline", "--cost", "measure", "--model", "tiny", "--dry-run", "--out", "t.svg"]
    )
    assert (args.cost, args.model, args.dry_run) == ("measure", "tiny", True)
