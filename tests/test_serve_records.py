"""Per-request records and their serving metrics: the same definitions as the simulator's
(vLLM's), tokens that arrived together counted as such, and a lossless JSON line per request."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pytest_prefill.plan.metrics import SLO, serving_metrics_of
from pytest_prefill.serve.client.prompts import Prompts, prompts_from_folder
from pytest_prefill.serve.load.records import BenchRun, ServerRecord


def _record(rid: str, arrival: float, times: list[float], counts: list[int], **kw) -> ServerRecord:
    out = sum(counts)
    return ServerRecord(rid, arrival, arrival, 10, out, tuple(times), tuple(counts), 10, out, **kw)


def test_metrics_follow_the_definitions():
    a = _record("a", 0.0, [0.5, 0.6, 0.8], [1, 2, 1])  # tokens at .5, .6, .6, .8
    b = _record("b", 1.0, [1.2], [1])
    assert a.token_times == (0.5, 0.6, 0.6, 0.8)
    m = serving_metrics_of([a, b], slo=SLO(ttft=0.4))
    assert m.completed == 2 and m.total_output_tokens == 5 and m.total_input_tokens == 20
    assert m.ttft.mean == pytest.approx((0.5 + 0.2) / 2)
    assert m.tpot.count == 1 and m.tpot.mean == pytest.approx((0.8 - 0.5) / 3)
    gaps = [0.1, 0.0, 0.2]  # the chunk of two gives a gap of 0
    assert m.itl.count == 3 and m.itl.mean == pytest.approx(sum(gaps) / 3)
    assert m.e2el.median == pytest.approx((0.8 + 0.2) / 2)
    assert m.duration == pytest.approx(1.2) and m.good == 1 and m.attainment == 0.5


def test_metrics_refuse_tokens_out_of_order():
    bad = _record("a", 0.0, [0.5, 0.4], [1, 1])
    with pytest.raises(ValueError, match="token_times"):
        serving_metrics_of([bad])


def test_failed_and_inexact_requests_are_told_apart():
    ok = _record("ok", 0.0, [0.1, 0.2], [1, 1])
    failed = ServerRecord("f", 0.0, 0.0, 10, 2, error="stalled")
    short = ServerRecord("s", 0.0, 0.0, 10, 3, (0.1, 0.2), (1, 1), 10, 2)
    run = BenchRun((ok, failed, short), {"url": "x"}, {}, "now")
    assert run.completed == (ok, short) and run.failed == (failed,) and run.inexact() == (short,)
    assert run.metrics().completed == 2 and run.to_dict()["failed"] == 1


def test_records_survive_a_json_line():
    record = _record("a", 0.25, [0.5, 0.7], [2, 1], server_timings={"prompt_ms": 3.5})
    run = BenchRun((record,), {}, {}, "now", warmup=(record,))
    lines = run.records_jsonl().splitlines()
    assert json.loads(lines[0])["warmup"] is True
    assert ServerRecord.from_dict(json.loads(lines[1])) == record
    with pytest.raises(ValueError, match="record"):
        ServerRecord.from_dict({"id": "x"})


def test_prompts_have_exact_lengths_and_differ_by_request():
    words = tuple(f" w{i:03d}" for i in range(100))
    prompts = Prompts(words, tuple(range(100)), "test")
    text = prompts.text("r1", 37)
    assert len(text.split()) == 37 and text == prompts.text("r1", 37)
    assert text != prompts.text("r2", 37)
    assert [prompts.ids[prompts.words.index(" " + w)] for w in text.split()] == prompts.token_ids(
        "r1", 37
    )
    with pytest.raises(ValueError, match="prompt length"):
        prompts.text("r1", 0)
    with pytest.raises(ValueError, match="single-token words"):
        Prompts(words[:3], (1, 2, 3), "few")


def test_word_tokens_are_read_from_a_tokenizer_json(tmp_path):
    vocab = {
        f"\u0120{w}": i
        for i, w in enumerate(f"{a}{b}{c}" for a in "abc" for b in "defg" for c in "hijklm")
    }
    vocab.update({"!": 500, "\u0120a1": 501, "plain": 502})
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab}}))
    prompts = prompts_from_folder(tmp_path)
    assert len(prompts.words) == 72 and all(
        w.startswith(" ") and w[1:].isalpha() for w in prompts.words
    )
    assert all(vocab["\u0120" + w[1:]] == i for w, i in zip(prompts.words, prompts.ids))
    with pytest.raises(ValueError, match="no prefill-words.json and no tokenizer.json"):
        prompts_from_folder(tmp_path / "..")


def test_peak_concurrency_counts_requests_in_flight_and_a_finish_frees_its_place():
    a = _record("a", 0.0, [1.0], [1])
    b = _record("b", 0.5, [2.0], [1])  # overlaps a
    c = _record("c", 1.0, [1.5], [1])  # sent as a finishes: b and c in flight
    d = _record("d", 3.0, [3.5], [1])
    assert BenchRun((a, b, c, d), {}, {}, "now").peak_concurrency() == 2
    assert BenchRun((a, d), {}, {}, "now").peak_concurrency() == 1


def _run_at(rate: float, service: float, count: int = 20) -> BenchRun:
    """``count`` requests offered at ``rate`` to a server that serves one at a time, each in
    ``service`` seconds (it keeps up when rate * service < 1)."""
    records, free = [], 0.0
    for i in range(count):
        sent = i / rate
        done = max(sent, free) + service
        free = done
        records.append(ServerRecord(f"r{i}", sent, sent, 10, 1, (done,), (1,), 10, 1))
    return BenchRun(tuple(records), {}, {}, "now")


def test_a_run_the_server_could_not_keep_up_with_says_so():
    from pytest_prefill.report.bench import overload_line

    slow = _run_at(rate=2.0, service=1.0)  # 2 req/s offered, 1 served
    assert slow.offered_rate() == pytest.approx(2.0)
    line = overload_line(slow, slow.metrics())
    assert line and "2 req/s offered" in line and "did not keep up" in line
    kept = _run_at(rate=0.5, service=1.0)
    assert overload_line(kept, kept.metrics()) is None
    burst = BenchRun(tuple(_record(f"r{i}", 0.0, [1.0 + i], [1]) for i in range(3)), {}, {}, "x")
    assert burst.offered_rate() is None and overload_line(burst, burst.metrics()) is None


def _capped_run(rate: float, service: float, cap: int, count: int = 20) -> BenchRun:
    """As :func:`_run_at`, but with at most ``cap`` requests in flight: a send waits for a free
    place (so the last actual send comes late, as the load generator's semaphore makes it)."""
    records, free, done_times = [], 0.0, []
    for i in range(count):
        scheduled = i / rate
        sent = max(scheduled, done_times[i - cap]) if i >= cap else scheduled
        done = max(sent, free) + service
        free = done
        done_times.append(done)
        records.append(ServerRecord(f"r{i}", scheduled, sent, 10, 1, (done,), (1,), 10, 1))
    settings = {"schedule": {"max_concurrency": cap}, "prompts": "words"}
    return BenchRun(tuple(records), {}, settings, "now")


def test_a_concurrency_cap_does_not_hide_the_overload_and_the_offered_rate_is_printed():
    """The cap delays the last send until a place frees, so the drain measured from the last
    actual send is short; measured from the last scheduled send it is not, and the warning
    fires, naming the cap. The text prints the rate offered beside the rate served."""
    from pytest_prefill.report.bench import bench_text, overload_line

    capped = _capped_run(rate=2.0, service=1.0, cap=2)
    last_token = max(r.chunk_times[-1] for r in capped.records)
    span = max(r.scheduled for r in capped.records)  # the first is scheduled at 0
    assert last_token - max(r.arrival for r in capped.records) <= span / 2  # hidden that way
    line = overload_line(capped, capped.metrics())
    assert line and "did not keep up" in line and "--max-concurrency 2 held sends back" in line
    text = bench_text(dataclasses.replace(capped, server=SERVER), capped.metrics())
    served = capped.metrics().request_throughput
    assert "Offered: 2 req/s" in text and f"served {served:.3g} req/s" in text


SERVER = {"url": "http://x", "engine": "vllm", "engine_from": "a test", "models": ["m"]}
