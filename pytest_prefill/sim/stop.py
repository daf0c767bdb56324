"""Stopping a run once its SLO verdict is decided (DESIGN.md, "Serving metrics"; issue 26): the
per-request test of an SLO as vLLM's goodput and our attainment make it (the one home:
:mod:`pytest_prefill.plan.metrics` calls it too), a :class:`StopRule` (the bounds and how many
requests may miss), and :class:`Watch`, which the simulator asks at each instant whether the
verdict is fixed.

A run FAILS once more requests have missed than may miss — a request misses when its TTFT,
TPOT or E2EL exceeds its bound, and one still without its first token when its TTFT is
already past the bound has missed — and PASSES once the requests not yet finished can no
longer push the misses past that."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .requests import Request
from .ticks import from_ticks

SLO_METRICS = ("ttft", "tpot", "e2el")


def slo_values(
    arrival: float, first_token: float, finish: float, output_len: int
) -> tuple[float, float | None, float]:
    """A finished request's TTFT, TPOT and E2EL (seconds) as vLLM defines them: TTFT = first
    token - arrival, E2EL = last token - arrival, TPOT = (E2EL - TTFT) / (output_len - 1),
    None for a request of one output token."""
    tpot = (finish - first_token) / (output_len - 1) if output_len > 1 else None
    return first_token - arrival, tpot, finish - arrival


def within(value: float | None, bound: float) -> bool:
    """Whether one metric meets its bound: ``value <= bound``; a one-token request's TPOT
    (None) counts as 0, as vLLM's goodput counts it."""
    return (value if value is not None else 0.0) <= bound


def meets(
    bounds: Iterable[tuple[str, float]], ttft: float, tpot: float | None, e2el: float
) -> bool:
    """Whether a request meets every ``(metric, bound)`` of an SLO: the one predicate of SLO
    attainment."""
    values = {"ttft": ttft, "tpot": tpot, "e2el": e2el}
    return all(within(values[name], bound) for name, bound in bounds)


def stated_bounds(bounds: Any) -> tuple[tuple[str, float], ...]:
    """``bounds``' ttft, tpot and e2el that are not None as (metric, seconds), in that order."""
    return tuple(
        (name, getattr(bounds, name)) for name in SLO_METRICS if getattr(bounds, name) is not None
    )


def check_bounds(bounds: Any) -> None:
    """The one check of a frozen dataclass's ttft, tpot and e2el (an SLO, a stop rule): each
    None or a positive finite number of seconds (kept as a float), one at least given.

    Raises:
        ValueError: naming the class and the field.
    """
    kind = type(bounds).__name__
    for name in SLO_METRICS:
        value = getattr(bounds, name)
        if value is None:
            continue
        number = not isinstance(value, bool) and isinstance(value, (int, float))
        if not (number and math.isfinite(value) and value > 0):
            raise ValueError(
                f"{kind}.{name} must be a positive number of seconds or None, got {value!r}"
            )
        object.__setattr__(bounds, name, float(value))
    if not stated_bounds(bounds):
        raise ValueError(f"{kind} needs at least one bound ({', '.join(SLO_METRICS)})")


@dataclasses.dataclass(frozen=True, slots=True)
class StopRule:
    """When a simulation may stop: the SLO's bounds in seconds (None: no bound on that
    metric; at least one) and ``allowed_misses``, the most requests that may miss it with the
    verdict still PASSED (e.g. the largest m with (n - m) / n >= the target attainment), and
    ``on_pass``: whether the run also stops once PASSED is fixed (False: only once FAILED; a
    run that passes goes to its end and keeps every record, as a search's answer needs).

    Raises:
        ValueError: naming the field, for a bound that is not a positive finite number, no
            bound at all, ``allowed_misses`` that is not an int >= 0, or ``on_pass`` not a bool.
    """

    ttft: float | None = None
    tpot: float | None = None
    e2el: float | None = None
    allowed_misses: int = 0
    on_pass: bool = True

    def __post_init__(self) -> None:
        check_bounds(self)
        misses = self.allowed_misses
        if isinstance(misses, bool) or not isinstance(misses, int) or misses < 0:
            raise ValueError(f"StopRule.allowed_misses must be an int >= 0, got {misses!r}")
        if not isinstance(self.on_pass, bool):
            raise ValueError(f"StopRule.on_pass must be True or False, got {self.on_pass!r}")

    @property
    def bounds(self) -> tuple[tuple[str, float], ...]:
        """The stated bounds as (metric, seconds), in the order ttft, tpot, e2el."""
        return stated_bounds(self)


