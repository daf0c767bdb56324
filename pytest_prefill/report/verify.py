"""A verification on a server, for a person: per flag set the predicted and measured knee (with
its interval), their ratio judged against the goal, and the attainment measured at the
predicted rate; every probe; and whether the measured ranking of the flag sets agrees with the
predicted one, and whether the measurement separates the best from the next."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tabulate import tabulate

from pytest_prefill.verify.knee import MeasuredProbe
from pytest_prefill.verify.load_check import speed_range
from pytest_prefill.verify.ranking import agrees, best_verdict, order_text, ranking, tied_best
from pytest_prefill.verify.verification import FlagSetResult, VerifyResult, ranking_tolerance


def _rate(value: float | None) -> str:
    return f"{value:.3g}" if value is not None and math.isfinite(value) and value > 0 else "-"


def _bound(value: float | str) -> str:
    value = float(value)  # a document keeps inf as "inf"
    if math.isinf(value):
        return "inf"
    return f"{value:.3g}" if value > 0 else "0"


def _interval(estimate: Mapping[str, Any] | None) -> tuple[float, float] | None:
    """A document's knee interval as numbers (None: no estimate, or a bound that is null)."""
    if not estimate or estimate.get("low") is None or estimate.get("high") is None:
        return None
    return float(estimate["low"]), float(estimate["high"])


def _knee(r: FlagSetResult) -> str:
    """The estimated knee and its interval (open: below the lowest probe, above the highest)."""
    e = r.measured.estimate if r.measured is not None else None
    if e is None or r.measured is None:
        return "-"
    rates = [p.rate for p in r.measured.probes]
    point = _bound(e.rate)
    if e.rate <= 0:
        point = f"< {_bound(min(rates))}"
    elif math.isinf(e.rate):
        point = f"> {_bound(max(rates))}"
    return f"{point} [{_bound(e.low)}, {_bound(e.high)}]"


def _ratio(r: FlagSetResult) -> str:
    a = r.agreement
    if a is None:
        return f"{r.ratio:.2f}" if math.isfinite(r.ratio) else "-"
    ratio = _bound(a.ratio) if 0 < a.ratio < math.inf else "-"
    return f"{ratio} [{_bound(a.low)}, {_bound(a.high)}] {a.verdict}"


def _measured(r: FlagSetResult) -> str:
    m = r.measured
    if m is None:
        return "-"
    if m.status == "found":
        return f"{_rate(m.rate)} (< {_rate(m.high.rate if m.high else None)})"
    if m.status == "bracketed":
        return f"{_rate(m.rate)}-{_rate(m.high.rate if m.high else None)} (probes ran out)"
    if m.status == "never met":
        return f"< {_rate(min(p.rate for p in m.probes))} (never met)"
    if m.status == "never missed":
        return f">= {_rate(m.rate)} (never missed)"
    return f"{_rate(m.rate)} ({m.status})"


def _sharp(r: FlagSetResult) -> str:
    """The simulated attainment just above and just below the predicted knee, flagged when an
    overload of the goal's size is not predicted to miss the target by the margin."""
    s = r.sharpness
    if s is None or not (math.isfinite(s.above) and math.isfinite(s.below)):
        return "-"
    return f"{s.above:.0%} / {s.below:.0%}" + ("" if s.decisive else " NOT decisive")


def _load(r: FlagSetResult) -> str:
    """The load check's factor on the calibration's cost, and the knee it moved from."""
    c = r.load_check
    if c is None or not c.runs:
        return "-"
    if len(c.runs) == 1:
        fit = c.runs[0].fit
        if not fit.kept:
            return "x1 (refused)"
        return (
            f"x{fit.estimate:.2f} [{fit.low:.2f}, {fit.high:.2f}] from {_rate(c.predicted_before)}"
        )
    measured = ", ".join(f"x{r.fit.factor:.2f} at {_rate(r.rate)}" for r in c.runs)
    return f"x{c.factor:.2f} ({measured}) from {_rate(c.predicted_before)}"


def _speed(r: FlagSetResult, i: int) -> str:
    """Probe ``i``'s own factor on the calibration's cost, with its interval."""
    fit = r.speeds[i] if i < len(r.speeds) else None
    if fit is None or not math.isfinite(fit.estimate):
        return "-"
    return f"x{fit.estimate:.2f} [{fit.low:.2f}, {fit.high:.2f}]"


