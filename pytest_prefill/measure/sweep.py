"""What a calibration times and how: the sweep of points (prompt lengths, chunks over cached
tokens, decode steps by cache length and by batch, fused passes), each point's time budget, and
the loops that time them with a runner. Nothing here prints (progress goes to a callable)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from pytest_prefill.measure.calibration_points import Point
from pytest_prefill.measure.timing import Measurement
from pytest_prefill.units import ms_spread

# Prompt lengths wide enough to show attention's curvature (on CUDA up to 16k where the model
# allows); chunks of 256 and 1,024 new tokens over 2k and 8k cached tokens (context 0 is the
# prefill sweep); fused passes of a chunk with decode rows (runners with ``time_fused``).
CPU_PROMPT_LENS = (32, 64, 128, 256, 512, 1024, 2048, 4096)
CUDA_PROMPT_LENS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_CHUNKS = ((256, 2048), (1024, 2048), (256, 8192), (1024, 8192))
DEFAULT_FUSED = tuple(
    (tokens, context, rows) for tokens in (32, 128, 512) for context in (0, 2048) for rows in (1, 8)
)
FUSED_ROW_CONTEXT = 512  # cached tokens of each decode row in a fused pass
DEFAULT_CACHE_LENS = (128, 1024, 4096, 16384)
DEFAULT_KV_ROWS = 1  # rows of the decode steps in the cache-length sweep
DEFAULT_BATCH_SIZES = (1, 2, 4, 8)
BATCH_CACHE_LEN = 128  # cached tokens per sequence in the batch sweep
# A prefill or chunk point predicted to take longer than this (all its calls) is skipped and
# the skip recorded: a 0.6B model on one CPU core would otherwise take hours at 16k tokens.
POINT_BUDGET = 60.0

Progress = Callable[[str], object]


@dataclasses.dataclass(frozen=True)
class Sweep:
    """What a calibration measures: prefill lengths, chunks (new tokens, context), decode cache
    lengths and batch sizes, fused passes (tokens, context, rows; each row ``row_context``
    cached), and the per-point time budget in seconds."""

    prompt_lens: tuple[int, ...]
    chunks: tuple[tuple[int, int], ...]
    cache_lens: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    batch_context: int
    fused: tuple[tuple[int, int, int], ...]
    row_context: int = FUSED_ROW_CONTEXT
    budget: float = POINT_BUDGET
    kv_rows: int = DEFAULT_KV_ROWS

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_lens": list(self.prompt_lens),
            "chunks": [list(c) for c in self.chunks],
            "cache_lens": list(self.cache_lens),
            "batch_sizes": list(self.batch_sizes),
            "batch_context": self.batch_context,
            "fused": [list(f) for f in self.fused],
            "row_context": self.row_context,
            "budget_seconds": self.budget,
            "kv_rows": self.kv_rows,
        }


def _lengths(field: str, values: Sequence[int], limit: int) -> tuple[int, ...]:
    checked = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{field} must be positive integers, got {v!r}")
        checked.append(min(v, limit))
    return tuple(sorted(set(checked)))


def _tuples(field: str, values: Sequence[Sequence[int]], size: int) -> tuple[Any, ...]:
    out = []
    for v in values:
        if len(v) != size or any(isinstance(n, bool) or not isinstance(n, int) or n < 0 for n in v):
            raise ValueError(f"{field} must hold {size}-tuples of integers >= 0, got {v!r}")
        if v[0] < 1:
            raise ValueError(f"{field}: a pass needs at least one new token, got {v!r}")
        out.append(tuple(v))
    return tuple(out)


def plan_sweep(
    loaded: Any,
    *,
    prompt_lens: Sequence[int] | None = None,
    chunks: Sequence[Sequence[int]] | None = None,
    cache_lens: Sequence[int] | None = None,
    batch_sizes: Sequence[int] | None = None,
    batch_context: int | None = None,
    fused: Sequence[Sequence[int]] | None = None,
    budget: float | None = None,
    kv_rows: int | None = None,
) -> Sweep:
    """The sweep for ``loaded``: the defaults for its device where an argument is None, every
    length within the model's context (a pass that would not fit is dropped).

    Raises:
        ValueError: for fewer than 4 distinct prompt lengths, bad lengths or tuples, or a
            budget that is not a positive number.
    """
    on_cuda = getattr(loaded.device, "type", str(loaded.device)).startswith("cuda")
    limit = loaded.max_context - 1  # room for the token a decode step appends
    default_prompts = CUDA_PROMPT_LENS if on_cuda else CPU_PROMPT_LENS
    prompt_lens = default_prompts if prompt_lens is None else prompt_lens
    prompts = _lengths("prompt_lens", prompt_lens, loaded.max_context)
    if len(prompts) < 4:
        raise ValueError(
            f"prompt_lens must hold 4 or more distinct lengths within the model's "
            f"context ({loaded.max_context}), got {list(prompt_lens)!r}"
        )
    chunk_list = _tuples("chunks", DEFAULT_CHUNKS if chunks is None else chunks, 2)
    fused_list = _tuples("fused", DEFAULT_FUSED if fused is None else fused, 3)
    caches = _lengths("cache_lens", DEFAULT_CACHE_LENS if cache_lens is None else cache_lens, limit)
    if not caches:
        raise ValueError("cache_lens must hold at least one length")
    batches = _lengths(
        "batch_sizes", DEFAULT_BATCH_SIZES if batch_sizes is None else batch_sizes, 2**31
    )
    context = _lengths(
        "batch_context", [BATCH_CACHE_LEN if batch_context is None else batch_context], limit
    )[0]
    budget = POINT_BUDGET if budget is None else budget
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
        raise ValueError(f"budget must be a number of seconds > 0, got {budget!r}")
    rows = DEFAULT_KV_ROWS if kv_rows is None else kv_rows
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"kv_rows must be an integer >= 1, got {rows!r}")
    return Sweep(
        prompts,
        tuple(c for c in chunk_list if c[0] + c[1] <= limit),
        caches,
        batches,
        context,
        tuple(f for f in fused_list if f[0] + f[1] <= limit and f[2] >= 1),
        min(FUSED_ROW_CONTEXT, limit),
        float(budget),
        rows,
    )


class Budget:
    """Predicts a pass's time from the prefill passes measured so far, to skip the ones that
    would exceed the per-point budget. Deliberately rough and on the high side: a doubling is
    taken to cost 3x (between linear and quadratic)."""

    def __init__(self, seconds: float, calls: int) -> None:
        self.seconds, self.calls = seconds, calls
        self.passes: list[tuple[int, float]] = []

    def record(self, tokens: int, seconds: float) -> None:
        self.passes.append((tokens, seconds))

    def predict(self, tokens: int, context: int = 0) -> float:
        """Seconds one pass of ``tokens`` over ``context`` cached tokens may take (0 when
        nothing has been measured yet)."""
        if not self.passes:
            return 0.0
        known, seconds = max(self.passes)
        whole = tokens + context
        ratio = whole / known
        estimate = seconds * (ratio * (1 + ratio) / 2 if ratio > 1 else ratio)
        return estimate * (tokens / whole) * (2 if context else 1)

    def over(self, tokens: int, context: int = 0) -> str:
        """Why this point is skipped ('' when it fits the budget)."""
        expected = self.predict(tokens, context) * self.calls
        if expected <= self.seconds:
            return ""
        what = f"{tokens:,} tokens" + (f" over {context:,}" if context else "")
        return (
            f"{what}: skipped, about {expected:,.0f} s for {self.calls} calls exceeds the "
            f"{self.seconds:g} s budget per point (--point-budget)"
        )


def say(progress: Progress | None, text: str) -> None:
    """``text`` to ``progress`` (when there is one and the text is not empty)."""
    if progress is not None and text:
        progress(text)


def _summary(m: Measurement) -> str:
    return ms_spread(m.median, m.minimum, m.maximum)


OUT_OF_MEMORY_ADVICE = (
    "try shorter prompts or fewer rows (the sweep's lengths), a smaller --prefill-dtype or "
    "model, or a device with more free memory"
)


def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is the device (or host allocator) running out of memory."""
    text = str(err)
    return type(err).__name__ == "OutOfMemoryError" or (
        isinstance(err, RuntimeError)
        and ("out of memory" in text or "can't allocate memory" in text)
    )


