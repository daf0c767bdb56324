"""The host cost an engine's derived answer carries without a calibration: read off the
engine's published one-request run, so that the derived model replays that run's time per
output token."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_prefill.cli import main
from pytest_prefill.plan.compute.derive import TokenRange, derive_cost
from pytest_prefill.plan.compute.devices import CATALOG
from pytest_prefill.plan.compute.efficiency import efficiency_for
from pytest_prefill.plan.compute.host import NONE_TABLED, RUNS, tabled_host
from pytest_prefill.plan.metrics import serving_metrics
from pytest_prefill.plan.model_spec import model_from_config
from pytest_prefill.sim import Request, simulate

LLAMA = str(Path(__file__).parent / "data" / "llama-3.1-8b.json")


@pytest.mark.parametrize("engine", sorted(RUNS))
def test_the_tabled_host_replays_its_runs_time_per_token(engine: str) -> None:
    run = RUNS[engine]
    model = model_from_config(dict(run.model_config), run.model, run.source)
    device = CATALOG[run.device]
    span = TokenRange(run.prompt, run.prompt, run.prompt + run.output, 1)
    host = tabled_host(engine)
    derived = derive_cost(model, device, efficiency_for(device, engine), span, host=host)
    load = [Request("one", 0.0, run.prompt, run.output)]
    tpot = serving_metrics(simulate("chunked", load, derived.cost, engine=engine)).tpot.mean
    # the host figure closes the gap to the published time per token, up to the linear
    # cost model's own error against the physics
    assert host.per_step > 0
    assert tpot == pytest.approx(run.tpot, rel=derived.decode_error + 1e-6)


def test_an_engine_without_a_published_run_has_none_tabled() -> None:
    assert tabled_host("sglang") is NONE_TABLED and "none tabled" in NONE_TABLED.source


@pytest.mark.parametrize(("engine", "says"), [("vllm", "tabled for vllm: "), ("sglang", "none")])
def test_a_derived_answer_names_its_host_cost(engine: str, says: str, capsys) -> None:
    assert main(["simulate", "--gpu", "h100", "--model", LLAMA, "--engine", engine]) == 0
    header = next(
        line for line in capsys.readouterr().out.splitlines() if line.startswith("Cost model:")
    )
    assert f"host: {says}" in header
    if engine in RUNS:
        run = RUNS[engine]
        assert run.model in header and run.device in header and run.version in header
