"""Pools of their own (DESIGN.md, "Deployments", pools of their own): a P:D split whose prefill
and decode pools each run on their own device kind and tensor-parallel size, written
``disaggregated:P:D,p=KIND[:tpN],d=KIND[:tpN]`` (P and D instances; e.g.
``disaggregated:2:4,p=h100:tp2,d=l40s:tp1``: 2 prefill instances of 2 H100s, 4 decode
instances of one L40S); each pool its own cost model, the KV crossing the slower of the two
kinds' links; devices counted per kind."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from pytest_prefill.plan.compute.devices import Device, device_named
from pytest_prefill.plan.model_spec import ModelSpec
from pytest_prefill.sim import CostModel

FORM = "disaggregated:P:D,p=KIND[:tpN],d=KIND[:tpN] (e.g. disaggregated:2:4,p=h100:tp2,d=l40s)"
ROLES = {"p": "prefill", "d": "decode"}


@dataclasses.dataclass(frozen=True, slots=True)
class PoolSpec:
    """One pool: ``instances`` engine instances of ``tp`` devices of ``kind`` (a catalog key).

    Raises:
        ValueError: naming the field, for a role other than prefill/decode, a kind the device
            catalog does not hold, or counts that are not whole numbers >= 1.
    """

    role: str
    kind: str
    tp: int
    instances: int

    def __post_init__(self) -> None:
        if self.role not in ROLES.values():
            raise ValueError(f"pool role must be prefill or decode, got {self.role!r}")
        for name in ("tp", "instances"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{self.role} pool: {name} must be an integer >= 1, got {value!r}")
        try:
            key = device_named(self.kind).key
        except ValueError as err:
            raise ValueError(f"{self.role} pool: {err}") from None
        object.__setattr__(self, "kind", key)

    @property
    def device(self) -> Device:
        return device_named(self.kind)

    @property
    def devices(self) -> int:
        return self.instances * self.tp

    @property
    def label(self) -> str:
        letter = "P" if self.role == "prefill" else "D"
        tp = f" TP{self.tp}" if self.tp > 1 else ""
        return f"{self.instances}{letter} {self.kind}{tp}"


@dataclasses.dataclass(frozen=True, slots=True)
class PoolSplit:
    """A P:D split of two pools of their own (see the module's docstring).

    Raises:
        ValueError: when ``prefill`` or ``decode`` is not a pool of that role.
    """

    prefill: PoolSpec
    decode: PoolSpec

    def __post_init__(self) -> None:
        if self.prefill.role != "prefill" or self.decode.role != "decode":
            raise ValueError("a PoolSplit takes a prefill pool, then a decode pool")

    @property
    def label(self) -> str:
        return f"disaggregated {self.prefill.label} : {self.decode.label}"

    def devices_by_kind(self) -> dict[str, int]:
        """Devices of each kind the split holds."""
        out: dict[str, int] = {}
        for pool in (self.prefill, self.decode):
            out[pool.kind] = out.get(pool.kind, 0) + pool.devices
        return out

    def check_model(self, model: ModelSpec) -> None:
        """ValueError naming the pool whose TP does not divide ``model``'s attention heads
        (vLLM shards heads across TP ranks)."""
        for pool in (self.prefill, self.decode):
            if model.attention_heads % pool.tp:
                raise ValueError(
                    f"{pool.role} pool: tp={pool.tp} does not divide {model.name}'s "
                    f"{model.attention_heads} attention heads"
                )

    def costs(self, cost_of: Callable[[PoolSpec], CostModel]) -> tuple[CostModel, CostModel]:
        """The prefill and decode pools' cost models, each ``cost_of(pool)`` (one instance of
        its kind at its TP: derived, measured or scaled, as the caller has it), the prefill
        one carrying the KV link between the kinds (:func:`link_between`)."""
        prefill, decode = cost_of(self.prefill), cost_of(self.decode)
        bandwidth, latency = link_between(self.prefill.device, self.decode.device)
        prefill = dataclasses.replace(prefill, link_bandwidth=bandwidth, link_latency=latency)
        return prefill, decode

    def simulate_options(self) -> dict[str, int]:
        """The pool sizes as ``simulate`` takes them (with ``decode_cost`` from :meth:`costs`)."""
        return {"prefill_workers": self.prefill.instances, "decode_workers": self.decode.instances}


def link_between(a: Device, b: Device) -> tuple[float, float]:
    """The KV link between a device of kind ``a`` and one of kind ``b``: bandwidth (bytes/s)
    and latency (s) of the slower of the two kinds' links (one kind: its own link)."""
    return min(a.link_bandwidth, b.link_bandwidth), max(a.link_latency, b.link_latency)


def parse_pools(text: str, model: ModelSpec | None = None) -> PoolSplit:
    """``disaggregated:P:D,p=KIND[:tpN],d=KIND[:tpN]`` as a :class:`PoolSplit` (a pool not
    named takes the other's kind and TP 1); with ``model``, each TP must divide its heads.

    Raises:
        ValueError: in one line naming the form, for anything else (an unknown kind names the
            catalog).
    """
    spec, *items = str(text).strip().split(",")
    policy, _, rest = spec.strip().partition(":")
    counts = [c.strip() for c in rest.split(":")] if rest else []
    if policy != "disaggregated" or len(counts) != 2 or not all(c.isdigit() for c in counts):
        raise ValueError(f"pools {text!r}: expected {FORM}")
    pools: dict[str, tuple[str, int]] = {}
    for item in items:
        key, sep, value = item.strip().partition("=")
        role = ROLES.get(key.strip().lower())
        if not sep or role is None or role in pools:
            raise ValueError(
                f"pools {text!r}: after a comma, p=KIND[:tpN] or d=KIND[:tpN] once each"
            )
        kind, _, tp = value.strip().partition(":")
        digits = tp.strip().lower().removeprefix("tp")
        if tp and not digits.isdigit():
            raise ValueError(f"pools {text!r}: {key.strip()}={value.strip()}: TP is tpN, e.g. tp2")
        pools[role] = (kind.strip(), int(digits) if tp else 1)
    if not pools:
        raise ValueError(f"pools {text!r}: name at least one pool's kind, as in {FORM}")
    other = next(iter(pools.values()))[0]
    made = {
        role: PoolSpec(role, *pools.get(role, (other, 1)), int(n))
        for role, n in zip(("prefill", "decode"), counts)
    }
    split = PoolSplit(made["prefill"], made["decode"])
    if model is not None:
        split.check_model(model)
    return split