def speed_line(r: FlagSetResult) -> str | None:
    """The range of the probes' own factors, against the factor the knee was predicted with
    (said when it lies outside them all) and the goal (said when no one factor is within it of
    every probe's: the highest over the lowest above (1 + goal) / (1 - goal)); None: no probe
    had one."""
    found = speed_range(r.speeds)
    if found is None:
        return None
    low, high = found
    used = r.load_check.factor if r.load_check is not None else 1.0
    line = (
        f"server speed, {r.flags.label}: each probe's requests replayed need x{low:.2f}-"
        f"x{high:.2f} the calibration's cost (fitted as the load check's; {high / low - 1:.0%} "
        f"apart); the knee was predicted with x{used:.2f}"
    )
    if used > high or used < low:
        faster = "faster" if used > high else "slower"
        line += (
            f", {'above' if used > high else 'below'} every probe's: the server ran "
            f"{faster} in its probes than the knee was predicted for"
        )
    if high * (1 - r.within) > low * (1 + r.within):
        line += f"; no one factor is within ±{r.within:.0%} of every probe's"
    return line


def knee_table(result: VerifyResult) -> str:
    """One row per flag set."""
    rows = []
    for r in result.results:
        first = r.measured.at_first if r.measured is not None else None
        at = f"{first.attainment:.0%} ± {first.standard_error:.0%}" if first is not None else "-"
        predicted = "-" if r.predicted is None else _rate(r.predicted.rate)
        if r.predicted is not None and r.predicted.status == "never missed":
            predicted = ">= " + predicted
        within = f"predicted/measured [90%], ±{r.within:.0%}"
        row = [r.flags.label, _load(r), predicted, _sharp(r), _knee(r), _measured(r), _ratio(r)]
        row.append(at)
        rows.append(row + [str(r.requests or "-"), r.ended and "ended" or ""])
    headers = [
        "flag set",
        "cost under load [90%]",
        "predicted knee req/s",
        f"simulated at x{1 + result.rule.within:g} / at /{1 + result.rule.within:g}",
        "measured knee [90%]",
        "met < missed req/s",
        within if result.results else "predicted/measured",
        "attainment at predicted",
        "requests a probe",
        "",
    ]
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def probe_table(result: VerifyResult) -> str:
    """Every probe run on the server, with the simulator's attainment on its requests replayed
    at their measured arrivals, and the factor on the calibration's cost that puts the replay's
    mean latency at the measured one (the probe's speed); the host's CPU steal during each
    where it was watched (``measure.host_steal``)."""
    rows = []
    watched = any(p.run.host is not None for r in result.results for p in _probes(r))
    for r in result.results:
        for i, p in enumerate(_probes(r)):
            replay = r.replayed[i] if i < len(r.replayed) else math.nan
            ttft = p.metrics.ttft.percentile(90.0) if p.metrics is not None else math.nan
            tpot = p.metrics.tpot.percentile(90.0) if p.metrics is not None else math.nan
            rows.append(
                [
                    r.flags.label,
                    i + 1,
                    _rate(p.rate),
                    f"{p.good}/{p.sent}",
                    f"{p.attainment:.0%} ± {p.standard_error:.0%}",
                    f"{replay:.0%}" if math.isfinite(replay) else "-",
                    _speed(r, i),
                    f"{ttft * 1e3:.0f}" if math.isfinite(ttft) else "-",
                    f"{tpot * 1e3:.1f}" if math.isfinite(tpot) else "-",
                    p.failed or "",
                ]
                + ([p.run.host.text() if p.run.host is not None else "-"] if watched else [])
            )
    headers = ["flag set", "probe", "req/s", "good/sent", "attainment", "replayed"]
    headers += ["speed [90%]", "p90 TTFT ms"]
    headers += ["p90 TPOT ms", "failed"] + (["host steal"] if watched else [])
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def _probes(result: FlagSetResult) -> tuple[MeasuredProbe, ...]:
    return result.measured.probes if result.measured is not None else ()


def ranking_line(result: VerifyResult) -> str:
    if len(result.compared) < 2:
        return "ranking: one flag set measured, nothing to rank"
    labels = [r.flags.label for r in result.compared]
    return ranking_text(labels, *result.knees, result.intervals, result.rule.within)


