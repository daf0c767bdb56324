"""What a calibrated server is to the simulator (:class:`ServerModel`): its cost model, the
request's way into the engine and back out (``RequestOverhead``), and its scheduling (the engine
profile at the budget and sequence cap it was started with, and its KV cache). Standard library
only.

A measured run replayed in the simulator (:func:`simulate_records`): the same requests, sent
when the client sent them (plus the calibration's way into the engine), under the server's
scheduling — its engine profile (``sim.profiles``: the first-token rule, and the token budget
and sequence cap the server was started with) and its KV cache — and each simulated token
delayed by the way back out. The result has the shape of a measured run's records, so both go
through one ``serving_metrics_of``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_prefill._io import json_number, number_from_json
from pytest_prefill.plan.metrics import DEFAULT_PERCENTILES, ServingMetrics, serving_metrics_of
from pytest_prefill.serve.calibration.calibration_fit import RequestOverhead
from pytest_prefill.serve.calibration.server_calibration import ServerCalibration
from pytest_prefill.serve.client.api import ENGINES
from pytest_prefill.serve.load.records import ServerRecord
from pytest_prefill.sim import KNOBS, PROFILES, CostModel, EngineProfile, Request, Trace, simulate
from pytest_prefill.sim.checks import check_int

# The cost model's terms in seconds (a factor scales these; sizes and ratios stay).
TIME_TERMS = (
    "prefill_pass_overhead",
    "prefill_per_token",
    "decode_step_base",
    "decode_per_seq",
    "decode_per_kv_token",
    "prefill_per_pair",
    "batch_attention_per_pair",
    "link_latency",
)

# The engines a server can be that have a profile (a plain "openai" server has none).
PROFILED_ENGINES = tuple(e for e in ENGINES if e in PROFILES)


class NoProfileError(ValueError):
    """A server whose engine has no profile: nothing measured on it can be simulated."""


def need_profile(engine: str, url: str, how: str) -> None:
    """Refuse a server whose engine has no profile to simulate it with (a plain OpenAI server,
    or one that does not say what it is), before anything is measured on it.

    Raises:
        NoProfileError: naming ``--engine`` and the engines it may be.
    """
    if engine not in PROFILED_ENGINES:
        raise NoProfileError(
            f"{url} is an {engine!r} server to this tool ({how}), and only an engine with a "
            f"profile can be simulated: give --engine, one of {', '.join(PROFILED_ENGINES)}"
        )


def server_profile(engine: str, budget: int, max_seqs: int | None = None) -> EngineProfile:
    """``engine``'s profile as the server runs it: its ``budget`` (tokens an iteration, decode
    rows included: vLLM ``--max-num-batched-tokens``, llama.cpp ``-b``, ``transformers serve
    --cb-max-batch-tokens``) and, when given, its sequence cap (vLLM ``--max-num-seqs``,
    llama.cpp ``-np``; else the profile's default).

    Raises:
        ValueError: naming the field, for an engine without a profile (listing those with
            one), a budget below 2 or a cap below 1.
    """
    if engine not in PROFILED_ENGINES:
        raise ValueError(
            f"engine {engine!r} has no engine profile to simulate it with; allowed: "
            f"{', '.join(PROFILED_ENGINES)}"
        )
    check_int("budget", budget, minimum=2)
    base = PROFILES[engine]
    seqs = base.max_seqs if max_seqs is None else max_seqs
    return dataclasses.replace(base, max_batched_tokens=budget, max_seqs=seqs)


@dataclasses.dataclass(frozen=True)
class Scheduling:
    """The server's scheduling as the simulator plays it: its engine ``profile`` (with a
    token budget: :func:`server_profile`) and its KV cache in tokens (``kv_capacity_tokens``:
    ``transformers serve`` ``--cb-num-blocks`` x 256, llama.cpp ``-c``; inf: unbounded)."""

    profile: EngineProfile
    kv_capacity_tokens: float = math.inf

    def __post_init__(self) -> None:
        if not isinstance(self.profile, EngineProfile):
            raise ValueError(f"profile must be an EngineProfile, got {type(self.profile).__name__}")
        if self.profile.max_batched_tokens is None:
            raise ValueError(
                f"profile {self.profile.name!r} has no token budget (max_batched_tokens); a "
                "server's scheduling needs the one it runs with"
            )
        kv = self.kv_capacity_tokens
        if isinstance(kv, bool) or not isinstance(kv, (int, float)) or not kv > 0:
            raise ValueError(f"kv_capacity_tokens must be > 0 (inf: unbounded), got {kv!r}")

    @property
    def budget(self) -> int:
        return int(self.profile.max_batched_tokens or 0)

    def replace(self, **knobs: Any) -> Scheduling:
        """This scheduling with the profile's ``knobs`` replaced (its name kept)."""
        return dataclasses.replace(self, profile=dataclasses.replace(self.profile, **knobs))

    def label(self) -> str:
        kv = self.kv_capacity_tokens
        cache = "unbounded KV" if math.isinf(kv) else f"KV {kv:,.0f} tokens"
        return f"{self.profile.label()}; {cache}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the engine, every knob, those changed from its profile, the KV tokens
        ("inf": unbounded)."""
        p, kv = self.profile, self.kv_capacity_tokens
        return {
            "engine": p.name,
            **{k: getattr(p, k) for k in KNOBS},
            "changed": list(p.changed()),
            "kv_capacity_tokens": json_number(float(kv)),
        }

    @classmethod
    def from_dict(cls, data: Any) -> Scheduling:
        """The scheduling :meth:`to_dict` wrote: the engine's profile with every knob as
        written, and the KV cache.

        Raises:
            ValueError: naming the field, for an engine without a profile, a knob missing,
                or a KV capacity that is not a positive number.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"scheduling must be an object, got {type(data).__name__}")
        engine = data.get("engine")
        if engine not in PROFILES:
            raise ValueError(f"scheduling.engine: no engine profile {engine!r}")
        missing = [k for k in KNOBS if k not in data]
        if missing:
            raise ValueError(f"scheduling: missing {', '.join(missing)}")
        try:
            profile = dataclasses.replace(PROFILES[engine], **{k: data[k] for k in KNOBS})
            kv = number_from_json(data.get("kv_capacity_tokens", "inf"), "kv_capacity_tokens")
        except (TypeError, ValueError) as err:
            raise ValueError(f"scheduling: {err}") from None
        return cls(profile, kv)


