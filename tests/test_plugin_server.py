"""The plugin's way to a running server: ``--prefill-server URL`` (ini ``prefill_server``), the
``prefill_server`` fixture and the ``server`` marker, tested with pytester against the
reference server."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys

import pytest

# Installed (as CI installs it), the plugin loads from its entry point; naming it again with -p
# registers it twice ("Plugin already registered under a different name").
ENTRY_POINT = any(
    ep.value == "pytest_prefill.plugin" for ep in importlib.metadata.entry_points(group="pytest11")
)
PLUGIN = () if ENTRY_POINT else ("-p", "pytest_prefill.plugin")
USES_THE_FIXTURE = """
    import asyncio
    import pytest
    from pytest_prefill.sim import Request
    from pytest_prefill.serve.load.loadgen import run_load

    @pytest.mark.server
    def test_bench(prefill_server):
        run = asyncio.run(run_load(prefill_server, [Request("r", 0.0, 8, 3)]))
        assert run.completed and run.completed[0].exact
"""


@pytest.fixture(autouse=True)
def _not_inside_xdist(monkeypatch):
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--strict-markers", "--prefill-no-archive", *PLUGIN, *args
    )


@pytest.fixture
def reference_url(tmp_path):
    words = tmp_path / "model"
    words.mkdir()
    listed = [f" w{chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(80)]
    (words / "prefill-words.json").write_text(json.dumps({"words": listed, "ids": list(range(80))}))
    argv = [sys.executable, "-m", "pytest_prefill.serve.launch.reference", "--gap", "0.002"]
    server = subprocess.Popen(
        [*argv, "--model", str(words)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = server.stdout.readline().split("127.0.0.1:")[1].split()[0]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait()


def test_without_a_server_the_fixture_skips_saying_how_to_give_one(pytester):
    pytester.makepyfile(USES_THE_FIXTURE)
    result = run(pytester, "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no server to measure: give --prefill-server URL*"])


def test_a_bad_url_is_a_usage_error_naming_the_option(pytester):
    pytester.makepyfile(USES_THE_FIXTURE)
    result = run(pytester, "--prefill-server", "localhost:8000")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--prefill-server*url must be like http://*"])


def test_an_unreachable_server_fails_in_one_line(pytester):
    pytester.makepyfile(USES_THE_FIXTURE)
    result = run(pytester, "--prefill-server", "http://127.0.0.1:9")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*--prefill-server http://127.0.0.1:9*cannot connect*"])


def test_the_fixture_measures_the_server_the_ini_names(pytester, reference_url):
    # the server lists its model as a folder (as transformers serve does): prompts come from it
    pytester.makeini(f"[pytest]\nprefill_server = {reference_url}\n")
    pytester.makepyfile(USES_THE_FIXTURE)
    run(pytester).assert_outcomes(passed=1)
