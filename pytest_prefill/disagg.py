"""Prefill/decode disaggregation for real: a prefill worker and a decode worker as two spawned
processes on disjoint CPU cores, the KV cache of each finished prompt shipped through shared
memory, every transfer timed. The decode process schedules with the engine's :class:`Worker`
rules, so the result is the simulator's ``Trace`` type. torch is imported lazily."""

from __future__ import annotations

import os
import queue
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any

from pytest_prefill.engine import (
    Clock,
    EngineRun,
    ModelExecutor,
    RealClock,
    Worker,
    disaggregated_trace,
    drive,
    make_prompts,
    warm_up,
)
from pytest_prefill.scheduler import LINK, EventLog, Request

STARTUP_TIMEOUT = 300.0  # seconds for a child to import torch and load the model
RUN_TIMEOUT = 3600.0


def split_cores(cores: Sequence[int]) -> tuple[list[int], list[int]]:
    """Disjoint halves of ``cores``: the prefill worker's and the decode worker's.

    Raises:
        ValueError: with fewer than two cores.
    """
    cores = sorted(cores)
    if len(cores) < 2:
        raise ValueError(
            f"disaggregation needs at least 2 CPU cores (one per worker); this process may use {cores}"
        )
    half = len(cores) // 2
    return cores[:half], cores[half:]


def _pin(cores: Sequence[int]) -> None:
    import torch

    os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))
    torch.set_num_interop_threads(1)


class _QueueArrivals:
    """Requests whose KV cache has arrived through ``channel``: ``(id, first token, ready time)``
    messages; a request is handed out at the first boundary at or after its ready time."""

    def __init__(
        self, channel: Any, requests: Sequence[Request], kv: dict[str, Any], executor: ModelExecutor
    ) -> None:
        self.channel, self.kv, self.executor = channel, kv, executor
        self.by_id = {r.id: r for r in requests}
        self.left = len(requests)
        self.pending: list[tuple[float, str, int]] = []
        self.ready_at: dict[str, float] = {}

    def _drain(self, block: bool) -> None:
        while True:
            try:
                rid, token, ready = self.channel.get(block=block, timeout=RUN_TIMEOUT)
            except queue.Empty:
                if block:
                    raise RuntimeError("the prefill worker stopped sending KV caches") from None
                return
            self.pending.append((ready, rid, token))
            block = False

    def ready(self, now: float) -> list:
        from pytest_prefill.packed import KVCache

        self._drain(block=False)
        due = sorted(p for p in self.pending if p[0] <= now)
        self.pending = [p for p in self.pending if p[0] > now]
        out = []
        for ready, rid, token in due:
            r = self.by_id[rid]
            self.executor.adopt(r, KVCache(self.kv[rid], length=r.prompt_len), token)
            self.ready_at[rid] = ready
            out.append(r)
        self.left -= len(out)
        return out

    def wait(self, clock: Clock) -> bool:
        if self.left == 0:
            return False
        if not self.pending:
            self._drain(block=True)
        clock.wait_until(min(p[0] for p in self.pending))
        return True


def _serve(role: str, model: Any, cores: list[int], jobs: Any, channel: Any, results: Any) -> None:
    """A worker process: load once, then run jobs until told to stop (None)."""
    try:
        from pytest_prefill.packed import PackedModel

        _pin(cores)
        packed = PackedModel(model)
        warm_up(packed)
        results.put(("ready", role, None))
        while (job := jobs.get()) is not None:
            if job[0] == "measure":
                results.put(("measured", role, _measure(packed, role, job[1])))
                continue
            requests, seed, prompts, kv = job
            results.put(("armed", role, None))
            origin = jobs.get()
            if role == "prefill":
                out = _prefill(packed, requests, prompts, kv, channel, RealClock(origin))
            else:
                out = _decode(packed, requests, seed, kv, channel, RealClock(origin))
            results.put((role, role, out))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        results.put(("error", role, traceback.format_exc()))


def _measure(packed: Any, role: str, spec: dict[str, Any]) -> list[Any]:
    """The calibrator's sweeps for this worker's own work, timed in this process on its cores:
    prefill passes on the prefill worker, decode steps on the decode worker."""
    from pytest_prefill import calibrate as cal
    from pytest_prefill.packed import PackedRunner

    runner = PackedRunner(packed, seed=spec["seed"])
    timing = {"repeats": spec["repeats"], "warmup": spec["warmup"]}
    if role == "prefill":
        return cal.measure_prefill(runner, spec["prompt_lens"], **timing)
    return cal.measure_decode_kv(runner, spec["cache_lens"], **timing) + cal.measure_decode_batch(
        runner, spec["batch_sizes"], context=spec["batch_context"], **timing
    )


