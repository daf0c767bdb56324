"""The package's layering, read from the source tree: a module's folder is its layer (DESIGN.md,
"Layout: the folder is the layer"), and every import (at module level or inside a function) goes
to the same layer or one below. Also: no import cycle, no ``_private`` name taken from another
module, nothing outside the standard library under ``sim/`` and ``plan/``, no module over 600
lines and no function over 60 lines of code.

There is no per-module list to keep: a new module takes its folder's layer. The ``KNOWN_*``
dicts name the exceptions that exist today, each with its reason; they may only shrink (an entry
that no longer occurs fails the test, so whoever fixes one deletes it)."""

from __future__ import annotations

import ast
import functools
import io
import sys
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.sim

PACKAGE = Path(__file__).resolve().parents[1] / "pytest_prefill"

# The layers from the bottom; each folder (or root module) on one rung. A module may import its
# own rung and the rungs below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_io", "units", "machine"),  # small leaf utilities at the package root
    ("sim", "scheduler"),  # the simulator core (scheduler.py: the seed's name, deprecated)
    ("plan", "__init__"),  # traffic and planning; the facade re-exports sim and plan
    ("measure",),
    ("lab", "serve"),
    ("verify",),  # a capacity answer checked on a server: knees, the load check, the ranking
    ("archive",),
    ("report",),
    # the hardware suite (tests shipped with the package: pytest --pyargs pytest_prefill.suite)
    ("plugin", "commands", "cli", "__main__", "suite"),
)
STDLIB_ONLY = ("sim", "plan", "_io", "units", "machine", "scheduler")
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60

# Exceptions that exist today, each with its reason. Only ever delete from here.
KNOWN_UPWARD: dict[tuple[str, str], str] = {}
KNOWN_CYCLES: dict[tuple[str, ...], str] = {}
KNOWN_LONG_MODULES: dict[str, str] = {}
KNOWN_LONG_FUNCTIONS: dict[str, str] = {}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache
def modules() -> dict[str, Path]:
    """Every module of the package, globbed once per test session."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@functools.cache
def source(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@functools.cache
def syntax_tree(path: Path) -> ast.Module:
    """Each module parsed once per test session (the tests below all read the same trees)."""
    return ast.parse(source(path), str(path))


def place(module: str) -> str:
    """The folder (or root module) that sets ``module``'s layer: ``pytest_prefill.plan.capacity``
    -> ``plan``; ``pytest_prefill.units`` -> ``units``; the package itself -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer(module: str) -> int | None:
    where = place(module)
    for rung, places in enumerate(LAYERS):
        if where in places:
            return rung
    return None


