"""The falsifier's measurement and verdict: what a live stream's worst token gap is when a long
prompt arrives, under a shared worker and under chunked prefill (the HF forward unfused, and the
engine's packed pass fused), judged HOLDS or FAILS against exactly the claim. Nothing here
prints or renders: ``falsifier_report`` states the claim first, then prints the tables."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from typing import Any

from pytest_prefill.measure.timing import Measurement
from pytest_prefill.plan.advice import FALLBACK_CHUNK as FALLBACK_CHUNK
from pytest_prefill.plan.advice import Trust, choose_chunk, star_text
from pytest_prefill.plan.advice import chunk_from_cost as chunk_from_cost
from pytest_prefill.sim import CostModel, check_int
from pytest_prefill.units import ms

CLAIM = (
    "If chunked prefill's worst decode gap is not below the shared worker's, chunking does not "
    "help on this hardware and the central claim is wrong here."
)
KIND = "pytest-prefill/falsifier"
SCHEMA_VERSION = 1
VERDICTS = ("HOLDS", "FAILS")
DEFAULT_PROMPT_LEN = 2048
STREAM_CONTEXT = 128  # cached tokens of the live stream (the lab scenario's stream prompt)

Progress = Callable[[str], object]


@dataclasses.dataclass(frozen=True)
class FalsifierResult:
    """What the falsifier measured and its verdict.

    ``baseline``, ``shared`` and ``chunked`` are the live stream's gap between two tokens:
    a decode step alone, behind a full prefill, and behind the prompt's last chunk (unfused).
    """

    claim: str
    verdict: str
    verdict_line: str
    prompt_len: int
    chunk: int
    chunk_source: str
    stream_context: int
    baseline: Measurement
    shared: Measurement
    chunked: Measurement
    provenance: dict[str, Any]
    calibration: Any = None  # a calibrate.Calibration when the run calibrated for C*
    kv_points: tuple[Any, ...] = ()
    # The same gaps on the engine's packed pass, the chunk FUSED with the decode row
    # (``baseline``, ``shared``, ``fused``); None when the packed pass does not support the model.
    engine: dict[str, Measurement] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "schema_version": SCHEMA_VERSION,
            "claim": self.claim,
            "verdict": self.verdict,
            "verdict_line": self.verdict_line,
            "prompt_len": self.prompt_len,
            "chunk": self.chunk,
            "chunk_source": self.chunk_source,
            "stream_context": self.stream_context,
            "gaps": {
                "baseline": self.baseline.to_dict(),
                "shared": self.shared.to_dict(),
                "chunked": self.chunked.to_dict(),
            },
            "decode_kv": [p.to_dict() for p in self.kv_points],
            "engine_gaps": (
                {k: m.to_dict() for k, m in self.engine.items()} if self.engine else None
            ),
            "provenance": dict(self.provenance),
            **({"calibration": self.calibration.to_dict()} if self.calibration else {}),
        }


def verdict(shared: Measurement, chunked: Measurement) -> tuple[str, str]:
    """HOLDS when chunked's gap is below shared's beyond their spread: median below, and the
    interquartile ranges apart (chunked's q3 < shared's q1). Anything else FAILS the claim."""
    numbers = (
        f"chunked {ms(chunked.median)} ms [IQR {ms(chunked.q1)}-{ms(chunked.q3)}] vs "
        f"shared {ms(shared.median)} ms [IQR {ms(shared.q1)}-{ms(shared.q3)}]"
    )
    if chunked.median < shared.median and chunked.q3 < shared.q1:
        return "HOLDS", (
            f"HOLDS: chunked prefill's worst decode gap is below the shared worker's ({numbers})."
        )
    return "FAILS", (
        f"FAILS: chunked prefill's worst decode gap is not clearly below the shared "
        f"worker's ({numbers}): chunking does not help on this hardware and the "
        "central claim is wrong here."
    )


def chunk_for(
    cost: CostModel,
    prompt_len: int,
    source: str,
    refused: Collection[str] = (),
    trust: Trust | None = None,
) -> tuple[int, str]:
    """The chunk to test (the one rule, :func:`advice.choose_chunk`) and a phrase saying
    where it came from: "C* of ``source``" only when that C* is determined -- the per-token
    cost not refused, C* >= 1, and the fit's own trust figures without doubts."""
    star = cost.chunk_star()
    chosen = choose_chunk(cost, prompt_len, refused)
    if "prefill_per_token" in refused:
        return chosen.chunk, (
            f"fallback: C* not determined ({source}: prefill_per_token was refused)"
        )
    if not star >= 1:
        return chosen.chunk, f"fallback: {source} is unusable, C* = {star_text(star)}"
    doubts = trust.doubts() if trust is not None else ()
    if doubts:
        return chosen.chunk, (
            f"the fit's C*, not determined: {source} is not trusted ({'; '.join(doubts)})"
        )
    return chosen.chunk, f"C* of {source}"


def check_arguments(loaded: Any, prompt_len: Any, chunk: Any, stream_context: Any) -> None:
    """ValueError naming the field for a non-positive prompt_len, chunk or stream context, or a
    prompt longer than the model's context."""
    check_int("prompt_len", prompt_len)
    check_int("stream_context", stream_context)
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1):
        raise ValueError(f"chunk must be an integer >= 1 (or None for C*), got {chunk!r}")
    if prompt_len > loaded.max_context:
        raise ValueError(
            f"prompt_len {prompt_len} exceeds the model's context ({loaded.max_context})"
        )


@dataclasses.dataclass(frozen=True)
class GivenCost:
    """A cost model the caller gives the falsifier, with what its calibration said of it:
    the constants it refused, its trust figures, and a phrase naming it."""

    cost: CostModel
    refused: tuple[str, ...] = ()
    trust: Trust | None = None
    source: str = "the given cost model"


def pick_chunk(
    loaded: Any,
    prompt_len: int,
    chunk: int | None,
    given: GivenCost | None,
    timing: dict[str, Any],
) -> tuple[int, str, Any]:
    """The chunk to test, where it came from, and the quick calibration made for it (None when
    ``chunk`` or a cost was given). The quick calibration times the engine's packed pass, as
    every other calibration does."""
    from pytest_prefill.lab.packed import calibration_runner
    from pytest_prefill.measure import calibrate as cal

    if chunk is not None:
        return min(chunk, prompt_len), "given", None
    if given is not None:
        picked, source = chunk_for(given.cost, prompt_len, given.source, given.refused, given.trust)
        return min(picked, prompt_len), source, None
    runner = calibration_runner(loaded, seed=timing.get("seed", 0))
    calibration = cal.calibrate(
        loaded, batch_sizes=(), chunks=(), fused=(), runner=runner, **timing
    )
    picked, source = chunk_for(
        calibration.cost,
        prompt_len,
        "a quick calibration made now",
        calibration.refused(),
        calibration.trust(),
    )
    return min(picked, prompt_len), source, calibration


@dataclasses.dataclass(frozen=True)
class GapSetup:
    """What every gap measurement shares: the arriving prompt, the chunk tested, the live
    stream's cached tokens, and the timing (repeats, warmup, the runner's seed)."""

    prompt_len: int
    chunk: int
    stream_context: int
    repeats: int
    warmup: int
    seed: int

    @property
    def timing(self) -> dict[str, int]:
        return {"repeats": self.repeats, "warmup": self.warmup}


def hf_gaps(
    loaded: Any, setup: GapSetup, progress: Progress | None = None
) -> tuple[Measurement, Measurement, Measurement]:
    """The live stream's gap on the HF forward: its decode step alone, behind a whole prefill,
    and behind the prompt's last chunk (run one after the other, unfused)."""
    from pytest_prefill.measure.runner import ModelRunner, rewind

    prompt_len, chunk, timing = setup.prompt_len, setup.chunk, setup.timing
    runner = ModelRunner(loaded, seed=setup.seed)
    stream = runner.decode_batch([setup.stream_context])
    stream_ids, prompt_ids, chunk_ids = (
        runner.tokens(1),
        runner.tokens(prompt_len),
        runner.tokens(chunk),
    )
    context = prompt_len - chunk  # the prompt's last chunk: the longest context, the worst gap
    prompt_cache = runner.synthetic_cache(context) if context else None

    def say(text: str) -> None:
        if progress is not None:
            progress(text)

    def chunked_gap() -> None:
        if prompt_cache is None:
            runner.prefill(chunk_ids)
        else:
            runner.chunk(prompt_cache, chunk_ids)
        runner.decode(stream, stream_ids)

    def reset() -> None:
        stream.rewind()
        if prompt_cache is not None:
            rewind(prompt_cache, context)

    baseline = runner.measure(
        lambda: runner.decode(stream, stream_ids), setup=stream.rewind, **timing
    )
    say(f"baseline decode step: {ms(baseline.median)} ms")
    shared = runner.measure(
        lambda: (runner.prefill(prompt_ids), runner.decode(stream, stream_ids)),
        setup=stream.rewind,
        **timing,
    )
    say(f"decode step behind a {prompt_len}-token prefill: {ms(shared.median)} ms")
    chunked = runner.measure(chunked_gap, setup=reset, **timing)
    say(f"decode step behind one {chunk}-token chunk: {ms(chunked.median)} ms")
    return baseline, shared, chunked


