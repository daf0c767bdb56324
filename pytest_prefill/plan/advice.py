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
# A calibration whose fit predicts its own held-out prompt lengths worse than this (median
# |relative error|) is not trusted to recommend anything: three calibrations of one model on a
# busy box gave C* of 126, 38 and -83,620, the last with a 49% held-out error.
MAX_TRUSTED_HELD_OUT = 0.25
# On a machine the quiet probe found BUSY, a fit that still predicts its held-out prompt lengths
# within this is sound enough to recommend from, with the caveat said (a 6% held-out error
# inside an exclusive CPU lock of a shared box was once flagged BUSY and blocked every answer).
MAX_BUSY_HELD_OUT = 0.10


@dataclasses.dataclass(frozen=True, slots=True)
class Trust:
    """How far a measured cost model may be trusted, as its calibration measured it:
    ``held_out`` the median |relative error| of the fit's held-out predictions (None: not
    computed), ``busy`` whether the quiet-machine probe found the machine busy (None: not
    probed), ``unstable`` how many measurements were flagged unstable."""

    held_out: float | None = None
    busy: bool | None = None
    unstable: int = 0

    def doubts(self) -> tuple[str, ...]:
        """Why the fit should not be acted on (empty when it may)."""
        out = []
        if self.held_out is not None and not self.held_out <= MAX_TRUSTED_HELD_OUT:
            out.append(
                f"held-out error {self.held_out:.0%} > {MAX_TRUSTED_HELD_OUT:.0%}"
                if math.isfinite(self.held_out)
                else "held-out error not finite"
            )
        if self.busy and not self.sound_though_busy():
            held = (
                f"its held-out error is {self.held_out:.0%}"
                if self.held_out is not None and math.isfinite(self.held_out)
                else "its held-out error was not computed"
            )
            out.append(
                f"the machine was BUSY while it was timed and {held}; on a busy machine it "
                f"must be <= {MAX_BUSY_HELD_OUT:.0%}"
            )
        return tuple(out)

    def sound_though_busy(self) -> bool:
        """Timed on a BUSY machine, yet the fit predicts its held-out prompt lengths within
        ``MAX_BUSY_HELD_OUT``: a recommendation with the caveat, not none."""
        return bool(self.busy and self.held_out is not None and self.held_out <= MAX_BUSY_HELD_OUT)

    def caveats(self) -> tuple[str, ...]:
        """What a reader of a recommendation from this fit must know (empty when nothing)."""
        if not self.sound_though_busy():
            return ()
        return (
            f"caveat: the machine was BUSY while it was timed; the fit still predicts its "
            f"held-out prompt lengths within {self.held_out:.1%} (<= {MAX_BUSY_HELD_OUT:.0%}), "
            "so the recommendation stands: confirm it on a quiet machine.",
        )

    def text(self) -> str:
        """The trust figures in a few words: 'held-out error 4.9%, quiet, 2 unstable'."""
        parts = []
        if self.held_out is not None and math.isfinite(self.held_out):
            parts.append(f"held-out error {self.held_out:.1%}")
        else:
            parts.append("held-out error not computed")
        if self.busy is not None:
            parts.append("BUSY machine" if self.busy else "quiet machine")
        if self.unstable:
            parts.append(f"{self.unstable} unstable measurement(s)")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, object]:
        return {"held_out": self.held_out, "busy": self.busy, "unstable": self.unstable}

    @classmethod
    def from_dict(cls, data: object) -> Trust | None:
        """Inverse of :meth:`to_dict` (None for anything else)."""
        if not isinstance(data, dict):
            return None
        held, busy, unstable = data.get("held_out"), data.get("busy"), data.get("unstable")
        return cls(
            float(held) if isinstance(held, (int, float)) and not isinstance(held, bool) else None,
            busy if isinstance(busy, bool) else None,
            unstable if isinstance(unstable, int) and not isinstance(unstable, bool) else 0,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class FittedCost:
    """A cost model with what its calibration said of it, what every recommendation rests on:
    the constants it ``refused`` (recorded as 0; without a per-token prefill cost C* means
    nothing), the ``contexts`` C* is reported at, and the fit's ``trust`` (None: not measured
    here, as a preset).

    Raises:
        ValueError: naming the field, for a cost that is not a CostModel, a refused name that
            is not a string, or a context that is not a whole number >= 0.
    """

    cost: CostModel
    refused: frozenset[str] = frozenset()
    contexts: tuple[int, ...] = STAR_CONTEXTS
    trust: Trust | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.cost, CostModel):
            raise ValueError(f"cost must be a CostModel, got {type(self.cost).__name__}")
        if isinstance(self.refused, str) or not all(isinstance(r, str) for r in self.refused):
            raise ValueError(f"refused must be constant names (strings), got {self.refused!r}")
        for context in self.contexts:
            check_int("contexts", context, minimum=0)
        if self.trust is not None and not isinstance(self.trust, Trust):
            raise ValueError(f"trust must be a Trust or None, got {self.trust!r}")
        object.__setattr__(self, "refused", frozenset(self.refused))
        object.__setattr__(self, "contexts", tuple(self.contexts))


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
        return "\n".join((self.line, *filter(None, [self.question]), *self.warnings))

    @property
    def question(self) -> str | None:
        """The question the rule answers, printed under a chunked or disaggregated line (None
        when undetermined): not the one ``capacity`` answers, so the two may differ."""
        return None if self.policy == "undetermined" else RULE_QUESTION

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


