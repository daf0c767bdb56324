"""The pytest plugin: ``gpu``, ``sim`` and ``server`` markers, ``--prefill-*`` options (each with
an ini twin), fixtures (``prefill_model``, ``prefill_calibration``, ``prefill_falsifier``,
``cost_model``, ``scheduler``, ``capacity``, ``prefill_report``, ``prefill_server``), a header
line, a short verdict block in the terminal summary (the full tables with ``-v``), and the
per-machine results archive -- written only when ``--prefill-save`` asks (as pytest-benchmark
writes only with ``--benchmark-autosave``).

Imports nothing heavy at import time: torch is imported only when a gpu test or a fixture that
needs the device runs. Under pytest-xdist the workers attach what they record to their test
reports (``user_properties``); only the controller prints the summary and writes the archive,
so ``pytest -n 2`` gives the same summary and archive as a serial run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from pytest_prefill._io import json_safe, write_json_atomic
from pytest_prefill.plugin.options import CPU_MODEL, OPTIONS, Settings, add_options, resolve
from pytest_prefill.plugin.session import (
    GPU_PROPERTY,
    SKIP_PROPERTY,
    STATE,
    USER_PROPERTY,
    Harvester,
    SessionState,
    benchmark_entry,
    device_lock,
    device_unavailable,
    our_skip,
    state_of,
)
from pytest_prefill.plugin.summary import archive_session, write_summary
from pytest_prefill.sim import CostModel, Trace, get_profile, simulate

__all__ = ["OPTIONS", "CapacitySearch", "PrefillReport", "Scheduler", "Settings"]


class Scheduler:
    """:func:`~pytest_prefill.sim.simulate` bound to a cost model and an engine profile
    (``--prefill-engine``; a call's own ``engine=`` wins): ``scheduler("chunked", load,
    chunk=256)``."""

    def __init__(self, cost: CostModel, engine: str = "lab") -> None:
        self.cost, self.engine = cost, engine

    def __call__(self, policy: str, load: Sequence[Any], **options: Any) -> Trace:
        options.setdefault("engine", self.engine)
        return simulate(policy, load, self.cost, **options)

    def __repr__(self) -> str:
        return f"Scheduler({self.cost!r}, engine={self.engine!r})"


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
        from pytest_prefill.report.verdicts import Table

        self._record({"kind": "table", **Table(title, text, data, self.test).to_dict()})

    def verdict(self, name: str, verdict: str, sentence: str, detail: str | None = None) -> None:
        """HOLDS or FAILS for the claim ``sentence`` (printed with it in the summary)."""
        from pytest_prefill.report.verdicts import Verdict

        self._record(
            {"kind": "verdict", **Verdict(name, verdict, sentence, detail, self.test).to_dict()}
        )


class CapacitySearch:
    """:func:`~pytest_prefill.plan.capacity.capacity` bound to the session's cost model, each search
    added to the run's report (its table in the summary, the whole search in the archive):
    ``capacity(load, "ttft:1s,tpot:100ms", 4)``. Simulations run in the test's process unless
    ``workers=N`` (a process pool) or ``executor=`` says otherwise; under the engine profile
    of ``--prefill-engine`` unless ``engine=`` says otherwise."""

    def __init__(
        self, cost: CostModel, report: PrefillReport, cost_label: str, engine: str = "lab"
    ) -> None:
        self.cost, self.report, self.cost_label, self.engine = cost, report, cost_label, engine

    def __call__(
        self,
        workload: Any,
        slo: Any,
        devices: int,
        *,
        title: str | None = None,
        workers: int = 1,
        **options: Any,
    ) -> Any:
        from pytest_prefill.plan.capacity import capacity
        from pytest_prefill.plan.executors import local_executor
        from pytest_prefill.plan.metrics import SLO
        from pytest_prefill.report.capacity import capacity_document, capacity_text

        slo = SLO.parse(slo) if isinstance(slo, str) else slo
        with contextlib.ExitStack() as stack:
            if "executor" not in options:
                options["executor"] = stack.enter_context(local_executor(workers))
            options.setdefault("progress", self.report.say)
            options.setdefault("engine", self.engine)
            result = capacity(workload, self.cost, slo, devices, **options)
        self.report.table(
            title or f"Capacity: {slo} on {devices} device(s); {result.workload}",
            capacity_text(result, self.cost_label),
            capacity_document(result, self.cost_label),
        )
        return result

    def __repr__(self) -> str:
        return f"CapacitySearch({self.cost!r})"


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
    config.addinivalue_line(
        "markers",
        "server: measures a running server (--prefill-server URL); under xdist every other "
        "test waits while one runs",
    )
    if config.option.help or config.option.version:
        return
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and "prefill_settings" in workerinput:
        settings = Settings(**workerinput["prefill_settings"])
        config.stash[STATE] = SessionState(settings, is_worker=True, owns_session_dir=False)
    else:
        config.stash[STATE] = SessionState(
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
    state = state_of(node.config)
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
        device = "none (nvidia-smi sees no GPU; gpu tests skip; --prefill-device cpu runs them)"
    model = f"{s.model} ({s.model_note})" if s.model_note else s.model
    dtype = s.dtype or (
        "auto (float32 on CPU)" if s.device == "cpu" else "auto (bfloat16 on CUDA, float32 on CPU)"
    )
    threads = f" | torch threads {s.threads}" if s.threads else ""
    lines = [
        f"prefill: device {device} | model {model} | dtype {dtype}{threads} | machine "
        f"{s.machine_key} | cost {s.cost_label}",
        f"prefill: the scheduler and capacity fixtures simulate as "
        f"{get_profile(s.engine).label()} (--prefill-engine)",
    ]
    if s.device == "cpu" and s.model != CPU_MODEL:
        lines.append(
            f"prefill: {s.model} on the CPU is slow: a calibration can take most of an hour "
            f"(--prefill-model {CPU_MODEL} takes seconds)"
        )
    return lines + [f"prefill: {note}" for note in s.notes]


def pytest_collection_finish(session: pytest.Session) -> None:
    state = session.config.stash.get(STATE, None)
    if state is None:
        return
    if session.items and not state.order:
        state.order = {item.nodeid: i for i, item in enumerate(session.items)}
    # Every process (each xdist worker collects the same items) decides alike: one session
    # cost model, the calibration when a selected test calibrates and the device is there.
    needs = any("prefill_calibration" in getattr(i, "fixturenames", ()) for i in session.items)
    state.calibrates = needs and device_unavailable(state) is None
    state.measures_server = any(i.get_closest_marker("server") for i in session.items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: Sequence[str]) -> None:
    state = state_of(node.config)
    if not state.order:
        state.order = {nodeid: i for i, nodeid in enumerate(ids)}


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is None:
        return
    reason = device_unavailable(state_of(item.config))
    if reason:
        # reported at the test's location, as a skip marker's would be
        raise pytest.skip.Exception(reason, _use_item_location=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    state = item.config.stash.get(STATE, None)
    gpu = item.get_closest_marker("gpu") is not None
    server = item.get_closest_marker("server") is not None
    timing = state is not None and (state.settings.device == "cpu" or state.measures_server)
    if state is None or not (gpu or server or timing):
        yield
        return
    with device_lock(state, exclusive=gpu or server):
        yield


# --- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def prefill_settings(pytestconfig: pytest.Config) -> Settings:
    """The session's resolved ``--prefill-*`` options."""
    return state_of(pytestconfig).settings


