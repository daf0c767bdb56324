"""Measurement discipline in one place: how many repeats after how much warmup, and the median
of the repeats with its spread and pyperf-style stability warnings. Standard library only;
nothing here knows about models. (The straight-line fit is :mod:`.line_fit`; the quiet-machine
probe :mod:`.quiet`.)"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from pytest_prefill.sim import check_int

# Every measuring entry point's defaults (the plugin's and the commands' too): timed calls per
# measurement, and untimed calls before them.
DEFAULT_REPEATS = 10
DEFAULT_WARMUP = 3


# A measurement is flagged (pyperf's spirit: shown beside the figure, never hidden) when its
# interquartile range exceeds this fraction of the median, or its [min, max] range exceeds
# UNSTABLE_RANGE of it, or it holds fewer than MIN_SAMPLES samples.
UNSTABLE_IQR = 0.10
UNSTABLE_RANGE = 0.50
MIN_SAMPLES = 3


def finite(field: str, value: Any) -> float:
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
    host: tuple[float, ...] = ()

    @classmethod
    def from_samples(
        cls, samples: Sequence[float], *, warmup: int = 0, host: Sequence[float] = ()
    ) -> Measurement:
        """Summarize ``samples`` (seconds, each finite and >= 0). ``host``: per sample, the
        seconds the host took to enqueue the work (the call's return, before the device was
        waited for); empty when not recorded.

        Raises:
            ValueError: for no samples, a negative, NaN or infinite sample or host time, or
                host times that do not pair with the samples.
        """
        import numpy as np

        if len(samples) == 0:
            raise ValueError("samples must hold at least one timing")
        values = tuple(finite("sample", s) for s in samples)
        if min(values) < 0:
            raise ValueError(f"samples must be >= 0 seconds, got {min(values)!r}")
        enqueue = tuple(finite("host time", h) for h in host)
        if enqueue and (len(enqueue) != len(values) or min(enqueue) < 0):
            raise ValueError(
                f"host times must be one per sample ({len(values)}), each >= 0 seconds"
            )
        q1, median, q3 = np.percentile(np.asarray(values, dtype=float), [25, 50, 75]).tolist()
        return cls(values, median, min(values), max(values), q1, q3, warmup, enqueue)

    @property
    def host_share(self) -> float | None:
        """The host's share of a timed call: the median of each sample's enqueue time over its
        synchronized wall time, at most 1 (None when not recorded). Near 1 the device waited
        on the host: the call is bound by Python dispatch, not by the device."""
        if not self.host:
            return None
        return statistics.median(
            min(1.0, h / s) if s > 0 else 1.0 for h, s in zip(self.host, self.samples)
        )

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
            **(
                {"host_share": self.host_share, "host_samples": list(self.host)}
                if self.host
                else {}
            ),
        }

    @classmethod
    def from_dict(cls, data: Any) -> Measurement:
        if not isinstance(data, dict) or not isinstance(data.get("samples"), list):
            raise ValueError(f"a measurement must be an object with 'samples', got {data!r:.80}")
        warmup = data.get("warmup", 0)
        host = data.get("host_samples", [])
        if not isinstance(host, list):
            raise ValueError(f"a measurement's host_samples must be a list, got {host!r:.80}")
        return cls.from_samples(
            data["samples"], warmup=check_int("warmup", warmup, minimum=0), host=host
        )


def perf_counter_timer(fn: Callable[[], object], sync: Callable[[], object] | None = None) -> float:
    """Seconds one call of ``fn`` takes by the wall clock, synchronized before and after."""
    return wall_and_host_timer(fn, sync)[0]


def wall_and_host_timer(
    fn: Callable[[], object], sync: Callable[[], object] | None = None
) -> tuple[float, float]:
    """One call of ``fn``: (seconds by the wall clock, synchronized before and after; seconds
    until ``fn`` returned, before the device is waited for -- the host's enqueue time)."""
    if sync is not None:
        sync()
    start = time.perf_counter()
    fn()
    enqueued = time.perf_counter()
    if sync is not None:
        sync()
    return time.perf_counter() - start, enqueued - start


Timer = Callable[[Callable[[], object]], "float | tuple[float, float]"]


def measure(
    fn: Callable[[], object],
    *,
    repeats: int,
    warmup: int,
    sync: Callable[[], object] | None = None,
    setup: Callable[[], object] | None = None,
    timer: Timer | None = None,
) -> Measurement:
    """Call ``fn`` ``warmup`` times untimed, then ``repeats`` times timed.

    Args:
        fn: the operation; its result is discarded.
        repeats: timed calls (>= 1).
        warmup: untimed calls first (>= 0).
        sync: waits for the device (e.g. ``torch.cuda.synchronize``); called around each timed
            call by the default wall-clock timer.
        setup: called before every call, untimed (e.g. to reset a cache to its length).
        timer: runs ``fn`` once and returns its seconds (e.g. CUDA events), or (seconds, the
            host's enqueue seconds); default :func:`wall_and_host_timer` with ``sync``. The
            host times, when given, make the measurement's ``host_share``.

    Raises:
        ValueError: for repeats < 1 or warmup < 0.
    """
    check_int("repeats", repeats, minimum=1)
    check_int("warmup", warmup, minimum=0)

    def timed(call: Callable[[], object]) -> float | tuple[float, float]:
        return timer(call) if timer is not None else wall_and_host_timer(call, sync)

    for _ in range(warmup):
        if setup is not None:
            setup()
        fn()
    if sync is not None:
        sync()
    samples: list[float] = []
    host: list[float] = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        taken = timed(fn)
        if isinstance(taken, tuple):
            samples.append(taken[0])
            host.append(taken[1])
        else:
            samples.append(taken)
    return Measurement.from_samples(
        samples, warmup=warmup, host=host if len(host) == len(samples) else ()
    )
