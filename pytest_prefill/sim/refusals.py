"""The requests an engine refuses: those whose KV can never fit one worker of a pool, however
idle (DESIGN.md, "Engine semantics (v3)", KV memory). vLLM will not serve a sequence longer
than its KV cache holds (it refuses to start with a ``max_model_len`` above it, and a server
started with a smaller one rejects the longer request): such a request is never served, and a
capacity search counts it as missed rather than stopping on it. :func:`simulate` itself
refuses a load holding one (ValueError naming it); :func:`never_fit` names them beforehand.

The rule is the simulator's own admission check, per pool: under paged KV a request needs
the blocks of its prompt and every token it emits but the last (whose KV is never written),
under the reserve rule its prompt and every output token; a disaggregated run checks it on
the prefill pool's devices and on the decode pool's (its own, when it has them)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

from .cost import CostModel
from .kv import kv_need
from .paged import block_capacity, blocks_for
from .profiles import EngineProfile
from .requests import Request


class Unfit(NamedTuple):
    """A request whose KV (``need`` tokens, whole blocks under paged KV) is more than one
    worker of ``pool`` (``"worker"``, ``"prefill"`` or ``"decode"``) holds (``have`` tokens)."""

    id: str
    pool: str
    need: int
    have: int


def kv_room(capacity: float, engine: EngineProfile) -> float:
    """The KV tokens one worker holds under ``engine``'s rule: whole blocks under paged KV,
    whole tokens under the reserve rule (inf: no limit)."""
    if math.isinf(capacity):
        return capacity
    if engine.kv == "paged":
        block = engine.kv_block_tokens
        return int(block_capacity(capacity, block)) * block
    return int(capacity)


def kv_tokens(r: Request, engine: EngineProfile) -> int:
    """The KV tokens ``r`` needs at once on a worker under ``engine``'s rule."""
    if engine.kv == "paged":
        block = engine.kv_block_tokens
        return blocks_for(r.prompt_len + r.output_len - 1, block) * block
    return kv_need(r)


def never_fit(
    load: Iterable[Request],
    cost: CostModel,
    engine: EngineProfile,
    decode_cost: CostModel | None = None,
    disaggregated: bool = False,
) -> tuple[Unfit, ...]:
    """The requests of ``load`` (in its order) that one worker can never hold, each with the
    first pool it does not fit: ``cost``'s workers (the prefill pool's when
    ``disaggregated``), then the decode pool's on ``decode_cost`` (default: ``cost``)."""
    pools = [("prefill" if disaggregated else "worker", cost.kv_capacity_tokens)]
    if disaggregated:
        pools.append(("decode", (decode_cost or cost).kv_capacity_tokens))
    rooms = [(name, kv_room(capacity, engine)) for name, capacity in pools]
    out = []
    for r in load:
        need = kv_tokens(r, engine)
        for name, room in rooms:
            if need > room:
                out.append(Unfit(r.id, name, need, int(room)))
                break
    return tuple(out)
