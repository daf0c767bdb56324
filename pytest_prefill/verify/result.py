"""What a verification found, as one typed value: per flag set the calibration, the scheduling,
the predicted and measured knees and how they agree (:class:`FlagSetResult`), and over them the
ranking (:class:`VerifyResult`). Written by ``to_dict`` and read back by ``from_dict`` (or
:func:`read_verify`, naming the file): the report, ``verify --rank`` and the scripts all read
this value, so a run ranks the same wherever it is read.

The ranking: flag sets by their knees, and ties the prediction cannot break. Two predicted
knees closer than a tolerance are a tie: the predicted best is every flag set within the
tolerance of the highest knee, and an order agrees with the predicted one when every pair the
prediction does tell apart (more than the tolerance between them) comes out the same way.
Verify's tolerance (:func:`claimed_apart`) is the closest two knees can be predicted and still
be ordered by the claims made of each knee, within ±``within`` of its measured one: 22% at
±10%. Closer than that both knee claims can hold with the knees either way round (two knees
predicted 14% apart can both hold, at 1.07 and 0.91, and measure in the other order), so a best
claimed there would be a claim stronger than the model's. Never below the simulated search's
own bracket (``knee.PREDICTION_TOLERANCE``, 2%). Standard library only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from pytest_prefill._io import json_safe, read_json
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.serve.calibration.server_calibration import ServerCalibration
from pytest_prefill.serve.calibration.server_model import Scheduling
from pytest_prefill.sim import CostModel
from pytest_prefill.verify.fields import Fields
from pytest_prefill.verify.knee import PREDICTION_TOLERANCE, MeasuredKnee, Predicted
from pytest_prefill.verify.knee_interval import KneeAgreement, agreement
from pytest_prefill.verify.knee_sizing import Sharpness
from pytest_prefill.verify.load_check import LoadCheck, LoadFactor
from pytest_prefill.verify.probe_rule import FlagSet, ProbeRule

KIND = "pytest-prefill/verify"


@dataclasses.dataclass(frozen=True)
class Derived:
    """A prediction from derived compute (``verify --gpu``), not from a calibration: the
    ``cost`` model derived for the served model on the device, and the ``basis`` line that
    says so, in the words a derived capacity answer uses (device, efficiency tables, held-out
    error class, the host cost's source); ``sizing``: the server's TP and where the KV cache
    the knee is simulated with comes from."""

    cost: CostModel
    basis: str
    sizing: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"basis": self.basis, "sizing": self.sizing, "cost_model": self.cost.to_dict()}

    @classmethod
    def from_dict(cls, fields: Fields) -> Derived:
        """Raises: ValueError naming the field, for one missing or of the wrong type."""
        cost = fields.raw("cost_model")
        if cost is None:
            raise ValueError(f"{fields.where}: missing 'cost_model'")
        sizing = fields.text("sizing", "")
        return cls(fields.build(CostModel.from_dict, cost), fields.text("basis"), sizing)


@dataclasses.dataclass(frozen=True)
class FlagSetResult:
    """One flag set's check: the command it ran (launched), the calibration used, the
    scheduling simulated, the predicted and measured knees, and ``ended``: the one line saying
    why it stopped early (None when it did not); ``requests``: what each probe sent, of
    ``wanted`` by the probe rule (more than the workload has: it sent them all); ``within``:
    the goal the predicted knee is judged against (±); ``pinning``: where a launched server
    and the load generator ran (``serve.launch.process``'s sentence); ``sharpness``: the simulated
    attainment on either side of the predicted knee, on what the probes send (rule 3);
    ``replayed``: per probe, the simulator's attainment on its requests replayed at their
    measured arrivals (``knee.replayed_attainment``); ``load_check``: the server's speed under
    load against the calibration's (``verify.load_check``), whose factor scales the cost model
    the knee is predicted with (None: not run); ``speeds``: per probe, its own factor
    (``load_check.run_speeds``)."""

    flags: FlagSet
    command: tuple[str, ...] = ()
    calibration: ServerCalibration | None = None
    scheduling: Scheduling | None = None
    predicted: Predicted | None = None
    measured: MeasuredKnee | None = None
    ended: str | None = None
    exit_status: int | None = None
    requests: int = 0
    wanted: int = 0
    within: float = 0.10
    pinning: str | None = None
    sharpness: Sharpness | None = None
    replayed: tuple[float, ...] = ()
    load_check: LoadCheck | None = None
    speeds: tuple[LoadFactor, ...] = ()

    @property
    def ratio(self) -> float:
        """Predicted over measured knee (NaN when either is missing or 0, or the search was cut
        short)."""
        if self.predicted is None or self.measured is None or self.measured.ended is not None:
            return math.nan
        if self.lower_bounds:
            return math.nan
        p, m = self.predicted.rate, self.measured.knee
        return p / m if p > 0 and m > 0 else math.nan

    @property
    def lower_bounds(self) -> bool:
        """Whether both knees are only lower bounds (the prediction never missed the SLO, nor
        did any probe): no ratio of the two says anything, so none is judged."""
        p, m = self.predicted, self.measured
        if p is None or m is None or p.status != "never missed":
            return False
        return m.status == "never missed" or (
            m.estimate is not None and m.estimate.rate == math.inf
        )

    @property
    def agreement(self) -> KneeAgreement | None:
        """The ratio with its interval, judged against ±``within`` (None: nothing to judge)."""
        if self.predicted is None or not measured_whole(self.measured) or self.lower_bounds:
            return None
        assert self.measured is not None and self.measured.estimate is not None
        return agreement(self.predicted.rate, self.measured.estimate, self.within)

    @property
    def attainment_at_predicted(self) -> float:
        first = self.measured.at_first if self.measured is not None else None
        return first.attainment if first is not None else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {
            "flags": self.flags.to_dict(),
            "command": list(self.command),
            "calibration": self.calibration.to_dict() if self.calibration is not None else None,
            "scheduling": self.scheduling.to_dict() if self.scheduling is not None else None,
            "predicted": self.predicted.to_dict() if self.predicted is not None else None,
            "measured": self.measured.to_dict() if self.measured is not None else None,
            "ratio": self.ratio,
            "agreement": self.agreement.to_dict() if self.agreement is not None else None,
            "requests": self.requests,
            "wanted": self.wanted,
            "attainment_at_predicted": self.attainment_at_predicted,
            "sharpness": self.sharpness.to_dict() if self.sharpness is not None else None,
            "replayed": list(self.replayed),
            "load_check": self.load_check.to_dict() if self.load_check is not None else None,
            "speeds": [s.to_dict() for s in self.speeds],
            "ended": self.ended,
            "exit_status": self.exit_status,
            "pinning": self.pinning,
            "within": self.within,
        }

    @classmethod
    def from_dict(cls, fields: Fields, slo: SLO, rule: ProbeRule) -> FlagSetResult:
        """The flag set :meth:`to_dict` wrote (``slo`` and ``rule``: the run's).

        Raises:
            ValueError: naming the field, for one missing or of the wrong type.
        """
        flags = fields.child("flags")
        if flags is None:
            raise ValueError(f"{fields.where}: missing 'flags'")
        parts = {name: fields.child(name) for name in _PARTS}
        calibration = fields.raw("calibration")
        scheduling = fields.raw("scheduling")
        measured = parts["measured"]
        return cls(
            FlagSet.from_dict(flags),
            tuple(str(c) for c in fields.items("command")),
            fields.build(ServerCalibration.from_dict, calibration) if calibration else None,
            fields.build(Scheduling.from_dict, scheduling) if scheduling else None,
            _read(parts["predicted"], lambda f: Predicted.from_dict(f.data, f.where)),
            _read(measured, lambda f: MeasuredKnee.from_dict(f.data, slo, rule.tolerance, f.where)),
            fields.optional_text("ended"),
            fields.optional_integer("exit_status"),
            fields.integer("requests", 0),
            fields.integer("wanted", 0),
            fields.number("within", _within(fields, rule)),
            fields.optional_text("pinning"),
            _read(parts["sharpness"], Sharpness.from_dict),
            fields.numbers("replayed"),
            _read(parts["load_check"], LoadCheck.from_dict),
            tuple(LoadFactor.from_dict(s) for s in fields.children("speeds") if s is not None),
        )


_PARTS = ("predicted", "measured", "sharpness", "load_check")


def _read(fields: Fields | None, make: Any) -> Any:
    return make(fields) if fields is not None else None


def _within(fields: Fields, rule: ProbeRule) -> float:
    """The goal a document written before ``within`` was judged its knee against: its
    agreement's, else the rule's."""
    judged = fields.child("agreement")
    return judged.number("within", rule.within) if judged is not None else rule.within


def one_line(err: BaseException, limit: int = 400) -> str:
    """An error's first line for a flag set's one ended line, whole up to ``limit``
    characters, else cut there with "…" (never silently)."""
    lines = str(err).strip().splitlines()
    line = lines[0] if lines else type(err).__name__
    return line if len(line) <= limit else line[: limit - 1] + "…"


def measured_whole(knee: MeasuredKnee | None) -> bool:
    """Whether ``knee`` is a search the server finished, with an estimate to judge."""
    return knee is not None and knee.ended is None and knee.estimate is not None


def ranking_tolerance(within: float) -> float:
    """The tie between predicted knees when each knee is claimed within ±``within``
    (``verify.result.claimed_apart``), never below the search's bracket."""
    return max(PREDICTION_TOLERANCE, claimed_apart(within))


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    """A whole verification: the workload, the SLO, the probe rule and one result per flag set,
    in the order given; ``quiet``: how runs were kept to a quiet host ("": not watched);
    ``interrupted``: the signal that ended the run early (``SIGINT``; "": none), its flag sets
    those it had started; ``derived``: the derived compute every knee was predicted from
    (None: each flag set's calibration)."""

    workload: str
    slo: SLO
    rule: ProbeRule
    results: tuple[FlagSetResult, ...]
    engine: str
    quiet: str = ""
    interrupted: str = ""
    derived: Derived | None = None

    @property
    def compared(self) -> tuple[FlagSetResult, ...]:
        """The flag sets with both knees (a flag set that ended before or during its probes
        has no measured knee: a probe the server cut short neither met nor missed the SLO)."""
        return tuple(
            r
            for r in self.results
            if r.predicted is not None and r.measured is not None and r.measured.ended is None
        )

    @property
    def knees(self) -> tuple[list[float], list[float]]:
        """The compared flag sets' predicted and measured knees, req/s."""
        predicted = [r.predicted.rate for r in self.compared if r.predicted is not None]
        return predicted, [r.measured.knee for r in self.compared if r.measured is not None]

    @property
    def predicted_order(self) -> list[int]:
        return ranking(self.knees[0])

    @property
    def measured_order(self) -> list[int]:
        return ranking(self.knees[1])

    @property
    def tolerance(self) -> float:
        """Predicted knees closer than this are a tie (``verify.result``): closer than claims
        each within the rule's ±``within`` can order, and never below the search's bracket."""
        return ranking_tolerance(self.rule.within)

    @property
    def predicted_best(self) -> tuple[int, ...]:
        """The flag sets (in ``compared``) whose predicted knee is within :attr:`tolerance` of
        the highest (``verify.result``): a tie names no one best."""
        return tied_best(self.knees[0], self.tolerance)

    @property
    def same_best(self) -> bool | None:
        """Whether the measured best is a predicted best (None: fewer than two)."""
        return self.measured_order[0] in self.predicted_best if len(self.compared) > 1 else None

    @property
    def intervals(self) -> list[tuple[float, float] | None]:
        """The compared flag sets' measured knee intervals (None: no estimate)."""
        estimates = [r.measured.estimate if r.measured else None for r in self.compared]
        return [(e.low, e.high) if e is not None else None for e in estimates]

    @property
    def best_verdict(self) -> str | None:
        """The predicted best judged on the measured intervals (``verify.result.best_verdict``;
        None: fewer than two)."""
        if len(self.compared) < 2:
            return None
        return best_verdict(self.knees[0], self.intervals, self.tolerance)[0]

    @property
    def same_order(self) -> bool | None:
        """Whether the measured order keeps every pair the prediction tells apart."""
        return agrees(*self.knees, self.tolerance) if len(self.compared) > 1 else None

    def to_dict(self) -> dict[str, Any]:
        labels = [r.flags.label for r in self.compared]
        return json_safe(
            {
                "kind": "pytest-prefill/verify",
                "schema_version": 1,
                "workload": self.workload,
                "engine": self.engine,
                "slo": self.slo.to_dict(),
                "probe_rule": self.rule.to_dict(),
                "quiet_host": self.quiet or None,
                "interrupted": self.interrupted or None,
                "derived": self.derived.to_dict() if self.derived is not None else None,
                "predicted_ranking": [labels[i] for i in self.predicted_order],
                "measured_ranking": [labels[i] for i in self.measured_order],
                "ranking_tolerance": self.tolerance,
                "predicted_best": [labels[i] for i in self.predicted_best],
                "same_best": self.same_best,
                "best_verdict": self.best_verdict,
                "same_order": self.same_order,
                "flag_sets": [r.to_dict() for r in self.results],
            },
            "verify",
        )

    @classmethod
    def from_dict(cls, data: Any) -> VerifyResult:
        """The verification :meth:`to_dict` wrote (a slim one, without its requests' records,
        reads too: its probes then have no metrics). The rankings are not read: they are
        recomputed from the flag sets, by the same rule as when the run was made.

        Raises:
            ValueError: naming the field, for anything that is not a verify document or a
                field missing or of the wrong type.
        """
        fields = Fields(data, "verify")
        if fields.raw("kind") != KIND:
            raise ValueError(f"not a verify result (kind {fields.raw('kind')!r}, not {KIND!r})")
        bounds = fields.child("slo")
        if bounds is None:
            raise ValueError("verify: missing 'slo'")
        slo = bounds.build(SLO, **bounds.data)
        rule = ProbeRule.from_dict(fields.raw("probe_rule", {}))
        results = tuple(
            FlagSetResult.from_dict(f, slo, rule) for f in fields.children("flag_sets") if f
        )
        quiet = fields.raw("quiet_host") or ""
        workload, engine = fields.text("workload", ""), fields.text("engine", "")
        interrupted = fields.optional_text("interrupted") or ""
        derived = _read(fields.child("derived"), Derived.from_dict)
        return cls(workload, slo, rule, results, engine, str(quiet), interrupted, derived)


def read_verify(path: str) -> VerifyResult:
    """The verify document at ``path`` (``verify --json``) as a :class:`VerifyResult`.

    Raises:
        ValueError: naming the file and the field, for anything that is not one.
    """
    data = read_json(path, "verify result")
    try:
        return VerifyResult.from_dict(data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def _check(values: Sequence[float], tolerance: float) -> None:
    if not (isinstance(tolerance, (int, float)) and math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be a finite number >= 0, got {tolerance!r}")
    if not all(isinstance(v, (int, float)) and v == v for v in values):
        raise ValueError(f"values must be numbers, got {list(values)!r}")


def claimed_apart(within: float) -> float:
    """How far apart (relative, of the lower) two predicted knees must be for claims each
    within ±``within`` of its measured knee to order the measured ones: the higher measures at
    least ``p_a / (1 + within)``, the lower at most ``p_b / (1 - within)``, so
    ``(1 + within) / (1 - within) - 1`` (0.222 at 0.10).

    Raises:
        ValueError: for a ``within`` that is not in [0, 1).
    """
    if not (
        isinstance(within, (int, float))
        and not isinstance(within, bool)
        and math.isfinite(within)
        and 0 <= within < 1
    ):
        raise ValueError(f"within must be a number in [0, 1), got {within!r}")
    return (1 + within) / (1 - within) - 1


def ranking(values: Sequence[float]) -> list[int]:
    """Indices by value, highest first (ties keep the given order)."""
    return sorted(range(len(values)), key=lambda i: -values[i])


def apart(a: float, b: float, tolerance: float) -> bool:
    """Whether ``a`` and ``b`` differ by more than ``tolerance`` of the smaller."""
    low, high = sorted((a, b))
    return high > low * (1 + tolerance)


def tied_best(values: Sequence[float], tolerance: float) -> tuple[int, ...]:
    """The indices whose value is within ``tolerance`` of the highest (highest first; empty
    for no values).

    Raises:
        ValueError: for a negative or non-finite tolerance, or a value that is not a number.
    """
    _check(values, tolerance)
    order = ranking(values)
    return tuple(i for i in order if not apart(values[i], values[order[0]], tolerance))


def agrees(predicted: Sequence[float], measured: Sequence[float], tolerance: float) -> bool:
    """Whether ``measured`` orders every pair that ``predicted`` tells apart (more than
    ``tolerance``) the same way (a measured tie, equal values, breaks such a pair).

    Raises:
        ValueError: for lists of different lengths, or as :func:`tied_best`.
    """
    _check(predicted, tolerance)
    if len(predicted) != len(measured):
        raise ValueError(f"{len(predicted)} predicted values against {len(measured)} measured")
    n = len(predicted)
    return all(
        measured[i] > measured[j]
        for i in range(n)
        for j in range(n)
        if predicted[i] > predicted[j] and apart(predicted[i], predicted[j], tolerance)
    )


def best_verdict(
    predicted: Sequence[float],
    intervals: Sequence[tuple[float, float] | None],
    tolerance: float,
) -> tuple[str, tuple[int, ...]]:
    """The claim "the predicted best sustains the most" judged on the measured knees'
    intervals (low, high; None: unknown, taken as (0, inf)): HOLDS when a predicted best's
    interval lies above every other flag set's, FAILS when another's lies above every
    predicted best's, else UNDECIDED (also when the prediction ties them all: nothing to
    refute). With it, the flag sets that decided it (the one above, HOLDS or FAILS) or those
    whose intervals reach a predicted best's (UNDECIDED).

    Raises:
        ValueError: for lists of different lengths, or as :func:`tied_best`.
    """
    if len(predicted) != len(intervals):
        raise ValueError(f"{len(predicted)} predicted values against {len(intervals)} intervals")
    best = tied_best(predicted, tolerance)
    spans = [span if span is not None else (0.0, math.inf) for span in intervals]
    others = [j for j in range(len(predicted)) if j not in best]
    if not others:
        return "UNDECIDED", best
    for b in best:
        if all(spans[b][0] > spans[j][1] for j in others):
            return "HOLDS", (b,)
    for j in others:
        if all(spans[j][0] > spans[b][1] for b in best):
            return "FAILS", (j,)
    return "UNDECIDED", tuple(j for j in others if spans[j][1] >= spans[best[0]][0])


def order_text(labels: Sequence[str], values: Sequence[float], tolerance: float) -> str:
    """``labels`` highest value first, joined by " > ", or " = " where the next is within
    ``tolerance`` of the first of its run of ties (ties are not transitive: 4.47 = 3.84 and
    3.84 = 3.41 at 22%, but 4.47 > 3.41, so a run is measured from its leader, as
    :func:`tied_best` measures the best from the highest)."""
    _check(values, tolerance)
    order = ranking(values)
    if not order:
        return ""
    text, leader = labels[order[0]], order[0]
    for i in order[1:]:
        if apart(values[leader], values[i], tolerance):
            text += " > " + labels[i]
            leader = i
        else:
            text += " = " + labels[i]
    return text