# The two recommendations answer different questions, and each output says which (they may
# disagree on one cost model: a prompt's stall and a deployment's goodput are not the same aim).
RULE_QUESTION = (
    "   (C*'s rule answers where ONE long prompt amid live decode streams should go: chunked in "
    "(a chunk up to C* tokens rides a decode step for free, more stalls the streams) or to a "
    "prefill worker (no stall; its TTFT pays the KV transfer). Which deployment serves the most requests per device "
    "for your traffic and SLO is another question: prefill-bench capacity, which may pick "
    "otherwise.)"
)
CAPACITY_QUESTION = (
    "This answers which deployment serves the most requests per device for this traffic within "
    "the SLO (simulated). C*'s rule (simulate, calibrate, the plugin's summary) answers another "
    "question, where one long prompt amid live streams should go, and may prefer otherwise."
)


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


def recommend(fitted: FittedCost) -> Recommendation:
    """The recommendation for ``fitted``'s cost (thresholds: ``DISAGGREGATE_OVERHEAD_FRACTION``,
    ``MIN_USEFUL_CHUNK``, ``TYPICAL_PROMPT``). Without a per-token prefill cost (refused) C*
    means nothing, and the policy is ``undetermined``; so it is when the fit's trust has doubts.
    A plain warning when the chunk that rides free at the longest of its contexts falls below
    usefulness."""
    cost, refused, contexts, trust = fitted.cost, fitted.refused, fitted.contexts, fitted.trust
    star = cost.chunk_star()
    typical = typical_star(cost)
    fraction = (
        cost.prefill_pass_overhead / cost.decode_step_base
        if cost.decode_step_base > 0
        else math.inf
    )

    def advice(policy: str, line: str, chunk: int | None = None) -> Recommendation:
        warnings = _warnings(cost, contexts) if policy != "undetermined" and contexts else ()
        if policy != "undetermined" and trust is not None:
            warnings = (*warnings, *trust.caveats())
        return Recommendation(policy, chunk, star, fraction, line, warnings)

    why_not = _no_recommendation(refused, trust)
    if why_not:
        return advice("undetermined", why_not)
    if star <= 0:
        return advice(
            "disaggregated",
            f"-> C* <= 0: {star_reason(cost)}, so no chunk rides along for free. Prefer "
            "DISAGGREGATION.",
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


def _no_recommendation(refused: Collection[str], trust: Trust | None) -> str:
    """The line that says why there is no recommendation ('' when there may be one)."""
    if "prefill_per_token" in refused:
        return (
            "-> no recommendation: prefill_per_token was refused, so no C* follows from this "
            "fit. Measure again (more --repeats, a quieter machine)."
        )
    doubts = trust.doubts() if trust is not None else ()
    if doubts:
        return (
            f"-> no recommendation: this fit is not trustworthy ({'; '.join(doubts)}). "
            "Measure again on a quiet machine, or with more --repeats until the held-out error "
            "is within bounds."
        )
    return ""


def star_reason(cost: CostModel, context: int = 0) -> str:
    """Why C* at ``context`` tokens of cached prompt is below one token, naming the term that
    takes the decode step (the pass overhead, reading the cached prompt's KV, or both), with
    its milliseconds -- never a term the cost model holds at 0."""
    decode = cost.decode_step(1, 0)
    overhead = cost.prefill_pass_overhead
    kv = cost.decode_per_kv_token * context
    step = f"a decode step ({ms(decode)} ms)"
    if overhead >= decode:
        return f"the pass overhead alone ({ms(overhead)} ms) fills {step}"
    reading = f"reading the KV of {context:,} cached prompt tokens ({ms(kv)} ms)"
    if overhead + kv >= decode:
        if overhead > 0:
            return f"the pass overhead ({ms(overhead)} ms) and {reading} fill {step}"
        return f"{reading} fills {step}"
    return f"what {step} leaves holds less than one prompt token"


def star_text(star: float) -> str:
    """C* in whole tokens, ``inf`` / ``-inf`` when infinite."""
    return f"{star:.0f}" if math.isfinite(star) else ("inf" if star > 0 else "-inf")


def _negative_star_note(cost: CostModel, contexts: Sequence[int]) -> list[str]:
    """A line under C* by context when some are below one token: from which context, and why."""
    low = [c for c, s in stars_by_context(cost, contexts).items() if not s >= 1]
    if not low:
        return []
    return [
        f"   below 1 from {low[0]:,} tokens of context: {star_reason(cost, low[0])}, so there "
        "no chunk rides free (each chunk lengthens the streams' decode step; C* <= 0 is this "
        "diagnosis, not a chunk size)"
    ]


def chunk_star_text(fitted: FittedCost) -> str:
    """The C* derivation block with ``fitted``'s numbers (the lab's formula at context 0), C* at
    each of its contexts when the model has terms that make it fall, and the recommendation;
    with the per-token cost refused, no C* at all (a division by a refused 0 has no result)."""
    cost, contexts, trust = fitted.cost, fitted.contexts, fitted.trust
    advice = recommend(fitted)
    if "prefill_per_token" in fitted.refused:
        return "\n".join(
            [
                "C* = (decode_step - pass_overhead) / prefill_per_token: not determined,",
                "     prefill_per_token was refused (recorded as 0)",
                "",
                f"pass overhead is {advice.overhead_fraction:.0%} of one decode step",
                advice.line,
            ]
        )
    lines = [
        "C* = (decode_step - pass_overhead) / prefill_per_token",
        f"   = ({ms(cost.decode_step_base)} - {ms(cost.prefill_pass_overhead)}) ms / "
        f"{us(cost.prefill_per_token)} us",
        f"   = {star_text(cost.chunk_star())} tokens",
    ]
    if trust is not None:
        lines.append(f"   ({trust.text()})")
    if (cost.prefill_per_pair > 0 or cost.decode_per_kv_token > 0) and contexts:
        by_context = ", ".join(
            f"{c:,}: {star_text(s)}" for c, s in stars_by_context(cost, contexts).items()
        )
        lines += [
            "",
            "C* by context (tokens of the prompt already cached, which each chunk attends to):",
            f"   {by_context}",
            *_negative_star_note(cost, contexts),
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
    at = "" if star == cost.chunk_star() else f" at {TYPICAL_PROMPT:,} tokens of context"
    if not star >= 1:
        context = TYPICAL_PROMPT if at else 0
        return ChunkChoice(
            fallback,
            f"C*{at} = {star_text(star)}: {star_reason(cost, context)}, so no chunk rides "
            f"free; fallback {fallback}",
        )
    chunk = max(1, min(round(star), prompt_len))
    capped = ", capped at the prompt" if chunk < round(star) else ""
    return ChunkChoice(chunk, f"C*{at} = {star:,.0f}, rounded{capped}")


def chunk_from_cost(cost: CostModel, prompt_len: int) -> int:
    """:func:`choose_chunk`'s chunk."""
    return choose_chunk(cost, prompt_len).chunk
