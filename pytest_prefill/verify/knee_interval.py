"""The measured knee as a number with an interval, and the predicted knee judged against it.

The probes give attainment at a few rates; the knee is where attainment crosses the target.
**Estimate**: attainment made non-increasing in rate (pool adjacent violators, weighted by the
requests sent: a higher rate cannot serve better, so two probes that say otherwise are pooled),
then interpolated in log rate between the last rate at or above the target and the first below
it. Beyond the probes the knee is open: 0 when every rate missed, inf when none did.

**Interval**: a parametric bootstrap over the probes. Each resample redraws every probe's good
requests from the fitted attainment at its rate (kept off 0 and 1 by half a request), as
binomial draws when the probes agree with the fit within binomial noise, and beta-binomial,
overdispersed by the factor the probes' own disagreement shows (the Pearson statistic of the fit
over its degrees of freedom, the probes pooled by the fit), when they disagree more: two probes
at neighbouring rates can differ by more than their binomial error, because a probe's requests
share one queue and one server moment. On each resample the crossing is bracketed again; the
interval runs from the low percentile of the last rate that met the target to the high
percentile of the first that missed: between two probes the probes say nothing of where the
cliff is, so the interpolated point is an estimate, not a bound. Resampling requests inside a
probe would not do: late requests see the queue the early ones built, so they are not
exchangeable. It covers what the probes show, not a server that is slower on another day.

**Judged**: predicted / measured, with the interval that the measured knee's gives, against
±``within``: HOLDS when the ratio's whole interval lies within, FAILS when none of it does,
UNDECIDED when it straddles a bound. Standard library only."""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from typing import Any

from pytest_prefill.verify.fields import Fields

LEVEL = 0.90
RESAMPLES = 1000
SEED = 20261202


def non_increasing(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The weighted least-squares non-increasing fit of ``values`` (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, count]
    for value, weight in zip(values, weights):
        blocks.append([float(value), float(weight), 1])
        while len(blocks) > 1 and blocks[-2][0] < blocks[-1][0]:
            mean_b, weight_b, count_b = blocks.pop()
            mean_a, weight_a, count_a = blocks.pop()
            total = weight_a + weight_b
            mean = (mean_a * weight_a + mean_b * weight_b) / total if total > 0 else mean_a
            blocks.append([mean, total, count_a + count_b])
    fitted: list[float] = []
    for mean, _, count in blocks:
        fitted.extend([mean] * int(count))
    return fitted


def bracket(
    rates: Sequence[float], attainments: Sequence[float], weights: Sequence[float], target: float
) -> tuple[float, float, float]:
    """Where the non-increasing fit of attainment over rate crosses ``target`` (``rates``
    ascending, positive): (the last rate at or above it, the crossing interpolated in log rate,
    the first rate below it); 0s when the lowest rate already misses, infs when the highest
    still meets it."""
    fitted = non_increasing(attainments, weights)
    for j, value in enumerate(fitted):
        if value < target:
            if j == 0:
                return 0.0, 0.0, rates[0]
            above, below = fitted[j - 1], value
            share = (above - target) / (above - below)
            low, high = math.log(rates[j - 1]), math.log(rates[j])
            return rates[j - 1], math.exp(low + share * (high - low)), rates[j]
    return rates[-1], math.inf, math.inf


def crossing(
    rates: Sequence[float], attainments: Sequence[float], weights: Sequence[float], target: float
) -> float:
    """The crossing of :func:`bracket` alone."""
    return bracket(rates, attainments, weights, target)[1]


def _pooled(probes: Sequence[tuple[float, Sequence[bool]]]) -> list[tuple[float, int, int]]:
    """(rate, good, sent) by rate ascending, probes at the same rate joined."""
    by_rate: dict[float, list[int]] = {}
    for rate, outcomes in probes:
        counts = by_rate.setdefault(float(rate), [0, 0])
        counts[0] += sum(bool(o) for o in outcomes)
        counts[1] += len(outcomes)
    return [(rate, good, sent) for rate, (good, sent) in sorted(by_rate.items())]


@dataclasses.dataclass(frozen=True)
class KneeEstimate:
    """The measured knee (``rate``: the crossing; 0 or inf when open) and its ``level``
    bootstrap interval [``low``, ``high``] over ``resamples`` redraws, overdispersed by
    ``dispersion`` (1: binomial)."""

    rate: float
    low: float
    high: float
    level: float = LEVEL
    resamples: int = RESAMPLES
    dispersion: float = 1.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, fields: Fields) -> KneeEstimate:
        """Raises: ValueError naming the field, for one missing or of the wrong type."""
        return fields.values_of(cls)


