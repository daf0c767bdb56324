"""The pytest plugin, run the way users run it: in a fresh folder, through a pytest subprocess
(``pytester.runpytest_subprocess``). Every run uses ``--strict-markers``, so each one also
checks that ``sim`` and ``gpu`` are registered. Hardware-free: where a test needs a
calibration, its conftest replaces the calibrator with a stub (the plugin's wiring is what is
under test here, not the measurement)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_prefill.archive import runs as archive
from pytest_prefill.archive import saving
from pytest_prefill.machine import cpu_key, cpu_model, machine_key, nvidia_accelerators
from pytest_prefill.plan.advice import FittedCost, recommend
from pytest_prefill.sim import CostModel, get_preset

ENTRY_POINT = any(
    ep.value == "pytest_prefill.plugin" for ep in importlib.metadata.entry_points(group="pytest11")
)
PLUGIN = [] if ENTRY_POINT else ["-p", "pytest_prefill.plugin"]
# The stubbed-calibration runs use --prefill-device cpu, which needs torch to be importable.
needs_torch = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="--prefill-device cpu needs torch"
)

# A conftest that stands in for the hardware: a dummy model and a calibrator stub that logs
# each call (so a test can count calibrations across xdist workers).
STUB_CONFTEST = """
import os
import pytest
import pytest_prefill.measure.calibrate as calibrate_module
from pytest_prefill.measure.calibration_document import Calibration
from pytest_prefill.sim import CostModel

COST = CostModel(prefill_pass_overhead=0.002, prefill_per_token=1e-5, decode_step_base=0.02,
                 kv_bytes_per_token=512)
LOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calibrations.log")


def stub_calibrate(loaded, *, repeats, warmup, dry_run=False, progress=None, runner=None):
    with open(LOG, "a") as handle:
        handle.write(f"{os.getpid()}\\n")
    return Calibration(
        COST, {"device": "cpu", "model": "stub", "dtype": "float32", "repeats": repeats},
        (), {}, ())


calibrate_module.calibrate = stub_calibrate


class _Dummy:
    config = None  # no architecture: the calibration runner falls back to the HF forward
    model = None


@pytest.fixture(scope="session")
def prefill_model():
    return _Dummy()
"""
STUB_COST = CostModel(
    prefill_pass_overhead=0.002,
    prefill_per_token=1e-5,
    decode_step_base=0.02,
    kv_bytes_per_token=512,
)

REPORTING_TESTS = """
import os

import pytest
from pytest_prefill.report.sweep import sweep_table
from pytest_prefill.plan.sweep import chunk_sweep
from pytest_prefill.plan.workloads import lab_scenario


@pytest.mark.gpu
@pytest.mark.parametrize("i", range(4))
def test_calibrated(i, prefill_calibration, prefill_report):
    with open("gpu_workers.log", "a") as handle:
        handle.write(os.environ.get("PYTEST_XDIST_WORKER", "serial") + "\\n")
    prefill_report.table(f"C* seen by test {i}", f"{prefill_calibration.cost.chunk_star():.0f}")


@pytest.mark.sim
@pytest.mark.parametrize("chunk", [64, 128, 256, 512])
def test_sweep(chunk, prefill_cost_model, prefill_report):
    rows = chunk_sweep(prefill_cost_model, lab_scenario(), [chunk])
    prefill_report.table(f"sweep at chunk {chunk}", sweep_table(rows), {"chunk": chunk})
    prefill_report.verdict(f"claim {chunk}", "HOLDS" if chunk < 500 else "FAILS",
                           f"chunk {chunk} is below 500 tokens", f"detail for {chunk}")
"""

TORCH_PROBE = """
import pathlib, sys

def pytest_sessionfinish(session):
    heavy = [m for m in ("torch", "numpy", "transformers") if m in sys.modules]
    pathlib.Path(str(session.config.rootpath), "heavy.txt").write_text(" ".join(heavy))
