"""Prefill/decode disaggregation for real: a prefill worker and a decode worker as two spawned
processes on disjoint CPU cores, the KV cache of each finished prompt shipped through shared
memory by a link thread, every transfer timed. The decode process schedules with the engine's
:class:`Worker` rules, so the result is the simulator's ``Trace`` type. The workers also
calibrate themselves, both at once (their operating condition), and the link through the path
real transfers take. torch is imported lazily."""

from __future__ import annotations

import os
import queue
import threading
import time
import traceback
from collections.abc import Sequence
from typing import Any

from pytest_prefill.lab.loop import (
    Clock,
    EngineRun,
    ModelBackend,
    RealClock,
    Worker,
    disaggregated_trace,
    drive,
    make_prompts,
    warm_up,
)
from pytest_prefill.sim import LINK, EventLog, Request

STARTUP_TIMEOUT = 300.0  # seconds for a child to import torch and load the model
RUN_TIMEOUT = 3600.0
FILLER_PROMPT = 256  # the prefill worker's filler pass while the decode worker calibrates
FILLER_ROWS = 2  # the decode worker's filler step (rows of FILLER_PROMPT cached tokens)


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


class LinkThread:
    """The KV link as the prefill process runs it: a thread that copies each finished prompt's
    cache into the decode side's shared-memory buffer, then announces ``(id, first token,
    ready time)`` on ``channel``. As in the simulator, a transfer starts when its prefill ends
    or when the link frees, whichever is later, and ends when the copy is done."""

    def __init__(self, kv: dict[str, Any], channel: Any, clock: Clock) -> None:
        self.kv, self.channel, self.clock = kv, channel, clock
        self.events: list[tuple[str, float, float]] = []  # (request id, begin, end)
        self.ready: dict[str, float] = {}
        self._handoff: queue.Queue[Any] = queue.Queue()
        self._free = 0.0
        self._thread = threading.Thread(target=self._move, name="kv-link", daemon=True)
        self._thread.start()

    def send(self, request_id: str, cache: Any, length: int, token: int, ended: float) -> None:
        """Hand over a prompt's ``cache`` (``length`` positions) whose prefill ended at
        ``ended``."""
        self._handoff.put((request_id, cache, length, token, ended))

    def _move(self) -> None:
        while (item := self._handoff.get()) is not None:
            rid, cache, length, token, ended = item
            begin = max(ended, self._free)
            self.kv[rid][:, :, :, :length].copy_(cache.filled())
            end = self.clock.now()
            self._free = end
            self.events.append((rid, begin, end))
            self.ready[rid] = end
            self.channel.put((rid, token, end))

    def close(self) -> None:
        """Wait for every transfer handed over so far."""
        self._handoff.put(None)
        self._thread.join()


class _QueueArrivals:
    """Requests whose KV cache has arrived through ``channel``: ``(id, first token, ready time)``
    messages; a request is handed out at the first boundary at or after its ready time."""

    def __init__(
        self, channel: Any, requests: Sequence[Request], kv: dict[str, Any], backend: ModelBackend
    ) -> None:
        self.channel, self.kv, self.backend = channel, kv, backend
        self.by_id = {r.id: r for r in requests}
        self.left = len(requests)
        self.pending: list[tuple[float, str, int]] = []

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
        from pytest_prefill.lab.packed import KVCache

        self._drain(block=False)
        due = sorted(p for p in self.pending if p[0] <= now)
        self.pending = [p for p in self.pending if p[0] > now]
        out = []
        for _, rid, token in due:
            r = self.by_id[rid]
            self.backend.adopt(r, KVCache(self.kv[rid], length=r.prompt_len), token)
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


