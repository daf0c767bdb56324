"""The archived runs as a table: the ids ``compare`` takes, what made each run, its C*, its
recommendation and its verdicts."""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping, Sequence

from tabulate import tabulate

from pytest_prefill.archive.runs import RunFile, run_id
from pytest_prefill.plan.advice import FittedCost, recommend, star_text
from pytest_prefill.plan.cost_document import cost_from_json, trust_in


@dataclasses.dataclass(frozen=True, slots=True)
class RunSummary:
    """What ``prefill-bench runs`` shows of one run: its id, when, which commit, what made it,
    and what it found (C* and the recommendation of its calibration, its verdicts)."""

    id: str
    created: str
    commit: str
    made_by: str
    chunk_star: float | None
    recommendation: str | None
    verdicts: tuple[tuple[str, str], ...]
    tables: int


def summarize_run(run: RunFile, key: str | None = None) -> RunSummary:
    """A :class:`RunSummary` of ``run``; fields a damaged run lacks are left empty."""
    data = run.data
    commit = str(data.get("commit") or "?") + (" dirty" if data.get("dirty") else "")
    command = data.get("command")
    pytest_info = data.get("pytest")
    if isinstance(command, str):
        made_by = command
    elif isinstance(pytest_info, Mapping):
        args = pytest_info.get("args")
        made_by = "pytest " + " ".join(map(str, args)) if isinstance(args, list) else "pytest"
    else:
        made_by = "?"
    star = recommendation = None
    if run.calibration is not None:
        try:
            cost = cost_from_json(run.calibration, str(run.path))
        except ValueError:
            cost = None
        if cost is not None:
            refused = {
                r.get("constant")
                for r in run.calibration.get("refusals") or []
                if isinstance(r, Mapping)
            }
            named = frozenset(str(c) for c in refused)
            advice = recommend(FittedCost(cost, named, trust=trust_in(run.calibration)))
            star, recommendation = advice.chunk_star, advice.policy
    listed = data.get("verdicts")
    verdicts = tuple(
        (str(v.get("name")), str(v.get("verdict")))
        for v in (listed if isinstance(listed, list) else [])
        if isinstance(v, Mapping)
    )
    tables = data.get("tables")
    return RunSummary(
        run_id(run, key),
        str(data.get("created") or "undated"),
        commit,
        made_by,
        star,
        recommendation,
        verdicts,
        len(tables) if isinstance(tables, list) else 0,
    )


# Widths that keep the table within ~120 columns (it ran to 430, its verdicts on one line).
MADE_BY_WIDTH = 25
VERDICTS_WIDTH = 20


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def verdicts_cell(verdicts: Sequence[tuple[str, str]]) -> str:
    """One verdict as ``name VERDICT``; several as counts (``3 HOLDS, 1 FAILS``), within
    :data:`VERDICTS_WIDTH`."""
    if not verdicts:
        return "-"
    if len(verdicts) == 1:
        name, verdict = verdicts[0]
        return _clip(f"{name} {verdict}", VERDICTS_WIDTH)
    counts = collections.Counter(verdict for _, verdict in verdicts)
    return _clip(", ".join(f"{n} {v}" for v, n in counts.most_common()), VERDICTS_WIDTH)


def runs_table(summaries: Sequence[RunSummary]) -> str:
    """Archived runs, oldest first: id (what ``compare`` takes), date, commit (``*``: with
    uncommitted changes), what made it (a ``prefill-bench`` subcommand, or pytest), C* and the recommendation of its calibration, its
    verdicts; about 120 columns wide."""
    body = [
        (
            r.id,
            r.created[:10],
            r.commit.replace(" dirty", "*"),
            _clip(r.made_by.removeprefix("prefill-bench "), MADE_BY_WIDTH),
            "-" if r.chunk_star is None else star_text(r.chunk_star),
            r.recommendation or "-",
            verdicts_cell(r.verdicts),
            r.tables,
        )
        for r in summaries
    ]
    headers = ("id", "created", "commit", "made by", "C*", "advice", "verdicts", "tables")
    table = tabulate(body, headers=headers, tablefmt="simple", disable_numparse=True)
    if any(r.commit.endswith(" dirty") for r in summaries):
        table += "\n(commit*: made with uncommitted changes)"
    return table