"""


@pytest.fixture(autouse=True)
def _not_inside_xdist(monkeypatch):
    """The inner pytest must not believe it is an xdist worker when the outer one is."""
    for name in (
        "PYTEST_XDIST_WORKER",
        "PYTEST_XDIST_WORKER_COUNT",
        "PYTEST_XDIST_TESTRUNUID",
        "PYTEST_ADDOPTS",
    ):
        monkeypatch.delenv(name, raising=False)


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--strict-markers", *PLUGIN, *args
    )


def this_machine() -> str:
    return machine_key(None, nvidia_accelerators(), cpu_model())


def run_files(results: Path) -> list[Path]:
    return sorted(p for p in results.glob("*/*.json") if p.name != archive.MACHINE_FILE)


def summary_section(lines: list[str]) -> list[str]:
    """The plugin's terminal summary, up to (not including) the archive line."""
    start = next(i for i, line in enumerate(lines) if re.match(r"^=+ pytest-prefill =+$", line))
    end = next(
        i
        for i in range(start, len(lines))
        if lines[i].startswith(("archived:", "not archived", "NOT archived"))
    )
    return lines[start:end]


def test_the_plugin_module_imports_nothing_heavy():
    code = (
        "import sys, pytest_prefill.plugin\n"
        "print(' '.join(m for m in ('torch', 'numpy', 'transformers', 'tabulate') "
        "if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == ""


def test_markers_are_registered(pytester):
    result = run(pytester, "--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.sim:*", "@pytest.mark.gpu:*"])


def test_options_have_ini_twins_in_a_prefill_group(pytester):
    result = run(pytester, "--help")
    result.stdout.fnmatch_lines(["pytest-prefill*"])
    text = result.stdout.str()
    for option in (
        "model",
        "device",
        "dtype",
        "repeats",
        "warmup",
        "dry-run",
        "cost",
        "results",
        "save",
        "no-archive",
        "machine",
        "threads",
    ):
        assert f"--prefill-{option}" in text
        assert f"prefill_{option.replace('-', '_')} " in text  # the [ini] list


GPU_TESTS = """
    import pytest

    @pytest.mark.gpu
    def test_on_the_device():
        pass

    def test_needs_the_model(prefill_model):
        pass

    def test_plain():
        pass
"""
LOOKED_FOR = "no GPU (nvidia-smi sees none) and --prefill-device not given"


@pytest.mark.skipif(bool(nvidia_accelerators()), reason="this machine has an NVIDIA GPU")
def test_gpu_tests_skip_with_a_reason_that_says_what_was_looked_for(pytester):
    pytester.makepyfile(GPU_TESTS)
    result = run(pytester, "-rs")
    result.assert_outcomes(skipped=2, passed=1)
    out = result.stdout.str()
    assert out.count(LOOKED_FOR) == 2, out  # -rs lists them; we do not repeat them
    assert "test_gpu_tests_skip_with_a_reason_that_says_what_was_looked_for.py:" in out


@pytest.mark.skipif(bool(nvidia_accelerators()), reason="this machine has an NVIDIA GPU")
def test_our_skips_are_explained_without_rs_and_torch_is_not_imported_to_find_no_gpu(pytester):
    pytester.makeconftest(TORCH_PROBE)
    pytester.makepyfile(GPU_TESTS)
    result = run(pytester)
    result.assert_outcomes(skipped=2, passed=1)
    result.stdout.fnmatch_lines(["*= pytest-prefill =*", f"skipped 2 test(s): {LOOKED_FOR}*"])
    assert (pytester.path / "heavy.txt").read_text() == "", "nvidia-smi had answered"
    assert not (pytester.path / "results").exists()


def test_sim_fixtures_work_from_a_fresh_test_file_with_ini_settings(pytester):
    pytester.makeconftest(TORCH_PROBE)
    pytester.makefile(".ini", pytest="[pytest]\nprefill_cost = datacenter-illustrative\n")
    pytester.makepyfile("""
        import pytest
        from pytest_prefill import check_invariants, get_preset
        from pytest_prefill.plan.workloads import lab_scenario

        @pytest.mark.sim
        def test_uses_the_fixtures(prefill_scheduler, prefill_cost_model, prefill_settings):
            assert prefill_cost_model == get_preset("datacenter-illustrative").cost
            assert prefill_scheduler.cost is prefill_cost_model
            load = lab_scenario()
            trace = prefill_scheduler("chunked", load, chunk=256)
            assert check_invariants(trace, load, prefill_cost_model) == []
            assert prefill_settings.cost_spec == "datacenter-illustrative"

        @pytest.mark.gpu
        def test_deselected():
            raise AssertionError("-m sim must deselect this")
    """)
    result = run(pytester, "-m", "sim")
    result.assert_outcomes(passed=1, deselected=1)
    result.stdout.fnmatch_lines(
        [
            f"prefill: device * | model * | dtype * | machine {this_machine()} | "
            "cost preset datacenter-illustrative*"
        ]
    )
    assert (pytester.path / "heavy.txt").read_text() == "", "a sim run imported torch/numpy"
    assert not (pytester.path / "results").exists(), "nothing reported, nothing archived"