@pytest.fixture(scope="session")
def prefill_model(pytestconfig: pytest.Config) -> Any:
    """The model under test (``--prefill-model`` on ``--prefill-device``), loaded once."""
    state = state_of(pytestconfig)
    reason = device_unavailable(state)
    if reason:
        pytest.skip(reason)
    try:
        from pytest_prefill.measure.models import load_model
    except ImportError as err:
        pytest.skip(
            f"the measurement layer cannot be imported ({err}); "
            "pip install 'pytest-prefill[measure]'"
        )
    s = state.settings
    if s.threads:
        import torch

        torch.set_num_threads(s.threads)  # before anything is timed; in every xdist worker
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
                "torch_threads": s.threads,
            },
        }
    )
    return loaded


@pytest.fixture(scope="session")
def prefill_calibration(request: pytest.FixtureRequest) -> Any:
    """The device's calibration, measured once per session: under xdist the first worker that
    needs it calibrates (holding the device lock) and the others read its result."""
    state = state_of(request.config)
    reason = device_unavailable(state)
    if reason:
        pytest.skip(reason)
    try:
        from pytest_prefill.measure.calibrate import calibrate
        from pytest_prefill.measure.calibration_document import Calibration
    except ImportError as err:
        pytest.skip(f"the calibrator cannot be imported ({err})")
    s = state.settings
    shared = Path(s.session_dir) / "calibration.json"
    with device_lock(state):
        if shared.is_file():
            return Calibration.from_dict(json.loads(shared.read_text(encoding="utf-8")))
        from pytest_prefill.lab.packed import calibration_runner

        loaded = request.getfixturevalue("prefill_model")
        calibration = calibrate(
            loaded,
            repeats=s.repeats,
            warmup=s.warmup,
            dry_run=s.dry_run,
            progress=_progress(request.config),
            runner=calibration_runner(loaded),
        )
        document = calibration.to_dict()
        write_json_atomic(shared, json_safe(document, "calibration"))
    state.record({"kind": "calibration", "data": document})
    return calibration


