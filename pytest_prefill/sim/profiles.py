"""Engine profiles (DESIGN.md, "Engine semantics (v3)"): the few ways a real engine's loop
differs from the lab's, as knobs, and named, frozen bundles of them with the source each
default was read from. ``lab`` is the lab's loop exactly; it is every entry point's default."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .checks import check_cap, check_int

FIRST_TOKEN_RULES = ("prefill", "decode")
KV_RULES = ("reserve", "paged")
KNOBS = (
    "first_token",
    "max_batched_tokens",
    "max_seqs",
    "kv",
    "kv_block_tokens",
    "prefix_caching",
    "prefix_block_tokens",
)


@dataclasses.dataclass(frozen=True, slots=True)
class EngineProfile:
    """How an engine schedules, as knobs (DESIGN.md, "Engine semantics (v3)").

    ``first_token``: ``"prefill"`` — the iteration that completes a request's prompt emits its
    first output token, and the request then takes part in ``output_len - 1`` decode rows (what
    vLLM, SGLang, TGI, llama.cpp and DistServe do); ``"decode"`` — the lab's rule, the first
    token at the end of the first decode step after the prefill. ``max_batched_tokens``: every
    iteration on a worker holds at most this many tokens (a decode row is one, a prompt token
    one; None: no budget). ``max_seqs``: at most this many requests admitted on a worker at
    once (None: no cap). With a token budget at most ``max_batched_tokens`` requests are
    admitted too (:attr:`seq_cap`), since each running request takes a decode row, as vLLM
    caps its default ``max_num_seqs``. ``kv``, ``kv_block_tokens``, ``prefix_caching``,
    ``prefix_block_tokens``: KV memory and the prefix cache (only ``"reserve"`` and no prefix
    caching are simulated so far). ``citations``: (knob, where its default comes from) pairs.

    Raises:
        ValueError: naming the field, for a value outside its allowed ones.
    """

    name: str
    first_token: str = "decode"
    max_batched_tokens: int | None = None
    max_seqs: int | None = None
    kv: str = "reserve"
    kv_block_tokens: int = 16
    prefix_caching: bool = False
    prefix_block_tokens: int = 16
    description: str = ""
    citations: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"EngineProfile.name must be a non-empty string, got {self.name!r}")
        if self.first_token not in FIRST_TOKEN_RULES:
            raise ValueError(
                f"first_token must be one of {', '.join(FIRST_TOKEN_RULES)}; "
                f"got {self.first_token!r}"
            )
        check_cap("max_batched_tokens", self.max_batched_tokens)
        check_cap("max_seqs", self.max_seqs)
        if self.kv not in KV_RULES:
            raise ValueError(f"kv must be one of {', '.join(KV_RULES)}; got {self.kv!r}")
        check_int("kv_block_tokens", self.kv_block_tokens)
        if not isinstance(self.prefix_caching, bool):
            raise ValueError(f"prefix_caching must be True or False, got {self.prefix_caching!r}")
        check_int("prefix_block_tokens", self.prefix_block_tokens)
        pairs = self.citations
        if not isinstance(pairs, tuple) or not all(
            isinstance(p, tuple) and len(p) == 2 and p[0] in KNOBS and isinstance(p[1], str)
            for p in pairs
        ):
            raise ValueError(
                f"citations must be a tuple of (knob, source) pairs, knobs among {KNOBS}"
            )

    @property
    def sources(self) -> Mapping[str, str]:
        """Each knob's source citation: engine, version, file or doc, and the case taken."""
        return dict(self.citations)

    @property
    def seq_cap(self) -> int | None:
        """The requests a worker admits at once: ``max_seqs``, and no more than the token
        budget (each running request takes one decode row); None: no cap."""
        caps = [c for c in (self.max_seqs, self.max_batched_tokens) if c is not None]
        return min(caps) if caps else None

    def changed(self) -> tuple[str, ...]:
        """The knobs that differ from the named profile's defaults (empty for a profile of
        another name)."""
        base = PROFILES.get(self.name)
        if base is None:
            return ()
        return tuple(k for k in KNOBS if getattr(self, k) != getattr(base, k))

    def label(self) -> str:
        """One line for a report header: the profile, its first-token rule and its caps."""
        budget = (
            "no token budget"
            if self.max_batched_tokens is None
            else (f"{self.max_batched_tokens} tokens an iteration")
        )
        seqs = "no sequence cap" if self.seq_cap is None else f"at most {self.seq_cap} requests"
        rule = "from the prefill" if self.first_token == "prefill" else "after a decode step"
        changed = self.changed()
        note = f" (changed: {', '.join(changed)})" if changed else ""
        return f"engine {self.name}{note}: first token {rule}; {budget}; {seqs}"


PROFILES: dict[str, EngineProfile] = {
    p.name: p
    for p in (
        EngineProfile(
            "lab",
            description="the lab's loop: today's simulator, every number unchanged",
            citations=(
                ("first_token", "DESIGN.md, Simulation semantics: the lab's convention"),
                ("max_batched_tokens", "the lab's loop has no token budget"),
                ("max_seqs", "the lab's loop has no sequence cap"),
            ),
        ),
    )
}
LAB = PROFILES["lab"]


def get_profile(name: str) -> EngineProfile:
    """The engine profile called ``name``; ValueError listing the allowed ones otherwise."""
    try:
        return PROFILES[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"unknown engine profile {name!r}; allowed: {', '.join(PROFILES)}"
        ) from None


def resolve_engine(engine: Any) -> EngineProfile:
    """``engine`` as a profile: a name from ``PROFILES`` or an :class:`EngineProfile`.

    Raises:
        ValueError: for an unknown name or anything else, listing the allowed names.
    """
    if isinstance(engine, EngineProfile):
        return engine
    if isinstance(engine, str):
        return get_profile(engine)
    raise ValueError(
        f"engine must be a profile name ({', '.join(PROFILES)}) or an EngineProfile, "
        f"got {type(engine).__name__}"
    )