def _prefill_pass(packed: Any, batch: Sequence[Request], prompts: dict[str, Any]) -> list[Any]:
    """One packed pass over every prompt of ``batch``: (cache, first token) per request."""
    import torch

    from pytest_prefill.lab.packed import Segment

    caches = [packed.new_cache(r.prompt_len) for r in batch]
    logits = packed.forward([Segment(c, prompts[r.id], "last") for c, r in zip(caches, batch)])  # noqa: B905
    tokens = torch.stack(logits).argmax(dim=-1).tolist()
    return list(zip(caches, tokens))  # noqa: B905


def _prefill(
    packed: Any,
    requests: list[Request],
    prompts: dict[str, Any],
    kv: dict[str, Any],
    channel: Any,
    clock: RealClock,
) -> Any:
    """The prefill worker's run, by ``simulate()``'s rule: whenever it is free, one pass over
    every prompt that has arrived (FCFS, as the shared worker does); each finished prompt
    goes to the link."""
    link = LinkThread(kv, channel, clock)
    passes: list[tuple[float, float, tuple[tuple[str, int], ...]]] = []
    i = 0
    while i < len(requests):
        clock.wait_until(requests[i].arrival)
        start = clock.now()
        batch: list[Request] = []
        while i < len(requests) and requests[i].arrival <= start:
            batch.append(requests[i])
            i += 1
        results = _prefill_pass(packed, batch, prompts)
        end = clock.now()
        passes.append((start, end, tuple((r.id, r.prompt_len) for r in batch)))
        for r, (cache, token) in zip(batch, results):  # noqa: B905
            link.send(r.id, cache, r.prompt_len, token, end)
    link.close()
    return passes, link.ready, link.events


def _decode(
    packed: Any,
    requests: list[Request],
    seed: int,
    kv: dict[str, Any],
    channel: Any,
    clock: RealClock,
) -> Any:
    backend = ModelBackend(packed, requests, seed=seed)
    worker = Worker("decode0", "decode")
    arrivals = _QueueArrivals(channel, requests, kv, backend)
    events = EventLog()
    drive(worker, backend, clock, arrivals, events, worker.join)
    tokens = {rid: tuple(t) for rid, t in backend.tokens.items()}
    return worker, events.finish([worker.name]), tokens


def _measure(packed: Any, role: str, spec: dict[str, Any]) -> list[Any]:
    """The calibrator's sweeps for this worker's own work, timed in this process on its cores:
    prefill and chunk passes on the prefill worker, decode steps on the decode worker."""
    from pytest_prefill.lab.packed import PackedRunner
    from pytest_prefill.measure import sweep as sweeps

    runner = PackedRunner(packed, seed=spec["seed"])
    timing = {"repeats": spec["repeats"], "warmup": spec["warmup"]}
    if role == "prefill":
        budget = sweeps.Budget(spec["budget"], spec["repeats"] + spec["warmup"])
        passes = sweeps.PassSweep(runner, budget=budget, **timing)
        return passes.prefill(spec["prompt_lens"]) + passes.chunks(spec["chunks"])
    kv = sweeps.measure_decode_kv(runner, spec["cache_lens"], rows=spec["kv_rows"], **timing)
    return kv + sweeps.measure_decode_batch(
        runner, spec["batch_sizes"], context=spec["batch_context"], **timing
    )


def _keep_busy(packed: Any, role: str, stop: Any, seed: int) -> None:
    """Work like this worker's own until ``stop`` is set, so that the other worker calibrates
    beside a busy neighbour, as it runs."""
    from pytest_prefill.lab.packed import PackedRunner, Segment

    runner = PackedRunner(packed, seed=seed)
    prompt = runner.tokens(FILLER_PROMPT)
    rows = [runner.synthetic_cache(FILLER_PROMPT, 1) for _ in range(FILLER_ROWS)]
    row_ids = [runner.tokens(1) for _ in rows]
    while not stop.is_set():
        if role == "prefill":
            packed.forward([Segment(packed.new_cache(FILLER_PROMPT), prompt)])
        else:
            for cache in rows:
                cache.length = FILLER_PROMPT
            packed.forward([Segment(c, t) for c, t in zip(rows, row_ids)])  # noqa: B905


