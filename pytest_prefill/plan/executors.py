"""Where a capacity search's simulations run: inline, a local process pool, or a Dask
``distributed`` cluster (the engine a user who outgrows one machine already runs). Standard
library only: ``distributed`` is an optional extra (``pip install ".[cluster]"``),
imported only when a cluster is asked for, and every worker needs pytest-prefill installed."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import math
import multiprocessing
import os
import pickle
import signal
import socket
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pytest_prefill.sim import check_int

FEW_SEARCHES = 2  # a search of this many deployments or fewer runs inline by default
CONNECT_TIMEOUT = 10.0  # seconds to wait for a scheduler before saying none answers
# tls:// needs certificates and ucx:// a UCX build, settings this harness does not take.
SCHEMES = ("tcp",)
# A Dask scheduler greets every connection at once with its handshake: a little-endian 8-byte
# length, then that many bytes (about sixty). Anything announcing more is not a scheduler.
MAX_HANDSHAKE_BYTES = 2**20
WORKERLESS_GRACE = 10.0  # seconds a cluster may have no worker before a search stops waiting


class ExecutorLost(RuntimeError):
    """The executor can no longer run a search's simulations: its workers died (a broken
    process pool, a cluster with no worker left)."""


class ShippedLoad(tuple):
    """A search's requests (a tuple), pickled once however many simulations are sent: every
    simulation of a search ships the same load, and pickling a 12,000-request trace for each
    took a tenth of a second in the caller and as much again to unpickle in the worker. Sent
    to a process, it carries its pickled bytes and a key; each process unpickles it once and
    keeps the latest few by key (:func:`_received`). In the calling process it is the tuple
    itself."""

    key: str
    payload: bytes

    def __new__(cls, items: Iterable[Any]) -> ShippedLoad:
        load = super().__new__(cls, items)
        load.key = uuid.uuid4().hex
        load.payload = b""
        return load

    def __reduce__(self) -> tuple[Any, ...]:
        if not self.payload:
            self.payload = pickle.dumps(tuple(self), protocol=pickle.HIGHEST_PROTOCOL)
        return (_received, (self.key, self.payload))


KEPT_LOADS = 2  # loads a worker process keeps unpickled (a search and its devices-needed)
_LOADS: collections.OrderedDict[str, tuple[Any, ...]] = collections.OrderedDict()


def _received(key: str, payload: bytes) -> tuple[Any, ...]:
    """A :class:`ShippedLoad` in a worker: unpickled the first time this process sees ``key``."""
    if key not in _LOADS:
        _LOADS[key] = pickle.loads(payload)
        while len(_LOADS) > KEPT_LOADS:
            _LOADS.popitem(last=False)
    return _LOADS[key]


class InlineExecutor(concurrent.futures.Executor):
    """Runs each task at once in the calling thread (no pool): for tests, tiny searches and
    places where processes cannot be started."""

    workers = 1  # tasks it runs at once (a search queues the rest in its own order)

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as err:  # delivered through the future, as a pool would
            future.set_exception(err)
        return future


class LocalPool(concurrent.futures.ProcessPoolExecutor):
    """A process pool that says how many tasks it runs at once (``workers``): a search keeps
    no more than that in it, so that the probes it sends next go in the order it chooses
    rather than the order they were queued."""

    workers: int = 1


@contextlib.contextmanager
def local_executor(workers: int | None = None) -> Iterator[concurrent.futures.Executor]:
    """A process pool of ``workers`` processes (default: one per core; 1: :class:`InlineExecutor`).

    The workers ignore SIGINT: Ctrl-C reaches the whole process group, and only the caller
    should hear it (each worker would print a ``KeyboardInterrupt`` traceback). When the block
    ends by an exception (Ctrl-C included) the pool's processes are stopped at once rather than
    waited for: simulations in flight are not finished for a caller who has given up. That
    holds too while the pool waits for its last tasks as the block ends normally: a Ctrl-C
    there once left the command waiting on workers that ignore it, each finishing a
    60,000-request simulation (more than 30 s on a busy 2-core box)."""
    if workers is not None:
        check_int("workers", workers)
    count = workers or os.cpu_count() or 1
    if count == 1:
        yield InlineExecutor()
        return
    before = set(multiprocessing.active_children())
    pool = LocalPool(max_workers=count, initializer=ignore_sigint)
    pool.workers = count
    try:
        yield pool
        pool.shutdown(wait=True)
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        started = [p for p in multiprocessing.active_children() if p not in before]
        for process in started:
            process.terminate()
        for process in started:
            process.join(timeout=5)
        raise


def search_executor(
    searches: int, workers: int | None = None
) -> tuple[contextlib.AbstractContextManager[concurrent.futures.Executor], str]:
    """Where a capacity search of ``searches`` deployments runs by default, and the words that
    say so: ``workers`` processes when given; else one process per core when more than
    :data:`FEW_SEARCHES` deployments are searched (each search runs one simulation at a time,
    so that many keep every core busy), else inline (starting processes and shipping them the
    workload would cost more than it saves)."""
    if workers is not None:
        check_int("workers", workers)
    cores = os.cpu_count() or 1
    count = workers if workers is not None else (cores if searches > FEW_SEARCHES else 1)
    if count == 1:
        few = f" ({FEW_SEARCHES} or fewer deployments: no process pool)" if workers is None else ""
        return local_executor(1), f"in this process{few}"
    basis = "" if workers is not None else " (one per core)"
    return local_executor(count), f"on {count} local processes{basis}"


def ignore_sigint() -> None:
    """A pool worker's initializer: Ctrl-C is for the process that owns the pool."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextlib.contextmanager
