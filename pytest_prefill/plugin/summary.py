"""The controller's end of a session: the run document written to the archive (only when
``--prefill-save`` asked) and the terminal summary (a
short verdict block; the full tables with ``-v``)."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_prefill.archive import saving
from pytest_prefill.machine import Accelerator
from pytest_prefill.plugin.session import RECORDED, STATE, SessionCost, SessionState, session_cost


def timeline_svg(cost: SessionCost) -> str | None:
    try:
        from pytest_prefill.report.timeline_svg import lab_timeline_svg
    except ImportError:
        return None
    assert cost.fitted is not None
    return lab_timeline_svg(cost.fitted.cost, cost.source, refused=cost.fitted.refused)


def run_document(session: pytest.Session, state: SessionState, exitstatus: int) -> dict[str, Any]:
    from pytest_prefill.machine import machine_info

    s = state.settings
    used, calibration = session_cost(state)
    machine = machine_info(s.device, [Accelerator(**a) for a in s.accelerators])
    machine["key"] = s.machine_key
    commit, dirty = saving.git_state(session.config.rootpath)
    models = state.sorted_entries("model")
    counts: dict[str, int] = {}
    for outcome in state.outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    settings = {k: getattr(s, k) for k in ("model", "device", "dtype", "repeats", "warmup")}
    settings.update(dry_run=s.dry_run, threads=s.threads, cost=s.cost_spec, save=s.save)
    cost = None
    if used.fitted is not None:
        cost = saving.cost_block(used.fitted, used.source)
    return saving.run_document(
        created=state.started,
        machine=machine,
        commit=commit,
        dirty=dirty,
        settings=settings,
        cost=cost,
        calibration=calibration,
        model=models[0]["data"] if models else None,
        tables=state.sorted_entries("table"),
        verdicts=state.sorted_entries("verdict"),
        benchmarks=state.sorted_entries("benchmark"),
        pytest={
            "args": list(session.config.invocation_params.args),
            "exit_status": int(exitstatus),
            "xdist_workers": state.workers,
            "outcomes": counts,
        },
    )


def archive_session(session: pytest.Session, exitstatus: int) -> None:
    """Write the run when the user asked (``--prefill-save``; controller only); otherwise say,
    when something of ours ran, how it would have been kept."""
    state = session.config.stash.get(STATE, None)
    if state is None or state.is_worker:
        return
    s = state.settings
    produced = any(e.get("kind") in RECORDED for _, _, e in state.entries)
    if not s.save:
        # Only an explicit --prefill-save writes (pytest-benchmark's --benchmark-autosave):
        # recording a table is not a request to keep it.
        if produced:
            state.archive_note = (
                "not archived (--prefill-no-archive)"
                if not s.archive
                else f"not archived: --prefill-save keeps this run under {s.results}/"
                f"{s.machine_key}/ (where --prefill-cost archive and prefill-bench runs find it)"
            )
        return
    document = run_document(session, state, exitstatus)
    used, _ = session_cost(state)
    svg = None
    if produced and used.fitted is not None:
        try:
            svg = timeline_svg(used)
        except Exception as err:  # a drawing problem must not lose the run
            s.notes.append(f"timeline not drawn: {err}")
    if svg:
        document["timeline"] = {"cost_source": used.source, "attachment": "timeline.svg"}
    try:
        state.archive_path = saving.save_run(
            s.results,
            document,
            when=state.started.astimezone(),
            attachments={"timeline.svg": svg} if svg else None,
        )
    except (OSError, ValueError) as err:
        state.archive_note = f"warning: NOT archived: {err}"
        if s.save:  # asked for, and not done: the run fails, as a failed test would
            state.archive_note += " (--prefill-save asked for it: exit status 1)"
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED


def our_skip_lines(state: SessionState, config: pytest.Config) -> list[str]:
    """Our skip reasons, unless ``-rs`` (or ``-ra``) already lists them."""
    chars = getattr(config.option, "reportchars", "") or ""
    if any(c in chars for c in "saA"):
        return []
    return [
        f"skipped {count} test(s): {reason}" for reason, count in state.skipped.items() if count
    ]


def write_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The pytest-prefill section of the terminal summary (controller only)."""
    state = config.stash.get(STATE, None)
    if state is None or state.is_worker:
        return
    lines = summary(state, config)
    if not lines:
        return
    terminalreporter.write_sep("=", "pytest-prefill")
    for line, markup in lines:
        terminalreporter.write_line(line, **markup)


