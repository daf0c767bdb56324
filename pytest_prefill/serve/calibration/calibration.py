"""Calibration from a running server, black box: the lab's difference method through the API
(``experiments``), fitted by the project's own fits and refusal rules (``measure.fitting``,
``measure.calibration_fit``), with the request's own overhead — HTTP, tokenisation, the way into
the engine and back — measured and kept apart from the cost model. The result is a
``measure.calibrate.Calibration`` (a cost model with provenance, usable wherever ``--cost`` is)
plus what only a server has: its overhead and the chunking it showed.

The prefill terms are fitted to the prompts' TTFTs alone: a ``P``-token prompt takes
``ceil(P / budget)`` passes, so its TTFT is ``request_overhead + passes * prefill_pass_overhead +
prefill_per_token * P + prefill_per_pair * pairs + decode_per_kv_token * context read``; prompts
longer than the budget are what tell the request's overhead from a pass's (the difference
method: the same overhead, more passes). Each prompt length is also held out, refitted without
and predicted: the held-out error is the number to trust. Decode terms come from streams
decoding together, the fusion penalty from the live streams' iterations beside a long prompt's
chunks. Standard library only, but the fits need numpy."""

from __future__ import annotations

import dataclasses
import datetime
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pytest_prefill.measure.calibration_document import Calibration
from pytest_prefill.measure.calibration_fit import decode_constants, refusals_of
from pytest_prefill.measure.calibration_points import (
    NO_FLOOR,
    PREFILL_TERMS,
    Point,
    Prediction,
    Refusal,
    predict,
)
from pytest_prefill.measure.timing import Measurement
from pytest_prefill.serve.calibration.calibration_fit import (
    BATCH_TERM,
    OVERHEAD,
    PassData,
    RequestOverhead,
    chunking_of,
    decode_points,
    fit_passes,
    fused_points,
    held_out,
    ttft_alone,
)
from pytest_prefill.serve.calibration.experiments import (
    LIVE_LEAD,
    DecodeSample,
    StallSample,
    chunks_of,
    prompt_alone,
    prompt_amid_streams,
    traffic,
)
from pytest_prefill.serve.calibration.server_calibration import (
    ServerCalibration,
    ServerSweep,
)
from pytest_prefill.serve.client.http import exchange
from pytest_prefill.serve.client.identity import ServerFacts, server_facts
from pytest_prefill.serve.load.loadgen import Target
from pytest_prefill.sim import CostModel

Progress = Callable[[str], object]
# Tokens the live streams keep decoding after the long prompt's chunks (a generous margin).
LIVE_TAIL = 24
RAMP_SPACING = 0.005  # seconds between the ramp's requests: at once, as a client sends them
RAMP_TRIES = 3  # a ramp is sent at most this many times while its decode points miss its rows

# Engines whose attention kernel reads each request's own KV blocks (vLLM's paged attention),
# so a chunk beside decode rows costs nothing for the rows' cached tokens: the batch-attention
# term is not fitted for them (a fit of it there reads noise: 8e-8 s a pair on one vLLM
# start, which halved the knee predicted at 512 tokens, 7.5 req/s against 15.0 measured).
PER_REQUEST_ATTENTION = ("vllm",)
PER_REQUEST_WHY = "not fitted: this engine's paged attention reads each request's own KV only"


@dataclasses.dataclass
class Samples:
    """What the rounds measured so far: TTFTs alone by prompt length, decode samples, long
    prompts amid live streams (the chunking check), the traffic's prompts amid the streams
    already decoding, and the network's round trips."""

    ttft: dict[int, list[float]] = dataclasses.field(default_factory=dict)
    decode: list[DecodeSample] = dataclasses.field(default_factory=list)
    stalls: list[StallSample] = dataclasses.field(default_factory=list)
    traffic_stalls: list[StallSample] = dataclasses.field(default_factory=list)
    loaded_stalls: list[StallSample] = dataclasses.field(default_factory=list)
    round_trips: list[float] = dataclasses.field(default_factory=list)


