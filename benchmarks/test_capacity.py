"""A capacity search from the session's cost model (``--prefill-cost``) on five minutes of the
Azure conv trace: which deployment of two devices serves the most requests per device within
the SLO. Simulated, not measured; the search goes to the run's summary and archive (through the
``prefill_capacity`` fixture), and the test asserts only what the search guarantees, never its numbers.
Data: Azure LLM inference trace 2023 (CC-BY 4.0; Patel et al., "Splitwise", ISCA 2024)."""

from __future__ import annotations

import pytest

from pytest_prefill.plan.deployments import default_deployments
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.plan.traces import azure_trace_path
from pytest_prefill.plan.workloads import resolve_workload

pytestmark = pytest.mark.sim

SLO_TEXT = "ttft:1s,tpot:100ms"
WINDOW = (0.0, 300.0)
DEVICES = 2


@pytest.fixture(scope="module")
def conv_window():
    if azure_trace_path("conv") is None:
        pytest.skip("the Azure conv trace is not in ../shared/data/azure-llm-inference-2023")
    return resolve_workload("azure-conv", window=WINDOW)


def test_capacity_search_on_the_azure_conv_trace(
    benchmark, prefill_capacity, prefill_cost_model, conv_window
):
    title = (
        f"Capacity: {SLO_TEXT} for >= 90% of requests on {DEVICES} devices, azure-conv "
        f"{WINDOW[0]:g}:{WINDOW[1]:g} s (simulated from the session's cost model)"
    )
    result = benchmark.pedantic(
        prefill_capacity,
        args=(conv_window, SLO_TEXT, DEVICES),
        kwargs={"title": title, "workers": 2},  # a process pool, as the command line uses
        rounds=1,
    )
    benchmark.extra_info.update(simulations=result.simulations, answer=result.recommendation())
    # the session's engine profile (vllm unless --prefill-engine says otherwise), as searched
    expected = default_deployments(prefill_cost_model, DEVICES, SLO.parse(SLO_TEXT), result.engine)
    assert [r.deployment for r in result.results] == list(expected)
    for r in result.results:
        if r.best is not None:
            assert r.best.attainment >= result.target
        if r.miss is not None:
            assert r.miss.attainment < result.target
        if r.best is not None and r.miss is not None:
            assert r.miss.scale <= r.best.scale * (1 + result.tolerance) * (1 + 1e-12)
