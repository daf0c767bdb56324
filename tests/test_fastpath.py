"""The fast path (sim/fastpath.py): closed-form decode runs, exact to the tick."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import V2, examples

from pytest_prefill.sim import (
    Request,
    simulate,
    steps_before,
)

pytestmark = pytest.mark.sim


def test_a_long_decode_run_grows_by_exactly_the_kv_read_each_step():
    trace = simulate("shared", [Request("a", 0.0, 100, 1000)], V2)
    gaps = trace.token_gaps()
    # each step reads one more cached token than the one before: 999 distinct gaps, the k-th
    # smallest exactly (k - 1) KV reads longer than the first, never drifting
    assert len(gaps) == 999 and len(gaps.items()) == 999
    first = V2.decode_step(1, 101)
    for k in (1, 2, 500, 999):
        assert gaps.kth(k) == pytest.approx(first + (k - 1) * V2.decode_per_kv_token, rel=1e-14)
    assert [e.count for e in trace.events if e.kind == "decode"] == [1000]


@examples(100)
@given(
    start=st.integers(0, 10**6),
    first=st.integers(1, 10**4),
    growth=st.integers(0, 50),
    span=st.integers(1, 10**5),
)
def test_steps_before_counts_the_steps_that_start_before_the_horizon(start, first, growth, span):
    # step j (from 0) starts at start + j*first + growth*j*(j-1)/2; the run keeps every step
    # that starts before the horizon. A run's first step reads each row's KV, so it costs at
    # least the growth (per KV token times rows).
    growth = min(growth, first)
    horizon = start + span
    expected = 0
    while start + expected * first + growth * (expected * (expected - 1) // 2) < horizon:
        expected += 1
    assert steps_before(start, first, growth, horizon) == expected
