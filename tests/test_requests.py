"""Requests and loads (sim/requests.py): bad fields named, duplicate ids, FCFS order."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import LAB, chunks, cost_models, examples, loads, policies, run

from pytest_prefill.sim import Request, get_preset, simulate

pytestmark = pytest.mark.sim


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(arrival=-0.1), "arrival"),
        (dict(arrival=math.nan), "arrival"),
        (dict(arrival=math.inf), "arrival"),
        (dict(prompt_len=0), "prompt_len"),
        (dict(prompt_len=-5), "prompt_len"),
        (dict(prompt_len=2.5), "prompt_len"),
        (dict(output_len=0), "output_len"),
        (dict(id=""), "id"),
        (dict(id=7), "id"),
    ],
)
def test_bad_requests_are_refused_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Request(**{**dict(id="r", arrival=0.0, prompt_len=10, output_len=5), **kwargs})


def test_duplicate_ids_are_refused():
    with pytest.raises(ValueError, match=r"load\[1\]\.id 'x' is a duplicate"):
        simulate("shared", [Request("x", 0, 1, 1), Request("x", 1, 1, 1)], LAB)


def test_a_load_of_non_requests_is_refused():
    with pytest.raises(ValueError, match=r"load\[0\] must be a Request"):
        simulate("shared", [("a", 0, 10, 1)], LAB)  # type: ignore[list-item]


def test_an_arrival_of_400_digits_is_a_value_error_naming_the_field():
    with pytest.raises(ValueError, match="arrival"):
        Request("a", 10**400, 10, 3)


@pytest.mark.parametrize("load", [None, 3, "abc"])
def test_a_load_that_is_no_sequence_of_requests_is_a_value_error(load):
    with pytest.raises(ValueError, match="load"):
        simulate("shared", load, get_preset("lab-laptop").cost)


@examples(60)
@given(load=loads(), cost=cost_models(), policy=policies, chunk=chunks, seed=st.integers(0, 99))
def test_the_order_of_the_load_list_does_not_matter(load, cost, policy, chunk, seed):
    shuffled = list(load)
    random.Random(seed).shuffle(shuffled)
    assert run(policy, shuffled, cost, chunk) == run(policy, load, cost, chunk)


def test_prefix_blocks_are_kept_as_a_tuple_of_hash_ids():
    r = Request("r", 0.0, 1024, 4, [0, 1, "sys-2"])  # type: ignore[arg-type]
    assert r.prefix_blocks == (0, 1, "sys-2")
    assert Request("s", 0.0, 10, 1).prefix_blocks == ()
    assert hash(r) == hash(Request("r", 0.0, 1024, 4, (0, 1, "sys-2")))


@pytest.mark.parametrize("blocks", ["ab", 3, None, (1, True), (1, ""), (1, 2.5), ([1],)])
def test_bad_prefix_blocks_are_a_value_error_naming_the_field(blocks):
    with pytest.raises(ValueError, match="prefix_blocks"):
        Request("r", 0.0, 10, 1, blocks)
