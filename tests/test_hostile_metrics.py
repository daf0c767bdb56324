"""A hostile server's /metrics: NaN and infinite counters are unknown (the run's documents
still write), and counters that go down (a restart) are not read, never negative tokens."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("prometheus_client")

from pytest_prefill.serve.client.counters import ServerCounters  # noqa: E402
from pytest_prefill.serve.load.server_metrics import parse_metrics  # noqa: E402

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
