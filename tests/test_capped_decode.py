"""A decode step capped at ``decode_max_kv_tokens`` KV tokens (sim/capped_decode.py; the
``distserve`` profile's 50,000, DistServe's ``_enter_decodes``): rows from the queue's head
while their KV fits, at least one; the rows that stepped rejoin the tail."""

from __future__ import annotations

import dataclasses
import random

import pytest
from strategies import V2

from pytest_prefill.sim import EngineProfile, Request, check_invariants, simulate

pytestmark = pytest.mark.sim

CAPPED = EngineProfile("capped", first_token="prefill", decode_max_kv_tokens=2000)


def load(n: int = 60, seed: int = 1) -> list[Request]:
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(30.0)
        out.append(Request(f"r{i}", t, rng.randint(50, 600), rng.randint(2, 60)))
    return out


def run(engine: EngineProfile, requests: list[Request]):
    return simulate("disaggregated", requests, V2, engine=engine, decode_workers=2)


def test_a_cap_no_step_reaches_is_the_uncapped_run_exactly() -> None:
    requests = load()
    most = sum(r.prompt_len + r.output_len for r in requests)
    uncapped = dataclasses.replace(CAPPED, decode_max_kv_tokens=None)
    wide = dataclasses.replace(CAPPED, decode_max_kv_tokens=most)
    a, b = run(uncapped, requests), run(wide, requests)
    assert {k: r.token_times for k, r in a.requests.items()} == {
        k: r.token_times for k, r in b.requests.items()
    }


def test_every_step_reads_at_most_the_cap_unless_one_row_and_every_request_finishes() -> None:
    requests = load()
    trace = run(CAPPED, requests)
    steps = [e for e in trace.events if e.decode_ids]
    assert steps and all(e.kv_tokens <= 2000 or len(e.decode_ids) == 1 for e in steps)
    assert any(e.kv_tokens > 1500 for e in steps)  # the cap binds
    assert {k: len(r.token_times) for k, r in trace.requests.items()} == {
        r.id: r.output_len for r in requests
    }
    assert check_invariants(trace, requests, V2) == []


def test_rows_left_out_step_next_and_a_stepped_row_goes_behind_them() -> None:
    # three rows of 900 KV tokens each: a step holds two; the third steps next, ahead of both
    requests = [Request(f"r{i}", 0.0, 899, 5) for i in range(3)]
    engine = dataclasses.replace(CAPPED, decode_max_kv_tokens=1800)
    trace = simulate("disaggregated", requests, V2, engine=engine)
    steps = [e.decode_ids for e in trace.events if e.decode_ids]
    assert steps[0] == ("r0", "r1") and steps[1][0] == "r2"
    assert all(len(ids) <= 2 for ids in steps)


def test_the_knob_is_validated_and_refused_under_paged_kv() -> None:
    with pytest.raises(ValueError, match="decode_max_kv_tokens"):
        EngineProfile("bad", decode_max_kv_tokens=0)
    paged = EngineProfile("p", kv="paged", decode_max_kv_tokens=100)
    with pytest.raises(ValueError, match="decode_max_kv_tokens.*reserve"):
        simulate("disaggregated", load(5), V2, engine=paged)
