"""Where a capacity search's simulations run: inline, a local process pool, or a Dask
``distributed`` cluster (the engine a user who outgrows one machine already runs). Standard
library only: ``distributed`` is an optional extra (``pip install "pytest-prefill[cluster]"``),
imported only when a cluster is asked for, and every worker needs pytest-prefill installed."""

from __future__ import annotations

import concurrent.futures
import contextlib
import math
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

from pytest_prefill.scheduler import check_int

CONNECT_TIMEOUT = 10.0  # seconds to wait for a scheduler before saying none answers
SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")


class InlineExecutor(concurrent.futures.Executor):
    """Runs each task at once in the calling thread (no pool): for tests, tiny searches and
    places where processes cannot be started."""

    def submit(
        self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as err:  # delivered through the future, as a pool would
            future.set_exception(err)
        return future


@contextlib.contextmanager
def local_executor(workers: int | None = None) -> Iterator[concurrent.futures.Executor]:
    """A process pool of ``workers`` processes (default: one per core; 1: :class:`InlineExecutor`)."""
    if workers is not None:
        check_int("workers", workers)
    count = workers or os.cpu_count() or 1
    if count == 1:
        yield InlineExecutor()
        return
    with concurrent.futures.ProcessPoolExecutor(max_workers=count) as pool:
        yield pool


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
    if not isinstance(address, str) or not address.strip():
        raise ValueError(f"cluster address must be like tcp://host:8786, got {address!r}")
    if not (isinstance(timeout, (int, float)) and 0 < timeout < math.inf):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    _check_answers(address.strip(), timeout)
    try:
        from distributed import Client
    except ImportError:
        raise ValueError(
            "a cluster needs Dask's distributed scheduler: pip install 'pytest-prefill[cluster]'"
        ) from None
    try:
        client = Client(address.strip(), timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError) as err:
        raise ValueError(
            f"no Dask scheduler answered at {address} within {timeout:g} s ({err})"
        ) from None
    except ValueError as err:  # e.g. an unknown protocol in the address
        raise ValueError(f"cluster address {address!r}: {err}") from None
    try:
        # pure=False: every probe runs; dask need not hash the workload to name the task
        yield client.get_executor(pure=False)
    finally:
        client.close()


def _check_answers(address: str, timeout: float) -> None:
    """For a ``tcp://host:port`` address, ValueError unless something accepts a connection
    there within ``timeout`` seconds (a refused port fails at once, not after the timeout, and
    no half-made dask client is left to complain at exit)."""
    scheme, sep, rest = address.partition("://")
    if sep and scheme not in SCHEMES:
        raise ValueError(
            f"cluster address {address!r}: the scheme must be one of {', '.join(SCHEMES)}"
        )
    if sep and scheme != "tcp":
        return  # dask's own connect reports those
    host, colon, port = (rest if sep else address).rpartition(":")
    if not colon or not port.isdigit():
        raise ValueError(f"cluster address {address!r} must be like tcp://host:8786")
    try:
        with socket.create_connection((host.strip("[]") or "127.0.0.1", int(port)), timeout):
            pass
    except OSError as err:
        raise ValueError(
            f"no Dask scheduler answered at {address} within {timeout:g} s ({err})"
        ) from None
