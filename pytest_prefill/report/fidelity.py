"""The fidelity run's printed tables (the report layer over ``fidelity``): simulated vs
measured per cell, the error summary, every real iteration against the cost model, the cost
models used, the KV link, and the quiet-machine probe."""

from __future__ import annotations

import math
import statistics
from typing import Any

from pytest_prefill.lab.fidelity_result import (
    STALL_JUDGED_RATIO,
    THRESHOLD,
    FidelityResult,
    percentiles,
)
from pytest_prefill.units import ms


def _ms(seconds: float) -> str:
    return ms(seconds, 1)


def _pct(value: float) -> str:
    return f"{value:+.0%}" if math.isfinite(value) else "n/a"


def fidelity_table(result: FidelityResult) -> str:
    """Per scenario, policy and metric: simulated, measured median [min, max], error, spread."""
    from tabulate import tabulate

    rows = []
    for c in result.cells:
        rows.append(
            (
                c.scenario,
                c.policy,
                c.metric,
                _ms(c.simulated),
                f"{_ms(c.median)} [{_ms(c.minimum)}, {_ms(c.maximum)}]",
                _pct(c.relative_error),
                f"{c.spread:.0%}" if math.isfinite(c.spread) else "n/a",
                "yes" if c.within_spread else "no",
                "" if c.judged else "not judged",
            )
        )
    return tabulate(
        rows,
        headers=(
            "scenario",
            "policy",
            "metric",
            "simulated ms",
            f"measured ms, median [min, max] of {result.runs}",
            "error",
            "spread",
            "in spread",
            "",
        ),
    )


def summary_table(result: FidelityResult) -> str:
    """Median |relative error| by policy and by metric (judged cells, and all cells), the
    policies not run, and the verdict line."""
    from tabulate import tabulate

    judged_policy, all_policy = result.by("policy"), result.by("policy", only_judged=False)
    judged_metric, all_metric = result.by("metric"), result.by("metric", only_judged=False)
    left = tabulate(
        [(k, f"{v:.1%}", f"{all_policy[k]:.1%}") for k, v in judged_policy.items()],
        headers=("policy", "median |error|", "all cells"),
    )
    right = tabulate(
        [(k, _pct_abs(judged_metric.get(k)), f"{v:.1%}") for k, v in all_metric.items()],
        headers=("metric", "median |error|", "all cells"),
    )
    inside = sum(c.within_spread for c in result.cells)
    unjudged = sum(not c.judged for c in result.cells)
    lines = [left, "", right, ""]
    lines += [f"{policy}: {reason}" for policy, reason in result.not_run.items()]
    lines += [
        f"{inside} of {len(result.cells)} simulated values lie within the measured [min, max].",
        f"{unjudged} max-stall cell(s) not judged: the simulator predicts no policy-caused "
        f"stall there (under {STALL_JUDGED_RATIO:g}x its median token gap), so the measured "
        "maximum is the machine's jitter; they are reported above.",
        f"median |relative error| over all cells: {result.median_abs_error_all:.1%}",
        f"median |relative error| over the judged cells: {result.median_abs_error:.1%} "
        f"(threshold {THRESHOLD:.0%}): {'PASS' if result.passed else 'FAIL'}",
    ]
    if result.quiet is not None and result.quiet.warning:
        lines.append(result.quiet.warning)
    return "\n".join(lines)


def _pct_abs(value: float | None) -> str:
    return f"{value:.1%}" if value is not None else "-"


def calibration_table(result: FidelityResult) -> str:
    """The cost models the simulator used, with the held-out error of each."""
    from tabulate import tabulate

    rows = []
    for name, calibration in result.calibrations.items():
        cost = calibration.cost
        rows.append(
            (
                name,
                _ms(cost.prefill_pass_overhead),
                f"{cost.prefill_per_token * 1e6:.1f}",
                f"{cost.prefill_per_pair * 1e9:.2f}",
                _ms(cost.decode_step_base),
                _ms(cost.decode_per_seq),
                f"{cost.decode_per_kv_token * 1e9:.1f}",
                f"{cost.fusion_penalty:.2f}",
                _pct_abs(calibration.held_out_median),
            )
        )
    return tabulate(
        rows,
        headers=(
            "calibration",
            "overhead ms",
            "us/token",
            "ns/pair",
            "decode ms",
            "ms/row",
            "ns/KV token",
            "fusion",
            "held-out err",
        ),
    )


