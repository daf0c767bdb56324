"""Fidelity against a running server, for a person: the table of simulated against measured
serving metrics per held-out workload, the judged median error beside the noise floor, what a
wrong first-token rule or budget would have scored on the same runs, and the verdict."""

from __future__ import annotations

from tabulate import tabulate

from pytest_prefill.serve.fidelity import ServerFidelity
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


def summary_lines(result: ServerFidelity) -> list[str]:
    j = result.judgement
    judged = sum(c.judged for c in result.cells)
    lines = [
        f"median |error| over {judged} judged cells: {j.error:.1%} (threshold {j.threshold:.0%}); "
        f"over the TTFT cells: {j.ttft_error:.1%} (threshold {j.ttft_threshold:.0%}); noise floor "
        f"(the measured runs' spread): median {result.noise:.1%}",
    ]
    for label, wrong in result.wrong.items():
        lines.append(
            f"  the same runs simulated with {label}: {wrong.error:.1%}, TTFT {wrong.ttft_error:.1%}"
            f" -> {wrong.verdict}"
        )
    sentence = (
        f"the simulator, with the cost model calibrated from this server and its scheduling "
        f"({result.scheduling.label()}), predicts its serving metrics within {j.threshold:.0%} "
        f"and its TTFTs within {j.ttft_threshold:.0%} (median over judged cells)"
    )
    lines.append(f"{result.verdict}: {sentence}")
    return lines


def fidelity_report(result: ServerFidelity) -> str:
    overhead = result.calibration.overhead
    lines = ["Held-out workloads:"]
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
