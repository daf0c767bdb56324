"""A verification ended by a signal keeps what it measured, as ``bench`` does: SIGINT (Ctrl-C),
SIGTERM (``timeout``, a cancelled CI job) or SIGHUP (a closed terminal) is heard once. Outside
the event loop (a server starting, between flag sets) it is raised as :class:`Interrupted`;
inside it (calibration, load check, probes) it cancels the running task where it next waits,
whose stages then end their flag set with one line, keeping the probes that finished (the one
cut short is neither met nor missed). Later signals are ignored while the run winds up (its
server being stopped, what it measured being kept); the handlers before are restored after.
Standard library only."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

INTERRUPTING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A signal of :data:`INTERRUPTING` heard outside the event loop."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def exit_status(name: str) -> int:
    """A shell's status for a command ended by the signal ``name`` (``SIGINT``: 130)."""
    return 128 + int(signal.Signals[name])


class Interruption:
    """The first signal of :data:`INTERRUPTING` heard while a verification runs (``signum``,
    None before one)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def name(self) -> str:
        """``SIGINT``, ``SIGTERM``, ``SIGHUP``; "" before a signal."""
        return signal.Signals(self.signum).name if self.signum is not None else ""

    @property
    def line(self) -> str | None:
        """``interrupted by SIGINT`` once a signal was heard, else None."""
        return f"interrupted by {self.name}" if self.signum is not None else None

    def _first(self, signum: int) -> bool:
        first = self.signum is None
        if first:
            self.signum = signum
        return first

    @contextlib.contextmanager
    def raising(self) -> Iterator[None]:
        """Inside, the first signal raises :class:`Interrupted`."""

        def handler(signum: int, frame: FrameType | None) -> None:
            if self._first(signum):
                raise Interrupted(signum)

        with _handled(handler):
            yield

    @contextlib.contextmanager
    def cancelling(self) -> Iterator[None]:
        """In a coroutine: inside, the first signal is heard at once and cancels its task
        where it waits next (from the loop, between its steps: one that has returned its result
        keeps it)."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()

        def cancel() -> None:
            if task is not None and not task.done():
                task.cancel()

        def handler(signum: int, frame: FrameType | None) -> None:
            if self._first(signum):
                with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                    loop.call_soon_threadsafe(cancel)

        with _handled(handler):
            yield


@contextlib.contextmanager
def _handled(handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """``handler`` for each signal of :data:`INTERRUPTING` inside (in the main thread;
    elsewhere nothing changes), the handlers before restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {signum: signal.getsignal(signum) for signum in INTERRUPTING}
    for signum in INTERRUPTING:
        signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, previous in before.items():
            if previous is not None:  # None: one set outside Python, left as it is
                signal.signal(signum, previous)
