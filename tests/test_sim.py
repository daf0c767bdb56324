"""The simulator as a folder (pytest_prefill/sim/): a copy of it runs anywhere with the standard
library alone and prints the lab's table; its docstring gives the reading order of every
module; the package's import stays light; ``pytest_prefill.scheduler`` is ``sim`` again
(deprecated)."""

from __future__ import annotations

import ast
import importlib
import re
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


def reading_steps() -> list[set[str]]:
    """The modules each numbered step of the docstring's reading order names."""
    doc = sim.__doc__ or ""
    text = doc[doc.index("Reading order") :]
    modules = {p.stem for p in SIM.glob("*.py") if not p.stem.startswith("__")}
    steps = re.split(r"^\d+\. ", text, flags=re.MULTILINE)[1:]
    return [set(re.findall(r"``(\w+)``", step)) & modules for step in steps]


def sim_imports(stem: str) -> set[str]:
    """The sibling modules ``sim/<stem>.py`` imports (any import, typing only too)."""
    tree = ast.parse((SIM / f"{stem}.py").read_text(encoding="utf-8"))
    return {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
    }


def test_no_step_of_the_reading_order_imports_a_later_step():
    steps = reading_steps()
    named = [m for step in steps for m in step]
    assert len(named) == len(set(named)), "a module named in two steps"
    where = {m: k for k, step in enumerate(steps) for m in step}
    later = [
        f"{m} (step {where[m] + 1}) imports {t} (step {where[t] + 1})"
        for m in where
        for t in sim_imports(m)
        if t in where and where[t] > where[m]
    ]
    assert not later, "the reading order is not the import order:\n" + "\n".join(later)


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
