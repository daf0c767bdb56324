"""How long a probe is and what it sends: the probe rule (:class:`ProbeRule`) and
:func:`probe_load`.

How long a probe is, three rules, the longest wins (``verify.knee_sizing`` applies them).
(1) Attainment measured over n requests has a binomial standard error ``sqrt(a (1 - a) / n)``;
at the target ``t`` this is at most the decision margin ``m`` when ``n >= t (1 - t) / m**2``
(t = 0.9, m = 0.05: 36 requests). (2) A rate ``within`` (the goal, 10%) above what the server
sustains builds its queue by ``within`` seconds a second, so a probe must keep arriving for
``bound / within`` seconds (``bound``: the SLO's TTFT, else E2EL) before that overload can show
as missed bounds: ``R x bound / within`` requests at the predicted rate ``R``. (3) The knee is
decisive: on the probe's own requests the simulator predicts attainment at ``R x (1 +
within)`` at least ``m`` below the target, so that an overload the size of the goal shows on
the server as a clear miss and not as a point or two on a flat stretch (a window that ends in a
burst is flat: how much of one burst the server absorbs). Rule 3 lengthens the probe step by
step while a probe's arrivals at ``R`` last at most ``max_seconds``; where that cap binds the
knee is not decisive by the rule, and the run says so. Every probe of a flag set sends the
same requests of the workload, the first after ``start``, which is also what the prediction
simulates. Standard library only.

What is verified: a flag set (:class:`FlagSet`), what a server is started with, the engine's
token budget and sequence cap."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

from pytest_prefill.plan.metrics import SLO
from pytest_prefill.plan.workloads import arrival_rate
from pytest_prefill.sim import Request, in_arrival_order
from pytest_prefill.sim.checks import check_int
from pytest_prefill.verify.fields import Fields, written

MIN_MARGIN = 0.001  # at most 250,000 requests a probe (target 0.5)


def _fraction(field: str, value: Any, low: float, high: float) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and low < value < high):
        raise ValueError(f"{field} must be a number in ({low:g}, {high:g}), got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class ProbeRule:
    """How the measured knee is searched: the attainment ``target``; the decision ``margin``
    (each probe is long enough that attainment's standard error at the target is at most
    this); stop when the highest pass and the lowest miss are within ``tolerance`` (relative);
    at most ``max_probes`` probes; rates stepped by ``step`` until the knee is bracketed;
    ``sustained``: probes also long enough for an overload of ``within`` to build a queue and
    to show (the module's rules 2 and 3); ``within``: the goal the predicted knee is judged
    against (±); ``max_seconds``: rule 3 lengthens a probe only while its arrivals at the
    predicted knee last at most this; ``start``: probes skip the workload's first ``start``
    requests.

    Raises:
        ValueError: naming the field, for a target or margin outside (0, 1), a tolerance,
            step, within or max_seconds that is not > 0 (step > 1), fewer than 2 probes, or a
            start below 0.
    """

    target: float = 0.9
    margin: float = 0.05
    tolerance: float = 0.05
    max_probes: int = 7
    step: float = 1.2
    min_requests: int = 8
    sustained: bool = True
    within: float = 0.10
    max_seconds: float = 45.0
    start: int = 0

    def __post_init__(self) -> None:
        _fraction("target", self.target, 0.0, 1.0)
        if _fraction("margin", self.margin, 0.0, 1.0) < MIN_MARGIN:
            raise ValueError(
                f"margin must be at least {MIN_MARGIN:g} (a probe of t(1-t)/margin² requests), "
                f"got {self.margin!r}"
            )
        _fraction("tolerance", self.tolerance, 0.0, 10.0)
        _fraction("step", self.step, 1.0, 100.0)
        _fraction("within", self.within, 0.0, 1.0)
        _fraction("max_seconds", self.max_seconds, 0.0, math.inf)
        for field, least in (("max_probes", 2), ("min_requests", 1), ("start", 0)):
            check_int(field, getattr(self, field), minimum=least)

    @property
    def requests(self) -> int:
        """Requests per probe by rule 1: the fewest whose standard error at the target is
        <= margin."""
        need = self.target * (1 - self.target) / self.margin**2
        return max(self.min_requests, math.ceil(need - 1e-9))

    def requests_at(self, rate: float, slo: SLO) -> int:
        """Requests per probe at ``rate`` req/s: rule 1, or rule 2 when ``sustained`` and
        longer (``rate x bound / within``; no TTFT or E2EL bound: rule 1 alone)."""
        bound = slo.ttft if slo.ttft is not None else slo.e2el
        if not self.sustained or bound is None or not (math.isfinite(rate) and rate > 0):
            return self.requests
        return max(self.requests, math.ceil(rate * bound / self.within - 1e-9))

    def standard_error(self, attainment: float, n: int) -> float:
        return math.sqrt(max(attainment * (1 - attainment), 0.0) / max(n, 1))

    def sentence(self) -> str:
        n = self.requests
        text = (
            f"each probe sends at least {n} requests: the binomial standard error of attainment "
            f"at the target, sqrt({self.target:g} x {1 - self.target:.2g} / {n}) = "
            f"{self.standard_error(self.target, n):.3f}, is at most the margin {self.margin:g}"
        )
        if self.sustained:
            over = f"{self.within:.0%}"
            text += (
                f", arrives for the SLO's TTFT / {self.within:g} at the predicted rate R, so "
                f"that a {over} overload builds a queue of one TTFT bound, and is long enough "
                f"that the simulator, on the same requests, puts attainment at R x {1 + self.within:g} "
                f"at most {self.target - self.margin:.0%} (a {over} overload shows), lengthened "
                f"while a probe lasts at most {self.max_seconds:g} s"
            )
        if self.start:
            text += f"; probes skip the workload's first {self.start} requests"
        return (
            f"{text}; rates step by {self.step:g}x to a bracket, bisected to within "
            f"{self.tolerance:.0%}, then, while the predicted knee's verdict is UNDECIDED, "
            "probed where one probe decides it (past an open interval, again where a higher "
            f"rate met more, or at the ±{self.within:.0%} bound), {self.max_probes} probes "
            f"at most; the predicted knee's goal is within ±{self.within:.0%} of the measured"
        )

    def to_dict(self) -> dict[str, Any]:
        return written(self, requests=self.requests, rule=self.sentence())

    @classmethod
    def from_dict(cls, data: Any, where: str = "probe_rule") -> ProbeRule:
        """The rule :meth:`to_dict` wrote; a field an older document lacks takes its default.

        Raises:
            ValueError: naming the field, for one of the wrong type or out of range.
        """
        fields = Fields(data, where)
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            default = getattr(cls, field.name)
            if isinstance(default, bool):
                values[field.name] = fields.flag(field.name, default)
            elif isinstance(default, int):
                values[field.name] = fields.integer(field.name, default)
            else:
                values[field.name] = fields.number(field.name, default)
        rule: ProbeRule = fields.build(cls, **values)
        return rule


def probe_load(load: Sequence[Request], rule: ProbeRule, count: int | None = None) -> list[Request]:
    """``count`` (default ``rule.requests``, at least that) of ``load`` by arrival, the first
    after ``rule.start``, or all that are left when fewer, their arrivals shifted to begin at 0:
    what every probe sends.

    Raises:
        ValueError: when ``load`` has fewer than ``rule.requests`` after ``rule.start``, or
            their arrivals have no rate to scale.
    """
    count = max(rule.requests, count or 0)
    ordered = in_arrival_order(load)[rule.start : rule.start + count]
    if len(ordered) < rule.requests:
        after = f" after the first {rule.start}" if rule.start else ""
        raise ValueError(
            f"the workload has {len(ordered)} requests{after}; each probe needs "
            f"{rule.requests} (target {rule.target:g}, margin {rule.margin:g}): give a longer "
            "workload, a wider margin or a smaller probe start"
        )
    if not math.isfinite(arrival_rate(ordered)):
        raise ValueError("the workload's first requests arrive at once: no rate to scale")
    origin = ordered[0].arrival
    return (
        [dataclasses.replace(r, arrival=r.arrival - origin) for r in ordered] if origin else ordered
    )


FLAGS = re.compile(r"^tokens=([0-9]{1,12})(?:,seqs=([0-9]{1,12}))?$")  # ASCII digits only


@dataclasses.dataclass(frozen=True)
class FlagSet:
    """What a server is started with: ``budget`` tokens an iteration, decode rows included
    (vLLM ``--max-num-batched-tokens``, ``transformers serve --cb-max-batch-tokens``,
    llama.cpp ``-b``) and the sequence cap ``max_seqs`` (vLLM ``--max-num-seqs``, llama.cpp
    ``-np``; None: the engine's default).

    Raises:
        ValueError: naming the field, for a budget below 2 or a cap below 1.
    """

    budget: int
    max_seqs: int | None = None

    def __post_init__(self) -> None:
        check_int("flag set budget", self.budget, minimum=2)
        if self.max_seqs is not None:
            check_int("flag set max_seqs", self.max_seqs)

    @classmethod
    def parse(cls, text: str) -> FlagSet:
        """``tokens=256`` or ``tokens=256,seqs=8`` (a capacity deployment's settings).

        Raises:
            ValueError: for anything else.
        """
        match = FLAGS.match(str(text).strip())
        if match is None:
            raise ValueError(f"a flag set is tokens=N or tokens=N,seqs=N, got {text!r}")
        seqs = match.group(2)
        return cls(int(match.group(1)), int(seqs) if seqs is not None else None)

    @property
    def label(self) -> str:
        seqs = f", ≤{self.max_seqs} seqs" if self.max_seqs is not None else ""
        return f"≤{self.budget} tok{seqs}"

    def to_dict(self) -> dict[str, Any]:
        return {"budget": self.budget, "max_seqs": self.max_seqs, "label": self.label}

    @classmethod
    def from_dict(cls, fields: Fields) -> FlagSet:
        """Raises: ValueError naming the field, for one missing, of the wrong type or out of
        range."""
        return fields.values_of(cls)