def ranking_text(
    labels: Sequence[str],
    predicted: Sequence[float],
    measured: Sequence[float],
    intervals: Sequence[tuple[float, float] | None],
    within: float = 0.10,
    head: str = "ranking",
) -> str:
    """The ranking line, starting ``head``: both orders (a predicted tie, within
    :func:`~pytest_prefill.verify.verification.ranking_tolerance` of ``within``, with "=") and
    :func:`ranking_verdict`."""
    tie = ranking_tolerance(within)
    return (
        f"{head}: predicted {order_text(labels, predicted, tie)} (= within {tie:.0%}: knees "
        f"each claimed to ±{within:.0%} order no closer); measured "
        f"{order_text(labels, measured, 0.0)}: "
        f"{ranking_verdict(labels, predicted, measured, intervals, within)}"
    )


def ranking_verdict(
    labels: Sequence[str],
    predicted: Sequence[float],
    measured: Sequence[float],
    intervals: Sequence[tuple[float, float] | None],
    within: float = 0.10,
) -> str:
    """ "best HOLDS / FAILS / UNDECIDED" (``verify.ranking.best_verdict``: the predicted best
    judged on the measured knees' intervals) and why; then whether the measured order keeps
    every pair the prediction tells apart (on the knees' points)."""
    tie = ranking_tolerance(within)
    best = tied_best(predicted, tie)
    verdict, which = best_verdict(predicted, intervals, tie)
    names = " and ".join(labels[i] for i in best)
    if verdict == "HOLDS":
        text = f"best HOLDS ({labels[which[0]]}'s measured knee lies above every other's)"
    elif verdict == "FAILS":
        text = f"best FAILS ({labels[which[0]]}'s measured knee lies above {names}'s)"
    elif len(best) == len(predicted):
        text = f"best UNDECIDED ({names} predicted within {tie:.0%} of one another: no claim)"
    else:
        reach = " and ".join(labels[i] for i in which)
        text = (
            f"best UNDECIDED (the measured knees of {names} and {reach} overlap: the probes "
            "cannot tell which is best)"
        )
    if 1 < len(best) < len(predicted):
        text += f"; {names} predicted within {tie:.0%}: a tie"
    if agrees(predicted, measured, tie):
        return text + "; the measured order agrees with the predicted one"
    same = ranking(measured)[0] in best
    return text + ("; the rest are ordered differently" if same else "; the order differs")


def verify_report(result: VerifyResult) -> str:
    lines = [
        f"verify on {result.engine or 'a server'}: {result.workload}",
        f"SLO {result.slo}, attainment target {result.rule.target:.0%}; {result.rule.sentence()}",
    ]
    if result.quiet:
        lines.append(f"quiet host: {result.quiet}")
    if any(r.load_check is not None for r in result.results):
        lines.append(
            "cost under load: as many requests as a probe, the ones after the probes' (no probe "
            "sends them), sent at the knee the calibration predicts, and again at the knee the "
            f"runs settle on while it moves by more than {result.rule.tolerance:.0%} (3 runs at "
            "most); a run's factor on every cost puts the simulated mean latency at the "
            "measured one, kept when its 90% interval leaves out 1; the knee is predicted with "
            "the factor, interpolated in log rate between the runs, at the rate whose factor "
            "predicts that rate"
        )
    lines += [
        "",
        knee_table(result),
        "",
        probe_table(result),
        "",
    ]
    lines += [r.ended for r in result.results if r.ended is not None]
    for r in result.results:
        if r.load_check is not None:
            lines.append(f"load check, {r.flags.label}: {r.load_check.sentence()}")
        speed = speed_line(r)
        if speed is not None:
            lines.append(speed)
    for r in result.results:
        if r.sharpness is not None and not r.sharpness.decisive:
            lines.append(f"WARNING: {r.flags.label}: {r.sharpness.sentence()}")
    lines.append(ranking_line(result))
    return "\n".join(lines)


def _speeds_of(document: Mapping[str, Any]) -> str:
    """A flag set document's probes' speeds as a range ("-": none, or an older document)."""
    fits = [x.get("estimate") for x in document.get("speeds") or []]
    speeds = [float(x) for x in fits if isinstance(x, (int, float)) and math.isfinite(x)]
    return f"x{min(speeds):.2f}-{max(speeds):.2f}" if speeds else "-"