def test_the_summary_shows_tables_and_verdicts_and_the_archive_holds_them(pytester):
    pytester.makepyfile(
        test_report="""
        import pytest

        @pytest.mark.sim
        def test_reports(prefill_report):
            prefill_report.table("A table of things", "col  val\\n---  ---\\nx    1", {"x": 1})
            prefill_report.verdict("claim-a", "HOLDS", "A is true.", "because of x")
            prefill_report.verdict("claim-b", "FAILS", "B is true.")
            prefill_report.verdict("claim-c", "HOLDS", "C is true.", asserted=False)

        def test_asserts_its_verdict(prefill_report):
            prefill_report.verdict("claim-d", "FAILS", "D is true.")
            assert False, "D does not hold"

        def test_bad_verdict(prefill_report):
            with pytest.raises(ValueError, match="verdict must be one of HOLDS, FAILS"):
                prefill_report.verdict("c", "MAYBE", "C.")

        def test_timed(benchmark):
            benchmark(sum, range(100))

        def test_timed_but_broken(benchmark):
            benchmark(lambda: 1 / 0)
    """
    )
    short = run(pytester, "--prefill-results", "short", "--prefill-save")
    short.assert_outcomes(passed=3, failed=2)
    short.stdout.fnmatch_lines(
        [
            "*= pytest-prefill =*",
            "cost model: preset 'lab-laptop'*",
            f"C* = {get_preset('lab-laptop').cost.chunk_star():.0f} tokens; pass overhead is*",
            "-> *",
            "HOLDS  claim-a: because of x",
            "FAILS  claim-d: D is true.",
            # a FAILS its passing test cannot have asserted, and one its test says it does not
            "reported, not asserted: FAILS  claim-b: B is true.",
            "reported, not asserted: HOLDS  claim-c: C is true.",
            "pytest-benchmark: 2 benchmark(s), 1 errored*",
            "1 table(s): -v shows them here; the archive holds them",
            "archived: *",
        ]
    )
    assert "x    1" not in short.stdout.str(), "the full tables need -v"
    result = run(pytester, "--prefill-results", "out", "-v", "--prefill-save")
    assert not re.search(r"^FAILS  claim-b", short.stdout.str(), re.M)
    result.assert_outcomes(passed=3, failed=2)
    result.stdout.fnmatch_lines(
        [
            "*= pytest-prefill =*",
            "HOLDS  claim-a: because of x",
            "A table of things  [[]test_report.py::test_reports[]]",
            "x    1",
            "Verdicts:",
            "  HOLDS  claim-a: A is true.",
            "         because of x",
            "  FAILS  claim-b: B is true.",
            "archived: *",
            "timeline: *_timeline.svg",
        ]
    )
    files = run_files(pytester.path / "out")
    assert len(files) == 1 and files[0].parent.name == this_machine()
    assert (files[0].parent / archive.MACHINE_FILE).is_file()
    assert re.fullmatch(r"\d{4}_[0-9a-z]{8}_\d{8}_\d{6}(_dirty)?\.json", files[0].name)
    run_ = archive.read_run(files[0]).data
    assert run_["tables"] == [
        {
            "title": "A table of things",
            "text": "col  val\n---  ---\nx    1",
            "data": {"x": 1},
            "test": "test_report.py::test_reports",
        }
    ]
    assert [(v["name"], v["verdict"]) for v in run_["verdicts"]] == [
        ("claim-a", "HOLDS"),
        ("claim-b", "FAILS"),
        ("claim-c", "HOLDS"),
        ("claim-d", "FAILS"),
    ]
    assert [v["asserted"] for v in run_["verdicts"]] == [None, None, False, None]
    assert run_["cost"]["cost_model"] == get_preset("lab-laptop").cost.to_dict()
    lab = get_preset("lab-laptop").cost
    assert run_["cost"]["recommendation"]["line"] == recommend(FittedCost(lab)).line
    assert run_["calibration"] is None
    svg = files[0].parent / run_["attachments"]["timeline.svg"]
    assert svg.name == f"{files[0].stem}_timeline.svg" and "<svg" in svg.read_text()
    benchmarks = {b["test"].rsplit("::", 1)[1]: b for b in run_["benchmarks"]}
    assert benchmarks["test_timed"]["error"] is False
    assert benchmarks["test_timed"]["stats"]["rounds"] >= 1
    assert benchmarks["test_timed_but_broken"]["error"] is True
    assert run_["pytest"]["outcomes"] == {"passed": 3, "failed": 2}


