"""Deployments a capacity search compares on N devices: shared, co-scheduled or chunked
replicas (one per device), or a prefill pool and a decode pool; and the default set. Standard
library only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from pytest_prefill.plan.advice import MIN_USEFUL_CHUNK
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.sim import POLICIES, CostModel, check_int, check_number
from pytest_prefill.units import duration_label

FALLBACK_CHUNKS = (64, 256, 1024)  # chunks tried when C* gives no usable size


@dataclasses.dataclass(frozen=True, slots=True)
class Deployment:
    """How ``devices`` devices serve: ``shared``/``coscheduled``/``chunked`` run one replica per
    device (the router sends each request to the replica with the fewest unfinished ones);
    ``disaggregated`` runs ``prefill_workers`` prefill and the rest decode workers.
    ``chunked`` takes a ``chunk`` (tokens) or a ``chunk_budget`` (seconds per iteration).

    Raises:
        ValueError: naming the field, for an unknown policy, devices < 1, a chunk or budget on
            a policy that takes none (or neither/both on ``chunked``), or a split that does not
            leave at least one worker of each kind.
    """

    policy: str
    devices: int
    chunk: int | None = None
    chunk_budget: float | None = None
    prefill_workers: int | None = None

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(
                f"deployment policy must be one of {', '.join(POLICIES)}, got {self.policy!r}"
            )
        check_int("devices", self.devices)
        chunked = self.policy == "chunked"
        if chunked and (self.chunk is None) == (self.chunk_budget is None):
            raise ValueError(
                "a chunked deployment needs a chunk (tokens) or a chunk_budget (s), not both"
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
            if self.devices < 2:
                raise ValueError(
                    "a disaggregated deployment needs devices >= 2 (one prefill, one decode)"
                )
            check_int("prefill_workers", self.prefill_workers)
            assert self.prefill_workers is not None
            if self.prefill_workers >= self.devices:
                raise ValueError(
                    f"prefill_workers must leave a decode worker: 1 <= prefill_workers <= "
                    f"{self.devices - 1}, got {self.prefill_workers!r}"
                )
        elif self.prefill_workers is not None:
            raise ValueError(
                f"prefill_workers applies to disaggregated deployments, not {self.policy!r}"
            )

    @property
    def decode_workers(self) -> int:
        return self.devices - (self.prefill_workers or 0)

    @property
    def label(self) -> str:
        """``shared ×4``, ``chunked 512 ×4``, ``chunked ≤100ms ×4``, ``disaggregated 1P:3D``."""
        if self.policy == "disaggregated":
            return f"disaggregated {self.prefill_workers}P:{self.decode_workers}D"
        if self.chunk is not None:
            return f"chunked {self.chunk} ×{self.devices}"
        if self.chunk_budget is not None:
            return f"chunked ≤{duration_label(self.chunk_budget)} ×{self.devices}"
        return f"{self.policy} ×{self.devices}"

    def simulate_options(self) -> dict[str, Any]:
        """The keyword arguments of :func:`~pytest_prefill.scheduler.simulate` (defaults left
        out)."""
        if self.policy == "disaggregated":
            return {"prefill_workers": self.prefill_workers, "decode_workers": self.decode_workers}
        options: dict[str, Any] = {}
        if self.chunk is not None:
            options["chunk"] = self.chunk
        if self.chunk_budget is not None:
            options["chunk_budget"] = float(self.chunk_budget)
        if self.devices > 1:
            options["replicas"] = self.devices
        return options

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
        }

    @classmethod
    def parse(cls, text: str, devices: int) -> Deployment:
        """``shared``, ``coscheduled``, ``chunked:512`` (tokens), ``chunked:100ms`` (a budget),
        ``disaggregated:1:3`` (prefill:decode workers, summing to ``devices``).

        Raises:
            ValueError: naming what is allowed, for anything else.
        """
        allowed = "shared, coscheduled, chunked:TOKENS, chunked:DURATION, disaggregated:P:D"
        policy, _, rest = str(text).strip().partition(":")
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
        if policy in ("chunked", "disaggregated") and not rest:
            example = "chunked:512 or chunked:100ms" if policy == "chunked" else "disaggregated:1:3"
            raise ValueError(f"deployment {text!r} needs its size, e.g. {example}")
        raise ValueError(f"unknown deployment {text!r}; allowed: {allowed}")

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


def default_deployments(
    cost: CostModel, devices: int, slo: SLO | None = None
) -> tuple[Deployment, ...]:
    """Shared ×N; chunked ×N at :func:`search_chunks` and, with a TPOT bound, with that bound as
    its ``chunk_budget``; disaggregated at the P:D splits of :func:`default_splits`."""
    check_int("devices", devices)
    out = [Deployment("shared", devices)]
    out += [Deployment("chunked", devices, chunk=c) for c in search_chunks(cost)]
    if slo is not None and slo.tpot is not None:
        out.append(Deployment("chunked", devices, chunk_budget=slo.tpot))
    out += [
        Deployment("disaggregated", devices, prefill_workers=p) for p in default_splits(devices)
    ]
    return tuple(out)


def deployments_like(
    deployments: Sequence[Deployment], devices: int, cost: CostModel, slo: SLO | None = None
) -> tuple[Deployment, ...]:
    """The kinds of ``deployments`` on ``devices`` devices (for the devices a traffic needs):
    each colocated one as ``devices`` replicas, and, when any is disaggregated, every P:D split
    of :func:`default_splits` (none on one device). ``cost`` and ``slo`` are
    :func:`default_deployments`' for no deployments at all."""
    check_int("devices", devices)
    if not deployments:
        return default_deployments(cost, devices, slo)
    out: dict[str, Deployment] = {}
    for d in deployments:
        if d.policy != "disaggregated":
            moved = dataclasses.replace(d, devices=devices)
            out.setdefault(moved.label, moved)
    if devices > 1 and any(d.policy == "disaggregated" for d in deployments):
        for p in default_splits(devices):
            split = Deployment("disaggregated", devices, prefill_workers=p)
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