def _link_probe(packed: Any, spec: dict[str, Any]) -> list[tuple[int, Any]]:
    """Transfers through the run's own path: a real prefill pass, then its cache handed to a
    :class:`LinkThread` that copies it into a fresh shared-memory buffer from the parent (as in
    a run). Per prompt length: the seconds from the pass's end to the copy's end."""
    from pytest_prefill.lab.packed import PackedRunner, Segment
    from pytest_prefill.measure.timing import Measurement

    runner = PackedRunner(packed, seed=spec["seed"])
    clock = RealClock()
    channel: queue.Queue[Any] = queue.Queue()
    buffers = spec["buffers"]  # (tokens, round) -> shared tensor
    link = LinkThread({}, channel, clock)
    samples: dict[int, list[float]] = {n: [] for n in spec["prompt_lens"]}
    for round_ in range(spec["warmup"] + spec["repeats"]):
        for n in spec["prompt_lens"]:
            rid = f"{n}/{round_}"
            link.kv[rid] = buffers[(n, round_)]
            cache = packed.new_cache(n)
            packed.forward([Segment(cache, runner.tokens(n), "last")])
            ended = clock.now()
            link.send(rid, cache, n, 0, ended)
            _, _, ready = channel.get(timeout=RUN_TIMEOUT)
            if round_ >= spec["warmup"]:
                samples[n].append(ready - ended)
    link.close()
    return [(n, Measurement.from_samples(s, warmup=spec["warmup"])) for n, s in samples.items()]


def _serve(
    role: str, model: Any, cores: list[int], jobs: Any, channel: Any, results: Any, stop: Any
) -> None:
    """A worker process: load once, then run jobs until told to stop (None)."""
    try:
        from pytest_prefill.lab.packed import PackedModel

        _pin(cores)
        packed = PackedModel(model)
        warm_up(packed)
        results.put(("ready", role, None))
        while (job := jobs.get()) is not None:
            if job[0] == "measure":
                results.put(("measured", role, _measure(packed, role, job[1])))
                _keep_busy(packed, role, stop, job[1]["seed"])
                results.put(("idle", role, None))
            elif job[0] == "link":
                results.put(("link", role, _link_probe(packed, job[1])))
            else:
                _, requests, seed, prompts, kv = job
                results.put(("armed", role, None))
                clock = RealClock(jobs.get())
                if role == "prefill":
                    out = _prefill(packed, requests, prompts, kv, channel, clock)
                else:
                    out = _decode(packed, requests, seed, kv, channel, clock)
                results.put(("done", role, out))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        results.put(("error", role, traceback.format_exc()))


