"""The package's layering, read from the source (every import, at module level or inside a
function): no module imports a higher layer (DESIGN.md: simulator core -> measurement ->
engine -> reports and archive -> plugin and CLI), no import cycle, no ``_private`` name taken
from another module, and the simulator core needs nothing outside the standard library.

A new module must be given a layer in ``LAYERS`` below: the test fails until it is. ``KNOWN``
lists the violations that exist today, each with its owner: the list may only shrink (an entry
that no longer occurs fails the test, so whoever fixes one deletes it)."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.sim

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_prefill"

CORE, MEASUREMENT, ENGINE, REPORTS, FRONT = 1, 2, 3, 4, 5
LAYER_NAMES = {
    CORE: "simulator core",
    MEASUREMENT: "measurement",
    ENGINE: "engine",
    REPORTS: "reports and archive",
    FRONT: "plugin and CLI",
}
LAYERS = {
    # 1. simulator core: standard library only (the facade re-exports it)
    "pytest_prefill": CORE,
    "pytest_prefill._io": CORE,
    "pytest_prefill.scheduler": CORE,
    "pytest_prefill.invariants": CORE,
    "pytest_prefill.workloads": CORE,
    "pytest_prefill.metrics": CORE,
    "pytest_prefill.capacity": CORE,
    "pytest_prefill.deployments": CORE,
    "pytest_prefill.executors": CORE,
    "pytest_prefill.timeline": CORE,
    "pytest_prefill.trace_events": CORE,
    "pytest_prefill.whatif": CORE,
    "pytest_prefill.advice": CORE,
    "pytest_prefill.costs": CORE,
    "pytest_prefill.units": CORE,
    # 2. measurement: timing discipline, fits, the model and its runner (torch lazily)
    "pytest_prefill.timing": MEASUREMENT,
    "pytest_prefill.models": MEASUREMENT,
    "pytest_prefill.runner": MEASUREMENT,
    "pytest_prefill.calibrate": MEASUREMENT,
    "pytest_prefill.fitting": MEASUREMENT,
    "pytest_prefill.calibration_fit": MEASUREMENT,
    # 3. engine: the packed pass, the real engine and disaggregation, fidelity, the falsifier
    "pytest_prefill.packed": ENGINE,
    "pytest_prefill.engine": ENGINE,
    "pytest_prefill.disagg": ENGINE,
    "pytest_prefill.fidelity": ENGINE,
    "pytest_prefill.falsifier": ENGINE,
    "pytest_prefill.fidelity_calibration": ENGINE,
    "pytest_prefill.serving": ENGINE,
    # 4. reports and archive: tables, verdicts, rendering, the JSON archive
    "pytest_prefill.report": REPORTS,
    "pytest_prefill.calibration_tables": REPORTS,
    "pytest_prefill.fidelity_tables": REPORTS,
    "pytest_prefill.falsifier_report": REPORTS,
    "pytest_prefill.serving_report": REPORTS,
    "pytest_prefill.comparison": REPORTS,
    "pytest_prefill.archive": REPORTS,
    "pytest_prefill.machine": REPORTS,
    "pytest_prefill.cost_spec": REPORTS,
    # 5. plugin and CLI: thin glue
    "pytest_prefill.__main__": FRONT,
    "pytest_prefill.cli": FRONT,
    "pytest_prefill.commands": FRONT,
    "pytest_prefill.plugin": FRONT,
    "pytest_prefill.plugin_options": FRONT,
    "pytest_prefill.plugin_session": FRONT,
    "pytest_prefill.plugin_device": FRONT,
    "pytest_prefill.plugin_summary": FRONT,
}

# Violations that exist today, with who fixes them. Only ever delete from here.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}
KNOWN_CYCLES: dict[tuple[str, str], str] = {}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer(module: str) -> int | None:
    """The layer of ``module``: its own entry, else its package's (``commands.*``)."""
    while module:
        if module in LAYERS:
            return LAYERS[module]
        module = module.rpartition(".")[0]
    return None


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(tree: ast.AST, typing_only: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """Every node, with whether it sits under ``if TYPE_CHECKING:`` (no runtime import)."""
    for child in ast.iter_child_nodes(tree):
        under = typing_only or (isinstance(child, ast.If) and _type_checking_only(child))
        yield child, under
        yield from _walk(child, under)


def _resolve(module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if modules()[module].name == "__init__.py" else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def imports(module: str, path: Path) -> Iterator[tuple[str, str | None, int, bool]]:
    """(imported module, imported name or None, line, typing only) for each import."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    known = modules()
    for node, typing_only in _walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno, typing_only
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in known:  # `from pytest_prefill import archive`
                    yield submodule, None, node.lineno, typing_only
                else:
                    yield source, alias.name, node.lineno, typing_only


def internal_edges() -> list[tuple[str, str, str | None, int, bool]]:
    known = modules()
    edges = []
    for module, path in known.items():
        for target, name, line, typing_only in imports(module, path):
            if target in known and target != module:
                edges.append((module, target, name, line, typing_only))
    return edges


def test_every_module_has_a_layer():
    missing = sorted(m for m in modules() if layer(m) is None)
    assert not missing, f"give these modules a layer in LAYERS: {missing}"


def upward_imports() -> list[tuple[str, str, int]]:
    return [
        (module, target, line)
        for module, target, _, line, _ in internal_edges()
        if layer(module) is not None and layer(target) is not None and layer(target) > layer(module)
    ]


def test_no_module_imports_a_higher_layer():
    upward = [
        f"{module}:{line} ({LAYER_NAMES[layer(module)]}) imports {target} "
        f"({LAYER_NAMES[layer(target)]})"
        for module, target, line in upward_imports()
        if (module, target) not in KNOWN_UPWARD
    ]
    assert not upward, "upward imports:\n" + "\n".join(upward)
    still = {(module, target) for module, target, _ in upward_imports()}
    fixed = sorted(set(KNOWN_UPWARD) - still)
    assert not fixed, f"fixed, thank you: delete these from KNOWN_UPWARD: {fixed}"


def test_no_private_name_is_imported_from_another_module():
    private = [
        f"{module}:{line} imports {name} from {target}"
        for module, target, name, line, _ in internal_edges()
        if name is not None and name.startswith("_") and not name.startswith("__")
    ]
    assert not private, "promote these to public names where they live:\n" + "\n".join(private)


def cycles(edges: list[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_cycles_finds_a_cycle_and_nothing_else():
    assert cycles([("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]) == [["a", "b", "c"]]
    assert cycles([("a", "b"), ("b", "c")]) == []


def test_no_import_cycle():
    runtime = [(a, b) for a, b, _, _, typing_only in internal_edges() if not typing_only]
    found = {tuple(c) for c in cycles(runtime)}
    new = sorted(found - set(KNOWN_CYCLES))
    assert not new, f"import cycles (TYPE_CHECKING imports excluded): {new}"
    fixed = sorted(set(KNOWN_CYCLES) - found)
    assert not fixed, f"fixed, thank you: delete these from KNOWN_CYCLES: {fixed}"


def test_the_simulator_core_imports_only_the_standard_library_at_module_level():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    foreign = []
    for module, path in modules().items():
        if layer(module) != CORE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:  # module level only: a lazy optional import is allowed
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                if top not in stdlib and top != "pytest_prefill":
                    foreign.append(f"{module}:{node.lineno} imports {name}")
    assert not foreign, "the simulator core is standard library only:\n" + "\n".join(foreign)
