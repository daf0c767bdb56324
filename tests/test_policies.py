"""The policies' options (sim/policies.py): unknown names and bad options named."""

from __future__ import annotations

import math

import pytest
from strategies import LAB, V2

from pytest_prefill.sim import (
    Request,
    WorkerMode,
    simulate,
    worker_mode,
)

pytestmark = pytest.mark.sim

LOAD = [Request("a", 0.0, 300, 20), Request("b", 0.0, 200, 40), Request("c", 0.01, 100, 10)]


def test_an_unknown_policy_lists_the_valid_ones():
    with pytest.raises(ValueError, match="shared, coscheduled, chunked, disaggregated"):
        simulate("fifo", [], LAB)


@pytest.mark.parametrize("chunk", [None, 0, -4, 1.5])
def test_chunked_needs_a_positive_chunk(chunk):
    with pytest.raises(ValueError, match="chunk"):
        simulate("chunked", [Request("a", 0, 10, 1)], LAB, chunk=chunk)


@pytest.mark.parametrize("field", ["prefill_workers", "decode_workers"])
@pytest.mark.parametrize("value", [0, -1, 1.0])
def test_workers_must_be_at_least_one(field, value):
    with pytest.raises(ValueError, match=field):
        simulate("disaggregated", [Request("a", 0, 10, 1)], LAB, **{field: value})


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"chunk": 64, "chunk_budget": 0.01}, "chunk_budget"),
        ({"chunk_budget": 0.0}, "chunk_budget"),
        ({"chunk_budget": -1.0}, "chunk_budget"),
        ({"chunk_budget": math.inf}, "chunk_budget"),
        ({"chunk": 64, "replicas": 0}, "replicas"),
        ({"chunk": 64, "replicas": 1.5}, "replicas"),
    ],
)
def test_bad_new_arguments_are_named(kwargs, field):
    with pytest.raises(ValueError, match=field):
        simulate("chunked", LOAD, V2, **kwargs)


def test_replicas_do_not_apply_to_disaggregation():
    with pytest.raises(ValueError, match="replicas"):
        simulate("disaggregated", LOAD, V2, replicas=2)


def test_each_policy_maps_to_one_worker_mode():
    assert worker_mode("shared", 64) == WorkerMode("shared", math.inf)
    assert worker_mode("coscheduled", 64) == WorkerMode("coscheduled", math.inf)
    assert worker_mode("chunked", 64) == WorkerMode("chunked", 64.0)
    assert worker_mode("chunked") == WorkerMode("chunked", math.inf)  # a time budget instead
    assert worker_mode("disaggregated") == WorkerMode("decode", math.inf)
