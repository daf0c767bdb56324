"""What the simulator says about chunking, computed (rendering lives in
:mod:`pytest_prefill.report.sweep` and :mod:`pytest_prefill.report.timeline`): the chunk sweep
and the policy comparison, and the lab scenario under the three designs. Standard library
only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterable, Sequence

from pytest_prefill.plan.advice import choose_chunk
from pytest_prefill.plan.engine_commands import refusal
from pytest_prefill.plan.workloads import LAB_SCENARIO, LabScenario
from pytest_prefill.sim import (
    LAB,
    POLICIES,
    CostModel,
    EngineProfile,
    Request,
    Summary,
    Trace,
    check_int,
    resolve_engine,
    simulate,
)


@dataclasses.dataclass(frozen=True, slots=True)
class SweepRow:
    """One policy (and chunk) on one load; ratios are against the shared worker's row."""

    policy: str
    chunk: int | None
    summary: Summary
    ttft_cost: float  # TTFT p99 / shared TTFT p99 (> 1: slower first token)
    stall_gain: float  # shared max stall / this max stall (> 1: shorter worst stall)

    @property
    def label(self) -> str:
        return f"chunked {self.chunk}" if self.policy == "chunked" else self.policy


def engine_header(profile: EngineProfile) -> str:
    """The line a simulated report's header gives its engine profile: ``Engine: vllm: first
    token from the prefill; 2048 tokens an iteration; at most 256 requests; KV paged (16-token
    blocks), prefix cache on (512-token blocks)``."""
    if profile.kv == "paged":
        kv = f"KV paged ({profile.kv_block_tokens}-token blocks)"
    else:
        kv = "KV reserved at admission"
    if profile.prefix_caching:
        kv += f", prefix cache on ({profile.prefix_block_tokens}-token blocks)"
    elif profile.kv == "paged":
        kv += ", prefix cache off"
    return f"Engine: {profile.label().removeprefix('engine ')}; {kv}"


def default_chunks(cost: CostModel, prompt_len: int) -> list[int]:
    """C* (when positive), the chunk every report runs (:func:`advice.choose_chunk`), powers
    of two from 64 below the prompt, and the whole prompt."""
    check_int("prompt_len", prompt_len)
    chunks = {prompt_len, choose_chunk(cost, prompt_len).chunk}
    star = cost.chunk_star()
    if 1 <= star < prompt_len:
        chunks.add(int(round(star)))
    size = 64
    while size < prompt_len:
        chunks.add(size)
        size *= 2
    return sorted(chunks)


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def chunk_sweep(
    cost: CostModel,
    load: Sequence[Request],
    chunks: Iterable[int],
    *,
    prefill_workers: int = 1,
    decode_workers: int = 1,
    engine: str | EngineProfile = LAB,
) -> list[SweepRow]:
    """Shared, coscheduled, chunked at each of ``chunks``, and disaggregated, on ``load``,
    under the ``engine`` profile's rules (default the lab's loop); a policy the simulator
    refuses under ``engine`` (:func:`~pytest_prefill.plan.engine_commands.refusal`) is left
    out."""
    chunks = sorted({check_int("chunk", c) for c in chunks})
    if not chunks:
        raise ValueError("chunks must name at least one chunk size")
    runs: list[tuple[str, int | None]] = [("shared", None), ("coscheduled", None)]
    runs += [("chunked", c) for c in chunks]
    runs.append(("disaggregated", None))
    assert {p for p, _ in runs} == set(POLICIES)
    runs = [(p, c) for p, c in runs if refusal(p, resolve_engine(engine), cost, chunk=c) is None]
    summaries = [
        (
            policy,
            chunk,
            simulate(
                policy,
                load,
                cost,
                chunk=chunk,
                prefill_workers=prefill_workers,
                decode_workers=decode_workers,
                engine=engine,
            ).summary(),
        )
        for policy, chunk in runs
    ]
    if not summaries:
        raise ValueError("no policy can run under this cost model (each one refused it)")
    base = summaries[0][2]
    return [
        SweepRow(
            policy, chunk, s, _ratio(s.ttft_p99, base.ttft_p99), _ratio(base.max_stall, s.max_stall)
        )
        for policy, chunk, s in summaries
    ]


@dataclasses.dataclass(frozen=True)
class LabTimeline:
    """The lab scenario simulated under shared, chunked and disaggregated serving, with the
    chunk the one rule picks (:func:`advice.choose_chunk`) and a title that names the cost
    model. What both the archive's timeline and ``prefill-bench timeline`` draw."""

    traces: tuple[Trace, ...]
    chunk: int
    how: str  # why the chunk is what it is
    title: str


def lab_timeline(
    cost: CostModel,
    origin: str,
    *,
    scenario: LabScenario = LAB_SCENARIO,
    chunk: int | None = None,
    refused: Collection[str] = (),
    engine: str | EngineProfile = LAB,
) -> LabTimeline:
    """The lab ``scenario`` (its prompt's id is "long") under the three designs and the
    ``engine`` profile's rules (default the lab's loop; the title names it); ``chunk`` None
    means the one chunk rule."""
    load = scenario.requests()
    streams, prompt_len, arrival = scenario.streams, scenario.prompt_len, scenario.arrival
    if chunk is None:
        chosen = choose_chunk(cost, prompt_len, refused)
        chunk, how = chosen.chunk, chosen.how
    else:
        how = "given"
    traces = (
        simulate("shared", load, cost, engine=engine),
        simulate("chunked", load, cost, chunk=chunk, engine=engine),
        simulate("disaggregated", load, cost, engine=engine),
    )
    title = (
        f"{streams} live stream{'s' * (streams != 1)} decoding; a "
        f'{prompt_len:,}-token prompt ("long") arrives at {arrival * 1e3:,.0f} ms. '
        f"Chunk {chunk:,} ({how}). Simulated from a cost model, not measured.\n"
        f"Cost model: {origin}\n"
        f"{engine_header(traces[0].engine)}"
    )
    return LabTimeline(traces, chunk, how, title)
