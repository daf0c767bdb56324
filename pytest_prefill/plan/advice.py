"""One home for the two decisions every report makes from a cost model: which chunk to run
chunked prefill with, and what to recommend (with the one wording that calibrate, compare, the
plugin's summary and the archive all print). With cost model v2 (DESIGN.md) the chunk that
rides free falls as a prompt proceeds, so both use C* at the end of a typical prompt, and the
reports give C* at several contexts. Standard library only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Sequence

from pytest_prefill._io import json_number
from pytest_prefill.sim import CostModel, check_int
from pytest_prefill.units import ms, us

# The recommendation (see ``recommend``): with overhead fraction f = pass overhead / decode
# step, prefer disaggregation when C* <= 0 (f >= 1), when f >= DISAGGREGATE_OVERHEAD_FRACTION
# (chunking has little room: every chunk pays most of a decode step in overhead), or when C* is
# below MIN_USEFUL_CHUNK tokens; otherwise prefer chunked prefill with a chunk of about C*.
DISAGGREGATE_OVERHEAD_FRACTION = 0.5
MIN_USEFUL_CHUNK = 16
# The chunk run or drawn when C* gives none (C* < 1, or the per-token cost was refused).
FALLBACK_CHUNK = MIN_USEFUL_CHUNK
# The chunk to set is C* at the end of a typical prompt (its last chunk attends to all of it,
# the costliest), so that no chunk of a typical prompt lengthens a decode step. For a cost
# model without the pair and KV-read terms this is the lab's C* exactly.
TYPICAL_PROMPT = 2048
# Where reports give C* (within the model's context).
STAR_CONTEXTS = (0, 2048, 8192, 32768)


@dataclasses.dataclass(frozen=True, slots=True)
class Recommendation:
    """What to do on this machine: ``policy`` is ``chunked``, ``disaggregated`` or
    ``undetermined`` (the per-token prefill cost was refused); ``chunk`` the suggested chunk
    (C* rounded) when chunking; ``line`` the sentence to print."""

    policy: str
    chunk: int | None
    chunk_star: float
    overhead_fraction: float
    line: str
    warnings: tuple[str, ...] = ()

    def __str__(self) -> str:
        return "\n".join((self.line, *self.warnings))

    def to_dict(self) -> dict[str, object]:
        """JSON-able (C* infinite becomes "inf" / "-inf")."""
        return {
            "policy": self.policy,
            "chunk": self.chunk,
            "chunk_star": json_number(self.chunk_star),
            "overhead_fraction": json_number(self.overhead_fraction),
            "line": self.line,
            "warnings": list(self.warnings),
        }


def star_contexts(max_context: int | None = None) -> tuple[int, ...]:
    """The contexts C* is reported at: ``STAR_CONTEXTS`` within the model's context."""
    if max_context is None:
        return STAR_CONTEXTS
    return tuple(c for c in STAR_CONTEXTS if c < max_context) or (0,)


def stars_by_context(cost: CostModel, contexts: Sequence[int] = STAR_CONTEXTS) -> dict[int, float]:
    """C* at each context (tokens of the prompt already cached), from ``cost``."""
    return {c: cost.chunk_star(context=c) for c in contexts}


def typical_star(cost: CostModel) -> float:
    """C* at the end of a typical prompt (``TYPICAL_PROMPT`` tokens of context)."""
    return cost.chunk_star(context=TYPICAL_PROMPT)


def _warnings(cost: CostModel, contexts: Sequence[int]) -> tuple[str, ...]:
    out = []
    longest = max(contexts)
    star = cost.chunk_star(context=longest)
    if longest > 0 and math.isfinite(star) and star < MIN_USEFUL_CHUNK:
        out.append(
            f"WARNING: at {longest:,} tokens of context only {star_text(max(star, 0.0))} prompt "
            f"tokens ride free (under {MIN_USEFUL_CHUNK}): long prompts stall the streams under "
            "chunking, and for them DISAGGREGATION wins."
        )
    if cost.fusion_penalty > 0:
        out.append(
            f"fusion_penalty {cost.fusion_penalty:.2f}: no chunk rides entirely free; a chunk "
            f"of C* still lengthens its decode step by about {cost.fusion_penalty:.0%}."
        )
    return tuple(out)


