"""The trace (sim/trace.py): a simulation's compact summary equals one built from its records."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from strategies import LAB, chunks, cost_models, examples, loads, policies, run

from pytest_prefill.sim import (
    POLICIES,
    Trace,
    simulate,
)

pytestmark = pytest.mark.sim


@examples(60)
@given(load=loads(), cost=cost_models(), policy=policies, chunk=chunks)
def test_summary_from_precomputed_gaps_equals_summary_from_records(load, cost, policy, chunk):
    trace = run(policy, load, cost, chunk, decode_workers=2)
    generic = Trace(trace.policy, trace.events, trace.requests, trace.chunk, gaps=None)
    fast, slow = trace.summary(), generic.summary()
    for name, value in fast.as_dict().items():
        other = getattr(slow, name)
        assert value == pytest.approx(other, rel=1e-9, nan_ok=True), name


def test_an_empty_load_gives_an_empty_trace_whose_summary_says_so():
    for policy in POLICIES:
        trace = simulate(policy, [], LAB, chunk=64)
        s = trace.summary()
        assert trace.events == () and dict(trace.requests) == {}
        assert s.empty and s.requests == 0 and s.gpu_seconds == 0.0
        assert math.isnan(s.ttft_p99)
        assert "empty" in str(s)