async def _round_trip(target: Target) -> float:
    import time

    start = time.perf_counter()
    await exchange(
        target.url, "GET", "/v1/models", timeouts=target.timeouts, headers=target.headers
    )
    return time.perf_counter() - start


async def _traffic_and_ramp(
    target: Target, sweep: ServerSweep, key: str
) -> tuple[list[DecodeSample], list[StallSample]]:
    """The sweep's traffic, then its ramps (when it has them): their decode samples and the
    traffic's prompts amid the streams."""
    decode, stalls = await traffic(
        target,
        sweep.traffic_prompts,
        sweep.decode_tokens,
        sweep.stream_spacing,
        sweep.budget,
        f"{key}-t",
        sweep.max_seqs,
    )
    for prompt in sweep.ramp_prompts:
        decode += await _ramp(target, sweep, prompt, f"{key}-r{prompt}")
    return decode, stalls


async def _ramp(target: Target, sweep: ServerSweep, prompt: int, key: str) -> list[DecodeSample]:
    """``sweep.ramp_rows`` requests of ``prompt`` tokens sent at once: the decode samples of
    every try, sent again (at most ``RAMP_TRIES`` in all) while none has the ramp's rows. On a
    vLLM CPU server (pinned, 256/8; busy) 3 of 7 ramps had none: the load generator, on the
    core the server's frontend uses, sent the first request and then nothing until it had
    finished (0.32-0.49 s late), and in two of them read every later token in one piece."""
    rows, tokens = sweep.ramp_rows, sweep.decode_tokens
    samples: list[DecodeSample] = []
    for attempt in range(RAMP_TRIES):
        prompts = (prompt,) * rows
        found = await traffic(
            target, prompts, tokens, RAMP_SPACING, sweep.budget, f"{key}.{attempt}"
        )
        samples += found[0]
        if any(s.rows == rows for s in found[0]):
            break
    return samples


async def calibration_round(
    target: Target,
    sweep: ServerSweep,
    samples: Samples,
    index: int,
    progress: Progress | None = None,
    rounds: int | None = None,
) -> None:
    """One round of every experiment, added to ``samples``: round ``index`` of ``rounds``
    (default the sweep's repeats), as its progress line says."""
    key = f"cal{index}"
    if index == 0:
        for warm in range(sweep.warmup):
            await _traffic_and_ramp(target, sweep, f"warm{warm}")
        if sweep.warmup and progress is not None:
            progress(f"calibration warm-up done ({sweep.warmup} pass of its traffic, dropped)")
    samples.round_trips.append(await _round_trip(target))
    for p in sweep.prompt_lens:
        samples.ttft.setdefault(p, []).append(await prompt_alone(target, p, f"{key}-alone{p}"))
    decode, stalls = await _traffic_and_ramp(target, sweep, key)
    samples.decode += [dataclasses.replace(s, round=index) for s in decode]
    samples.traffic_stalls += stalls
    step = statistics.median([s.seconds for s in samples.decode] or [0.01])
    for p in sweep.stall_prompts if sweep.stall_rows else ():
        chunks = len(chunks_of(p, sweep.budget, sweep.stall_rows))
        live_tokens = int(LIVE_LEAD / step) + chunks + LIVE_TAIL
        stall = await prompt_amid_streams(
            target, p, sweep.stall_rows, sweep.budget, live_tokens, f"{key}-s{p}"
        )
        samples.stalls.append(stall)
    for p in sweep.stall_prompts if sweep.loaded_rows else ():
        samples.loaded_stalls.append(await _loaded_stall(target, sweep, samples, p, f"{key}-l{p}"))
    if progress is not None:
        progress(f"calibration round {index + 1}/{rounds or sweep.repeats} done")


