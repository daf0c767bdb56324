"""The calibration's experiments against a running server, and what each one's token times say
about the iterations behind them. Standard library only.

- **Prompt alone**: one request, one output token: its TTFT is the request's overhead plus the
  passes its prompt takes (``ceil(P / budget)``, each chunk over the ones before).
- **Streams decoding**: k requests at once; while all k decode, every gap between two tokens of
  one of them is one iteration of k decode rows (their mean, over the window where all k are
  decoding, is immune to tokens that arrive together).
- **A prompt amid live streams**: r streams decoding, a long prompt arrives. The iteration that
  emits its first token also emits a token of each live stream, so the live stream's gaps just
  before that token are the iterations that held the prompt's chunks beside r decode rows: how
  many there were (the server's chunking, against the stated budget), how long each took (the
  fused cost), and when the first of them started (the request's way in, from the client's send
  to the engine).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from pytest_prefill.serve.client.wire import ServerError
from pytest_prefill.serve.load.loadgen import Bounds, Schedule, Target, run_load
from pytest_prefill.serve.load.records import ServerRecord
from pytest_prefill.sim import Request

STREAM_PROMPT = 32  # prompt tokens of a decoding stream
LIVE_LEAD = 0.4  # seconds the live streams decode before the long prompt is sent
SKIP_TOKENS = 2  # tokens at a stream's start not used for the decode step (admission noise)
SAME_TIME = 1e-4  # seconds: two token times this close came from one read
SLOW = 1.5  # an iteration this many times the median gap holds more than decode rows
WARMUP_REQUESTS = 3  # before a server is timed (:func:`warm_up`)
WARMUP_PROMPT = 64  # tokens


def chunks_of(prompt_len: int, budget: int, rows: int = 0) -> list[tuple[int, int]]:
    """The (new tokens, context) of each pass a ``prompt_len`` prompt takes beside ``rows``
    decode rows under a per-iteration ``budget`` (decode rows placed first)."""
    room = budget - rows
    if room < 1:
        raise ValueError(f"budget {budget} leaves no room for a prompt beside {rows} rows")
    return [(min(room, prompt_len - c), c) for c in range(0, prompt_len, room)]


@dataclasses.dataclass(frozen=True)
class DecodeSample:
    """One iteration of ``rows`` decode rows at about ``context`` cached tokens each, in
    calibration round ``round``."""

    rows: int
    context: int
    seconds: float
    round: int = 0


@dataclasses.dataclass(frozen=True)
class StallSample:
    """What one long prompt amid ``rows`` live streams showed: the live stream's gaps that held
    its chunks (``fused``: seconds each, in order; empty when they could not be read), the
    number of slow iterations seen before its first token (``seen``) against ``expected``
    (from the budget), and the seconds from its send to the first of those iterations
    (``way_in``: an upper bound; ``way_in_low``: the lower one, the iteration before)."""

    prompt_len: int
    rows: int
    row_context: int
    expected: int
    seen: int
    fused: tuple[float, ...]
    way_in: float
    way_in_low: float
    note: str = ""


async def prompt_alone(target: Target, prompt_len: int, key: str) -> float:
    """The TTFT of one ``prompt_len`` prompt with nothing else running (seconds).

    Raises:
        ServerError: naming the request, when it failed; ValueError, when its length was not
            confirmed.
    """
    run = await run_load(
        target,
        [Request(key, 0.0, prompt_len, 1)],
        schedule=Schedule("burst"),
        bounds=Bounds(warmup=0),
    )
    return _checked(run.records[0]).ttft


async def warm_up(target: Target, prefix: str = "") -> None:
    """A server's first requests are slow (570 ms for a 64-token prompt vs 9 ms warm): send
    ``WARMUP_REQUESTS`` short prompts alone before anything is timed, their answers dropped."""
    for i in range(WARMUP_REQUESTS):
        await prompt_alone(target, WARMUP_PROMPT, f"{prefix}warmup{i}")


def _checked(record: ServerRecord) -> ServerRecord:
    if not record.ok:
        # the server's fault, not the command line's: exit 1, not a usage error
        raise ServerError(f"calibration request {record.id} failed: {record.error}")
    if record.output_tokens is not None and record.output_tokens != record.output_len:
        raise ValueError(
            f"calibration request {record.id}: {record.output_tokens} tokens came for "
            f"{record.output_len} asked (the server does not pin output lengths)"
        )
    return record


async def traffic(
    target: Target,
    prompts: Sequence[int],
    tokens: int,
    spacing: float,
    budget: int,
    key: str,
    max_seqs: int = 0,
) -> tuple[list[DecodeSample], list[StallSample]]:
    """Requests of ``prompts`` tokens (``tokens`` each) sent ``spacing`` seconds apart, as
    traffic arrives: rows join and leave, contexts differ, each prompt lands amid the streams
    already decoding. Every decode-only iteration, and each later prompt's chunks read off the
    earliest stream decoding across them (:func:`traffic_stalls`, under the server's sequence
    cap ``max_seqs``)."""
    load = [Request(f"{key}-{i}", i * spacing, p, tokens) for i, p in enumerate(prompts)]
    run = await run_load(target, load, bounds=Bounds(warmup=0))
    records = [_checked(r) for r in run.records]
    return decode_iterations(records), traffic_stalls(records, budget, max_seqs)


def traffic_stalls(
    records: Sequence[ServerRecord], budget: int, max_seqs: int = 0
) -> list[StallSample]:
    """Each prompt of ``records`` (after the first) that landed amid streams already decoding,
    its chunks read off the earliest of them. Under a sequence cap (``max_seqs``, 0: none) a
    prompt sent while that many requests were in flight is left out: it waited for one to
    finish, so its way in would hold the wait and its chunks ran beside fewer rows than were
    live when it was sent (transformers serve capped at 2 here: a way in of 0.126 s read,
    against 0.011-0.013 s at caps 4 and 16, which the simulator then added to every TTFT)."""
    stalls = []
    for r in records[1:]:
        in_flight = sum(1 for o in records if o.arrival < r.arrival < o.chunk_times[-1])
        if max_seqs and in_flight >= max_seqs:
            continue
        live = [
            o
            for o in records
            if o.chunk_times[0] < r.arrival and o.chunk_times[-1] > r.chunk_times[0]
        ]
        if live:
            expected = len(chunks_of(r.prompt_len, budget, len(live)))
            stalls.append(read_stall(r, live[0], expected, r.prompt_len, len(live)))
    return stalls


def _clean_gaps(times: Sequence[float]) -> list[tuple[float, float]]:
    """The gaps between a stream's tokens (after its first ``SKIP_TOKENS``) that time one
    iteration each: neither end in a read that brought several tokens at once. When the
    client reads late, the tokens of several iterations arrive together: the gap into such a
    read spans all of them and the gap out of it is cut short."""
    together = [False] * len(times)
    for i in range(1, len(times)):
        if times[i] - times[i - 1] < SAME_TIME:
            together[i - 1] = together[i] = True
    return [
        (times[i], times[i + 1])
        for i in range(SKIP_TOKENS, len(times) - 1)
        if not (together[i] or together[i + 1])
    ]


def decode_iterations(records: Sequence[ServerRecord]) -> list[DecodeSample]:
    """The iterations of decode rows only that ``records``' token times show: a gap between two
    tokens of a stream while no prompt was in flight (none sent and still without its first
    token), neither of its tokens read together with others (:func:`_clean_gaps`), its rows
    the streams decoding across it, each iteration counted once (by its end)."""
    spans = [(r.arrival, r.chunk_times[0], r.chunk_times[-1], r) for r in records]
    seen: list[float] = []
    out = []
    for r in records:
        for a, b in _clean_gaps(r.token_times):
            if any(abs(b - end) < SAME_TIME * 10 for end in seen):
                continue
            if any(sent < b and first > a + SAME_TIME for sent, first, _, _ in spans):
                continue  # a prompt may have been in this iteration
            rows = [
                (o, first)
                for _, first, last, o in spans
                if first < a + SAME_TIME and last >= b - SAME_TIME
            ]
            kv = sum(
                o.prompt_len + sum(1 for t in o.token_times if t <= a + SAME_TIME) for o, _ in rows
            )
            seen.append(b)
            out.append(DecodeSample(len(rows), kv // max(len(rows), 1), b - a))
    return out


async def prompt_amid_streams(
    target: Target,
    prompt_len: int,
    rows: int,
    budget: int,
    live_tokens: int,
    key: str,
    *,
    live_prompt: int = STREAM_PROMPT,
    lead: float = LIVE_LEAD,
) -> StallSample:
    """``rows`` live streams of ``live_prompt`` tokens, and a ``prompt_len`` prompt sent
    ``lead`` seconds after them (time for their prompts to be prefilled and decoding)."""
    load = [Request(f"{key}-live{i}", 0.0, live_prompt, live_tokens) for i in range(rows)]
    load.append(Request(f"{key}-long", lead, prompt_len, 2))
    run = await run_load(target, load, bounds=Bounds(warmup=0))
    records = [_checked(r) for r in run.records]
    long = next(r for r in records if r.id.endswith("-long"))
    live = [r for r in records if r is not long]
    expected = len(chunks_of(prompt_len, budget, rows))
    return read_stall(long, live[0], expected, prompt_len, rows)


def read_stall(
    long: ServerRecord, live: ServerRecord, expected: int, prompt_len: int, rows: int
) -> StallSample:
    """The iterations that held ``long``'s chunks, read off ``live``'s token times: they run
    from the first slow iteration that began after ``long`` was sent to the one that emitted
    ``long``'s first token (the live token nearest to it in time)."""
    times = list(live.chunk_times)
    gaps = [b - a for a, b in zip(times, times[1:])]
    base = _median_gap(times)
    first, sent = long.chunk_times[0], long.arrival
    end = min(range(len(times)), key=lambda i: abs(times[i] - first))
    after = next((i for i, t in enumerate(times) if t > sent), len(times))
    start = next((j for j in range(after, end) if gaps[j] > SLOW * base), None)

    def unread(note: str, seen: int = 0) -> StallSample:
        return StallSample(prompt_len, rows, 0, expected, seen, (), math.nan, math.nan, note)

    if abs(times[end] - first) > base / 2:
        return unread("no token of the live stream came out with the prompt's first token")
    if start is None or start < 1:
        return unread("no slow iteration of the live stream after the prompt was sent")
    seen = end - start
    if any(g < SAME_TIME for g in gaps[start - 1 : end]):
        return unread(
            "tokens of the live stream arrived together: its gaps do not time iterations", seen
        )
    fused = tuple(gaps[start:end])
    row_context = live.prompt_len + start
    way_in, low = times[start] - sent, times[start - 1] - sent
    return StallSample(prompt_len, rows, row_context, expected, seen, fused, way_in, low)


def _median_gap(times: Sequence[float]) -> float:
    gaps = sorted(b - a for a, b in zip(times, times[1:]) if b - a > SAME_TIME)
    return gaps[len(gaps) // 2] if gaps else math.inf