def _percentile(ordered: Sequence[float], q: float) -> float:
    """The q-th quantile of sorted values (nearest rank; inf values sort last)."""
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


def _kept_off_the_ends(p: float, sent: int) -> float:
    return min(max(p, 0.5 / sent), 1 - 0.5 / sent)


def dispersion(goods: Sequence[int], sents: Sequence[int], fitted: Sequence[float]) -> float:
    """How much more the probes scatter round the fit than binomial draws would: the Pearson
    statistic over the degrees of freedom (probes less the fit's distinct levels), at least 1
    (1 when there is no degree of freedom)."""
    free = len(fitted) - len(set(fitted))
    if free <= 0:
        return 1.0
    pearson = 0.0
    for good, sent, p in zip(goods, sents, fitted):
        q = _kept_off_the_ends(p, sent)
        pearson += (good - sent * q) ** 2 / (sent * q * (1 - q))
    return max(1.0, pearson / free)


def _redraw(rng: random.Random, p: float, sent: int, spread: float) -> float:
    """A probe's attainment redrawn: binomial at ``p``, beta-binomial when ``spread`` > 1."""
    if spread > 1 and sent > 1:
        size = max((sent - min(spread, sent - 1e-9)) / (min(spread, sent) - 1), 1e-9)
        p = rng.betavariate(p * size, (1 - p) * size)
    return sum(rng.random() < p for _ in range(sent)) / sent