@pytest.mark.skipif(
    importlib.util.find_spec("pytest_benchmark") is None, reason="pytest-benchmark not installed"
)
def test_pytest_benchmark_storage_appears_only_when_asked_for(pytester):
    pytester.makepyfile(test_timed="def test_timed(benchmark):\n    benchmark(sum, range(9))\n")
    run(pytester).assert_outcomes(passed=1)
    assert not (pytester.path / ".benchmarks").exists(), "a plain run leaves .benchmarks/"
    run(pytester, "--benchmark-autosave").assert_outcomes(passed=1)
    assert list((pytester.path / ".benchmarks").rglob("*.json")), "asked for, it is kept"


def test_no_archive_from_the_ini_twin(pytester):
    pytester.makefile(".ini", pytest="[pytest]\nprefill_no_archive = true\n")
    pytester.makepyfile("""
        def test_reports(prefill_report):
            prefill_report.table("T", "text")
    """)
    result = run(pytester)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["not archived (--prefill-no-archive)"])
    assert not (pytester.path / "results").exists()


@needs_torch
def test_a_measured_calibration_is_archived_and_read_back_by_prefill_cost_archive(pytester):
    pytester.makeconftest(STUB_CONFTEST)
    pytester.makepyfile(REPORTING_TESTS)
    first = run(pytester, "-m", "gpu", "--prefill-device", "cpu", "--prefill-save")
    first.assert_outcomes(passed=4, deselected=4)
    key = cpu_key(cpu_model())
    files = run_files(pytester.path / "results")
    assert [f.parent.name for f in files] == [key]
    assert archive.read_run(files[0]).calibration["cost_model"] == STUB_COST.to_dict()

    pytester.makepyfile(
        test_reads_back=f"""
        import pytest
        from pytest_prefill.sim import CostModel

        @pytest.mark.sim
        def test_archived_cost(prefill_cost_model):
            assert prefill_cost_model == CostModel.from_dict({STUB_COST.to_dict()!r})
    """
    )
    second = run(
        pytester, "test_reads_back.py", "--prefill-cost", "archive", "--prefill-device", "cpu"
    )
    second.assert_outcomes(passed=1)
    second.stdout.fnmatch_lines([f"prefill: *cost archive {files[0].name}"])


def test_a_corrupt_archive_file_is_skipped_with_a_message(pytester):
    key = this_machine()
    good = saving.write_run(
        pytester.path / "results",
        key,
        {"calibration": {"cost_model": STUB_COST.to_dict()}},
        commit="abcdef12",
        dirty=False,
        when=__import__("datetime").datetime(2026, 1, 1),
    )
    corrupt = good.parent / "0002_abcdef12_20260102_000000.json"
    corrupt.write_text('{"kind": "pytest-prefill/run", "schema_')
    foreign = good.parent / "notes.json"
    foreign.write_text(json.dumps({"hello": "world"}))
    pytester.makepyfile(f"""
        from pytest_prefill.sim import CostModel

        def test_archived_cost(prefill_cost_model):
            assert prefill_cost_model == CostModel.from_dict({STUB_COST.to_dict()!r})
    """)
    result = run(pytester, "--prefill-cost", "archive")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert f"skipped {corrupt}: not readable JSON" in out
    assert f"skipped {foreign}: not a pytest-prefill run file" in out
    assert f"cost archive {good.name}" in out


