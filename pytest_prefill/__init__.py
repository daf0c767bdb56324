"""pytest-prefill: measure prefill/decode interference on your hardware, fit a cost model, and
replay workloads through an iteration-level simulator of serving policies.

The public names, one per line: the simulator (``pytest_prefill.sim``), its oracle, and traffic and
planning (``pytest_prefill.plan``: workloads, serving metrics, deployments, the capacity search, the
chunk rule and the recommendation). Importing this package never imports torch, transformers or
numpy.
"""

from __future__ import annotations

from pytest_prefill.sim import KINDS
from pytest_prefill.sim import POLICIES
from pytest_prefill.sim import PRESETS
from pytest_prefill.sim import CostModel
from pytest_prefill.sim import Event
from pytest_prefill.sim import Plan
from pytest_prefill.sim import Preset
from pytest_prefill.sim import Request
from pytest_prefill.sim import RequestRecord
from pytest_prefill.sim import Summary
from pytest_prefill.sim import Trace
from pytest_prefill.sim import Worker
from pytest_prefill.sim import get_preset
from pytest_prefill.sim import simulate
from pytest_prefill.sim import check_invariants
from pytest_prefill.sim import iteration_cost
from pytest_prefill.plan.advice import ChunkChoice
from pytest_prefill.plan.advice import FittedCost
from pytest_prefill.plan.advice import Recommendation
from pytest_prefill.plan.advice import choose_chunk
from pytest_prefill.plan.advice import recommend
from pytest_prefill.plan.capacity import CapacityResult
from pytest_prefill.plan.capacity import capacity
from pytest_prefill.plan.deployments import Deployment
from pytest_prefill.plan.deployments import default_deployments
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.plan.metrics import ServingMetrics
from pytest_prefill.plan.metrics import serving_metrics
from pytest_prefill.plan.question import ServingQuestion
from pytest_prefill.plan.traces import load_azure
from pytest_prefill.plan.traces import load_jsonl
from pytest_prefill.plan.workloads import Workload
from pytest_prefill.plan.workloads import lab_scenario
from pytest_prefill.plan.workloads import poisson
from pytest_prefill.plan.workloads import resolve_workload

__version__ = "0.1.0"

__all__ = [
    "CapacityResult",
    "ChunkChoice",
    "CostModel",
    "Deployment",
    "Event",
    "FittedCost",
    "KINDS",
    "POLICIES",
    "PRESETS",
    "Plan",
    "Preset",
    "Recommendation",
    "Request",
    "RequestRecord",
    "SLO",
    "ServingMetrics",
    "ServingQuestion",
    "Summary",
    "Trace",
    "Worker",
    "Workload",
    "__version__",
    "capacity",
    "check_invariants",
    "choose_chunk",
    "default_deployments",
    "get_preset",
    "iteration_cost",
    "lab_scenario",
    "load_azure",
    "load_jsonl",
    "poisson",
    "recommend",
    "resolve_workload",
    "serving_metrics",
    "simulate",
]
