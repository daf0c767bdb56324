"""Paged KV memory (DESIGN.md, "Engine semantics (v3)", KV memory and prefix caching): one
worker's block pool, ``kv_capacity_tokens // kv_block_tokens`` blocks, with its prefix cache.
Blocks are counted, not named: a request owns the blocks of the tokens it wrote beyond the
cached prefix blocks it shares; each cached prefix block holds ``prefix_block_tokens //
kv_block_tokens`` blocks, once, whoever shares it. What to allocate when is the rules'
business (:mod:`.paged_worker`); this is the arithmetic and the LRU order."""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Hashable, Sequence

from .profiles import EngineProfile
from .requests import Request


def blocks_for(tokens: int, block_tokens: int) -> int:
    """The blocks of ``block_tokens`` tokens that ``tokens`` tokens fill (the last partly)."""
    return -(-tokens // block_tokens)


def block_capacity(capacity_tokens: float, block_tokens: int) -> float:
    """The blocks of a worker: ``capacity_tokens // block_tokens`` (inf: no limit)."""
    return capacity_tokens if math.isinf(capacity_tokens) else int(capacity_tokens) // block_tokens


class BlockPool:
    """One worker's KV blocks: ``capacity`` (inf: no limit), ``owned`` by requests (their own
    blocks), and the prefix cache's entries (:attr:`cached` of them, each ``entry_blocks``
    blocks; those no running request shares are evictable, least recently used first).

    The cache follows vLLM V1 (vllm/v1/core/block_pool.py, kv_cache_manager.py, commit 99d7eb5):
    a block a request stops sharing goes to the back of the eviction queue, a request's blocks
    in reverse order (its tail first out); a hit takes a block off the queue.
    """

    __slots__ = ("capacity", "owned", "entry_blocks", "refs", "lru")

    def __init__(self, capacity: float, entry_blocks: int = 1) -> None:
        self.capacity = capacity
        self.owned = 0
        self.entry_blocks = entry_blocks
        self.refs: dict[Hashable, int] = {}  # cached block id -> requests sharing it
        self.lru: OrderedDict[Hashable, None] = OrderedDict()  # shared by none: evictable

    @property
    def cached(self) -> int:
        return len(self.refs)

    @property
    def used(self) -> int:
        """Blocks owned by requests plus the cache's blocks (evictable or not)."""
        return self.owned + len(self.refs) * self.entry_blocks

    def room(self, keep: int = 0) -> float:
        """Blocks that could be had now: free ones plus evictable ones, less ``keep``
        evictable entries about to be shared."""
        free = self.capacity - self.used
        return free + (len(self.lru) - keep) * self.entry_blocks

    def take(self, blocks: int) -> bool:
        """Own ``blocks`` more, evicting least recently used cached blocks if needed; False
        (nothing changed) if even eviction leaves too few."""
        if blocks <= 0:
            return True
        if self.capacity == math.inf:  # every block is had: nothing to count against
            self.owned += blocks
            return True
        if self.room() < blocks:
            return False
        lru, refs = self.lru, self.refs
        while self.capacity - self.used < blocks:
            block, _ = lru.popitem(last=False)
            del refs[block]
        self.owned += blocks
        return True

    def hits(self, blocks: Sequence[Hashable], most: int) -> int:
        """How many of ``blocks``' leading ids the cache holds in a run (at most ``most``)."""
        refs, n = self.refs, 0
        while n < most and blocks[n] in refs:
            n += 1
        return n

    def share(self, blocks: Sequence[Hashable]) -> None:
        """A request shares these cached blocks (off the eviction queue)."""
        if self.capacity == math.inf:  # nothing is ever evicted: who shares what is moot
            return
        refs, lru = self.refs, self.lru
        for b in blocks:
            if refs[b] == 0:
                del lru[b]
            refs[b] += 1

    def unshare(self, blocks: Sequence[Hashable]) -> None:
        """A request stops sharing these blocks: any now shared by none become evictable,
        the last of them first."""
        if self.capacity == math.inf:  # nothing is ever evicted: who shares what is moot
            return
        refs, lru = self.refs, self.lru
        for b in reversed(blocks):
            refs[b] -= 1
            if refs[b] == 0:
                lru[b] = None

    def insert(self, block: Hashable) -> bool:
        """A completed prompt's full block enters the cache (shared by its request): its
        ``entry_blocks`` move from the request's own to the cache. False if already cached
        (the request keeps its copy as its own)."""
        if block in self.refs:
            return False
        self.refs[block] = 1
        self.owned -= self.entry_blocks
        return True


def prefix_hits(pool: BlockPool, request: Request, target: int, entry_tokens: int) -> int:
    """The leading prefix blocks of ``request`` the cache holds in a run, as admission counts
    them: full prompt blocks of ``entry_tokens`` only, and never all ``target`` tokens (one at
    least is computed, as vLLM's ``get_computed_blocks``). The one home of a prefix hit."""
    blocks = request.prefix_blocks
    if not blocks:
        return 0
    most = min(len(blocks), request.prompt_len // entry_tokens, (target - 1) // entry_tokens)
    return pool.hits(blocks, most)


def cache_prompt(
    pool: BlockPool, request: Request, shared: list[Hashable], entry_tokens: int
) -> int:
    """``request``'s prompt completed: its full blocks it does not share yet enter the cache,
    shared by it (appended to ``shared``). Returns how many entered (their blocks move from
    the request's own to the cache). The one home of a cache entry."""
    full = min(len(request.prefix_blocks), request.prompt_len // entry_tokens)
    entered = 0
    for block in request.prefix_blocks[len(shared) : full]:
        if pool.insert(block):
            shared.append(block)
            entered += 1
    return entered


def check_paged(requests: Sequence[Request], engine: EngineProfile, capacity: float) -> float:
    """The block pool of a worker under ``engine``'s paged KV, in blocks (inf: no limit).

    Raises:
        ValueError: naming the knobs when ``prefix_block_tokens`` is not a multiple of
            ``kv_block_tokens`` under prefix caching, or naming a request that needs more
            blocks than a worker has (its prompt and every token it emits).
    """
    block = engine.kv_block_tokens
    if engine.prefix_caching and engine.prefix_block_tokens % block:
        raise ValueError(
            f"prefix_block_tokens ({engine.prefix_block_tokens}) must be a multiple of "
            f"kv_block_tokens ({block}) under kv='paged' with prefix caching (engine "
            f"{engine.name!r})"
        )
    blocks = block_capacity(capacity, block)
    if math.isinf(blocks):
        return blocks
    for r in requests:
        need = blocks_for(r.prompt_len + r.output_len - 1, block)
        if need > blocks:
            raise ValueError(
                f"request {r.id!r} needs {need} KV blocks of {block} tokens (prompt_len + "
                f"output_len - 1: the last token's KV is never written) but a worker has "
                f"{blocks} (kv_capacity_tokens // "
                "kv_block_tokens): it can never run"
            )
    return blocks
