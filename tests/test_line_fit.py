"""The straight-line fit (fit_line): its recoveries and refusals, and the one refusal rule it and
the many-term fit share. Synthetic data only."""

from __future__ import annotations

import math

import pytest

np = pytest.importorskip("numpy")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pytest_prefill.measure.line_fit import CLEARLY, Fit, fit_from_dict, fit_line  # noqa: E402


@settings(max_examples=60)
@given(
    slope=st.floats(min_value=1e-7, max_value=1e-2),
    intercept=st.floats(min_value=0.0, max_value=0.1),
    points=st.integers(min_value=2, max_value=8),
)
def test_fit_line_recovers_a_known_line(slope, intercept, points):
    xs = [128 * 2**i for i in range(points)]
    ys = [intercept + slope * x for x in xs]
    fit = fit_line(xs, ys, [0.0] * points)
    assert not fit.refused, fit.reason
    assert fit.slope == pytest.approx(slope, rel=1e-6)
    assert fit.intercept == pytest.approx(intercept, rel=1e-6, abs=1e-9)
    assert fit.recorded_slope == fit.slope and fit.level == fit.intercept


def test_fit_line_recovers_a_slope_above_modest_noise():
    rng = np.random.default_rng(0)
    xs = [256, 512, 1024, 2048]
    slope, intercept, noise = 50e-6, 0.03, 0.5e-3
    ys = [intercept + slope * x + rng.normal(0, noise) for x in xs]
    fit = fit_line(xs, ys, [noise] * 4)
    assert not fit.refused
    assert abs(fit.slope - slope) <= 3 * fit.slope_stderr + 1e-12
    assert fit.effect > CLEARLY * fit.scatter


@settings(max_examples=80)
@given(
    level=st.floats(min_value=1e-3, max_value=1.0),
    jitter=st.lists(st.floats(min_value=-1.0, max_value=1.0), min_size=4, max_size=6),
    width=st.floats(min_value=1e-6, max_value=1e-2),
)
def test_fit_line_refuses_pure_noise(level, jitter, width):
    # ys wander within +/- width; each point's own spread is that wander's full width, so no
    # fitted slope can predict an effect clearly larger than the scatter
    xs = [128 * 2**i for i in range(len(jitter))]
    ys = [level + width * j for j in jitter]
    fit = fit_line(xs, ys, [2 * width] * len(xs))
    assert fit.refused and fit.reason
    assert fit.recorded_slope == 0
    assert fit.level == pytest.approx(sum(ys) / len(ys))


def test_fit_line_refuses_a_negative_slope_for_a_cost():
    fit = fit_line([1, 2, 3, 4], [0.4, 0.3, 0.2, 0.1])
    assert fit.refused and "negative" in fit.reason
    assert fit.recorded_slope == 0
    allowed = fit_line([1, 2, 3, 4], [0.4, 0.3, 0.2, 0.1], nonnegative=False)
    assert not allowed.refused and allowed.slope == pytest.approx(-0.1)


def test_refusal_reason_carries_the_numbers():
    fit = fit_line([128, 16384], [0.03573, 0.03574], [0.001, 0.001], unit="ms")
    assert fit.refused
    assert "128..16384" in fit.reason and "ms" in fit.reason


@pytest.mark.parametrize(
    ("xs", "ys", "spreads", "match"),
    [
        ([1, 2], [1.0], None, "same length"),
        ([1, 1, 1], [1.0, 2.0, 3.0], None, "distinct"),
        ([1, 2], [1.0, math.nan], None, "finite"),
        ([1, 2], [1.0, 2.0], [0.1], "one value per point"),
        ([1, 2], [1.0, 2.0], [0.1, -0.1], ">= 0"),
    ],
)
def test_fit_line_rejects_bad_input(xs, ys, spreads, match):
    with pytest.raises(ValueError, match=match):
        fit_line(xs, ys, spreads)


def test_fit_round_trips_through_a_dict():
    fit = fit_line([1, 2, 3], [1.0, 2.1, 2.9])
    assert fit_from_dict(fit.to_dict()) == fit
    assert isinstance(fit, Fit)
    with pytest.raises(ValueError, match="missing"):
        fit_from_dict({"slope": 1.0})


def test_one_rule_refuses_a_term_for_each_reason_in_order():
    from pytest_prefill.measure.line_fit import CLEARLY, SIGNIFICANT, unsupported

    assert unsupported(-1.0, 0.1, 10.0, 1.0) == "negative"
    assert unsupported(-1.0, 0.1, 10.0, 1.0, nonnegative=False) is None
    assert unsupported(1.0, 0.1, CLEARLY * 1.0, 1.0) == "flat"  # not MORE than CLEARLY x
    assert unsupported(1.0, 1.0 / SIGNIFICANT, 10.0, 1.0) == "near zero"
    assert unsupported(1.0, 1.0 / SIGNIFICANT, 10.0, 1.0, test_stderr=False) is None
    assert unsupported(1.0, 0.1, 10.0, 1.0) is None