async def _loaded_stall(
    target: Target, sweep: ServerSweep, samples: Samples, prompt: int, key: str
) -> StallSample:
    """``prompt`` amid ``sweep.loaded_rows`` streams of the ramp's longer prompt, sent once
    their prompts are prefilled (a prompt of all their tokens alone takes as long, from the
    longest TTFT alone measured, scaled; half as long again for the rows decoding beside) and
    their streams long enough, at the decode step the ramp measured at that many rows, to
    outlast its chunks."""
    rows, live_prompt = sweep.loaded_rows, sweep.ramp_prompts[-1]
    longest = max(samples.ttft, default=0)
    prefill = (
        statistics.median(samples.ttft[longest]) * rows * live_prompt / longest if longest else 0.0
    )
    lead = LIVE_LEAD + 1.5 * prefill
    at_rows = [s.seconds for s in samples.decode if s.rows >= rows]
    step = statistics.median(at_rows or [s.seconds for s in samples.decode] or [0.01])
    live_tokens = int(lead / step) + len(chunks_of(prompt, sweep.budget, rows)) + LIVE_TAIL
    return await prompt_amid_streams(
        target, prompt, rows, sweep.budget, live_tokens, key, live_prompt=live_prompt, lead=lead
    )


async def measure_server(
    target: Target, sweep: ServerSweep, progress: Progress | None = None
) -> Samples:
    """Every round of ``sweep`` against ``target``."""
    samples = Samples()
    for index in range(sweep.repeats):
        await calibration_round(target, sweep, samples, index, progress)
    return samples


def _decode_step(decode: Mapping[str, float], rows: int, kv_tokens: int) -> float:
    return (
        decode["decode_step_base"]
        + decode["decode_per_seq"] * (rows - 1)
        + decode["decode_per_kv_token"] * kv_tokens
    )


def _to_engine(stalls: Sequence[StallSample]) -> float:
    """The median way in over the readable stalls: the midpoint of the iteration the prompt
    entered the engine in (from the send, never before it)."""
    ways = [
        (max(s.way_in_low, 0.0) + s.way_in) / 2 for s in stalls if s.fused and s.seen == s.expected
    ]
    return statistics.median(ways) if ways else math.nan


def _pass_constants(
    fit: Any, batch_why: str | None = None
) -> tuple[dict[str, float], float, list[Refusal]]:
    """The prefill constants (the batch-attention term with them) and the fusion penalty of
    the joint fit (capped at 1), and the refusals to report (the overhead is not a cost-model
    constant); ``batch_why``: why the batch-attention term was left out of the fit."""
    values = {name: fit.values.get(name, 0.0) for name in (*PREFILL_TERMS, BATCH_TERM)}
    refusals = [r for r in refusals_of(fit) if r.constant != OVERHEAD]
    if BATCH_TERM not in fit.values:
        why = batch_why or "not measured: no fused iteration beside cached tokens read"
        refusals.append(Refusal(BATCH_TERM, why, {}))
    penalty = fit.values.get("fusion_penalty", 0.0)
    if "fusion_penalty" not in fit.values:
        refusals.append(Refusal("fusion_penalty", "not measured: no fused iteration was read", {}))
    if penalty > 1:
        refusals.append(
            Refusal(
                "fusion_penalty",
                f"fitted {penalty:.3g} > 1; capped at 1, the model's ceiling",
                {"estimate": penalty, "used": 1.0},
            )
        )
        penalty = 1.0
    if values["prefill_pass_overhead"] + values["prefill_per_token"] <= 0:
        raise ValueError(
            "every prefill term was refused: the prompts' TTFTs do not grow with length"
        )
    return values, penalty, refusals


