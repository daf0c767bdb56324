"""What a capacity search's deployments run on beside the cost model: the model they serve (its
memory: weights, KV bytes per token, context), each device's memory and the fraction the
engine takes, and how compute scales with tensor parallelism (DESIGN.md, "Deployments: model,
memory, parallelism"). Gives each deployment its own cost model at its TP, and the lines an
answer states its assumptions in. Standard library only."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

from pytest_prefill.plan.deployments import Deployment, default_deployments
from pytest_prefill.plan.device_memory import (
    DEFAULT_UTILIZATION,
    DEFAULT_VLLM_VERSION,
    GiB,
    KVCapacity,
    check_tp,
    kv_capacity,
)
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.plan.model_spec import ModelSpec
from pytest_prefill.plan.tensor_parallel import TPRule, cost_at_tp, tp_rule
from pytest_prefill.plan.vllm_memory import reserve_rule
from pytest_prefill.sim import CostModel, EngineProfile

MAX_TP = 8  # one node: the largest TP the shipped all-reduce profiles cover


@dataclasses.dataclass(frozen=True, slots=True)
class Hardware:
    """``model`` served on devices of ``device_memory`` bytes (None: the KV capacity is the
    cost model's own), the engine taking ``utilization`` of each; compute at TP > 1 by
    ``rule`` (default: :func:`~pytest_prefill.plan.tensor_parallel.tp_rule` of the model).
    A cost model measured on a server at ``measured_tp`` is used as it is at that TP (and only
    there, when it is not 1), with the server's own KV capacity ``server_kv_tokens`` when it
    showed one. ``max_num_seqs``: the engine's sequence cap, which sizes vLLM's sampler reserve
    (None: vLLM's default for the device); ``vllm_version`` picks vLLM's reserve rule
    (plan/vllm_memory.py). ``derived``: the cost model derived from the model
    and the device at a TP (plan/compute/derive.py); when given it is used at every TP instead
    of scaling a TP=1 model by the rule.

    Raises:
        ValueError: naming the field, for memory that is not a positive number or a
            utilization outside (0, 1].
    """

    model: ModelSpec
    device_memory: float | None = None
    utilization: float = DEFAULT_UTILIZATION
    rule: TPRule | None = None
    measured_tp: int = 1
    server_kv_tokens: int | None = None
    memory_source: str = "--device-memory"
    max_num_seqs: int | None = None
    derived: Callable[[int], CostModel] | None = None
    vllm_version: str = DEFAULT_VLLM_VERSION

    def __post_init__(self) -> None:
        memory = self.device_memory
        if memory is not None and not (
            isinstance(memory, (int, float)) and math.isfinite(memory) and memory > 0
        ):
            raise ValueError(f"device_memory must be a positive number of bytes, got {memory!r}")
        if not (isinstance(self.utilization, (int, float)) and 0 < self.utilization <= 1):
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {self.utilization!r}")
        reserve_rule(self.vllm_version)  # raises naming vllm_version
        if self.rule is None:
            object.__setattr__(self, "rule", tp_rule(self.model))

    def kv(self, tp: int, block_tokens: int) -> KVCapacity | None:
        """One instance's KV cache at ``tp`` (None: no device memory given).

        Raises:
            ValueError: when the weights and the reserve leave no KV block.
        """
        if self.device_memory is None:
            return None
        return kv_capacity(
            self.model,
            self.device_memory,
            utilization=self.utilization,
            tp=tp,
            block_tokens=block_tokens,
            max_num_seqs=self.max_num_seqs,
            vllm_version=self.vllm_version,
        )

    def instance_cost(self, cost: CostModel, tp: int, block_tokens: int) -> CostModel:
        """``cost`` (measured at :attr:`measured_tp`) for one instance at ``tp``: compute scaled
        by the rule from TP 1, the model's KV bytes per token and its KV capacity (the server's
        own at its TP, else vLLM's rule with device memory, else the cost model's).

        Raises:
            ValueError: for a TP other than :attr:`measured_tp` when that is not 1.
        """
        assert self.rule is not None
        if self.derived is not None:
            scaled = self.derived(tp)
        elif tp == self.measured_tp:
            scaled = cost
        elif self.measured_tp == 1:
            scaled = cost_at_tp(cost, self.model, tp, self.rule)
        else:
            raise ValueError(
                f"a cost model measured at TP={self.measured_tp} is used at that TP only, not {tp}"
            )
        kv = self.kv(tp, block_tokens)
        if tp == self.measured_tp and self.server_kv_tokens is not None:
            capacity = float(self.server_kv_tokens)
        else:
            capacity = float(kv.tokens) if kv is not None else scaled.kv_capacity_tokens
        return dataclasses.replace(
            scaled, kv_bytes_per_token=self.model.kv_bytes_per_token, kv_capacity_tokens=capacity
        )

    def fits(self, tp: int, block_tokens: int = 16) -> bool:
        """Whether an instance at ``tp`` holds the weights and at least one KV block."""
        try:
            self.kv(tp, block_tokens)
        except ValueError:
            return False
        return True

    def tp_sizes(self, devices: int, block_tokens: int = 16) -> tuple[int, ...]:
        """The TP sizes a search tries on ``devices``: the powers of two up to
        :data:`MAX_TP` that divide the devices and the attention heads, at which the weights
        fit."""
        powers = tuple(2**k for k in range(int(math.log2(MAX_TP)) + 1))
        sizes = powers if self.measured_tp == 1 else (self.measured_tp,)
        return tuple(
            n
            for n in sizes
            if n <= devices
            and devices % n == 0
            and self.model.attention_heads % n == 0
            and self.fits(n, block_tokens)
        )

    def check_tp(self, tp: int, devices: int, block_tokens: int = 16) -> None:
        """ValueError naming the problem when ``tp`` cannot serve the model on ``devices``."""
        check_tp(tp)
        if devices % tp:
            raise ValueError(f"tp={tp} does not divide the {devices} devices")
        if self.model.attention_heads % tp:
            raise ValueError(
                f"tp={tp} does not divide {self.model.name}'s {self.model.attention_heads} "
                "attention heads"
            )
        self.kv(tp, block_tokens)  # raises when the memory is smaller than the weights

    def attach(
        self, deployments: Sequence[Deployment], cost: CostModel, block_tokens: int
    ) -> tuple[Deployment, ...]:
        """``deployments`` each with its instances' cost model at its TP (and KV sized for its
        own sequence cap, ``,seqs=N``, when it sets one: vLLM's sampler reserve follows it)."""
        costs = {}
        for tp, seqs in {(d.tp, d.max_seqs) for d in deployments}:
            sized = self if seqs is None else dataclasses.replace(self, max_num_seqs=seqs)
            costs[tp, seqs] = sized.instance_cost(cost, tp, block_tokens)
        return tuple(dataclasses.replace(d, cost=costs[d.tp, d.max_seqs]) for d in deployments)

    def deployments(
        self, cost: CostModel, devices: int, slo: SLO | None, engine: EngineProfile
    ) -> tuple[Deployment, ...]:
        """The default deployments at every TP of :meth:`tp_sizes` (each at its own cost)."""
        block = engine.kv_block_tokens
        out: list[Deployment] = []
        for tp in self.tp_sizes(devices, block):
            at = self.instance_cost(cost, tp, block)
            out += [
                dataclasses.replace(d, cost=at)
                for d in default_deployments(at, devices, slo, engine, tp)
            ]
        return tuple(out)

    def short_of(self, tp: int, block_tokens: int, context: int | None) -> int | None:
        """The KV tokens of an instance at ``tp`` when fewer than ``context`` (None: enough,
        or no device memory given). vLLM then refuses to start unless ``--max-model-len`` is at
        most that (``vllm/v1/core/kv_cache_utils.py`` ``check_enough_kv_cache_memory``: one
        sequence of the model's length must fit; its estimate of the length that does is the
        KV in whole blocks, as here)."""
        kv = self.kv(tp, block_tokens)
        if kv is None or context is None or kv.tokens >= context:
            return None
        return kv.tokens

    def lines(
        self,
        tps: Sequence[int],
        block_tokens: int,
        context: int | None = None,
        lengths: Sequence[int] = (),
    ) -> list[str]:
        """What the answer assumes about memory and TP, one line each (with, where an
        instance's KV holds fewer tokens than ``context``, the ``--max-model-len`` it needs and
        how many of the workload's sequence ``lengths``, prompt + output, exceed it)."""
        memory = (
            f"{self.device_memory / GiB:g} GiB devices ({self.memory_source}), "
            f"{self.utilization:g} of each for the engine"
            if self.device_memory is not None
            else "no device memory given: KV capacity is the cost model's own"
        )
        out = [f"Model: {self.model.summary()} ({self.model.source}); {memory}"]
        for tp in sorted(set(tps)):
            kv = self.kv(tp, block_tokens)
            if kv is not None:
                out.append(f"  KV at TP={tp}: {kv.describe()}")
            short = self.short_of(tp, block_tokens, context)
            if short is not None:
                longer = sum(n > short for n in lengths)
                fate = (
                    f"{longer:,} request(s) longer, which vLLM would refuse, are simulated as "
                    "served"
                    if longer
                    else f"every request here fits (the longest: {max(lengths, default=0):,})"
                )
                out.append(
                    f"    fewer than the {context:,}-token max-model-len: vLLM starts at TP={tp} "
                    f"only with --max-model-len {short} or less (kv_cache_utils.py "
                    f"check_enough_kv_cache_memory); the command sets it; {fate}"
                )
            if tp > 1 and self.derived is not None:
                out.append(
                    f"  compute at TP={tp}: derived at that TP (each GEMM split {tp} ways, two "
                    "all-reduces per layer at the efficiency table's bus bandwidth)"
                )
            elif tp > 1:
                assert self.rule is not None
                out.append(f"  compute at TP={tp}: {self.rule.describe(tp)}")
        return out
