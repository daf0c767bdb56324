"""Measurement discipline in one place: the median of repeats after warmup with its spread and
pyperf-style stability warnings, and a straight-line fit that refuses what the noise cannot
support. numpy only; nothing here knows about models."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from pytest_prefill.sim import check_int

# A measurement is flagged (pyperf's spirit: shown beside the figure, never hidden) when its
# interquartile range exceeds this fraction of the median, or its [min, max] range exceeds
# UNSTABLE_RANGE of it, or it holds fewer than MIN_SAMPLES samples.
UNSTABLE_IQR = 0.10
UNSTABLE_RANGE = 0.50
MIN_SAMPLES = 3

# A fitted slope is kept only when the effect it predicts across the measured range is more than
# CLEARLY times the measurements' own scatter, and (with 3 or more points) more than
# SIGNIFICANT standard errors from zero.
CLEARLY = 3.0
SIGNIFICANT = 2.0
UNSUPPORTED = ("negative", "flat", "near zero")


def unsupported(
    value: float,
    stderr: float,
    effect: float,
    scatter: float,
    *,
    nonnegative: bool = True,
    test_stderr: bool = True,
) -> str | None:
    """The one rule for refusing a fitted term: why the noise cannot support ``value`` — one of
    :data:`UNSUPPORTED` — or None when it is kept. ``effect`` is what the term contributes
    across the measured range and ``scatter`` the measurements' own scatter, in the same unit:
    a term whose effect is not more than ``CLEARLY`` times the scatter is "flat"; with
    ``test_stderr`` (enough points to have one), a value within ``SIGNIFICANT`` standard errors
    of zero is "near zero"; with ``nonnegative``, a negative value is "negative"."""
    if nonnegative and value < 0:
        return "negative"
    if effect <= CLEARLY * scatter:
        return "flat"
    if test_stderr and abs(value) <= SIGNIFICANT * stderr:
        return "near zero"
    return None


def _finite(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{field} must be a finite number, got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True, slots=True)
class Measurement:
    """Repeated timings of one operation, in seconds: the median and its spread.

    ``relative_spread`` is IQR / median; ``warning`` is None for a stable measurement, else a
    sentence saying what is wrong with it.
    """

    samples: tuple[float, ...]
    median: float
    minimum: float
    maximum: float
    q1: float
    q3: float
    warmup: int

    @classmethod
    def from_samples(cls, samples: Sequence[float], *, warmup: int = 0) -> Measurement:
        """Summarize ``samples`` (seconds, each finite and >= 0).

        Raises:
            ValueError: for no samples, or a negative, NaN or infinite sample.
        """
        import numpy as np

        if len(samples) == 0:
            raise ValueError("samples must hold at least one timing")
        values = tuple(_finite("sample", s) for s in samples)
        if min(values) < 0:
            raise ValueError(f"samples must be >= 0 seconds, got {min(values)!r}")
        q1, median, q3 = np.percentile(np.asarray(values, dtype=float), [25, 50, 75]).tolist()
        return cls(values, median, min(values), max(values), q1, q3, warmup)

    @property
    def repeats(self) -> int:
        return len(self.samples)

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def relative_spread(self) -> float:
        return self.iqr / self.median if self.median > 0 else 0.0

    @property
    def warning(self) -> str | None:
        problems = []
        if self.repeats < MIN_SAMPLES:
            problems.append(f"only {self.repeats} sample(s): a sample, not a measurement")
        if self.relative_spread > UNSTABLE_IQR:
            problems.append(f"unstable: the IQR is {self.relative_spread:.0%} of the median")
        if self.median > 0 and (self.maximum - self.minimum) / self.median > UNSTABLE_RANGE:
            problems.append(
                f"outliers: [min, max] spans {(self.maximum - self.minimum) / self.median:.0%} "
                "of the median"
            )
        return "; ".join(problems) or None

    def to_dict(self) -> dict[str, Any]:
        return {
            "median": self.median,
            "min": self.minimum,
            "max": self.maximum,
            "q1": self.q1,
            "q3": self.q3,
            "iqr": self.iqr,
            "relative_spread": self.relative_spread,
            "repeats": self.repeats,
            "warmup": self.warmup,
            "warning": self.warning,
            "samples": list(self.samples),
        }

    @classmethod
    def from_dict(cls, data: Any) -> Measurement:
        if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
            raise ValueError(f"a measurement must be an object with 'samples', got {data!r:.80}")
        warmup = data.get("warmup", 0)
        return cls.from_samples(data["samples"], warmup=check_int("warmup", warmup, minimum=0))


def perf_counter_timer(fn: Callable[[], object], sync: Callable[[], object] | None = None) -> float:
    """Seconds one call of ``fn`` takes by the wall clock, synchronized before and after."""
    if sync is not None:
        sync()
    start = time.perf_counter()
    fn()
    if sync is not None:
        sync()
    return time.perf_counter() - start


def measure(
    fn: Callable[[], object],
    *,
    repeats: int,
    warmup: int,
    sync: Callable[[], object] | None = None,
    setup: Callable[[], object] | None = None,
    timer: Callable[[Callable[[], object]], float] | None = None,
) -> Measurement:
    """Call ``fn`` ``warmup`` times untimed, then ``repeats`` times timed.

    Args:
        fn: the operation; its result is discarded.
        repeats: timed calls (>= 1).
        warmup: untimed calls first (>= 0).
        sync: waits for the device (e.g. ``torch.cuda.synchronize``); called around each timed
            call by the default wall-clock timer.
        setup: called before every call, untimed (e.g. to reset a cache to its length).
        timer: runs ``fn`` once and returns its seconds (e.g. CUDA events); default: the wall
            clock with ``sync`` around the call.

    Raises:
        ValueError: for repeats < 1 or warmup < 0.
    """
    check_int("repeats", repeats, minimum=1)
    check_int("warmup", warmup, minimum=0)

    def timed(call: Callable[[], object]) -> float:
        return timer(call) if timer is not None else perf_counter_timer(call, sync)

    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    if sync is not None:
        sync()
    samples: list[float] = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        samples.append(timed(fn))
    return Measurement.from_samples(samples, warmup=warmup)


@dataclasses.dataclass(frozen=True, slots=True)
class Fit:
    """``y = intercept + slope * x`` by least squares, and whether the slope is believed.

    ``refused`` is True when the slope is noise or impossible; ``reason`` says why, with the
    numbers. ``recorded_slope`` is 0 for a refused slope, and ``level`` the constant to use
    with it: the intercept when the slope is kept, the mean of the ys when it is refused.
    """

    slope: float
    intercept: float
    slope_stderr: float
    intercept_stderr: float
    points: int
    x_range: float
    effect: float
    scatter: float
    mean_y: float
    refused: bool
    reason: str

    @property
    def recorded_slope(self) -> float:
        return 0.0 if self.refused else self.slope

    @property
    def level(self) -> float:
        return self.mean_y if self.refused else self.intercept

    def to_dict(self) -> dict[str, Any]:
        return {
            "slope": self.slope,
            "intercept": self.intercept,
            "slope_stderr": self.slope_stderr,
            "intercept_stderr": self.intercept_stderr,
            "points": self.points,
            "x_range": self.x_range,
            "effect": self.effect,
            "scatter": self.scatter,
            "mean_y": self.mean_y,
            "refused": self.refused,
            "reason": self.reason,
        }


def fit_line(
    xs: Sequence[float],
    ys: Sequence[float],
    spreads: Sequence[float] | None = None,
    *,
    nonnegative: bool = True,
    unit: str = "",
    x_unit: str = "unit of x",
) -> Fit:
    """Fit a line to (xs, ys) and refuse a slope the measurements cannot support.

    The effect is ``|slope| * (max(xs) - min(xs))``: how much the fitted cost changes across
    the measured range. The scatter is the larger of the points' typical spread (the median of
    ``spreads``, e.g. each point's IQR) and the residual standard deviation of the fit. The
    slope is refused when the effect is not more than ``CLEARLY`` times the scatter, when
    (with 3+ points) it is within ``SIGNIFICANT`` standard errors of zero, or when it is
    negative and ``nonnegative`` (a cost cannot fall as work grows).

    Args:
        xs, ys: at least two points, two or more distinct xs; finite numbers.
        spreads: optional per-point scatter (>= 0), same length as ``xs``.
        nonnegative: refuse negative slopes.
        unit: how to print a y value in the reason (``"ms"`` multiplies seconds by 1e3).
        x_unit: what one unit of x is, for the reason (e.g. ``"cached token"``).

    Raises:
        ValueError: for mismatched lengths, fewer than two distinct xs, or non-finite input.
    """
    import numpy as np

    x, y, spread_values = _line_input(xs, ys, spreads)
    n = len(x)
    x_mean, y_mean = float(x.mean()), float(y.mean())
    sxx = float(((x - x_mean) ** 2).sum())
    slope = float(((x - x_mean) * (y - y_mean)).sum() / sxx)
    intercept = y_mean - slope * x_mean
    residuals = y - (intercept + slope * x)
    if n > 2:
        residual_sd = math.sqrt(float((residuals**2).sum()) / (n - 2))
        slope_stderr = residual_sd / math.sqrt(sxx)
        intercept_stderr = residual_sd * math.sqrt(1.0 / n + x_mean**2 / sxx)
    else:
        residual_sd = slope_stderr = intercept_stderr = 0.0
    typical_spread = float(np.median(spread_values)) if spread_values else 0.0
    scatter = max(typical_spread, residual_sd)
    x_range = float(x.max() - x.min())
    effect = abs(slope) * x_range
    reason = _line_refusal(
        slope, slope_stderr, effect, scatter, (float(x.min()), float(x.max()), n),
        nonnegative=nonnegative, unit=unit, x_unit=x_unit,
    )  # fmt: skip
    return Fit(
        slope=slope,
        intercept=intercept,
        slope_stderr=slope_stderr,
        intercept_stderr=intercept_stderr,
        points=n,
        x_range=x_range,
        effect=effect,
        scatter=scatter,
        mean_y=y_mean,
        refused=bool(reason),
        reason=reason,
    )


def _line_input(
    xs: Sequence[float], ys: Sequence[float], spreads: Sequence[float] | None
) -> tuple[Any, Any, list[float]]:
    """``fit_line``'s points as arrays, checked (ValueError naming what is wrong)."""
    import numpy as np

    if len(xs) != len(ys):
        raise ValueError(f"xs and ys must have the same length, got {len(xs)} and {len(ys)}")
    x = np.array([_finite("x", v) for v in xs], dtype=float)
    y = np.array([_finite("y", v) for v in ys], dtype=float)
    if len(set(x.tolist())) < 2:
        raise ValueError(f"fit_line needs at least two distinct xs, got {list(xs)!r}")
    spread_values: list[float] = []
    if spreads is not None:
        if len(spreads) != len(xs):
            raise ValueError(
                f"spreads must have one value per point, got {len(spreads)} for {len(xs)}"
            )
        spread_values = [_finite("spread", s) for s in spreads]
        if min(spread_values) < 0:
            raise ValueError(f"spreads must be >= 0, got {min(spread_values)!r}")
    return x, y, spread_values


