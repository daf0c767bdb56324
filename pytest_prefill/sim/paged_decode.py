"""Paged KV on the two pools of a disaggregated run (DESIGN.md, "Engine semantics (v3)", KV
memory): a prefill worker holds a prompt's blocks from admission until its KV has crossed the
link (:class:`PromptBlocks`); a decode worker holds them from the KV's arrival, grows a block
each time decoding fills one, and preempts by recompute as a colocated paged worker does
(:class:`PagedDecodeWorker`: a decode instance is an engine of its own, as vLLM's is under
its P/D connectors, so a preempted request prefills its prompt and emitted tokens again there,
fused with the rows)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from typing import Any

from .paged import BlockPool, blocks_for, cache_prompt, prefix_hits
from .paged_worker import PagedWorker
from .profiles import EngineProfile
from .requests import Request
from .rules import Plan


class PromptBlocks:
    """A prefill worker's blocks: ``blocks`` of the profile's ``kv_block_tokens`` (inf: no
    limit) and, under prefix caching, its cache (cached blocks no prompt shares are evicted
    least recently used first when room is needed). A prompt is admitted when the blocks of
    the tokens the cache does not supply fit; it shares the cached ones."""

    __slots__ = ("pool", "block_tokens", "entry_tokens", "caching", "own", "shared")

    def __init__(self, blocks: float, engine: EngineProfile) -> None:
        self.block_tokens = engine.kv_block_tokens
        self.entry_tokens = engine.prefix_block_tokens
        self.caching = engine.prefix_caching
        entry_blocks = max(1, self.entry_tokens // self.block_tokens)
        self.pool = BlockPool(blocks, entry_blocks)
        self.own: dict[str, int] = {}  # admitted prompt -> its own blocks
        self.shared: dict[str, list[Hashable]] = {}  # admitted prompt -> cached blocks shared

    def hit_blocks(self, r: Request) -> int:
        """The leading cache entries of ``r`` the cache holds (never its whole prompt)."""
        if not self.caching:
            return 0
        return prefix_hits(self.pool, r, r.prompt_len, self.entry_tokens)

    def fits(self, r: Request) -> bool:
        """Whether ``r``'s prompt fits now (its uncached tokens' blocks, evicting if need be)."""
        hits = self.hit_blocks(r)
        blocks = r.prefix_blocks[:hits]
        keep = sum(1 for b in blocks if self.pool.refs[b] == 0)
        need = blocks_for(r.prompt_len - hits * self.entry_tokens, self.block_tokens)
        return self.pool.room(keep) >= need

    def reserve(self, r: Request) -> int:
        """Admit ``r`` (it fits): share its cached blocks, take the rest; returns the prompt
        tokens the cache supplied."""
        hits = self.hit_blocks(r)
        blocks: list[Hashable] = list(r.prefix_blocks[:hits])
        self.pool.share(blocks)
        need = blocks_for(r.prompt_len - hits * self.entry_tokens, self.block_tokens)
        taken = self.pool.take(need)
        assert taken, "a prompt admitted without room"
        self.own[r.id], self.shared[r.id] = need, blocks
        return hits * self.entry_tokens

    def cache(self, r: Request) -> None:
        """``r``'s prompt completed: its full blocks enter the cache (shared by it)."""
        entered = cache_prompt(self.pool, r, self.shared[r.id], self.entry_tokens)
        self.own[r.id] -= entered * self.pool.entry_blocks

    def release(self, r: Request) -> None:
        """``r``'s KV has left (or it is done): its own blocks are free, its cached ones
        evictable once no one shares them."""
        self.pool.owned -= self.own.pop(r.id)
        self.pool.unshare(self.shared.pop(r.id))


class PagedDecodeWorker(PagedWorker):
    """A decode worker under paged KV with ``blocks`` blocks. A request whose KV has arrived
    (:meth:`join`) takes a sequence slot at once and, at the next boundary at which no
    preempted request waits ahead of it, the blocks of its prompt and the tokens it emitted
    (FCFS; it waits while they do not fit: an arrival never preempts); then it decodes as a
    row, takes a block each time it fills one, and when a row cannot get its block the most
    recently admitted request here is preempted by recompute
    (:class:`~.paged_worker.PagedWorker`'s rules, with no prefix cache: under disaggregation
    it lives on the prefill workers). A preempted request keeps its sequence slot: it was
    routed here and is this instance's to finish (were the slot freed, arrivals could take
    every slot while waiting behind it for blocks, and nothing would run again). The decode pool's router sees slots, not blocks
    (:meth:`has_room`), as a proxy in front of engine instances does; so what it decides
    never depends on how the fast path groups decode steps."""

    __slots__ = ("arrived",)

    def __init__(self, name: str, blocks: float, engine: EngineProfile) -> None:
        super().__init__(name, "decode", math.inf, blocks, engine)
        self.caching = False
        self.arrived: deque[Request] = deque()  # KV arrived, its blocks not taken yet

    def _arrival_blocks(self, r: Request) -> int:
        """The blocks ``r`` takes as it joins: its prompt and the tokens emitted before."""
        return blocks_for(r.prompt_len + (1 if self.prefill_first else 0), self.block_tokens)

    def has_room(self, r: Request) -> bool:
        """Whether ``r`` could join now: a free sequence slot."""
        return self.admitted < self.max_seqs

    def join(self, r: Request, first_token: Any = None) -> None:
        """``r``'s KV has arrived: it takes a slot, and its blocks at the next boundary with
        room (under the ``prefill`` rule, with its first token's time)."""
        self.admitted += 1
        self.unfinished += 1
        self.emitted[r.id] = 0
        self.prefill_start[r.id] = first_token  # its prefill was elsewhere: never admitted here
        if self.prefill_first:
            self.tokens.add(r.id, first_token)
            self.emitted[r.id] = 1
        self.arrived.append(r)

    def _preempt(self, now: int) -> Request:
        """Preempt the most recently admitted request; it keeps its slot."""
        r = super()._preempt(now)
        self.admitted += 1
        return r

    def _slot_for(self, r: Request) -> bool:
        """A request re-admitted here was preempted here: it holds its slot already."""
        return True

    def _admitted(
        self, r: Request, done: int, target: int, blocks: list[Hashable], own: int, now: int
    ) -> None:
        super()._admitted(r, done, target, blocks, own, now)
        self.admitted -= 1  # its slot was kept while it waited

    def compose(self, now: Any) -> Plan | None:
        """The arrivals that fit join the rows (FCFS, behind any preempted request), then
        :meth:`PagedWorker.compose`."""
        arrived, pool = self.arrived, self.pool
        while arrived and not self.pending:
            r = arrived[0]
            need = self._arrival_blocks(r)
            if not pool.take(need):
                break
            arrived.popleft()
            self.owned[r.id], self.shared[r.id] = need, []
            self.holds[r.id] = need * self.block_tokens
            self.counter += 1
            self.order[r.id] = self.counter
            self.joining.append(r)
        return super().compose(now)
