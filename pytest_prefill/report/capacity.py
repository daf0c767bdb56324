"""Capacity searches for a person: the capacity table (tabulate), the text around it and the JSON
document; the picture is :mod:`.capacity_plot`'s (re-exported here). Rendering only: the numbers
come from :mod:`pytest_prefill.plan.capacity`."""

from __future__ import annotations

import datetime
import math
from typing import Any

from tabulate import tabulate

from pytest_prefill import __version__
from pytest_prefill._io import json_number
from pytest_prefill.plan.advice import CAPACITY_QUESTION
from pytest_prefill.plan.capacity import CapacityResult
from pytest_prefill.plan.engine_commands import engine_command
from pytest_prefill.plan.rate_search import PERCENTILE, DeploymentResult, target_percentile
from pytest_prefill.plan.sizing import DevicesNeeded
from pytest_prefill.plan.sweep import engine_header
from pytest_prefill.report.assumptions import AnswerBasis
from pytest_prefill.report.capacity_plot import (  # the picture, re-exported where it lived
    attainment_floor as attainment_floor,
)
from pytest_prefill.report.capacity_plot import capacity_svg as capacity_svg
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
    if result.prices:
        headers = (*headers, "$/Mtok in", "$/Mtok out", "$/h")
        body = [row + _price_cells(result, r) for row, r in zip(body, ranked)]
    return text_table(body, headers)


def _price_cells(result: CapacityResult, r: DeploymentResult) -> tuple[str, str, str]:
    """A deployment's price per million input and output tokens at its answer, and an
    hour of its devices."""
    assert result.prices is not None
    price = result.prices[r.deployment.label]

    def dollars(value: float) -> str:
        return f"{value:,.3g}" if math.isfinite(value) else "-"

    return (
        dollars(price.input_per_mtok),
        dollars(price.output_per_mtok),
        dollars(price.dollars_per_hour),
    )


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
    on = _devices(result.devices if result.budget is None else best.deployment.devices)
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
    if below and below[0].best is None:  # not a 0% attainment: nothing could be simulated
        line += (
            f"; on {_devices(below[0].devices)} no deployment fits (the model with its KV "
            "cache needs more)"
        )
    elif below and math.isnan(below[0].attainment):
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
    command = result.command(basis.memory_fraction, basis.model, basis.max_model_len, basis.fp8)
    if command is None or result.engine.name == "lab":
        return None
    word = "Run" if engine_command(result.engine).start is None else "Type"
    command = command.replace("\n", "\n         ")  # a split of pools: a command per pool
    return f"   {word}: {command}" + (f"\n     {basis.type_line}" if basis.type_line else "")


def _on(result: CapacityResult) -> str:
    """The devices the deployments use: all the same count, or a budget per kind."""
    if result.budget is None:
        return f"on {_devices(result.devices)}"
    kinds = ", ".join(f"{n} {kind}" for kind, n in result.budget.items())
    return f"within a budget of {kinds} (each deployment its own count)"


def _ranking(result: CapacityResult) -> str | None:
    """What the table is ranked by, when not the same devices' goodput."""
    if result.prices:
        return (
            "Ranked by the price of a million tokens served within the SLO (input and output "
            "tokens together; --price $/device-hour; input priced by the prefill pool's hours, "
            "output by the decode pool's; colocated, by the share of busy time on prompts), "
            "cheapest first."
        )
    if result.budget is not None:
        return "Ranked by goodput per device (the deployments use different devices)."
    return None


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
        *filter(None, [basis.warning]),
        f"Cost model: {cost_source}",
        *basis.lines,
        f"Workload: {result.workload}",
    ]
    if result.attribution:
        lines.append(f"  data: {result.attribution}")
    lines += [
        engine_line(result, engine_note),
        f"SLO: {result.slo} for >= {result.target:.0%} of requests, {_on(result)}; rates "
        f"found to within {result.tolerance:.0%}. Simulated from the cost model, not measured.",
        *filter(None, [_ranking(result)]),
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
        CAPACITY_QUESTION,
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
            basis.memory_fraction, basis.model, basis.max_model_len, basis.fp8
        )
        document["assumptions"] = {
            "lines": [line.strip() for line in basis.lines],
            "type": basis.type_line,
            "devices_needed": basis.needed_line,
            "warning": basis.warning,
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
