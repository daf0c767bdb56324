"""The search across device kinds (``capacity --gpu h100,h200,l40s``): the deployments to
compare within a device budget per kind — each kind colocated on its whole budget, and every
P:D split of pools of their own (:mod:`.pools`), same kind or mixed, within the budgets."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from pytest_prefill.plan.compute.devices import device_named
from pytest_prefill.plan.pools import PoolSpec, PoolSplit


@dataclasses.dataclass(frozen=True, slots=True)
class Colocated:
    """``replicas`` colocated instances of ``tp`` devices of ``kind``."""

    kind: str
    replicas: int
    tp: int

    @property
    def devices_by_kind(self) -> dict[str, int]:
        return {self.kind: self.replicas * self.tp}

    @property
    def label(self) -> str:
        tp = f" TP{self.tp}" if self.tp > 1 else ""
        return f"colocated ×{self.replicas} {self.kind}{tp}"


def check_budget(budget: Mapping[str, int], tp: Mapping[str, int]) -> dict[str, int]:
    """``budget`` (devices per kind) by catalog key.

    Raises:
        ValueError: in one line, for an unknown kind, a count < 1, a kind whose TP is not
            an integer >= 1 or exceeds its budget, or a kind given twice.
    """
    out: dict[str, int] = {}
    for kind, n in budget.items():
        key = device_named(kind).key
        if key in out:
            raise ValueError(f"--gpu: {key} is given twice")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"--gpu: {key}'s device budget must be an integer >= 1, got {n!r}")
        size = tp.get(kind, tp.get(key, 1))
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= n:
            raise ValueError(f"--gpu: {key}'s tp must be an integer from 1 to its {n} devices")
        out[key] = n
    return out


def kind_deployments(
    budget: Mapping[str, int], tp: Mapping[str, int] | None = None
) -> tuple[list[Colocated], list[PoolSplit]]:
    """Within ``budget`` devices of each kind, at each kind's TP (``tp``, default 1): each
    kind colocated on every whole instance its budget holds, and every P:D split (P, D >= 1
    instances) whose pools fit the budgets (one kind: P and D share its budget)."""
    sizes = dict(tp or {})
    keys = check_budget(budget, sizes)
    tps = {k: sizes.get(k, 1) for k in keys}
    for name, size in sizes.items():
        tps[device_named(name).key] = size
    colocated = [Colocated(k, n // tps[k], tps[k]) for k, n in keys.items()]
    splits = []
    for pk, pn in keys.items():
        for dk, dn in keys.items():
            p_tp, d_tp = tps[pk], tps[dk]
            for p in range(1, pn // p_tp + 1):
                left = dn - (p * p_tp if pk == dk else 0)
                for d in range(1, left // d_tp + 1):
                    splits.append(
                        PoolSplit(PoolSpec("prefill", pk, p_tp, p), PoolSpec("decode", dk, d_tp, d))
                    )
    return colocated, splits
