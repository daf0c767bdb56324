"""Fidelity against a running server, for a person: the table of simulated against measured
serving metrics per held-out workload, the judged median error beside the noise floor, what a
wrong first-token rule or budget would have scored on the same runs, and the verdict."""

from __future__ import annotations

from tabulate import tabulate

from pytest_prefill.serve.fidelity import ServerFidelity
from pytest_prefill.serve.fidelity_interval import Interval
from pytest_prefill.units import ms


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
    ]
    for label, wrong in result.wrong.items():
        lines.append(
            f"  the same runs simulated with {label}: {_within(wrong.error, wrong.interval)}, "
            f"TTFT {_within(wrong.ttft_error, wrong.ttft_interval)} -> {wrong.verdict}"
        )
    for knob in result.cannot_tell():
        lines.append(f"  this run cannot tell {knob} apart: its wrong setting does not FAIL")
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