Markup = dict[str, bool]
GREEN: Markup = {"green": True, "bold": True}
RED: Markup = {"red": True, "bold": True}
YELLOW: Markup = {"yellow": True}


UNDECIDED = "UNDECIDED"


def undecided_line(v: Any) -> str:
    """An UNDECIDED check, said apart from the verdicts: the measurement could not tell, which
    is neither a pass nor a failure."""
    detail = (v.detail or v.sentence or "").strip().splitlines()
    said = detail[0].removeprefix("UNDECIDED: ") if detail else ""
    return (
        f"not decided (neither holds nor fails; more probes or a quieter machine may decide "
        f"it): {v.name}" + (f": {said}" if said else "")
    )


def summary(state: SessionState, config: pytest.Config) -> list[tuple[str, Markup]]:
    """The section's lines: the machine, the verdict block, our skips, pytest-benchmark's
    count, notes, the tables (with ``-v``; else how many), where the run was archived.
    Empty when nothing of ours ran."""
    from pytest_prefill.report.verdicts import (
        NOT_ASSERTED,
        Table,
        Verdict,
        not_asserted,
        summary_lines,
        verdict_block,
        verdict_line,
    )

    tables = [Table.from_dict(e) for e in state.sorted_entries("table")]
    verdicts = [Verdict.from_dict(e) for e in state.sorted_entries("verdict")]
    used, calibration = session_cost(state)
    s = state.settings
    produced = bool(tables or verdicts or calibration)
    skips = our_skip_lines(state, config)
    if not (produced or s.notes or skips or state.archive_path or state.archive_note):
        return []
    out: list[tuple[str, Markup]] = [(f"machine {s.machine_key}", {})]
    if produced:
        # UNDECIDED is not a verdict (an interval straddled the line): said apart, as such
        open_ = [v for v in verdicts if v.verdict == UNDECIDED]
        decided = [v for v in verdicts if v.verdict != UNDECIDED]
        reported = [v for v in decided if not_asserted(v, state.outcomes.get(v.test))]
        asserted = [v for v in decided if v not in reported]
        block = verdict_block(used.fitted, used.source, asserted)
        for line in block:
            out.append(
                (
                    line,
                    GREEN if line.startswith("HOLDS") else RED if line.startswith("FAILS") else {},
                )
            )
        out += [(NOT_ASSERTED + verdict_line(v), YELLOW) for v in reported]
        out += [(undecided_line(v), YELLOW) for v in open_]
    out += [(line, YELLOW) for line in skips]
    out += [(line, {}) for line in benchmark_lines(state.sorted_entries("benchmark"))]
    received = len(state.sorted_entries("calibration"))
    if received > 1:  # the session lock should make this impossible; say so if it happens
        out.append(
            (
                f"note: {received} calibrations were reported this session; the archive holds "
                "the first",
                YELLOW,
            )
        )
    out += [(f"note: {note}", YELLOW) for note in s.notes]
    if tables and config.option.verbose <= 0:
        kept = "the archive holds them" if s.save else "--prefill-save archives them"
        out.append((f"{len(tables)} table(s): -v shows them here; {kept}", {}))
    elif tables or verdicts:
        out += [(line, {}) for line in ["", *summary_lines(tables, verdicts)]]
    return out + [
        (line, RED if line.startswith("warning:") else {}) for line in archive_lines(state)
    ]


def benchmark_lines(benchmarks: list[dict[str, Any]]) -> list[str]:
    if not benchmarks:
        return []
    errored = sum(1 for b in benchmarks if b.get("error"))
    untimed = sum(1 for b in benchmarks if b.get("disabled"))
    return [
        f"pytest-benchmark: {len(benchmarks)} benchmark(s), {errored} errored, "
        f"{untimed} not timed (disabled){'; run serially for statistics' if untimed else ''}"
    ]


def archive_lines(state: SessionState) -> list[str]:
    if state.archive_path is None:
        return [state.archive_note] if state.archive_note else []
    lines = [f"archived: {state.archive_path}"]
    svg = state.archive_path.with_name(f"{state.archive_path.stem}_timeline.svg")
    if svg.is_file():
        lines.append(f"timeline: {svg}")
    return lines
