"""Keeping a launched server's compute apart from everything else on a small CPU.

On a box of a few cores the engine that computes the passes shares them with its own HTTP
frontend, vLLM's engine-core loop and our load generator; under load those take CPU from the
passes, so the server steps slower than its calibration said. A first quiet check here (vLLM
CPU 0.32.0, the small model, budget 256, 8 seqs, one server, 2 cores) gave short prompts sent
alone a median TPOT of 7.33 ms unpinned and 5.87 ms pinned, and the measured runs' spread 4.2%
and 1.7%. So a launched server whose compute is a process of its own (vLLM's worker) is pinned:
that process gets the first core this process may use, to itself; every other process of the
server and this process (the load generator) get the rest. The load generator's cores are given
back when the server stops. A server that serves HTTP and computes in one process
(``transformers serve``, ``llama-server``) is not pinned: its frontend would share the compute's
one core. Pinned so, ``transformers serve`` (budget 128, quiet) calibrated about twice as fast
as it then served under load (predicted knee 9.13 req/s, measured 4.27), where unpinned the
same workload gave 4.18 predicted and met the target at 3.82. Linux only
(``os.sched_setaffinity``); elsewhere, or with fewer than 2 cores, nothing is pinned and the
sentence says so. Standard library only."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from typing import Any

# The engines whose compute runs in a child process, by that process's name (/proc/PID/comm,
# at most 15 characters): vLLM's CPU worker calls itself "VLLM::Worker".
COMPUTE_NAMES = {"vllm": ("VLLM::Worker",)}


@dataclasses.dataclass(frozen=True)
class Pinning:
    """Where a launched server and the load generator run: ``engine_cores`` hold the
    ``compute`` processes (PID, name) alone; ``other_cores`` the server's ``others`` and this
    process, whose cores before were ``client_before``; ``why_not``: set when nothing was
    pinned, saying why."""

    engine_cores: tuple[int, ...] = ()
    other_cores: tuple[int, ...] = ()
    compute: tuple[tuple[int, str], ...] = ()
    others: tuple[tuple[int, str], ...] = ()
    client_before: tuple[int, ...] = ()
    why_not: str | None = None

    @property
    def pinned(self) -> bool:
        return self.why_not is None

    def sentence(self) -> str:
        if self.why_not is not None:
            return f"not pinned: {self.why_not}"
        names = ", ".join(sorted({name for _, name in self.compute}))
        return (
            f"pinned: the server's compute ({names}) alone on core(s) {_cores(self.engine_cores)}; "
            f"its {len(self.others)} other process(es) and this load generator on "
            f"{_cores(self.other_cores)}"
        )

    def release(self) -> None:
        """Give the load generator its cores back (the server's processes are left: they end
        with it)."""
        if self.client_before:
            _set_all(os.getpid(), self.client_before)

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine_cores": list(self.engine_cores),
            "other_cores": list(self.other_cores),
            "compute": [list(p) for p in self.compute],
            "others": [list(p) for p in self.others],
            "why_not": self.why_not,
            "sentence": self.sentence(),
        }


def _cores(cores: Iterable[int]) -> str:
    return ",".join(str(c) for c in cores)


def available_cores() -> tuple[int, ...] | None:
    """The cores this process may run on, or None where the platform cannot say."""
    getter = getattr(os, "sched_getaffinity", None)
    return None if getter is None else tuple(sorted(getter(0)))


def split_cores(cores: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The engine's core (the first) and the rest.

    Raises:
        ValueError: for fewer than 2 cores (nothing to keep apart).
    """
    ordered = sorted(set(cores))
    if len(ordered) < 2:
        raise ValueError(f"pinning needs 2 or more cores, got {ordered}")
    return (ordered[0],), tuple(ordered[1:])


def engine_core() -> int | None:
    """The core a launched engine will be pinned to (vLLM binds its OpenMP thread there), or
    None when nothing will be pinned."""
    cores = available_cores()
    return None if cores is None or len(cores) < 2 else split_cores(cores)[0][0]


def group_processes(pgid: int) -> list[tuple[int, str]]:
    """The live processes of process group ``pgid`` (PID, name), read from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                stat = handle.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid:
            found.append((int(entry), name))
    return sorted(found)


def compute_processes(engine: str, processes: Sequence[tuple[int, str]]) -> list[tuple[int, str]]:
    """Which of the server's ``processes`` compute the passes apart from its frontend: those
    named as the engine's worker (:data:`COMPUTE_NAMES`); none for an engine that computes in
    the process that serves HTTP."""
    names = COMPUTE_NAMES.get(engine, ())
    return [p for p in processes if p[1] in names]


def _set_all(pid: int, cores: Iterable[int]) -> None:
    """Every thread of ``pid`` onto ``cores`` (a thread keeps its own mask: setting the
    process's sets its first thread only)."""
    wanted = set(cores)
    try:
        threads = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        threads = [pid]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, wanted)
        except (ProcessLookupError, FileNotFoundError):
            continue  # the thread ended meanwhile


def pin_server(engine: str, leader: int) -> Pinning:
    """Pin the server whose process group ``leader`` leads, and this process, as the module
    says; a :class:`Pinning` that says what was done (or why nothing was)."""
    cores = available_cores()
    if cores is None or not hasattr(os, "sched_setaffinity") or not os.path.isdir("/proc"):
        return Pinning(why_not="this platform cannot set CPU affinity")
    if len(cores) < 2:
        return Pinning(why_not=f"this process may use {len(cores)} core")
    if engine not in COMPUTE_NAMES:
        return Pinning(
            why_not=f"{engine} serves HTTP and computes in one process: on one core its frontend "
            "would take the compute's time (see serve/launch/pinning.py)"
        )
    mine, rest = split_cores(cores)
    processes = group_processes(leader)
    compute = compute_processes(engine, processes)
    if not compute:
        return Pinning(why_not=f"no {engine} compute process found among {processes}")
    others = [p for p in processes if p not in compute]
    try:
        for pid, _ in compute:
            _set_all(pid, mine)
        for pid, _ in others:
            _set_all(pid, rest)
        _set_all(os.getpid(), rest)
    except OSError as err:
        return Pinning(client_before=cores, why_not=f"setting CPU affinity failed: {err}")
    return Pinning(mine, rest, tuple(compute), tuple(others), cores)