def _prefill(
    packed: Any,
    requests: list[Request],
    prompts: dict[str, Any],
    kv: dict[str, Any],
    channel: Any,
    clock: RealClock,
) -> Any:
    import torch

    from pytest_prefill.packed import Segment

    handoff: queue.Queue[Any] = queue.Queue()
    link_events: list[tuple[str, float, float]] = []
    ready_times: dict[str, float] = {}

    def link() -> None:
        # The link is its own resource (a thread): the prefill worker does not wait for it.
        while (item := handoff.get()) is not None:
            r, cache, token = item
            begin = clock.now()
            kv[r.id][:, :, :, : r.prompt_len].copy_(cache.filled())
            end = clock.now()
            link_events.append((r.id, begin, end))
            ready_times[r.id] = end
            channel.put((r.id, token, end))

    mover = threading.Thread(target=link, name="kv-link", daemon=True)
    mover.start()
    times: dict[str, tuple[float, float]] = {}
    for r in requests:
        clock.wait_until(r.arrival)
        start = clock.now()
        cache = packed.new_cache(r.prompt_len)
        logits = packed.forward([Segment(cache, prompts[r.id], "last")])[0]
        token = int(torch.argmax(logits))
        end = clock.now()
        times[r.id] = (start, end)
        handoff.put((r, cache, token))
    handoff.put(None)
    mover.join()
    return times, ready_times, link_events


def _decode(
    packed: Any,
    requests: list[Request],
    seed: int,
    kv: dict[str, Any],
    channel: Any,
    clock: RealClock,
) -> Any:
    executor = ModelExecutor(packed, requests, seed=seed)
    worker = Worker("decode0", "decode")
    arrivals = _QueueArrivals(channel, requests, kv, executor)
    events = EventLog()
    drive(worker, executor, clock, arrivals, events, worker.join)
    tokens = {rid: tuple(t) for rid, t in executor.tokens.items()}
    return worker, events.finish([worker.name]), tokens