class DisaggregatedWorkers:
    """A prefill process and a decode process, started once (loading the model takes seconds)
    and reused for many runs. Use as a context manager, or call :meth:`close`.

    Raises:
        ValueError: on a non-CPU model (two devices would be needed; this build ships KV
            through host shared memory only), or with fewer than two cores.
        RuntimeError: when a worker process fails (its traceback is in the message).
    """

    roles = ("prefill", "decode")

    def __init__(self, model: Any, *, cores: Sequence[int] | None = None) -> None:
        import torch.multiprocessing as mp

        from pytest_prefill.lab.packed import PackedModel

        self.packed = PackedModel(model)
        if self.packed.device.type != "cpu":
            raise ValueError(
                "real disaggregation runs on CPU only in this build (two worker processes on "
                f"disjoint cores, KV through host shared memory); the model is on "
                f"{self.packed.device}"
            )
        cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
        self.prefill_cores, self.decode_cores = split_cores(cores)
        context = mp.get_context("spawn")
        self._channel, self._results = context.Queue(), context.Queue()
        self._stop = context.Event()
        self._jobs = {role: context.Queue() for role in self.roles}
        self._children = [
            context.Process(
                target=_serve,
                name=f"{role}-worker",
                daemon=True,
                args=(
                    role,
                    model,
                    where,
                    self._jobs[role],
                    self._channel,
                    self._results,
                    self._stop,
                ),
            )
            for role, where in zip(self.roles, (self.prefill_cores, self.decode_cores))  # noqa: B905
        ]
        for child in self._children:
            child.start()
        try:
            self._expect("ready", STARTUP_TIMEOUT)
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

    def _expect(self, tag: str, timeout: float, roles: Sequence[str] = roles) -> dict[str, Any]:
        """Wait for one ``tag`` message from each of ``roles``; their payloads by role."""
        wanted = set(roles)
        got: dict[str, Any] = {}
        deadline = time.monotonic() + timeout
        while wanted:
            try:
                kind, role, payload = self._results.get(timeout=1.0)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"disaggregated run: no {tag!r} from {sorted(wanted)} within {timeout} s"
                    ) from None
                dead = [c.name for c in self._children if c.exitcode is not None]
                if dead:
                    raise RuntimeError(f"disaggregated run: {dead} exited early") from None
                continue
            if kind == "error":
                raise RuntimeError(f"disaggregated run: the {role} worker failed:\n{payload}")
            if kind != tag:
                raise RuntimeError(f"disaggregated run: expected {tag!r}, got {kind!r} from {role}")
            wanted.discard(role)
            got[role] = payload
        return got

    def calibration_points(self, spec: dict[str, Any]) -> list[Any]:
        """``calibrate.Point``s measured by the workers themselves, both at once, each beside
        the other working (the one that finishes first keeps working until the other is done):
        prefill and chunk passes on the prefill worker, decode steps on the decode worker.
        ``spec``: prompt_lens, chunks, budget, cache_lens, batch_sizes, batch_context,
        repeats, warmup, seed."""
        self._stop.clear()
        for role in self.roles:
            self._jobs[role].put(("measure", spec))
        got = self._expect("measured", RUN_TIMEOUT)
        self._stop.set()
        self._expect("idle", RUN_TIMEOUT)
        self._stop.clear()
        return got["prefill"] + got["decode"]

    def link_points(
        self, prompt_lens: Sequence[int], *, repeats: int, warmup: int, seed: int = 0
    ) -> list[tuple[int, Any]]:
        """(prompt tokens, Measurement of the seconds from a prefill's end to its KV's arrival)
        through the run's own path (:func:`_link_probe`), while the decode worker idles."""
        rounds = warmup + repeats
        buffers = {
            (n, r): self.packed.new_cache(n + 1, shared=True).data
            for n in prompt_lens
            for r in range(rounds)
        }
        spec = {
            "prompt_lens": tuple(prompt_lens),
            "repeats": repeats,
            "warmup": warmup,
            "seed": seed,
            "buffers": buffers,
        }
        self._jobs["prefill"].put(("link", spec))
        return self._expect("link", RUN_TIMEOUT, roles=("prefill",))["prefill"]

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
        self._jobs["prefill"].put(("run", requests, seed, prompts, kv))
        self._jobs["decode"].put(("run", requests, seed, None, kv))
        self._expect("armed", STARTUP_TIMEOUT)
        collect = gc.isenabled()
        gc.disable()
        try:
            origin = time.perf_counter() + 0.01
            for jobs in self._jobs.values():
                jobs.put(origin)
            got = self._expect("done", RUN_TIMEOUT)
        finally:
            if collect:
                gc.enable()
        return self._assemble(requests, got, chunk)

    def _assemble(
        self, requests: list[Request], got: dict[str, Any], chunk: int | None
    ) -> EngineRun:
        passes, ready_times, link_events = got["prefill"]
        worker, decode_events, tokens = got["decode"]
        events = EventLog()
        starts = {}
        for start, end, pieces in passes:
            events.add("prefill0", start, end, "prefill", pieces, contexts=(0,) * len(pieces))
            starts.update({rid: (start, end) for rid, _ in pieces})
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
        self._stop.set()
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