def link_table(result: FidelityResult) -> str:
    """The link's calibration and the transfers measured during the disaggregated runs."""
    from tabulate import tabulate

    if result.link is None:
        return "KV link: not measured (disaggregation did not run)"
    rows = [
        (f"{b / 1e6:.2f} MB", f"{_ms(m.median)} [{_ms(m.minimum)}, {_ms(m.maximum)}]")
        for b, m in result.link.points
    ]
    text = tabulate(
        rows,
        headers=("KV bytes", "prefill end to KV arrival ms, median [min, max]"),
    )
    bandwidth = (
        f"{result.link.bandwidth / 1e9:.2f} GB/s" if math.isfinite(result.link.bandwidth) else "inf"
    )
    lines = [
        text,
        f"link: latency {result.link.latency * 1e6:.1f} us, bandwidth {bandwidth} "
        f"({result.link.note})",
    ]
    if result.transfers:
        t = sorted(result.transfers)
        lines.append(
            f"transfers in the disaggregated runs: {len(t)}, median {_ms(statistics.median(t))} ms "
            f"[{_ms(t[0])}, {_ms(t[-1])}]"
        )
    return "\n".join(lines)


def weakest_text(result: FidelityResult, n: int = 5) -> str:
    lines = [f"Where the simulator is furthest from the engine (top {n} |error|):"]
    for c in result.weakest(n):
        lines.append(
            f"  {c.scenario} / {c.policy} / {c.metric}: simulated {_ms(c.simulated)} ms, "
            f"measured {_ms(c.median)} ms [{_ms(c.minimum)}, {_ms(c.maximum)}] "
            f"({_pct(c.relative_error)})"
        )
    return "\n".join(lines)


def iteration_table(result: FidelityResult) -> str:
    """Every real iteration against the cost model's value for its exact composition."""
    from tabulate import tabulate

    rows = []
    for policy, kinds in result.iterations.items():
        for kind, errors in kinds.items():
            p = percentiles(errors)
            rows.append(
                (
                    policy,
                    kind,
                    p["count"],
                    _pct(p["median"]),
                    f"[{_pct(p['p10'])}, {_pct(p['p90'])}]",
                )
            )
    return tabulate(rows, headers=("policy", "iteration", "count", "median error", "[p10, p90]"))


def fidelity_report(result: FidelityResult, loaded: Any) -> str:
    """Everything a fidelity run prints, in order, as one text."""
    info = result.provenance
    loud = [result.quiet.warning, ""] if result.quiet is not None and result.quiet.warning else []
    lines = [
        *loud,
        f"Fidelity: {loaded.name} ({loaded.source}) on {info['device_name']}, {info['dtype']}; "
        f"torch {info['torch']}, transformers {info['transformers']}; {info['date']}",
        f"{result.runs} real runs per scenario and policy; calibration {info['repeats']} repeats "
        f"after {info['warmup']} warmup{' (dry run)' if info['dry_run'] else ''}; "
        f"chunked policy: chunk {result.chunk}; machine "
        f"{'quiet' if result.quiet is None or result.quiet.quiet else 'BUSY'} before timing",
        "",
        "Equal total resources:",
        *(f"  {policy}: {setup}" for policy, setup in result.setups.items()),
        *(f"  {policy}: {reason}" for policy, reason in result.not_run.items()),
        "  each is simulated with a cost model calibrated on the engine in the same setting "
        "(the disaggregated one by the two worker processes themselves, both at once):",
        calibration_table(result),
        "",
        "Scenarios:",
        *(f"  {s.name}: {s.note}" for s in result.scenarios),
        *(f"  ({reason})" for reason in result.skipped),
        "",
        fidelity_table(result),
        "",
        summary_table(result),
        "",
        weakest_text(result),
        "",
        "Each real iteration vs. the cost model for its exact composition (measured - "
        "predicted) / predicted:",
        iteration_table(result),
        "",
        "KV link (shared memory between the two worker processes):",
        link_table(result),
    ]
    return "\n".join(lines)