class DisaggregatedWorkers:
    """A prefill process and a decode process, started once (loading the model takes seconds)
    and reused for many runs. Use as a context manager, or call :meth:`close`.

    Raises:
        ValueError: on a non-CPU model (two devices would be needed; this build ships KV
            through host shared memory only), or with fewer than two cores.
        RuntimeError: when a worker process fails (its traceback is in the message).
    """

    def __init__(self, model: Any, *, cores: Sequence[int] | None = None) -> None:
        import torch
        import torch.multiprocessing as mp

        from pytest_prefill.packed import PackedModel

        self.packed = PackedModel(model)
        if self.packed.device.type != "cpu":
            count = torch.cuda.device_count() if self.packed.device.type == "cuda" else 0
            raise ValueError(
                "real disaggregation needs two devices, one per worker "
                f"(found {count} CUDA device(s)); this build runs it on CPU only "
                "(--device cpu), with the two workers on disjoint cores"
            )
        cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
        self.prefill_cores, self.decode_cores = split_cores(cores)
        context = mp.get_context("spawn")
        self._channel, self._results = context.Queue(), context.Queue()
        self._jobs = {"prefill": context.Queue(), "decode": context.Queue()}
        self._children = [
            context.Process(
                target=_serve,
                name=f"{role}-worker",
                daemon=True,
                args=(role, model, where, self._jobs[role], self._channel, self._results),
            )
            for role, where in (("prefill", self.prefill_cores), ("decode", self.decode_cores))
        ]
        for child in self._children:
            child.start()
        try:
            self._expect({"ready"}, STARTUP_TIMEOUT)
        except BaseException:
            self.close()
            raise

    @property
    def setup(self) -> str:
        p, d = self.prefill_cores, self.decode_cores
        return (
            f"two processes: prefill worker on cores {p} ({len(p)} torch thread(s)), decode "
            f"worker on cores {d} ({len(d)} torch thread(s)); KV shipped through shared memory "
            "by a link thread in the prefill process"
        )

    def _expect(
        self, tags: set[str], timeout: float, roles: Sequence[str] = ("prefill", "decode")
    ) -> dict[str, Any]:
        """Wait for one message of each tag in ``tags`` from ``roles``; payloads by role."""
        wanted = {(tag, role) for tag in tags for role in roles}
        wanted = {w for w in wanted if w[0] in ("ready", "armed", "measured") or w[0] == w[1]}
        got: dict[str, Any] = {}
        deadline = time.monotonic() + timeout
        while wanted:
            try:
                tag, role, payload = self._results.get(timeout=1.0)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"disaggregated run: no {sorted(wanted)} within {timeout} s"
                    ) from None
                dead = [c.name for c in self._children if c.exitcode is not None]
                if dead:
                    raise RuntimeError(f"disaggregated run: {dead} exited early") from None
                continue
            if tag == "error":
                raise RuntimeError(f"disaggregated run: the {role} worker failed:\n{payload}")
            wanted.discard((tag, role))
            got[role] = payload
        return got

    def calibration_points(
        self,
        *,
        prompt_lens: Sequence[int],
        cache_lens: Sequence[int],
        batch_sizes: Sequence[int],
        batch_context: int,
        repeats: int,
        warmup: int,
        seed: int = 0,
    ) -> list[Any]:
        """``calibrate.Point``s measured by the workers themselves, one worker at a time:
        prefill passes on the prefill worker, decode steps (per cache length, per batch size)
        on the decode worker. Fit them with ``calibrate.fit_cost_model``."""
        spec = {
            "prompt_lens": tuple(prompt_lens),
            "cache_lens": tuple(cache_lens),
            "batch_sizes": tuple(batch_sizes),
            "batch_context": batch_context,
            "repeats": repeats,
            "warmup": warmup,
            "seed": seed,
        }
        points: list[Any] = []
        for role in ("prefill", "decode"):  # one after the other: neither disturbs the other
            self._jobs[role].put(("measure", spec))
            points += self._expect({"measured"}, RUN_TIMEOUT, roles=(role,))[role]
        return points

    def run(
        self, requests: Sequence[Request], *, seed: int = 0, chunk: int | None = None
    ) -> EngineRun:
        """Run ``requests`` (sorted FCFS, arrivals relative to the run's start)."""
        import gc

        requests = list(requests)
        prompts = make_prompts(requests, self.packed.config.vocab_size, seed)
        # KV buffers the decode worker uses, in shared memory: the link copies each prompt's
        # cache into its buffer, which has room for the tokens the request will decode.
        kv = {
            r.id: self.packed.new_cache(r.prompt_len + r.output_len, shared=True).data
            for r in requests
        }
        self._jobs["prefill"].put((requests, seed, prompts, kv))
        self._jobs["decode"].put((requests, seed, None, kv))
        self._expect({"armed"}, STARTUP_TIMEOUT)
        collect = gc.isenabled()
        gc.disable()
        try:
            origin = time.perf_counter() + 0.01
            for jobs in self._jobs.values():
                jobs.put(origin)
            got = self._expect({"prefill", "decode"}, RUN_TIMEOUT)
        finally:
            if collect:
                gc.enable()
        starts, ready_times, link_events = got["prefill"]
        worker, decode_events, tokens = got["decode"]
        events = EventLog()
        for r in requests:
            start, end = starts[r.id]
            events.add("prefill0", start, end, "prefill", ((r.id, r.prompt_len),))
        lengths = {r.id: r.prompt_len for r in requests}
        for rid, begin, end in link_events:
            events.add(LINK, begin, end, "transfer", ((rid, lengths[rid]),))
        times = {r.id: (*starts[r.id], ready_times[r.id]) for r in requests}
        everything = events.finish(["prefill0", LINK]) + tuple(decode_events)
        trace = disaggregated_trace(requests, times, everything, worker, chunk)
        return EngineRun(trace, tokens, self.setup)

    def close(self) -> None:
        for jobs in self._jobs.values():
            try:
                jobs.put(None)
            except (OSError, ValueError):
                pass
        for child in self._children:
            child.join(timeout=10)
            if child.is_alive():
                child.terminate()
                child.join(timeout=5)

    def __enter__(self) -> DisaggregatedWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_disaggregated(
    requests: list[Request],
    model: Any,
    *,
    seed: int,
    cores: Sequence[int],
    chunk: int | None = None,
) -> EngineRun:
    """One disaggregated run on fresh worker processes (see :class:`DisaggregatedWorkers`)."""
    with DisaggregatedWorkers(model, cores=cores) as workers:
        return workers.run(requests, seed=seed, chunk=chunk)
