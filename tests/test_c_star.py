"""One C* story (issue 50 item 4): C* by context says why when it goes below a token; the
reason for a C* below one names the term that takes the decode step, never one held at 0; a
held-out prediction of 0 ms is not the "worst" error."""

from __future__ import annotations

import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_prefill.measure.calibration_points import Point, Prediction
from pytest_prefill.measure.timing import Measurement
from pytest_prefill.plan.advice import (
    TYPICAL_PROMPT,
    FittedCost,
    choose_chunk,
    chunk_star_text,
    recommend,
    star_reason,
)
from pytest_prefill.report.calibration import held_out_text
from pytest_prefill.sim import CostModel

pytestmark = pytest.mark.sim

# The calibration: the overhead refused (0), decode reading cached KV: C* 14 at no
# context, negative from 2,048 tokens on.
REFUSED_OVERHEAD = CostModel(
    prefill_pass_overhead=0.0,
    prefill_per_token=2e-4,
    decode_step_base=2.8e-3,
    decode_per_kv_token=1.65e-6,
)


def test_a_c_star_below_one_with_the_overhead_at_0_blames_the_kv_read_not_the_overhead():
    assert REFUSED_OVERHEAD.chunk_star() == pytest.approx(14)
    assert REFUSED_OVERHEAD.chunk_star(context=TYPICAL_PROMPT) < 0
    chosen = choose_chunk(REFUSED_OVERHEAD, 4096)
    assert "overhead" not in chosen.how
    assert f"C* at {TYPICAL_PROMPT:,} tokens of context = " in chosen.how
    assert "reading the KV of 2,048 cached prompt tokens" in chosen.how
    text = chunk_star_text(FittedCost(REFUSED_OVERHEAD))
    by_context, note = text.split("C* by context")[1].splitlines()[1:3]
    assert "-" in by_context  # a negative C* printed ...
    assert note.strip().startswith("below 1 from 2,048 tokens of context: reading the KV")
    assert "overhead" not in note  # ... with its reason, not a false one


@given(
    overhead=st.floats(0, 0.1),
    per_kv=st.floats(0, 1e-5),
    decode=st.floats(1e-4, 0.1),
    context=st.sampled_from([0, 2048, 8192, 32768]),
)
def test_the_reason_names_only_terms_the_model_holds(overhead, per_kv, decode, context):
    cost = CostModel(
        prefill_pass_overhead=overhead,
        prefill_per_token=1e-4,
        decode_step_base=decode,
        decode_per_kv_token=per_kv,
    )
    reason = star_reason(cost, context)
    if overhead == 0:
        assert "overhead" not in reason
    if per_kv == 0 or context == 0:
        assert "reading the KV" not in reason
    if cost.chunk_star(context=context) <= 0:
        assert "fill" in reason  # the terms named do fill the step


def test_the_recommendation_at_c_star_0_says_what_fills_the_step():
    cost = CostModel(prefill_pass_overhead=0.05, prefill_per_token=1e-4, decode_step_base=0.03)
    assert (
        "the pass overhead alone (50.00 ms) fills a decode step" in recommend(FittedCost(cost)).line
    )


def _prediction(length: int, measured: float, held: float) -> Prediction:
    return Prediction(
        Point("prefill", length, Measurement.from_samples([measured])), measured, held
    )


def test_a_held_out_prediction_of_0_ms_is_named_apart_from_the_worst():
    """A refit that crosses zero predicted 0.00 ms (-100%) and made "the worst 100%"."""
    calibration = types.SimpleNamespace(
        predictions=(
            _prediction(32, 0.010, 0.0),
            _prediction(256, 0.020, 0.021),
            _prediction(1024, 0.050, 0.045),
        ),
        in_sample_median=0.01,
    )
    text = held_out_text(calibration)
    assert "worst 10.0%" in text and "100" not in text
    assert "1 predicted 0 ms, at 32 tokens" in text
    assert "median 10.0%" in text  # the median still counts it: the figure the trust rule reads