def _line_refusal(
    slope: float,
    slope_stderr: float,
    effect: float,
    scatter: float,
    span: tuple[float, float, int],
    *,
    nonnegative: bool,
    unit: str,
    x_unit: str,
) -> str:
    """Why ``fit_line`` refuses the slope ('' when it keeps it); ``span`` is (min x, max x,
    points)."""
    scale = 1e3 if unit == "ms" else 1.0

    def show(value: float) -> str:
        return f"{value * scale:.4g}{' ' + unit if unit else ''}"

    low, high, n = span
    why = unsupported(
        slope, slope_stderr, effect, scatter, nonnegative=nonnegative, test_stderr=n > 2
    )
    if why == "negative":
        return (
            f"negative slope ({slope * scale:.3g} {unit + ' ' if unit else ''}per {x_unit}) for a "
            "cost that cannot fall as work grows"
        )
    if why == "flat":
        return (
            f"flat within noise: the effect across x = {low:g}..{high:g} is "
            f"{show(effect)}, not more than {CLEARLY:g}x the scatter {show(scatter)}"
        )
    if why == "near zero":
        return (
            f"slope {slope * scale:.3g} is within {SIGNIFICANT:g} standard errors "
            f"({slope_stderr * scale:.3g}) of zero"
        )
    return ""


