"""The capacity picture at a high target (issue 50 item 2): a readable attainment axis, no two
deployments drawn alike, the legend inside the picture, the workload's rate label clear of the
target line, and a legend for the marker kinds."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_prefill.plan.capacity import capacity
from pytest_prefill.plan.deployments import Deployment
from pytest_prefill.plan.executors import InlineExecutor
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.plan.question import ServingQuestion
from pytest_prefill.plan.workloads import poisson
from pytest_prefill.report.capacity_plot import (
    CHAR_WIDTH,
    MARKER_KINDS,
    AttainmentAxis,
    capacity_svg,
    marker_kind,
    series_style,
)
from pytest_prefill.sim import PRESETS

pytestmark = pytest.mark.sim

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def many():
    """Twelve deployments at a 99% target: more than the palette's ten colours."""
    load = poisson(20.0, 60, prompt_len=lambda rng: rng.randint(64, 3000), output_len=20)
    deployments = [Deployment("chunked", 1, chunk=c) for c in range(128, 128 * 13, 128)]
    return capacity(
        ServingQuestion(
            load,
            PRESETS["datacenter-illustrative"].cost,
            SLO.parse("ttft:300ms,tpot:50ms"),
            target=0.99,
            executor=InlineExecutor(),
        ),
        1,
        deployments=deployments,
    )


@pytest.mark.parametrize("target", [0.96, 0.99, 0.995, 0.999])
def test_a_high_target_sits_mid_axis_with_room_above_and_below(target):
    """At 99% every curve was squashed into the top 1% of a 60-100% axis."""
    axis = AttainmentAxis(target)
    assert 0.3 <= axis.position(target) <= 0.8
    ticks = axis.ticks()
    assert len({axis.label(t) for t in ticks}) == len(ticks)  # no two ticks read alike
    above = [t for t in ticks if t > target]
    assert above and axis.position(above[0]) - axis.position(target) > 0.05


@given(st.sampled_from([0.5, 0.9, 0.95, 0.99, 0.999]), st.floats(0, 1), st.floats(0, 1))
def test_the_axis_keeps_order_and_its_edges(target, a, b):
    axis = AttainmentAxis(target)
    low, high = sorted((a, b))
    assert 0 <= axis.position(low) <= axis.position(high) <= 1
    assert axis.position(1.0) == 1 and axis.position(0.0) == 0


def test_thirty_deployments_are_drawn_thirty_ways():
    assert len({series_style(i) for i in range(30)}) == 30


def test_twelve_deployments_fit_the_picture_each_its_own_style(many):
    root = ET.fromstring(capacity_svg(many))
    width, height = float(root.get("width")), float(root.get("height"))
    lines = root.findall(f"{SVG}polyline")
    assert len(lines) == len(many.results) == 12
    assert len({(p.get("stroke"), p.get("stroke-dasharray")) for p in lines}) == 12
    for text in root.iter(f"{SVG}text"):
        if text.get("transform"):  # the rotated axis title
            continue
        words, x = text.text or "", float(text.get("x"))
        right = {"start": x + CHAR_WIDTH * len(words), "middle": x + CHAR_WIDTH * len(words) / 2}
        assert right.get(text.get("text-anchor"), x) <= width, words
        assert float(text.get("y")) <= height, words


def test_the_workloads_rate_label_is_clear_of_the_target_line(many):
    root = ET.fromstring(capacity_svg(many))
    (label,) = [t for t in root.iter(f"{SVG}text") if (t.text or "").startswith("this workload")]
    dashed = [ln for ln in root.iter(f"{SVG}line") if ln.get("stroke-dasharray") == "6 4"]
    (target,) = [ln for ln in dashed if ln.get("y1") == ln.get("y2")]
    frame = root.findall(f"{SVG}rect")[1]
    assert float(label.get("y")) < float(frame.get("y"))  # above the box
    assert abs(float(label.get("y")) - float(target.get("y1"))) > 10


def test_every_marker_kind_drawn_is_in_the_legend(many):
    root = ET.fromstring(capacity_svg(many))
    marks = [e for e in root.iter() if "probe" in (e.get("class") or "")]
    drawn = [e for e in marks if e.find(f"{SVG}title") is not None]
    legend = {e.get("class").split()[1] for e in marks if e.find(f"{SVG}title") is None}
    assert legend == {kind for kind, _ in MARKER_KINDS}
    assert len(drawn) == many.simulations
    kinds = {marker_kind(r, p) for r in many.results for p in r.probes}
    assert {e.get("class").split()[1] for e in drawn} == kinds
    texts = {t.text for t in root.iter(f"{SVG}text")}
    assert all(words in texts for _, words in MARKER_KINDS)
    # a probe stopped once decided is drawn as a bound (a triangle), never as "just met"
    for r in many.results:
        for p in r.probes:
            if p.stopped is not None and p is not r.best:
                assert marker_kind(r, p).startswith("stopped")
