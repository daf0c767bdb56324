"""The plugin's fixtures, each named ``prefill_*`` (a pytest11 plugin shares one fixture namespace
with every project that installs it). ``cost_model``, ``scheduler`` and ``capacity`` are the
earlier names, kept as deprecated aliases until pytest-prefill 0.2: each warns
(``PytestDeprecationWarning``) and returns its ``prefill_*`` twin."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_prefill._io import json_safe, write_json_atomic
from pytest_prefill.plan.advice import Trust
from pytest_prefill.plan.hardware import Hardware
from pytest_prefill.plan.model_spec import load_model_spec
from pytest_prefill.plugin.bound import CapacitySearch, PrefillReport, Scheduler
from pytest_prefill.plugin.options import Settings
from pytest_prefill.plugin.session import device_lock, device_unavailable, state_of
from pytest_prefill.sim import CostModel, simulated_engine

# old name -> its prefill_* twin; the old names go in pytest-prefill 0.2
DEPRECATED_FIXTURES = {
    "cost_model": "prefill_cost_model",
    "scheduler": "prefill_scheduler",
    "capacity": "prefill_capacity",
}


@pytest.fixture(scope="session")
def prefill_settings(pytestconfig: pytest.Config) -> Settings:
    """The session's resolved ``--prefill-*`` options."""
    return state_of(pytestconfig).settings


def _on_the_device(config: pytest.Config) -> Any:
    """The session's state; the test skips, saying why, when the device under test is not
    usable."""
    state = state_of(config)
    reason = device_unavailable(state)
    if reason:
        pytest.skip(reason)
    return state


@pytest.fixture(scope="session")
def prefill_model(pytestconfig: pytest.Config) -> Any:
    """The model under test (``--prefill-model`` on ``--prefill-device``), loaded once."""
    state = _on_the_device(pytestconfig)
    try:
        from pytest_prefill.measure.models import load_model
    except ImportError as err:
        pytest.skip(f"the measurement layer cannot be imported ({err}); pip install '.[measure]'")
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
    state = _on_the_device(request.config)
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
    prefill_settings: Settings,
    prefill_report: PrefillReport,
    request: pytest.FixtureRequest,
) -> Callable[..., Any]:
    """The falsifier on the device under test: ``prefill_falsifier(prompt_len=2048)`` states
    its claim before measuring, times a decode step alone, behind a whole prefill and behind
    one chunk (default: the chunk C* gives -- of ``--prefill-cost`` when given, else of the
    session's calibration -- labelled C* only when that calibration determines it), records
    the stall table and the HOLDS/FAILS verdict in the summary, and returns the result
    (``.verdict``, ``.verdict_line``, ``.claim``)."""

    def falsify(prompt_len: int | None = None, chunk: int | None = None) -> Any:
        given = None if chunk is not None else falsifier_cost(request)
        return _falsify(prefill_model, given, prefill_settings, prefill_report, prompt_len, chunk)

    return falsify


def falsifier_cost(request: pytest.FixtureRequest) -> Any:
    """The cost the falsifier's chunk comes from, with its calibration's refusals and trust:
    ``--prefill-cost`` when given explicitly, else the session's calibration."""
    from pytest_prefill.lab.falsifier import GivenCost

    s = state_of(request.config).settings
    if s.cost_model is not None and s.cost_explicit:
        return GivenCost(
            CostModel.from_dict(s.cost_model),
            tuple(s.cost_refused),
            Trust.from_dict(s.cost_trust),
            s.cost_source,
        )
    calibration = request.getfixturevalue("prefill_calibration")
    return GivenCost(
        calibration.cost,
        tuple(sorted(calibration.refused())),
        calibration.trust(),
        "the session's calibration",
    )


def _falsify(
    model: Any,
    cost: Any,
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
def prefill_cost_model(request: pytest.FixtureRequest) -> CostModel:
    """The session's one cost model: ``--prefill-cost`` when given; else this session's
    calibration when a selected test calibrates (gpu tests on an available device); else the
    lab-laptop preset. The summary and the archive name the same one."""
    state = state_of(request.config)
    s = state.settings
    if s.cost_model is not None and (s.cost_explicit or not state.calibrates):
        cost = CostModel.from_dict(s.cost_model)
    else:
        cost = request.getfixturevalue("prefill_calibration").cost
    if s.deploy is None:
        return cost
    # --prefill-deploy-model: the deployment's KV bytes and capacity, as vLLM would size them
    spec, memory = s.deploy
    engine = simulated_engine(s.engine)
    hardware = Hardware(load_model_spec(spec), memory, max_num_seqs=engine.max_seqs)
    return hardware.instance_cost(cost, 1, engine.kv_block_tokens)


@pytest.fixture(scope="session")
def prefill_scheduler(prefill_cost_model: CostModel, request: pytest.FixtureRequest) -> Scheduler:
    """The simulator bound to ``prefill_cost_model`` and ``--prefill-engine``:
    ``prefill_scheduler("chunked", load, chunk=256)``."""
    return Scheduler(prefill_cost_model, state_of(request.config).settings.engine)


@pytest.fixture
def prefill_capacity(
    prefill_cost_model: CostModel, prefill_report: PrefillReport, request: pytest.FixtureRequest
) -> CapacitySearch:
    """The capacity search bound to ``prefill_cost_model``, reporting each search:
    ``prefill_capacity(load, "ttft:1s,tpot:100ms", 4)`` returns a ``CapacityResult``."""
    settings = state_of(request.config).settings
    progress = prefill_report.say if request.config.option.verbose > 0 else None
    return CapacitySearch(
        prefill_cost_model, prefill_report, settings.cost_label, settings.engine, progress
    )


@pytest.fixture(scope="session")
def prefill_server(pytestconfig: pytest.Config) -> Any:
    """The server ``--prefill-server URL`` names, identified, with prompts of exact lengths: a
    ``serve.load.loadgen.Target`` for ``serve.load.loadgen.run_load``, ``serve.calibration.calibration`` and
    ``serve.fidelity.fidelity``. Skips without the option; fails with one line when it is unreachable or
    not an OpenAI-compatible server."""
    import asyncio

    from pytest_prefill.serve.client.wire import ServerError, Url
    from pytest_prefill.serve.load.loadgen import open_target

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


# --- the earlier names, deprecated -------------------------------------------------------------


def _renamed(request: pytest.FixtureRequest, old: str) -> Any:
    new = DEPRECATED_FIXTURES[old]
    warnings.warn(
        pytest.PytestDeprecationWarning(
            f"the {old!r} fixture is deprecated and goes in pytest-prefill 0.2: use {new!r}"
        ),
        stacklevel=2,
    )
    return request.getfixturevalue(new)


@pytest.fixture(scope="session")
def cost_model(request: pytest.FixtureRequest) -> CostModel:
    """Deprecated: :func:`prefill_cost_model`."""
    return _renamed(request, "cost_model")


@pytest.fixture(scope="session")
def scheduler(request: pytest.FixtureRequest) -> Scheduler:
    """Deprecated: :func:`prefill_scheduler`."""
    return _renamed(request, "scheduler")


@pytest.fixture
def capacity(request: pytest.FixtureRequest) -> CapacitySearch:
    """Deprecated: :func:`prefill_capacity`."""
    return _renamed(request, "capacity")
