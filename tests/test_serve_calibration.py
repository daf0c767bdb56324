"""Calibration from a server, without a server: what the experiments read off token times, and
the fit recovering a known cost model and overhead from samples made with it."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from pytest_prefill.serve.calibration.calibration import Samples, fit_server
from pytest_prefill.serve.calibration.calibration_fit import ttft_alone
from pytest_prefill.serve.calibration.experiments import (
    DecodeSample,
    StallSample,
    chunks_of,
    decode_iterations,
    read_stall,
    traffic_stalls,
)
from pytest_prefill.serve.calibration.server_calibration import (
    RAMP_PROMPT,
    ServerCalibration,
    ServerSweep,
)
from pytest_prefill.serve.load.records import ServerRecord
from pytest_prefill.sim import CostModel

pytest.importorskip("numpy")

TRUE = CostModel(
    prefill_pass_overhead=0.02,
    prefill_per_token=2.5e-4,
    prefill_per_pair=2e-7,
    decode_step_base=0.015,
    decode_per_seq=0.004,
    decode_per_kv_token=3e-6,
    fusion_penalty=0.5,
)
OVERHEAD = 0.008


def _record(rid: str, sent: float, times: list[float], prompt_len: int = 32) -> ServerRecord:
    n = len(times)
    return ServerRecord(rid, sent, sent, prompt_len, n, tuple(times), (1,) * n, prompt_len, n)


@pytest.mark.parametrize("prompt_len,budget,rows", [(2048, 256, 2), (100, 256, 0), (257, 256, 0)])
def test_chunks_cover_the_prompt_within_the_budget(prompt_len, budget, rows):
    pieces = chunks_of(prompt_len, budget, rows)
    assert sum(t for t, _ in pieces) == prompt_len
    assert all(1 <= t <= budget - rows for t, _ in pieces)
    assert [c for _, c in pieces] == [sum(t for t, _ in pieces[:i]) for i in range(len(pieces))]
    with pytest.raises(ValueError, match="no room"):
        chunks_of(10, 2, 2)


def test_a_stall_is_read_off_the_live_stream():
    step, slow = 0.02, [0.1, 0.12, 0.05]
    times = [i * step for i in range(30)]
    end = times[-1]
    times += [end + sum(slow[: i + 1]) for i in range(3)] + [
        end + sum(slow) + step * k for k in (1, 2)
    ]
    sent = end - 0.007  # during the last decode step before the chunks
    long = _record("long", sent, [end + sum(slow), end + sum(slow) + step])
    stall = read_stall(long, _record("live", 0.0, times), expected=3, prompt_len=512, rows=2)
    assert stall.seen == 3 and stall.fused == pytest.approx(tuple(slow))
    assert stall.way_in == pytest.approx(end - sent) and stall.way_in_low == pytest.approx(-0.013)
    unrelated = _record("long", sent, [end + 5.0])
    assert read_stall(unrelated, _record("live", 0.0, times), 3, 512, 2).fused == ()


def test_decode_iterations_count_rows_and_skip_prompts_in_flight():
    a = _record("a", 0.0, [0.05 + 0.01 * i for i in range(20)], prompt_len=100)
    # b is sent at 0.095 and has its first token at 0.115: gaps ending after 0.095 and
    # starting before 0.115 may hold its prompt and are skipped
    b = _record("b", 0.095, [0.115 + 0.01 * i for i in range(5)], prompt_len=50)
    samples = decode_iterations([a, b])
    assert {s.rows for s in samples} == {1, 2}
    assert all(s.seconds == pytest.approx(0.01) for s in samples)
    # a's 17 gaps after its first two tokens, less the 3 that end after b's send and begin
    # before b's first token; b's 2 gaps after its first two tokens
    assert len(samples) == 17 - 3 + 2


def test_decode_iterations_skip_gaps_into_and_out_of_a_late_read():
    step = 0.01
    times = [0.05 + step * i for i in range(30)]
    # the client read tokens 10-14 late, all at once when token 14 came
    late = [times[14]] * 5
    a = _record("a", 0.0, times[:10] + late + times[15:])
    samples = decode_iterations([a])
    assert all(s.seconds == pytest.approx(step) for s in samples)
    # 29 gaps less the first two tokens', the 4 inside the read, the one into it and out of it
    assert len(samples) == 29 - 2 - 4 - 2
    whole = decode_iterations([_record("a", 0.0, times)])
    assert len(whole) == 29 - 2


def _samples(budget: int, seed: int = 0) -> Samples:
    """Samples a server running ``TRUE`` would give, with 0.5% multiplicative jitter."""
    rng = random.Random(seed)

    def jitter(x: float) -> float:
        return x * (1 + rng.uniform(-0.005, 0.005))

    samples = Samples(round_trips=[0.001, 0.001])
    for p in (16, 64, 128, 256, 512, 1024, 2048):
        samples.ttft[p] = [jitter(ttft_alone(TRUE, OVERHEAD, p, budget)) for _ in range(3)]
    for rows in (1, 2, 3, 4):
        for context in (100, 400, 900):
            for _ in range(3):
                step = TRUE.decode_step(rows, rows * context)
                samples.decode.append(DecodeSample(rows, context, jitter(step)))
    for p in (64, 512, 2048):
        pieces = chunks_of(p, budget, 2)
        for _ in range(3):
            fused = tuple(
                jitter(TRUE.iteration([(t, c)], 2, 2 * (40 + j))) for j, (t, c) in enumerate(pieces)
            )
            samples.stalls.append(
                StallSample(p, 2, 40, len(pieces), len(pieces), fused, 0.006, 0.0)
            )
    return samples


def test_the_fit_recovers_the_cost_model_and_the_overhead():
    sweep = ServerSweep(256)
    result = fit_server(_samples(256), sweep, {"source": "synthetic"})
    cost = result.cost
    for name in (
        "prefill_pass_overhead",
        "prefill_per_token",
        "prefill_per_pair",
        "decode_step_base",
        "decode_per_seq",
        "decode_per_kv_token",
    ):
        assert getattr(cost, name) == pytest.approx(getattr(TRUE, name), rel=0.1), name
    assert cost.fusion_penalty == pytest.approx(TRUE.fusion_penalty, abs=0.15)
    assert result.overhead.total == pytest.approx(OVERHEAD, rel=0.2)
    assert result.overhead.to_engine == pytest.approx(0.003)  # the midpoint of (0, 6 ms]
    assert result.overhead.arrival_delay == pytest.approx(0.003)
    held = result.calibration.held_out_median
    assert held < 0.02 and not math.isnan(held)
    assert all(c.agrees for c in result.chunking)


def test_a_server_calibration_round_trips_through_json_and_reads_as_a_cost():
    from pytest_prefill.plan.cost_document import cost_from_json

    result = fit_server(_samples(256), ServerSweep(256), {"source": "synthetic"})
    document = result.to_dict()
    again = ServerCalibration.from_dict(document)
    assert again.cost == result.cost and again.overhead == result.overhead
    assert again.sweep == result.sweep
    assert cost_from_json(document, "test") == result.cost
    del document["server"]["sweep"]["warmup"]  # written before the warm-up existed: it had none
    assert ServerCalibration.from_dict(document).sweep.warmup == 0
    with pytest.raises(ValueError, match="server"):
        ServerCalibration.from_dict({"kind": "pytest-prefill/calibration"})


@pytest.mark.parametrize(
    "field,value",
    [
        ("budget", 0),
        ("repeats", 0),
        ("prompt_lens", (16, 32)),
        ("stream_spacing", -1.0),
        ("decode_tokens", 2),
        ("ramp_rows", 1),
        ("ramp_rows", -2),
        ("warmup", -1),
        ("warmup", True),
    ],
)
def test_a_bad_sweep_names_its_field(field, value):
    with pytest.raises(ValueError, match=field):
        ServerSweep(**{"budget": 256, field: value})


def test_the_engine_profile_recorded_is_printed_with_what_the_server_changed():
    from pytest_prefill.report.server_calibration import server_calibration_report
    from pytest_prefill.serve.calibration.server_model import Scheduling, server_profile

    profile = server_profile("llama.cpp", 256, 8)
    provenance = {"source": "synthetic", "engine_profile": Scheduling(profile).to_dict()}
    result = fit_server(_samples(256), ServerSweep(256), provenance)
    again = ServerCalibration.from_dict(result.to_dict())
    assert again.calibration.provenance["engine_profile"]["max_seqs"] == 8
    last = server_calibration_report(again).splitlines()[-1]
    assert "engine profile 'llama.cpp'" in last and "budget 256" in last
    assert "sequence cap 8" in last and "max_batched_tokens, max_seqs" in last
    plain = fit_server(_samples(256), ServerSweep(256), {"source": "synthetic"})
    assert "engine profile" not in server_calibration_report(plain)


def test_the_constants_print_in_units_a_person_reads_and_a_capped_term_says_so():
    import dataclasses

    from pytest_prefill.measure.calibration_points import Refusal
    from pytest_prefill.report.calibration import constants_table, refusals_text
    from pytest_prefill.units import readable

    calibration = fit_server(_samples(256), ServerSweep(256), {"source": "synthetic"}).calibration
    capped = Refusal(
        "fusion_penalty",
        "fitted 1.98 > 1; capped at 1, the model's ceiling",
        {"estimate": 1.98, "used": 1.0},
    )
    calibration = dataclasses.replace(
        calibration,
        cost=dataclasses.replace(calibration.cost, fusion_penalty=1.0),
        refusals=(*calibration.refusals, capped),
    )
    table = constants_table(calibration)
    assert "e+" not in table and "e-" not in table, table
    rows = {line.split()[0]: line for line in table.splitlines()[2:]}
    for name in ("decode_per_kv_token", "prefill_per_token", "decode_step_base"):
        assert readable(getattr(calibration.cost, name)) in rows[name], rows[name]
    assert "capped at 1" in rows["fusion_penalty"]
    text = refusals_text(calibration)
    assert "CAPPED fusion_penalty at 1: fitted 1.98 > 1" in text
    assert "REFUSED fusion_penalty" not in text


def test_a_calibration_rounds_progress_counts_the_rounds_that_run(monkeypatch):
    import asyncio

    import pytest_prefill.serve.calibration.calibration as calibration

    async def nothing(*args, **kwargs):
        return 0.0

    async def no_traffic(*args, **kwargs):
        return [], []

    for name in ("_round_trip", "prompt_alone", "prompt_amid_streams"):
        monkeypatch.setattr(calibration, name, nothing)
    monkeypatch.setattr(calibration, "traffic", no_traffic)
    sweep = ServerSweep(256)
    lines: list[str] = []
    asyncio.run(calibration.calibration_round(None, sweep, Samples(), 1, lines.append, rounds=2))
    asyncio.run(calibration.calibration_round(None, sweep, Samples(), 0, lines.append))
    assert lines == [
        "calibration round 2/2 done",
        f"calibration warm-up done ({sweep.warmup} pass of its traffic, dropped)",
        f"calibration round 1/{sweep.repeats} done",
    ]


def test_the_fit_recovers_a_chunk_attending_over_the_batchs_kv_and_refuses_it_absent():
    """Engines that run the batch's attention as one masked operation (transformers serve,
    llama.cpp) make a chunk beside decode rows cost more with the rows' cached tokens: the fit
    finds that term where the fused iterations show it, and records ~0 (or refuses it) where
    they do not; for vLLM it is not fitted at all."""
    true = dataclasses.replace(TRUE, batch_attention_per_pair=2e-7)
    samples = _samples(256)
    samples.stalls = [
        stall
        for seed, (p, row_context) in enumerate(((512, 200), (1024, 900), (2048, 500)))
        for stall in _batch_stalls(true, 2, row_context, seed, 0.006, prompt=p, noise=0.005)
    ]  # a context per chunking
    found = fit_server(samples, ServerSweep(256), {"source": "synthetic"}).cost
    assert found.batch_attention_per_pair == pytest.approx(2e-7, rel=0.25)
    # vLLM's paged attention reads each request's own blocks: the term is not fitted there
    vllm = fit_server(
        samples, ServerSweep(256), {"source": "synthetic", "server": {"engine": "vllm"}}
    )
    assert vllm.cost.batch_attention_per_pair == 0.0
    why = [r.reason for r in vllm.calibration.refusals if r.constant == "batch_attention_per_pair"]
    assert len(why) == 1 and "paged attention" in why[0]
    plain = fit_server(_samples(256), ServerSweep(256), {"source": "synthetic"}).cost
    assert plain.batch_attention_per_pair < 2e-8  # a tenth of the term the first run had


def test_a_ramp_sends_its_rows_at_once_and_keeps_their_decode_points(monkeypatch):
    import asyncio

    import pytest_prefill.serve.calibration.calibration as calibration
    from pytest_prefill.serve.calibration.experiments import DecodeSample

    async def nothing(*args, **kwargs):
        return 0.0

    sent: list[tuple] = []

    async def traffic(target, prompts, tokens, spacing, budget, key, max_seqs=0):
        sent.append((tuple(prompts), spacing, key))
        return [DecodeSample(len(prompts), 100, 0.01)], []

    for name in ("_round_trip", "prompt_alone", "prompt_amid_streams"):
        monkeypatch.setattr(calibration, name, nothing)
    monkeypatch.setattr(calibration, "traffic", traffic)
    samples = Samples()
    sweep = ServerSweep(256, ramp_rows=8, warmup=0)
    asyncio.run(calibration.calibration_round(None, sweep, samples, 0))
    assert [len(p) for p, _, _ in sent] == [len(sweep.traffic_prompts), 8, 8]
    assert all(spacing < sweep.stream_spacing for _, spacing, _ in sent[1:])  # at once
    # one ramp of short prompts, one of the traffic's median prompt (its rows read more)
    short, long = (p[0] for p, _, _ in sent[1:])
    assert short == RAMP_PROMPT < long
    assert long == sorted(sweep.traffic_prompts)[(len(sweep.traffic_prompts) - 1) // 2]
    assert sorted(s.rows for s in samples.decode) == sorted([len(sweep.traffic_prompts), 8, 8])
    sent.clear()
    asyncio.run(calibration.calibration_round(None, ServerSweep(256, warmup=0), Samples(), 0))
    assert len(sent) == 1  # no ramp by default


@pytest.mark.parametrize("warmup", [0, 1, 2])
def test_the_warm_up_sends_the_traffic_and_ramp_before_the_first_round_and_drops_them(
    monkeypatch, warmup
):
    import asyncio

    import pytest_prefill.serve.calibration.calibration as calibration
    from pytest_prefill.serve.calibration.experiments import DecodeSample

    async def nothing(*args, **kwargs):
        return 0.0

    sent: list[str] = []

    async def traffic(target, prompts, tokens, spacing, budget, key, max_seqs=0):
        sent.append(key)
        return [DecodeSample(len(prompts), 100, 0.01)], []

    for name in ("_round_trip", "prompt_alone", "prompt_amid_streams"):
        monkeypatch.setattr(calibration, name, nothing)
    monkeypatch.setattr(calibration, "traffic", traffic)
    sweep = ServerSweep(256, ramp_rows=4, warmup=warmup)
    samples = Samples()
    for index in range(2):
        asyncio.run(calibration.calibration_round(None, sweep, samples, index))
    kept = 2 * 3  # traffic and two ramps, in each of the two rounds
    assert len(sent) == 3 * warmup + kept
    assert all(key.startswith("warm") for key in sent[: 3 * warmup])
    assert not any(key.startswith("warm") for key in sent[3 * warmup :])
    assert len(samples.decode) == kept  # the warm-up's samples are dropped


@pytest.mark.parametrize("per_seq,per_kv", [(3e-4, 0.0), (0.0, 1.2e-6)], ids=["rows", "cached"])
def test_the_two_ramps_tell_a_cost_per_row_from_one_per_cached_token(per_seq, per_kv):
    """Spaced traffic decodes one or two rows over a few hundred cached tokens, where either
    term is a few percent of a step and drowns in an 8% scatter; the ramps decode the cap's
    rows over short prompts and over the traffic's median one, so the step a loaded server
    runs (the cap's rows over that median) is measured, not extrapolated."""
    from pytest_prefill.measure.calibration_fit import decode_constants
    from pytest_prefill.serve.calibration.calibration_fit import decode_points

    true = dataclasses.replace(
        TRUE, decode_step_base=0.005, decode_per_seq=per_seq, decode_per_kv_token=per_kv
    )
    sweep = ServerSweep(256, ramp_rows=8, warmup=0)
    rng = random.Random(1)

    def sample(rows: int, context: int, noise: float, index: int) -> DecodeSample:
        step = true.decode_step(rows, rows * context)
        return DecodeSample(rows, context, step * (1 + rng.uniform(-noise, noise)), index % 2)

    traffic = [
        sample(rows, context, 0.08, i)
        for i in range(6)
        for rows in (1, 2)
        for context in (120, 260, 410, 540)
    ]
    half = sweep.decode_tokens // 2
    ramps = [sample(8, p + half, 0.02, i) for p in sweep.ramp_prompts for i in range(6)]
    values = decode_constants(decode_points(traffic + ramps))[1]
    loaded = 8 * (max(sweep.ramp_prompts) + half)
    fitted = dataclasses.replace(true, **values).decode_step(8, loaded)
    assert len(sweep.ramp_prompts) == 2
    assert fitted == pytest.approx(true.decode_step(8, loaded), rel=0.05)


def test_a_ramp_that_misses_its_rows_is_sent_again(monkeypatch):
    import asyncio

    import pytest_prefill.serve.calibration.calibration as calibration

    sweep = ServerSweep(256, ramp_rows=8, warmup=0)
    sent: list[str] = []

    def fake(rows_by_try):
        async def traffic(target, prompts, tokens, spacing, budget, key, max_seqs=0):
            sent.append(key)
            return [DecodeSample(rows_by_try[len(sent) - 1], 100, 0.01)], []

        return traffic

    # the first try reached 3 rows (the client sent the rest late), the second all 8
    monkeypatch.setattr(calibration, "traffic", fake([3, 8]))
    samples = asyncio.run(calibration._ramp(None, sweep, 32, "k"))
    assert len(sent) == 2 and [s.rows for s in samples] == [3, 8]
    sent.clear()
    monkeypatch.setattr(calibration, "traffic", fake([2] * 10))
    samples = asyncio.run(calibration._ramp(None, sweep, 32, "k"))
    assert len(sent) == calibration.RAMP_TRIES == len(samples)


@pytest.mark.parametrize(
    "fields,named",
    [
        ({"loaded_rows": -1}, "loaded_rows must be"),
        ({"loaded_rows": True, "ramp_rows": 8}, "loaded_rows must be"),
        ({"loaded_rows": 7}, "needs a ramp"),  # no ramp: no streams' prompt to send
        ({"loaded_rows": 256, "ramp_rows": 16}, "needs a ramp"),  # not below the budget
    ],
)
def test_a_loaded_stall_needs_a_ramp_and_room_in_the_budget(fields, named):
    with pytest.raises(ValueError, match=named):
        ServerSweep(256, **fields)
    assert ServerSweep(256, ramp_rows=16, loaded_rows=15).loaded_rows == 15


def test_the_loaded_stall_sends_the_stall_prompt_amid_the_ramps_rows_once_they_decode(
    monkeypatch,
):
    """Each stall prompt is sent again amid ``loaded_rows`` streams of the ramp's longer
    prompt, after a lead that covers their prefill (from the TTFT alone measured, scaled to
    all their tokens) and with streams that outlast the lead and the prompt's chunks at the
    step the ramp measured at those rows; not at all without ``loaded_rows``."""
    import asyncio

    import pytest_prefill.serve.calibration.calibration as calibration

    async def ttft(target, prompt_len, key):
        return 0.001 * prompt_len  # a millisecond a token, alone

    step = 0.05  # the ramp's decode step at its rows; spaced traffic's is 0.01

    async def traffic(target, prompts, tokens, spacing, budget, key, max_seqs=0):
        rows = len(prompts) if spacing < 0.1 else 2
        return [DecodeSample(rows, 100, step if rows >= 15 else 0.01)], []

    sent: list[dict] = []

    async def amid(target, prompt_len, rows, budget, live_tokens, key, **live):
        sent.append({"prompt": prompt_len, "rows": rows, "tokens": live_tokens, **live})
        return StallSample(prompt_len, rows, 0, 1, 1, (0.1,), 0.01, 0.0)

    async def nothing(*args, **kwargs):
        return 0.0

    monkeypatch.setattr(calibration, "_round_trip", nothing)
    monkeypatch.setattr(calibration, "prompt_alone", ttft)
    monkeypatch.setattr(calibration, "traffic", traffic)
    monkeypatch.setattr(calibration, "prompt_amid_streams", amid)
    sweep = ServerSweep(128, ramp_rows=16, loaded_rows=15, warmup=0)
    samples = Samples()
    asyncio.run(calibration.calibration_round(None, sweep, samples, 0))
    plain, loaded = sent  # the chunking check amid 2 short streams, then the loaded one
    assert plain["rows"] == sweep.live_rows and "live_prompt" not in plain
    assert loaded["rows"] == 15 and loaded["live_prompt"] == sweep.ramp_prompts[-1]
    longest = max(sweep.prompt_lens)
    prefill = 0.001 * longest * 15 * sweep.ramp_prompts[-1] / longest
    assert loaded["lead"] == pytest.approx(calibration.LIVE_LEAD + 1.5 * prefill)
    chunks = len(chunks_of(sweep.stall_prompts[0], 128, 15))
    assert loaded["tokens"] * step >= loaded["lead"] + chunks * step
    assert len(samples.loaded_stalls) == 1 and len(samples.stalls) == 1
    sent.clear()
    asyncio.run(calibration.calibration_round(None, ServerSweep(128, warmup=0), Samples(), 0))
    assert len(sent) == 1


def _batch_stalls(
    true: CostModel,
    rows: int,
    row_context: int,
    seed: int,
    way_in: float,
    prompt: int = 1024,
    noise: float = 0.03,
) -> list[StallSample]:
    """Three rounds of a ``prompt``-token prompt amid ``rows`` streams of ``row_context``
    tokens on a server running ``true`` at budget 256, each iteration with ``noise``
    multiplicative noise, its way in read as ``way_in`` seconds."""
    rng = random.Random(seed)
    pieces = chunks_of(prompt, 256, rows)
    stalls = []
    for _ in range(3):
        fused = tuple(
            true.iteration([(t, c)], rows, rows * (row_context + j))
            * (1 + rng.uniform(-noise, noise))
            for j, (t, c) in enumerate(pieces)
        )
        stalls.append(
            StallSample(prompt, rows, row_context, len(pieces), len(pieces), fused, way_in, 0.0)
        )
    return stalls


def test_a_loaded_stall_tells_the_batchs_attention_apart_and_leaves_the_way_in_alone():
    """Amid 2 short streams a chunk's attention over the batch's KV is a sliver of the
    iteration and 3% noise hides it; amid 15 streams of 300 tokens it is most of it: the fit
    finds the term there, with a standard error a third or less of the one amid 2 streams.
    The loaded stalls' way in (sent into a busy server) is not the request's: it is not read."""
    true = dataclasses.replace(TRUE, batch_attention_per_pair=1.5e-7)
    samples = _samples(256)
    samples.stalls = _batch_stalls(true, 2, 40, seed=1, way_in=0.006)
    alone = fit_server(samples, ServerSweep(256), {"source": "synthetic"})
    samples.loaded_stalls = _batch_stalls(true, 15, 300, seed=2, way_in=0.5)
    both = fit_server(samples, ServerSweep(256), {"source": "synthetic"})

    def stderr(cal: ServerCalibration) -> float:
        return cal.calibration.fits["passes"].stderrs["batch_attention_per_pair"]

    assert both.cost.batch_attention_per_pair == pytest.approx(1.5e-7, rel=0.2)
    assert stderr(both) < stderr(alone) / 3
    assert both.overhead.to_engine == alone.overhead.to_engine < 0.5


def test_a_traffic_prompt_that_waited_for_a_slot_under_the_cap_is_not_read():
    """Under a sequence cap a prompt sent while that many requests are in flight waits for one
    to finish: its way in would hold the wait (and its chunks ran beside fewer rows than were
    live), so it is left out; without a cap, or with room under it, it is read."""
    step = 0.02
    a = _record("a", 0.0, [0.05 + step * i for i in range(40)])  # decodes 0.05-0.83
    # b decodes from 0.15; c, sent at 0.3 amid a and b, gets its first token only after a has
    # finished, its chunks slowing b's steps
    slow = [0.85 + 0.04 * i for i in range(3)]
    b_times = [0.15 + step * i for i in range(35)] + slow + [0.97 + step * i for i in range(5)]
    b = _record("b", 0.1, b_times)
    c = _record("c", 0.3, [slow[-1], slow[-1] + step], prompt_len=512)
    uncapped = traffic_stalls([a, b, c], budget=256)
    assert [s.prompt_len for s in uncapped] == [32, 512]  # b amid a, c amid b
    way_in = uncapped[-1].way_in
    assert way_in > 0.5  # the wait for a's slot, read as the way in
    assert [s.prompt_len for s in traffic_stalls([a, b, c], budget=256, max_seqs=2)] == [32]
    assert len(traffic_stalls([a, b, c], budget=256, max_seqs=3)) == 2  # room under the cap


@pytest.mark.parametrize(
    "cap,stall_rows,ramp,loaded",
    [(0, 2, 8, 7), (16, 2, 8, 7), (4, 2, 4, 3), (2, 1, 2, 1), (1, 0, 0, 0)],
)
def test_a_sweep_under_a_cap_keeps_its_rows_within_it(cap, stall_rows, ramp, loaded):
    sweep = ServerSweep(256, ramp_rows=8, loaded_rows=7).capped(cap)
    assert sweep.max_seqs == cap
    assert (sweep.stall_rows, sweep.ramp_rows, sweep.loaded_rows) == (stall_rows, ramp, loaded)
    assert ServerSweep(256).capped(None) == ServerSweep(256)


@pytest.mark.parametrize(
    "fields", [{"max_seqs": -1}, {"max_seqs": True}, {"max_seqs": 4, "ramp_rows": 8}]
)
def test_a_sweep_beyond_its_cap_names_the_field(fields):
    with pytest.raises(ValueError, match="max_seqs"):
        ServerSweep(256, **fields)


@pytest.mark.parametrize("cap,rows", [(0, 2), (2, 1), (1, None)])
def test_the_chunking_checks_prompt_joins_the_streams_within_the_cap(monkeypatch, cap, rows):
    import asyncio

    import pytest_prefill.serve.calibration.calibration as calibration

    async def nothing(*args, **kwargs):
        return 0.0

    caps: list[int] = []

    async def traffic(target, prompts, tokens, spacing, budget, key, max_seqs=0):
        caps.append(max_seqs)
        return [DecodeSample(1, 100, 0.01)], []

    sent: list[int] = []

    async def amid(target, prompt_len, rows, budget, live_tokens, key, **live):
        sent.append(rows)
        return StallSample(prompt_len, rows, 0, 1, 1, (0.1,), 0.01, 0.0)

    monkeypatch.setattr(calibration, "_round_trip", nothing)
    monkeypatch.setattr(calibration, "prompt_alone", nothing)
    monkeypatch.setattr(calibration, "traffic", traffic)
    monkeypatch.setattr(calibration, "prompt_amid_streams", amid)
    sweep = ServerSweep(128, warmup=0).capped(cap)
    asyncio.run(calibration.calibration_round(None, sweep, Samples(), 0))
    assert caps == [cap]  # the traffic knows the cap
    assert sent == ([] if rows is None else [rows])


@pytest.mark.parametrize(
    "given,flags,cap", [(None, None, 0), (2, None, 2), (None, "-np 3", 3), (4, "-np 3", 4)]
)
def test_calibrate_server_runs_under_the_cap_given_else_the_servers_own(
    monkeypatch, given, flags, cap
):
    """``calibrate-server --max-seqs N`` caps its sweep; without it the cap the server's command
    states (here llama.cpp's ``-np``) does; with neither the sweep is uncapped."""
    import argparse
    import asyncio
    import types

    import pytest_prefill.serve.calibration.calibration as calibration
    from pytest_prefill.commands.server_calibration import sweep_from_args
    from pytest_prefill.serve.client.identity import ServerIdentity

    swept: list[ServerSweep] = []

    async def measure(target, sweep, progress=None):
        swept.append(sweep)
        return Samples()

    monkeypatch.setattr(calibration, "measure_server", measure)
    monkeypatch.setattr(calibration, "fit_server", lambda samples, sweep, provenance: sweep)
    monkeypatch.setattr(calibration, "server_provenance", lambda *args, **kwargs: {})
    args = argparse.Namespace(budget=256, repeats=2, max_prompt=2048, max_seqs=given)
    identity = ServerIdentity("http://x", ("m",), "llama.cpp", "given", flags=flags)
    asyncio.run(
        calibration.calibrate_server(
            types.SimpleNamespace(identity=identity), sweep_from_args(args)
        )
    )
    assert swept[0].max_seqs == cap
    assert swept[0].stall_rows == (min(2, cap - 1) if cap else 2)
