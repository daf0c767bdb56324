"""The fidelity run's printed tables (the report layer over ``fidelity``): simulated vs
measured per cell, the error summary, fused-iteration rules, the prefill shape, the KV link."""

from __future__ import annotations

import math
import statistics

from pytest_prefill.fidelity import (
    FUSED_ROW_CONTEXT,
    THRESHOLD,
    FidelityResult,
    fused_errors,
    percentiles,
    prefill_shape,
)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}" if seconds >= 0.01 else f"{seconds * 1e3:.2f}"


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
        ),
    )


def summary_table(result: FidelityResult) -> str:
    """Median |relative error| by policy and by metric, and the verdict line."""
    from tabulate import tabulate

    by_policy = result.by("policy")
    by_metric = result.by("metric")
    inside = sum(c.within_spread for c in result.cells)
    left = tabulate(
        [(k, f"{v:.1%}") for k, v in by_policy.items()], headers=("policy", "median |error|")
    )
    right = tabulate(
        [(k, f"{v:.1%}") for k, v in by_metric.items()], headers=("metric", "median |error|")
    )
    verdict = "PASS" if result.passed else "FAIL"
    return (
        f"{left}\n\n{right}\n\n{inside} of {len(result.cells)} simulated values lie within "
        f"the measured [min, max].\nmedian |relative error| over all cells: "
        f"{result.median_abs_error:.1%} (threshold {THRESHOLD:.0%}): {verdict}"
    )


def fused_table(result: FidelityResult) -> str:
    """Fused passes measured directly beside their parts and each rule's prediction."""
    from tabulate import tabulate

    if not result.fused:
        return "no fused iterations measured"
    names = list(result.fused[0].predictions)
    rows = []
    for p in result.fused:
        m = p.fused.median
        row = [
            p.tokens,
            p.context,
            p.rows,
            f"{_ms(m)} [{_ms(p.fused.minimum)}, {_ms(p.fused.maximum)}]",
            _ms(p.chunk_alone.median),
            _ms(p.decode_alone.median),
        ]
        row += [f"{_ms(p.predictions[n])} ({_pct((p.predictions[n] - m) / m)})" for n in names]
        row.append(f"{_ms(p.cost_model)} ({_pct((p.cost_model - m) / m)})")
        rows.append(row)
    errors = fused_errors(result.fused)
    rules = {k: v for k, v in errors.items() if k in names}
    best = min(rules, key=lambda k: rules[k])
    text = tabulate(
        rows,
        headers=[
            "chunk",
            "context",
            "rows",
            "fused ms [min, max]",
            "chunk alone",
            "decode alone",
            *names,
            "fitted cost model",
        ],
    )
    ranked = "; ".join(f"{n} {e:.1%}" for n, e in sorted(errors.items(), key=lambda kv: kv[1]))
    return (
        f"{text}\n(each decode row holds {FUSED_ROW_CONTEXT} cached tokens; rules combine "
        f"the parts measured alone)\nmedian |error|: {ranked}\nbest rule here: {best}"
    )


def prefill_shape_table(result: FidelityResult) -> str:
    """The prefill pass measured, the linear cost model's fit, and a fit with a T^2 term."""
    from tabulate import tabulate

    rows = []
    for name, calibration in result.calibrations.items():
        for tokens, measured, linear, quadratic in prefill_shape(calibration):
            rows.append(
                (
                    name,
                    tokens,
                    _ms(measured),
                    f"{_ms(linear)} ({_pct((linear - measured) / measured)})",
                    f"{_ms(quadratic)} ({_pct((quadratic - measured) / measured)})",
                )
            )
    return tabulate(
        rows,
        headers=(
            "calibration",
            "prompt tokens",
            "measured ms",
            "cost model (linear)",
            "with a T^2 term",
        ),
    )


def link_table(result: FidelityResult) -> str:
    """The link's calibration and the transfers measured during the disaggregated runs."""
    from tabulate import tabulate

    rows = [
        (f"{b / 1e6:.2f} MB", f"{_ms(m.median)} [{_ms(m.minimum)}, {_ms(m.maximum)}]")
        for b, m in result.link.points
    ]
    text = tabulate(
        rows,
        headers=("KV bytes", "copy ms, median [min, max]"),
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