def fit_server(
    samples: Samples, sweep: ServerSweep, provenance: Mapping[str, Any]
) -> ServerCalibration:
    """The cost model and overhead ``samples`` support: one fit of the prefill terms, the fusion
    penalty and the request's overhead to every pass the server ran (prompts alone and fused
    iterations beside live streams), each prompt length held out in turn.

    Raises:
        ValueError: without TTFTs at 3 or more prompt lengths or any decode sample.
    """
    lengths = sorted(samples.ttft)
    if len(lengths) < 3:
        raise ValueError("a server calibration needs TTFTs alone at 3 or more prompt lengths")
    alone = [Measurement.from_samples(samples.ttft[p]) for p in lengths]
    decoded = decode_points(samples.decode)
    decode_fit, decode, refusals = decode_constants(decoded)
    per_kv = decode["decode_per_kv_token"]
    every_stall = samples.stalls + samples.traffic_stalls
    fused = fused_points(every_stall + samples.loaded_stalls, sweep.budget)
    steps = tuple(_decode_step(decode, p.rows, p.kv_tokens) for p in fused)
    engine = (provenance.get("server") or {}).get("engine")
    batch = engine not in PER_REQUEST_ATTENTION
    data = PassData(tuple(lengths), tuple(alone), tuple(fused), steps, sweep.budget, batch)
    to_engine = _to_engine(every_stall)
    pass_fit = fit_passes(data, per_kv)
    # the part of a TTFT alone no pass explains; never less than the way in read beside streams
    fitted_overhead = pass_fit.values.get(OVERHEAD, 0.0)
    total = max(fitted_overhead, 0.0 if math.isnan(to_engine) else to_engine)
    how = (
        "fitted: the part of a TTFT alone that no pass explains"
        if total == fitted_overhead
        else "the way in read beside live streams (the fit could not see more)"
    )
    prefill, penalty, more = _pass_constants(pass_fit, None if batch else PER_REQUEST_WHY)
    cost = CostModel(**prefill, **decode, fusion_penalty=penalty, **_memory(provenance))
    prompts = [Point("prefill", p, m) for p, m in zip(lengths, alone)]
    fitted = {p.x: ttft_alone(cost, total, p.x, sweep.budget) for p in prompts}
    held = held_out(data, per_kv)
    predictions = [Prediction(p, fitted[p.x], held.get(p.x)) for p in prompts]
    predictions += [Prediction(p, predict(cost, NO_FLOOR, p), None) for p in decoded + fused]
    calibration = Calibration(
        cost,
        dict(provenance),
        tuple(prompts + decoded + fused),
        {"passes": pass_fit, "decode": decode_fit},
        tuple(refusals + more),
        NO_FLOOR,
        tuple(predictions),
    )
    round_trip = statistics.median(samples.round_trips) if samples.round_trips else math.nan
    overhead = RequestOverhead(total, to_engine, round_trip, how)
    return ServerCalibration(calibration, overhead, tuple(chunking_of(samples.stalls)), sweep)


def _memory(provenance: Mapping[str, Any]) -> dict[str, float]:
    """The KV bytes per token and capacity the server's facts show (serve/server_facts)."""
    facts = ServerFacts.from_dict(provenance.get("deployment"))
    out: dict[str, float] = {}
    if facts is not None and facts.kv_bytes_per_token is not None:
        out["kv_bytes_per_token"] = float(facts.kv_bytes_per_token)
    if facts is not None and facts.kv_capacity_tokens is not None:
        out["kv_capacity_tokens"] = float(facts.kv_capacity_tokens)
    return out


def server_provenance(target: Target, sweep: ServerSweep, **extra: Any) -> dict[str, Any]:
    """Where a server calibration comes from: the server's identity, the sweep, the date."""
    from pytest_prefill import __version__

    identity = target.identity
    return {
        "source": "server",
        "device": "server",
        "device_name": f"{identity.engine} at {identity.url}",
        "model": identity.model,
        "model_source": f"served by {identity.engine} ({identity.how})",
        "server": identity.to_dict(),
        "deployment": server_facts(identity).to_dict(),
        "endpoint": target.endpoint,
        "budget": sweep.budget,
        "repeats": sweep.repeats,
        "warmup": sweep.warmup,
        "dry_run": False,
        "prefill_points": "TTFT alone over HTTP: the request's overhead plus ceil(P / budget) passes",
        "pytest_prefill": __version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }


async def calibrate_server(
    target: Target, sweep: ServerSweep, progress: Progress | None = None, **provenance: Any
) -> ServerCalibration:
    """Measure ``sweep`` against ``target`` and fit it; a sweep with no cap of its own runs
    under the one the server's command states (:meth:`ServerSweep.capped`)."""
    if not sweep.max_seqs:
        sweep = sweep.capped(server_facts(target.identity).max_seqs)
    samples = await measure_server(target, sweep, progress)
    return fit_server(samples, sweep, server_provenance(target, sweep, **provenance))
