"""A measured run replayed in the simulator: the same requests, sent when the client sent them
(plus the calibration's way into the engine), under the server's scheduling — its first-token
rule and token budget — and each simulated token delayed by the way back out. The result has
the shape of a measured run's records, so both go through one ``serving_metrics_of``.
Standard library only."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pytest_prefill.plan.metrics import DEFAULT_PERCENTILES, ServingMetrics, serving_metrics_of
from pytest_prefill.serve.calibration_fit import RequestOverhead
from pytest_prefill.serve.records import RequestRecord
from pytest_prefill.sim import CostModel, Request, simulate

FIRST_TOKEN_RULES = ("prefill", "decode")


@dataclasses.dataclass(frozen=True)
class Scheduling:
    """The server's scheduling as the simulator plays it: ``first_token`` (``prefill``: the
    iteration that completes the prompt emits the first token, as vLLM, SGLang, llama.cpp and
    transformers do; ``decode``: the lab's convention, one decode step later) and ``budget``
    (tokens an iteration holds, decode rows included)."""

    first_token: str = "prefill"
    budget: int = 256
    kv_capacity_tokens: float = float("inf")

    def __post_init__(self) -> None:
        if self.first_token not in FIRST_TOKEN_RULES:
            raise ValueError(
                f"first_token must be one of {', '.join(FIRST_TOKEN_RULES)}, got {self.first_token!r}"
            )
        if isinstance(self.budget, bool) or not isinstance(self.budget, int) or self.budget < 2:
            raise ValueError(f"budget must be an integer >= 2, got {self.budget!r}")

    def label(self) -> str:
        return f"first token at {self.first_token}, budget {self.budget:,}"


@dataclasses.dataclass(frozen=True, slots=True)
class SimulatedRequest:
    """One request as the simulator saw it, on the client's clock."""

    id: str
    arrival: float
    prompt_len: int
    token_times: tuple[float, ...]


def simulate_records(
    records: Sequence[RequestRecord],
    cost: CostModel,
    overhead: RequestOverhead,
    scheduling: Scheduling,
) -> list[SimulatedRequest]:
    """The simulator's version of ``records`` (the completed requests of a measured run).

    Until the simulator's engine profiles exist this plays the server with the lab's chunked
    policy: ``chunk = budget - 2`` prompt tokens beside the decode rows, and for the
    ``prefill`` rule one output token fewer, the first being the end of the prompt's last pass
    (the lab's first decode step after the prompt is then the server's second token).
    """
    delay, back = overhead.arrival_delay, overhead.from_engine
    prefill_rule = scheduling.first_token == "prefill"
    load = [
        Request(
            r.id,
            r.arrival + delay,
            r.prompt_tokens or r.prompt_len,
            max(len(r.token_times) - (1 if prefill_rule else 0), 1),
        )
        for r in records
    ]
    model = dataclasses.replace(cost, kv_capacity_tokens=scheduling.kv_capacity_tokens)
    trace = simulate("chunked", load, model, chunk=max(scheduling.budget - 2, 1))
    out = []
    for r in records:
        record = trace.requests[r.id]
        times = list(record.token_times)
        if prefill_rule:
            times = [record.prefill_end, *times][: len(r.token_times)]
        out.append(
            SimulatedRequest(
                r.id, r.arrival, r.prompt_tokens or r.prompt_len, tuple(t + back for t in times)
            )
        )
    return out


def simulated_metrics(
    records: Sequence[RequestRecord],
    cost: CostModel,
    overhead: RequestOverhead,
    scheduling: Scheduling,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> ServingMetrics:
    """vLLM's serving metrics of the simulated run, by the definitions of the measured one."""
    simulated = simulate_records(records, cost, overhead, scheduling)
    return serving_metrics_of(simulated, percentiles=percentiles)
