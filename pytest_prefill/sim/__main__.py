"""``python path/to/sim``: the lab's table, from a copy of this folder anywhere, with nothing
installed (``python -I -S`` too); ``python -m pytest_prefill.sim`` in the package."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType


def _package() -> ModuleType:
    """This folder as a package: the one it belongs to, or (run as a path, with no package
    context) loaded from here under the name ``sim``."""
    if __package__:
        return importlib.import_module(__package__)
    here = os.path.dirname(os.path.abspath(__file__))
    # The folder itself is on the path when run as one: its modules are no top-level modules.
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.util.spec_from_file_location(
        "sim", os.path.join(here, "__init__.py"), submodule_search_locations=[here]
    )
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules["sim"] = package
    spec.loader.exec_module(package)
    return package


if __name__ == "__main__":
    print(_package().lab_table())
