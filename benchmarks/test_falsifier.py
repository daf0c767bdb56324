"""The falsifier, on the device under test. Its claim is stated before any measurement; the
test passes when the claim HOLDS and fails, with the stall table in the message, when it
FAILS. The chunk is C* of the session's calibration."""

from __future__ import annotations

import pytest

from pytest_prefill.engine.falsifier import CLAIM, DEFAULT_PROMPT_LEN
from pytest_prefill.report.falsifier import run_falsifier, stall_table_of

pytestmark = pytest.mark.gpu


def test_chunked_prefill_shortens_the_worst_decode_gap(
    prefill_model, prefill_calibration, prefill_settings, prefill_report
):
    emitted: list[str] = []

    def emit(text: str) -> None:
        emitted.append(text)
        prefill_report.say(text)

    s = prefill_settings
    result = run_falsifier(
        prefill_model,
        prompt_len=DEFAULT_PROMPT_LEN,
        cost=prefill_calibration.cost,
        repeats=s.repeats,
        warmup=s.warmup,
        dry_run=s.dry_run,
        emit=emit,
        progress=prefill_report.say,
    )
    assert CLAIM in emitted[0], "the claim must be stated before any measurement"
    data = result.to_dict()
    prefill_report.table(
        f"Falsifier: a live stream's decode gap when a {result.prompt_len:,}-token prompt "
        f"arrives; chunk {result.chunk:,} ({result.chunk_source})",
        stall_table_of(result),
        {k: v for k, v in data.items() if k != "provenance"},
    )
    prefill_report.verdict("falsifier", result.verdict, result.claim, result.verdict_line)
    if result.verdict == "FAILS":
        pytest.fail(
            f"FAILS: {result.claim}\n{result.verdict_line}\n\n{stall_table_of(result)}",
            pytrace=False,
        )
