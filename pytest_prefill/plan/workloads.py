"""Workloads for the simulator: the lab's scenario, seeded Poisson loads, and a workload by name
for the command line (``lab``, ``poisson``, the traces the package ships, a CSV or JSONL file: the
files are read by :mod:`.traces`). Standard library only."""

from __future__ import annotations

import dataclasses
import math
import os
import random
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from pytest_prefill.plan.traces import (
    AZURE_ATTRIBUTION,
    JSONL_BLOCK_TOKENS,
    MOONCAKE_ATTRIBUTION,
    SHIPPED_TRACES,
    load_azure,
    load_jsonl,
    named_trace_path,
    trace_locations,
)
from pytest_prefill.sim import Request, check_int, check_number

NAMED_WORKLOADS = ("lab", "poisson", *SHIPPED_TRACES)
POISSON_DEFAULTS = {"request_rate": 1.0, "num_prompts": 1000}
POISSON_PROMPT_LEN, POISSON_OUTPUT_LEN = 1024, 128  # the named workload's lengths


@dataclasses.dataclass(frozen=True, slots=True)
class LabScenario:
    """The lab scenario's shape: ``streams`` live streams decoding and a ``prompt_len``-token
    prompt arriving at ``arrival`` seconds (checked by :meth:`requests`)."""

    streams: int = 2
    prompt_len: int = 2048
    arrival: float = 0.1

    def requests(self) -> list[Request]:
        """The scenario's requests (:func:`lab_scenario`)."""
        return lab_scenario(streams=self.streams, prompt_len=self.prompt_len, arrival=self.arrival)


LAB_SCENARIO = LabScenario()


def lab_scenario(
    *,
    streams: int = LAB_SCENARIO.streams,
    prompt_len: int = LAB_SCENARIO.prompt_len,
    arrival: float = LAB_SCENARIO.arrival,
    stream_prompt_len: int = 128,
    stream_output_len: int = 256,
    output_len: int = 32,
) -> list[Request]:
    """``streams`` live requests arrive at 0 and decode for ``stream_output_len`` tokens; a
    prompt of ``prompt_len`` tokens (id ``"long"``) arrives at ``arrival`` seconds."""
    check_int("streams", streams, minimum=0)
    check_number("arrival", arrival)
    live = [Request(f"live{i}", 0.0, stream_prompt_len, stream_output_len) for i in range(streams)]
    return [*live, Request("long", arrival, prompt_len, output_len)]


def poisson(
    rate: float,
    count: int,
    *,
    prompt_len: int | Callable[[random.Random], int] | Sequence[int] = 1024,
    output_len: int | Callable[[random.Random], int] | Sequence[int] = 128,
    seed: int = 0,
    start: float = 0.0,
) -> list[Request]:
    """``count`` requests with exponential inter-arrival times at ``rate`` per second.

    A length is a constant, a function of the seeded ``random.Random``, or a sequence to sample
    from uniformly (e.g. the prompt lengths of a real trace). The same seed gives the same load.
    """
    check_number("rate", rate, positive=True)
    check_int("count", count, minimum=0)
    check_number("start", start)
    _check_length("prompt_len", prompt_len)
    _check_length("output_len", output_len)
    rng = random.Random(seed)

    def draw(field: str, spec: int | Callable[[random.Random], int] | Sequence[int]) -> int:
        if isinstance(spec, int):
            return spec
        value = spec(rng) if callable(spec) else rng.choice(spec)
        return check_int(field, value)

    t = start
    load = []
    for i in range(count):
        t += rng.expovariate(rate)
        load.append(
            Request(f"p{i}", t, draw("prompt_len", prompt_len), draw("output_len", output_len))
        )
    return load


def _check_length(field: str, spec: object) -> None:
    """A length spec is an int >= 1, a function of the ``random.Random``, or a non-empty
    sequence (a string is none of these); what a function or a sequence yields is checked when
    drawn."""
    if callable(spec):
        return
    if isinstance(spec, Sequence) and not isinstance(spec, (str, bytes)):
        if not spec:
            raise ValueError(f"{field} must not be an empty sequence")
        return
    if isinstance(spec, bool) or not isinstance(spec, int) or spec < 1:
        raise ValueError(
            f"{field} must be an integer >= 1, a function of a random.Random, or a non-empty "
            f"sequence of integers >= 1; got {spec!r}"
        )


