"""The held-out workloads a fidelity run measures: none of them a request the calibration sent.
Poisson arrivals at two loads and a window of the Azure conv trace's own arrivals (its lengths
scaled down to a small model), plus two that a wrong token budget cannot pass unnoticed:
prompts several times the budget among short ones (a wrong budget changes how many passes
they take) and a burst (all at once: a wrong budget changes the queueing), and one that a
wrong first-token rule cannot: short prompts each alone (a TTFT of one short pass, to which
a first token at the next decode step adds a whole decode step). Without the Azure trace the
lengths fall back to a fixed mix, and every workload says so. Standard library only."""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Sequence

from pytest_prefill.plan.traces import (
    AZURE_ATTRIBUTION,
    AZURE_DIR_ENV,
    azure_trace_path,
    load_azure,
)
from pytest_prefill.serve.calibration.calibration_fit import ttft_alone
from pytest_prefill.serve.calibration.server_calibration import ServerCalibration
from pytest_prefill.sim import Request

PROMPT_SCALE = 4  # Azure conv prompts (median ~1,000 tokens) divided by this
OUTPUT_SCALE = 8  # and its outputs (median ~130)
MIN_OUTPUT = 4
LOADS = (0.5, 1.0)  # Poisson rates, in requests per mean service time of one request alone
LONG_TIMES = (4, 6, 8)  # the long prompts, in budgets
ALONE_PROMPTS = (24, 40, 56)  # the short prompts sent alone (not the calibration's lengths)
ALONE_OUTPUT = 8
ALONE_SPACING = 2.0  # each arrives this many times its own service time after the one before
# ... and this many times the other workloads' requests: its TTFT cells are where a wrong
# first-token rule shows (one decode step on a short pass), and the p90 of 16 requests moves
# with one or two of them; each takes tens of milliseconds
ALONE_TIMES = 3
SOURCES = ("azure-conv", "mix")
MIX = "prompts 64-512, outputs 8-32"


@dataclasses.dataclass(frozen=True)
class ServerWorkload:
    """A held-out workload; ``fallback`` says loudly what it stands in for (None: nothing)."""

    name: str
    requests: tuple[Request, ...]
    description: str
    attribution: str | None = None
    fallback: str | None = None


