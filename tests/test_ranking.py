"""Ranking flag sets with ties the prediction cannot break: the best within the tolerance of
the highest, an order that agrees where the prediction tells pairs apart, and the order
written with "=" for a tie; bad input named."""

from __future__ import annotations

import itertools
import math

import pytest

from pytest_prefill.verify.result import agrees, apart, order_text, ranking, tied_best

TOL = 0.02


def test_two_values_are_apart_only_beyond_the_tolerance_of_the_smaller():
    assert not apart(100.0, 100.0 * (1 + TOL), TOL)  # exactly at the tolerance: a tie
    assert apart(100.0, 100.0 * (1 + TOL) * 1.001, TOL)
    assert apart(5.0, 4.0, TOL) == apart(4.0, 5.0, TOL)  # symmetric
    assert not apart(0.0, 0.0, TOL) and apart(0.0, 1e-9, TOL)


def test_the_predicted_best_is_every_value_within_the_tolerance_of_the_highest():
    values = [4.61, 4.05, 4.61 * (1 - TOL / 2), 4.61 / (1 + 2 * TOL)]
    assert tied_best(values, TOL) == (0, 2)  # highest first, the 4% lower one out
    assert tied_best([3.0, 5.0], TOL) == (1,)
    assert tied_best([], TOL) == ()
    assert tied_best([2.0, 2.0, 2.0], 0.0) == (0, 1, 2)  # equal values tie at any tolerance


def test_an_order_agrees_when_every_pair_told_apart_comes_out_the_same_way():
    predicted = [4.61, 4.05, 4.61]  # the first and last tie
    assert agrees(predicted, [4.86, 4.46, 5.07], TOL)  # the tie broken either way
    assert agrees(predicted, [5.07, 4.46, 4.86], TOL)
    assert not agrees(predicted, [4.40, 4.46, 5.07], TOL)  # a pair told apart, swapped
    assert not agrees([5.0, 4.0], [4.5, 4.5], TOL)  # a measured tie breaks a told pair
    # with no tolerance, agreement is the same strict order
    for measured in itertools.permutations([1.0, 2.0, 3.0]):
        strict = ranking([3.0, 2.0, 1.0]) == ranking(list(measured))
        assert agrees([3.0, 2.0, 1.0], list(measured), 0.0) == strict


def test_the_order_is_written_with_an_equals_sign_for_a_tie():
    labels = ["a", "b", "c"]
    assert order_text(labels, [4.61, 4.05, 4.61], TOL) == "a = c > b"
    assert order_text(labels, [1.0, 2.0, 3.0], TOL) == "c > b > a"
    assert order_text(labels, [4.61, 4.05, 4.61], 0.0) == "a = c > b"  # equal is a tie
    assert order_text([], [], TOL) == ""
    # a run of ties is measured from its first: 4.47 = 3.84 (16%), 3.41 is 31% below 4.47
    assert order_text(labels, [3.84, 4.47, 3.41], 0.22) == "b = a > c"
    assert order_text(labels, [3.84, 4.47, 3.41], 0.32) == "b = a = c"


@pytest.mark.parametrize("tolerance", [-0.01, math.nan, math.inf, "2%"])
def test_a_bad_tolerance_is_named(tolerance):
    with pytest.raises(ValueError, match="tolerance"):
        tied_best([1.0, 2.0], tolerance)


def test_bad_values_are_named():
    with pytest.raises(ValueError, match="values"):
        tied_best([1.0, math.nan], TOL)
    with pytest.raises(ValueError, match="measured"):
        agrees([1.0, 2.0], [1.0], TOL)