def scaled_cost(cost: CostModel, factor: float) -> CostModel:
    """``cost`` with every term in seconds (:data:`TIME_TERMS`) times ``factor``.

    Raises:
        ValueError: for a factor that is not a positive finite number.
    """
    ok = isinstance(factor, (int, float)) and not isinstance(factor, bool)
    if not (ok and math.isfinite(factor) and factor > 0):
        raise ValueError(f"factor must be a positive finite number, got {factor!r}")
    if factor == 1:
        return cost
    return dataclasses.replace(cost, **{t: getattr(cost, t) * factor for t in TIME_TERMS})


@dataclasses.dataclass(frozen=True, slots=True)
class ServerModel:
    """A calibrated server as the simulator sees it: its ``cost`` model, the request's
    ``overhead`` outside the engine (kept apart from the cost model), and its ``scheduling``.
    Every prediction and replay against a server takes one."""

    cost: CostModel
    overhead: RequestOverhead
    scheduling: Scheduling

    def __post_init__(self) -> None:
        for name, kind in (
            ("cost", CostModel),
            ("overhead", RequestOverhead),
            ("scheduling", Scheduling),
        ):
            value = getattr(self, name)
            if not isinstance(value, kind):
                raise ValueError(f"{name} must be a {kind.__name__}, got {type(value).__name__}")

    @classmethod
    def of(cls, calibration: ServerCalibration, scheduling: Scheduling) -> ServerModel:
        """The server ``calibration`` measured, under ``scheduling``."""
        return cls(calibration.cost, calibration.overhead, scheduling)

    def scaled(self, factor: float) -> ServerModel:
        """This server running at ``factor`` x its cost model's times (:func:`scaled_cost`)."""
        return dataclasses.replace(self, cost=scaled_cost(self.cost, factor))

    @property
    def simulated_cost(self) -> CostModel:
        """The cost model with the server's KV cache, as the simulator runs it."""
        kv = self.scheduling.kv_capacity_tokens
        return dataclasses.replace(self.cost, kv_capacity_tokens=kv)


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
