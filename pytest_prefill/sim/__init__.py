"""The simulator core: an iteration-level simulator of LLM serving policies — shared worker,
co-scheduled batching, chunked prefill (Sarathi-Serve) and prefill/decode disaggregation
(DistServe) — standard library only. Copy this folder anywhere and ``python path/to/sim``
prints the lab's policy table. The semantics are DESIGN.md's "Simulation semantics"; each point
is pinned by a test, and ``tests/reference_sim.py`` is the same rules written out literally
(slow, one instant at a time): ``simulate()`` must agree with it exactly.

Reading order (no step imports a later one; ``RULES`` and ``SPEED_UPS`` name the two sides
that ``tests/test_structure.py`` keeps apart: no rules module imports a speed-up, no class
subclasses across the line):

1. What a run is given and what it costs: ``requests``, ``checks`` (the input checks every
   entry point shares), ``cost`` and ``presets`` (what one iteration costs), ``profiles`` (the
   engine knobs and the engines' defaults, with their sources), and ``ticks`` (the same costs
   in exact integer time: a speed-up, but everything after counts in it).
2. What a run records: ``events`` (events, and the simulator's log in ticks), ``percentiles``
   (nearest-rank and linear, the one home), ``gaps`` (the token-gap multiset), ``trace``
   (records, summary).
3. The rules — what the next iteration on a worker holds: ``rules`` (:meth:`Worker.compose`,
   in one place, on :class:`BaseWorker`), with ``kv`` (when a request may be admitted) and
   ``tokens`` (who emits which token when); under paged KV, ``paged`` (the block pool, its
   prefix hits and cache entries) and ``paged_worker`` (vLLM's rules: blocks as tokens are
   written, preemption by recompute, prefix cache hits) and ``paged_decode`` (paged KV on a
   split's pools: a prompt's blocks on its prefill worker until sent, a decode worker's blocks
   and preemptions), ``capped_decode`` (a decode pass's rows capped by their KV, as DistServe
   caps them); disaggregation's prefill side, ``prefill_worker`` (passes over a queue, and the
   KV link) and ``dispatch`` (which prefill worker's own queue an arrival joins); ``refusals``
   (the requests whose KV never fits one worker of a pool); ``policies`` (the
   policies, their options and the worker mode of each); ``router`` (which worker gets a
   request: least loaded, or the one holding its longest cached prefix).
4. The speed-ups, kept apart from the rules: ``fastpath`` (any worker's rules timed by the
   cost model; decode runs in closed form; the link timed), ``pool`` (the one loop that
   drives them through time).
5. A run assembled: ``stop`` (the SLO test of one request, and when a run's verdict is
   fixed: :class:`StopRule`), ``prefill_pool`` (disaggregation's prefill side on the loop),
   ``simulation`` (:func:`simulate`: each policy as pools of workers), ``results`` (a
   simulation's compact results).
6. ``oracle`` — every invariant a trace must keep, checked from the trace alone;
   ``oracle_paged`` — its checks of paged KV (prefill attempts, cache hits, blocks in use).
7. ``demo`` — the lab's table.
"""

from __future__ import annotations

from .checks import check_cap, check_int, check_number, check_whole_or_inf
from .cost import CostModel, Piece, attention_pairs, piece_sums, run_first_step, run_step_start
from .demo import lab_table
from .events import KINDS, LINK, Event, EventLog, LogEntry, events_by_resource
from .fastpath import TimedLink, TimedWorker, steps_before
from .gaps import GapMultiset, GapRun
from .kv import KVReserve, kv_capacity, kv_need
from .oracle import check_invariants, close, iteration_cost
from .paged import BlockPool, block_capacity, blocks_for
from .paged_worker import PagedWorker
from .percentiles import (
    check_percentile,
    linear_percentile,
    nearest_rank,
    percentile,
    weighted_linear_percentile,
    weighted_percentile,
)
from .policies import POLICIES, WorkerMode, check_options, worker_mode
from .pool import Pool
from .prefill_pool import PrefillPool, PrefillSide, PrefillTimes
from .prefill_worker import Link, PrefillWorker
from .presets import PRESETS, Preset, get_preset
from .profiles import (
    FIRST_TOKEN_RULES,
    KNOBS,
    KV_RULES,
    LAB,
    PROFILES,
    EngineProfile,
    get_profile,
    resolve_engine,
)
from .refusals import Unfit, never_fit
from .requests import Request, in_arrival_order, validate_load
from .results import SimResults
from .router import ROUTERS, LeastLoaded, PrefixRouter
from .rules import MODES, BaseWorker, Plan, Price, Worker, takes_whole
from .simulation import (
    colocated,
    disaggregated,
    disaggregated_prefill,
    simulate,
    simulated_engine,
)
from .stop import StopRule, Watch, check_bounds, meets, slo_values, stated_bounds, within
from .ticks import TICKS_PER_SECOND, TickCost, from_ticks, to_ticks
from .tokens import TokenBook
from .trace import CompactRun, RequestRecord, Summary, Trace, no_collection, record_gaps

token_gaps = record_gaps  # the old name, kept for one release (it clashed with Trace.token_gaps())

RULES = (
    "kv",
    "tokens",
    "rules",
    "paged",
    "paged_worker",
    "paged_decode",
    "prefill_worker",
    "dispatch",
    "policies",
    "router",
)
SPEED_UPS = ("ticks", "fastpath", "pool")

__all__ = [
    "within",
    "check_bounds",
    "stated_bounds",
    "slo_values",
    "meets",
    "Watch",
    "StopRule",
    "takes_whole",
    "BaseWorker",
    "PrefillWorker",
    "Link",
    "TimedLink",
    "record_gaps",
    "weighted_linear_percentile",
    "linear_percentile",
    "check_percentile",
    "run_step_start",
    "run_first_step",
    "FIRST_TOKEN_RULES",
    "KINDS",
    "KNOBS",
    "KV_RULES",
    "LAB",
    "LINK",
    "MODES",
    "POLICIES",
    "PRESETS",
    "PROFILES",
    "ROUTERS",
    "TICKS_PER_SECOND",
    "CompactRun",
    "CostModel",
    "EngineProfile",
    "Event",
    "EventLog",
    "GapMultiset",
    "GapRun",
    "BlockPool",
    "PagedWorker",
    "KVReserve",
    "LeastLoaded",
    "LogEntry",
    "Piece",
    "Plan",
    "Pool",
    "PrefillPool",
    "PrefillSide",
    "PrefillTimes",
    "PrefixRouter",
    "Preset",
    "Price",
    "Request",
    "RequestRecord",
    "SimResults",
    "Summary",
    "TickCost",
    "TimedWorker",
    "TokenBook",
    "Trace",
    "Unfit",
    "Worker",
    "WorkerMode",
    "attention_pairs",
    "block_capacity",
    "blocks_for",
    "check_cap",
    "check_int",
    "check_invariants",
    "check_number",
    "check_options",
    "check_whole_or_inf",
    "close",
    "colocated",
    "disaggregated",
    "disaggregated_prefill",
    "events_by_resource",
    "from_ticks",
    "get_preset",
    "get_profile",
    "iteration_cost",
    "kv_capacity",
    "kv_need",
    "lab_table",
    "never_fit",
    "nearest_rank",
    "no_collection",
    "percentile",
    "piece_sums",
    "resolve_engine",
    "simulate",
    "simulated_engine",
    "steps_before",
    "to_ticks",
    "token_gaps",
    "validate_load",
    "in_arrival_order",
    "weighted_percentile",
    "worker_mode",
]
