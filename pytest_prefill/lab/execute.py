"""Real runs of a workload under a policy: one engine worker in this process (shared,
coscheduled, chunked; CPU or CUDA), or the two disaggregated worker processes (CPU). The one
entry point above :mod:`loop` and :mod:`disaggregated`. torch is imported lazily."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterable, Sequence
from typing import Any

from pytest_prefill.lab.loop import (
    EngineRun,
    ModelBackend,
    RealClock,
    check_lab_run,
    run_single,
    warm_up,
)
from pytest_prefill.sim import Request, validate_load


def hf_model(model: Any) -> Any:
    """The ``*ForCausalLM`` in ``model`` (itself, or a ``LoadedModel``'s ``.model``)."""
    return model if hasattr(model, "lm_head") else getattr(model, "model", model)


def run_colocated(
    policy: str,
    requests: Sequence[Request],
    model: Any,
    *,
    chunk: int | None,
    seed: int,
    cores: Sequence[int],
    threads: int | None,
) -> EngineRun:
    """``shared``, ``coscheduled`` or ``chunked`` on one worker in this process (on CPU pinned to
    ``cores`` with ``threads`` torch threads, then restored)."""
    import torch

    from pytest_prefill.lab.packed import PackedModel

    packed = PackedModel(model)
    on_cpu = packed.device.type == "cpu"
    previous = (os.sched_getaffinity(0), torch.get_num_threads())
    if on_cpu:
        os.sched_setaffinity(0, cores)
        torch.set_num_threads(threads or len(cores))
    backend = ModelBackend(packed, requests, seed=seed)
    collect = gc.isenabled()
    try:
        warm_up(packed)
        gc.collect()
        gc.disable()  # a collection mid-run would show up as a stall that is not the model's
        trace = run_single(policy, requests, backend, RealClock(), chunk)
    finally:
        if collect:
            gc.enable()
        if on_cpu:
            os.sched_setaffinity(0, previous[0])
            torch.set_num_threads(previous[1])
    where = (
        f"one worker on cores {list(cores)} with {threads or len(cores)} torch thread(s)"
        if on_cpu
        else f"one worker on {packed.device}"
    )
    tokens = {rid: tuple(t) for rid, t in backend.tokens.items()}
    return EngineRun(trace, tokens, where)


def execute(
    policy: str,
    load: Iterable[Request],
    model: Any,
    *,
    chunk: int | None = None,
    seed: int = 0,
    cores: Sequence[int] | None = None,
    threads: int | None = None,
    workers: Any = None,
) -> EngineRun:
    """Run ``load`` under ``policy`` for real on ``model`` (a ``*ForCausalLM`` or anything with
    a ``.model`` attribute holding one). Arrivals are relative to the run's start.

    Single-worker policies run in this process on ``cores`` (default: every core this process
    may use) with ``threads`` torch threads (default: one per core); ``disaggregated`` runs a
    prefill process and a decode process on disjoint halves of those cores (see
    :mod:`pytest_prefill.lab.disaggregated`; pass started ``workers`` to reuse them), so every policy gets
    the same total resources.

    Raises:
        ValueError: for a bad policy, chunk or load, or an unsupported model.
    """
    check_lab_run(policy, chunk, 1, 1)
    requests = validate_load(load)
    model = hf_model(model)
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    if policy != "disaggregated":
        return run_colocated(
            policy, requests, model, chunk=chunk, seed=seed, cores=cores, threads=threads
        )
    if workers is not None:
        return workers.run(requests, seed=seed, chunk=chunk)
    from pytest_prefill.lab.disaggregated import run_disaggregated

    return run_disaggregated(requests, model, seed=seed, cores=cores, chunk=chunk)