@needs_torch
def test_xdist_gives_the_same_summary_and_one_complete_archive(pytester):
    pytester.makeconftest(STUB_CONFTEST)
    pytester.makepyfile(REPORTING_TESTS)
    common = ("--prefill-device", "cpu", "-p", "xdist", "-v", "--prefill-save")
    serial = run(pytester, *common, "--prefill-results", "serial")
    serial.assert_outcomes(passed=8)
    (pytester.path / "calibrations.log").unlink()
    parallel = run(pytester, *common, "-n", "2", "--prefill-results", "parallel")
    parallel.assert_outcomes(passed=8)

    assert summary_section(parallel.outlines) == summary_section(serial.outlines)
    assert "  FAILS  claim 512: chunk 512 is below 500 tokens" in serial.outlines
    finished = [line for line in parallel.outlines if line.startswith("prefill: [gw")]
    assert len(finished) == 4 and all("test_calibrated[" in line for line in finished), (
        "under xdist, one line per finished gpu test"
    )
    calibrations = (pytester.path / "calibrations.log").read_text().split()
    assert len(calibrations) == 1, "one calibration per session, whatever the workers"
    workers = set((pytester.path / "gpu_workers.log").read_text().split()) - {"serial"}
    assert workers == {"gw0", "gw1"}, "both workers needed the calibration"

    serial_files = run_files(pytester.path / "serial")
    parallel_files = run_files(pytester.path / "parallel")
    assert len(serial_files) == len(parallel_files) == 1
    a = archive.read_run(serial_files[0]).data
    b = archive.read_run(parallel_files[0]).data
    for field in ("tables", "verdicts", "calibration", "cost", "settings", "timeline"):
        assert a[field] == b[field], field
    svgs = [
        f.parent / archive.read_run(f).data["attachments"]["timeline.svg"]
        for f in (serial_files[0], parallel_files[0])
    ]
    assert svgs[0].read_text() == svgs[1].read_text()
    assert len(a["tables"]) == 8 and len(a["verdicts"]) == 4
    assert (a["pytest"]["xdist_workers"], b["pytest"]["xdist_workers"]) == (0, 2)
    assert a["pytest"]["outcomes"] == b["pytest"]["outcomes"] == {"passed": 8}


@pytest.mark.parametrize(
    "args, ini, message",
    [
        (["--prefill-repeats", "0"], "", "--prefill-repeats must be an integer >= 1, got '0'"),
        (["--prefill-warmup", "-1"], "", "--prefill-warmup must be an integer >= 0"),
        (["--prefill-device", "gpu0"], "", "--prefill-device: device must be one of cpu, cuda"),
        (["--prefill-dtype", "int8"], "", "--prefill-dtype must be one of float32, bfloat16"),
        (["--prefill-cost", "fastest"], "", "--prefill-cost: unknown cost 'fastest'"),
        (
            ["--prefill-cost", "missing.json"],
            "",
            "--prefill-cost: cost file 'missing.json' does not exist",
        ),
        (
            ["--prefill-cost", "archive"],
            "",
            "--prefill-cost archive: no calibration archived for machine",
        ),
        ([], "prefill_repeats = many", "ini option prefill_repeats must be an integer >= 1"),
        (["--prefill-threads", "0"], "", "--prefill-threads must be an integer >= 1"),
        ([], "prefill_threads = all", "ini option prefill_threads must be an integer >= 1"),
        (["--prefill-machine", "My Box"], "", "--prefill-machine must be lower-case letters"),
        (["--prefill-engine", "tgi"], "", "--prefill-engine: unknown engine profile 'tgi'"),
        ([], "prefill_engine = vlm", "ini option prefill_engine: unknown engine profile 'vlm'"),
        (
            ["--prefill-save", "--prefill-no-archive"],
            "",
            "--prefill-save and --prefill-no-archive contradict each other",
        ),
    ],
)
def test_bad_option_values_are_usage_errors_naming_the_option(pytester, args, ini, message):
    pytester.makefile(".ini", pytest=f"[pytest]\n{ini}\n")
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = run(pytester, *args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()


UNRELATED_TESTS = """
    def test_unrelated():
        assert 1 + 1 == 2

    def test_timed(benchmark):
        benchmark(sum, range(10))
"""


def test_a_project_that_merely_installed_the_plugin_gets_nothing_written(pytester):
    pytester.makepyfile(UNRELATED_TESTS)
    result = run(pytester)
    result.assert_outcomes(passed=2)
    assert not (pytester.path / "results").exists(), "nothing of ours ran: nothing archived"
    assert "pytest-prefill" not in result.stdout.str()


@pytest.mark.parametrize("how", ["option", "ini"])
def test_prefill_save_archives_one_run_holding_the_benchmark_statistics(pytester, how):
    pytester.makepyfile(UNRELATED_TESTS)
    if how == "ini":
        pytester.makefile(".ini", pytest="[pytest]\nprefill_save = true\n")
    result = run(pytester, *(["--prefill-save"] if how == "option" else []))
    result.assert_outcomes(passed=2)
    files = run_files(pytester.path / "results")
    assert len(files) == 1
    data = archive.read_run(files[0]).data
    assert data["tables"] == [] and data["pytest"]["outcomes"] == {"passed": 2}
    assert [b["name"] for b in data["benchmarks"]] == ["test_timed"]
    assert data["benchmarks"][0]["stats"]["rounds"] >= 1
    assert "attachments" not in data, "nothing was simulated: no timeline"


def test_the_machine_key_can_be_set(pytester):
    pytester.makepyfile("""
        def test_reports(prefill_report):
            prefill_report.table("T", "text")
    """)
    run(pytester, "--prefill-machine", "lab-box-1", "--prefill-save").assert_outcomes(passed=1)
    assert [f.parent.name for f in run_files(pytester.path / "results")] == ["lab-box-1"]


SESSION_COST_TESTS = """
import pytest
from pytest_prefill.sim import CostModel


@pytest.mark.gpu
def test_calibrates(prefill_calibration):
    pass


@pytest.mark.sim
def test_sim_table(prefill_cost_model, prefill_report):
    cost = prefill_cost_model.to_dict()
    prefill_report.table("cost seen", repr(cost), cost)
"""


@needs_torch
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--prefill-device", "cpu"], "calibration"),  # gpu tests calibrate: sim tables use it
        (["--prefill-device", "cpu", "-m", "sim"], "preset"),  # nothing calibrates
        (["--prefill-device", "cpu", "--prefill-cost", "lab-laptop"], "preset"),  # said so
    ],
)
def test_one_session_cost_model(pytester, args, expected):
    pytester.makeconftest(STUB_CONFTEST)
    pytester.makepyfile(SESSION_COST_TESTS)
    result = run(pytester, *args, "--prefill-save")
    assert result.ret == 0
    data = archive.read_run(run_files(pytester.path / "results")[0]).data
    seen = CostModel.from_dict(data["tables"][0]["data"])
    want = STUB_COST if expected == "calibration" else get_preset("lab-laptop").cost
    assert seen == want
    assert data["cost"]["cost_model"] == want.to_dict(), "the archive names the same model"
    source = "calibrated in this session" if expected == "calibration" else "preset 'lab-laptop'"
    result.stdout.fnmatch_lines([f"cost model: {source}*"])
    assert data["settings"]["threads"] == 1, "one torch thread by default on the CPU"


