"""The simulator as a folder (pytest_prefill/sim/): a copy of it runs anywhere with the standard
library alone and prints the lab's table; its docstring gives the reading order of every
module; the package's import stays light; ``pytest_prefill.scheduler`` is ``sim`` again
(deprecated)."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_prefill import sim
from pytest_prefill.sim import POLICIES, lab_table

pytestmark = pytest.mark.sim

ROOT = Path(__file__).resolve().parents[1]
SIM = ROOT / "pytest_prefill" / "sim"


def test_a_copy_of_the_folder_runs_alone_with_the_standard_library(tmp_path):
    copy = tmp_path / "elsewhere" / "sim"
    shutil.copytree(SIM, copy, ignore=shutil.ignore_patterns("__pycache__"))
    out = subprocess.run(
        [sys.executable, "-I", "-S", str(copy)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
        check=True,
    ).stdout
    assert out == lab_table() + "\n"
    for policy in POLICIES:
        assert policy in out
    assert "C* = " in out


def test_the_folder_runs_as_a_module_of_the_package_too():
    out = subprocess.run(
        [sys.executable, "-m", "pytest_prefill.sim"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    ).stdout
    assert out == lab_table() + "\n"


def test_the_docstring_gives_the_reading_order_of_every_module():
    doc = sim.__doc__ or ""
    modules = sorted(p.stem for p in SIM.glob("*.py") if not p.stem.startswith("__"))
    missing = [m for m in modules if f"``{m}``" not in doc]
    assert not missing, f"name these modules in sim/__init__.py's reading order: {missing}"
    assert "tests/reference_sim.py" in doc


def test_the_seed_name_is_a_deprecated_re_export_of_sim():
    sys.modules.pop("pytest_prefill.scheduler", None)
    with pytest.warns(DeprecationWarning, match="import from pytest_prefill.sim"):
        scheduler = importlib.import_module("pytest_prefill.scheduler")
    assert scheduler.__all__ == sim.__all__
    for name in sim.__all__:
        assert getattr(scheduler, name) is getattr(sim, name)


def test_importing_the_package_loads_no_heavy_library():
    code = (
        "import sys, pytest_prefill, pytest_prefill.plugin, pytest_prefill.cli; "
        "print(sorted(m for m in ('torch', 'numpy', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    ).stdout
    assert out.strip() == "[]"