def fit_from_dict(data: Any) -> Fit:
    """Inverse of :meth:`Fit.to_dict`; ValueError for a missing or mistyped field."""
    if not isinstance(data, dict):
        raise ValueError(f"a fit must be a JSON object, got {type(data).__name__}")
    names = [f.name for f in dataclasses.fields(Fit)]
    missing = [name for name in names if name not in data]
    if missing:
        raise ValueError(f"fit is missing field(s) {missing}")
    values: dict[str, Any] = {}
    for name in names:
        if name == "refused":
            if not isinstance(data[name], bool):
                raise ValueError(f"fit field 'refused' must be true or false, got {data[name]!r}")
            values[name] = data[name]
        elif name == "reason":
            values[name] = str(data[name])
        elif name == "points":
            values[name] = check_int("points", data[name], minimum=2)
        else:
            values[name] = _finite(f"fit field {name!r}", data[name])
    return Fit(**values)


# The quiet-machine probe: a machine is quiet when, while the probe ran, other processes used
# at most QUIET_OTHER_CORES cores' worth of CPU time and a fixed workload's timings had a
# relative IQR of at most QUIET_JITTER.
QUIET_OTHER_CORES = 0.25
QUIET_JITTER = 0.05
PROBE_SECONDS = 1.0


@dataclasses.dataclass(frozen=True, slots=True)
class Quietness:
    """How quiet the machine was just before timing: ``other_cores`` is the CPU time other
    processes used during the probe, in cores (None where /proc/stat cannot be read);
    ``jitter`` the relative IQR of a fixed workload timed over and over meanwhile; ``cores``
    the CPUs the machine has; ``seconds`` how long the probe ran."""

    other_cores: float | None
    jitter: float
    cores: int
    seconds: float

    @property
    def quiet(self) -> bool:
        busy = self.other_cores is not None and self.other_cores > QUIET_OTHER_CORES
        return not busy and self.jitter <= QUIET_JITTER

    @property
    def warning(self) -> str | None:
        """A loud sentence for a busy machine (None when quiet)."""
        if self.quiet:
            return None
        parts = []
        if self.other_cores is not None and self.other_cores > QUIET_OTHER_CORES:
            parts.append(
                f"other processes used {self.other_cores:.2f} of {self.cores} cores "
                f"(quiet: <= {QUIET_OTHER_CORES:g})"
            )
        if self.jitter > QUIET_JITTER:
            parts.append(
                f"a fixed workload's timings varied by {self.jitter:.0%} IQR "
                f"(quiet: <= {QUIET_JITTER:.0%})"
            )
        return (
            "BUSY MACHINE: "
            + "; ".join(parts)
            + ". Figures taken now describe a shared machine, not this hardware: measure "
            "again when it is quiet."
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "other_cores": self.other_cores,
            "jitter": self.jitter,
            "cores": self.cores,
            "seconds": self.seconds,
            "quiet": self.quiet,
            "warning": self.warning,
        }


