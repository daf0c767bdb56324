"""A measured run against a server, for a person: vLLM ``bench serve``'s result block (the same
names and order, so the two can be read side by side), then what the figures rest on: the
server's identity, failed requests, lengths the server's usage does not confirm."""

from __future__ import annotations

from pytest_prefill.plan.metrics import Distribution, ServingMetrics
from pytest_prefill.serve.load.records import BenchRun
from pytest_prefill.units import ms

WIDTH = 50
TITLES = {
    "ttft": ("Time to First Token", "TTFT"),
    "tpot": ("Time per Output Token (excl. 1st token)", "TPOT"),
    "itl": ("Inter-token Latency", "ITL"),
    "e2el": ("End-to-end Latency", "E2EL"),
}


def _line(label: str, value: str) -> str:
    return f"{label:<40} {value:>9}"


def _rule(title: str, fill: str = "-") -> str:
    return f"{title:{fill}^{WIDTH}}" if title else fill * WIDTH


def _latency(name: str, dist: Distribution) -> list[str]:
    title, short = TITLES[name]
    lines = [_rule(title)]
    lines.append(_line(f"Mean {short} (ms):", ms(dist.mean)))
    lines.append(_line(f"Median {short} (ms):", ms(dist.median)))
    for p, value in dist.percentiles:
        if p != 50:
            lines.append(_line(f"P{p:g} {short} (ms):", ms(value)))
    return lines


def metrics_block(
    metrics: ServingMetrics,
    failed: int = 0,
    max_concurrency: int | None = None,
    peak_concurrency: int | None = None,
) -> str:
    """vLLM's serving benchmark result block for ``metrics``, with its "Maximum request
    concurrency" (the cap asked for, when one was) and "Peak concurrent requests" lines."""
    lines = [_rule(" Serving Benchmark Result ", "=")]
    lines.append(_line("Successful requests:", f"{metrics.completed:,}"))
    if failed:
        lines.append(_line("Failed requests:", f"{failed:,}"))
    if max_concurrency is not None:
        lines.append(_line("Maximum request concurrency:", f"{max_concurrency:,}"))
    lines.append(_line("Benchmark duration (s):", f"{metrics.duration:,.2f}"))
    lines.append(_line("Total input tokens:", f"{metrics.total_input_tokens:,}"))
    lines.append(_line("Total generated tokens:", f"{metrics.total_output_tokens:,}"))
    lines.append(_line("Request throughput (req/s):", f"{metrics.request_throughput:,.2f}"))
    if metrics.slo is not None:
        lines.append(_line(f"Request goodput ({metrics.slo}) (req/s):", f"{metrics.goodput:,.2f}"))
        lines.append(_line("SLO attainment:", f"{metrics.attainment:.1%}"))
    lines.append(_line("Output token throughput (tok/s):", f"{metrics.output_throughput:,.2f}"))
    if peak_concurrency is not None:
        lines.append(_line("Peak concurrent requests:", f"{peak_concurrency:,}"))
    lines.append(_line("Total Token throughput (tok/s):", f"{metrics.total_token_throughput:,.2f}"))
    for name in TITLES:
        lines += _latency(name, getattr(metrics, name))
    lines.append(_rule("", "="))
    return "\n".join(lines)


# The run served less than this share of the rate offered, and its last token came more than
# half the sending span after the last *scheduled* send (not the last actual one: a concurrency
# cap delays the sends and would hide the drain): the queue grew, and the latencies include it.
KEPT_UP = 0.9


def offered_line(run: BenchRun, metrics: ServingMetrics) -> str | None:
    """The rate the schedule offered against the rate served (None: one request, or all at
    once)."""
    offered = run.offered_rate()
    if offered is None:
        return None
    return (
        f"Offered: {offered:.3g} req/s (the schedule's sends, first to last); served "
        f"{metrics.request_throughput:.3g} req/s (request throughput)"
    )


def overload_line(run: BenchRun, metrics: ServingMetrics) -> str | None:
    """A warning when the server did not keep up with the rate offered (the queue grew, in
    the server or behind ``--max-concurrency``), or None."""
    offered = run.offered_rate()
    completed = run.completed
    if offered is None or not completed:
        return None
    sent = [r.scheduled for r in run.records]
    span = max(sent) - min(sent)
    drain = max(r.chunk_times[-1] for r in completed) - max(sent)
    if metrics.request_throughput >= KEPT_UP * offered or drain <= span / 2:
        return None
    late = max(r.arrival - r.scheduled for r in run.records)
    cap = max_concurrency_of(run)
    held = (
        f"; --max-concurrency {cap} held sends back, the latest {late:,.1f} s after its time "
        "(those waits are not in the latencies, the server's own queue is)"
        if cap is not None and late > span / 10
        else ""
    )
    return (
        f"warning: the server did not keep up: {offered:.3g} req/s offered, "
        f"{metrics.request_throughput:.3g} req/s served (request throughput); the last "
        f"token came {drain:,.1f} s after the last scheduled send{held}. Requests queued: "
        "the figures above describe an overloaded server. Lower the rate (--arrivals "
        "poisson:RATE) to measure it unloaded."
    )


def max_concurrency_of(run: BenchRun) -> int | None:
    schedule = run.settings.get("schedule") or {}
    value = schedule.get("max_concurrency") if isinstance(schedule, dict) else None
    return value if isinstance(value, int) else None


def run_notes(run: BenchRun) -> list[str]:
    """What a reader must know about the run beside its figures."""
    server = run.server
    notes = [
        f"Server: {server['url']} ({server['engine']}, {server['engine_from']}), model "
        f"{', '.join(server['models'])}"
        + (f", version {server['version']}" if server.get("version") else "")
    ]
    if server.get("flags"):
        notes.append(f"  flags (as stated): {server['flags']}")
    notes.append(f"Prompts: {run.settings['prompts']}; started {run.started}")
    if run.stopped:
        notes.append(f"Stopped early: {run.stopped}")
    failed = run.failed
    if failed:
        notes.append(f"{len(failed)} request(s) failed; the first: {failed[0].error}")
    inexact = run.inexact()
    if inexact:
        r = inexact[0]
        notes.append(
            f"warning: {len(inexact)} request(s) have lengths the server's usage does not "
            f"confirm (e.g. {r.id}: asked {r.prompt_len}/{r.output_len} tokens, usage "
            f"{r.prompt_tokens}/{r.output_tokens}, {r.tokens_received} received)"
        )
    if any(r.counts_assumed for r in run.completed) and not inexact:
        notes.append("  (one token per streamed chunk, as the server's usage totals confirm)")
    if run.server_counters is not None:
        notes.append(run.server_counters.line())
    return notes


def bench_text(run: BenchRun, metrics: ServingMetrics) -> str:
    block = metrics_block(metrics, len(run.failed), max_concurrency_of(run), run.peak_concurrency())
    extra = [offered_line(run, metrics), overload_line(run, metrics)]
    return "\n".join([block, *run_notes(run), *filter(None, extra)])
