"""The trace (sim/trace.py): a simulation's compact summary equals one built from its records."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from strategies import LAB, chunks, cost_models, examples, loads, policies, run

from pytest_prefill.sim import (
    POLICIES,
    Request,
    RequestRecord,
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
    for name, value in fast.to_dict().items():
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


def test_hit_rate_preemptions_and_cached_tokens_are_read_off_the_records():
    records = {
        rid: RequestRecord(
            rid,
            0.0,
            prompt,
            2,
            0.0,
            1.0,
            1.0,
            "worker",
            (1.0, 2.0),
            None,
            cached_tokens=cached,
            preemptions=preempted,
        )
        for rid, prompt, cached, preempted in (("a", 100, 0, 0), ("b", 300, 96, 2))
    }
    trace = Trace("shared", (), records)
    assert trace.cached_tokens("b") == 96 and trace.cached_tokens("a") == 0
    assert trace.hit_rate == 96 / 400
    assert trace.preemptions == 2
    s = trace.summary()
    assert s.to_dict()["hit_rate"] == 96 / 400 and s.cached_tokens == 96
    assert "hit rate 24.0%" in str(s) and "2 preemptions" in str(s)
    with pytest.raises(ValueError, match="request_id"):
        trace.cached_tokens("zz")


def test_a_run_without_caching_or_paging_has_no_hits_and_no_preemptions():
    trace = simulate("chunked", [Request("r", 0.0, 64, 3)], LAB, chunk=16)
    assert trace.hit_rate == 0.0 and trace.preemptions == 0 and trace.cached_tokens("r") == 0
