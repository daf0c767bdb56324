"""A hostile server's /metrics: NaN and infinite counters are unknown (the run's documents
still write), and counters that go down (a restart) are not read, never negative tokens."""

from __future__ import annotations

import asyncio
import json

import pytest
from hostile import serving, trickle

pytest.importorskip("prometheus_client")

from pytest_prefill.serve.load import server_metrics  # noqa: E402
from pytest_prefill.serve.load.records import ServerCounters  # noqa: E402
from pytest_prefill.serve.load.server_metrics import parse_metrics, scrape  # noqa: E402

TEXT = """# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total {prompt}
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total {generated}
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total {preempted}
"""


def _samples(prompt="100", generated="50", preempted="0") -> dict[str, float]:
    return parse_metrics(TEXT.format(prompt=prompt, generated=generated, preempted=preempted))


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf"])
def test_a_non_finite_counter_is_unknown_and_the_run_still_writes(bad):
    before = _samples()
    after = _samples(prompt=bad, generated="80")
    assert "vllm:prompt_tokens_total" not in after
    counters = ServerCounters(before, after)
    summary = counters.summary()
    assert summary["prompt_tokens"] is None and summary["generation_tokens"] == 30
    json.dumps(counters.to_dict(), allow_nan=False)  # what --json and --records need
    # a document written before: its NaN is not read as a figure either
    assert (
        ServerCounters(
            {"vllm:prompt_tokens_total": 1.0}, {"vllm:prompt_tokens_total": float(bad)}
        ).delta("prompt_tokens")
        is None
    )


def test_counters_that_go_down_are_not_read():
    counters = ServerCounters(_samples("90000", "100", "60"), _samples("3", "50", "10"))
    summary = counters.summary()
    assert counters.reset
    assert all(
        summary[name] is None for name in ("prompt_tokens", "generation_tokens", "preemptions")
    )
    line = counters.line()
    assert "counters reset" in line and "not read" in line and "-" not in line.split(":", 1)[1]


def test_counters_that_grow_are_read():
    counters = ServerCounters(_samples("100", "50", "1"), _samples("160", "80", "3"))
    summary = counters.summary()
    assert not counters.reset
    assert (summary["prompt_tokens"], summary["generation_tokens"], summary["preemptions"]) == (
        60,
        30,
        2,
    )


def _metrics_text(lines: int) -> bytes:
    return (
        TEXT.format(prompt="100", generated="50", preempted="0")
        + "".join(f"vllm:filler_{i}_total 1\n" for i in range(lines))
    ).encode()


def _plain(body: bytes) -> bytes:
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return head.encode() + body


def test_a_metrics_page_past_the_cap_is_not_parsed(monkeypatch):
    body = _metrics_text(200)
    monkeypatch.setattr(server_metrics, "MAX_METRICS_BYTES", len(body) - 1)

    async def handle(method, path, payload, writer):
        writer.write(_plain(body))

    with serving(handle) as url:
        assert asyncio.run(scrape(url)) is None
        monkeypatch.setattr(server_metrics, "MAX_METRICS_BYTES", len(body))
        assert asyncio.run(scrape(url))["vllm:prompt_tokens_total"] == 100


def test_a_trickled_metrics_page_is_given_up_at_the_deadline(monkeypatch):
    body = _plain(_metrics_text(0))  # a byte every 10 ms: every read well inside its timeout

    async def handle(method, path, payload, writer):
        await trickle(writer, body, 0.01)

    with serving(handle) as url:
        whole = asyncio.run(scrape(url))  # the whole page arrives inside the default deadline
        monkeypatch.setattr(server_metrics, "SCRAPE_DEADLINE", len(body) * 0.01 / 4)
        cut = asyncio.run(scrape(url))
    assert whole is not None and whole["vllm:prompt_tokens_total"] == 100
    assert cut is None