def describe(module: str) -> str:
    return f"{module} ({place(module)}/, layer {layer(module)})"


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
    known = modules()
    for node, typing_only in _walk(syntax_tree(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno, typing_only
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, node)
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in known:  # `from pytest_prefill.plan import capacity`
                    yield submodule, None, node.lineno, typing_only
                else:
                    yield source, alias.name, node.lineno, typing_only


@functools.cache
def internal_edges() -> list[tuple[str, str, str | None, int, bool]]:
    known = modules()
    edges = []
    for module, path in known.items():
        for target, name, line, typing_only in imports(module, path):
            if target in known and target != module:
                edges.append((module, target, name, line, typing_only))
    return edges


def test_every_module_sits_in_a_layer_folder():
    misplaced = sorted(m for m in modules() if layer(m) is None)
    assert not misplaced, (
        f"these modules are in no layer (DESIGN.md's Layout): {misplaced}; move each into the "
        f"folder of its layer ({', '.join(p for rung in LAYERS for p in rung)})"
    )


def test_layers_are_read_from_paths():
    assert layer("pytest_prefill.sim.cost") == 1
    assert layer("pytest_prefill.plan.capacity") == 2
    assert layer("pytest_prefill.lab.loop") == layer("pytest_prefill.serve.client")
    assert layer("pytest_prefill.report.timeline") > layer("pytest_prefill.archive.runs")
    assert layer("pytest_prefill.plugin") == layer("pytest_prefill.commands.simulate")
    assert layer("pytest_prefill.units") == 0
    assert layer("pytest_prefill.somewhere_new") is None


def upward_imports() -> list[tuple[str, str, int]]:
    found = []
    for module, target, _, line, _ in internal_edges():
        low, high = layer(module), layer(target)
        if low is not None and high is not None and high > low:
            found.append((module, target, line))
    return found


def test_no_module_imports_a_higher_layer():
    upward = [
        f"{module}:{line} {describe(module)} imports {describe(target)}"
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
    # A package importing its own modules (an __init__ facade) is not a cycle of ideas. A
    # type-only import (under TYPE_CHECKING) counts: a cycle of ideas is one however imported.
    edges = [(a, b) for a, b, _, _, _ in internal_edges() if not b.startswith(a + ".")]
    found = {tuple(c) for c in cycles(edges)}
    new = sorted(found - set(KNOWN_CYCLES))
    assert not new, f"import cycles (TYPE_CHECKING imports included): {new}"
    fixed = sorted(set(KNOWN_CYCLES) - found)
    assert not fixed, f"fixed, thank you: delete these from KNOWN_CYCLES: {fixed}"


def test_sim_and_plan_import_only_the_standard_library_at_module_level():
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    foreign = []
    for module, path in modules().items():
        if place(module) not in STDLIB_ONLY:
            continue
        for node in syntax_tree(path).body:  # module level only: a lazy optional import is allowed
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                if top not in stdlib and top != "pytest_prefill":
                    foreign.append(f"{module}:{node.lineno} imports {name}")
    assert not foreign, "these layers are standard library only:\n" + "\n".join(foreign)


def test_sim_imports_nothing_outside_its_folder():
    """A copy of ``sim/`` runs on its own, so it reaches nothing else of the package."""
    outside = [
        f"{module}:{line} imports {target}"
        for module, target, _, line, _ in internal_edges()
        if place(module) == "sim" and place(target) != "sim"
    ]
    assert not outside, "sim/ must be copy-and-run:\n" + "\n".join(outside)


def long_modules() -> dict[str, int]:
    sizes = {m: len(source(p).splitlines()) for m, p in modules().items()}
    return {m: n for m, n in sizes.items() if n > MAX_MODULE_LINES}


def test_no_module_is_over_600_lines():
    found = long_modules()
    new = {m: n for m, n in found.items() if m not in KNOWN_LONG_MODULES}
    assert not new, f"modules over {MAX_MODULE_LINES} lines (split by idea): {new}"
    fixed = sorted(set(KNOWN_LONG_MODULES) - set(found))
    assert not fixed, f"fixed, thank you: delete these from KNOWN_LONG_MODULES: {fixed}"


def code_lines(source: str, node: ast.AST) -> int:
    """Lines of code in a function: neither blank, nor only a comment, nor its docstring."""
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    first, last = node.lineno, node.end_lineno or node.lineno
    skip: set[int] = set()
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            skip.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    lines = source.splitlines()[first - 1 : last]
    counted = set()
    tokens = tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline)
    for token in tokens:
        if token.type in (
            tokenize.COMMENT,
            tokenize.NL,
            tokenize.NEWLINE,
            tokenize.INDENT,
            tokenize.DEDENT,
            tokenize.ENDMARKER,
        ):
            continue
        for row in range(token.start[0], token.end[0] + 1):
            counted.add(row + first - 1)
    return len(counted - skip)


def long_functions() -> dict[str, int]:
    found = {}
    for module, path in modules().items():
        for node in ast.walk(syntax_tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = code_lines(source(path), node)
                if n > MAX_FUNCTION_LINES:
                    found[f"{module}:{node.name}"] = n
    return found


def test_code_lines_counts_code_only():
    source = 'def f(x):\n    """Doc.\n\n    More."""\n    # a comment\n\n    y = (x +\n         1)\n    return y\n'
    node = ast.parse(source).body[0]
    assert code_lines(source, node) == 4  # def, the two lines of y, return


def test_no_function_is_over_60_lines_of_code():
    found = long_functions()
    new = {f: n for f, n in found.items() if f not in KNOWN_LONG_FUNCTIONS}
    assert not new, (
        f"functions over {MAX_FUNCTION_LINES} lines of code (docstring, comments and blank lines "
        f"excluded): {new}"
    )
    fixed = sorted(set(KNOWN_LONG_FUNCTIONS) - set(found))
    assert not fixed, f"fixed, thank you: delete these from KNOWN_LONG_FUNCTIONS: {fixed}"


def sim_side(module: str) -> str | None:
    """``"rules"`` or ``"speed-ups"`` for a module of ``sim/`` that ``sim.RULES`` or
    ``sim.SPEED_UPS`` names (the one place the two sides are listed), else None."""
    from pytest_prefill import sim

    parts = module.split(".")
    if len(parts) != 3 or parts[1] != "sim":
        return None
    if parts[2] in sim.RULES:
        return "rules"
    return "speed-ups" if parts[2] in sim.SPEED_UPS else None


def test_the_two_sides_name_existing_modules_and_none_twice():
    from pytest_prefill import sim

    stems = {m.rsplit(".", 1)[-1] for m in modules() if place(m) == "sim"}
    assert set(sim.RULES) <= stems and set(sim.SPEED_UPS) <= stems
    assert not set(sim.RULES) & set(sim.SPEED_UPS)
    assert sim_side("pytest_prefill.sim.rules") == "rules"
    assert sim_side("pytest_prefill.sim.fastpath") == "speed-ups"
    assert sim_side("pytest_prefill.plan.capacity") is None


def test_no_rules_module_imports_a_speed_up():
    """The rules read alone against tests/reference_sim.py: nothing of the fast path in them
    (TYPE_CHECKING imports included)."""
    found = [
        f"{module}:{line} imports {target}"
        for module, target, _, line, _ in internal_edges()
        if sim_side(module) == "rules" and sim_side(target) == "speed-ups"
    ]
    assert not found, "a rules module imports a speed-up:\n" + "\n".join(found)


def class_bases() -> Iterator[tuple[str, str, str, int]]:
    """(module, class, the module defining a base class, line) for each class of the package
    whose base is a class defined in the package (found by name among the modules it imports
    from, or its own)."""
    defined: dict[str, dict[str, str]] = {}  # module -> class name -> module defining it
    trees = {m: syntax_tree(p) for m, p in modules().items()}
    for module, tree in trees.items():
        defined[module] = {n.name: module for n in tree.body if isinstance(n, ast.ClassDef)}
    for module, path in modules().items():
        names = dict(defined[module])
        for target, name, _, _ in imports(module, path):
            if name is not None and name in defined.get(target, {}):
                names[name] = defined[target][name]
        for node in ast.walk(trees[module]):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    if isinstance(base, ast.Name) and base.id in names:
                        yield module, node.name, names[base.id], node.lineno


def test_class_bases_finds_a_base_by_its_import():
    found = {(m, c, b) for m, c, b, _ in class_bases()}
    assert ("pytest_prefill.sim.rules", "Worker", "pytest_prefill.sim.rules") in found
    assert (
        "pytest_prefill.sim.paged_worker",
        "PagedWorker",
        "pytest_prefill.sim.rules",
    ) in found


def test_no_class_subclasses_across_the_rules_and_the_speed_ups():
    """A speed-up times the rules (it holds them), never inherits them, and a rule never
    inherits a speed-up."""
    found = [
        f"{module}:{line} {name} ({sim_side(module)}) subclasses a class of {base} "
        f"({sim_side(base)})"
        for module, name, base, line in class_bases()
        if {sim_side(module), sim_side(base)} == {"rules", "speed-ups"}
    ]
    assert not found, "subclassing across the line:\n" + "\n".join(found)


def test_no_formatter_is_switched_off():
    """``# fmt: skip`` / ``# fmt: off`` packed arguments onto fewer lines to keep the letter of the
    size rules: a function or call that needs it holds two ideas, or wants a value to carry its
    arguments."""
    marks = ("fmt: skip", "fmt: off")
    found = [
        f"{module}:{number}"
        for module, path in modules().items()
        for number, line in enumerate(source(path).splitlines(), start=1)
        if "#" in line and any(mark in line.split("#", 1)[1] for mark in marks)
    ]
    assert not found, f"formatter switched off at: {found}"
