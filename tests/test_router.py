"""The router (sim/router.py): least loaded first, ties to the lowest index, untouched workers
cost nothing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import FLAT, V2, examples, run

from pytest_prefill.sim import (
    Request,
    check_invariants,
    simulate,
)

pytestmark = pytest.mark.sim


def test_replicas_route_to_the_fewest_unfinished_lowest_index_first():
    load = [Request(f"r{i}", 0.0, 100, 10 + i) for i in range(5)]
    trace = simulate("coscheduled", load, V2, replicas=3)
    where = {rid: rec.decode_resource for rid, rec in trace.requests.items()}
    assert where == {
        "r0": "worker0",
        "r1": "worker1",
        "r2": "worker2",
        "r3": "worker0",
        "r4": "worker1",
    }
    later = [*load, Request("late", 100.0, 100, 5)]  # everyone has finished: worker0 again
    assert simulate("coscheduled", later, V2, replicas=3).requests["late"].decode_resource == (
        "worker0"
    )


@examples(80)
@given(n=st.integers(1, 6), prompt=st.integers(1, 2000), out=st.integers(1, 50))
def test_a_replica_each_serves_a_burst_as_one_worker_serves_one_request(n, prompt, out):
    burst = [Request(f"r{i}", 0.0, prompt, out) for i in range(n)]
    alone = simulate("chunked", burst[:1], V2, chunk=256).requests["r0"]
    trace = simulate("chunked", burst, V2, chunk=256, replicas=n)
    for rec in trace.requests.values():
        assert rec.token_times == alone.token_times


def test_a_prefilled_request_joins_the_decode_worker_with_fewest_requests():
    load = [Request("a", 0.0, 10, 50), Request("b", 0.001, 10, 50), Request("c", 0.002, 10, 50)]
    trace = run("disaggregated", load, FLAT, decode_workers=2)
    where = {rid: rec.decode_resource for rid, rec in trace.requests.items()}
    assert where == {"a": "decode0", "b": "decode1", "c": "decode0"}


def test_a_million_decode_workers_cost_nothing_until_used():
    trace = simulate(
        "disaggregated",
        [Request("a", 0.0, 100, 10)],
        V2,
        decode_workers=10**6,
        prefill_workers=10**6,
    )
    assert trace.resources == ("prefill0", "decode0")


def test_a_thousand_requests_on_ten_thousand_workers():
    load = [Request(f"r{i}", i * 0.001, 200, 20) for i in range(1000)]
    trace = simulate("disaggregated", load, V2, decode_workers=10**4)
    used = {r.decode_resource for r in trace.requests.values()}
    # untouched workers never show; those used are the lowest-numbered ones
    assert trace.resources == ("prefill0", *(f"decode{i}" for i in range(len(used))))
    assert check_invariants(trace, load, V2) == []
