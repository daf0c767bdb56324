"""Fidelity against a running server, for a person: the table of simulated against measured
serving metrics per held-out workload, the judged median error beside the noise floor, each
counter-check on the cells where it predicts differently, and the verdict."""

from __future__ import annotations

from tabulate import tabulate

from pytest_prefill.serve.fidelity.fidelity import ServerFidelity, knob
from pytest_prefill.serve.fidelity.fidelity_interval import Interval
from pytest_prefill.serve.fidelity.judgement import SEPARATION, CounterCheck
from pytest_prefill.units import ms

MAX_NAMED = 4  # a counter-check's cells are named up to this many, counted beyond


def _pct(value: float) -> str:
    return f"{value:+.1%}" if value == value else "-"


def fidelity_table(result: ServerFidelity) -> str:
    """One row per (workload, metric, statistic)."""
    rows = []
    for c in result.cells:
        rows.append(
            [
                c.workload,
                f"{c.metric.upper()} {c.stat}",
                ms(c.simulated_value),
                f"{ms(c.measured_value)} [{ms(min(c.measured))}, {ms(max(c.measured))}]",
                _pct(c.error),
                f"{c.noise:.1%}",
                "yes" if c.judged else "no (noisy)",
            ]
        )
    headers = [
        "workload",
        "metric",
        "simulated ms",
        "measured ms [min, max]",
        "error",
        "noise",
        "judged",
    ]
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def _within(value: float, interval: Interval | None) -> str:
    if interval is None:
        return f"{value:.1%}"
    return f"{value:.1%} [{interval.low:.1%}, {interval.high:.1%}]"


def _cells(check: CounterCheck, judged: int) -> str:
    """The discriminating cells: named (a workload's once) when few, else counted by workload."""
    by: dict[str, list[str]] = {}
    for workload, metric, stat in check.cells:
        by.setdefault(workload, []).append(f"{metric.upper()} {stat}")
    if len(check.cells) <= MAX_NAMED:
        named = "; ".join(f"{w} {', '.join(cells)}" for w, cells in by.items())
    else:
        named = ", ".join(f"{w} {len(cells)}" for w, cells in by.items())
    return f"{len(check.cells)} of {judged} judged cells ({named})"


def counter_line(label: str, check: CounterCheck, judged: int) -> str:
    """One counter-check: its verdict where it predicts differently, beside the right
    scheduling's figures on the same cells, and its figures over every judged cell."""
    every = f"every judged cell: {check.overall.error:.1%}, TTFT {check.overall.ttft_error:.1%}"
    wrong, right = check.judgement, check.right
    if wrong is None or right is None:
        return (
            f"  {label}: no judged cell where it predicts over {SEPARATION:g}x the threshold "
            f"apart (at most {check.apart:.1%}) -> {check.verdict} ({every})"
        )
    ttft = ""  # the TTFT figure, where it is not the same cells' as the first
    if (
        any(metric != "ttft" for _, metric, _ in check.cells)
        and wrong.ttft_error == wrong.ttft_error
    ):
        ttft = f", TTFT {_within(wrong.ttft_error, wrong.ttft_interval)}"
    return (
        f"  {label}: on {_cells(check, judged)}: {_within(wrong.error, wrong.interval)}{ttft}, "
        f"the right profile {_within(right.error, right.interval)} -> {check.verdict} ({every})"
    )


def summary_lines(result: ServerFidelity) -> list[str]:
    j = result.judgement
    judged = sum(c.judged for c in result.cells)
    level = j.interval.level if j.interval is not None else None
    how = (
        f"; [{level:.0%} bootstrap interval over requests and runs, "
        f"{j.interval.resamples} resamples]"
        if j.interval is not None and level is not None
        else ""
    )
    lines = [
        f"median |error| over {judged} judged cells: {_within(j.error, j.interval)} (threshold "
        f"{j.threshold:.0%}); over the TTFT cells: {_within(j.ttft_error, j.ttft_interval)} "
        f"(threshold {j.ttft_threshold:.0%}); noise floor (the measured runs' spread): median "
        f"{result.noise:.1%}{how}",
        f"counter-checks, each judged on the judged cells where its prediction is over "
        f"{SEPARATION:g}x the cell's threshold from the right profile's:",
    ]
    lines += [counter_line(label, c, judged) for label, c in result.wrong.items()]
    untold = result.cannot_tell()
    for label, check in result.wrong.items():
        if knob(label) not in untold:
            continue
        why = (
            f"its predictions differ from the right profile's by at most {check.apart:.1%} on "
            f"any judged cell"
            if not check.cells
            else "where it predicts differently, its wrong setting does not FAIL"
        )
        lines.append(f"  this run cannot tell {knob(label)} apart: {why}")
    if result.fallback:
        lines.append(f"WARNING: {result.fallback}")
    sentence = (
        f"the simulator, with the cost model calibrated from this server and its scheduling "
        f"({result.scheduling.label()}), predicts its serving metrics within {j.threshold:.0%} "
        f"and its TTFTs within {j.ttft_threshold:.0%} (median over judged cells)"
    )
    if j.verdict == "UNDECIDED":
        sentence += ": the interval straddles a threshold"
    lines.append(f"{result.verdict}: {sentence}")
    return lines


def fidelity_report(result: ServerFidelity) -> str:
    overhead = result.calibration.overhead
    lines = [f"WARNING: {result.fallback}"] if result.fallback else []
    lines.append("Held-out workloads:")
    for w in result.workloads:
        lines.append(f"  {w.name}: {w.description}")
        if w.attribution:
            lines.append(f"    data: {w.attribution}")
    lines.append(
        f"Request overhead kept apart: {ms(overhead.total)} ms a request "
        f"({ms(overhead.arrival_delay)} ms on the way in, added to each simulated arrival; "
        f"{ms(overhead.from_engine)} ms back, added to each simulated token)"
    )
    lines += ["", fidelity_table(result), "", *summary_lines(result)]
    return "\n".join(lines)
