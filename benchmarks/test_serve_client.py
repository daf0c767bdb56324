"""The load generator's own timestamp error and cost: every token's client stamp against the
time a reference server (its own process, same monotonic clock) wrote it, at 1, 64 and 512
concurrent streams. Reported, never asserted."""

from __future__ import annotations

import pytest

from pytest_prefill.serve.launch.reference import timestamp_errors
from pytest_prefill.units import us

pytestmark = pytest.mark.sim

STREAMS = (1, 64, 512)
TOKENS = 100
GAP = 0.05  # 512 streams x 20 tokens/s = 10,240 tokens/s through one Python client


def test_client_timestamp_error(prefill_report):
    results = timestamp_errors(STREAMS, tokens=TOKENS, gap=GAP)
    lines = [
        f"{'streams':>8} {'tokens':>7} {'p50 us':>8} {'p99 us':>9} {'max us':>9} {'CPU us/token':>13}"
    ]
    for r in results:
        lines.append(
            f"{r.streams:>8} {r.tokens:>7} {us(r.p50):>8} {us(r.p99):>9} {us(r.maximum):>9} "
            f"{us(r.cpu_per_token):>13}"
        )
    text = "\n".join(lines)
    print(
        f"\nclient timestamp error (client stamp - server write), {TOKENS} tokens a stream, "
        f"one every {GAP * 1e3:g} ms\n{text}"
    )
    prefill_report.table("client timestamp error", text, data=[r.to_dict() for r in results])
    assert [r.tokens for r in results] == [n * TOKENS for n in STREAMS]
