"""Repository wiring only: in a checkout where pytest-prefill is not installed (so its pytest11
entry point is absent), load the plugin from the source tree. Installed, the entry point loads
it and this file does nothing."""

from __future__ import annotations

import importlib.metadata


def _entry_point_installed() -> bool:
    return any(
        ep.value == "pytest_prefill.plugin"
        for ep in importlib.metadata.entry_points(group="pytest11")
    )


if not _entry_point_installed():
    pytest_plugins = ["pytest_prefill.plugin"]