def recommend(
    cost: CostModel, refused: Collection[str] = (), contexts: Sequence[int] = STAR_CONTEXTS
) -> Recommendation:
    """The recommendation for ``cost`` (thresholds: ``DISAGGREGATE_OVERHEAD_FRACTION``,
    ``MIN_USEFUL_CHUNK``, ``TYPICAL_PROMPT``). ``refused`` names the constants a calibration
    refused: without a per-token (or per-pair) prefill cost C* means nothing, and the policy is
    ``undetermined``. ``contexts``: where C* is reported; a plain warning when the chunk that
    rides free at the longest of them falls below usefulness."""
    star = cost.chunk_star()
    typical = typical_star(cost)
    fraction = (
        cost.prefill_pass_overhead / cost.decode_step_base
        if cost.decode_step_base > 0
        else math.inf
    )

    def advice(policy: str, line: str, chunk: int | None = None) -> Recommendation:
        warnings = _warnings(cost, contexts) if policy != "undetermined" and contexts else ()
        return Recommendation(policy, chunk, star, fraction, line, warnings)

    if "prefill_per_token" in refused and cost.prefill_per_pair == 0:
        return advice(
            "undetermined",
            "-> no recommendation: prefill_per_token was refused, so this C* rests on noise. "
            "Measure again (more --repeats, a quieter machine).",
        )
    if star <= 0:
        return advice(
            "disaggregated",
            "-> C* <= 0: the pass overhead alone fills a decode step, so no chunk rides along "
            "for free. Prefer DISAGGREGATION.",
        )
    if fraction >= DISAGGREGATE_OVERHEAD_FRACTION:
        return advice(
            "disaggregated", "-> chunking has almost no room here. Prefer DISAGGREGATION."
        )
    if math.isinf(typical):
        return advice(
            "chunked",
            "-> prompt tokens cost nothing measurable within a decode step: any chunk rides "
            "along. Prefer CHUNKED prefill.",
        )
    at = "" if typical == star else f" at {TYPICAL_PROMPT:,} tokens of context"
    if typical < MIN_USEFUL_CHUNK:
        return advice(
            "disaggregated",
            f"-> C*{at} is under {MIN_USEFUL_CHUNK} tokens: a decode step has room for only a "
            "handful of prompt tokens, and chunks that small multiply the passes. Prefer "
            "DISAGGREGATION.",
        )
    chunk = round(typical)
    where = f" (C* at the end of a typical {TYPICAL_PROMPT:,}-token prompt)" if at else ""
    return advice(
        "chunked",
        f"-> chunking has room: chunk ~ {chunk} tokens{where} (vLLM max_num_batched_tokens ~ "
        f"{chunk} + decode rows). Prefer CHUNKED prefill.",
        chunk,
    )


def star_text(star: float) -> str:
    """C* in whole tokens, ``inf`` / ``-inf`` when infinite."""
    return f"{star:.0f}" if math.isfinite(star) else ("inf" if star > 0 else "-inf")


def chunk_star_text(
    cost: CostModel, refused: Collection[str] = (), contexts: Sequence[int] = STAR_CONTEXTS
) -> str:
    """The C* derivation block with ``cost``'s numbers (the lab's formula at context 0), C* at
    each of ``contexts`` when the model has terms that make it fall, and the recommendation."""
    advice = recommend(cost, refused, contexts)
    lines = [
        "C* = (decode_step - pass_overhead) / prefill_per_token",
        f"   = ({ms(cost.decode_step_base)} - {ms(cost.prefill_pass_overhead)}) ms / "
        f"{us(cost.prefill_per_token)} us",
        f"   = {star_text(cost.chunk_star())} tokens",
    ]
    if (cost.prefill_per_pair > 0 or cost.decode_per_kv_token > 0) and contexts:
        by_context = ", ".join(
            f"{c:,}: {star_text(s)}" for c, s in stars_by_context(cost, contexts).items()
        )
        lines += [
            "",
            "C* by context (tokens of the prompt already cached, which each chunk attends to):",
            f"   {by_context}",
        ]
    lines += [
        "",
        f"pass overhead is {advice.overhead_fraction:.0%} of one decode step",
        advice.line,
        *advice.warnings,
    ]
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True, slots=True)
class ChunkChoice:
    """The chunk for chunked prefill and why: ``how`` is a phrase for a title or a table."""

    chunk: int
    how: str


def choose_chunk(cost: CostModel, prompt_len: int, refused: Collection[str] = ()) -> ChunkChoice:
    """The chunk every report runs chunked prefill with for ``cost``: C* at the end of a
    typical prompt (:func:`typical_star`; the lab's C* for a linear model) rounded, within
    [1, ``prompt_len``]; the whole prompt when C* is infinite; ``FALLBACK_CHUNK`` (capped at the
    prompt) when C* < 1 or the per-token prefill cost was refused.

    Raises:
        ValueError: for a ``prompt_len`` that is not an integer >= 1.
    """
    check_int("prompt_len", prompt_len)
    star = typical_star(cost)
    fallback = min(FALLBACK_CHUNK, prompt_len)
    if "prefill_per_token" in refused:
        return ChunkChoice(fallback, f"fallback {fallback}: the per-token prefill cost was refused")
    if math.isinf(star) and star > 0:
        return ChunkChoice(prompt_len, "C* = inf: the whole prompt rides along")
    if not star >= 1:
        return ChunkChoice(
            fallback,
            f"C* = {star_text(star)}: the pass overhead eats the decode step, so no chunk "
            f"rides free; fallback {fallback}",
        )
    chunk = max(1, min(round(star), prompt_len))
    capped = ", capped at the prompt" if chunk < round(star) else ""
    at = "" if star == cost.chunk_star() else f" at {TYPICAL_PROMPT:,} tokens of context"
    return ChunkChoice(chunk, f"C*{at} = {star:,.0f}, rounded{capped}")


def chunk_from_cost(cost: CostModel, prompt_len: int) -> int:
    """:func:`choose_chunk`'s chunk."""
    return choose_chunk(cost, prompt_len).chunk
