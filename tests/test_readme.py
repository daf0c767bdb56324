"""The README opens with exactly two commands, and CI runs the second one verbatim; it and the
reference under docs/ import only from the facade, and every file they link to exists."""

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


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def readme_python_imports() -> list[tuple[str, str]]:
    """(module, name) for every ``from pytest_prefill... import name`` in the README's and the
    docs' code."""
    text = "\n".join(path.read_text() for path in documents())
    found = []
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        for module, names in re.findall(r"^from (pytest_prefill[\w.]*) import (.+)$", block, re.M):
            found += [(module, n.strip()) for n in names.split(",") if n.strip()]
    return found


def test_the_readme_imports_only_from_the_facade():
    import pytest_prefill

    imports = readme_python_imports()
    assert imports, "the README shows no Python import"
    deep = [f"{module}.{name}" for module, name in imports if module != "pytest_prefill"]
    assert not deep, f"the README imports past the facade (pytest_prefill/__init__.py): {deep}"
    missing = [name for _, name in imports if name not in pytest_prefill.__all__]
    assert not missing, f"the facade does not export what the README imports: {missing}"


def test_every_file_the_readme_and_the_docs_link_to_exists():
    broken = []
    for path in documents():
        for target in re.findall(r"\]\(([^)#\s]+)\)", path.read_text()):
            if "://" not in target and not (path.parent / target).exists():
                broken.append(f"{path.relative_to(ROOT)} -> {target}")
    assert not broken, f"links to files that do not exist: {broken}"


def test_the_readme_stays_short_and_links_its_reference():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 400, (
        "the README is what a user does; reference goes to docs/"
    )
    linked = set(re.findall(r"\]\(docs/([^)#\s]+\.md)\)", readme))
    unlinked = [p.name for p in (ROOT / "docs").glob("*.md") if p.name not in linked]
    assert not unlinked, f"docs/ files the README does not link to: {unlinked}"


# Files whose citations of a missing DESIGN.md another change is rewriting (may only shrink).
KNOWN_DESIGN_CITATIONS = {"docs/verify.md": "issue 47 re-houses serve/ and rewrites this page"}


def test_the_docs_cite_no_document_the_checkout_lacks():
    """Issue 50 item 9: docs/ cited "DESIGN.md", which no checkout holds."""
    citing = {
        str(path.relative_to(ROOT))
        for path in documents()
        if "DESIGN.md" in path.read_text() and not (ROOT / "DESIGN.md").exists()
    }
    assert citing <= set(KNOWN_DESIGN_CITATIONS), f"cite DESIGN.md: {citing}"
    assert set(KNOWN_DESIGN_CITATIONS) <= citing, "fixed: delete it from KNOWN_DESIGN_CITATIONS"


def test_install_hints_name_the_checkout_not_an_index():
    """Issue 50 item 13: hints said pytest-prefill[plot], which no package index holds."""
    package = ROOT / "pytest_prefill"
    said = [
        str(path.relative_to(ROOT))
        for path in [*package.rglob("*.py"), *documents()]
        if "pytest-prefill[" in path.read_text()
    ]
    assert not said, f'say pip install ".[extra]" instead: {said}'
