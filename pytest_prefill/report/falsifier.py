"""The falsifier as a user sees it (the report layer over ``falsifier``): the claim stated
before any measurement, then the stall tables, the decode-per-KV table, warnings, the fused
figure on the engine, and the verdict against exactly the claim."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from tabulate import tabulate

from pytest_prefill.lab.falsifier import (
    CLAIM,
    DEFAULT_PROMPT_LEN,
    STREAM_CONTEXT,
    FalsifierResult,
    check_arguments,
    measure_falsifier,
)
from pytest_prefill.measure.timing import Measurement
from pytest_prefill.report.calibration import kv_table
from pytest_prefill.units import ms

Emit = Callable[[str], object]


def _gap_table(rows: Sequence[tuple[str, Measurement]], base: float) -> str:
    """Rows of (label, measurement) as median [min, max] and x ``base``."""
    body = [
        (
            name,
            ms(m.median) + ("!" if m.warning else ""),
            f"[{ms(m.minimum)}, {ms(m.maximum)}]",
            f"{m.median / base:.2f}x",
        )
        for name, m in rows
    ]
    return tabulate(
        body,
        headers=(
            "live stream's gap between two tokens",
            "median ms",
            "[min, max] ms",
            "x baseline",
        ),
        tablefmt="simple",
        disable_numparse=True,
        colalign=("left", "right", "right", "right"),
    )


def stall_table(
    baseline: Measurement, shared: Measurement, chunked: Measurement, *, prompt_len: int, chunk: int
) -> str:
    """The live stream's gap between two tokens: median [min, max] and x baseline."""
    rows = [
        ("BASELINE: decode step, nothing else running", baseline),
        (f"shared: behind a {prompt_len:,}-token prefill", shared),
        (f"chunked: behind one {chunk:,}-token chunk (unfused)*", chunked),
    ]
    return _gap_table(rows, baseline.median)


def stall_table_of(result: FalsifierResult) -> str:
    """:func:`stall_table` of a falsifier's result."""
    return stall_table(
        result.baseline,
        result.shared,
        result.chunked,
        prompt_len=result.prompt_len,
        chunk=result.chunk,
    )


def engine_stall_table(
    engine: dict[str, Measurement], *, prompt_len: int, chunk: int, unfused: Measurement
) -> str:
    """The engine's gaps (x its own baseline), with the unfused figure beside, labelled."""
    rows = [
        ("BASELINE: decode step alone (engine)", engine["baseline"]),
        (f"shared: behind a {prompt_len:,}-token prefill (engine)", engine["shared"]),
        (
            f"chunked: one {chunk:,}-token chunk FUSED with the decode step (engine)",
            engine["fused"],
        ),
        ("chunked, unfused (HF passes, from the table above; x engine baseline)", unfused),
    ]
    return _gap_table(rows, engine["baseline"].median)


def _engine_sections(result: FalsifierResult) -> list[str]:
    if result.engine is None:
        return []
    sections = [
        "Stall on the engine's packed pass: the chunk runs FUSED with the decode row in one "
        "iteration\n"
        + engine_stall_table(
            result.engine, prompt_len=result.prompt_len, chunk=result.chunk, unfused=result.chunked
        )
    ]
    if result.engine["fused"].median > result.chunked.median:
        # Two implementations: the bound holds for one model code, not across them.
        sections.append(
            "NOTE: the engine's fused iteration is slower here than the HF passes run one "
            "after the other, so the unfused figure is no upper bound on this device: the "
            "packed pass (attention per request in Python) is the slower implementation."
        )
    return sections


def falsifier_sections(result: FalsifierResult) -> list[str]:
    """Everything printed after the measurements, in order, ending with the verdict line."""
    sections = [] if result.calibration is None else [result.calibration.chunk_star_text()]
    context = result.prompt_len - result.chunk
    sections += [
        f"Stall: a live stream with {result.stream_context} cached tokens; a "
        f"{result.prompt_len:,}-token prompt arrives. Chunk {result.chunk:,} tokens "
        f"({result.chunk_source}).\n" + stall_table_of(result),
        f"* the chunk pass and the decode step run one after the other, not fused: an upper "
        f"bound on one fused iteration. It is the prompt's last chunk ({context:,} tokens "
        "already cached), so its gap is the worst.",
        "Decode step, batch 1, per cached-token count\n" + kv_table(list(result.kv_points)),
    ]
    gaps = (("baseline", result.baseline), ("shared", result.shared), ("chunked", result.chunked))
    unstable = [f"{name}: {m.warning}" for name, m in gaps if m.warning]
    if unstable:
        sections.append("WARNING: unstable measurements (! above): " + "; ".join(unstable))
    return [*sections, *_engine_sections(result), result.verdict_line]


def run_falsifier(loaded: Any, *, emit: Emit = print, **options: Any) -> FalsifierResult:
    """State the claim, measure (``falsifier.measure_falsifier``, given ``options``: its keyword
    arguments), then emit each table and the verdict. ``emit`` receives the claim before any
    measurement.

    Raises:
        ValueError: as ``measure_falsifier`` does.
        TypeError: for an option ``measure_falsifier`` does not take (before anything is said).
    """
    from pytest_prefill.measure.calibrate import effective_repeats

    inspect.signature(measure_falsifier).bind(loaded, **options)
    check_arguments(
        loaded,
        options.get("prompt_len", DEFAULT_PROMPT_LEN),
        options.get("chunk"),
        options.get("stream_context", STREAM_CONTEXT),
    )
    dry_run = options.get("dry_run", False)
    repeats, warmup = effective_repeats(options.get("repeats"), options.get("warmup"), dry_run)
    emit(f"Falsifier: {CLAIM}")
    emit(
        f"Model: {loaded.name} ({loaded.source}); device {loaded.device}, {loaded.dtype_name}; "
        f"{repeats} repeats after {warmup} warmup{' (dry run)' if dry_run else ''}"
    )
    result = measure_falsifier(loaded, **options)
    for section in falsifier_sections(result):
        emit(section)
    return result
