"""vLLM's serving metrics as a person reads them: one row per run (TTFT, TPOT, ITL and E2EL in
milliseconds, throughputs, goodput and attainment under an SLO). The numbers come from
:mod:`pytest_prefill.plan.metrics`."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tabulate import tabulate

from pytest_prefill.plan.metrics import ServingMetrics
from pytest_prefill.units import ms


def serving_table(runs: Sequence[tuple[str, ServingMetrics]]) -> str:
    """vLLM's serving metrics, one row per (label, metrics): TTFT, TPOT, ITL and E2EL in ms
    (mean and p99; p99 needs it among the computed percentiles), throughputs, and goodput and
    attainment when the metrics carry an SLO; the prefix cache's hit rate when a simulated run
    used it; under the table, for simulated runs, the engine profile(s) and first-token rule
    that produced them."""
    with_slo = any(m.slo is not None for _, m in runs)
    with_cache = any(m.cached_tokens for _, m in runs)
    headers = ["run", "TTFT mean", "TTFT p99", "TPOT mean", "TPOT p99", "ITL p99", "E2EL p99"]
    headers += ["req/s", "out tok/s"] + (["goodput req/s", "attainment"] if with_slo else [])
    headers += ["hit rate"] if with_cache else []
    body = []
    for label, m in runs:
        row = [label, ms(m.ttft.mean, 1), ms(m.ttft.percentile(99), 1), ms(m.tpot.mean, 1)]
        row += [
            ms(m.tpot.percentile(99), 1),
            ms(m.itl.percentile(99), 1),
            ms(m.e2el.percentile(99), 1),
        ]
        row += [f"{m.request_throughput:,.3g}", f"{m.output_throughput:,.4g}"]
        if with_slo:
            row += ["-", "-"] if m.slo is None else [f"{m.goodput:,.3g}", f"{m.attainment:.1%}"]
        if with_cache:
            row.append("-" if m.cached_tokens is None else f"{m.hit_rate:.1%}")
        body.append(row)
    table = tabulate(
        body,
        headers=headers,
        tablefmt="simple",
        disable_numparse=True,
        colalign=("left",) + ("right",) * (len(headers) - 1),
    )
    return "\n".join([table, *filter(None, [engines_line(m for _, m in runs)])])


def engines_line(metrics: Iterable[ServingMetrics]) -> str | None:
    """``Simulated under engine vllm (first token from the prefill).``: the profiles and rules
    of the simulated runs among ``metrics`` (None when none was simulated)."""
    rules = {"prefill": "first token from the prefill", "decode": "first token after a decode step"}
    seen = dict.fromkeys((m.engine, m.first_token) for m in metrics if m.engine is not None)
    if not seen:
        return None
    named = ", ".join(f"{name} ({rules.get(rule or '', rule)})" for name, rule in seen)
    return f"Simulated under engine {named}."
