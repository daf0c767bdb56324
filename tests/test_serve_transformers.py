"""Against a real engine: `transformers serve --continuous-batching`, started by the session's
``transformers_server`` fixture (tests/conftest.py) with a model it made. Exact lengths and
token counts from the load generator; a calibration whose chunking matches the server's budget
and whose JSON works as ``--cost``; and fidelity, reported, with a wrong budget caught."""

from __future__ import annotations

import asyncio
import json

import pytest

from pytest_prefill.serve.calibration.calibration import calibrate_server
from pytest_prefill.serve.calibration.experiments import prompt_alone
from pytest_prefill.serve.calibration.server_calibration import ServerSweep
from pytest_prefill.serve.fidelity.fidelity import run_server_fidelity
from pytest_prefill.serve.load.loadgen import Bounds, Schedule, open_target, run_load
from pytest_prefill.sim import Request

# under xdist (--dist loadgroup) on one worker, so the session's server starts once
pytestmark = [pytest.mark.server, pytest.mark.xdist_group("transformers_server")]


# The fidelity test's calibration, small (the verdict it feeds is reported, not asserted), and
# its requests a workload (16 by default).
SHORT_SWEEP = dict(
    prompt_lens=(16, 128, 512),
    traffic_prompts=(64, 256, 128),
    stall_prompts=(512,),
    decode_tokens=32,
)
FIDELITY_COUNT = 4


@pytest.fixture(scope="module")
def target(transformers_server):
    served = transformers_server
    target = asyncio.run(
        open_target(served.server.url, engine="transformers", tokenizer=served.folder)
    )

    async def warm():
        for i in range(3):  # a server's first requests are slow
            await prompt_alone(target, 64, f"warm{i}")

    asyncio.run(warm())
    return target


def test_every_request_gets_exactly_its_lengths(target):
    load = [Request(f"r{i}", 0.05 * i, 40 + 60 * i, 8 + i) for i in range(6)]
    run = asyncio.run(run_load(target, load, schedule=Schedule("trace"), bounds=Bounds(warmup=1)))
    assert not run.failed
    for record in run.records:
        assert record.exact, record
        assert (
            record.prompt_tokens == record.prompt_len
            and len(record.token_times) == record.output_len
        )
        assert record.ttft > 0 and record.e2el >= record.ttft
    metrics = run.metrics()
    assert metrics.total_output_tokens == sum(r.output_len for r in load)
    assert metrics.itl.count == sum(r.output_len - 1 for r in load)


def test_the_calibration_reads_the_budget_and_works_as_a_cost(
    target, transformers_server, tmp_path, capsys
):
    from pytest_prefill.cli import main

    sweep = ServerSweep(transformers_server.budget, prompt_lens=(16, 64, 256, 512, 1024), repeats=2)
    result = asyncio.run(calibrate_server(target, sweep))
    assert result.chunking and all(c.agrees for c in result.chunking), result.chunking
    assert result.cost.prefill_per_token > 0 and result.cost.decode_step_base > 0
    assert result.calibration.held_out_median == result.calibration.held_out_median  # computed
    path = tmp_path / "calibration.json"
    path.write_text(json.dumps(result.to_dict()))
    assert main(["simulate", "--cost", str(path)]) == 0
    assert "file " + str(path) in capsys.readouterr().out


def test_fidelity_runs_and_a_wrong_budget_shows_in_the_ttfts(
    target, transformers_server, prefill_report
):
    """The verdict is reported, not asserted: on a shared 2-core box this engine's TTFTs come out
    10-25% low from run to run (docs/fidelity.md, "Fidelity against a server"), the size of the one decode
    step a wrong first-token rule adds, and the sign of that bias changes from run to run."""
    from pytest_prefill.report.server_fidelity import fidelity_report
    from pytest_prefill.serve.calibration.server_model import (
        Scheduling,
        ServerModel,
        server_profile,
    )
    from pytest_prefill.serve.fidelity.fidelity import cells_of, wrong_schedulings
    from pytest_prefill.serve.fidelity.judgement import METRICS, STATS

    served = transformers_server
    profile = server_profile("transformers", served.budget)
    scheduling = Scheduling(profile, float(served.kv_tokens))
    # In CI time: a short calibration (prompts alone to 512, three streams of 32 tokens, the
    # chunking check's prompt two budgets long) and 4 requests a workload, two runs each; the
    # long-prompts workload's prompts are still 4 and 6 budgets long.
    sweep = ServerSweep(served.budget, **SHORT_SWEEP)
    result = asyncio.run(
        run_server_fidelity(target, sweep, scheduling, runs=2, count=FIDELITY_COUNT)
    )
    text = fidelity_report(result)
    print(text)
    prefill_report.table("fidelity against transformers serve", text, data=result.to_dict())
    prefill_report.verdict("server fidelity", result.verdict, text.splitlines()[-1], asserted=False)
    assert len(result.cells) == len(result.workloads) * len(METRICS) * len(STATS)
    assert all(c.error == c.error for c in result.cells) and result.noise == result.noise
    # Which scheduling scores closer is this box's luck (a quiet run once had the 16x budget's
    # TTFTs 5.9% off against the server's own 20.8%: the calibration's bias had the other sign),
    # so that is reported, not asserted; tests/test_serve_fidelity.py shows on runs the simulator
    # made that the wrong schedulings FAIL. Asserted here: the wrong budget reaches the replay of
    # these measured runs: the TTFTs it predicts for them change.
    wide = next(
        s for label, s in wrong_schedulings(scheduling).items() if label.startswith("budget")
    )
    own = {(c.workload, c.stat): c.simulated_value for c in result.cells if c.metric == "ttft"}
    fewer = {
        (c.workload, c.stat): c.simulated_value
        for c in cells_of(result.runs, ServerModel.of(result.calibration, wide))
        if c.metric == "ttft"
    }
    assert fewer.keys() == own.keys() and fewer != own, text
