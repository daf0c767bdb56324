"""Money and the search across kinds (plan/pricing.py, plan/kinds.py): prices per device kind,
the cost of a million tokens served (input and output apart), and the deployments a budget
per kind allows."""

from __future__ import annotations

import math

import pytest
from strategies import V2

from pytest_prefill.plan.kinds import kind_deployments
from pytest_prefill.plan.pools import parse_pools
from pytest_prefill.plan.pricing import (
    colocated_price,
    dollars_per_hour,
    parse_prices,
    prompt_share,
    split_price,
    token_price,
)
from pytest_prefill.sim import Request, simulate


def test_prices_are_keyed_by_catalog_kind():
    assert parse_prices("h100=2.5,l40s=0.9", ["h100", "l40s"]) == {"h100-sxm": 2.5, "l40s": 0.9}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("h100=-1", "h100=-1: a price is a number >= 0"),
        ("h100=abc", "a price is a number >= 0"),
        ("h200=3", "'h200' is not a kind searched \\(h100-sxm, l40s\\)"),
        ("h900=3", "--price: unknown gpu 'h900'"),
        ("h100", "expected KIND=\\$/device-hour"),
        ("h100=1,h100-sxm=2", "h100-sxm is priced twice"),
    ],
)
def test_bad_prices_are_one_line_each(text, message):
    with pytest.raises(ValueError, match=message) as err:
        parse_prices(text, ["h100", "l40s"])
    assert "\n" not in str(err.value)


def test_a_million_tokens_costs_the_hours_that_serve_them():
    price = token_price(2.0, 1000, 100, input_dollars=7.2, output_dollars=3.6)
    # 2 req/s: 7.2e6 input and 7.2e5 output tokens an hour
    assert price.input_per_mtok == pytest.approx(7.2 / 7.2)
    assert price.output_per_mtok == pytest.approx(3.6 / 0.72)
    assert price.per_mtok == pytest.approx(10.8 / 7.92)
    assert token_price(0.0, 1000, 100, 1.0, 1.0).per_mtok == math.inf


def test_a_split_pays_input_with_its_prefill_pool_and_output_with_its_decode_pool():
    split = parse_pools("disaggregated:2:4,p=h100:tp2,d=l40s")
    prices = {"h100-sxm": 2.5, "l40s": 0.9}
    price = split_price(split, prices, 1.0, 500, 50)
    assert price.dollars_per_hour == pytest.approx(4 * 2.5 + 4 * 0.9)
    assert price.input_per_mtok == pytest.approx(10.0 / (500 * 3600) * 1e6)
    assert price.output_per_mtok == pytest.approx(3.6 / (50 * 3600) * 1e6)
    with pytest.raises(ValueError, match="no price for l40s"):
        dollars_per_hour(split.devices_by_kind(), {"h100-sxm": 2.5})


def test_colocated_hours_split_by_the_prompts_share_of_busy_time():
    load = [Request(f"r{i}", 0.05 * i, 400, 20) for i in range(8)]
    trace = simulate("shared", load, V2)
    share = prompt_share(trace.events)
    prefill = sum(e.duration for e in trace.events if e.kind == "prefill")
    assert share == pytest.approx(prefill / sum(e.duration for e in trace.events))
    price = colocated_price("h100", 2, {"h100-sxm": 2.0}, 1.0, 400, 20, share)
    assert price.dollars_per_hour == pytest.approx(4.0)
    both = price.input_per_mtok * 400 + price.output_per_mtok * 20
    assert both == pytest.approx(price.per_mtok * 420)


def test_a_budget_per_kind_gives_each_kind_colocated_and_every_split_that_fits():
    colocated, splits = kind_deployments({"h100": 4, "l40s": 2}, {"h100": 2})
    assert {c.label for c in colocated} == {"colocated ×2 h100-sxm TP2", "colocated ×2 l40s"}
    budget = {"h100-sxm": 4, "l40s": 2}
    for s in splits:
        for kind, n in s.devices_by_kind().items():
            assert n <= budget[kind]
    mixed = {(s.prefill.kind, s.decode.kind) for s in splits}
    assert mixed == {(a, b) for a in budget for b in budget}
    # same kind: P + D instances of TP2 within 4 H100s -> only 1:1
    same = [s for s in splits if s.prefill.kind == s.decode.kind == "h100-sxm"]
    assert [(s.prefill.instances, s.decode.instances) for s in same] == [(1, 1)]
    with pytest.raises(ValueError, match="h100-sxm's tp must be an integer from 1 to its 1"):
        kind_deployments({"h100": 1}, {"h100": 2})