# --- bad option values and a failed archive write (issue 13) -----------------------------------


@pytest.mark.parametrize(
    "option",
    [
        "--prefill-cost",
        "--prefill-results",
        "--prefill-model",
        "--prefill-machine",
        "--prefill-repeats",
    ],
)
def test_an_empty_option_value_is_a_usage_error(pytester, option):
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = run(pytester, f"{option}=", "--prefill-save")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"{option} is empty" in result.stderr.str()
    assert not (pytester.path / "results").exists()


@pytest.mark.parametrize(
    ("ini", "message"),
    [
        ("prefill_dry_run = maybe", "ini option prefill_dry_run: invalid truth value 'maybe'"),
        ("prefill_save = perhaps", "ini option prefill_save: invalid truth value 'perhaps'"),
        (
            "prefill_cost = lab-lapto",
            "ini option prefill_cost: unknown cost 'lab-lapto': give a preset (lab-laptop, "
            "datacenter-illustrative)",
        ),
        ("prefill_results = ~nouser-x9/res", "cannot expand '~nouser-x9'"),
    ],
)
def test_a_bad_ini_value_is_a_usage_error_naming_the_option(pytester, ini, message):
    pytester.makefile(".ini", pytest=f"[pytest]\n{ini}\nprefill_machine = box\n")
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert message in result.stderr.str()
    assert not any(p.name.startswith(("~", "results")) for p in pytester.path.iterdir())


