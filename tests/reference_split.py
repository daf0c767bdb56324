"""The reference simulator's disaggregation under paged KV (DESIGN.md, "Engine semantics (v3)",
KV memory), one iteration at a time, each pool's blocks counted on its own:

- a prefill worker admits a prompt when the blocks of its tokens the prefix cache does not
  supply fit (evicting the least recently freed cached block no one shares); it holds them
  until its KV has crossed the link (or, one token in all, until its pass ends);
- a decode worker takes a request (a sequence slot, kept while it is preempted) when its KV
  arrives, and at the next boundary at which no preempted request waits the blocks of its
  prompt and the tokens emitted so far, FCFS (else it waits: an arrival never preempts); then
  it decodes as :class:`~reference_paged.Paged`'s rows do, a preempted request prefilling its
  prompt and emitted tokens again there, fused with the rows. No prefix cache on a decode
  worker (it lives on the prefill workers)."""

from __future__ import annotations

from collections import deque

from reference_paged import Paged

from pytest_prefill.sim import TickCost


class PagedSplit(Paged):
    """Disaggregation under paged KV: ``cap`` blocks per prefill worker, ``decode_cap`` per
    decode worker (inf: no limit); ``decode_k``: the decode pool's constants and fusion penalty."""

    def __init__(self, cost, engine, decode_cost=None):
        super().__init__(cost, None, engine)
        self.decode_cap = self.cap
        self.prefill_k = self.k, self.pen
        devices = cost if decode_cost is None else decode_cost
        self.decode_k = TickCost(devices), devices.fusion_penalty.as_integer_ratio()
        self.arrived: dict[str, deque] = {}  # decode worker -> KV arrived, no blocks yet

    def cap_of(self, w):
        return self.decode_cap if w.name.startswith("decode") else self.cap

    # -- the prefill pool --------------------------------------------------------------------
    def prompt_fits(self, w, r):
        hits = self.prefill_hits(w, r) // self.E
        ids = list(r.prefix_blocks[:hits])
        return w.admitted < self.S and self.room(w, keep=ids) >= self.blocks(
            r.prompt_len - hits * self.E
        )

    def hold_prompt(self, w, r):
        ids = list(r.prefix_blocks[: self.prefill_hits(w, r) // self.E])
        for k in ids:
            w.cache[k][0] += 1
        self.clock += 1
        w.adm[r.id] = {"r": r, "own": 0, "shared": ids, "seq": self.clock}
        w.admitted += 1
        assert self.alloc(w, r, r.prompt_len), "a prompt admitted without room"

    def prefilled(self, w, r):
        if self.caching:
            self.enter_cache(w, r)

    def sent(self, w, r):
        self.release(w, r)

    # -- the decode pool ---------------------------------------------------------------------
    def decode_fits(self, w, r):
        return w.routed < self.S  # a slot: every request routed here and not finished

    def join(self, w, r):
        self.arrived.setdefault(w.name, deque()).append(r)

    def compose(self, w, mode, t):
        arrived = self.arrived.setdefault(w.name, deque())
        while arrived and not w.pending:
            r = arrived[0]
            need = self.blocks(r.prompt_len + self.emitted[r.id])
            if self.cap_of(w) - self.used(w) < need:
                break
            arrived.popleft()
            self.clock += 1
            w.adm[r.id] = {"r": r, "own": need, "shared": [], "seq": self.clock}
            w.admitted += 1
            w.joining.append(r)
        return super().compose(w, mode, t)

    def start(self, w, mode, t):
        (self.k, self.pen), caching, self.caching = self.decode_k, self.caching, False
        super().start(w, mode, t)  # timed on the decode pool's devices, no prefix cache
        (self.k, self.pen), self.caching = self.prefill_k, caching

    def end(self, w, t):
        caching, self.caching = self.caching, False
        super().end(w, t)
        self.caching = caching
