"""Deployments a capacity search compares on N devices: shared, co-scheduled or chunked
replicas (one per device), or a prefill pool and a decode pool, each with the engine's own
settings (its token budget and sequence cap); and the default set under an engine profile.
Standard library only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from pytest_prefill.plan.advice import MIN_USEFUL_CHUNK, typical_star
from pytest_prefill.plan.engine_commands import (
    ENGINE_DEFAULTS,
    LaunchSettings,
    engine_command,
    launch_line,
    pool_line,
    refusal,
    splits,
)
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.plan.pools import PoolSplit
from pytest_prefill.sim import (
    LAB,
    POLICIES,
    CostModel,
    EngineProfile,
    check_cap,
    check_int,
    check_number,
)
from pytest_prefill.units import duration_label

FALLBACK_CHUNKS = (64, 256, 1024)  # chunks tried when C* gives no usable size
FALLBACK_BUDGETS = (512, 2048, 8192)  # token budgets tried when C* gives no usable size


@dataclasses.dataclass(frozen=True, slots=True)
class Deployment:
    """How ``devices`` devices serve: ``shared``/``coscheduled``/``chunked`` run one replica per
    device (the router sends each request to the replica with the fewest unfinished ones);
    ``disaggregated`` runs ``prefill_workers`` prefill and the rest decode workers.
    ``chunked`` takes a ``chunk`` (tokens) or a ``chunk_budget`` (seconds per iteration), or
    neither when it sets the engine's token budget. ``max_batched_tokens`` and ``max_seqs`` are
    the engine's settings for this deployment (vLLM's ``--max-num-batched-tokens`` and
    ``--max-num-seqs``; None: the engine profile's own), every worker's. ``tp`` is every
    instance's tensor-parallel size: ``devices`` = instances × ``tp`` (a split's
    ``prefill_workers`` counts instances). ``cost`` is one instance's cost model on this
    deployment's hardware at this TP (its compute and KV capacity; None: the search's own).

    Raises:
        ValueError: naming the field, for an unknown policy, devices < 1, a chunk or budget on
            a policy that takes none (both, or none of them and no token budget, on
            ``chunked``), a setting that is not an integer >= 1, a ``tp`` that does not divide
            the devices, or a split that does not leave at least one worker of each kind.
    """

    policy: str
    devices: int
    chunk: int | None = None
    chunk_budget: float | None = None
    prefill_workers: int | None = None
    max_batched_tokens: int | None = None
    max_seqs: int | None = None
    tp: int = 1
    cost: CostModel | None = None
    pools: PoolSplit | None = None
    decode_cost: CostModel | None = None
    kind: str | None = None  # a colocated deployment's device kind (a catalog key), when named

    def __post_init__(self) -> None:
        self._check_pools()
        if self.kind is not None and (not isinstance(self.kind, str) or self.pools is not None):
            raise ValueError("kind names a colocated deployment's device kind (a split: pools)")
        if self.policy not in POLICIES:
            raise ValueError(
                f"deployment policy must be one of {', '.join(POLICIES)}, got {self.policy!r}"
            )
        check_int("devices", self.devices)
        check_cap("max_batched_tokens", self.max_batched_tokens)
        check_cap("max_seqs", self.max_seqs)
        check_int("tp", self.tp)
        if self.devices % self.tp:
            raise ValueError(
                f"tp={self.tp} does not divide the {self.devices} devices (devices = instances "
                "× tp)"
            )
        if self.cost is not None and not isinstance(self.cost, CostModel):
            raise ValueError(f"cost must be a CostModel or None, got {type(self.cost).__name__}")
        chunked = self.policy == "chunked"
        if chunked and self.chunk is not None and self.chunk_budget is not None:
            raise ValueError(
                "a chunked deployment needs a chunk (tokens) or a chunk_budget (s), not both"
            )
        if chunked and self.max_batched_tokens is None and self.chunk is self.chunk_budget is None:
            raise ValueError(
                "a chunked deployment needs a chunk (tokens), a chunk_budget (s) or "
                "max_batched_tokens (the engine's token budget)"
            )
        if not chunked and (self.chunk is not None or self.chunk_budget is not None):
            raise ValueError(
                f"chunk and chunk_budget apply to chunked deployments, not {self.policy!r}"
            )
        if self.chunk is not None:
            check_int("chunk", self.chunk)
        if self.chunk_budget is not None:
            check_number("chunk_budget", self.chunk_budget, positive=True)
        if self.policy == "disaggregated":
            if self.instances < 2:
                raise ValueError(
                    "a disaggregated deployment needs devices >= 2 (one prefill, one decode)"
                    + (f" instances of tp={self.tp} devices" if self.tp > 1 else "")
                )
            check_int("prefill_workers", self.prefill_workers)
            assert self.prefill_workers is not None
            if self.prefill_workers >= self.instances:
                raise ValueError(
                    f"prefill_workers must leave a decode worker: 1 <= prefill_workers <= "
                    f"{self.instances - 1}, got {self.prefill_workers!r}"
                )
        elif self.prefill_workers is not None:
            raise ValueError(
                f"prefill_workers applies to disaggregated deployments, not {self.policy!r}"
            )

    def _check_pools(self) -> None:
        """A split of pools of their own (:mod:`.pools`): disaggregated, ``tp`` 1 (each pool
        has its own), its devices and prefill instances the pools'; ``decode_cost`` (the decode
        pool's cost model) only on a split."""
        if self.decode_cost is not None:
            if not isinstance(self.decode_cost, CostModel):
                raise ValueError(
                    f"decode_cost must be a CostModel or None, got {type(self.decode_cost).__name__}"
                )
            if self.policy != "disaggregated":
                raise ValueError(
                    f"decode_cost applies to disaggregated deployments, not {self.policy!r}"
                )
        pools = self.pools
        if pools is None:
            return
        if not isinstance(pools, PoolSplit) or self.policy != "disaggregated" or self.tp != 1:
            raise ValueError("pools (a PoolSplit) go with policy 'disaggregated' and tp 1")
        total = pools.prefill.devices + pools.decode.devices
        if self.devices != total or self.prefill_workers != pools.prefill.instances:
            raise ValueError(
                f"deployment {pools.label}: devices must be its {total} and prefill_workers its "
                f"{pools.prefill.instances}, got {self.devices} and {self.prefill_workers}"
            )

    @classmethod
    def of_pools(
        cls, pools: PoolSplit, cost: CostModel, decode_cost: CostModel, **settings: Any
    ) -> Deployment:
        """The split ``pools`` with its prefill pool's ``cost`` (carrying the KV link) and its
        decode pool's ``decode_cost`` (:meth:`PoolSplit.costs` makes both), and the engine's
        ``settings`` (``max_batched_tokens``, ``max_seqs``)."""
        devices = pools.prefill.devices + pools.decode.devices
        return cls(
            "disaggregated",
            devices,
            prefill_workers=pools.prefill.instances,
            cost=cost,
            pools=pools,
            decode_cost=decode_cost,
            **settings,
        )

    @property
    def instances(self) -> int:
        """Engine instances (replicas, or a split's prefill and decode ones): devices ÷ tp."""
        return self.devices // self.tp

    @property
    def decode_workers(self) -> int:
        if self.pools is not None:
            return self.pools.decode.instances
        return self.instances - (self.prefill_workers or 0)

    def cost_on(self, cost: CostModel) -> CostModel:
        """The cost model this deployment's instances run on: its own, else ``cost``."""
        return self.cost if self.cost is not None else cost

    @property
    def label(self) -> str:
        """``shared ×4``, ``chunked 512 ×4``, ``chunked ≤100ms ×4``, ``disaggregated 1P:3D``;
        with engine settings ``chunked ≤2048 tok ×4``, ``disaggregated 1P:3D ≤8192 tok``, and
        ``, ≤128 seqs`` after either; at TP 2 ``chunked ≤2048 tok ×2 TP2`` (two instances of
        two devices each) and ``disaggregated 1P:1D TP2``."""
        tokens = self.max_batched_tokens
        settings = f"≤{tokens} tok" if tokens is not None else ""
        seqs = f", ≤{self.max_seqs} seqs" if self.max_seqs is not None else ""
        tp = f" TP{self.tp}" if self.tp > 1 else ""
        if self.policy == "disaggregated":
            split = f"disaggregated {self.prefill_workers}P:{self.decode_workers}D{tp}"
            if self.pools is not None:
                split = self.pools.label
            return f"{split} {settings}{seqs}" if settings else split + seqs
        if self.chunk is not None:
            head = f"chunked {self.chunk}" + (f" {settings}" if settings else "")
        elif self.chunk_budget is not None:
            head = f"chunked ≤{duration_label(self.chunk_budget)}"
        else:
            head = f"{self.policy} {settings}" if settings else self.policy
        kind = f" {self.kind}" if self.kind is not None else ""
        return f"{head} ×{self.instances}{kind}{tp}{seqs}"

    def engine(self, profile: EngineProfile = LAB) -> EngineProfile:
        """``profile`` with this deployment's settings in place of its own."""
        if self.max_batched_tokens is None and self.max_seqs is None:
            return profile
        return dataclasses.replace(
            profile,
            max_batched_tokens=self.max_batched_tokens or profile.max_batched_tokens,
            max_seqs=self.max_seqs or profile.max_seqs,
        )

    def command(
        self, profile: EngineProfile = LAB, settings: LaunchSettings = ENGINE_DEFAULTS
    ) -> str:
        """The line to type for this deployment under ``profile`` (its engine, its flags, its
        TP) with ``settings`` (the fraction of device memory it takes, the model it serves and
        the longest sequence it takes, those given)."""
        engine = self.engine(profile)
        if self.pools is not None:  # one command per pool, a line each
            return "\n".join(
                f"{pool.role} pool, {pool.kind}: "
                + pool_line(engine, pool.role, pool.instances, pool.tp, settings)
                for pool in (self.pools.prefill, self.pools.decode)
            )
        on = f"on {self.kind}: " if self.kind is not None else ""
        return on + launch_line(engine, self.prefill_workers, self.instances, self.tp, settings)

    def simulate_options(self, profile: EngineProfile | None = None) -> dict[str, Any]:
        """The keyword arguments of :func:`~pytest_prefill.sim.simulate` (defaults left out;
        ``engine`` only when a ``profile`` is given: it, with this deployment's settings)."""
        knobs = self.max_batched_tokens is not None or self.max_seqs is not None
        engine = {} if profile is None and not knobs else {"engine": self.engine(profile or LAB)}
        if self.policy == "disaggregated":
            workers = {"prefill_workers": self.prefill_workers}
            own = {} if self.decode_cost is None else {"decode_cost": self.decode_cost}
            return {**workers, "decode_workers": self.decode_workers, **engine, **own}
        options: dict[str, Any] = dict(engine)
        if self.chunk is not None:
            options["chunk"] = self.chunk
        if self.chunk_budget is not None:
            options["chunk_budget"] = float(self.chunk_budget)
        if self.instances > 1:
            options["replicas"] = self.instances
        return options

    def to_dict(self) -> dict[str, Any]:
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["cost"] = self.cost.to_dict() if self.cost is not None else None
        fields["decode_cost"] = self.decode_cost.to_dict() if self.decode_cost is not None else None
        fields["pools"] = (
            None
            if self.pools is None
            else {
                p.role: {"kind": p.kind, "tp": p.tp, "instances": p.instances}
                for p in (self.pools.prefill, self.pools.decode)
            }
        )
        return {"label": self.label, **fields}

    @classmethod
    def parse(cls, text: str, devices: int, engine: EngineProfile | None = None) -> Deployment:
        """``shared``, ``coscheduled``, ``chunked:512`` (tokens), ``chunked:100ms`` (a budget),
        ``disaggregated:1:3`` (prefill:decode workers, summing to ``devices``), each optionally
        followed by the engine's settings ``,tokens=N`` (its token budget) and ``,seqs=N`` (its
        sequence cap) and the tensor-parallel size ``,tp=N`` (``disaggregated:1:3,tp=2``: P:D
        instances of N devices each): ``chunked,tokens=2048,tp=2``. Under an ``engine`` with a
        token budget a bare ``chunked`` takes that budget.

        Raises:
            ValueError: naming what is allowed, for anything else.
        """
        spec, *extra = str(text).strip().split(",")
        settings = cls._parse_settings(text, extra)
        policy, _, rest = spec.strip().partition(":")
        if policy == "chunked" and not rest and engine is not None:
            settings.setdefault("max_batched_tokens", engine.max_batched_tokens)
        tp = settings.pop("tp", 1)
        if tp is None or tp < 1:
            raise ValueError(f"deployment {text!r}: tp must be an integer >= 1, got {tp}")
        if devices % tp:
            raise ValueError(
                f"deployment {text!r}: tp={tp} does not divide the {devices} devices "
                "(devices = instances × tp)"
            )
        tokens = settings.get("max_batched_tokens")
        base = cls._parse_base(text, policy, rest, devices // tp, tokens)
        seqs = settings.get("max_seqs")
        return dataclasses.replace(
            base,
            devices=devices,
            tp=tp,
            max_batched_tokens=tokens if tokens is not None else base.max_batched_tokens,
            max_seqs=seqs if seqs is not None else base.max_seqs,
        )

    @classmethod
    def _parse_base(
        cls, text: str, policy: str, rest: str, devices: int, tokens: int | None
    ) -> Deployment:
        allowed = (
            "shared, coscheduled, chunked:TOKENS, chunked:DURATION, disaggregated:P:D "
            "(then ,tokens=N ,seqs=N ,tp=N)"
        )
        if policy == "disaggregated" and rest:
            return cls._parse_split(text, rest, devices)
        if policy == "chunked" and rest:
            if rest.isascii() and rest.isdigit():
                return cls("chunked", devices, chunk=int(rest))
            try:
                budget = SLO.parse(f"tpot:{rest}").tpot
            except ValueError:
                raise ValueError(
                    f"deployment {text!r}: chunked takes TOKENS or a duration like 100ms"
                ) from None
            return cls("chunked", devices, chunk_budget=budget)
        if policy in ("shared", "coscheduled") and not rest:
            return cls(policy, devices)
        if policy == "chunked" and tokens is not None:  # the token budget is its size
            return cls("chunked", devices, max_batched_tokens=tokens)
        if policy in ("chunked", "disaggregated") and not rest:
            example = "chunked:512 or chunked:100ms" if policy == "chunked" else "disaggregated:1:3"
            raise ValueError(f"deployment {text!r} needs its size, e.g. {example}")
        raise ValueError(f"unknown deployment {text!r}; allowed: {allowed}")

    @staticmethod
    def _parse_settings(text: str, extra: Sequence[str]) -> dict[str, int | None]:
        """``tokens=N`` and ``seqs=N`` as the deployment's engine knobs, ``tp=N`` its TP."""
        knobs = {"tokens": "max_batched_tokens", "seqs": "max_seqs", "tp": "tp"}
        out: dict[str, int | None] = {}
        for item in extra:
            key, sep, value = item.strip().partition("=")
            if not sep or key.strip() not in knobs or not (value.isascii() and value.isdigit()):
                raise ValueError(
                    f"deployment {text!r}: after a comma, tokens=N (the engine's token budget), "
                    f"seqs=N (its sequence cap) or tp=N (tensor-parallel size), got "
                    f"{item.strip()!r}"
                )
            out[knobs[key.strip()]] = int(value)
        return out

    @classmethod
    def _parse_split(cls, text: str, rest: str, devices: int) -> Deployment:
        parts = [p.strip().upper().removesuffix("P").removesuffix("D") for p in rest.split(":")]
        if len(parts) != 2 or not all(p.isascii() and p.isdigit() for p in parts):
            raise ValueError(
                f"deployment {text!r}: disaggregated takes P:D, e.g. disaggregated:1:3"
            )
        prefill, decode = int(parts[0]), int(parts[1])
        if prefill + decode != devices:
            raise ValueError(
                f"deployment {text!r}: {prefill}P + {decode}D is not the {devices} devices"
            )
        return cls("disaggregated", devices, prefill_workers=prefill)


MAX_SPLITS = 15


def search_chunks(cost: CostModel) -> tuple[int, ...]:
    """Chunks around C*: half, C* and double (rounded); ``FALLBACK_CHUNKS`` when C* is under
    advice's ``MIN_USEFUL_CHUNK`` or infinite (no chunk is free, or every chunk is)."""
    star = cost.chunk_star()
    if not MIN_USEFUL_CHUNK <= star < math.inf:
        return FALLBACK_CHUNKS
    return tuple(sorted({max(1, round(star * f)) for f in (0.5, 1.0, 2.0)}))


def search_budgets(cost: CostModel, profile: EngineProfile) -> tuple[int, ...]:
    """Token budgets (vLLM's ``max_num_batched_tokens``) around the one chunk rule's C* (at
    the end of a typical prompt, :func:`~pytest_prefill.plan.advice.typical_star`): the powers
    of two nearest half, C* and double it, and the profile's own budget (a budget holds the
    decode rows too; the chunk is what they leave). ``FALLBACK_BUDGETS`` when C* is no size."""
    star = typical_star(cost)
    if MIN_USEFUL_CHUNK <= star < math.inf:
        budgets = {2 ** round(math.log2(star * f)) for f in (0.5, 1.0, 2.0)}
    else:
        budgets = set(FALLBACK_BUDGETS)
    if profile.max_batched_tokens is not None:
        budgets.add(profile.max_batched_tokens)
    return tuple(sorted(budgets))


def default_deployments(
    cost: CostModel,
    devices: int,
    slo: SLO | None = None,
    engine: EngineProfile = LAB,
    tp: int = 1,
) -> tuple[Deployment, ...]:
    """What an ``engine`` can be told to run on ``devices`` devices as instances of ``tp``
    devices each (``cost`` is one instance's), in its own settings:

    - with a token budget (vLLM, SGLang, llama.cpp, transformers): chunked ×N at each of
      :func:`search_budgets`;
    - the lab: shared ×N; chunked ×N at :func:`search_chunks` and, with a TPOT bound, with that
      bound as its ``chunk_budget`` (the only profile with a time budget);
    - DistServe: shared ×N (its colocated baseline, no chunking);

    and, for an engine that runs prefill:decode splits, the splits of :func:`default_splits`
    (at the profile's own token budget). A kind the simulator refuses under ``engine`` (e.g.
    a split with paged KV, not simulated yet) is left out (:func:`refused_kinds` says why)."""
    check_int("devices", devices)
    kinds = engine_command(engine).kinds
    out = []
    if "shared" in kinds:
        out.append(Deployment("shared", devices, tp=tp))
    if "chunks" in kinds:
        out += [Deployment("chunked", devices, chunk=c, tp=tp) for c in search_chunks(cost)]
        if slo is not None and slo.tpot is not None:
            out.append(Deployment("chunked", devices, chunk_budget=slo.tpot, tp=tp))
    if "budgets" in kinds:
        out += [
            Deployment("chunked", devices, max_batched_tokens=b, tp=tp)
            for b in search_budgets(cost, engine)
        ]
    if splits(engine) and devices // tp > 1:
        tokens = engine.max_batched_tokens
        out += [
            Deployment(
                "disaggregated", devices, prefill_workers=p, max_batched_tokens=tokens, tp=tp
            )
            for p in default_splits(devices // tp)
        ]
    refused = refused_kinds(out, engine, cost)
    return tuple(d for d in out if _kind(d) not in refused)


def _kind(deployment: Deployment) -> str:
    return "chunked ≤time" if deployment.chunk_budget is not None else deployment.policy


def refused_kinds(
    deployments: Sequence[Deployment], engine: EngineProfile, cost: CostModel | None = None
) -> dict[str, str]:
    """The kinds among ``deployments`` (policies; a time budget apart) the simulator refuses
    under ``engine`` on ``cost`` (default: a preset with unbounded KV), each with its
    reason."""
    out: dict[str, str] = {}
    for d in deployments:
        kind = _kind(d)
        if kind not in out:
            options = d.simulate_options(engine)
            options.pop("replicas", None)
            reason = refusal(d.policy, options.pop("engine"), cost, **options)
            if reason is not None:
                out[kind] = reason
    return {k: v for k, v in out.items() if v}


def deployments_like(
    deployments: Sequence[Deployment],
    devices: int,
    cost: CostModel,
    slo: SLO | None = None,
    engine: EngineProfile = LAB,
) -> tuple[Deployment, ...]:
    """The kinds of ``deployments`` on ``devices`` devices (for the devices a traffic needs):
    each colocated one as ``devices`` replicas, and, when any is disaggregated, every P:D split
    of :func:`default_splits` (none on one device) with the first split's settings. ``cost``,
    ``slo`` and ``engine`` are :func:`default_deployments`' for no deployments at all."""
    check_int("devices", devices)
    if not deployments:
        return default_deployments(cost, devices, slo, engine)
    out: dict[str, Deployment] = {}
    for d in deployments:
        if d.policy != "disaggregated" and devices % d.tp == 0:
            moved = dataclasses.replace(d, devices=devices)
            out.setdefault(moved.label, moved)
    given = [d for d in deployments if d.policy == "disaggregated" and devices % d.tp == 0]
    if given and devices // given[0].tp > 1:
        for p in default_splits(devices // given[0].tp):
            split = dataclasses.replace(given[0], devices=devices, prefill_workers=p)
            out.setdefault(split.label, split)
    return tuple(out.values())


def default_splits(devices: int) -> tuple[int, ...]:
    """The prefill workers of the P:D splits a search compares by default: every split up to
    ``MAX_SPLITS`` + 1 devices; beyond, ``MAX_SPLITS`` of them spread evenly over the P:D ratio
    on a log scale, from 1:N-1 to N-1:1 (each split is a search of its own, and a thousand
    devices would otherwise take a thousand searches)."""
    check_int("devices", devices)
    if devices - 1 <= MAX_SPLITS:
        return tuple(range(1, devices))
    low, high = math.log(1 / (devices - 1)), math.log(devices - 1)
    ratios = (math.exp(low + (high - low) * i / (MAX_SPLITS - 1)) for i in range(MAX_SPLITS))
    return tuple(sorted({min(devices - 1, max(1, round(devices * r / (1 + r)))) for r in ratios}))
