"""One home for the two decisions every report makes from a cost model: which chunk to run
chunked prefill with, and what to recommend (with the one wording that calibrate, compare, the
plugin's summary and the archive all print). Standard library only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection

from pytest_prefill.scheduler import CostModel, check_int
from pytest_prefill.units import ms, us

# The recommendation (see ``recommend``): with overhead fraction f = pass overhead / decode
# step, prefer disaggregation when C* <= 0 (f >= 1), when f >= DISAGGREGATE_OVERHEAD_FRACTION
# (chunking has little room: every chunk pays most of a decode step in overhead), or when C* is
# below MIN_USEFUL_CHUNK tokens; otherwise prefer chunked prefill with a chunk of about C*.
DISAGGREGATE_OVERHEAD_FRACTION = 0.5
MIN_USEFUL_CHUNK = 16
# The chunk run or drawn when C* gives none (C* < 1, or the per-token cost was refused).
FALLBACK_CHUNK = MIN_USEFUL_CHUNK


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

    def __str__(self) -> str:
        return self.line

    def to_dict(self) -> dict[str, object]:
        """JSON-able (C* infinite becomes "inf" / "-inf")."""
        return {
            "policy": self.policy,
            "chunk": self.chunk,
            "chunk_star": _json_number(self.chunk_star),
            "overhead_fraction": _json_number(self.overhead_fraction),
            "line": self.line,
        }


def _json_number(value: float) -> float | str | None:
    if math.isnan(value):
        return None
    return value if math.isfinite(value) else ("inf" if value > 0 else "-inf")


def recommend(cost: CostModel, refused: Collection[str] = ()) -> Recommendation:
    """The recommendation for ``cost`` (thresholds: ``DISAGGREGATE_OVERHEAD_FRACTION``,
    ``MIN_USEFUL_CHUNK``). ``refused`` names the constants a calibration refused: without a
    per-token prefill cost C* means nothing, and the policy is ``undetermined``."""
    star = cost.chunk_star()
    fraction = (
        cost.prefill_pass_overhead / cost.decode_step_base
        if cost.decode_step_base > 0
        else math.inf
    )

    def advice(policy: str, line: str, chunk: int | None = None) -> Recommendation:
        return Recommendation(policy, chunk, star, fraction, line)

    if "prefill_per_token" in refused:
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
    if math.isinf(star):
        return advice(
            "chunked",
            "-> prompt tokens cost nothing measurable within a decode step: any chunk rides "
            "along. Prefer CHUNKED prefill.",
        )
    if star < MIN_USEFUL_CHUNK:
        return advice(
            "disaggregated",
            f"-> C* is under {MIN_USEFUL_CHUNK} tokens: a decode step has room for only a "
            "handful of prompt tokens, and chunks that small multiply the passes. Prefer "
            "DISAGGREGATION.",
        )
    chunk = round(star)
    return advice(
        "chunked",
        f"-> chunking has room: chunk ~ {chunk} tokens (vLLM max_num_batched_tokens ~ {chunk} "
        "+ decode rows). Prefer CHUNKED prefill.",
        chunk,
    )


def star_text(star: float) -> str:
    """C* in whole tokens, ``inf`` / ``-inf`` when infinite."""
    return f"{star:.0f}" if math.isfinite(star) else ("inf" if star > 0 else "-inf")


def chunk_star_text(cost: CostModel, refused: Collection[str] = ()) -> str:
    """The C* derivation block, with ``cost``'s numbers, ending with the recommendation."""
    advice = recommend(cost, refused)
    return "\n".join(
        [
            "C* = (decode_step - pass_overhead) / prefill_per_token",
            f"   = ({ms(cost.decode_step_base)} - {ms(cost.prefill_pass_overhead)}) ms / "
            f"{us(cost.prefill_per_token)} us",
            f"   = {star_text(cost.chunk_star())} tokens",
            "",
            f"pass overhead is {advice.overhead_fraction:.0%} of one decode step",
            advice.line,
        ]
    )


@dataclasses.dataclass(frozen=True, slots=True)
class ChunkChoice:
    """The chunk for chunked prefill and why: ``how`` is a phrase for a title or a table."""

    chunk: int
    how: str


def choose_chunk(cost: CostModel, prompt_len: int, refused: Collection[str] = ()) -> ChunkChoice:
    """The chunk every report runs chunked prefill with for ``cost``: C* rounded, within
    [1, ``prompt_len``]; the whole prompt when C* is infinite; ``FALLBACK_CHUNK`` (capped at the
    prompt) when C* < 1 or the per-token prefill cost was refused.

    Raises:
        ValueError: for a ``prompt_len`` that is not an integer >= 1.
    """
    check_int("prompt_len", prompt_len)
    star = cost.chunk_star()
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
    return ChunkChoice(chunk, f"C* = {star:,.0f}, rounded{capped}")


def chunk_from_cost(cost: CostModel, prompt_len: int) -> int:
    """:func:`choose_chunk`'s chunk."""
    return choose_chunk(cost, prompt_len).chunk
