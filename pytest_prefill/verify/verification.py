"""Checking a capacity answer on a server (DESIGN.md, "Checking the answer on a server"): for
each flag set (the engine's token budget and sequence cap) the server runs it — restarted by a
launcher (``serve.launch.launchers``), or running and said to run it — is calibrated (or a calibration
is reused, or the compute derived for its model on its device: ``Derived``), its knee predicted by
the capacity search with that cost, and then measured (``verify.knee``). Reported: the predicted and measured knee, their ratio, the attainment at the
predicted rate, and whether the measured ranking of the flag sets agrees with the predicted one.

A server that dies or stalls ends its flag set with one line; what was measured is kept, and
every process this module started is stopped by its PID. Standard library only (the
calibration's fit needs numpy)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from pytest_prefill.measure.quiet import QuietHost
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.plan.workloads import arrival_rate
from pytest_prefill.serve.calibration.calibration import PER_REQUEST_ATTENTION, calibrate_server
from pytest_prefill.serve.calibration.calibration_fit import RequestOverhead
from pytest_prefill.serve.calibration.experiments import warm_up
from pytest_prefill.serve.calibration.server_calibration import ServerCalibration, ServerSweep
from pytest_prefill.serve.calibration.server_model import (
    NoProfileError,
    Scheduling,
    ServerModel,
    need_profile,
    server_profile,
)
from pytest_prefill.serve.client.wire import ServerError, Timeouts, Url
from pytest_prefill.serve.launch.launchers import Launcher, alive
from pytest_prefill.serve.launch.process import ServerProcess
from pytest_prefill.serve.load.loadgen import Target, open_target
from pytest_prefill.sim import Request, in_arrival_order, simulated_engine
from pytest_prefill.verify.interrupt import Interrupted, Interruption
from pytest_prefill.verify.knee import (
    Predicted,
    measure_knee,
    predict_knee,
    replayed_attainment,
    start_scale,
)
from pytest_prefill.verify.knee_sizing import Sharpness, predict_sized, sharpness
from pytest_prefill.verify.load_check import (
    MIN_REQUESTS,
    LoadCheck,
    LoadRun,
    factor_at,
    run_load_check,
    run_speeds,
)
from pytest_prefill.verify.probe_rule import FlagSet, ProbeRule, probe_load
from pytest_prefill.verify.result import Derived, FlagSetResult, VerifyResult, one_line

Progress = Callable[[str], object]
RAMP_ROWS = 16  # the calibration's decode points reach the flag set's cap, at most this
CHECK_RUNS = 3  # the load check's runs, at most
# A derived prediction measures nothing: the request's way into the engine and back is not known.
UNMEASURED = RequestOverhead(
    0.0, 0.0, math.nan, "not measured: the knee is predicted from derived compute, uncalibrated"
)


@dataclasses.dataclass(frozen=True)
class Server:
    """Where the flag sets run: ``launcher`` restarts a server under each; else ``url`` is a
    running one, said to run the one flag set given. ``engine`` (else what the server shows),
    ``tokenizer`` (the model folder: one-token words), ``kv_tokens`` (its KV cache in tokens;
    a launcher knows its own), ``timeouts``; ``prefix_block_tokens``: the workload's hash-id
    block size, when its requests carry them (sent as shared leading blocks, and simulated
    with a prefix cache of that block size where the engine has one)."""

    url: Url | None = None
    launcher: Launcher | None = None
    engine: str | None = None
    tokenizer: str | None = None
    kv_tokens: float | None = None
    timeouts: Timeouts = Timeouts()
    prefix_block_tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.url is None) == (self.launcher is None):
            raise ValueError("a server is a running url or a launcher, exactly one of them")

    @property
    def kv_capacity(self) -> float:
        if self.kv_tokens is not None:
            return float(self.kv_tokens)
        return self.launcher.kv_capacity() if self.launcher is not None else math.inf


@dataclasses.dataclass(frozen=True)
class VerifyOptions:
    """How :func:`verify` checks the flag sets, the one list of its options. ``calibration``:
    reuse it for all; else calibrate each with ``sweep`` at its budget (``calibrate_once``: the
    first one's calibration for all). ``probe_requests``: every probe sends this many (at least
    rule 1's), else the first flag set sizes them for all. ``load_check``: before the probes, as
    many requests as a probe sends, the ones that follow the probes' (none of them a probe's),
    are sent at the predicted knee and the cost model scaled to the speed they show
    (``verify.load_check``); off, or where the workload has fewer than
    ``load_check.MIN_REQUESTS`` after the probes', the calibration alone predicts. ``quiet``:
    each probe and load-check run on a quiet host (``measure.quiet``; None: not watched).
    ``derived``: every knee predicted from this derived compute alone, no calibration measured
    or reused and no load check run (which would scale the compute to the server's speed): the
    measured knees test the derivation. ``workload`` names the load in the result;
    ``progress`` is called with a line per step.

    Raises:
        ValueError: for neither a sweep nor a calibration (nor derived compute), derived compute
            beside a calibration, or a probe_requests that is not a positive integer.
    """

    rule: ProbeRule = dataclasses.field(default_factory=ProbeRule)
    sweep: ServerSweep | None = None
    calibration: ServerCalibration | None = None
    calibrate_once: bool = False
    workload: str = ""
    progress: Progress | None = None
    probe_requests: int | None = None
    load_check: bool = True
    quiet: QuietHost | None = None
    derived: Derived | None = None

    def __post_init__(self) -> None:
        count = self.probe_requests
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or count < 1
        ):
            raise ValueError(f"probe_requests must be a positive integer, got {count!r}")
        if not isinstance(self.rule, ProbeRule):
            raise ValueError(f"rule must be a ProbeRule, got {self.rule!r}")
        derived = self.derived
        if derived is not None and (self.calibration is not None or self.calibrate_once):
            raise ValueError("a derived prediction takes no calibration (reused or measured once)")
        if self.sweep is None and self.calibration is None and derived is None:
            raise ValueError("give a calibration sweep or a calibration to reuse")


@dataclasses.dataclass
class _Plan:
    load: list[Request]
    slo: SLO
    rule: ProbeRule
    sweep: ServerSweep | None
    calibration: ServerCalibration | None
    count: int | None = None  # requests a probe, once fixed: every flag set sends the same
    load_check: bool = True
    quiet: QuietHost | None = None
    interruption: Interruption = dataclasses.field(default_factory=Interruption)
    derived: Derived | None = None

    def server_model(
        self, calibration: ServerCalibration | None, scheduling: Scheduling
    ) -> ServerModel:
        """What the knee is predicted with under ``scheduling``: the derived compute (no way
        in or out measured), else ``calibration``."""
        if self.derived is not None:
            return ServerModel(self.derived.cost, UNMEASURED, scheduling)
        assert calibration is not None  # _calibrated: the plan's, or measured
        return ServerModel.of(calibration, scheduling)

    async def why_ended(
        self, err: BaseException, stage: str, url: Url, process: ServerProcess | None
    ) -> str:
        """Why ``stage`` ended on ``err``: the signal that cancelled it, else whether the
        server is gone, then the error's line. A cancellation with no signal behind it is
        raised again."""
        if isinstance(err, asyncio.CancelledError):
            if self.interruption.line is None:
                raise err
            return f"{self.interruption.line} during {stage}"
        line, gone = one_line(err), await alive(url, process)
        if gone is None:
            return f"{stage} failed: {line}"
        return gone if line in gone else f"{gone}: {line}"  # the same error said once


async def _cancellable(plan: _Plan, check: Coroutine[Any, Any, FlagSetResult]) -> FlagSetResult:
    """``check`` (:func:`_check_flag_set`), a signal cancelling it (``verify.interrupt``)."""
    with plan.interruption.cancelling():
        return await check


async def _check_flag_set(
    server: Server,
    url: Url,
    process: ServerProcess | None,
    flags: FlagSet,
    plan: _Plan,
    progress: Progress | None,
) -> FlagSetResult:
    """Calibrate (or reuse), predict, measure one flag set on a server running it."""
    command = process.argv if process is not None else ()
    label = flags.label
    flagged = " ".join(command) or f"budget {flags.budget}" + (
        f", seqs {flags.max_seqs}" if flags.max_seqs else ""
    )
    try:
        target, calibration = await _calibrated(server, url, flags, flagged, plan, progress)
    except NoProfileError:
        raise  # the server cannot be simulated under any flag set: the run is refused
    except (ServerError, ValueError, asyncio.CancelledError) as err:
        why = await plan.why_ended(err, "calibration", url, process)
        return FlagSetResult(flags, command, ended=f"{label}: {why}")
    scheduling = _scheduling(server, target.identity.engine, flags)
    calibrated = plan.server_model(calibration, scheduling)
    check = None
    if plan.load_check:
        try:
            check = await _load_check(target, plan, calibrated, flags, progress)
        except (ServerError, ValueError, asyncio.CancelledError) as err:
            line = f"{label}: {await plan.why_ended(err, 'the load check', url, process)}"
            return FlagSetResult(flags, command, calibration, scheduling, ended=line)
    under_load = calibrated.scaled(check.factor if check is not None else 1.0)
    load, wanted, predicted, sharp = _predicted(plan, under_load)
    if progress is not None:
        progress(
            f"{label}: predicted knee {predicted.rate:.3g} req/s ({predicted.status}); "
            f"{len(load)} requests a probe; {sharp.sentence()}"
        )
    start = start_scale(predicted, load)
    measured = await measure_knee(
        target,
        load,
        plan.slo,
        plan.rule,
        start,
        alive=lambda: alive(url, process),
        progress=progress,
        tag=f"b{flags.budget}s{flags.max_seqs or 0}-",
        judged=start if predicted.rate > 0 else None,
        quiet=plan.quiet,
        stopped=lambda: plan.interruption.line,
    )
    ended = f"{label}: {measured.ended}" if measured.ended is not None else None
    sizes: dict[str, Any] = {"requests": len(load), "wanted": wanted, "within": plan.rule.within}
    sizes["sharpness"] = sharp
    sizes["replayed"] = tuple(replayed_attainment(p, under_load, plan.slo) for p in measured.probes)
    sizes["load_check"] = check
    runs = [p.run for p in measured.probes]
    sizes["speeds"] = run_speeds(runs, calibrated)
    return FlagSetResult(
        flags, command, calibration, scheduling, predicted, measured, ended, **sizes
    )


async def _calibrated(
    server: Server, url: Url, flags: FlagSet, flagged: str, plan: _Plan, progress: Progress | None
) -> tuple[Target, ServerCalibration | None]:
    """The server at ``url`` opened and warmed up, and its calibration: none for a derived
    prediction, the plan's, else one measured now at the flag set's budget, its ramps at its
    cap."""
    target: Target = await open_target(
        url,
        engine=server.engine,
        tokenizer=server.tokenizer,
        flags=flagged,
        timeouts=server.timeouts,
    )
    who = target.identity
    need_profile(who.engine, who.url, who.how)  # before a request is sent: none is simulated
    target = dataclasses.replace(target, prefix_block_tokens=server.prefix_block_tokens)
    await warm_up(target, f"{flags.budget}-")
    if plan.derived is not None or plan.calibration is not None:
        return target, plan.calibration
    assert plan.sweep is not None
    rows = min(flags.max_seqs or RAMP_ROWS, RAMP_ROWS) if flags.max_seqs != 1 else 0
    engine = target.identity.engine  # as the server named itself
    batch_wide = engine not in PER_REQUEST_ATTENTION and rows - 1 > plan.sweep.live_rows
    loaded = rows - 1 if batch_wide else 0  # the stall prompt joins them within the cap
    sweep = dataclasses.replace(plan.sweep, budget=flags.budget, ramp_rows=rows, loaded_rows=loaded)
    sweep = sweep.capped(flags.max_seqs)  # the flag set's cap, where the server's command hides it
    return target, await calibrate_server(target, sweep, progress, verify=flags.label)


def _scheduling(server: Server, engine: str, flags: FlagSet) -> Scheduling:
    """The server's scheduling under ``flags`` as simulated: its engine's profile at the
    budget and cap, with the workload's prefix block size where the engine caches prefixes."""
    profile = server_profile(engine, flags.budget, flags.max_seqs)
    block = server.prefix_block_tokens
    if block is not None and profile.prefix_caching:
        profile = simulated_engine(dataclasses.replace(profile, prefix_block_tokens=block))
    return Scheduling(profile, server.kv_capacity)


async def _load_check(
    target: Target,
    plan: _Plan,
    server_model: ServerModel,
    flags: FlagSet,
    progress: Progress | None,
) -> LoadCheck | None:
    """The load check (``verify.load_check``): the requests that follow the probes' (as many),
    sent at the knee the calibration alone predicts, and again — at most :data:`CHECK_RUNS`
    runs — at the knee the runs settle on (:func:`_settled`) while that moves by more than the
    probes' tolerance. A server's factor grows with its load (vLLM 256/8 here: 1.10 at 13
    req/s, 1.01 at 11.8; `transformers serve` 1.50 at 5.67, 1.00 at 3.33), so the factor kept
    is the one at the settled knee, between the runs' rates. None, said in the progress,
    when the workload has too few requests after the probes'. Fixes the probes' count (sized
    on the calibration alone) when no flag set has yet."""
    if plan.count is None:
        sized = predict_sized(plan.load, server_model, plan.slo, plan.rule)
        plan.count = len(sized.requests)
    first = plan.rule.start + plan.count
    requests = plan.load[first : first + plan.count]  # plan.load is in arrival order
    if len(requests) < MIN_REQUESTS or not math.isfinite(arrival_rate(requests)):
        if progress is not None:
            progress(
                f"{flags.label}: no load check: the workload has {len(requests)} requests after "
                f"the probes' (at least {MIN_REQUESTS} that do not all arrive at once needed)"
            )
        return None
    origin = requests[0].arrival
    requests = [dataclasses.replace(r, arrival=r.arrival - origin) for r in requests]
    before = _guess(plan, server_model)
    runs: list[LoadRun] = []
    rate, factor = before, 1.0
    while rate > 0 and len(runs) < CHECK_RUNS:
        tag = f"b{flags.budget}s{flags.max_seqs or 0}-load{len(runs)}-"
        found = await run_load_check(
            target, requests, rate, server_model, tag, plan.quiet, progress
        )
        runs.append(found)
        if progress is not None:
            progress(f"load check {len(runs)}: {found.rate:.3g} req/s: {found.fit.sentence()}")
        if math.isnan(found.fit.estimate):
            break
        moved, factor = _settled(plan, server_model, runs)
        if abs(moved / rate - 1) <= plan.rule.tolerance:
            break
        rate = moved
    return LoadCheck(before, tuple(runs), factor)


def _settled(
    plan: _Plan, server_model: ServerModel, runs: Sequence[LoadRun]
) -> tuple[float, float]:
    """The knee the load check's runs settle on, and the factor there: the rate R whose
    factor (:func:`factor_at`) predicts a knee of R, by bisection in log rate between the
    runs' lowest and highest rates (the end whose own prediction is nearer when none does)."""

    def predicted(rate: float) -> float:
        return _guess(plan, server_model.scaled(factor_at(runs, rate)))

    rates = sorted(r.rate for r in runs)
    low, high = rates[0], rates[-1]
    at_low = predicted(low)
    if at_low <= low:
        return at_low, factor_at(runs, low)
    at_high = at_low if high == low else predicted(high)
    if at_high >= high:
        return at_high, factor_at(runs, high)
    while high / low - 1 > plan.rule.tolerance / 4:
        middle = math.sqrt(low * high)
        low, high = (middle, high) if predicted(middle) > middle else (low, middle)
    rate = math.sqrt(low * high)
    return rate, factor_at(runs, rate)


def _guess(plan: _Plan, server_model: ServerModel) -> float:
    """The knee predicted on what the probes will send (their count fixed)."""
    load = probe_load(plan.load, plan.rule, plan.count)
    return predict_knee(load, server_model, plan.slo, plan.rule.target).rate


def _predicted(
    plan: _Plan, server_model: ServerModel
) -> tuple[list[Request], int, Predicted, Sharpness]:
    """What the probes send, how many rule 2 wants at the knee predicted on them, that knee,
    and how sharp the simulator predicts it. The first flag set sizes the probes
    (:func:`~pytest_prefill.verify.knee_sizing.predict_sized`) unless a count was given; every
    later one sends the same requests, so that the knees rank flag sets on one workload (the
    rules' want and sharpness are reported beside each)."""
    slo, rule = plan.slo, plan.rule
    if plan.count is None:
        sized = predict_sized(plan.load, server_model, slo, rule)
        load, predicted, sharp = sized.requests, sized.predicted, sized.sharpness
        plan.count = len(load)
    else:
        load = probe_load(plan.load, rule, plan.count)
        predicted = predict_knee(load, server_model, slo, rule.target)
        sharp = sharpness(load, server_model, slo, rule, predicted)
        if not sharp.decisive and sharp.capped is None:
            why = (
                "the probes' length was fixed before (--probe-requests, the first flag set's, "
                "or sized on the calibration alone for the load check)"
            )
            sharp = dataclasses.replace(sharp, capped=why)
    return load, rule.requests_at(predicted.rate, slo), predicted, sharp


def verify(
    server: Server,
    flag_sets: Sequence[FlagSet],
    load: Sequence[Request],
    slo: SLO,
    options: VerifyOptions,
) -> VerifyResult:
    """Check every flag set on ``server`` (see the module's docstring) as ``options`` say.
    SIGINT, SIGTERM or SIGHUP (``verify.interrupt``) ends the flag set running with one line,
    keeping what it measured, and starts no other: the result says which signal
    (``interrupted``).

    Raises:
        ValueError: for no flag set, repeated ones, several on a running URL, options that are
            not a :class:`VerifyOptions`, or a workload too short for the probe rule.
    """
    if not isinstance(options, VerifyOptions):
        raise ValueError(f"options must be a VerifyOptions, got {type(options).__name__}")
    if not flag_sets:
        raise ValueError("verify needs at least one flag set")
    if len(set(flag_sets)) != len(flag_sets):
        raise ValueError(f"flag sets are repeated: {[f.label for f in flag_sets]}")
    if server.launcher is None and len(flag_sets) > 1:
        raise ValueError(
            "a running server runs one flag set: give a launcher to restart it under several"
        )
    rule, derived, progress, quiet = options.rule, options.derived, options.progress, options.quiet
    probe_load(load, rule)  # refuses a workload too short for rule 1 before anything starts
    ordered = in_arrival_order(load)
    checked = options.load_check and derived is None
    sweep, calibration, count = options.sweep, options.calibration, options.probe_requests
    plan = _Plan(ordered, slo, rule, sweep, calibration, count, checked, quiet)
    plan.derived = derived
    results = []
    with plan.interruption.raising():
        for flags in flag_sets:
            result = _interruptible(server, flags, plan, progress)
            results.append(result)
            if progress is not None and result.ended is not None:
                progress(result.ended)
            once = options.calibrate_once
            if once and plan.calibration is None and result.calibration is not None:
                plan.calibration = result.calibration
            if plan.interruption.signum is not None:
                break
    engine = server.engine or (server.launcher.engine if server.launcher is not None else "")
    host = quiet.sentence() if quiet is not None else ""
    interrupted = plan.interruption.name
    return VerifyResult(
        options.workload, slo, rule, tuple(results), engine, host, interrupted, derived
    )


def _interruptible(
    server: Server, flags: FlagSet, plan: _Plan, progress: Progress | None
) -> FlagSetResult:
    """:func:`_one`, or, where a signal ended it outside its stages (its server starting, or
    being stopped), the flag set with that one line."""
    try:
        return _one(server, flags, plan, progress)
    except (Interrupted, asyncio.CancelledError):
        if plan.interruption.line is None:
            raise
        return FlagSetResult(flags, ended=f"{flags.label}: {plan.interruption.line}")


def _one(server: Server, flags: FlagSet, plan: _Plan, progress: Progress | None) -> FlagSetResult:
    """One flag set, with its server started (and stopped, whatever happens) when launched."""
    if server.launcher is None:
        assert server.url is not None
        check = _check_flag_set(server, server.url, None, flags, plan, progress)
        return asyncio.run(_cancellable(plan, check))
    if progress is not None:
        progress(f"{flags.label}: starting {server.launcher.engine}")
    try:
        process = server.launcher.start(flags.budget, flags.max_seqs)
    except ServerError as err:
        line = f"{flags.label}: the server did not start: {one_line(err)}"
        return FlagSetResult(flags, ended=line)
    pinning = process.pinning.sentence() if process.pinning is not None else None
    if progress is not None:
        progress(f"{flags.label}: {server.launcher.engine} up, its log {process.log}")
        if pinning is not None:
            progress(f"{flags.label}: {pinning}")
    try:
        check = _check_flag_set(server, process.url, process, flags, plan, progress)
        result = asyncio.run(_cancellable(plan, check))
    finally:
        status = process.stop()
    return dataclasses.replace(result, exit_status=status, pinning=pinning)
