"""pytest-prefill: measure prefill/decode interference on your hardware, fit a cost model, and
replay workloads through an iteration-level simulator of serving policies.

Importing this package never imports torch, transformers or numpy.
"""

from __future__ import annotations

from pytest_prefill.scheduler import KINDS
from pytest_prefill.scheduler import POLICIES
from pytest_prefill.scheduler import PRESETS
from pytest_prefill.scheduler import CostModel
from pytest_prefill.scheduler import Event
from pytest_prefill.scheduler import Plan
from pytest_prefill.scheduler import Preset
from pytest_prefill.scheduler import Request
from pytest_prefill.scheduler import RequestRecord
from pytest_prefill.scheduler import Summary
from pytest_prefill.scheduler import Trace
from pytest_prefill.scheduler import Worker
from pytest_prefill.invariants import check_invariants
from pytest_prefill.invariants import iteration_cost
from pytest_prefill.scheduler import get_preset
from pytest_prefill.scheduler import simulate

__version__ = "0.1.0"

__all__ = [
    "KINDS",
    "POLICIES",
    "PRESETS",
    "CostModel",
    "Event",
    "Plan",
    "Preset",
    "Request",
    "RequestRecord",
    "Summary",
    "Trace",
    "Worker",
    "__version__",
    "check_invariants",
    "get_preset",
    "iteration_cost",
    "simulate",
]