def estimate_knee(
    probes: Sequence[tuple[float, Sequence[bool]]],
    target: float,
    *,
    level: float = LEVEL,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> KneeEstimate:
    """The knee of ``probes`` (each its rate and its requests' outcomes, True: within the SLO)
    and its interval (see the module's docstring).

    Raises:
        ValueError: for no probe, a rate that is not positive, or a probe with no request.
    """
    if not probes:
        raise ValueError("estimate_knee needs at least one probe")
    if any(not (math.isfinite(r) and r > 0) for r, _ in probes):
        raise ValueError(f"probe rates must be positive, got {[r for r, _ in probes]}")
    if any(len(o) == 0 for _, o in probes):
        raise ValueError("every probe must have sent requests")
    pooled = _pooled(probes)
    rates = [r for r, _, _ in pooled]
    goods = [g for _, g, _ in pooled]
    sents = [n for _, _, n in pooled]
    point = crossing(rates, [g / n for g, n in zip(goods, sents)], sents, target)
    fitted = non_increasing([g / n for g, n in zip(goods, sents)], sents)
    spread = dispersion(goods, sents, fitted)
    kept = [_kept_off_the_ends(p, n) for p, n in zip(fitted, sents)]
    rng = random.Random(seed)
    lows, highs = [], []
    for _ in range(resamples):
        drawn = [_redraw(rng, p, n, spread) for p, n in zip(kept, sents)]
        met, _, missed = bracket(rates, drawn, sents, target)
        lows.append(met)
        highs.append(missed)
    lows.sort()
    highs.sort()
    tail = (1 - level) / 2
    low, high = _percentile(lows, tail), _percentile(highs, 1 - tail)
    return KneeEstimate(point, low, high, level, resamples, spread)


@dataclasses.dataclass(frozen=True)
class KneeAgreement:
    """Predicted over measured knee, its interval (from the measured knee's), and the verdict
    against ±``within``."""

    ratio: float
    low: float
    high: float
    within: float
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _over(predicted: float, measured: float) -> float:
    if measured <= 0:
        return math.inf
    return 0.0 if math.isinf(measured) else predicted / measured


def agreement(predicted: float, knee: KneeEstimate, within: float = 0.10) -> KneeAgreement:
    """Judge ``predicted`` against the measured ``knee`` (see the module's docstring)."""
    ratio = _over(predicted, knee.rate)
    low, high = _over(predicted, knee.high), _over(predicted, knee.low)
    floor, ceiling = 1 - within, 1 + within
    if floor <= low and high <= ceiling:
        verdict = "HOLDS"
    elif high < floor or low > ceiling:
        verdict = "FAILS"
    else:
        verdict = "UNDECIDED"
    return KneeAgreement(ratio, low, high, within, verdict)


def deciding_scale(
    probes: Sequence[tuple[float, Sequence[bool]]],
    target: float,
    judged: float,
    *,
    within: float = 0.10,
    step: float = 1.05,
    highest: float = math.inf,
) -> float | None:
    """Where one more probe would best decide the verdict on ``judged`` (the predicted knee, in
    the probes' own units) while it is UNDECIDED; None once it is HOLDS or FAILS. In order:
    (1) the interval is open, so past the probes: ``step`` above the highest (never above
    ``highest``, where the probes are a burst) or below the lowest; (2) the probes rise with the
    rate (a higher rate met more, a server's moment rather than the rate): the pair's member
    with fewer requests sent again, the higher on a tie, so that the fit leans on more of them;
    (3) else at the bound the interval reaches past (``judged / (1 - within)`` above,
    ``judged / (1 + within)`` below, a hair inside), where a probe on the near side decides
    HOLDS; once one is there and came out on the far side (the knee lies at the bound or
    past it), half a ``step`` past it, where a probe on the far side decides FAILS; a probe
    already at the spot that still left it undecided is sent again (more requests there).

    Raises:
        ValueError: as :func:`estimate_knee`; for a ``judged`` that is not positive, or a
            ``step`` that is not > 1.
    """
    if not (math.isfinite(judged) and judged > 0):
        raise ValueError(f"judged must be a positive number, got {judged!r}")
    if not (math.isfinite(step) and step > 1):
        raise ValueError(f"step must be a number > 1, got {step!r}")
    knee = estimate_knee(probes, target)
    if agreement(judged, knee, within).verdict != "UNDECIDED":
        return None
    pooled = _pooled(probes)
    if math.isinf(knee.high):
        top = pooled[-1][0]
        return min(top * step, highest) if top < highest else None
    if knee.low <= 0:
        return pooled[0][0] / step
    shares = [good / sent for _, good, sent in pooled]
    rises = [(shares[i + 1] - shares[i], i) for i in range(len(pooled) - 1)]
    rise, i = max(rises, key=lambda r: r[0], default=(0.0, 0))  # the first, on a tie
    if rise > 0:  # the pair that rose most: its member with fewer requests (the higher on a tie)
        lower, upper = pooled[i], pooled[i + 1]
        return lower[0] if lower[2] < upper[2] else upper[0]
    above = judged / knee.high < 1 - within  # the knee may lie past judged / (1 - within)
    # a hair inside the goal, so that a probe there coming out on the near side decides HOLDS
    bound = judged / (1 - within) * (1 - 1e-9) if above else judged / (1 + within) * (1 + 1e-9)
    beyond = bound * math.sqrt(step) if above else bound / math.sqrt(step)
    there = [share for (rate, _, _), share in zip(pooled, shares) if abs(rate / bound - 1) < 1e-6]
    if there and (there[0] >= target) == above:  # the far side: only a probe past it decides
        bound = beyond
    return bound if bound <= highest else None  # (again, where a probe left it undecided)