def test_a_cost_file_with_a_400_digit_integer_is_a_usage_error_not_an_internal_error(pytester):
    cost = get_preset("lab-laptop").cost.to_dict()
    text = json.dumps(cost).replace(str(cost["link_latency"]), "1" + "0" * 400)
    (pytester.path / "huge.json").write_text(text)
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = run(pytester, "--prefill-cost", "huge.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--prefill-cost: huge.json: not readable JSON (an integer of 401 digits" in (
        result.stderr.str()
    )
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


def test_an_archive_of_only_a_truncated_calibration_names_the_file(pytester):
    key = this_machine()
    path = saving.write_run(
        pytester.path / "results",
        key,
        {"calibration": {"cost_model": STUB_COST.to_dict()}},
        commit="abcdef12",
        dirty=False,
        when=__import__("datetime").datetime(2026, 1, 1),
    )
    path.write_text(path.read_text()[:60])
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = run(pytester, "--prefill-cost", "archive")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "no calibration archived" in err and f"passed over: skipped {path}: not readable" in err


REPORTS_A_TABLE = """
    def test_reports(prefill_report):
        prefill_report.table("T", "text")
"""


def test_a_failed_archive_write_is_a_warning_and_fails_the_run_when_asked_to_save(pytester):
    (pytester.path / "results").mkdir()
    (pytester.path / "results" / "box").write_text("a file where the machine folder goes\n")
    pytester.makepyfile(REPORTS_A_TABLE)
    result = run(pytester, "--prefill-machine", "box", "--prefill-save")
    result.assert_outcomes(passed=1)
    assert result.ret == 1
    warning = [line for line in result.stdout.lines if line.startswith("warning: NOT archived")]
    assert len(warning) == 1 and "exit status 1" in warning[0]


def test_a_table_is_not_a_request_to_archive(pytester):
    """Issue 21: every `pytest -m sim` whose test called prefill_report added a run and an SVG
    under results/; only --prefill-save writes (pytest-benchmark's --benchmark-autosave)."""
    pytester.makepyfile(REPORTS_A_TABLE)
    for _ in range(2):
        result = run(pytester)
        result.assert_outcomes(passed=1)
        assert result.ret == 0
    written = [p for p in pytester.path.rglob("*") if p.suffix in (".json", ".svg")]
    assert not (pytester.path / "results").exists() and written == []
    result.stdout.fnmatch_lines(["not archived: --prefill-save keeps this run under *"])


@pytest.mark.parametrize("how", ["default", "option", "ini"])
def test_the_engine_option_feeds_the_scheduler_and_capacity_fixtures(pytester, how):
    expected = "vllm" if how == "default" else "lab"  # the default is capacity's
    pytester.makefile(".ini", pytest="[pytest]\nprefill_engine = lab\n" if how == "ini" else "")
    pytester.makepyfile(
        test_engine=f"""
        import pytest
        from pytest_prefill.plan.workloads import poisson

        @pytest.mark.sim
        def test_fixtures(prefill_scheduler, prefill_capacity):
            load = poisson(5.0, 20, prompt_len=512, output_len=16)
            assert prefill_scheduler("shared", load).engine.name == "{expected}"
            assert prefill_scheduler("shared", load, engine="sglang").engine.name == "sglang"
            result = prefill_capacity(load, "ttft:2s,tpot:200ms", 2)
            assert result.engine.name == "{expected}"
    """
    )
    args = ["--prefill-engine", "lab"] if how == "option" else []
    result = run(pytester, *args, "-v")
    result.assert_outcomes(passed=1)
    said = "the default, as prefill-bench capacity's" if how == "default" else "--prefill-engine)"
    result.stdout.fnmatch_lines(
        [
            "prefill: the prefill_scheduler and prefill_capacity fixtures simulate as "
            f"engine {expected}*{said}*"
        ]
    )


def test_the_plugin_and_capacity_share_one_default_engine():
    from pytest_prefill.commands import capacity as capacity_command
    from pytest_prefill.plugin import options

    assert options.DEFAULT_ENGINE == capacity_command.DEFAULT_ENGINE


def test_a_search_in_a_test_prints_its_progress_only_with_v(pytester):
    pytester.makepyfile(
        test_quiet="""
        import pytest
        from pytest_prefill.plan.workloads import poisson

        @pytest.mark.sim
        def test_search(prefill_capacity):
            load = poisson(5.0, 20, prompt_len=512, output_len=16)
            prefill_capacity(load, "ttft:2s,tpot:200ms", 2)
    """
    )
    progress = re.compile(r"\(\d+ simulations[^)]*, [\d.]+ s\)")  # a finished deployment's line
    quiet = run(pytester)
    quiet.assert_outcomes(passed=1)
    assert not progress.search(quiet.stdout.str()), "progress lands between the test dots"
    loud = run(pytester, "-v")
    loud.assert_outcomes(passed=1)
    assert progress.search(loud.stdout.str())


def test_the_deploy_options_size_the_cost_models_kv_as_vllm_would(pytester):
    pytester.makepyfile(
        test_deploy="""
        import pytest
        from pytest_prefill.plan.device_memory import kv_capacity
        from pytest_prefill.plan.model_spec import load_model_spec

        @pytest.mark.sim
        def test_kv(prefill_cost_model):
            model = load_model_spec("llama-3-8b")
            assert prefill_cost_model.kv_bytes_per_token == model.kv_bytes_per_token
            assert prefill_cost_model.kv_capacity_tokens == kv_capacity(model, 40 * 2**30).tokens
    """
    )
    args = ["--prefill-deploy-model", "llama-3-8b", "--prefill-device-memory", "40"]
    run(pytester, *args).assert_outcomes(passed=1)
    result = run(pytester, "--prefill-deploy-model", "llama-3-8b", "--prefill-device-memory", "8")
    assert "holds no KV cache for llama-3-8b" in result.stderr.str()
    result = run(pytester, "--prefill-deploy-model", "llama-3-8b")
    assert "go together" in result.stderr.str()


def test_the_capacity_fixture_searches_with_the_session_cost_and_archives_the_search(pytester):
    pytester.makepyfile(
        test_capacity_fixture="""
        import pytest
        from pytest_prefill.plan.workloads import poisson

        @pytest.mark.sim
        def test_search(prefill_capacity, prefill_cost_model):
            load = poisson(5.0, 30, prompt_len=512, output_len=16)
            result = prefill_capacity(load, "ttft:2s,tpot:200ms", 2)
            assert result.cost == prefill_cost_model and result.devices == 2
            labels = {r.deployment.label for r in result.results}
            assert "chunked ≤2048 tok ×2" in labels  # vllm's own budget: the default engine
    """
    )
    result = run(pytester, "--prefill-results", "out", "-v", "--prefill-save")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["Capacity: ttft:2s,tpot:200ms on 2 device(s)*", "-> *"])
    (only,) = run_files(pytester.path / "out")
    (table,) = archive.read_run(only).data["tables"]
    assert table["data"]["kind"] == "pytest-prefill/capacity"
    assert table["data"]["cost_model"] == get_preset("lab-laptop").cost.to_dict()
    assert all(r["probes"] for r in table["data"]["results"])


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("cost_model", "prefill_cost_model"),
        ("scheduler", "prefill_scheduler"),
        ("capacity", "prefill_capacity"),
    ],
)
def test_an_old_fixture_name_warns_and_is_its_prefixed_twin(pytester, old, new):
    pytester.makepyfile(
        test_old_name=f"""
        import pytest

        @pytest.mark.sim
        def test_both({old}, {new}):
            assert {old} is {new}
    """
    )
    result = run(pytester, "-W", "always::pytest.PytestDeprecationWarning")
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(
        [f"*PytestDeprecationWarning: the {old!r} fixture is deprecated*: use {new!r}"]
    )


