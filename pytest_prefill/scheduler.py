"""Deprecated: the simulator's seed name, a re-export of :mod:`pytest_prefill.sim` kept until
pytest-prefill 0.2. Import from ``pytest_prefill.sim`` (or the ``pytest_prefill`` facade)."""

from __future__ import annotations

import warnings

from pytest_prefill.sim import *  # noqa: F403
from pytest_prefill.sim import __all__ as __all__

warnings.warn(
    "pytest_prefill.scheduler is deprecated and goes in pytest-prefill 0.2: "
    "import from pytest_prefill.sim",
    DeprecationWarning,
    stacklevel=2,
)
