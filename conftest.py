"""Repository wiring only: in a checkout where pytest-prefill is not installed (so its pytest11
entry point is absent), load the plugin from the source tree (installed, the entry point loads
it); and keep Hypothesis's example database in the temporary folder, not in the checkout."""

from __future__ import annotations

import importlib.metadata
import os
import tempfile


def _entry_point_installed() -> bool:
    return any(
        ep.value == "pytest_prefill.plugin"
        for ep in importlib.metadata.entry_points(group="pytest11")
    )


if not _entry_point_installed():
    pytest_plugins = ["pytest_prefill.plugin"]

# Hypothesis keeps its example database and caches under $HYPOTHESIS_STORAGE_DIRECTORY (read at
# its first use, after this file), else in ./.hypothesis.
os.environ.setdefault(
    "HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(tempfile.gettempdir(), "pytest-prefill-hypothesis")
)