@pytest.mark.parametrize("verbose", [False, True])
def test_verify_in_a_test_prints_its_progress_only_with_v(monkeypatch, verbose):
    """Issue 29, item 2: the verify fixture's progress ('probe 1: …') landed between the test
    dots; like the capacity fixture's, it shows only with -v."""
    from pytest_prefill.plugin.verify_fixture import Verifier
    from pytest_prefill.serve.calibration.server_calibration import ServerSweep
    from pytest_prefill.verify import verification as verify_module

    seen = {}

    class Stop(Exception):
        pass

    def fake_verify(server, flag_sets, load, slo, options):
        seen["progress"] = options.progress
        raise Stop

    class Report:
        def say(self, text):
            pass

    report = Report()
    monkeypatch.setattr(verify_module, "verify", fake_verify)
    verifier = Verifier(report, "http://127.0.0.1:9", verbose)
    with pytest.raises(Stop):
        verifier(["tokens=128"], [], "ttft:1s", sweep=ServerSweep(128))
    assert (seen["progress"] is not None) is verbose


def test_an_undecided_check_is_said_apart_from_the_verdicts(pytester):
    """Issue 50 item 13: a green run's summary listed "UNDECIDED verify ranking" among its
    verdicts, as if it were one."""
    pytester.makepyfile(
        test_undecided="""
        import pytest

        @pytest.mark.sim
        def test_reports(prefill_report):
            prefill_report.verdict("claim-a", "HOLDS", "A is true.")
            prefill_report.verdict("verify ranking", "UNDECIDED", "R.", "UNDECIDED: too close")
    """
    )
    result = run(pytester)
    result.assert_outcomes(passed=1)
    lines = result.stdout.lines
    section = lines[next(i for i, line in enumerate(lines) if "pytest-prefill" in line) :]
    assert not any(line.startswith("UNDECIDED") for line in section)
    result.stdout.fnmatch_lines(
        ["HOLDS  claim-a: A is true.", "not decided (*): verify ranking: too close"]
    )
