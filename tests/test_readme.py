"""The README opens with exactly two commands, and CI runs the second one verbatim."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.sim
ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "README.md has no ```bash block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_opens_with_two_commands_that_install_then_run():
    commands = readme_commands()
    assert len(commands) == 2
    main_job, tests = commands
    assert main_job.startswith("pip install ") and "prefill-bench" in main_job
    assert tests.startswith("pip install ") and "pytest" in tests


def test_ci_runs_the_readme_test_command_verbatim():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci
