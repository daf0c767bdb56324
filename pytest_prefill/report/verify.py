"""A verification on a server, for a person: per flag set the predicted and measured knee (with
its interval), their ratio judged against the goal, and the attainment measured at the
predicted rate; every probe; and whether the measured ranking of the flag sets agrees with the
predicted one, and whether the measurement separates the best from the next."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence

from tabulate import tabulate

from pytest_prefill.verify.knee import MeasuredProbe
from pytest_prefill.verify.load_check import speed_range
from pytest_prefill.verify.result import (
    FlagSetResult,
    VerifyResult,
    agrees,
    best_verdict,
    order_text,
    ranking,
    ranking_tolerance,
    tied_best,
)


def _rate(value: float | None) -> str:
    return f"{value:.3g}" if value is not None and math.isfinite(value) and value > 0 else "-"


def _bound(value: float | str) -> str:
    value = float(value)  # a document keeps inf as "inf"
    if math.isinf(value):
        return "inf"
    return f"{value:.3g}" if value > 0 else "0"


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
        if r.lower_bounds:
            return "- (both lower bounds)"
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
    whose = "the calibration's" if r.calibration is not None else "the derived"
    line = (
        f"server speed, {r.flags.label}: each probe's requests replayed need x{low:.2f}-"
        f"x{high:.2f} {whose} cost (fitted as the load check's; {high / low - 1:.0%} "
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
    ended = any(r.ended is not None for r in result.results)  # a column only when one did
    for r in result.results:
        first = r.measured.at_first if r.measured is not None else None
        at = f"{first.attainment:.0%} ± {first.standard_error:.0%}" if first is not None else "-"
        predicted = "-" if r.predicted is None else _rate(r.predicted.rate)
        if r.predicted is not None and r.predicted.status == "never missed":
            predicted = ">= " + predicted
        within = f"predicted/measured [90%], ±{r.within:.0%}"
        row = [r.flags.label, _load(r), predicted, _sharp(r), _knee(r), _measured(r), _ratio(r)]
        row.append(at)
        rows.append(row + [str(r.requests or "-")] + (["ended" if r.ended else "-"] * ended))
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
        *(["server"] * ended),
    ]
    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def probe_table(result: VerifyResult) -> str:
    """Every probe run on the server, with the simulator's attainment on its requests replayed
    at their measured arrivals, and the factor on the calibration's cost that puts the replay's
    mean latency at the measured one (the probe's speed); the host's CPU steal during each
    where it was watched (``measure.quiet``)."""
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
    """The run's ranking line: :func:`combined_rankings` of it alone (one code path, so a run
    ranks the same in its own report and under ``verify --rank``)."""
    return combined_rankings([result])[0][2]


def ranking_text(
    labels: Sequence[str],
    predicted: Sequence[float],
    measured: Sequence[float],
    intervals: Sequence[tuple[float, float] | None],
    within: float = 0.10,
    head: str = "ranking",
) -> str:
    """The ranking line, starting ``head``: both orders (a predicted tie, within
    :func:`~pytest_prefill.verify.result.ranking_tolerance` of ``within``, with "="); then "best
    HOLDS / FAILS / UNDECIDED" (``verify.result.best_verdict``: the predicted best judged on the
    measured knees' intervals) and why; then whether the measured order keeps every pair the
    prediction tells apart (on the knees' points)."""
    tie = ranking_tolerance(within)
    orders = (
        f"{head}: predicted {order_text(labels, predicted, tie)} (= within {tie:.0%}: knees "
        f"each claimed to ±{within:.0%} order no closer); measured "
        f"{order_text(labels, measured, 0.0)}: "
    )
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
        return orders + text + "; the measured order agrees with the predicted one"
    same = ranking(measured)[0] in best
    return orders + text + ("; the rest are ordered differently" if same else "; the order differs")


# What the probe table's replayed column is, and how to read it beside the measured attainment.
REPLAYED = (
    "replayed: the simulator's attainment on the probe's own requests at their measured "
    "arrivals, at the cost the knee was predicted with (the calibration, or the derived compute, "
    "times the load check's factor). Far below the measured attainment: the model ran slower than the server did "
    "during that probe (its speed column under that factor), so the knee predicted is low; at "
    "or above the target where the server missed: the miss is the model's."
)
WIDTH = 100
# What a derived prediction's basis line is introduced with: capacity's Cost model: header.
DERIVED = "knees predicted from derived compute (nothing calibrated, no load check). Cost model: "


def _wrapped(text: str) -> list[str]:
    """``text`` in lines of at most :data:`WIDTH` characters, the later ones indented."""
    return textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)


