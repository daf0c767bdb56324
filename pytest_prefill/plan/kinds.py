"""The search across device kinds (``capacity --gpu h100,h200,l40s``): the deployments to
compare within a device budget per kind — each kind colocated on its whole budget, and every
P:D split of pools of their own (:mod:`.pools`), same kind or mixed, within the budgets —
and each one's price at its answer (:func:`result_prices`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from pytest_prefill.plan.capacity import CapacityResult
from pytest_prefill.plan.compute.devices import device_named
from pytest_prefill.plan.deployments import Deployment
from pytest_prefill.plan.pools import PoolSpec, PoolSplit
from pytest_prefill.plan.pricing import deployment_price, prompt_share
from pytest_prefill.plan.workloads import scale_rate
from pytest_prefill.sim import Request, simulate


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


def result_prices(
    result: CapacityResult, load: Sequence[Request], prices: Mapping[str, float]
) -> CapacityResult:
    """``result`` with each deployment's price at its answer (the highest rate within the
    SLO; inf where it has none): a split by :func:`split_price`, a colocated deployment of a
    named kind by :func:`colocated_price`, its prompts' share of busy time taken from one
    simulation at that rate.

    Raises:
        ValueError: for a deployment of no named kind, or a kind with no price.
    """
    prompt = sum(r.prompt_len for r in load) / len(load)
    output = sum(r.output_len for r in load) / len(load)

    def share(d: Deployment, scale: float) -> Callable[[], float]:
        def run() -> float:
            options = d.simulate_options(result.engine)
            trace = simulate(d.policy, scale_rate(load, scale), d.cost_on(result.cost), **options)
            return prompt_share(trace.events)

        return run

    out = {}
    for r in result.results:
        d, best = r.deployment, r.best
        served = best is not None and best.metrics is not None and not r.pruned
        rate = r.max_rate if served else 0.0
        scale = best.scale if best is not None else 1.0
        out[d.label] = deployment_price(d, prices, rate, prompt, output, share(d, scale))
    return dataclasses.replace(result, prices=out)
