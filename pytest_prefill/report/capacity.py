"""Capacity searches for a person: the capacity table (tabulate), the text around it, the JSON
document and an SVG of attainment against arrival rate per deployment (standard library, like
the timeline). Rendering only: the numbers come from :mod:`pytest_prefill.plan.capacity`."""

from __future__ import annotations

import datetime
import math
import textwrap
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from tabulate import tabulate

from pytest_prefill import __version__
from pytest_prefill._io import json_number
from pytest_prefill.plan.capacity import CapacityResult
from pytest_prefill.plan.engine_commands import engine_command
from pytest_prefill.plan.rate_search import PERCENTILE, DeploymentResult, target_percentile
from pytest_prefill.plan.sizing import DevicesNeeded
from pytest_prefill.plan.sweep import engine_header
from pytest_prefill.report.assumptions import AnswerBasis
from pytest_prefill.report.text_table import text_table
from pytest_prefill.units import ms

HEADERS = (
    "deployment",
    "max rate req/s",
    "goodput/device",
    "attainment",
    f"TTFT p{PERCENTILE:g} ms",
    f"TPOT p{PERCENTILE:g} ms",
    "binds",
    "sims",
)  # at the default target, 90%: the latency columns follow the target (capacity_headers)


def capacity_headers(target: float) -> tuple[str, ...]:
    """The table's headers, the latency columns at the percentile the target names."""
    p = target_percentile(target)
    return (*HEADERS[:4], f"TTFT p{p:g} ms", f"TPOT p{p:g} ms", *HEADERS[6:])


SCHEMA = "pytest-prefill/capacity"
SCHEMA_VERSION = 1


def _ms(seconds: float) -> str:
    return ms(seconds, 1)


def _rate(value: float, at_least: bool = False) -> str:
    return ("≥ " if at_least else "") + f"{value:,.3g}"


def _row(r: DeploymentResult) -> tuple[str, ...]:
    best = r.best
    flag = "" if r.monotone else " (!)"
    label, sims = r.deployment.label + flag, str(len(r.probes))
    if r.pruned and r.miss is not None:  # below the miss, too far below the best to matter
        per_device = r.miss.rate / r.deployment.devices
        return (label, f"< {r.miss.rate:,.3g}", f"< {per_device:,.3g}", "-", "-", "-", "-", sims)
    if best is None or best.metrics is None:
        return (label, "none", "0", "-", "-", "-", r.binding, sims)
    at_least = r.status == "never missed"
    return (
        label,
        _rate(r.max_rate, at_least),
        _rate(r.goodput_per_device, at_least),
        f"{best.attainment:.1%}",
        _ms(best.metrics.ttft.percentile(target_percentile(r.target))),
        _ms(best.metrics.tpot.percentile(target_percentile(r.target))),
        r.binding,
        sims,
    )


def capacity_table(result: CapacityResult) -> str:
    """One row per deployment, best first: the highest rate within the SLO, per device
    (DistServe's goodput), the attainment and latencies there, and the bound that binds; with
    a prefix cache or paged KV, the hit rate and the preemptions at that rate too."""
    ranked = result.ranked()
    cache = result.engine.prefix_caching or result.engine.kv == "paged"
    columns = capacity_headers(result.target)
    headers = (*columns, "hit rate", "preempted") if cache else columns
    body = [_row(r) + (_cache_cells(r) if cache else ()) for r in ranked]
    return text_table(body, headers)


def _cache_cells(r: DeploymentResult) -> tuple[str, str]:
    """The prefix cache's hit rate and the preemptions at the deployment's answer."""
    metrics = r.best.metrics if r.best is not None and not r.pruned else None
    if metrics is None or metrics.cached_tokens is None:
        return ("-", "-")
    return (f"{metrics.hit_rate:.1%}", f"{metrics.preemptions or 0:,}")


def _devices(count: int) -> str:
    return f"{count:,} device{'s' * (count != 1)}"


