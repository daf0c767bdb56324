"""The archived runs as a table: the ids ``compare`` takes, what made each run, its C*, its
recommendation and its verdicts."""

from __future__ import annotations

from collections.abc import Sequence

from tabulate import tabulate

from pytest_prefill.archive.runs import RunSummary
from pytest_prefill.plan.advice import star_text


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