class Watch:
    """A run's verdict as it unfolds, for :class:`StopRule` ``rule`` over ``requests`` (by
    arrival). The workers append each request they finish to :attr:`leaving`; at each instant
    :meth:`check` judges them (``times(r)``: its first token and finish, in ticks), counts
    those still without a first token (``first_token(r)``: None) whose TTFT is already past
    the bound, at the latest any of them could still get it (``floor(now)``: no in-flight
    iteration started earlier), and says whether the verdict is fixed (:attr:`verdict`)."""

    def __init__(self, rule: StopRule, requests: Sequence[Request]) -> None:
        self.rule, self.bounds, self.allowed = rule, rule.bounds, rule.allowed_misses
        self.order, self.total = requests, len(requests)
        self.leaving: list[Request] = []
        self.judged: set[str] = set()
        self.met = self.missed = 0
        self.ended = 0  # requests finished
        self.next = 0  # order[next:]: not yet judged nor seen with a first token
        self.times: Callable[[Request], tuple[int, int]] = _unset
        self.first_token: Callable[[Request], int | None] = _unset
        self.floor: Callable[[int], int] = _unset

    @property
    def verdict(self) -> str | None:
        """``"failed"`` once more have missed than may, ``"passed"`` once the unfinished
        cannot push the misses past that, else None."""
        if self.missed > self.allowed:
            return "failed"
        decided = self.rule.on_pass and self.total - self.met <= self.allowed
        return "passed" if decided else None

    @property
    def finished(self) -> bool:
        """Every request finished (the run went to its end)."""
        return self.ended == self.total

    def judge(self, r: Request, first_token: int, finish: int) -> None:
        """``r`` finished: it met the SLO or missed it (unless it had missed already)."""
        self.ended += 1
        if r.id in self.judged:
            return
        self.judged.add(r.id)
        values = slo_values(r.arrival, from_ticks(first_token), from_ticks(finish), r.output_len)
        if meets(self.bounds, *values):
            self.met += 1
        else:
            self.missed += 1

    def first_known(self, r: Request, first_token: int) -> None:
        """``r``'s first token came at ``first_token``: if its TTFT is past the bound, it has
        missed."""
        bound = self.rule.ttft
        if bound is not None and not within(from_ticks(first_token) - r.arrival, bound):
            self.missed_ttft(r)

    def missed_ttft(self, r: Request) -> None:
        """``r``'s TTFT is past the bound whatever it does now."""
        if r.id not in self.judged:
            self.judged.add(r.id)
            self.missed += 1

    def check(self, now: int) -> bool:
        """Judge what finished by ``now`` and what waits past the TTFT bound; True when the
        verdict is fixed."""
        leaving = self.leaving
        if leaving:
            for r in leaving:
                self.judge(r, *self.times(r))
            leaving.clear()
        if self.rule.ttft is not None and self.next < self.total:
            self._waiting(now)
        return self.verdict is not None

    def _waiting(self, now: int) -> None:
        bound, order, judged = self.rule.ttft, self.order, self.judged
        assert bound is not None
        t, floor = from_ticks(now), None
        k = self.next
        while k < self.total:
            r = order[k]
            if r.id in judged or self.first_token(r) is not None:
                k += 1  # judged, or judged when it finishes
                continue
            if not t - r.arrival > bound:
                break  # nor anyone after it: they arrived later
            if floor is None:
                floor = from_ticks(self.floor(now))
            if not floor - r.arrival > bound:
                break  # its first token may yet come in time
            self.missed_ttft(r)
            k += 1
        self.next = k


def _unset(*_: Any) -> Any:
    raise AssertionError("a Watch's times, first_token and floor are set by the run")