@dataclasses.dataclass(frozen=True)
class Workload:
    """A load with what a report needs to say about it: its ``name`` as the user gave it, a
    one-line ``description``, how many prompts were cut to the model's context (``capped``, to
    ``max_model_len`` tokens) and the data's ``attribution`` when it carries one."""

    name: str
    requests: tuple[Request, ...]
    description: str
    capped: int = 0
    max_model_len: int | None = None
    attribution: str | None = None
    notes: tuple[str, ...] = ()  # what a reader must know about how it was read
    prefix_block_tokens: int | None = None  # tokens per prefix block, when requests carry them

    @property
    def span(self) -> float:
        """Seconds from the first arrival to the last."""
        arrivals = [r.arrival for r in self.requests]
        return max(arrivals) - min(arrivals) if arrivals else 0.0

    @property
    def rate(self) -> float:
        """Mean arrival rate: :func:`arrival_rate` of the requests."""
        return arrival_rate(self.requests)


def arrival_rate(load: Sequence[Request]) -> float:
    """Mean arrival rate of ``load``, requests per second: (n - 1) arrivals after the first,
    over the span from the first to the last (NaN when every request arrives at once)."""
    arrivals = [r.arrival for r in load]
    span = max(arrivals) - min(arrivals) if arrivals else 0.0
    return (len(arrivals) - 1) / span if span > 0 else math.nan


def _window_of(load: Sequence[Request], window: tuple[float, float | None]) -> list[Request]:
    """The requests arriving in [start, end) seconds after the first arrival, shifted to 0."""
    start, end = window
    origin = min((r.arrival for r in load), default=0.0)
    return [
        dataclasses.replace(r, arrival=r.arrival - origin - start)
        for r in sorted(load, key=lambda r: (r.arrival, r.id))
        if r.arrival - origin >= start and (end is None or r.arrival - origin < end)
    ]


def _check_window(window: Any) -> tuple[float, float | None]:
    try:
        start, end = window
    except (TypeError, ValueError):
        raise ValueError(f"window must be (start, end) seconds, got {window!r}") from None
    check_number("window start", start)
    if end is not None and not (check_number("window end", end, positive=True) > start):
        raise ValueError(f"window end must be after its start, got {start!r}:{end!r}")
    return float(start), None if end is None else float(end)


def _read_trace(
    spec: str, window: tuple[float, float | None] | None, limit: int | None
) -> tuple[list[Request], str, str | None]:
    """The trace ``spec`` names (a shipped trace's name or a .csv/.jsonl path, plain or gzip),
    windowed and limited."""
    start, end = window or (0.0, None)
    duration = None if end is None else end - start
    if spec in SHIPPED_TRACES:
        path = named_trace_path(spec)
        attribution = AZURE_ATTRIBUTION if spec.startswith("azure-") else MOONCAKE_ATTRIBUTION
        if path is None:
            raise ValueError(
                f"workload {spec!r}, the {attribution}: its trace is not installed; looked in "
                f"{', '.join(trace_locations(spec))} (reinstall pytest-prefill, or pass the "
                "trace file's path as the workload)"
            )
        reader = load_azure if spec.startswith("azure-") else load_jsonl
        load = reader(path, start=start, duration=duration, limit=limit)
        return load, f"{spec} ({os.path.basename(path)})", attribution
    if not os.path.isfile(spec):
        raise ValueError(
            f"workload {spec!r} is not one of {', '.join(NAMED_WORKLOADS)} and no such file exists"
        )
    name = os.path.basename(spec)  # a title names the file, not where it sits on this disk
    kind = spec.removesuffix(".gz")  # read through gzip either way: open_trace sees its bytes
    if kind.endswith(".jsonl"):
        load = load_jsonl(spec, start=start, duration=duration, limit=limit)
        return load, f"{name} (timestamps read as milliseconds)", None
    if kind.endswith(".csv"):
        return load_azure(spec, start=start, duration=duration, limit=limit), name, None
    raise ValueError(
        f"workload file {spec!r} must end in .csv (Azure columns) or .jsonl, optionally .gz"
    )


def scale_rate(load: Iterable[Request], factor: float) -> list[Request]:
    """``load`` with its arrival rate multiplied by ``factor`` (every arrival time divided).

    Raises:
        ValueError: for a factor that is not a positive finite number.
    """
    factor = check_number("rate scale", factor, positive=True)
    if factor == 1:
        return list(load)
    return [_arriving(r, r.arrival / factor) for r in load]


def _arriving(request: Request, arrival: float) -> Request:
    """``request`` arriving at ``arrival``, not checked again: its other fields were checked
    when it was made, and a finite arrival over a positive finite factor is a finite number
    (one that overflows goes through the check, which refuses it). A capacity search scales
    the whole load for every simulation; checking each prefix block id again took a tenth of
    a Mooncake probe."""
    if not math.isfinite(arrival):
        return dataclasses.replace(request, arrival=arrival)
    moved = object.__new__(Request)
    for name in Request.__slots__:
        object.__setattr__(moved, name, getattr(request, name))
    object.__setattr__(moved, "arrival", arrival)
    return moved


def _check_resolve_arguments(
    spec: str,
    request_rate: float | None,
    num_prompts: int | None,
    rate_scale: float | None,
    max_model_len: int | None,
) -> None:
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"workload must be one of {', '.join(NAMED_WORKLOADS)} or a path")
    for field, value in (("request_rate", request_rate), ("rate_scale", rate_scale)):
        if value is not None:
            check_number(field, value, positive=True)
    for field, count in (("num_prompts", num_prompts), ("max_model_len", max_model_len)):
        if count is not None:
            check_int(field, count)
    if request_rate is not None and rate_scale is not None:
        raise ValueError("request_rate and rate_scale both set the arrival rate: give one")


def _random_lengths(inputs: int, outputs: int, ratio: float) -> dict[str, Any]:
    """vLLM's random dataset lengths: uniform in [n·(1 − ratio), n·(1 + ratio)], at least 1."""
    check_int("input length", inputs, minimum=1)
    check_int("output length", outputs, minimum=1)
    if not (isinstance(ratio, (int, float)) and 0 <= ratio < 1):
        raise ValueError(f"range ratio must be in [0, 1), got {ratio!r}")

    def spread(n: int) -> int | Callable[[random.Random], int]:
        low, high = max(1, int(n * (1 - ratio))), max(1, int(n * (1 + ratio)))
        return n if low == high else (lambda rng: rng.randint(low, high))

    return {"prompt_len": spread(inputs), "output_len": spread(outputs)}


def resolve_workload(
    spec: str,
    *,
    request_rate: float | None = None,
    num_prompts: int | None = None,
    window: tuple[float, float | None] | None = None,
    rate_scale: float | None = None,
    seed: int = 0,
    max_model_len: int | None = None,
    lengths: tuple[int, int, float] | None = None,
) -> Workload:
    """The workload ``spec`` names: ``lab``, ``poisson``, a trace the package ships
    (``azure-conv``, ``azure-code``, ``mooncake-conv``), or a ``.csv`` (Azure columns) or
    ``.jsonl`` (``timestamp`` ms, ``input_length``, ``output_length``) path, plain or ``.gz``.

    Args:
        spec: the workload.
        request_rate: ``poisson``: its rate (default 1/s); a trace: arrival times rescaled so
            the mean rate is this.
        num_prompts: ``poisson``: how many (default 1000); a trace: its first N (after the
            window).
        window: (start, end or None) seconds since the first arrival; kept arrivals start at 0.
        rate_scale: multiply the arrival rate by this (not with ``request_rate``).
        seed: ``poisson``'s random seed.
        max_model_len: prompts longer than this many tokens are cut to it (``capped`` counts
            them).
        lengths: ``poisson``: (input length, output length, range ratio), vLLM's random
            dataset: each length drawn uniformly from [n·(1 − ratio), n·(1 + ratio)] (output
            at least 1); default (1024, 128, 0).

    Raises:
        ValueError: naming the argument, for an unknown workload or missing file, a value out of
            range, both rate arguments, an argument the lab scenario does not take, or a
            workload with no request (e.g. an empty window).
    """
    _check_resolve_arguments(spec, request_rate, num_prompts, rate_scale, max_model_len)
    window = _check_window(window) if window is not None else None
    attribution = None
    if spec == "lab":
        given: dict[str, object] = {"request_rate": request_rate, "num_prompts": num_prompts}
        given.update(window=window, rate_scale=rate_scale, lengths=lengths)
        if any(value is not None for value in given.values()):
            names = ", ".join(name for name, value in given.items() if value is not None)
            raise ValueError(f"the lab workload is fixed; it takes no {names}")
        load = lab_scenario()
        source = "lab (2 live streams decoding, a 2048-token prompt arrives at 100 ms)"
    elif spec == "poisson":
        rate = request_rate or POISSON_DEFAULTS["request_rate"]
        count = int(num_prompts or POISSON_DEFAULTS["num_prompts"])
        inputs, outputs, ratio = lengths or (POISSON_PROMPT_LEN, POISSON_OUTPUT_LEN, 0.0)
        load = poisson(rate, count, seed=seed, **_random_lengths(inputs, outputs, ratio))
        load = _window_of(load, window) if window is not None else load
        spread = f" ±{ratio:.0%}" if ratio else ""
        source = f"poisson ({count:,} requests at {rate:g} req/s, seed {seed}; "
        source += f"{inputs}/{outputs} tokens{spread})"
        request_rate = None
    else:
        if lengths is not None:
            raise ValueError(f"lengths are poisson's; workload {spec!r} has its own")
        load, source, attribution = _read_trace(spec, window, num_prompts)
    if not load:
        raise ValueError(f"workload {spec!r} has no request (window {window!r})")
    load = _rescaled(load, request_rate, rate_scale)
    load, capped = _capped(load, max_model_len)
    if window is not None:
        source += f", window {window[0]:g}:{'' if window[1] is None else f'{window[1]:g}'} s"
    notes = _unit_notes(spec, load)
    carrying = sum(1 for r in load if r.prefix_blocks)
    block = JSONL_BLOCK_TOKENS if carrying else None
    if carrying:
        notes += (
            f"  {carrying:,} of {len(load):,} requests carry hash_ids, kept as prefix blocks of "
            f"{block} tokens (Mooncake's block), for a prefix cache to reuse (--prefix-caching on|off)",
        )
    workload = Workload(spec, tuple(load), source, capped, max_model_len, attribution, notes)
    workload = dataclasses.replace(workload, prefix_block_tokens=block)
    summary = f"{len(load):,} requests over {workload.span:,.1f} s"
    if not math.isnan(workload.rate):
        summary += f" ({workload.rate:.2f} req/s)"
    return dataclasses.replace(workload, description=f"{source}: {summary}")


# A JSONL trace's timestamps are milliseconds (Mooncake's and vLLM's traces); one written in
# seconds reads as a burst a thousand times too fast. At or below this mean gap it probably is.
SECONDS_LIKE_GAP = 1e-3


def _unit_notes(spec: str, load: Sequence[Request]) -> tuple[str, ...]:
    """A warning when a JSONL trace's arrivals, read as milliseconds, are closer than
    :data:`SECONDS_LIKE_GAP` on average: its timestamps are probably seconds."""
    if not spec.removesuffix(".gz").endswith(".jsonl") or len(load) < 2:
        return ()
    span = max(r.arrival for r in load) - min(r.arrival for r in load)
    gap = span / (len(load) - 1)
    if gap > SECONDS_LIKE_GAP:
        return ()
    return (
        f"  WARNING: {spec.rsplit('/', 1)[-1]}'s timestamps were read as milliseconds (the "
        f"JSONL convention): {len(load):,} requests over {span * 1e3:,.3g} ms, a mean gap of "
        f"{gap * 1e3:.3g} ms. If they are seconds, rescale with --rate-scale 0.001.",
    )


def _rescaled(
    load: list[Request], request_rate: float | None, rate_scale: float | None
) -> list[Request]:
    if request_rate is not None:
        rate = arrival_rate(load)
        if math.isnan(rate):
            raise ValueError("request_rate needs a workload whose arrivals are not all equal")
        return scale_rate(load, request_rate / rate)
    return scale_rate(load, rate_scale) if rate_scale is not None else load


def _capped(load: list[Request], max_model_len: int | None) -> tuple[list[Request], int]:
    if max_model_len is None:
        return load, 0
    capped = sum(1 for r in load if r.prompt_len > max_model_len)
    if not capped:
        return load, 0
    return [
        dataclasses.replace(r, prompt_len=max_model_len) if r.prompt_len > max_model_len else r
        for r in load
    ], capped