@pytest.fixture
def prefill_falsifier(
    prefill_model: Any,
    prefill_calibration: Any,
    prefill_settings: Settings,
    prefill_report: PrefillReport,
) -> Callable[..., Any]:
    """The falsifier on the device under test: ``prefill_falsifier(prompt_len=2048)`` states
    its claim before measuring, times a decode step alone, behind a whole prefill and behind
    one chunk (default: the chunk the session calibration's C* gives), records the stall table
    and the HOLDS/FAILS verdict in the summary, and returns the result (``.verdict``,
    ``.verdict_line``, ``.claim``)."""

    def falsify(prompt_len: int | None = None, chunk: int | None = None) -> Any:
        return _falsify(
            prefill_model,
            prefill_calibration.cost,
            prefill_settings,
            prefill_report,
            prompt_len,
            chunk,
        )

    return falsify


def _falsify(
    model: Any,
    cost: CostModel,
    s: Settings,
    report: PrefillReport,
    prompt_len: int | None,
    chunk: int | None,
) -> Any:
    from pytest_prefill.lab.falsifier import CLAIM, DEFAULT_PROMPT_LEN
    from pytest_prefill.report.falsifier import run_falsifier, stall_table_of

    emitted: list[str] = []

    def emit(text: str) -> None:
        emitted.append(text)
        report.say(text)

    result = run_falsifier(
        model,
        prompt_len=prompt_len or DEFAULT_PROMPT_LEN,
        chunk=chunk,
        cost=cost,
        repeats=s.repeats,
        warmup=s.warmup,
        dry_run=s.dry_run,
        emit=emit,
        progress=report.say,
    )
    assert CLAIM in emitted[0], "the claim must be stated before any measurement"
    data = result.to_dict()
    report.table(
        f"Falsifier: a live stream's decode gap when a {result.prompt_len:,}-token prompt "
        f"arrives; chunk {result.chunk:,} ({result.chunk_source})",
        stall_table_of(result),
        {k: v for k, v in data.items() if k != "provenance"},
    )
    report.verdict("falsifier", result.verdict, result.claim, result.verdict_line)
    return result


