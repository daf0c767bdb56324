"""The fit of a server's calibration (``serve.calibration.calibration``'s samples in, a cost model and the
request's overhead out), through the project's own fits and refusals: ``measure.fitting``'s
relative least squares for the prefill terms, the fusion penalty and the request's overhead
together, ``measure.calibration_fit``'s decode fit. numpy (through those fits)."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_prefill.measure.calibration_fit import held_out_lengths
from pytest_prefill.measure.calibration_points import PREFILL_TERMS, Point
from pytest_prefill.measure.fitting import TermFit, fit_terms
from pytest_prefill.measure.timing import Measurement
from pytest_prefill.serve.calibration.experiments import DecodeSample, StallSample, chunks_of
from pytest_prefill.sim import CostModel, attention_pairs

OVERHEAD = "request_overhead"
# A chunk's tokens attending over the decode rows' cached tokens in one masked attention
# (transformers serve, llama.cpp): new tokens x the batch's cached tokens, fused iterations only.
BATCH_TERM = "batch_attention_per_pair"
PASS_TERMS = (*PREFILL_TERMS, "fusion_penalty", BATCH_TERM, OVERHEAD)
# A fused iteration whose chunk is this small may cost less to compute than its decode rows:
# the linear form below (compute + penalty x decode) does not hold for it, so it is not fitted.
MIN_FUSED_SHARE = 0.25  # of the budget


@dataclasses.dataclass(frozen=True)
class PassData:
    """What the prefill-side fit is made on: the TTFTs of prompts alone (``lengths``, their
    measurements) and the fused iterations beside live streams (``fused`` points), with the
    budget that chunked them and the decode step the decode fit gave each fused point."""

    lengths: tuple[int, ...]
    alone: tuple[Measurement, ...]
    fused: tuple[Point, ...]
    decode: tuple[float, ...]
    budget: int
    batch_term: bool = True  # False: the engine's attention reads each request's own KV only

    def without(self, length: int) -> PassData:
        keep = [i for i, x in enumerate(self.lengths) if x != length]
        return dataclasses.replace(
            self,
            lengths=tuple(self.lengths[i] for i in keep),
            alone=tuple(self.alone[i] for i in keep),
        )


def alone_row(length: int, budget: int) -> tuple[dict[str, float], int]:
    """A prompt alone: each term's multiplier in its TTFT (its passes, tokens and pairs, the
    overhead once) and the cached tokens its passes read."""
    pieces = chunks_of(length, budget)
    row = {
        "prefill_pass_overhead": float(len(pieces)),
        "prefill_per_token": float(length),
        "prefill_per_pair": float(sum(attention_pairs(t, c) for t, c in pieces)),
        "fusion_penalty": 0.0,
        BATCH_TERM: 0.0,
        OVERHEAD: 1.0,
    }
    return row, sum(c for _, c in pieces)


def fused_row(point: Point, decode: float) -> tuple[dict[str, float], int]:
    """A fused iteration, read as the cost model's compute part (one pass over the chunk, the
    decode rows riding as more tokens) plus ``fusion_penalty`` times its decode part."""
    t, c = point.x, point.context
    row = {
        "prefill_pass_overhead": 1.0,
        "prefill_per_token": float(t + point.rows),
        "prefill_per_pair": float(attention_pairs(t, c)),
        "fusion_penalty": decode,
        BATCH_TERM: float(t * point.rows * point.row_context),
        OVERHEAD: 0.0,
    }
    return row, c


def pass_design(
    data: PassData,
) -> tuple[dict[str, list[float]], list[float], list[float], list[int]]:
    """Columns, times, spreads and cached tokens read, alone prompts first, then the fused
    iterations whose chunk is at least ``MIN_FUSED_SHARE`` of the budget."""
    rows = [alone_row(x, data.budget) for x in data.lengths]
    measured = list(data.alone)
    for point, decode in zip(data.fused, data.decode):
        if point.x >= MIN_FUSED_SHARE * data.budget:
            rows.append(fused_row(point, decode))
            measured.append(point.measurement)
    columns = {name: [r[name] for r, _ in rows] for name in PASS_TERMS}
    return columns, [m.median for m in measured], [m.iqr for m in measured], [c for _, c in rows]


def fit_passes(data: PassData, per_kv: float) -> TermFit:
    """The prefill terms, the fusion penalty and the request's overhead, fitted together by
    relative least squares to the prompts' TTFTs alone and the fused iterations, refusing what
    the scatter cannot support. A term that never varies (no fused iteration: the penalty) is
    left out, and reported so by its absence; so is the batch-attention term where
    ``data.batch_term`` is off."""
    columns, ys, spreads, read = pass_design(data)
    kept = {
        k: v
        for k, v in columns.items()
        if any(v) and (k == "prefill_pass_overhead" or len(set(v)) > 1)
        if k != BATCH_TERM or data.batch_term
    }
    return fit_terms(kept, ys, spreads, offset=[per_kv * r for r in read])


def predict_pass_row(fit: TermFit, row: Mapping[str, float], read: int, per_kv: float) -> float:
    return fit.predict(row) + per_kv * read


def ttft_alone(cost: CostModel, overhead: float, length: int, budget: int) -> float:
    """The model's TTFT of a ``length``-token prompt alone: the overhead and its passes."""
    return overhead + sum(cost.prefill_pass(t, c) for t, c in chunks_of(length, budget))


