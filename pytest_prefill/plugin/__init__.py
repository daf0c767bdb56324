"""The pytest plugin: ``gpu``, ``sim`` and ``server`` markers, ``--prefill-*`` options (each with
an ini twin), fixtures (``prefill_model``, ``prefill_calibration``, ``prefill_falsifier``,
``prefill_cost_model``, ``prefill_scheduler``, ``prefill_capacity``, ``prefill_report``,
``prefill_server``; in :mod:`.fixtures`; ``prefill_verify`` in :mod:`.verify_fixture`), a header
line, a short verdict block in the terminal summary (the full tables with ``-v``), and the
per-machine results archive -- written only when ``--prefill-save`` asks (as pytest-benchmark
writes only with ``--benchmark-autosave``).

Imports nothing heavy at import time: torch is imported only when a gpu test or a fixture that
needs the device runs. Under pytest-xdist the workers attach what they record to their test
reports (``user_properties``); only the controller prints the summary and writes the archive,
so ``pytest -n 2`` gives the same summary and archive as a serial run.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Generator, Iterator, Sequence
from typing import Any

import pytest

from pytest_prefill.plugin.bound import CapacitySearch, PrefillReport, Scheduler

# pytest finds a plugin's fixtures among the plugin module's names: these imports register them.
from pytest_prefill.plugin.fixtures import (  # noqa: F401  (registered, not called here)
    capacity,
    cost_model,
    prefill_calibration,
    prefill_capacity,
    prefill_cost_model,
    prefill_falsifier,
    prefill_model,
    prefill_report,
    prefill_scheduler,
    prefill_server,
    prefill_settings,
    scheduler,
)
from pytest_prefill.plugin.options import (
    CPU_MODEL,
    DEFAULT_ENGINE,
    OPTIONS,
    Settings,
    add_options,
    keep_benchmark_storage_out,
    resolve,
)
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
    lock_mode,
    our_skip,
    state_of,
)
from pytest_prefill.plugin.summary import archive_session, write_summary
from pytest_prefill.plugin.verify_fixture import prefill_verify  # noqa: F401  (registered)
from pytest_prefill.sim import get_profile

__all__ = ["OPTIONS", "CapacitySearch", "PrefillReport", "Scheduler", "Settings"]


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
    keep_benchmark_storage_out(config)
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
        f"prefill: the prefill_scheduler and prefill_capacity fixtures simulate as "
        f"{get_profile(s.engine).label()} "
        + (
            "(the default, as prefill-bench capacity's; --prefill-engine NAME changes it)"
            if s.engine == DEFAULT_ENGINE
            else "(--prefill-engine)"
        ),
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
    gpu_tests = any(i.get_closest_marker("gpu") for i in session.items)
    state.times_device = gpu_tests and device_unavailable(state) is None


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
    mode = None if state is None else lock_mode(state, gpu, server)
    if state is None or mode is None:
        yield
        return
    with device_lock(state, exclusive=mode):
        yield


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
