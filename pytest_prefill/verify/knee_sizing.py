"""How long a probe is: the probe rule's three rules (``verify.knee``) applied to a workload with
the server's calibration, and how sharp the simulator predicts the knee on what is sent.

Rules 1 and 2 give the fewest requests that are long enough for the knee predicted on them (a
longer probe predicts a lower knee, which asks for fewer requests: bisected). Rule 3 then
lengthens the probe by a quarter at a time until the simulator, on the probe's own requests,
predicts attainment at the knee x (1 + within) at least the margin below the target — a knee a
10% overload visibly misses — or until a probe would last longer than ``max_seconds`` at its
predicted knee, or the workload ends; then the knee is not decisive by the rule, and the
result says why. Attainment is not monotone in the length (a window that ends inside a burst
is flat near its knee, one that runs past it is not), so rule 3 walks up from rule 2's length
and keeps the first that is decisive. Standard library only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from pytest_prefill.plan.metrics import SLO
from pytest_prefill.serve.calibration.server_model import ServerModel
from pytest_prefill.sim import Request
from pytest_prefill.verify.fields import Fields, written
from pytest_prefill.verify.knee import Predicted, predict_knee, simulated_attainment
from pytest_prefill.verify.probe_rule import ProbeRule, probe_load

GROWTH = 1.25  # rule 3 lengthens a probe by this factor a step


@dataclasses.dataclass(frozen=True)
class Sharpness:
    """How sharp the simulator predicts the knee at ``rate`` on the probe's ``requests``: its
    attainment at ``rate`` x (1 + ``within``) (``above``) and / (1 + ``within``) (``below``),
    and how long the probe's arrivals last at ``rate`` (``seconds``); ``capped``: why rule 3
    stopped before the knee was decisive (None: it did not)."""

    rate: float
    requests: int
    above: float
    below: float
    target: float
    margin: float
    within: float
    capped: str | None = None

    @property
    def seconds(self) -> float:
        return (self.requests - 1) / self.rate if self.rate > 0 else math.inf

    @property
    def decisive(self) -> bool:
        """Whether an overload of ``within`` is predicted to miss the target by the margin."""
        return self.above <= self.target - self.margin + 1e-12

    def sentence(self) -> str:
        up, down = f"x {1 + self.within:g}", f"/ {1 + self.within:g}"
        text = (
            f"simulated attainment {self.above:.0%} at the predicted knee {up}, "
            f"{self.below:.0%} at {down}; a probe lasts {self.seconds:.3g} s at the knee"
        )
        if self.decisive:
            return text + ": decisive"
        why = f" ({self.capped})" if self.capped else ""
        return (
            f"{text}: NOT decisive by the probe rule (a {self.within:.0%} overload is predicted "
            f"above {self.target - self.margin:.0%}){why}"
        )

    def to_dict(self) -> dict[str, Any]:
        return written(self, seconds=self.seconds, decisive=self.decisive, sentence=self.sentence())

    @classmethod
    def from_dict(cls, fields: Fields) -> Sharpness:
        """Raises: ValueError naming the field, for one missing or of the wrong type."""
        return fields.values_of(cls)


@dataclasses.dataclass(frozen=True)
class Sized:
    """What every probe sends, the knee predicted on exactly those requests, and how sharp."""

    requests: list[Request]
    predicted: Predicted
    sharpness: Sharpness


def sharpness(
    load: Sequence[Request],
    server_model: ServerModel,
    slo: SLO,
    rule: ProbeRule,
    predicted: Predicted,
) -> Sharpness:
    """The simulated attainment of ``load`` on either side of the knee ``predicted`` on it
    (NaN without a knee: nothing then is decisive)."""
    rate, step = predicted.rate, 1 + rule.within
    above = below = math.nan
    if 0 < rate < math.inf:
        above = simulated_attainment(load, server_model, slo, rate * step)
        below = simulated_attainment(load, server_model, slo, rate / step)
    capped = None if 0 < rate < math.inf else "no knee predicted"
    return Sharpness(rate, len(load), above, below, rule.target, rule.margin, rule.within, capped)


def predict_sized(
    load: Sequence[Request],
    server_model: ServerModel,
    slo: SLO,
    rule: ProbeRule,
) -> Sized:
    """What the probes send (:func:`~pytest_prefill.verify.knee.probe_load`), sized by the
    three rules (the module's docstring; rule 1 alone when ``rule.sustained`` is off), the knee
    predicted on it and how sharp.

    Raises:
        ValueError: as :func:`~pytest_prefill.verify.knee.probe_load`.
    """

    def at(n: int) -> tuple[list[Request], Predicted]:
        sent = probe_load(load, rule, n)
        return sent, predict_knee(sent, server_model, slo, rule.target)

    sent, predicted = _rule_two(at, len(load) - rule.start, slo, rule)
    sharp = sharpness(sent, server_model, slo, rule, predicted)
    while rule.sustained and not sharp.decisive and sharp.capped is None:
        if rule.start + len(sent) >= len(load):
            sharp = dataclasses.replace(sharp, capped="the workload ends")
            break
        longer, again = at(math.ceil(len(sent) * GROWTH))
        seconds = (len(longer) - 1) / again.rate if again.rate > 0 else math.inf
        if seconds > rule.max_seconds:
            why = f"a longer probe would last {seconds:.3g} s, over {rule.max_seconds:g} s"
            sharp = dataclasses.replace(sharp, capped=why)
            break
        sent, predicted = longer, again
        sharp = sharpness(sent, server_model, slo, rule, predicted)
    return Sized(sent, predicted, sharp)


def _rule_two(
    at: Callable[[int], tuple[list[Request], Predicted]], available: int, slo: SLO, rule: ProbeRule
) -> tuple[list[Request], Predicted]:
    """Rules 1 and 2: the fewest requests (at least rule 1's) that rule 2 asks for at the rate
    predicted on them, bisected to within 5%; all ``available`` when even that is too short."""

    def enough(sent: list[Request], predicted: Predicted) -> bool:
        return not rule.sustained or rule.requests_at(predicted.rate, slo) <= len(sent)

    short, predicted = at(rule.requests)
    if enough(short, predicted):
        return short, predicted
    low = len(short)
    sent, predicted = at(min(rule.requests_at(predicted.rate, slo), available))
    if not enough(sent, predicted):
        return sent, predicted  # the workload is shorter than rule 2 asks
    high = len(sent)
    while high - low > max(1, high // 20):
        middle = (low + high) // 2
        candidate = at(middle)
        if enough(*candidate):
            high, (sent, predicted) = middle, candidate
        else:
            low = middle
    return sent, predicted