def _busy_jiffies() -> float | None:
    """CPU time every process has used since boot, in clock ticks (None off Linux)."""
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            fields = handle.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    values = [int(v) for v in fields[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    guest = sum(values[8:10]) if len(values) > 9 else 0  # already counted in user and nice
    return float(sum(values) - idle - guest)


def _own_jiffies() -> float:
    """CPU time this process has used, in clock ticks."""
    import os

    times = os.times()
    return (times.user + times.system) * os.sysconf("SC_CLK_TCK")


def _workload() -> None:
    total = 0
    for i in range(20_000):
        total += i * i
    if total < 0:  # never: keeps the loop from being optimised away
        raise AssertionError


def quiet_probe(
    seconds: float = PROBE_SECONDS,
    *,
    busy: Callable[[], float | None] = _busy_jiffies,
    own: Callable[[], float] = _own_jiffies,
    workload: Callable[[], object] = _workload,
    ticks_per_second: float | None = None,
) -> Quietness:
    """Probe how quiet the machine is for ``seconds``: time a fixed workload over and over,
    and count the CPU time other processes used meanwhile (``busy`` - ``own`` ticks).

    Raises:
        ValueError: for seconds <= 0 or not finite.
    """
    import os

    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"seconds must be a finite number > 0, got {seconds!r}")
    ticks = ticks_per_second or float(os.sysconf("SC_CLK_TCK"))
    busy_before, own_before = busy(), own()
    start = time.perf_counter()
    samples: list[float] = []
    while time.perf_counter() - start < seconds or len(samples) < MIN_SAMPLES:
        samples.append(perf_counter_timer(workload))
    elapsed = time.perf_counter() - start
    busy_after, own_after = busy(), own()
    other = None
    if busy_before is not None and busy_after is not None:
        used = (busy_after - busy_before) - (own_after - own_before)
        other = max(0.0, used / ticks / elapsed)
    jitter = Measurement.from_samples(samples).relative_spread
    return Quietness(other, jitter, os.cpu_count() or 1, elapsed)


SETTLE_SECONDS = 5.0


def settle(
    limit: float = SETTLE_SECONDS, probe: Callable[[], Quietness] | None = None
) -> Quietness:
    """Probe until the machine is quiet or ``limit`` seconds have passed; the last probe. A
    probe right after loading a model often sees the kernel still paging the weights in (CPU
    time that is not ours): a few seconds' wait settles that, and a machine that stays busy is
    reported busy.

    Raises:
        ValueError: for a limit that is not a finite number >= 0.
    """
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 <= limit < math.inf:
        raise ValueError(f"limit must be a finite number of seconds >= 0, got {limit!r}")
    run = probe or quiet_probe
    start = time.perf_counter()
    while True:
        quiet = run()
        if quiet.quiet or time.perf_counter() - start >= limit:
            return quiet