def headroom_line(result: CapacityResult) -> str:
    """The workload's own arrival rate against the most the best deployment serves within
    the SLO: how many times the traffic the devices could take, or by how much they fall
    short."""
    best = result.ranked()[0]
    own = f"{result.base_rate:,.3g} req/s"
    on = _devices(result.devices)
    if best.best is None:
        return f"Headroom: none: no deployment meets the SLO on {on}; the workload's own rate is {own}."
    served = f"{best.max_rate:,.3g} req/s"
    if result.headroom >= 1:
        at_least = "at least " if best.status == "never missed" else ""
        return (
            f"Headroom: the workload's own rate is {own}; {best.deployment.label} serves "
            f"{at_least}{served} within the SLO: {at_least}{result.headroom:,.3g}× this traffic "
            f"on {on}."
        )
    return (
        f"Headroom: none: the workload's own rate ({own}) is {1 / result.headroom:,.3g}× what "
        f"the best deployment, {best.deployment.label}, serves within the SLO on {on} "
        f"({served}); see the devices it needs."
    )


def devices_needed_line(needed: DevicesNeeded) -> str:
    """The smallest device count that meets the SLO at the workload's own rate, with the count
    below it that misses, or the largest count tried."""
    rate = f"{needed.rate:,.3g} req/s"
    checked = f"{len(needed.checks)} count(s) checked, {needed.simulations} simulation(s)"
    if needed.unreachable and needed.alone is not None:
        return (
            f"Devices this traffic needs: none would do: on {_devices(needed.max_devices)} "
            f"(--max-devices) {needed.alone.count:,} requests still miss the SLO alone "
            f"(at most {needed.alone.allowed:,} may); no count searched."
        )
    if needed.devices is None:
        last = max(needed.checks, key=lambda c: c.devices)
        best = f"the best, {last.best.label}, " if last.best is not None else ""
        share = (
            f"for {last.attainment:.1%} of requests"
            if not math.isnan(last.attainment)
            else "for fewer requests than that"  # a run stopped once it missed
        )
        return (
            f"Devices this traffic needs: more than {needed.max_devices:,} (the search's bound, "
            f"--max-devices): on {_devices(last.devices)} {best}meets the SLO {share} "
            f"at the workload's own {rate}, under {needed.target:.0%} ({checked})."
        )
    deployment = needed.deployment
    at = next(c for c in needed.checks if c.devices == needed.devices and c.meets)
    line = (
        f"Devices this traffic needs: {needed.devices:,} "
        f"({deployment.label if deployment else '-'} meets the SLO for {at.attainment:.1%} of "
        f"requests at the workload's own {rate}"
    )
    below = [c for c in needed.checks if c.devices == needed.devices - 1]
    if below and math.isnan(below[0].attainment):
        line += f"; on {_devices(below[0].devices)} none meets it"
    elif below:
        line += f"; on {_devices(below[0].devices)} the best reaches {below[0].attainment:.1%}"
    return f"{line}; {checked})."


def engine_line(result: CapacityResult, note: str = "") -> str:
    """The engine profile the search ran under and its first-token rule (``note`` after it,
    e.g. that it is a command's default), and whether the deployments set their own knobs."""
    line = engine_header(result.engine)
    own = [d.deployment for d in result.results if d.deployment.max_batched_tokens is not None]
    if own and any(d.max_batched_tokens != result.engine.max_batched_tokens for d in own):
        line += "; each deployment below sets its own token budget (≤N tok)"
    return line + (f" {note}" if note else "")


def command_line(result: CapacityResult, basis: AnswerBasis | None = None) -> str | None:
    """``Type: vllm serve MODEL --max-num-batched-tokens 1024 ...``: the best deployment in
    the engine's own command and flags (with the model and the device memory fraction when
    ``basis`` has them), then what it rests on; None for the lab's loop, or when nothing meets
    the SLO."""
    basis = basis or AnswerBasis()
    command = result.command(basis.memory_fraction, basis.model, basis.max_model_len)
    if command is None or result.engine.name == "lab":
        return None
    word = "Run" if engine_command(result.engine).start is None else "Type"
    return f"   {word}: {command}" + (f"\n     {basis.type_line}" if basis.type_line else "")