def held_out(data: PassData, per_kv: float) -> dict[int, float]:
    """Each prompt length's TTFT alone predicted by a fit made without it."""
    out: dict[int, float] = {}
    for length in held_out_lengths(data.lengths, extra_terms=1):  # the request's overhead
        fit = fit_passes(data.without(length), per_kv)
        row, read = alone_row(length, data.budget)
        out[length] = predict_pass_row(fit, row, read, per_kv)
    return out


CONTEXT_BUCKET = 128  # decode iterations are grouped by rows and mean context, to this many tokens


def decode_points(samples: Sequence[DecodeSample]) -> list[Point]:
    """Decode iterations grouped by rows and mean context (``CONTEXT_BUCKET``): each group a
    measurement whose samples are its median in each round (the spread a refusal is judged
    against is then the rounds', as for repeated timings, not the spread of single
    iterations)."""
    groups: dict[tuple[int, int], list[DecodeSample]] = {}
    for s in samples:
        groups.setdefault((s.rows, s.context // CONTEXT_BUCKET), []).append(s)
    points = []
    for (rows, _), group in sorted(groups.items()):
        rounds: dict[int, list[float]] = {}
        for s in group:
            rounds.setdefault(s.round, []).append(s.seconds)
        m = Measurement.from_samples([statistics.median(v) for _, v in sorted(rounds.items())])
        context = round(statistics.mean(s.context for s in group))
        if rows == 1:
            points.append(Point("decode_kv", max(context, 1), m, rows=1))
        else:
            points.append(Point("decode_batch", rows, m, context=context))
    return points


def fused_points(stalls: Sequence[StallSample], budget: int) -> list[Point]:
    """The iterations beside live streams that held a long prompt's chunks, by chunk, each a
    measurement over the rounds (only prompts whose iterations could be read and numbered as
    the budget says); the rows' context is the rounds' mean."""
    groups: dict[tuple[int, int, int], list[tuple[float, int]]] = {}
    for s in stalls:
        if not s.fused or s.seen != s.expected:
            continue
        pieces = chunks_of(s.prompt_len, budget, s.rows)
        for j, ((tokens, context), seconds) in enumerate(zip(pieces, s.fused)):
            groups.setdefault((tokens, context, s.rows), []).append((seconds, s.row_context + j))
    points = []
    for (tokens, context, rows), items in sorted(groups.items()):
        m = Measurement.from_samples([seconds for seconds, _ in items])
        row_context = round(statistics.mean(k for _, k in items))
        points.append(
            Point("fused", tokens, m, context=context, rows=rows, row_context=row_context)
        )
    return points


@dataclasses.dataclass(frozen=True)
class RequestOverhead:
    """Seconds a request spends outside the engine's iterations, kept apart from the cost
    model: ``total`` (fitted: the TTFT's part no pass explains), ``to_engine`` (from the
    client's send to the first iteration that holds the prompt, read beside live streams;
    NaN when none could be read), ``from_engine`` (the rest: the first token's way back), and
    the network's ``round_trip`` (GET /v1/models)."""

    total: float
    to_engine: float
    round_trip: float
    how: str

    @property
    def from_engine(self) -> float:
        if math.isnan(self.to_engine):
            return 0.0
        return max(self.total - self.to_engine, 0.0)

    @property
    def arrival_delay(self) -> float:
        """What a simulation adds to each arrival: the way in (the whole overhead when unread)."""
        return self.total if math.isnan(self.to_engine) else self.to_engine

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "to_engine": None if math.isnan(self.to_engine) else self.to_engine,
            "from_engine": self.from_engine,
            "round_trip": self.round_trip,
            "how": self.how,
        }

    @classmethod
    def from_dict(cls, data: Any) -> RequestOverhead:
        if not isinstance(data, Mapping):
            raise ValueError(f"a request overhead must be an object, got {data!r:.60}")
        to_engine = data.get("to_engine")
        return cls(
            float(data["total"]),
            math.nan if to_engine is None else float(to_engine),
            float(data.get("round_trip", math.nan)),
            str(data.get("how", "")),
        )


@dataclasses.dataclass(frozen=True)
class Chunking:
    """How many slow iterations a ``prompt_len`` prompt amid ``rows`` live streams showed
    (median over the rounds) against the budget's count."""

    prompt_len: int
    rows: int
    expected: int
    seen: float

    @property
    def agrees(self) -> bool:
        return self.seen == self.expected

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "agrees": self.agrees}


def chunking_of(stalls: Sequence[StallSample]) -> list[Chunking]:
    groups: dict[tuple[int, int, int], list[int]] = {}
    for s in stalls:
        groups.setdefault((s.prompt_len, s.rows, s.expected), []).append(s.seen)
    return [Chunking(p, r, e, statistics.median(v)) for (p, r, e), v in sorted(groups.items())]
