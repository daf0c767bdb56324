"""Workloads for the simulator: the lab's scenario, seeded Poisson loads, and the Azure LLM
inference 2023 traces (Patel et al., "Splitwise", ISCA 2024; CC-BY 4.0). Standard library only."""

from __future__ import annotations

import csv
import datetime
import os
import random
from collections.abc import Callable, Sequence

from pytest_prefill.scheduler import Request, _count, _number

# Where the repository's sibling ``shared/`` keeps the Azure traces; override with
# PYTEST_PREFILL_AZURE_DIR.
AZURE_DIR_ENV = "PYTEST_PREFILL_AZURE_DIR"
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def lab_scenario(
    *,
    streams: int = 2,
    prompt_len: int = 2048,
    arrival: float = 0.1,
    stream_prompt_len: int = 128,
    stream_output_len: int = 256,
    output_len: int = 32,
) -> list[Request]:
    """``streams`` live requests arrive at 0 and decode for ``stream_output_len`` tokens; a
    prompt of ``prompt_len`` tokens (id ``"long"``) arrives at ``arrival`` seconds."""
    _count("streams", streams, minimum=0)
    _number("arrival", arrival)
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
    _number("rate", rate, positive=True)
    _count("count", count, minimum=0)
    _number("start", start)
    rng = random.Random(seed)

    def draw(field: str, spec: int | Callable[[random.Random], int] | Sequence[int]) -> int:
        if isinstance(spec, int):
            return spec
        value = spec(rng) if callable(spec) else rng.choice(spec)
        return _count(field, value)

    if isinstance(prompt_len, Sequence) and not prompt_len:
        raise ValueError("prompt_len must not be an empty sequence")
    if isinstance(output_len, Sequence) and not output_len:
        raise ValueError("output_len must not be an empty sequence")
    t = start
    load = []
    for i in range(count):
        t += rng.expovariate(rate)
        load.append(
            Request(f"p{i}", t, draw("prompt_len", prompt_len), draw("output_len", output_len))
        )
    return load


def _parse_timestamp(text: str) -> datetime.datetime:
    # "2023-11-16 18:17:03.9799600": seven fractional digits, which datetime does not take.
    head, _, frac = text.strip().partition(".")
    moment = datetime.datetime.strptime(head, "%Y-%m-%d %H:%M:%S")
    if frac:
        if not frac.isdigit():
            raise ValueError(f"bad fractional seconds {frac!r}")
        moment += datetime.timedelta(microseconds=round(int(frac) / 10 ** len(frac) * 1e6))
    return moment


def load_azure(
    path: str | os.PathLike[str],
    *,
    start: float = 0.0,
    duration: float | None = None,
    limit: int | None = None,
    rate_scale: float = 1.0,
) -> list[Request]:
    """Requests from an Azure LLM inference 2023 CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Args:
        path: the CSV file.
        start, duration: keep rows whose time since the first row is in [start, start+duration)
            seconds (all rows when duration is None); kept arrivals are shifted to begin at 0.
        limit: keep at most this many rows (after the window).
        rate_scale: multiply the arrival rate (divide every arrival time) by this factor.

    Raises:
        ValueError: naming the file and line, for a missing column, a bad timestamp or a
            non-positive token count; or naming the argument for a bad window, limit or scale.
        FileNotFoundError: when the file does not exist.
    """
    _number("start", start)
    if duration is not None:
        _number("duration", duration, positive=True)
    if limit is not None:
        _count("limit", limit)
    _number("rate_scale", rate_scale, positive=True)
    load: list[Request] = []
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != AZURE_COLUMNS:
            raise ValueError(f"{path}: header must be {','.join(AZURE_COLUMNS)}, got {header!r}")
        origin: datetime.datetime | None = None
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            try:
                stamp, context, generated = row
                moment = _parse_timestamp(stamp)
                prompt, output = int(context), int(generated)
            except ValueError as err:
                raise ValueError(f"{path}:{line}: cannot read row {row!r} ({err})") from None
            if prompt < 1 or output < 1:
                raise ValueError(f"{path}:{line}: token counts must be >= 1, got {row!r}")
            origin = origin or moment
            offset = (moment - origin).total_seconds()
            if offset < start:
                continue
            if duration is not None and offset >= start + duration:
                break
            load.append(Request(f"az{line - 2}", (offset - start) / rate_scale, prompt, output))
            if limit is not None and len(load) >= limit:
                break
    return load


def azure_trace_path(name: str) -> str | None:
    """Path of the shared Azure trace ``name`` (``"code"`` or ``"conv"``), or None if absent."""
    if name not in ("code", "conv"):
        raise ValueError(f"Azure trace name must be 'code' or 'conv', got {name!r}")
    candidates = []
    if os.environ.get(AZURE_DIR_ENV):
        candidates.append(os.environ[AZURE_DIR_ENV])
    here = os.path.dirname(os.path.abspath(__file__))
    for up in (os.path.join(here, ".."), os.getcwd()):
        candidates.append(os.path.join(up, "..", "shared", "data", "azure-llm-inference-2023"))
    for folder in candidates:
        path = os.path.join(folder, f"{name}.csv")
        if os.path.isfile(path):
            return os.path.normpath(path)
    return None