def measure_falsifier(
    loaded: Any,
    *,
    prompt_len: int = DEFAULT_PROMPT_LEN,
    chunk: int | None = None,
    cost: CostModel | GivenCost | None = None,
    repeats: int | None = None,
    warmup: int | None = None,
    dry_run: bool = False,
    progress: Progress | None = None,
    stream_context: int = STREAM_CONTEXT,
    seed: int = 0,
) -> FalsifierResult:
    """Measure the gaps and judge the claim (``falsifier_report.run_falsifier`` states the claim
    first and prints the tables; call that to run the falsifier as a user sees it).

    Args:
        loaded: a ``models.LoadedModel``.
        prompt_len: the arriving prompt (never shortened, not even by ``dry_run``).
        chunk: the chunk to test; default C* of ``cost``, or of a quick calibration on the
            packed pass (prefill and decode-per-KV sweeps, no batch, chunk or fused sweep)
            made here.
        cost: a cost model, or a :class:`GivenCost` carrying its calibration's refusals and
            trust (the chunk is then labelled C* only when that C* is determined).
        repeats, warmup, dry_run: as for ``calibrate.calibrate``.
        progress: receives one line per finished measurement (for stderr).
        stream_context: cached tokens of the live stream.

    Raises:
        ValueError: for a non-positive prompt_len or chunk, or a prompt longer than the model's
            context.
    """
    from pytest_prefill.measure import calibrate as cal

    check_arguments(loaded, prompt_len, chunk, stream_context)
    repeats, warmup = cal.effective_repeats(repeats, warmup, dry_run)
    timing: dict[str, Any] = {
        "repeats": repeats,
        "warmup": warmup,
        "dry_run": dry_run,
        "seed": seed,
    }
    given = GivenCost(cost) if isinstance(cost, CostModel) else cost
    chosen, source, calibration = pick_chunk(
        loaded, prompt_len, chunk, given, {**timing, "progress": progress}
    )
    setup = GapSetup(prompt_len, chosen, stream_context, repeats, warmup, seed)
    baseline, shared, chunked = hf_gaps(loaded, setup, progress)
    kv_points = _kv_points(loaded, calibration, setup, progress)
    engine = engine_gaps(loaded, setup, progress)
    outcome, line = (
        verdict(shared, chunked) if engine is None else verdict(engine["shared"], engine["fused"])
    )
    if engine is not None:
        line += " [Judged on the engine's figures: the chunk fused with the decode step.]"
    info = cal.provenance(
        loaded, **timing, prompt_len=prompt_len, chunk=chosen, stream_context=stream_context
    )
    return FalsifierResult(
        claim=CLAIM,
        verdict=outcome,
        verdict_line=line,
        prompt_len=prompt_len,
        chunk=chosen,
        chunk_source=source,
        stream_context=stream_context,
        baseline=baseline,
        shared=shared,
        chunked=chunked,
        provenance=info,
        calibration=calibration,
        kv_points=kv_points,
        engine=engine,
    )


def _kv_points(
    loaded: Any, calibration: Any, setup: GapSetup, progress: Progress | None
) -> tuple[Any, ...]:
    """The decode step per cached-token count: the quick calibration's, else measured now."""
    from pytest_prefill.measure import sweep as sweeps
    from pytest_prefill.measure.runner import ModelRunner

    if calibration is not None:
        return tuple(calibration.points("decode_kv"))
    caches = tuple(sorted({min(n, loaded.max_context - 1) for n in sweeps.DEFAULT_CACHE_LENS}))
    runner = ModelRunner(loaded, seed=setup.seed)
    return tuple(
        sweeps.measure_decode_kv(
            runner, caches, repeats=setup.repeats, warmup=setup.warmup, progress=progress
        )
    )


def engine_gaps(
    loaded: Any, setup: GapSetup, progress: Progress | None = None
) -> dict[str, Measurement] | None:
    """Baseline, shared and fused-chunk gaps on the packed pass; None if it cannot run it."""
    from pytest_prefill.lab.packed import PackedRunner

    try:
        runner = PackedRunner(loaded.model, seed=setup.seed)
    except ValueError as err:  # an architecture the packed pass does not implement
        if progress is not None:
            progress(f"fused figure not measured: {err}")
        return None
    gaps = runner.time_gaps(setup.prompt_len, setup.chunk, setup.stream_context, **setup.timing)
    if progress is not None:
        progress(
            f"engine: decode step fused with one {setup.chunk}-token chunk: "
            f"{ms(gaps['fused'].median)} ms"
        )
    return gaps
