"""The cost model (sim/cost.py): every formula of DESIGN.md's cost model v2, C*, the JSON form
and bad terms. Expected values come from the formulas, never from an earlier run."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import LAB, V2, cost_models, examples

from pytest_prefill.sim import (
    CostModel,
    Request,
    attention_pairs,
    simulate,
)

pytestmark = pytest.mark.sim

terms = st.floats(0, 0.05, allow_nan=False)
small = st.floats(0, 1e-8, allow_nan=False)
GOOD = dict(prefill_pass_overhead=1e-3, prefill_per_token=1e-5, decode_step_base=1e-2)


@st.composite
def v2_models(draw: st.DrawFn) -> CostModel:
    return CostModel(
        prefill_pass_overhead=draw(terms),
        prefill_per_token=draw(st.floats(1e-7, 1e-4)),
        decode_step_base=draw(st.floats(1e-4, 0.05)),
        decode_per_seq=draw(st.floats(0, 1e-3)),
        decode_per_kv_token=draw(small),
        prefill_per_pair=draw(small),
        fusion_penalty=draw(st.floats(0, 1)),
    )


@given(
    cost=cost_models(),
    t=st.integers(0, 10**5),
    n=st.integers(1, 512),
    k=st.integers(0, 10**6),
    c=st.integers(0, 10**5),
)
def test_cost_model_formulas(cost, t, n, k, c):
    assert cost.prefill_pass(t, c) == pytest.approx(
        cost.prefill_pass_overhead + cost.prefill_per_token * t + cost.decode_per_kv_token * c
    )
    assert cost.decode_step(n, k) == pytest.approx(
        cost.decode_step_base + cost.decode_per_seq * (n - 1) + cost.decode_per_kv_token * k
    )
    fused = cost.fused_iteration(t, n, k, c)
    assert fused >= cost.decode_step(n, k)
    if t:
        assert fused >= cost.prefill_pass(t, c)
        # the chunk's t tokens also attend over the rows' k cached tokens (batch attention)
        batch = cost.batch_attention_per_pair * t * k
        assert fused == pytest.approx(
            max(cost.decode_step(n, k), cost.prefill_pass(t + n, c) + batch)
        )
    assert cost.kv_transfer(t) == pytest.approx(
        cost.link_latency + t * cost.kv_bytes_per_token / cost.link_bandwidth
    )


def test_chunk_star_is_the_formula_and_may_be_a_negative_diagnosis():
    assert LAB.chunk_star() == pytest.approx((35.73e-3 - 29.03e-3) / 55.2e-6)
    assert round(LAB.chunk_star()) == 121  # DESIGN.md's published figure for the lab laptop
    overhead_bound = CostModel(
        prefill_pass_overhead=0.05, prefill_per_token=1e-5, decode_step_base=0.01
    )
    assert overhead_bound.chunk_star() < 0


@given(cost=cost_models())
def test_cost_model_survives_a_json_round_trip(cost):
    import json

    assert CostModel.from_dict(json.loads(json.dumps(cost.to_dict()))) == cost


@pytest.mark.parametrize(
    "field",
    [
        *GOOD,
        "decode_per_seq",
        "decode_per_kv_token",
        "kv_bytes_per_token",
        "link_latency",
        "link_bandwidth",
    ],
)
@pytest.mark.parametrize("value", [-1.0, math.nan, -math.inf, "fast", None])
def test_bad_costs_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        CostModel(**{**GOOD, field: value})


@pytest.mark.parametrize("field", [*GOOD, "decode_per_seq", "link_latency"])
def test_infinite_costs_are_refused(field):
    with pytest.raises(ValueError, match=field):
        CostModel(**{**GOOD, field: math.inf})


def test_a_cost_model_must_make_time_pass():
    with pytest.raises(ValueError, match="decode_step_base"):
        CostModel(**{**GOOD, "decode_step_base": 0.0})
    with pytest.raises(ValueError, match="prefill_pass_overhead"):
        CostModel(**{**GOOD, "prefill_pass_overhead": 0.0, "prefill_per_token": 0.0})
    with pytest.raises(ValueError, match="link_bandwidth"):
        CostModel(**{**GOOD, "link_bandwidth": 0.0})


@examples(80)
@given(
    cost=v2_models(),
    pieces=st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 50000)), min_size=1, max_size=4),
    rows=st.integers(0, 64),
    kv=st.integers(0, 10**6),
)
def test_an_iteration_costs_what_design_says(cost, pieces, rows, kv):
    prefill = (
        cost.prefill_pass_overhead
        + cost.prefill_per_token * sum(t for t, _ in pieces)
        + cost.prefill_per_pair * sum(t * c + t * (t + 1) / 2 for t, c in pieces)
        + cost.decode_per_kv_token * sum(c for _, c in pieces)
    )
    assert cost.prefill_pieces(pieces) == pytest.approx(prefill, rel=1e-12)
    if rows == 0:
        assert cost.iteration(pieces) == pytest.approx(prefill, rel=1e-12)
        return
    decode = (
        cost.decode_step_base + cost.decode_per_seq * (rows - 1) + cost.decode_per_kv_token * kv
    )
    compute = prefill + cost.prefill_per_token * rows
    assert cost.compute_part(pieces, rows) == pytest.approx(compute, rel=1e-12)
    fused = max(decode, compute) + cost.fusion_penalty * min(decode, compute)
    assert cost.iteration(pieces, rows, kv) == pytest.approx(fused, rel=1e-12)
    assert cost.iteration((), rows, kv) == pytest.approx(decode, rel=1e-12)


@examples(80)
@given(
    cost=st.builds(CostModel, terms, st.floats(1e-7, 1e-4), st.floats(1e-4, 0.05)),
    t=st.integers(1, 5000),
    c=st.integers(0, 5000),
    n=st.integers(1, 64),
    k=st.integers(0, 10**5),
)
def test_with_the_new_terms_at_zero_the_fused_rule_is_the_labs(cost, t, c, n, k):
    lab_rule = max(cost.decode_step(n, k), cost.prefill_pass(t + n, c))
    assert cost.fused_iteration(t, n, k, c) == pytest.approx(lab_rule, rel=1e-12)


def test_the_pair_term_makes_a_chunk_dearer_the_later_it_comes():
    early, late = V2.prefill_pass(512, 0), V2.prefill_pass(512, 8192)
    assert late - early == pytest.approx(
        V2.prefill_per_pair * 512 * 8192 + V2.decode_per_kv_token * 8192
    )
    whole = V2.prefill_pass(1024)
    halves = V2.prefill_pass(512) + V2.prefill_pass(512, 512)
    # two halves pay a second overhead but the same attention pairs in all
    assert halves - whole == pytest.approx(V2.prefill_pass_overhead + V2.decode_per_kv_token * 512)


@examples(80)
@given(
    cost=v2_models(),
    context=st.integers(0, 50000),
    rows=st.integers(0, 32),
    kv=st.integers(0, 10**5),
)
def test_chunk_star_is_the_largest_chunk_whose_compute_part_fits_the_decode_step(
    cost, context, rows, kv
):
    star = cost.chunk_star(context, rows, kv)
    decode = cost.decode_step(max(rows, 1), kv)
    if not math.isfinite(star) or star < 1 or star > 1e7:
        return
    fits = cost.compute_part([(math.floor(star), context)], rows)
    over = cost.compute_part([(math.floor(star) + 1, context)], rows)
    assert fits <= decode * (1 + 1e-9)
    assert over >= decode * (1 - 1e-9)


@examples(80)
@given(cost=v2_models(), context=st.integers(0, 40000))
def test_chunk_star_falls_as_the_prompt_proceeds_with_a_pair_term(cost, context):
    if cost.prefill_per_pair == 0 and cost.decode_per_kv_token == 0:
        return
    if cost.chunk_star(context + 1000) > 0:  # (below 0 it is a diagnosis, not a chunk)
        assert cost.chunk_star(context + 1000) <= cost.chunk_star(context)


def test_cost_model_v2_round_trips_and_old_json_loads_with_the_defaults():
    capped = dataclasses.replace(V2, kv_capacity_tokens=4096)
    for cost in (V2, capped):
        assert CostModel.from_dict(cost.to_dict()) == cost
    old = {
        k: v
        for k, v in V2.to_dict().items()
        if k not in ("prefill_per_pair", "fusion_penalty", "kv_capacity_tokens")
    }
    loaded = CostModel.from_dict(old)
    assert (loaded.prefill_per_pair, loaded.fusion_penalty) == (0.0, 0.0)
    assert math.isinf(loaded.kv_capacity_tokens)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("fusion_penalty", 1.5),
        ("fusion_penalty", -0.1),
        ("prefill_per_pair", -1e-9),
        ("prefill_per_pair", math.nan),
        ("kv_capacity_tokens", 0),
        ("kv_capacity_tokens", 10.5),
        ("kv_capacity_tokens", -5),
        ("kv_capacity_tokens", 10**400),
    ],
)
def test_bad_v2_terms_are_named(field, value):
    with pytest.raises(ValueError, match=field):
        CostModel.from_dict({**V2.to_dict(), field: value})


def test_a_transfer_time_per_token_that_overflows_is_named():
    with pytest.raises(ValueError, match="kv_bytes_per_token / link_bandwidth"):
        dataclasses.replace(V2, kv_bytes_per_token=1e300, link_bandwidth=1e-300)


@pytest.mark.parametrize("field", ["prefill_pass_overhead", "decode_step_base"])
def test_a_cost_of_400_digits_is_a_value_error_naming_the_field(field):
    fields = {"prefill_pass_overhead": 0.01, "prefill_per_token": 1e-5, "decode_step_base": 0.03}
    with pytest.raises(ValueError, match=field):
        CostModel(**{**fields, field: 10**400})


def test_a_kv_transfer_that_overflows_is_a_value_error():
    with pytest.raises(ValueError, match="link_bandwidth"):
        cost = CostModel(
            prefill_pass_overhead=0.01,
            prefill_per_token=1e-5,
            decode_step_base=0.03,
            kv_bytes_per_token=1e300,
            link_bandwidth=1e-300,
        )
        simulate("disaggregated", [Request("a", 0.0, 10, 3)], cost)


@given(tokens=st.integers(0, 300), context=st.integers(0, 300))
def test_attention_pairs_count_every_new_token_against_the_cache_and_the_new_ones_before(
    tokens, context
):
    # new token i (from 1) attends to the context and to the new tokens 1..i
    assert attention_pairs(tokens, context) == sum(context + i for i in range(1, tokens + 1))
    pieces = [(tokens, context), (3, 7)]
    assert V2.prefill_pieces(pieces) == pytest.approx(
        V2.prefill_pass_overhead
        + V2.prefill_per_token * (tokens + 3)
        + V2.prefill_per_pair * (attention_pairs(tokens, context) + attention_pairs(3, 7))
        + V2.decode_per_kv_token * (context + 7),
        rel=1e-12,
    )


FLOORED = CostModel(
    prefill_pass_overhead=1e-3,
    prefill_per_token=1e-5,
    decode_step_base=1e-2,
    decode_per_kv_token=1e-8,
    prefill_per_pair=1e-10,
    fusion_penalty=0.5,
    prefill_floor=4e-3,
)


@given(
    t=st.integers(1, 10**4),
    c=st.integers(0, 10**4),
    n=st.integers(1, 64),
    k=st.integers(0, 10**5),
    floor=st.sampled_from([0.0, 4e-3, 2e-2]),
)
def test_the_prefill_floor_bounds_every_pass_with_prompt_tokens_from_below(t, c, n, k, floor):
    cost = dataclasses.replace(FLOORED, prefill_floor=floor)
    bare = dataclasses.replace(FLOORED, prefill_floor=0.0)
    assert cost.prefill_pass(t, c) == max(floor, bare.prefill_pass(t, c))
    assert cost.compute_part(((t, c),), n) == max(floor, bare.compute_part(((t, c),), n))
    decode = cost.decode_step(n, k)
    assert decode == bare.decode_step(n, k)  # decode steps never see the floor
    compute = max(floor, bare.compute_part(((t, c),), n))  # the rows ride as n more tokens
    fused = max(decode, compute) + cost.fusion_penalty * min(decode, compute)
    assert cost.fused_iteration(t, n, k, c) == pytest.approx(fused)


def test_a_zero_floor_changes_no_cost():
    bare = dataclasses.replace(FLOORED, prefill_floor=0.0)
    unfloored = CostModel.from_dict(
        {k: v for k, v in bare.to_dict().items() if k != "prefill_floor"}
    )
    assert unfloored == bare
    for t, c in ((1, 0), (100, 0), (512, 4096)):
        assert bare.prefill_pass(t, c) == (
            bare.prefill_pass_overhead
            + bare.prefill_per_token * t
            + bare.prefill_per_pair * attention_pairs(t, c)
            + bare.decode_per_kv_token * c
        )


def test_chunk_star_under_a_floor_over_the_decode_step_is_a_negative_diagnosis():
    under = dataclasses.replace(FLOORED, prefill_floor=FLOORED.decode_step_base / 2)
    assert under.chunk_star() == dataclasses.replace(FLOORED, prefill_floor=0.0).chunk_star()
    over = dataclasses.replace(FLOORED, prefill_floor=2 * FLOORED.decode_step_base)
    room = FLOORED.decode_step_base - over.prefill_floor
    b = FLOORED.prefill_per_token + FLOORED.prefill_per_pair * 0.5
    assert over.chunk_star() == pytest.approx(room / b)
    assert over.chunk_star() < 0


@pytest.mark.parametrize("value", [-1e-3, math.nan, math.inf, "slow"])
def test_a_bad_prefill_floor_is_refused_naming_the_field(value):
    with pytest.raises(ValueError, match="prefill_floor"):
        CostModel(**{**GOOD, "prefill_floor": value})


def test_the_floor_survives_the_cost_document(tmp_path):
    import json

    from pytest_prefill.plan.cost_document import load_cost

    path = tmp_path / "cost.json"
    path.write_text(json.dumps({"cost_model": FLOORED.to_dict()}))
    cost, _ = load_cost(str(path))
    assert cost.prefill_floor == FLOORED.prefill_floor
    assert cost == FLOORED
