"""Verify against a real engine: `transformers serve` restarted under two budgets (a launcher,
the session's model folder), calibrated once, each knee predicted and then measured by bounded
probes. Asserted: what a verification must hold whatever this shared box's speed — both flag
sets predicted and measured (no server died), every probe the rule's length with every request
exact, the first probe at the predicted rate, the bracket consistent, the ranking reported, the
servers stopped, the records in the document. The knees themselves are reported, not asserted."""

from __future__ import annotations

import json
import random

import pytest

from pytest_prefill.serve.calibration.server_calibration import ServerSweep
from pytest_prefill.serve.launch.launchers import Launcher
from pytest_prefill.sim import Request
from pytest_prefill.verify.probe_rule import ProbeRule

# under xdist (--dist loadgroup) on one worker, so the session's server starts once
pytestmark = [pytest.mark.server, pytest.mark.xdist_group("transformers_server")]

# The first under a sequence cap (serve/launch/transformers_capped.py: the CLI has no flag for it).
BUDGETS = ("tokens=128,seqs=2", "tokens=512")
CAP = 2
# Client-side slack on a stream's end: the next request's first token needs a forward pass after
# the last one's final token, so a true overlap is longer than this.
SLACK = 0.005
# 8 requests a probe (the rule's floor: the margin is wide, the run small), at most 3 probes.
RULE = ProbeRule(target=0.9, margin=0.15, max_probes=3, min_requests=8)
SWEEP = ServerSweep(
    128,
    prompt_lens=(16, 64, 256),
    traffic_prompts=(64, 128, 96),
    stall_prompts=(256,),
    decode_tokens=16,
    repeats=1,
)


def _load() -> list[Request]:
    rng, t, load = random.Random(5), 0.0, []
    for i in range(RULE.requests):
        load.append(Request(f"v{i}", t, rng.choice((128, 192, 256)), 16))
        t += rng.expovariate(1.0)
    return load


def _most_streaming(records) -> int:
    """The most requests streaming at once, counted at each first token: those whose first
    token came before it and whose last came after (less :data:`SLACK`), and itself."""
    spans = [(r.chunk_times[0], r.chunk_times[-1]) for r in records if r.ok]
    return max(
        (1 + sum(1 for s, e in spans if s < start and e - SLACK > start) for start, _ in spans),
        default=0,
    )


def test_verify_on_two_budgets_reports_both_knees_and_the_ranking(
    transformers_server, prefill_verify
):
    launcher = Launcher("transformers", transformers_server.folder, kv_blocks=64)
    load = _load()
    result = prefill_verify(
        BUDGETS,
        load,
        "ttft:1s,tpot:150ms",
        launcher=launcher,
        tokenizer=transformers_server.folder,
        rule=RULE,
        sweep=SWEEP,
        calibrate_once=True,
        workload="8 Poisson requests, prompts 128-256, 16 tokens out",
    )
    assert [r.ended for r in result.results] == [None, None]
    assert len(result.compared) == 2
    for r in result.results:
        assert r.exit_status is not None  # the server it started is stopped
        assert r.predicted is not None and r.predicted.rate > 0
        measured = r.measured
        assert measured is not None and 1 <= len(measured.probes) <= RULE.max_probes
        assert measured.probes[0].rate == pytest.approx(r.predicted.rate)
        for probe in measured.probes:
            assert probe.sent == RULE.requests and not probe.failed
            assert all(record.exact for record in probe.run.records)
        assert len(r.speeds) == len(measured.probes)  # each probe's own speed: too few to fit
        assert all(s.requests == RULE.requests and not s.kept for s in r.speeds)
        if measured.low is not None:
            assert measured.low.attainment >= RULE.target
        if measured.high is not None:
            assert measured.high.attainment < RULE.target
        if measured.low is not None and measured.high is not None:
            assert measured.high.rate > measured.low.rate
    capped = result.results[0].measured
    assert capped is not None
    assert max(_most_streaming(p.run.records) for p in capped.probes) <= CAP
    assert "--max-requests-per-batch" in result.results[0].command
    assert result.results[1].calibration is result.results[0].calibration  # calibrated once
    assert result.same_best is not None and result.best_verdict in ("HOLDS", "FAILS", "UNDECIDED")
    assert sorted(result.measured_order) == sorted(result.predicted_order) == [0, 1]
    document = json.loads(json.dumps(result.to_dict()))
    probes = document["flag_sets"][0]["measured"]["probes"]
    assert [len(p["records"]) for p in probes] == [RULE.requests] * len(probes)