def time_or_skip(
    what: str, call: Callable[[], Measurement], skipped: list[str], progress: Progress | None
) -> Measurement | None:
    """``call()``; when it runs out of memory, None, with ``what`` failed and what to try said
    and kept in ``skipped`` (the device's cache is emptied so that the next point can run)."""
    try:
        return call()
    except Exception as err:
        if not out_of_memory(err):
            raise
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        reason = f"{what}: out of memory ({first[:160]}); {OUT_OF_MEMORY_ADVICE}"
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        say(progress, reason)
        skipped.append(reason)
        return None


@dataclasses.dataclass
class PassSweep:
    """Times a sweep's passes (prefill, chunk, fused) with one runner, one timing and one
    ``budget``: a pass the budget predicts too slow is skipped, said (``progress``) and kept in
    ``skipped`` with its reason."""

    runner: Any
    repeats: int
    warmup: int
    progress: Progress | None = None
    budget: Budget | None = None
    skipped: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.budget = self.budget or Budget(math.inf, self.repeats + self.warmup)

    @property
    def timing(self) -> dict[str, int]:
        return {"repeats": self.repeats, "warmup": self.warmup}

    def _skips(self, what: str, tokens: int, context: int = 0) -> bool:
        assert self.budget is not None
        reason = self.budget.over(tokens, context)
        if reason:
            say(self.progress, what + reason)
            self.skipped.append(what + reason)
        return bool(reason)

    def _time(self, what: str, method: Callable[..., Measurement], *args: Any) -> Any:
        return time_or_skip(what, lambda: method(*args, **self.timing), self.skipped, self.progress)

    def prefill(self, prompt_lens: Sequence[int]) -> list[Point]:
        """Prefill passes into a fresh cache at each prompt length, shortest first."""
        assert self.budget is not None
        points: list[Point] = []
        for tokens in sorted(prompt_lens):
            if self._skips("prefill ", tokens):
                continue
            m = self._time(f"prefill {tokens:,} tokens", self.runner.time_prefill, tokens)
            if m is None:
                break  # a longer prompt needs more memory still
            self.budget.record(tokens, m.median)
            say(self.progress, f"prefill {tokens:>6} tokens: {_summary(m)}")
            points.append(Point("prefill", tokens, m))
            if len(points) == 2:
                later = [t for t in prompt_lens if t > tokens]
                say(self.progress, _time_left(points, later, self.budget))
        return points

    def chunks(self, chunks: Sequence[tuple[int, int]]) -> list[Point]:
        """Chunk passes: ``tokens`` new tokens over ``context`` cached tokens of one prompt."""
        points = []
        for tokens, context in chunks:
            if self._skips("chunk ", tokens, context):
                continue
            m = self._time(
                f"chunk {tokens:,} over {context:,}", self.runner.time_chunk, tokens, context
            )
            if m is None:
                continue
            say(self.progress, f"chunk {tokens:>6} tokens over {context:,} cached: {_summary(m)}")
            points.append(Point("chunk", tokens, m, context=context))
        return points

    def fused(self, grid: Sequence[tuple[int, int, int]], row_context: int) -> list[Point]:
        """Fused passes (``runner.time_fused``): a chunk of ``tokens`` over ``context`` cached
        tokens and ``rows`` decode rows of ``row_context`` cached tokens each, in one pass."""
        points = []
        for tokens, context, rows in grid:
            if self._skips(f"fused, {rows} decode row(s): ", tokens, context):
                continue
            rows_context = [row_context] * rows
            m = self._time(
                f"fused {tokens:,} over {context:,} + {rows} rows",
                self.runner.time_fused,
                tokens,
                context,
                rows_context,
            )
            if m is None:
                continue
            say(
                self.progress,
                f"fused {tokens} tokens over {context:,} + {rows} rows: {_summary(m)}",
            )
            points.append(
                Point("fused", tokens, m, context=context, rows=rows, row_context=row_context)
            )
        return points