def engine_of(document: Mapping[str, Any]) -> str:
    """The engine a verify document names ("a server" when it names none)."""
    return str(document.get("engine") or "a server")


def _knees_of(flag_set: Mapping[str, Any]) -> tuple[float, float]:
    """A flag set document's predicted and measured knee, req/s (0: none)."""
    measured = flag_set.get("measured") or {}
    predicted = (flag_set.get("predicted") or {}).get("rate") or 0.0
    return predicted, measured.get("knee") or measured.get("rate") or 0.0


def combined_report(documents: Sequence[Mapping[str, Any]]) -> str:
    """The flag sets of several verify runs (their JSON documents: one server start each, say)
    in one table, and per engine whether their measured ranking agrees with the predicted one
    (:func:`combined_rankings`: flag sets of different engines are never ranked together)."""
    engines = list(dict.fromkeys(engine_of(doc) for doc in documents))
    rows = []
    for doc in documents:
        for r in doc.get("flag_sets", []):
            p, m = _knees_of(r)
            measured_doc = r.get("measured") or {}
            status = measured_doc.get("status", "-")
            estimate, judged = measured_doc.get("estimate"), r.get("agreement")
            interval = (
                f" [{_bound(estimate['low'])}, {_bound(estimate['high'])}]" if estimate else ""
            )
            ratio = f"{p / m:.2f}" if p > 0 and m > 0 else "-"
            rates = [float(x["rate"]) for x in measured_doc.get("probes") or []]
            shown = _rate(m)
            if estimate and float(estimate["rate"]) <= 0 and rates:  # below every probe
                shown, ratio = f"< {_rate(min(rates))}", "-"
            if judged:
                ratio = f"{ratio} [{_bound(judged['low'])}, {_bound(judged['high'])}] "
                ratio += judged["verdict"]
            at = r.get("attainment_at_predicted")
            check = r.get("load_check") or {}
            factor = f"x{check['factor']:.2f}" if check.get("runs") else "-"
            row = [] if len(engines) == 1 else [engine_of(doc)]
            row += [r["flags"]["label"], factor, _speeds_of(r), _rate(p)]
            row.append(f"{shown}{interval} ({status})")
            row.append(ratio)
            row.append(f"{at:.0%}" if isinstance(at, (int, float)) else "-")
            rows.append(row)
    headers = [] if len(engines) == 1 else ["engine"]
    headers += ["flag set", "cost under load", "probes' speed", "predicted knee"]
    headers.append("measured knee [90%]")
    headers.append("predicted/measured [90%]")
    headers.append("attainment at predicted")
    table = tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)
    lines = [line for _, _, line in combined_rankings(documents)]
    return "\n".join([table, *lines])


def combined_rankings(
    documents: Sequence[Mapping[str, Any]],
) -> list[tuple[str, str | None, str]]:
    """Per engine, in the order the documents name them: (engine, the best's verdict — None
    with fewer than two flag sets measured —, the ranking line; prefixed with the engine when
    the documents hold several)."""
    engines = list(dict.fromkeys(engine_of(doc) for doc in documents))
    out: list[tuple[str, str | None, str]] = []
    for engine in engines:
        mine = [doc for doc in documents if engine_of(doc) == engine]
        labels, predicted, measured = [], [], []
        intervals: list[tuple[float, float] | None] = []
        for doc in mine:
            for r in doc.get("flag_sets", []):
                if r.get("predicted") and r.get("measured") and not r.get("ended"):
                    p, m = _knees_of(r)
                    labels.append(r["flags"]["label"])
                    predicted.append(p)
                    measured.append(m)
                    intervals.append(_interval(r["measured"].get("estimate")))
        head = "ranking" if len(engines) == 1 else f"ranking, {engine}"
        if len(labels) < 2:
            line = f"{head}: fewer than two flag sets measured, nothing to rank"
            out.append((engine, None, line))
            continue
        rules = [doc.get("probe_rule") or {} for doc in mine]
        within = max(float(rule.get("within", 0.10)) for rule in rules)  # the loosest claim
        line = ranking_text(labels, predicted, measured, intervals, within, head)
        verdict = best_verdict(predicted, intervals, ranking_tolerance(within))[0]
        out.append((engine, verdict, line))
    return out
