"""A measured run replayed in the simulator (a :class:`ServerModel`): the same requests, sent when
the client sent them (plus the calibration's way into the engine), under the server's scheduling — its engine
profile (``sim.profiles``: the first-token rule, and the token budget and sequence cap the
server was started with) and its KV cache — and each simulated token delayed by the way back
out. The result has the shape of a measured run's records, so both go through one
``serving_metrics_of``. Standard library only."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from pytest_prefill.plan.metrics import DEFAULT_PERCENTILES, ServingMetrics, serving_metrics_of
from pytest_prefill.serve.calibration.server_model import ServerModel
from pytest_prefill.serve.load.records import ServerRecord
from pytest_prefill.sim import Request, Trace, simulate


@dataclasses.dataclass(frozen=True, slots=True)
class SimulatedRequest:
    """One request as the simulator saw it, on the client's clock."""

    id: str
    arrival: float
    prompt_len: int
    token_times: tuple[float, ...]


def simulate_run(
    records: Sequence[ServerRecord],
    model: ServerModel,
    blocks: Mapping[str, Sequence[int | str]] | None = None,
) -> tuple[list[SimulatedRequest], Trace]:
    """:func:`simulate_records`, and the simulation's trace (its prefix cache's hits and its
    preemptions); ``blocks``: request id -> the prompt's hash ids, for a workload that shares
    prefixes (sent as shared blocks: ``loadgen.Target.prefix_block_tokens``)."""
    delay, back = model.overhead.arrival_delay, model.overhead.from_engine
    shared = blocks or {}
    load = [
        Request(
            r.id,
            r.arrival + delay,
            r.prompt_tokens or r.prompt_len,
            max(len(r.token_times), 1),
            tuple(shared.get(r.id, ())),
        )
        for r in records
    ]
    trace = simulate("chunked", load, model.simulated_cost, engine=model.scheduling.profile)
    out = []
    for r in records:
        times = trace.requests[r.id].token_times[: len(r.token_times)]
        out.append(
            SimulatedRequest(
                r.id, r.arrival, r.prompt_tokens or r.prompt_len, tuple(t + back for t in times)
            )
        )
    return out, trace


def simulate_records(records: Sequence[ServerRecord], model: ServerModel) -> list[SimulatedRequest]:
    """The simulator's version of ``records`` (the completed requests of a measured run):
    ``chunked`` under the server's profile (decode rows first, prompt tokens FCFS in what the
    budget leaves, at most the sequence cap admitted; the first token where the profile's rule
    puts it), each request as long as the server made it."""
    return simulate_run(records, model)[0]


def simulated_metrics(
    records: Sequence[ServerRecord],
    model: ServerModel,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> ServingMetrics:
    """vLLM's serving metrics of the simulated run, by the definitions of the measured one."""
    simulated = simulate_records(records, model)
    return serving_metrics_of(simulated, percentiles=percentiles)