def capacity_text(
    result: CapacityResult,
    cost_source: str,
    needed: DevicesNeeded | None = None,
    engine_note: str = "",
    basis: AnswerBasis | None = None,
) -> str:
    """What ``prefill-bench capacity`` prints: the inputs (the engine profile among them), the
    table, the recommendation with the command to type, the headroom and the devices the
    traffic needs, the notes and how the table is read, with what the answer rests on
    (``basis``: :class:`~pytest_prefill.report.assumptions.AnswerBasis`)."""
    basis = basis or AnswerBasis()
    lines = [
        f"Cost model: {cost_source}",
        *basis.lines,
        f"Workload: {result.workload}",
    ]
    if result.attribution:
        lines.append(f"  data: {result.attribution}")
    lines += [
        engine_line(result, engine_note),
        f"SLO: {result.slo} for >= {result.target:.0%} of requests, on {result.devices} "
        f"device{'s' * (result.devices != 1)}; rates found to within {result.tolerance:.0%}. "
        "Simulated from the cost model, not measured.",
        "",
        capacity_table(result),
        "",
        f"-> {result.recommendation()}",
        *filter(None, [command_line(result, basis)]),
        headroom_line(result),
    ]
    if needed is not None:
        lines.append(devices_needed_line(needed))
        if basis.needed_line:
            lines.append(f"     {basis.needed_line}")
    lines += [f"note: {note}" for note in result.notes()]
    lines += [
        "",
        f"max rate: the highest arrival rate (the workload's, scaled) at which >= "
        f"{result.target:.0%} of requests meet every bound; goodput/device: that rate per "
        "device (DistServe's per-device goodput; vLLM's goodput there, whose duration includes "
        "draining the queue, is in --json); binds: the bound missed first above that rate; "
        "(!): attainment not monotone in rate (see the notes).",
    ]
    return "\n".join(lines)


def capacity_document(
    result: CapacityResult,
    cost_source: str,
    needed: DevicesNeeded | None = None,
    basis: AnswerBasis | None = None,
) -> dict[str, Any]:
    """The whole search as the JSON ``--json`` writes (schema-versioned, with provenance); with
    ``basis``, the command as printed (model, memory fraction, max-model-len) and what the
    answer rests on (``assumptions``)."""
    document = {
        "kind": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "version": __version__,
        "cost_source": cost_source,
        **result.to_dict(),
        "headroom": json_number(result.headroom),
        "devices_needed": needed.to_dict() if needed is not None else None,
    }
    if basis is not None:
        document["command"] = result.command(
            basis.memory_fraction, basis.model, basis.max_model_len
        )
        document["assumptions"] = {
            "lines": [line.strip() for line in basis.lines],
            "type": basis.type_line,
            "devices_needed": basis.needed_line,
        }
    return document


# --- the regression gate: this search against a baseline --------------------------------------


