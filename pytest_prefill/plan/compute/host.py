"""The host cost an engine's derived answer carries when the user gives no calibration of their
own: read off a published run of that engine with one request, whose decode steps are one row
each, so that its measured time per output token less the device time the physics gives for that
step is the host's share of a step. The run is the evidence and the host figure is computed from
it with the shipped efficiency tables, so it moves with them. Standard library only."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from pytest_prefill.plan.compute.derive import HostCost
from pytest_prefill.plan.compute.devices import CATALOG
from pytest_prefill.plan.compute.efficiency import efficiency_for
from pytest_prefill.plan.compute.physics import Physics
from pytest_prefill.plan.model_spec import model_from_config

NONE_TABLED = HostCost()


@dataclasses.dataclass(frozen=True, slots=True)
class OneRequestRun:
    """A published run of ``engine`` with one request: ``model_config`` (the fields of its
    config.json the physics reads) on the catalog ``device``, ``prompt`` tokens in, ``output``
    out, and its measured mean time per output token ``tpot`` (seconds)."""

    engine: str
    version: str
    model: str
    model_config: Mapping[str, Any]
    device: str
    prompt: int
    output: int
    tpot: float
    source: str

    def step_context(self) -> int:
        """The cached tokens of the run's middle decode step (the mean step: the step's time
        is linear in its cached tokens)."""
        return self.prompt + self.output // 2

    def host_per_step(self) -> float:
        """Its measured time per output token less the device time of that one-row step."""
        model = model_from_config(dict(self.model_config), self.model, self.source)
        device = CATALOG[self.device]
        physics = Physics(model, device, efficiency_for(device, self.engine).table)
        return max(0.0, self.tpot - physics.decode_step(1, self.step_context()))


# Qwen/Qwen2-7B-Instruct's config.json (Apache-2.0), the fields the physics reads
_QWEN2_7B = MappingProxyType(
    {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
)

RUNS = MappingProxyType(
    {
        "vllm": OneRequestRun(
            engine="vllm",
            version="0.10.1.1",
            model="Qwen2-7B-Instruct",
            model_config=_QWEN2_7B,
            device="a100-80",
            prompt=1024,
            output=1024,
            tpot=11.75e-3,
            source="github.com/dennislee22/vLLM-benchmarking@b474d1e053c35c9aef8c02aae4efbc0d8675f033 "
            "README.md, Test 5 (1 prompt of 1024 tokens, 1024 out, mean TPOT 11.75 ms)",
        ),
    }
)


@functools.cache
def tabled_host(engine: str) -> HostCost:
    """The host cost ``engine``'s derived answers carry without a calibration (``--host-from``):
    per step, from its published one-request run; none for an engine without one."""
    run = RUNS.get(engine)
    if run is None:
        return NONE_TABLED
    per_step = run.host_per_step()
    return HostCost(
        per_step=per_step,
        source=(
            f"tabled for {engine}: {per_step * 1e3:.2f} ms per step, a published one-request run's "
            f"time per token less its derived step ({run.model} on {run.device}, {engine} "
            f"{run.version}; another host, version or device differs): give --host-from "
            "CALIBRATION.json for your server's"
        ),
    )