def dask_executor(
    address: str, *, timeout: float = CONNECT_TIMEOUT
) -> Iterator[concurrent.futures.Executor]:
    """A ``concurrent.futures`` executor running on the Dask scheduler at ``address``
    (``tcp://host:port``); the connection closes when the block ends.

    Raises:
        ValueError: when ``distributed`` is not installed, the address is empty or the timeout
            not a positive number, or no scheduler answers within ``timeout`` seconds.
    """
    address = check_cluster_address(address)
    if not (isinstance(timeout, (int, float)) and 0 < timeout < math.inf):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    try:
        from distributed import Client
    except ImportError:
        raise ValueError(
            "a cluster needs Dask's distributed scheduler: pip install '.[cluster]'"
        ) from None
    scheduler_answers(address, timeout)
    try:
        client = Client(address, timeout=timeout, set_as_default=False)
    except Exception as err:  # whatever the peer said; it greeted like a scheduler
        raise ValueError(
            f"no Dask scheduler answered at {address} within {timeout:g} s "
            f"({type(err).__name__}: {err})"
        ) from None
    try:
        # pure=False: every probe runs; dask need not hash the workload to name the task
        inner = client.get_executor(pure=False)

        executor = WatchedExecutor(
            inner, lambda: bool(client.nthreads()), f"the cluster at {address}"
        )
        try:
            yield executor
        finally:
            executor.shutdown(wait=False)  # what is still queued is cancelled with the client
    finally:
        client.close()


def check_cluster_address(address: Any) -> str:
    """``address`` stripped, when it has the form ``tcp://host:port`` (or ``host:port``).

    Raises:
        ValueError: naming the form, for anything else (``tls://`` and ``ucx://`` included).
    """
    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"cluster address must be like tcp://host:8786, got {address!r}")
    address = address.strip()
    scheme, sep, rest = address.partition("://")
    if sep and scheme not in SCHEMES:
        raise ValueError(
            f"cluster address {address!r}: only tcp:// is supported (tls:// and ucx:// need "
            "settings this harness does not take)"
        )
    host, colon, port = (rest if sep else address).rpartition(":")
    if not colon or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise ValueError(f"cluster address {address!r} must be like tcp://host:8786")
    return address


