"""The pytest plugin: ``gpu`` and ``sim`` markers, ``--prefill-*`` options (each with an ini
twin), fixtures (``prefill_model``, ``prefill_calibration``, ``cost_model``, ``scheduler``,
``prefill_report``), a header line, the tables and verdicts in the terminal summary, and the
per-machine results archive.

Imports nothing heavy at import time: torch is imported only when a gpu test or a fixture that
needs the device runs. Under pytest-xdist the workers attach what they record to their test
reports (``user_properties``); only the controller prints the summary and writes the archive,
so ``pytest -n 2`` gives the same summary and archive as a serial run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib.util
import json
import os
import shutil
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_prefill import archive
from pytest_prefill._io import write_json_atomic
from pytest_prefill.machine import Accelerator, device_index
from pytest_prefill.plugin_options import OPTIONS, Settings, add_options, resolve
from pytest_prefill.scheduler import CostModel, Trace, simulate

__all__ = ["OPTIONS", "PrefillReport", "Scheduler", "Settings"]

USER_PROPERTY = "prefill"  # the user_properties name under which entries travel to the controller


class Scheduler:
    """:func:`~pytest_prefill.scheduler.simulate` bound to a cost model:
    ``scheduler("chunked", load, chunk=256)``."""

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost

    def __call__(self, policy: str, load: Sequence[Any], **options: Any) -> Trace:
        return simulate(policy, load, self.cost, **options)

    def __repr__(self) -> str:
        return f"Scheduler({self.cost!r})"


class PrefillReport:
    """Adds tables and verdicts to the run's report (terminal summary and archive)."""

    def __init__(
        self,
        record: Callable[[dict[str, Any]], None],
        test: str,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self._record = record
        self._say = say
        self.test = test

    def say(self, text: str) -> None:
        """Show ``text`` on the terminal now, around output capture (serial runs; under xdist
        workers have no terminal and it is dropped: record what matters as a table)."""
        if self._say is not None:
            for line in str(text).splitlines() or [""]:
                self._say(line)

    def table(self, title: str, text: str, data: Any = None) -> None:
        """A formatted table under ``title``; ``data`` (JSON-able) goes into the archive."""
        from pytest_prefill.report import Table

        self._record({"kind": "table", **Table(title, text, data, self.test).to_dict()})

    def verdict(self, name: str, verdict: str, sentence: str, detail: str | None = None) -> None:
        """HOLDS or FAILS for the claim ``sentence`` (printed with it in the summary)."""
        from pytest_prefill.report import Verdict

        self._record(
            {"kind": "verdict", **Verdict(name, verdict, sentence, detail, self.test).to_dict()}
        )


@dataclasses.dataclass
class _State:
    """Per-process session state (in ``config.stash``)."""

    settings: Settings
    is_worker: bool
    owns_session_dir: bool
    pending: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    sequence: int = 0
    device_reason: tuple[str | None] | None = None  # cached answer of _device_unavailable
    lock_depth: int = 0
    lock_fd: int | None = None
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


STATE = pytest.StashKey[_State]()


def _state(config: pytest.Config) -> _State:
    return config.stash[STATE]


# --- options ---------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "sim: needs no hardware (simulator, tables from a cost model)"
    )
    config.addinivalue_line(
        "markers",
        "gpu: real timings on the device under test (skipped "
        "when there is none; --prefill-device cpu runs them on the CPU)",
    )
    if config.option.help or config.option.version:
        return
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "prefill_settings" in workerinput:
        settings = Settings(**workerinput["prefill_settings"])
        config.stash[STATE] = _State(settings, is_worker=True, owns_session_dir=False)
    else:
        config.stash[STATE] = _State(
            resolve(config), is_worker=workerinput is not None, owns_session_dir=True
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is not None and state.owns_session_dir:
        shutil.rmtree(state.settings.session_dir, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist: every worker gets the controller's resolved settings (one 'archive' lookup, one
    machine key, one session folder for the device lock and the shared calibration)."""
    state = _state(node.config)
    state.workers += 1
    node.workerinput["prefill_settings"] = dataclasses.asdict(state.settings)


# --- header, order, skips ----------------------------------------------------------------------


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    state = config.stash.get(STATE, None)
    if state is None:
        return None
    s = state.settings
    if s.device:
        device = s.device
    elif s.accelerators:
        device = f"cuda ({s.accelerators[0]['name']})"
    else:
        device = "auto (nvidia-smi sees no GPU; gpu tests skip unless torch finds CUDA)"
    model = f"{s.model} ({s.model_note})" if s.model_note else s.model
    dtype = s.dtype or (
        "auto (float32 on CPU)" if s.device == "cpu" else "auto (bfloat16 on CUDA, float32 on CPU)"
    )
    lines = [
        f"prefill: device {device} | model {model} | dtype {dtype} | machine "
        f"{s.machine_key} | cost {s.cost_label}"
    ]
    return lines + [f"prefill: {note}" for note in s.notes]


def pytest_collection_finish(session: pytest.Session) -> None:
    state = session.config.stash.get(STATE, None)
    if state is not None and session.items and not state.order:
        state.order = {item.nodeid: i for i, item in enumerate(session.items)}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: Sequence[str]) -> None:
    state = _state(node.config)
    if not state.order:
        state.order = {nodeid: i for i, nodeid in enumerate(ids)}


def _device_unavailable(state: _State) -> str | None:
    """Why the device under test cannot be used here, or None. Asks torch (once)."""
    if state.device_reason is None:
        state.device_reason = (_ask_torch(state.settings.device),)
    return state.device_reason[0]


def _ask_torch(device: str | None) -> str | None:
    missing = (
        "torch is not installed, so nothing can be timed (pip install 'pytest-prefill[measure]')"
    )
    if device == "cpu":
        # the CPU always exists; only the runner's libraries can be missing
        return None if importlib.util.find_spec("torch") else missing
    unless = "--prefill-device not given (--prefill-device cpu runs the hardware suite on the CPU)"
    try:
        import torch
    except ImportError:
        return missing
    if not torch.cuda.is_available():
        if device:
            return (
                f"--prefill-device {device}: no CUDA device found "
                "(torch.cuda.is_available() is False)"
            )
        return f"no CUDA device found (torch.cuda.is_available() is False) and {unless}"
    count = torch.cuda.device_count()
    if device and device_index(device) >= count:
        return f"--prefill-device {device}: only {count} CUDA device(s) visible"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is None:
        return
    reason = _device_unavailable(_state(item.config))
    if reason:
        # reported at the test's location, as a skip marker's would be
        raise pytest.skip.Exception(reason, _use_item_location=True)


@contextlib.contextmanager
def _device_lock(state: _State) -> Iterator[None]:
    """Under xdist, one worker at a time times the device (re-entrant within a process), so
    parallel workers never disturb each other's measurements. Serial runs need no lock."""
    try:
        import fcntl
    except ImportError:  # Windows: no lock; the summary cannot vouch for parallel timings
        fcntl = None  # type: ignore[assignment]
    if not state.is_worker or fcntl is None:
        yield
        return
    if state.lock_depth == 0:
        os.makedirs(state.settings.session_dir, exist_ok=True)  # a remote worker's own host
        fd = os.open(
            os.path.join(state.settings.session_dir, "device.lock"), os.O_CREAT | os.O_RDWR, 0o644
        )
        fcntl.flock(fd, fcntl.LOCK_EX)
        state.lock_fd = fd
    state.lock_depth += 1
    try:
        yield
    finally:
        state.lock_depth -= 1
        if state.lock_depth == 0 and state.lock_fd is not None:
            fcntl.flock(state.lock_fd, fcntl.LOCK_UN)
            os.close(state.lock_fd)
            state.lock_fd = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    state = item.config.stash.get(STATE, None)
    if state is None or item.get_closest_marker("gpu") is None:
        yield
        return
    with _device_lock(state):
        yield


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def prefill_settings(pytestconfig: pytest.Config) -> Settings:
    """The session's resolved ``--prefill-*`` options."""
    return _state(pytestconfig).settings


@pytest.fixture(scope="session")
def prefill_model(pytestconfig: pytest.Config) -> Any:
    """The model under test (``--prefill-model`` on ``--prefill-device``), loaded once."""
    state = _state(pytestconfig)
    reason = _device_unavailable(state)
    if reason:
        pytest.skip(reason)
    try:
        from pytest_prefill.models import load_model
    except ImportError as err:
        pytest.skip(
            f"the measurement layer cannot be imported ({err}); "
            "pip install 'pytest-prefill[measure]'"
        )
    s = state.settings
    try:
        loaded = load_model(s.model, device=s.effective_device, dtype=s.dtype)
    except ValueError as err:
        pytest.fail(f"--prefill-model {s.model}: {err}", pytrace=False)
    state.record(
        {
            "kind": "model",
            "data": {
                "name": loaded.name,
                "source": loaded.source,
                "device": str(loaded.device),
                "dtype": str(loaded.dtype).removeprefix("torch."),
                "kv_bytes_per_token": loaded.kv_bytes_per_token,
            },
        }
    )
    return loaded


@pytest.fixture(scope="session")
def prefill_calibration(request: pytest.FixtureRequest) -> Any:
    """The device's calibration, measured once per session: under xdist the first worker that
    needs it calibrates (holding the device lock) and the others read its result."""
    state = _state(request.config)
    reason = _device_unavailable(state)
    if reason:
        pytest.skip(reason)
    try:
        from pytest_prefill.calibrate import Calibration, calibrate
    except ImportError as err:
        pytest.skip(f"the calibrator cannot be imported ({err})")
    s = state.settings
    shared = Path(s.session_dir) / "calibration.json"
    with _device_lock(state):
        if shared.is_file():
            return Calibration.from_dict(json.loads(shared.read_text(encoding="utf-8")))
        loaded = request.getfixturevalue("prefill_model")
        calibration = calibrate(
            loaded,
            repeats=s.repeats,
            warmup=s.warmup,
            dry_run=s.dry_run,
            progress=_progress(request.config),
        )
        document = calibration.to_dict()
        write_json_atomic(shared, archive.json_safe(document, "calibration"))
    state.record({"kind": "calibration", "data": document})
    return calibration


@pytest.fixture(scope="session")
def cost_model(request: pytest.FixtureRequest) -> CostModel:
    """The session's cost model, as ``--prefill-cost`` says (default: the lab-laptop preset)."""
    s = _state(request.config).settings
    if s.cost_model is not None:
        return CostModel.from_dict(s.cost_model)
    return request.getfixturevalue("prefill_calibration").cost


@pytest.fixture(scope="session")
def scheduler(cost_model: CostModel) -> Scheduler:
    """The simulator bound to ``cost_model``: ``scheduler("chunked", load, chunk=256)``."""
    return Scheduler(cost_model)


@pytest.fixture
def prefill_report(request: pytest.FixtureRequest) -> PrefillReport:
    """Add tables and verdicts to the run's terminal summary and archive."""
    return PrefillReport(
        _state(request.config).record, request.node.nodeid, _progress(request.config)
    )


def _progress(config: pytest.Config) -> Callable[[str], None] | None:
    """Progress lines on the terminal around output capture (serial runs only)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None or _state(config).is_worker:
        return None

    def say(line: str) -> None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"  prefill: {line}")

    return say


# --- entries travel with the reports ----------------------------------------------------------


def _benchmark_entry(item: pytest.Item, report: pytest.TestReport) -> dict[str, Any] | None:
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    outcome = yield
    state = item.config.stash.get(STATE, None)
    if state is None:
        return
    report = outcome.get_result()
    entries, state.pending = state.pending, []
    bench = _benchmark_entry(item, report)
    if bench is not None:
        state.sequence += 1
        entries.append({**bench, "test": item.nodeid, "seq": state.sequence})
    for entry in entries:
        report.user_properties.append((USER_PROPERTY, json.dumps(entry, allow_nan=False)))


class _Harvester:
    """Registered on the controller only: collects what workers (or this process) reported."""

    def __init__(self, state: _State) -> None:
        self.state = state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        state = self.state
        for name, value in report.user_properties:
            if name == USER_PROPERTY and isinstance(value, str):
                try:
                    entry = json.loads(value)
                except (TypeError, ValueError):
                    continue
                state.entries.append((report.nodeid, entry.get("seq", 0), entry))
        if report.when == "call" or report.outcome != "passed":
            previous = state.outcomes.get(report.nodeid)
            now = (
                report.outcome
                if report.when == "call"
                else ("error" if report.failed else report.outcome)
            )
            if previous in (None, "passed"):
                state.outcomes[report.nodeid] = now


def pytest_sessionstart(session: pytest.Session) -> None:
    state = session.config.stash.get(STATE, None)
    if state is not None and not state.is_worker:
        session.config.pluginmanager.register(_Harvester(state), "prefill-harvester")


# --- the archive and the summary (controller only) --------------------------------------------


def _session_cost(state: _State) -> tuple[CostModel | None, dict[str, Any] | None]:
    calibrations = state.sorted_entries("calibration")
    calibration = calibrations[0]["data"] if calibrations else None
    if state.settings.cost_model is not None:
        return CostModel.from_dict(state.settings.cost_model), calibration
    if calibration is not None:
        return CostModel.from_dict(calibration["cost_model"]), calibration
    return None, calibration


def _timeline(cost: CostModel, origin: str) -> str | None:
    try:
        from pytest_prefill.report import lab_timeline_svg
    except ImportError:
        return None
    return lab_timeline_svg(cost, origin)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    state = session.config.stash.get(STATE, None)
    if state is None or state.is_worker:
        return
    tables = state.sorted_entries("table")
    verdicts = state.sorted_entries("verdict")
    benchmarks = state.sorted_entries("benchmark")
    cost, calibration = _session_cost(state)
    if not (tables or verdicts or benchmarks or calibration):
        return
    s = state.settings
    if not s.archive:
        state.archive_note = "not archived (--prefill-no-archive)"
        return
    from pytest_prefill.machine import machine_info

    accelerators = [Accelerator(**a) for a in s.accelerators]
    machine = machine_info(s.device, accelerators)
    machine["key"] = s.machine_key
    commit, dirty = archive.git_state(session.config.rootpath)
    models = state.sorted_entries("model")
    counts: dict[str, int] = {}
    for outcome in state.outcomes.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    # The timeline shows this machine when the run calibrated it, else the session's model.
    drawn = (
        (CostModel.from_dict(calibration["cost_model"]), "calibrated in this run")
        if calibration is not None
        else (cost, s.cost_source)
    )
    svg = None
    try:
        svg = _timeline(drawn[0], drawn[1]) if drawn[0] is not None else None
    except Exception as err:  # a drawing problem must not lose the run
        state.settings.notes.append(f"timeline not drawn: {err}")
    run = {
        "created": state.started.isoformat(timespec="seconds"),
        "finished": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine_key": s.machine_key,
        "machine": machine,
        "commit": commit,
        "dirty": dirty,
        "settings": {
            "model": s.model,
            "device": s.device,
            "dtype": s.dtype,
            "repeats": s.repeats,
            "warmup": s.warmup,
            "dry_run": s.dry_run,
            "cost": s.cost_spec,
        },
        "model": models[0]["data"] if models else None,
        "cost": None
        if cost is None
        else {
            "source": s.cost_source,
            "cost_model": cost.to_dict(),
            "chunk_star": cost.chunk_star(),
        },
        "calibration": calibration,
        "tables": [{k: e[k] for k in ("title", "text", "data", "test")} for e in tables],
        "verdicts": [
            {k: e[k] for k in ("name", "verdict", "sentence", "detail", "test")} for e in verdicts
        ],
        "benchmarks": [
            {"test": e.get("test"), **{k: v for k, v in e.items() if k not in ("kind", "seq")}}
            for e in benchmarks
        ],
        "pytest": {
            "args": list(session.config.invocation_params.args),
            "exit_status": int(exitstatus),
            "xdist_workers": state.workers,
            "outcomes": counts,
        },
        "timeline": {"cost_source": drawn[1], "attachment": "timeline.svg"} if svg else None,
    }
    try:
        archive.write_machine(s.results, machine)
        state.archive_path = archive.write_run(
            s.results,
            s.machine_key,
            run,
            commit=commit,
            dirty=dirty,
            when=state.started.astimezone(),
            attachments={"timeline.svg": svg} if svg else None,
        )
    except (OSError, ValueError) as err:
        state.archive_note = f"NOT archived: {err}"


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(STATE, None)
    if state is None or state.is_worker:
        return
    from pytest_prefill.report import Table, Verdict, summary_lines

    tables = [Table.from_dict(e) for e in state.sorted_entries("table")]
    verdicts = [Verdict.from_dict(e) for e in state.sorted_entries("verdict")]
    benchmarks = state.sorted_entries("benchmark")
    cost, calibration = _session_cost(state)
    s = state.settings
    if not (tables or verdicts or benchmarks or calibration or s.notes):
        return
    tr = terminalreporter
    tr.write_sep("=", "pytest-prefill")
    star = f" (C* = {cost.chunk_star():,.0f} tokens)" if cost is not None else ""
    tr.write_line(f"machine {s.machine_key}; session cost model{star}: {s.cost_source}")
    tr.write_line("")
    for line in summary_lines(tables, verdicts):
        markup = {}
        if line.startswith("  HOLDS"):
            markup = {"green": True, "bold": True}
        elif line.startswith("  FAILS"):
            markup = {"red": True, "bold": True}
        tr.write_line(line, **markup)
    if benchmarks:
        errored = sum(1 for b in benchmarks if b.get("error"))
        untimed = sum(1 for b in benchmarks if b.get("disabled"))
        tr.write_line(
            f"pytest-benchmark: {len(benchmarks)} benchmark(s), {errored} errored, "
            f"{untimed} not timed (disabled){'; run serially for statistics' if untimed else ''}"
        )
    received = len(state.sorted_entries("calibration"))
    if received > 1:  # the session lock should make this impossible; say so if it happens
        tr.write_line(
            f"note: {received} calibrations were reported this session; the "
            "archive holds the first",
            yellow=True,
        )
    for note in s.notes:
        tr.write_line(f"note: {note}", yellow=True)
    if state.archive_path is not None:
        tr.write_line(f"archived: {state.archive_path}")
        svg = state.archive_path.with_name(f"{state.archive_path.stem}_timeline.svg")
        if svg.is_file():
            tr.write_line(f"timeline: {svg}")
    elif state.archive_note:
        tr.write_line(state.archive_note)
