"""Timing primitives: a measurement's statistics and warnings, and the measure loop. Synthetic
data only: nothing here times anything that matters."""

from __future__ import annotations

import math

import pytest

np = pytest.importorskip("numpy")

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pytest_prefill.measure.timing import UNSTABLE_IQR, Measurement, measure  # noqa: E402

durations = st.floats(min_value=1e-6, max_value=10.0, allow_nan=False, allow_infinity=False)


@given(st.lists(durations, min_size=1, max_size=30))
def test_measurement_statistics_follow_their_definitions(samples):
    m = Measurement.from_samples(samples, warmup=2)
    q1, median, q3 = np.percentile(samples, [25, 50, 75])
    assert m.median == pytest.approx(median)
    assert (m.minimum, m.maximum) == (min(samples), max(samples))
    assert m.iqr == pytest.approx(q3 - q1)
    assert m.relative_spread == pytest.approx((q3 - q1) / median)
    assert m.minimum <= m.q1 <= m.median <= m.q3 <= m.maximum
    assert m.repeats == len(samples) and m.warmup == 2
    assert Measurement.from_dict(m.to_dict()) == m


def test_identical_samples_are_stable():
    assert Measurement.from_samples([0.01] * 5).warning is None


def test_few_samples_and_wide_spread_are_flagged():
    assert "sample" in Measurement.from_samples([0.01, 0.01]).warning
    wide = Measurement.from_samples([1.0, 1.0, 2.0, 3.0, 3.0])
    assert wide.relative_spread > UNSTABLE_IQR
    assert "unstable" in wide.warning and "outliers" in wide.warning


@pytest.mark.parametrize("bad", [[], [-1.0], [math.nan], [math.inf], ["1"]])
def test_bad_samples_are_refused(bad):
    with pytest.raises(ValueError, match="sample"):
        Measurement.from_samples(bad)


def test_measure_runs_warmup_untimed_then_repeats_with_setup_each_time():
    calls, setups, timed = [], [], []

    def timer(fn):
        timed.append(len(calls))
        fn()
        return 0.5

    m = measure(
        lambda: calls.append(1), repeats=4, warmup=2, setup=lambda: setups.append(1), timer=timer
    )
    assert len(calls) == 6 and len(setups) == 6
    assert timed == [2, 3, 4, 5]  # the timer saw only the calls after the warmup
    assert m.samples == (0.5,) * 4 and m.warmup == 2


def test_measure_synchronizes_around_each_timed_call():
    events = []
    measure(lambda: events.append("fn"), repeats=2, warmup=0, sync=lambda: events.append("sync"))
    assert events.count("fn") == 2
    for i, event in enumerate(events):
        if event == "fn":
            assert events[i - 1] == "sync" and events[i + 1] == "sync"


@pytest.mark.parametrize(
    "kwargs",
    [{"repeats": 0, "warmup": 0}, {"repeats": 1, "warmup": -1}, {"repeats": 1.5, "warmup": 0}],
)
def test_measure_rejects_bad_counts(kwargs):
    with pytest.raises(ValueError, match="repeats|warmup"):
        measure(lambda: None, **kwargs)
