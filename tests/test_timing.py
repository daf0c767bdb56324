"""Timing primitives: a measurement's statistics and warnings, the measure loop, and fit_line's
recoveries and refusals. Synthetic data only: nothing here times anything that matters."""

from __future__ import annotations

import math

import pytest

np = pytest.importorskip("numpy")

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pytest_prefill.measure.line_fit import CLEARLY, Fit, fit_from_dict, fit_line  # noqa: E402
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


def test_the_quiet_probe_counts_what_other_processes_used():
    from pytest_prefill.measure.quiet import QUIET_OTHER_CORES, quiet_probe

    ticks = iter([1000.0, 1000.0 + 150.0])  # 150 ticks of everyone's CPU time
    own = iter([10.0, 10.0 + 20.0])  # 20 of them ours

    quiet = quiet_probe(
        0.01, busy=lambda: next(ticks), own=lambda: next(own), ticks_per_second=100.0
    )
    # others used 130 ticks = 1.3 s of CPU over the probe's (short) wall time: busy
    assert quiet.other_cores is not None and quiet.other_cores > QUIET_OTHER_CORES
    assert not quiet.quiet and "BUSY MACHINE" in (quiet.warning or "")
    assert quiet.to_dict()["quiet"] is False


def test_the_quiet_probe_without_proc_stat_judges_by_jitter_alone():
    from pytest_prefill.measure.quiet import quiet_probe

    quiet = quiet_probe(0.01, busy=lambda: None, own=lambda: 0.0, workload=lambda: None)
    assert quiet.other_cores is None and quiet.seconds > 0
    assert quiet.quiet == (quiet.jitter <= 0.05)


@pytest.mark.parametrize("seconds", [0, -1, math.inf, math.nan, "1"])
def test_the_quiet_probe_refuses_a_bad_duration(seconds):
    from pytest_prefill.measure.quiet import quiet_probe

    with pytest.raises(ValueError, match="seconds"):
        quiet_probe(seconds)


def test_settle_probes_until_quiet_or_the_limit():
    from pytest_prefill.measure.quiet import Quietness, settle

    busy = Quietness(other_cores=1.0, jitter=0.01, cores=2, seconds=0.0)
    quiet = Quietness(other_cores=0.0, jitter=0.01, cores=2, seconds=0.0)
    answers = iter([busy, busy, quiet, busy])
    assert settle(10.0, probe=lambda: next(answers)) is quiet
    assert settle(0.0, probe=lambda: busy) is busy  # no time to wait: the first probe
    with pytest.raises(ValueError, match="limit"):
        settle(-1.0)


def test_one_rule_refuses_a_term_for_each_reason_in_order():
    from pytest_prefill.measure.line_fit import CLEARLY, SIGNIFICANT, unsupported

    assert unsupported(-1.0, 0.1, 10.0, 1.0) == "negative"
    assert unsupported(-1.0, 0.1, 10.0, 1.0, nonnegative=False) is None
    assert unsupported(1.0, 0.1, CLEARLY * 1.0, 1.0) == "flat"  # not MORE than CLEARLY x
    assert unsupported(1.0, 1.0 / SIGNIFICANT, 10.0, 1.0) == "near zero"
    assert unsupported(1.0, 1.0 / SIGNIFICANT, 10.0, 1.0, test_stderr=False) is None
    assert unsupported(1.0, 0.1, 10.0, 1.0) is None