class WatchedExecutor(concurrent.futures.Executor):
    """``inner`` (an executor on a cluster), whose pending futures fail with
    :class:`ExecutorLost` once ``alive()`` has said False (no worker) for ``grace`` seconds: a
    cluster whose workers all died would otherwise keep a search waiting for ever."""

    def __init__(
        self,
        inner: concurrent.futures.Executor,
        alive: Callable[[], bool],
        what: str,
        grace: float | None = None,
        poll: float | None = None,
    ) -> None:
        self.inner, self.alive, self.what = inner, alive, what
        self.grace = WORKERLESS_GRACE if grace is None else grace
        self.poll = min(1.0, self.grace / 4) if poll is None else poll
        self._pending: set[concurrent.futures.Future[Any]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watch = threading.Thread(target=self._watchdog, name="cluster-watch", daemon=True)
        self._watch.start()

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        outer: concurrent.futures.Future[Any] = concurrent.futures.Future()
        inner = self.inner.submit(fn, *args, **kwargs)
        with self._lock:
            self._pending.add(outer)

        def deliver(done: concurrent.futures.Future[Any]) -> None:
            with self._lock:
                self._pending.discard(outer)
                if outer.done():
                    return
                if done.cancelled():
                    outer.cancel()
                elif done.exception() is not None:
                    outer.set_exception(done.exception())
                else:
                    outer.set_result(done.result())

        inner.add_done_callback(deliver)
        outer.add_done_callback(lambda f: inner.cancel() if f.cancelled() else None)
        return outer

    def _watchdog(self) -> None:
        since: float | None = None
        while not self._stop.wait(self.poll):
            try:
                ok = self.alive()
            except Exception:  # a scheduler that cannot be asked has no worker for us
                ok = False
            now = time.monotonic()
            since = None if ok else (since if since is not None else now)
            if since is not None and now - since >= self.grace:
                self._fail(
                    ExecutorLost(
                        f"{self.what} has had no worker for {self.grace:g} s; its workers died "
                        "(start new ones, or run locally without --cluster)"
                    )
                )

    def _fail(self, error: BaseException) -> None:
        with self._lock:
            pending, self._pending = self._pending, set()
            for future in pending:
                if not future.done():
                    future.set_exception(error)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._stop.set()
        self.inner.shutdown(wait=wait)  # dask's ClientExecutor takes no cancel_futures


def scheduler_answers(address: str, timeout: float) -> None:
    """ValueError unless a Dask scheduler greets us at ``address`` (``tcp://host:port``) within
    ``timeout`` seconds: its handshake arrives at once on connecting, so a refused port fails at
    once, a peer that accepts and never speaks fails after ``timeout`` (dask's own connect would
    wait on it for minutes), and one that answers with anything else (a length no handshake has)
    fails before dask tries to allocate what it announced. No half-made dask client is left to
    complain at exit."""
    address = check_cluster_address(address)
    host, _, port = address.removeprefix("tcp://").rpartition(":")
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout) as s:
            header = _receive(s, 8, deadline)
            if len(header) == 8:
                (length,) = struct.unpack("<Q", header)
                if not 0 < length <= MAX_HANDSHAKE_BYTES:
                    raise ValueError(
                        f"something at {address} answers, but not as a Dask scheduler (its "
                        f"first 8 bytes, {header!r}, are no handshake)"
                    )
                body = _receive(s, length, deadline)
                if len(body) == length:
                    return
            raise ValueError(
                f"something at {address} accepted the connection and closed it without a "
                "Dask scheduler's handshake"
            )
    except TimeoutError:
        raise ValueError(
            f"something at {address} accepts connections but sent no Dask scheduler "
            f"handshake within {timeout:g} s (is it a Dask scheduler?)"
        ) from None
    except OSError as err:
        raise ValueError(
            f"no Dask scheduler answered at {address} within {timeout:g} s ({err})"
        ) from None


def _receive(sock: socket.socket, count: int, deadline: float) -> bytes:
    """Up to ``count`` bytes, fewer when the peer closes; TimeoutError at ``deadline``."""
    data = b""
    while len(data) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        sock.settimeout(left)
        chunk = sock.recv(count - len(data))
        if not chunk:
            break
        data += chunk
    return data
