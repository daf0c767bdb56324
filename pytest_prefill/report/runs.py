"""The archived runs as a table: the ids ``compare`` takes, what made each run, its C*, its
recommendation and its verdicts."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from tabulate import tabulate

from pytest_prefill.archive.runs import RunFile, run_id
from pytest_prefill.plan.advice import recommend, star_text
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
            advice = recommend(cost, {str(c) for c in refused}, trust=trust_in(run.calibration))
            star, recommendation = advice.chunk_star, advice.policy
    verdicts = tuple(
        (str(v.get("name")), str(v.get("verdict")))
        for v in data.get("verdicts") or []
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


def runs_table(summaries: Sequence[RunSummary]) -> str:
    """Archived runs, oldest first: id (what ``compare`` takes), date, commit, what made it,
    C* and the recommendation of its calibration, its verdicts."""
    body = [
        (
            r.id,
            r.created,
            r.commit,
            r.made_by if len(r.made_by) <= 48 else r.made_by[:47] + "…",
            "-" if r.chunk_star is None else star_text(r.chunk_star),
            r.recommendation or "-",
            ", ".join(f"{name} {verdict}" for name, verdict in r.verdicts) or "-",
            r.tables,
        )
        for r in summaries
    ]
    headers = ("id", "created", "commit", "made by", "C*", "recommendation", "verdicts", "tables")
    return tabulate(body, headers=headers, tablefmt="simple", disable_numparse=True)