def _scaled(rows: Sequence[Request], max_prompt: int) -> list[tuple[int, int]]:
    return [
        (
            min(max(r.prompt_len // PROMPT_SCALE, 16), max_prompt),
            max(r.output_len // OUTPUT_SCALE, MIN_OUTPUT),
        )
        for r in rows
    ]


def lengths(
    source: str | None, max_prompt: int, count: int, seed: int
) -> tuple[list[tuple[int, int]], str, str | None, str | None]:
    """(prompt, output) pairs, what they are, the Azure trace's path (None: not used) and the
    fallback's warning (None: none). ``source`` None: the Azure conv trace where it is found,
    else the fixed mix, loudly.

    Raises:
        ValueError: for an unknown source, or ``azure-conv`` asked for where it is not found.
    """
    if source is not None and source not in SOURCES:
        raise ValueError(f"workload must be one of {', '.join(SOURCES)}, got {source!r}")
    path = azure_trace_path("conv") if source != "mix" else None
    if source == "azure-conv" and path is None:
        raise ValueError(
            f"workload azure-conv: no Azure trace here (../shared/data/azure-llm-inference-2023/"
            f"conv.csv next to the checkout, or ${AZURE_DIR_ENV})"
        )
    rng = random.Random(seed)
    if path is not None:
        pairs = _scaled(load_azure(path, limit=4000), max_prompt)
        what = f"Azure conv lengths / {PROMPT_SCALE} (prompts) and / {OUTPUT_SCALE} (outputs)"
        return [rng.choice(pairs) for _ in range(count)], what, path, None
    mix = [(min(p, max_prompt), o) for p in (64, 128, 256, 512) for o in (8, 16, 32)]
    warning = None
    if source is None:
        warning = (
            f"FALLBACK: no Azure trace found (../shared/data/azure-llm-inference-2023/conv.csv "
            f"or ${AZURE_DIR_ENV}): the held-out lengths are a fixed mix ({MIX}), not a "
            "trace's; give --workload mix to choose it, or the trace to use it"
        )
    return [rng.choice(mix) for _ in range(count)], MIX, None, warning


def service_time(calibration: ServerCalibration, pairs: Sequence[tuple[int, int]]) -> float:
    """Mean seconds one request of ``pairs`` takes alone, by the calibration."""
    cost, budget = calibration.cost, calibration.sweep.budget
    times = [
        ttft_alone(cost, calibration.overhead.total, p, budget)
        + (o - 1) * cost.decode_step(1, p + o // 2)
        for p, o in pairs
    ]
    return statistics.mean(times)


def _poisson(
    name: str, pairs: Sequence[tuple[int, int]], rate: float, seed: int
) -> tuple[Request, ...]:
    rng, t, requests = random.Random(seed), 0.0, []
    for i, (p, o) in enumerate(pairs):
        requests.append(Request(f"{name}-{i}", t, p, o))
        t += rng.expovariate(rate)
    return tuple(requests)


def held_out_workloads(
    calibration: ServerCalibration,
    *,
    count: int = 16,
    seed: int = 7,
    max_prompt: int = 2048,
    source: str | None = None,
) -> list[ServerWorkload]:
    """Poisson arrivals at ``LOADS`` (requests per mean service time), prompts of
    ``LONG_TIMES`` budgets (capped at ``max_prompt``) among the short ones at the lower load,
    a burst, short prompts each alone, and (with the trace) a window of its own arrival times
    rescaled to the higher load; ``count`` requests each (``ALONE_TIMES`` x that alone)."""
    pairs, what, path, fallback = lengths(source, max_prompt, count, seed)
    service = service_time(calibration, pairs)
    budget = calibration.sweep.budget
    out = []
    for load in LOADS:
        rate = load / service
        requests = _poisson(f"poisson{load:g}", pairs, rate, seed + int(load * 100))
        description = f"{count} Poisson arrivals at {rate:.2f} req/s; {what}"
        out.append(ServerWorkload(f"poisson x{load:g}", requests, description, fallback=fallback))
    long_pairs = [
        (min(budget * LONG_TIMES[i // 2 % len(LONG_TIMES)], max_prompt), o) if i % 2 else (p, o)
        for i, (p, o) in enumerate(pairs)
    ]
    rate = min(LOADS) / service_time(calibration, long_pairs)
    longest = max(p for p, _ in long_pairs)
    out.append(
        ServerWorkload(
            "long prompts",
            _poisson("long", long_pairs, rate, seed + 1),
            f"{count} Poisson arrivals at {rate:.2f} req/s, every other prompt "
            f"{'-'.join(map(str, LONG_TIMES))}x the budget {budget} (up to {longest} tokens); "
            f"{what}",
            fallback=fallback,
        )
    )
    burst = tuple(Request(f"burst-{i}", 0.0, p, o) for i, (p, o) in enumerate(pairs))
    out.append(ServerWorkload("burst", burst, f"{count} requests at once; {what}", None, fallback))
    out.append(_alone(calibration, count * ALONE_TIMES))
    if path is not None:
        out.append(_azure_window(path, count, max_prompt, max(LOADS) / service))
    return out


def _alone(calibration: ServerCalibration, count: int) -> ServerWorkload:
    """Short prompts, each alone: the next arrives ``ALONE_SPACING`` x this one's service time
    (by the calibration) after it, so no two overlap; the lengths are fixed, not the trace's."""
    t, requests = 0.0, []
    for i in range(count):
        prompt = ALONE_PROMPTS[i % len(ALONE_PROMPTS)]
        requests.append(Request(f"alone-{i}", t, prompt, ALONE_OUTPUT))
        t += ALONE_SPACING * service_time(calibration, [(prompt, ALONE_OUTPUT)])
    prompts = "-".join(map(str, ALONE_PROMPTS))
    return ServerWorkload(
        "short alone",
        tuple(requests),
        f"{count} prompts of {prompts} tokens ({ALONE_OUTPUT} out), each alone (spaced "
        f"{ALONE_SPACING:g}x its service time): TTFT is one short pass",
    )


def _azure_window(path: str, count: int, max_prompt: int, rate: float) -> ServerWorkload:
    window = load_azure(path, start=600.0, limit=count)
    span = window[-1].arrival - window[0].arrival
    scale = (len(window) - 1) / span / rate if span > 0 else 1.0
    requests = tuple(
        Request(f"azure-{r.id}", (r.arrival - window[0].arrival) * scale, *pair)
        for r, pair in zip(window, _scaled(window, max_prompt))
    )
    return ServerWorkload(
        "azure-conv window",
        requests,
        f"{count} requests from 600 s into azure-conv, its arrival times rescaled to "
        f"{rate:.2f} req/s, lengths scaled as above",
        AZURE_ATTRIBUTION,
    )