def test_the_predicted_best_holds_fails_or_is_undecided_on_the_measured_intervals():
    from pytest_prefill.verify.result import best_verdict

    predicted = [4.0, 5.0, 3.0]  # the predicted best is index 1
    clear = [(4.42, 4.62), (4.69, 4.91), (4.26, 4.46)]
    assert best_verdict(predicted, clear, TOL) == ("HOLDS", (1,))
    touching = [(4.42, 4.69), (4.69, 4.91), (4.26, 4.46)]  # low == high: not above it
    assert best_verdict(predicted, touching, TOL) == ("UNDECIDED", (0,))
    beaten = [(4.95, 5.2), (4.69, 4.91), (4.26, 4.46)]  # index 0 clears the predicted best
    assert best_verdict(predicted, beaten, TOL) == ("FAILS", (0,))
    unknown = [None, (4.69, 4.91), (4.26, 4.46)]  # no interval: it may lie anywhere
    assert best_verdict(predicted, unknown, TOL) == ("UNDECIDED", (0,))
    tied = [5.0, 4.0, 5.0 * (1 - TOL / 2)]  # 0 and 2 tied: either clearing the rest holds
    assert best_verdict(tied, [(4.0, 4.2), (4.3, 4.5), (4.6, 4.8)], TOL) == ("HOLDS", (2,))
    assert best_verdict(tied, [(4.0, 4.2), (4.3, 4.5), (4.4, 4.8)], TOL)[0] == "UNDECIDED"
    assert best_verdict(tied, [(4.6, 4.8), (4.85, 5.0), (4.0, 4.5)], TOL) == ("FAILS", (1,))
    assert best_verdict([4.0, 4.0], [(3.0, 3.1), (5.0, 5.1)], TOL)[0] == "UNDECIDED"  # no claim
    with pytest.raises(ValueError, match="intervals"):
        best_verdict(predicted, clear[:2], TOL)


def test_the_claimed_tolerance_is_the_closest_knee_claims_can_order():
    from pytest_prefill.verify.result import claimed_apart

    for within in (0.0, 0.05, 0.10, 0.25):
        tie = claimed_apart(within)
        assert tie == pytest.approx((1 + within) / (1 - within) - 1)
        low = 4.0  # the lower predicted knee at its highest claimed measurement ...
        high = low * (1 + tie)  # ... meets the higher one at its lowest
        assert high / (1 + within) == pytest.approx(low / (1 - within))
    for bad in (-0.1, 1.0, 1.5, math.nan, math.inf, True, "0.1", None):
        with pytest.raises(ValueError, match="within"):
            claimed_apart(bad)  # type: ignore[arg-type]


def _held(rng, within: float, n: int) -> tuple[list[float], list[tuple[float, float]]]:
    """Predicted knees and measured intervals such that every knee's claim HOLDS: each
    interval inside [p / (1 + within), p / (1 - within)]."""
    predicted = [rng.uniform(1.0, 10.0) for _ in range(n)]
    intervals = []
    for p in predicted:
        a, b = sorted(rng.uniform(p / (1 + within), p / (1 - within)) for _ in range(2))
        intervals.append((a, b))
    return predicted, intervals


def test_when_every_knee_holds_the_claimed_ranking_cannot_fail():
    import random

    from pytest_prefill.verify.result import best_verdict, claimed_apart

    rng = random.Random(27)
    within = 0.10
    tie = claimed_apart(within)
    decided = failed_on_grid = 0
    for _ in range(3000):
        predicted, intervals = _held(rng, within, rng.randint(2, 4))
        points = [rng.uniform(a, b) for a, b in intervals]
        verdict, _ = best_verdict(predicted, intervals, tie)
        assert verdict != "FAILS"
        best = tied_best(predicted, tie)
        if len(best) < len(predicted):  # the prediction names a best: every knee held it up
            assert verdict == "HOLDS"
            decided += 1
        assert agrees(predicted, points, tie)
        failed_on_grid += best_verdict(predicted, intervals, TOL)[0] == "FAILS"
    assert decided > 100  # the property was exercised, not vacuous
    assert failed_on_grid > 0  # at the search's 2% the same knees, each holding, fail a best
