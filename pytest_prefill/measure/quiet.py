"""The quiet-machine discipline, in one place: the probe (how much CPU other processes used, and
how much a fixed workload's timings jittered, just before timing), waiting for a quiet machine
(:func:`settle`), and a virtual machine's host steal around a timed run (:class:`QuietHost`).
Every reading of ``/proc/stat`` is :func:`cpu_line`'s.

The host's CPU steal around a timed run, and runs kept to a quiet host.

On a virtual machine the hypervisor runs other guests on the same cores; the time it takes
from ours is counted as *steal* (the eighth field of ``/proc/stat``'s ``cpu`` line). On this
project's 2-vCPU VM it came in bursts of 5-20% of all CPU time lasting tens of seconds, with
quiet stretches between, and a `transformers serve` probe's speed followed it (probes at
0.2-0.9% steal ran at x0.82-0.90 the calibration's cost, a load check at 4.5% at x1.10): a 30%
swing in the server's speed, where the goal is a knee within 10%. A timing taken while another guest runs is no more a figure than one taken while a
test suite runs beside it.

So a :class:`QuietHost` waits, before each run, for a window in which the host stole at most
half its limit, runs, and redoes a run during which it stole more than the limit (a bounded
number of times, each attempt's steal kept); every run carries a :class:`HostSteal` saying
what the host took. Where ``/proc/stat`` cannot be read (not Linux) it waits for nothing, and
says so. On bare metal the steal is 0 and nothing is waited for or redone. Standard library
only."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

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


STAT = "/proc/stat"
STEAL_FIELD = 7  # user nice system idle iowait irq softirq *steal* guest guest_nice


def cpu_line(path: str = STAT) -> tuple[int, ...] | None:
    """The ``cpu`` line of ``path``: all CPUs' ticks by kind since boot (None where it cannot
    be read, as off Linux)."""
    try:
        with open(path, encoding="ascii") as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    try:
        return tuple(int(x) for x in first[1:])
    except ValueError:
        return None


def _busy_jiffies() -> float | None:
    """CPU time every process has used since boot, in clock ticks (None off Linux)."""
    line = cpu_line()
    if not line or len(line) < 4:
        return None
    values = list(line)
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


Run = TypeVar("Run")


def cpu_times(path: str = STAT) -> tuple[int, ...] | None:
    """The ``cpu`` line of ``path`` (:func:`cpu_line`), or None where it cannot be read or has
    no steal field."""
    line = cpu_line(path)
    return line if line is not None and len(line) > STEAL_FIELD else None


def steal_between(before: tuple[int, ...] | None, after: tuple[int, ...] | None) -> float | None:
    """The fraction of all CPUs' time the host stole between two :func:`cpu_times` readings
    (None: either unread, or no tick passed between them). Guest time, which Linux counts
    inside user time too, is left out of the total."""
    if before is None or after is None:
        return None
    ticks = [b - a for a, b in zip(before, after)][: STEAL_FIELD + 1]
    total = sum(ticks)
    if total <= 0:
        return None
    return max(ticks[STEAL_FIELD], 0) / total


@dataclasses.dataclass(frozen=True)
class HostSteal:
    """What the host took during one run: ``steal``, the fraction of all CPUs' time (None:
    not readable here); ``waited``, seconds waited for a quiet host before it; ``quiet``,
    whether that wait found one (False: it gave up after the longest wait); ``redone``, the
    steal of the attempts before it, discarded for stealing more than ``limit``."""

    steal: float | None
    limit: float
    waited: float = 0.0
    quiet: bool = True
    redone: tuple[float, ...] = ()

    @property
    def over(self) -> bool:
        """The run kept stole more than the limit (every attempt did)."""
        return self.steal is not None and self.steal > self.limit

    def text(self) -> str:
        """A table cell: ``0.4%``, ``0.4% (redone: 3.3%)``, ``3.1% > 2%`` or ``-``."""
        if self.steal is None:
            return "-"
        cell = f"{self.steal:.1%}"
        if self.over:
            cell += f" > {self.limit:.1%}"
        if self.redone:
            cell += " (redone: " + ", ".join(f"{s:.1%}" for s in self.redone) + ")"
        if not self.quiet:
            cell += f", after {self.waited:.0f} s not quiet"
        return cell

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "redone": list(self.redone), "over": self.over}

    @classmethod
    def from_dict(cls, data: Any) -> HostSteal:
        """Raises: ValueError naming the field, for anything but the steal :meth:`to_dict`
        wrote (a fraction from 0 to 1, a limit and a wait that are finite and not below 0)."""
        if not isinstance(data, Mapping):
            raise ValueError(f"host: must be an object, got {type(data).__name__}")
        if "steal" not in data or "limit" not in data:
            raise ValueError("host: must hold 'steal' and 'limit'")
        redone = data.get("redone") or []
        if not isinstance(redone, list):
            raise ValueError(f"host.redone: must be a list of fractions, got {redone!r:.60}")
        steal = data["steal"]
        return cls(
            None if steal is None else _share(steal, "steal", 1.0),
            _share(data["limit"], "limit"),
            _share(data.get("waited", 0.0), "waited"),
            _flag(data.get("quiet", True), "quiet"),
            tuple(_share(s, f"redone[{i}]", 1.0) for i, s in enumerate(redone)),
        )


def _share(value: Any, field: str, most: float = math.inf) -> float:
    """A number of a host document: finite, from 0 to ``most``."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and 0 <= value <= most):
        bound = "finite" if most == math.inf else f"at most {most:g}"
        raise ValueError(
            f"host.{field}: must be a number, at least 0 and {bound}, got {value!r:.60}"
        )
    return float(value)