def _differences(baseline: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What two capacity documents did not share (workload, SLO, devices, target, cost model,
    engine profile), a line each."""
    lines = [
        f"{key} differs from the baseline: {baseline.get(key)!r} -> {now[key]!r}"
        for key in ("workload", "slo", "devices", "target", "cost_model")
        if baseline.get(key) != now[key]
    ]
    # a document from before the engine profiles ran the lab's loop
    engine = baseline.get("engine") if isinstance(baseline.get("engine"), dict) else None
    if (engine or {"name": "lab"}).get("name") != now["engine"]["name"] or (
        engine is not None and engine != now["engine"]
    ):
        was = engine.get("label") if engine is not None else "lab (a search before the profiles)"
        lines.append(f"engine differs from the baseline: {was} -> {now['engine']['label']}")
    return lines


def capacity_gate(
    baseline: Any, result: CapacityResult, fail_above: float | None
) -> tuple[bool, list[str]]:
    """This search's goodput per device against ``baseline`` (a document ``--json`` wrote),
    deployment by deployment (matched by label): (passed, lines). A deployment fails when its
    goodput per device fell by more than ``fail_above`` percent *and* by more than the two
    searches' tolerances allow (each rate is known to within its tolerance); ``fail_above``
    None only reports. What the two searches did not share (workload, SLO, devices, cost model,
    engine profile) is said, and a deployment either lacks is listed, not judged.

    Raises:
        ValueError: when ``baseline`` is not a capacity document.
    """
    if not isinstance(baseline, dict) or baseline.get("kind") != SCHEMA:
        raise ValueError(f"the baseline must be a capacity search written by --json ({SCHEMA})")
    before = {
        r["deployment"]["label"]: r
        for r in baseline.get("results") or []
        if isinstance(r, dict) and isinstance(r.get("deployment"), dict)
    }
    lines = _differences(baseline, result.to_dict())
    slack = 100 * (result.tolerance + float(baseline.get("tolerance") or 0))
    rows, failed = [], []
    for r in result.results:
        label = r.deployment.label
        old = before.get(label)
        if old is None or not old.get("goodput_per_device"):
            rows.append((label, "-", f"{r.goodput_per_device:.3g}", "-", "not judged"))
            continue
        change = 100 * (r.goodput_per_device / float(old["goodput_per_device"]) - 1)
        bad = fail_above is not None and -change > max(fail_above, slack)
        failed += [label] if bad else []
        verdict = "FAIL" if bad else "ok"
        rows.append(
            (
                label,
                f"{float(old['goodput_per_device']):.3g}",
                f"{r.goodput_per_device:.3g}",
                f"{change:+.1f}%",
                verdict,
            )
        )
    table = tabulate(
        rows,
        headers=("deployment", "baseline goodput/dev", "now", "change", "gate"),
        tablefmt="simple",
        disable_numparse=True,
    )
    if fail_above is None:
        head = "compared with the baseline (no gate: --fail-above PCT makes it one)"
    elif failed:
        head = f"FAIL: goodput per device fell more than {max(fail_above, slack):g}%: " + ", ".join(
            failed
        )
    else:
        head = (
            f"PASS: no deployment's goodput per device fell more than {max(fail_above, slack):g}%"
        )
    return not failed, [*lines, table, head]


# --- the plot: attainment against arrival rate ---------------------------------------------

WIDTH, HEIGHT = 960, 560
LEFT, RIGHT, TOP, BOTTOM = 70, 290, 90, 70
PALETTE = (
    "#3f76b5",
    "#e07b28",
    "#2f9a62",
    "#c0392b",
    "#8a55b0",
    "#8c6d31",
    "#d6609f",
    "#5b5b5b",
    "#17a2b8",
    "#9aa02d",
)


def _text(
    x: float, y: float, text: str, size: int = 12, anchor: str = "start", **style: str
) -> str:
    extra = "".join(f" {k.replace('_', '-')}={quoteattr(v)}" for k, v in style.items())
    return (
        f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"'
        f' font-family="sans-serif"{extra}>{escape(text)}</text>'
    )


def _decade_ticks(low: float, high: float) -> list[float]:
    ticks = []
    for exponent in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1):
        for mantissa in (1, 2, 5):
            value = mantissa * 10.0**exponent
            if low <= value <= high:
                ticks.append(value)
    return ticks


def attainment_floor(target: float) -> float:
    """The bottom of the plot's attainment axis: the decision band, 30 points below the target
    rounded down to 10% (a 90% target: 60% to 100%), not 0 to 100%, which squashes it."""
    return max(0.0, math.floor(round((target - 0.3) * 10, 9)) / 10)


def _axes(result: CapacityResult, low: float, high: float, x: Any, y: Any) -> list[str]:
    x0, x1, y0, y1 = LEFT, WIDTH - RIGHT, HEIGHT - BOTTOM, TOP
    out = [
        f'<rect x="{x0}" y="{y1}" width="{x1 - x0}" height="{y0 - y1}" fill="#fafafa" stroke="#999"/>'
    ]
    floor = attainment_floor(result.target)
    steps = round((1 - floor) / 0.1)
    for value in [floor + (1 - floor) * i / steps for i in range(steps + 1)]:
        out.append(
            f'<line x1="{x0}" x2="{x1}" y1="{y(value):.1f}" y2="{y(value):.1f}" stroke="#e4e4e4"/>'
        )
        out.append(_text(x0 - 8, y(value) + 4, f"{value:.0%}", 11, "end"))
    for tick in _decade_ticks(low, high):
        out.append(
            f'<line x1="{x(tick):.1f}" x2="{x(tick):.1f}" y1="{y1}" y2="{y0}" stroke="#e4e4e4"/>'
        )
        out.append(_text(x(tick), y0 + 16, f"{tick:g}", 11, "middle"))
    ty = y(result.target)
    out.append(
        f'<line x1="{x0}" x2="{x1}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#333" stroke-dasharray="6 4"/>'
    )
    out.append(_text(x1 - 4, ty - 5, f"target {result.target:.0%}", 11, "end", fill="#333"))
    own = x(result.base_rate)
    out.append(
        f'<line x1="{own:.1f}" x2="{own:.1f}" y1="{y1}" y2="{y0}" stroke="#b03030" '
        'stroke-width="1.5" stroke-dasharray="2 3"/>'
    )
    out.append(
        _text(own + 4, y1 + 14, f"this workload: {result.base_rate:.3g} req/s", 11, fill="#b03030")
    )
    out.append(_text((x0 + x1) / 2, y0 + 40, "arrival rate, requests/s (log scale)", 12, "middle"))
    label = f"SLO attainment (below {floor:.0%}: on the bottom edge)" if floor else "SLO attainment"
    out.append(
        f'<text x="18" y="{(y0 + y1) / 2:.1f}" font-size="12" font-family="sans-serif" '
        f'text-anchor="middle" transform="rotate(-90 18 {(y0 + y1) / 2:.1f})">{label}</text>'
    )
    return out


def _series(r: DeploymentResult, colour: str, x: Any, y: Any) -> list[str]:
    ordered = sorted(r.probes, key=lambda p: p.rate)
    points = " ".join(f"{x(p.rate):.1f},{y(p.attainment):.1f}" for p in ordered)
    out = [f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.8"/>']
    for p in ordered:
        mark = 5 if p is r.best else 3
        fill = colour if p is r.best or p.attainment >= r.target else "white"
        tip = escape(f"{r.deployment.label}: {p.rate:.3g} req/s, attainment {p.attainment:.1%}")
        out.append(
            f'<circle cx="{x(p.rate):.1f}" cy="{y(p.attainment):.1f}" r="{mark}" fill="{fill}" '
            f'stroke="{colour}" stroke-width="1.5"><title>{tip}</title></circle>'
        )
    return out


def capacity_svg(result: CapacityResult, title: str | None = None) -> str:
    """Attainment against arrival rate, one line per deployment: every probe the search ran
    (filled: meets the target; the big dot is the answer), the target dashed, the workload's
    own rate marked; the attainment axis spans the decision band (:func:`attainment_floor`)."""
    rates = [p.rate for r in result.results for p in r.probes if p.rate > 0]
    rates.append(result.base_rate)  # the workload's own rate is marked
    low, high = min(rates) / 1.3, max(rates) * 1.3
    x0, x1, y0, y1 = LEFT, WIDTH - RIGHT, HEIGHT - BOTTOM, TOP
    floor = attainment_floor(result.target)

    def x(rate: float) -> float:
        return x0 + (math.log(rate) - math.log(low)) / (math.log(high) - math.log(low)) * (x1 - x0)

    def y(attainment: float) -> float:  # below the floor: on the bottom edge
        return y0 - (max(attainment, floor) - floor) / (1 - floor) * (y0 - y1)

    heading = title or (
        f"SLO attainment against arrival rate: {result.slo} for >= {result.target:.0%}, "
        f"{result.devices} device{'s' * (result.devices != 1)}. {result.workload}. "
        "Simulated, not measured."
    )
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
    ]
    for i, line in enumerate(textwrap.wrap(heading, 120)[:4]):
        out.append(
            _text(
                20,
                24 + 16 * i,
                line,
                13 if i == 0 else 12,
                font_weight="bold" if i == 0 else "normal",
            )
        )
    out += _axes(result, low, high, x, y)
    for i, r in enumerate(result.ranked()):
        colour = PALETTE[i % len(PALETTE)]
        out += _series(r, colour, x, y)
        ly = TOP + 10 + i * 20
        answer = f"{r.max_rate:.3g} req/s" if r.best is not None else "never met"
        if r.pruned and r.miss is not None:  # as the table says it
            answer = f"< {r.miss.rate:.3g} req/s (stopped)"
        out.append(f'<rect x="{x1 + 16}" y="{ly - 9}" width="14" height="10" fill="{colour}"/>')
        out.append(
            _text(x1 + 36, ly, f"{r.deployment.label}: {answer}{'' if r.monotone else ' (!)'}", 11)
        )
    if result.attribution:
        out.append(_text(20, HEIGHT - 12, f"Data: {result.attribution}", 10, fill="#555"))
    out.append("</svg>")
    return "\n".join(out) + "\n"
