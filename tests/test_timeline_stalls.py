"""The timeline's stalls (issue 50 item 7): the shading marks a gap that stands out from the
request's own gaps around it, not decode that is slower for a while once a long KV joins, and
the row's stall figure is the longest gap so shaded."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_prefill.plan.workloads import lab_scenario
from pytest_prefill.report.timeline import (
    STALL_FACTOR,
    STALL_WINDOW,
    layout,
    stall_words,
    stalls,
)
from pytest_prefill.sim import PRESETS, simulate
from pytest_prefill.units import ms

pytestmark = pytest.mark.sim

LAB = PRESETS["lab-laptop"].cost
# a 2,048-token KV in the batch makes each decode step 1.7x as long: slower, not stalled
SLOW_KV = dataclasses.replace(LAB, decode_per_kv_token=LAB.decode_step_base * 0.7 / 2048)


def times_of(gaps: list[float]) -> list[float]:
    out = [0.0]
    for gap in gaps:
        out.append(out[-1] + gap)
    return out


@given(st.floats(0.001, 1.0), st.integers(1, 30), st.floats(1.0, 10.0), st.integers(0, 30))
def test_a_step_to_slower_decode_is_no_stall_and_a_spike_is_one(base, before, slower, extra):
    """Slower for longer than half the window: no stall, however much slower."""
    after = STALL_WINDOW + 1 + extra
    steady = times_of([base] * before + [base * slower] * after)
    assert stalls(steady) == []
    spiked = times_of([base] * before + [base * 2 * STALL_FACTOR] + [base] * after)
    assert stalls(spiked) == [(spiked[before], spiked[before + 1])]


def test_slower_decode_after_a_long_kv_joins_is_not_shaded():
    """The issue: pink from 760 ms to the end while the row said "max stall 22.1 ms"."""
    load = lab_scenario()
    traces = [simulate("shared", load, SLOW_KV), simulate("chunked", load, SLOW_KV, chunk=256)]
    lay = layout(traces, (0.0, 2.0))
    shared, chunked = lay.panels
    prefill_end = max(
        b.end for b in shared.rows[0].bars if "long" in b.request_ids and b.kind == "prefill"
    )
    for row in shared.tokens:
        if row.request.startswith("live"):
            assert (
                len(row.stalls) == 1 and row.stalls[0][1] <= prefill_end + LAB.decode_step_base * 2
            )
    assert all(not row.stalls for row in chunked.tokens)
    # the slow stretch does make the longest gap: the chunked row says it is no stall
    longest = traces[1].summary().max_stall
    assert longest > STALL_FACTOR * LAB.decode_step_base * 0.9
    assert chunked.stats.startswith(f"whole run: no stall (longest gap {ms(longest, 1)} ms)")


def test_the_row_figure_is_the_longest_shaded_gap():
    load = lab_scenario()
    for trace in (simulate("shared", load, SLOW_KV), simulate("shared", load, LAB)):
        found = [b - a for r in trace.requests.values() for a, b in stalls(r.token_times)]
        words = stall_words(trace, trace.summary().max_stall)
        assert words.startswith(f"max stall {ms(max(found), 1)} ms")
        lay = layout([trace], (0.0, 5.0))
        shaded = [b - a for row in lay.panels[0].tokens for a, b in row.stalls]
        assert max(shaded) == pytest.approx(max(found))
