"""The quiet-machine probe: how much CPU other processes used, and how much a fixed workload's
timings jittered, just before timing; and waiting for a quiet machine (:func:`settle`).
Standard library only."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

from pytest_prefill.measure.timing import MIN_SAMPLES, Measurement, perf_counter_timer

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