def _time_left(points: Sequence[Point], lengths: Sequence[int], budget: Budget) -> str:
    """How long the lengths still to time will take, from a line through the two shortest
    timed (the budget's own guard is deliberately pessimistic: it said 107 s for a sweep that
    took 37)."""
    if not lengths:
        return ""
    (n0, p0), (n1, p1) = ((p.x, p.measurement.median) for p in points[:2])
    slope = max(0.0, (p1 - p0) / (n1 - n0))
    rest = sum(min(max(p0 + slope * (n - n0), 0.0) * budget.calls, budget.seconds) for n in lengths)
    return (
        f"the prefill sweep will take about {rest:,.0f} s more (a line through the two "
        "shortest prompts; attention's quadratic work can add to it)"
    )


def _timed_decodes(
    runner: Any,
    steps: Iterable[tuple[int, str, list[int]]],
    *,
    repeats: int,
    warmup: int,
    progress: Progress | None,
    skipped: list[str] | None,
) -> Iterator[tuple[int, Measurement]]:
    """Each step ``(x, what, contexts)``, one decode step over ``contexts`` cached tokens a row,
    timed: ``(x, its measurement)``; one that runs out of memory is skipped, its reason added to
    ``skipped``."""
    skipped = [] if skipped is None else skipped
    for x, what, contexts in steps:
        call = functools.partial(runner.time_decode, contexts, repeats=repeats, warmup=warmup)
        m = time_or_skip(what, call, skipped, progress)
        if m is not None:
            yield x, m


