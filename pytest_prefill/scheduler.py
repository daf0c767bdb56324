"""The simulator's seed name, kept as a thin re-export: everything lives in
:mod:`pytest_prefill.sim` (copy that folder to run it alone: ``python path/to/sim``)."""

from __future__ import annotations

from pytest_prefill.sim import *  # noqa: F403
from pytest_prefill.sim import __all__ as __all__