@pytest.fixture(scope="session")
def cost_model(request: pytest.FixtureRequest) -> CostModel:
    """The session's one cost model: ``--prefill-cost`` when given; else this session's
    calibration when a selected test calibrates (gpu tests on an available device); else the
    lab-laptop preset. The summary and the archive name the same one."""
    state = state_of(request.config)
    s = state.settings
    if s.cost_model is not None and (s.cost_explicit or not state.calibrates):
        return CostModel.from_dict(s.cost_model)
    return request.getfixturevalue("prefill_calibration").cost


@pytest.fixture(scope="session")
def scheduler(cost_model: CostModel, request: pytest.FixtureRequest) -> Scheduler:
    """The simulator bound to ``cost_model`` and ``--prefill-engine``:
    ``scheduler("chunked", load, chunk=256)``."""
    return Scheduler(cost_model, state_of(request.config).settings.engine)


@pytest.fixture
def capacity(
    cost_model: CostModel, prefill_report: PrefillReport, request: pytest.FixtureRequest
) -> CapacitySearch:
    """The capacity search bound to ``cost_model``, reporting each search:
    ``capacity(load, "ttft:1s,tpot:100ms", 4)`` returns a ``CapacityResult``."""
    settings = state_of(request.config).settings
    return CapacitySearch(cost_model, prefill_report, settings.cost_label, settings.engine)


@pytest.fixture(scope="session")
def prefill_server(pytestconfig: pytest.Config) -> Any:
    """The server ``--prefill-server URL`` names, identified, with prompts of exact lengths: a
    ``serve.loadgen.Target`` for ``serve.loadgen.run_load``, ``serve.calibration`` and
    ``serve.fidelity``. Skips without the option; fails with one line when it is unreachable or
    not an OpenAI-compatible server."""
    import asyncio

    from pytest_prefill.serve.http import ServerError, Url
    from pytest_prefill.serve.loadgen import open_target

    url = state_of(pytestconfig).settings.server
    if url is None:
        pytest.skip("no server to measure: give --prefill-server URL (ini prefill_server)")
    try:
        return asyncio.run(open_target(Url.parse(url)))
    except (ServerError, ValueError) as err:
        pytest.fail(f"--prefill-server {url}: {err}", pytrace=False)


@pytest.fixture
def prefill_report(request: pytest.FixtureRequest) -> PrefillReport:
    """Add tables and verdicts to the run's terminal summary and archive."""
    return PrefillReport(
        state_of(request.config).record, request.node.nodeid, _progress(request.config)
    )


def _progress(config: pytest.Config) -> Callable[[str], None] | None:
    """Progress lines on the terminal around output capture (serial runs only)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None or state_of(config).is_worker:
        return None

    def say(line: str) -> None:
        with capture.global_and_fixture_disabled():
            reporter.write_line(f"  prefill: {line}")

    return say


# --- entries travel with the reports ----------------------------------------------------------


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
    bench = benchmark_entry(item, report)
    if bench is not None:
        state.sequence += 1
        entries.append({**bench, "test": item.nodeid, "seq": state.sequence})
    for entry in entries:
        report.user_properties.append((USER_PROPERTY, json.dumps(entry, allow_nan=False)))
    if item.get_closest_marker("gpu") is not None:
        report.user_properties.append((GPU_PROPERTY, True))
    reason = our_skip(state, report)
    if reason is not None:
        report.user_properties.append((SKIP_PROPERTY, reason))


def pytest_sessionstart(session: pytest.Session) -> None:
    state = session.config.stash.get(STATE, None)
    if state is not None and not state.is_worker:
        harvester = Harvester(state, session.config)
        session.config.pluginmanager.register(harvester, "prefill-harvester")


# --- the archive and the summary (controller only) --------------------------------------------


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    archive_session(session, exitstatus)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    write_summary(terminalreporter, config)
