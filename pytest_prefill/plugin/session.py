"""The plugin's session state: what each process records, how entries travel from xdist
workers to the controller (``user_properties``), what the controller harvests, and the one
cost model of the session. Imports nothing heavy."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib.util
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_prefill.archive.cost_spec import contexts_in, refusals_in
from pytest_prefill.plan.advice import STAR_CONTEXTS, FittedCost, Trust
from pytest_prefill.plan.cost_document import trust_in
from pytest_prefill.plugin.device import DeviceLock, why_no_device
from pytest_prefill.plugin.options import Settings
from pytest_prefill.sim import CostModel

USER_PROPERTY = "prefill"  # the user_properties name under which entries travel to the controller
GPU_PROPERTY = "prefill-gpu"  # marks a gpu test's reports (the controller's progress lines)
SKIP_PROPERTY = "prefill-skip"  # a skip this plugin made, with its reason
RECORDED = ("table", "verdict", "calibration", "model")  # what our fixtures record


@dataclasses.dataclass
class SessionState:
    """Per-process session state (in ``config.stash``)."""

    settings: Settings
    is_worker: bool
    owns_session_dir: bool
    pending: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    sequence: int = 0
    device_reason: tuple[str | None] | None = None  # cached answer of device_unavailable
    lock: DeviceLock | None = None
    calibrates: bool = False  # a collected test needs the calibration (see session_cost)
    measures_server: bool = False  # a collected test is marked server (every test then locks)
    times_device: bool = False  # a collected gpu test will time an available device
    # the controller's harvest
    order: dict[str, int] = dataclasses.field(default_factory=dict)
    entries: list[tuple[str, int, dict[str, Any]]] = dataclasses.field(default_factory=list)
    outcomes: dict[str, str] = dataclasses.field(default_factory=dict)
    workers: int = 0
    started: datetime.datetime = dataclasses.field(
        default_factory=lambda: datetime.datetime.now(datetime.timezone.utc)
    )
    archive_path: Path | None = None
    archive_note: str | None = None
    skipped: dict[str, int] = dataclasses.field(default_factory=dict)  # our skip reasons

    def record(self, entry: dict[str, Any]) -> None:
        self.sequence += 1
        self.pending.append({**entry, "seq": self.sequence})

    def sorted_entries(self, kind: str) -> list[dict[str, Any]]:
        chosen = [
            (self.order.get(n, len(self.order)), n, e["seq"], e)
            for n, _, e in self.entries
            if e.get("kind") == kind
        ]
        return [e for *_, e in sorted(chosen, key=lambda c: c[:3])]


STATE = pytest.StashKey[SessionState]()


def state_of(config: pytest.Config) -> SessionState:
    return config.stash[STATE]


def device_unavailable(state: SessionState) -> str | None:
    """Why the device under test cannot be used here, or None (asked once per process)."""
    if state.device_reason is None:
        reason = why_no_device(state.settings.device, bool(state.settings.accelerators))
        state.device_reason = (reason,)
        if reason:
            state.skipped.setdefault(reason, 0)  # a skip with this reason is ours
    return state.device_reason[0]


@contextlib.contextmanager
def device_lock(state: SessionState, exclusive: bool = True) -> Iterator[None]:
    """Under xdist, one worker at a time times the device. Serial runs need no lock; neither
    does Windows (no fcntl: the summary cannot vouch for parallel timings there)."""
    if not state.is_worker or importlib.util.find_spec("fcntl") is None:
        yield
        return
    if state.lock is None:
        state.lock = DeviceLock(os.path.join(state.settings.session_dir, "device.lock"))
    with state.lock.hold(exclusive):
        yield


def lock_mode(state: SessionState, gpu: bool, server: bool) -> bool | None:
    """How a test holds the device lock under xdist: True exclusively (a gpu or server test:
    it times), False shared (every other test while the session times anything -- gpu tests
    on any available device, ``--prefill-device cpu``, a server -- so that nothing runs on
    the host beside a timing: an eager engine's passes are host-bound), None not at all."""
    if gpu or server:
        return True
    if state.settings.device == "cpu" or state.measures_server or state.times_device:
        return False
    return None


def benchmark_entry(item: pytest.Item, report: pytest.TestReport) -> dict[str, Any] | None:
    """pytest-benchmark's record of this test, errored ones included and marked."""
    if "benchmark" not in getattr(item, "fixturenames", ()):
        return None
    fixture = getattr(item, "funcargs", {}).get("benchmark")
    if report.when == "setup":
        if not report.failed:
            return None
        return {
            "kind": "benchmark",
            "name": item.name,
            "error": True,
            "outcome": "error",
            "note": "setup failed before the benchmark ran",
            "stats": None,
        }
    if report.when != "call" or fixture is None or not hasattr(fixture, "has_error"):
        return None
    record: dict[str, Any] = {}
    if fixture.stats is not None:
        try:
            record = fixture.stats.as_dict(include_data=False)
        except Exception:  # an errored benchmark may have no rounds to summarise
            record = {}
    note = None
    if fixture.disabled:
        note = (
            "pytest-benchmark did not time this benchmark (disabled: xdist is active, "
            "or --benchmark-disable); run serially for statistics"
        )
    return {
        "kind": "benchmark",
        "name": fixture.name,
        "group": fixture.group,
        "param": fixture.param,
        "error": bool(fixture.has_error or report.failed),
        "disabled": bool(fixture.disabled),
        "outcome": report.outcome,
        "note": note,
        "stats": record.get("stats"),
        "options": record.get("options"),
        "extra_info": record.get("extra_info") or dict(fixture.extra_info),
    }


def our_skip(state: SessionState, report: pytest.TestReport) -> str | None:
    """The reason, when ``report`` is a skip this plugin made (no device, no torch)."""
    if not report.skipped or not isinstance(report.longrepr, tuple):
        return None
    text = str(report.longrepr[2])
    return next((reason for reason in state.skipped if reason in text), None)


class Harvester:
    """Registered on the controller only: collects what workers (or this process) reported,
    and under xdist says when each gpu test finishes (workers have no terminal)."""

    def __init__(self, state: SessionState, config: pytest.Config) -> None:
        self.state = state
        self.config = config
        self.setup_seconds: dict[str, float] = {}  # a session fixture's time counts here

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        state = self.state
        gpu = False
        for name, value in report.user_properties:
            if name == GPU_PROPERTY:
                gpu = True
            elif name == SKIP_PROPERTY and isinstance(value, str) and report.when == "setup":
                state.skipped[value] = state.skipped.get(value, 0) + 1
            elif name == USER_PROPERTY and isinstance(value, str):
                try:
                    entry = json.loads(value)
                except (TypeError, ValueError):
                    continue
                state.entries.append((report.nodeid, entry.get("seq", 0), entry))
        if gpu and state.workers and not report.skipped:
            self._finished(report)
        if report.when == "call" or report.outcome != "passed":
            previous = state.outcomes.get(report.nodeid)
            now = (
                report.outcome
                if report.when == "call"
                else ("error" if report.failed else report.outcome)
            )
            if previous in (None, "passed"):
                state.outcomes[report.nodeid] = now

    def _finished(self, report: pytest.TestReport) -> None:
        """One line per finished gpu test (its call, or a setup that failed), with the time
        its setup took (the session's calibration is set up by the first that needs it)."""
        if report.when == "setup" and not report.failed:
            self.setup_seconds[report.nodeid] = report.duration
            return
        if report.when not in ("call", "setup"):
            return
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        node = getattr(report, "node", None)
        worker = getattr(getattr(node, "gateway", None), "id", None)
        where = f"[{worker}] " if worker else ""
        seconds = report.duration + self.setup_seconds.pop(report.nodeid, 0.0)
        reporter.write_line(f"prefill: {where}{report.nodeid} {report.outcome} in {seconds:.1f} s")


@dataclasses.dataclass(frozen=True)
class SessionCost:
    """The one cost model of the session, as the summary and the archive name it: ``fitted``
    (None: none) and the ``source`` that names it."""

    fitted: FittedCost | None
    source: str


def session_cost(state: SessionState) -> tuple[SessionCost, dict[str, Any] | None]:
    """(the session's cost model, the calibration measured this session if any): the
    explicit ``--prefill-cost``; else this session's calibration; else the preset."""
    s = state.settings
    calibrations = state.sorted_entries("calibration")
    calibration = calibrations[0]["data"] if calibrations else None
    if s.cost_model is not None and (s.cost_explicit or calibration is None):
        cost = CostModel.from_dict(s.cost_model)
        contexts = tuple(s.cost_contexts) or STAR_CONTEXTS
        trust = Trust.from_dict(s.cost_trust)
        fitted = FittedCost(cost, frozenset(s.cost_refused), contexts, trust)
        used = SessionCost(fitted, s.cost_source)
        return used, calibration
    if calibration is not None:
        info = calibration.get("provenance") or {}
        source = (
            f"calibrated in this session: {info.get('model', '?')} on "
            f"{info.get('device_name', info.get('device', '?'))}, {info.get('dtype', '?')}"
        )
        cost = CostModel.from_dict(calibration["cost_model"])
        refused = frozenset(refusals_in(calibration))
        fitted = FittedCost(cost, refused, contexts_in(calibration), trust_in(calibration))
        used = SessionCost(fitted, source)
        return used, calibration
    return SessionCost(None, "measure: no test calibrated this session"), None