def _flag(value: Any, field: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"host.{field}: must be true or false, got {value!r:.60}")
    return value


@dataclasses.dataclass(frozen=True)
class QuietHost:
    """Runs kept to a quiet host: before each, windows of ``window`` seconds until one in
    which the host stole at most half of ``max_steal`` (at most ``max_wait`` seconds); a run
    during which it stole more than ``max_steal`` is redone, at most ``redo`` times (the last
    attempt is kept, marked). ``read`` and ``sleep`` are the clock's and ``/proc/stat``'s
    stand-ins in tests.

    Raises:
        ValueError: naming a field outside its range.
    """

    max_steal: float = 0.02
    max_wait: float = 120.0
    redo: int = 2
    window: float = 5.0
    read: Callable[[], tuple[int, ...] | None] = cpu_times
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def __post_init__(self) -> None:
        def number(value: Any) -> bool:
            return isinstance(value, (int, float)) and not isinstance(value, bool)

        if not (number(self.max_steal) and 0 < self.max_steal < 1):
            raise ValueError(f"max_steal must be a fraction in (0, 1), got {self.max_steal!r}")
        if not (number(self.max_wait) and math.isfinite(self.max_wait) and self.max_wait >= 0):
            raise ValueError(f"max_wait must be seconds >= 0, got {self.max_wait!r}")
        if isinstance(self.redo, bool) or not isinstance(self.redo, int) or self.redo < 0:
            raise ValueError(f"redo must be an integer >= 0, got {self.redo!r}")
        if not (number(self.window) and math.isfinite(self.window) and self.window > 0):
            raise ValueError(f"window must be seconds > 0, got {self.window!r}")

    def sentence(self) -> str:
        readable = self.read() is not None
        head = (
            f"each probe and load-check run waits for {self.window:g} s in which the host "
            f"stole at most {self.max_steal / 2:.1%} of the CPU (at most {self.max_wait:g} s) "
            f"and is redone, up to {self.redo} times, if it stole more than {self.max_steal:.1%} "
            "during it (a VM's host running other guests: /proc/stat's steal)"
        )
        return head if readable else head + "; this host has no /proc/stat: nothing is waited for"

    async def _wait(self) -> tuple[float, bool]:
        """Seconds waited until a quiet window, and whether one came."""
        waited = 0.0
        while True:
            before = self.read()
            if before is None:
                return waited, True
            await self.sleep(self.window)
            waited += self.window
            steal = steal_between(before, self.read())
            if steal is None or steal <= self.max_steal / 2:
                return waited, True
            if waited >= self.max_wait:
                return waited, False

    async def run(
        self,
        measure: Callable[[int], Awaitable[Run]],
        *,
        what: str = "run",
        progress: Callable[[str], object] | None = None,
    ) -> tuple[Run, HostSteal]:
        """``measure(attempt)`` (attempt 0, 1, …: a fresh salt each, so no cache carries
        over) on a quiet host, redone while the host stole more than the limit during it."""
        redone: list[float] = []
        while True:
            waited, quiet = await self._wait()
            before = self.read()
            result = await measure(len(redone))
            steal = steal_between(before, self.read())
            if steal is None or steal <= self.max_steal or len(redone) >= self.redo:
                return result, HostSteal(steal, self.max_steal, waited, quiet, tuple(redone))
            redone.append(steal)
            if progress is not None:
                progress(
                    f"{what}: the host stole {steal:.1%} of the CPU during it (more than "
                    f"{self.max_steal:.1%}): redone"
                )


async def quietly(
    quiet: QuietHost | None,
    measure: Callable[[int], Awaitable[Run]],
    what: str,
    progress: Callable[[str], object] | None = None,
) -> tuple[Run, HostSteal | None]:
    """``quiet.run(measure)``, or ``measure(0)`` once with nothing watched when ``quiet`` is
    None."""
    if quiet is None:
        return await measure(0), None
    return await quiet.run(measure, what=what, progress=progress)