def measure_decode_kv(
    runner: Any,
    cache_lens: Sequence[int],
    *,
    repeats: int,
    warmup: int,
    progress: Progress | None = None,
    rows: int = 1,
    skipped: list[str] | None = None,
) -> list[Point]:
    """Decode steps of ``rows`` rows (batch 1 by default), each over a cache of each length
    (one that runs out of memory is skipped, its reason added to ``skipped``)."""
    steps = (
        (cached, f"decode, {rows} x {cached:,} cached", [cached] * rows) for cached in cache_lens
    )
    points = []
    for cached, m in _timed_decodes(
        runner, steps, repeats=repeats, warmup=warmup, progress=progress, skipped=skipped
    ):
        point = Point("decode_kv", cached, m, rows=rows if rows > 1 else 0)
        say(progress, f"{point.label()}: {_summary(m)}")
        points.append(point)
    return points


def measure_decode_batch(
    runner: Any,
    batch_sizes: Sequence[int],
    *,
    context: int,
    repeats: int,
    warmup: int,
    progress: Progress | None = None,
    skipped: list[str] | None = None,
) -> list[Point]:
    """Decode steps of each batch size, every sequence holding ``context`` cached tokens (one
    that runs out of memory is skipped, its reason added to ``skipped``)."""
    steps = (
        (batch, f"decode, batch {batch} x {context:,} cached", [context] * batch)
        for batch in batch_sizes
    )
    points = []
    for batch, m in _timed_decodes(
        runner, steps, repeats=repeats, warmup=warmup, progress=progress, skipped=skipped
    ):
        say(progress, f"decode, batch {batch:>3} x {context} cached: {_summary(m)}")
        points.append(Point("decode_batch", batch, m, context=context))
    return points


def measure_sweep(
    runner: Any, sweep: Sweep, *, repeats: int, warmup: int, progress: Progress | None = None
) -> tuple[list[Point], list[str]]:
    """Every point of ``sweep`` (fused passes only when the runner has ``time_fused``), and
    the points skipped with their reasons."""
    timing: dict[str, Any] = {"repeats": repeats, "warmup": warmup, "progress": progress}
    passes = PassSweep(runner, budget=Budget(sweep.budget, repeats + warmup), **timing)
    points = passes.prefill(sweep.prompt_lens) + passes.chunks(sweep.chunks)
    skipped = passes.skipped
    points += measure_decode_kv(
        runner, sweep.cache_lens, rows=sweep.kv_rows, skipped=skipped, **timing
    )
    if sweep.batch_sizes:
        points += measure_decode_batch(
            runner, sweep.batch_sizes, context=sweep.batch_context, skipped=skipped, **timing
        )
    if sweep.fused and hasattr(runner, "time_fused"):
        points += passes.fused(sweep.fused, sweep.row_context)
    elif sweep.fused:
        passes.skipped.append(f"fused passes: {getattr(runner, 'name', 'this runner')} cannot fuse")
    return points, passes.skipped
