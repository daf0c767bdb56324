"""The falsifier, on the device under test. Its claim is stated before any measurement; the
test passes when the claim HOLDS and fails, with the stall table in the message, when it
FAILS. The chunk is C* of the session's calibration."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def test_chunked_prefill_shortens_the_worst_decode_gap(prefill_falsifier):
    from pytest_prefill.report.falsifier import stall_table_of

    result = prefill_falsifier()
    if result.verdict == "FAILS":
        pytest.fail(
            f"FAILS: {result.claim}\n{result.verdict_line}\n\n{stall_table_of(result)}",
            pytrace=False,
        )
