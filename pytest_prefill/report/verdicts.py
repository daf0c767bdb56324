"""What a run reports, as the plugin's summary and the archive hold it: titled tables and
HOLDS/FAILS verdicts (frozen values that validate), the short block a summary opens with, and
the lines a terminal shows."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_prefill._io import json_safe
from pytest_prefill.plan.advice import (
    TYPICAL_PROMPT,
    FittedCost,
    recommend,
    star_text,
    typical_star,
)

VERDICTS = ("HOLDS", "FAILS", "UNDECIDED")  # UNDECIDED: an interval straddles the line


def _text_field(field: str, value: object, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise ValueError(f"{field} must be a non-empty string, got {value!r}")
    return value


def _archived(cls: Any, data: Mapping[str, Any]) -> Any:
    """A value from its archived entry: each field as stored, unchecked (the constructor checks
    it); a missing ``test`` is ""."""
    fields = {f.name: data.get(f.name) for f in dataclasses.fields(cls)}
    return cls(**{**fields, "test": fields["test"] or ""})


@dataclasses.dataclass(frozen=True, slots=True)
class Table:
    """A titled, already formatted table; ``data`` is its JSON form for the archive (or None);
    ``test`` is the node id of the test that produced it."""

    title: str
    text: str
    data: Any = None
    test: str = ""

    def __post_init__(self) -> None:
        _text_field("title", self.title)
        _text_field("text", self.text)
        object.__setattr__(self, "data", json_safe(self.data, f"table {self.title!r} data"))

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "text": self.text, "data": self.data, "test": self.test}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Table:
        return _archived(cls, data)


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """A falsifiable claim's outcome: HOLDS or FAILS, with the sentence it was judged against."""

    name: str
    verdict: str
    sentence: str
    detail: str | None = None
    test: str = ""
    asserted: bool | None = None  # False: the test reports it and does not assert it

    def __post_init__(self) -> None:
        _text_field("name", self.name)
        if self.asserted is not None and not isinstance(self.asserted, bool):
            raise ValueError(f"asserted must be True, False or None, got {self.asserted!r}")
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}, got {self.verdict!r}")
        _text_field("sentence", self.sentence)
        if self.detail is not None:
            _text_field("detail", self.detail, allow_empty=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "sentence": self.sentence,
            "detail": self.detail,
            "test": self.test,
            "asserted": self.asserted,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        return _archived(cls, data)


def verdict_block(
    fitted: FittedCost | None, cost_line: str, verdicts: Sequence[Verdict]
) -> list[str]:
    """The short block a run's summary opens with: the cost model its tables used (``fitted``;
    None: none), C* and the recommendation (the one rule's words) with the calibration's trust
    figures beside the numbers (no trust: not measured here), and one line per verdict (its
    detail's first line: the falsifier's gaps, the fidelity's median error)."""
    lines = [f"cost model: {cost_line}"]
    if fitted is not None:
        cost, trust = fitted.cost, fitted.trust
        advice = recommend(fitted)
        figures = f" [{trust.text()}]" if trust is not None else " [not measured here]"
        if "prefill_per_token" in fitted.refused:
            star = "C* not determined (prefill_per_token was refused)"
        else:
            typical = typical_star(cost)
            at = (
                ""
                if typical == advice.chunk_star
                else f" ({star_text(typical)} at {TYPICAL_PROMPT:,} of context)"
            )
            star = f"C* = {star_text(advice.chunk_star)} tokens{at}"
        lines += [
            f"{star}; pass overhead is {advice.overhead_fraction:.0%} of one decode step{figures}",
            advice.line,
            *filter(None, [advice.question]),
            *advice.warnings,
        ]
    return lines + [verdict_line(v) for v in verdicts]


def verdict_line(v: Verdict) -> str:
    """One verdict on one line: its detail's first line (else its sentence)."""
    detail = (v.detail or "").strip()
    text = detail.splitlines()[0] if detail else v.sentence
    for prefix in ("HOLDS: ", "FAILS: "):
        text = text.removeprefix(prefix)
    return f"{v.verdict}  {v.name}: {text}"


NOT_ASSERTED = "reported, not asserted: "


def not_asserted(v: Verdict, outcome: str | None) -> bool:
    """Whether the verdict is only reported: its test said so (``asserted=False``), or it FAILS
    in a test that passed (a test that asserted it would have failed)."""
    if v.asserted is not None:
        return not v.asserted
    return v.verdict == "FAILS" and outcome == "passed"


def summary_lines(tables: Sequence[Table], verdicts: Sequence[Verdict]) -> list[str]:
    """The tables, then every verdict with its sentence, as lines for a terminal."""
    lines: list[str] = []
    for table in tables:
        heading = f"{table.title}  [{table.test}]" if table.test else table.title
        lines += [heading, "-" * min(len(heading), 100), *table.text.rstrip().splitlines(), ""]
    if verdicts:
        lines.append("Verdicts:")
        for v in verdicts:
            lines.append(f"  {v.verdict}  {v.name}: {v.sentence}")
            if v.detail:
                lines += [f"         {line}" for line in v.detail.rstrip().splitlines()]
    return lines