def verify_report(result: VerifyResult) -> str:
    lines = [
        f"verify on {result.engine or 'a server'}: {result.workload}",
        *_wrapped(
            f"SLO {result.slo}, attainment target {result.rule.target:.0%}; "
            f"{result.rule.sentence()}"
        ),
    ]
    if result.quiet:
        lines += _wrapped(f"quiet host: {result.quiet}")
    if result.derived is not None:
        lines += _wrapped(f"{DERIVED}{result.derived.basis}")
        if result.derived.sizing:
            lines += _wrapped(f"Simulated server: {result.derived.sizing}")
    if any(r.load_check is not None for r in result.results):
        lines += _wrapped(
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
        *_wrapped(REPLAYED),
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
            lines.append(
                f"WARNING: {r.flags.label}: {r.sharpness.sentence()}"
            )  # one line: grep-able
    lines.append(ranking_line(result))
    return "\n".join(lines)


def engine_of(result: VerifyResult) -> str:
    """The engine a verification names ("a server" when it names none)."""
    return result.engine or "a server"


def _speeds(r: FlagSetResult) -> str:
    """The range of a flag set's probes' own factors ("-": none)."""
    found = speed_range(r.speeds)
    return f"x{found[0]:.2f}-{found[1]:.2f}" if found is not None else "-"


def _combined_row(r: FlagSetResult) -> list[str]:
    p = r.predicted.rate if r.predicted is not None else 0.0
    m = r.measured.knee if r.measured is not None else 0.0
    status = r.measured.status if r.measured is not None else "-"
    estimate = r.measured.estimate if r.measured is not None else None
    interval = f" [{_bound(estimate.low)}, {_bound(estimate.high)}]" if estimate else ""
    ratio = f"{p / m:.2f}" if p > 0 and m > 0 else "-"
    shown = _rate(m)
    rates = [probe.rate for probe in _probes(r)]
    if estimate is not None and estimate.rate <= 0 and rates:  # below every probe
        shown, ratio = f"< {_rate(min(rates))}", "-"
    judged = r.agreement
    if judged is not None:
        ratio = f"{ratio} [{_bound(judged.low)}, {_bound(judged.high)}] {judged.verdict}"
    check = r.load_check
    factor = f"x{check.factor:.2f}" if check is not None and check.runs else "-"
    at = r.attainment_at_predicted
    row = [r.flags.label, factor, _speeds(r), _rate(p), f"{shown}{interval} ({status})", ratio]
    return row + [f"{at:.0%}" if math.isfinite(at) else "-"]


def combined_report(results: Sequence[VerifyResult]) -> str:
    """The flag sets of several verify runs (one server start each, say) in one table, and
    per engine whether their measured ranking agrees with the predicted one
    (:func:`combined_rankings`: flag sets of different engines are never ranked together)."""
    engines = list(dict.fromkeys(engine_of(result) for result in results))
    rows = []
    for result in results:
        for r in result.results:
            row = [] if len(engines) == 1 else [engine_of(result)]
            rows.append(row + _combined_row(r))
    headers = [] if len(engines) == 1 else ["engine"]
    headers += ["flag set", "cost under load", "probes' speed", "predicted knee"]
    headers += ["measured knee [90%]", "predicted/measured [90%]", "attainment at predicted"]
    table = tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)
    lines = [line for _, _, line in combined_rankings(results)]
    for i, result in enumerate(results):
        if result.derived is not None:
            sizing = f"; simulated server: {result.derived.sizing}" if result.derived.sizing else ""
            lines.append(
                f"run {i + 1} ({engine_of(result)}): {DERIVED}{result.derived.basis}{sizing}"
            )
    return "\n".join([table, *lines])


def combined_rankings(results: Sequence[VerifyResult]) -> list[tuple[str, str | None, str]]:
    """Per engine, in the order the runs name them: (engine, the best's verdict — None with
    fewer than two flag sets compared —, the ranking line; prefixed with the engine when the
    runs hold several). The flag sets compared are each run's :attr:`VerifyResult.compared`,
    so one run ranks here as in its own report."""
    engines = list(dict.fromkeys(engine_of(result) for result in results))
    out: list[tuple[str, str | None, str]] = []
    for engine in engines:
        mine = [result for result in results if engine_of(result) == engine]
        compared = [r for result in mine for r in result.compared]
        head = "ranking" if len(engines) == 1 else f"ranking, {engine}"
        if len(compared) < 2:
            out.append(
                (engine, None, f"{head}: fewer than two flag sets measured, nothing to rank")
            )
            continue
        labels = [r.flags.label for r in compared]
        predicted = [r.predicted.rate for r in compared if r.predicted is not None]
        measured = [r.measured.knee for r in compared if r.measured is not None]
        intervals = [_interval_of(r) for r in compared]
        within = max(result.rule.within for result in mine)  # the loosest claim
        line = ranking_text(labels, predicted, measured, intervals, within, head)
        verdict = best_verdict(predicted, intervals, ranking_tolerance(within))[0]
        out.append((engine, verdict, line))
    return out


def _interval_of(r: FlagSetResult) -> tuple[float, float] | None:
    e = r.measured.estimate if r.measured is not None else None
    return (e.low, e.high) if e is not None else None
