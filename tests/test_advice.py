"""The one chunk rule and the one recommendation: every report derives its chunk and its words
from these, so a cost model gets the same chunk and the same sentence everywhere."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_prefill.plan.advice import (
    FALLBACK_CHUNK,
    MIN_USEFUL_CHUNK,
    FittedCost,
    choose_chunk,
    chunk_from_cost,
    chunk_star_text,
    recommend,
)
from pytest_prefill.sim import PRESETS, CostModel

pytestmark = pytest.mark.sim

seconds = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
positive = st.floats(min_value=1e-6, max_value=1.0)


def cost_of(overhead: float, per_token: float, decode: float) -> CostModel:
    return CostModel(
        prefill_pass_overhead=overhead, prefill_per_token=per_token, decode_step_base=decode
    )


@given(
    overhead=positive,
    per_token=seconds,
    decode=positive,
    prompt_len=st.integers(1, 100_000),
)
def test_the_chunk_is_c_star_rounded_within_the_prompt_or_the_fallback(
    overhead, per_token, decode, prompt_len
):
    cost = cost_of(overhead, per_token, decode)
    star = cost.chunk_star()
    chosen = choose_chunk(cost, prompt_len)
    assert 1 <= chosen.chunk <= prompt_len
    if math.isinf(star) and star > 0:
        assert chosen.chunk == prompt_len
    elif star >= 1:
        assert chosen.chunk == min(round(star), prompt_len)
    else:
        assert chosen.chunk == min(FALLBACK_CHUNK, prompt_len)
    assert chunk_from_cost(cost, prompt_len) == chosen.chunk


def test_a_refused_per_token_cost_gives_the_fallback_chunk_and_no_recommendation():
    lab = PRESETS["lab-laptop"].cost
    chosen = choose_chunk(lab, 2048, {"prefill_per_token"})
    assert chosen.chunk == FALLBACK_CHUNK and "refused" in chosen.how
    advice = recommend(FittedCost(lab, frozenset({"prefill_per_token"})))
    assert advice.policy == "undetermined" and advice.chunk is None
    assert chunk_star_text(FittedCost(lab, frozenset({"prefill_per_token"}))).endswith(advice.line)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("cost", {"prefill_per_token": 1e-4}),
        ("refused", "prefill_per_token"),
        ("refused", {3}),
        ("contexts", (0, -1)),
        ("contexts", (2048.0,)),
        ("trust", {"held_out": 0.1}),
    ],
)
def test_a_bad_fitted_cost_is_refused_by_name(field, value):
    fields = {"cost": PRESETS["lab-laptop"].cost, field: value}
    with pytest.raises(ValueError, match=field):
        FittedCost(**fields)


def test_a_fitted_cost_holds_its_refusals_as_a_set_and_its_contexts_in_order():
    lab = PRESETS["lab-laptop"].cost
    fitted = FittedCost(lab, ["prefill_per_token", "prefill_per_token"], [8192, 0])
    assert fitted.refused == {"prefill_per_token"} and fitted.contexts == (8192, 0)
    assert fitted == FittedCost(lab, frozenset({"prefill_per_token"}), (8192, 0))


def test_the_fallback_is_the_smallest_useful_chunk():
    assert FALLBACK_CHUNK == MIN_USEFUL_CHUNK


@pytest.mark.parametrize("prompt_len", [0, -1, 1.5, True, "2048"])
def test_a_bad_prompt_length_is_refused_by_name(prompt_len):
    with pytest.raises(ValueError, match="prompt_len"):
        choose_chunk(PRESETS["lab-laptop"].cost, prompt_len)


def test_the_recommendation_is_json_able_with_infinite_c_star():
    free = cost_of(1e-3, 0.0, 1e-2)
    data = recommend(FittedCost(free)).to_dict()
    assert data["chunk_star"] == "inf" and data["policy"] == "chunked"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.03573, "35.73"), (0.0, "0.00"), (0.000648, "0.648"), (1.5, "1,500.00"), (math.nan, "-")],
)
def test_one_millisecond_formatter(seconds, text):
    from pytest_prefill.units import ms

    assert ms(seconds) == text


@pytest.mark.parametrize(
    "cost",
    [
        PRESETS["lab-laptop"].cost,
        cost_of(0.05, 1e-5, 0.01),  # C* < 0: the fallback
        cost_of(1e-3, 0.0, 1e-2),  # C* infinite: the whole prompt
    ],
)
def test_the_archived_timeline_and_the_timeline_command_draw_the_one_chunk(cost, tmp_path, capsys):
    import json
    import re

    from pytest_prefill.cli import main
    from pytest_prefill.report.timeline_svg import lab_timeline_svg

    chunk = choose_chunk(cost, 2048).chunk
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(cost.to_dict()))
    out = tmp_path / "t.svg"
    assert main(["timeline", "--out", str(out), "--cost", str(path)]) == 0
    for svg in (out.read_text(), lab_timeline_svg(cost, "archived")):
        assert re.findall(r">chunked \(chunk ([\d,]+) tokens\)", svg) == [f"{chunk:,}"]


def test_summary_compare_and_archive_say_the_same_words_and_warnings(tmp_path, capsys):
    import json

    from pytest_prefill.archive import saving
    from pytest_prefill.cli import main
    from pytest_prefill.report.verdicts import verdict_block

    cost = CostModel(
        prefill_pass_overhead=1e-3,
        prefill_per_token=1e-5,
        prefill_per_pair=2e-9,
        decode_step_base=1e-2,
        fusion_penalty=0.2,
    )
    document = {
        "kind": "pytest-prefill/calibration",
        "schema_version": 1,
        "cost_model": cost.to_dict(),
        "provenance": {"max_context": 40960},
        "refusals": [],
    }
    advice = recommend(FittedCost(cost, contexts=(0, 2048, 8192, 32768)))
    assert advice.warnings, "a pair term and a fusion penalty each earn a warning"
    block = verdict_block(FittedCost(cost, contexts=(0, 2048, 8192, 32768)), "x", [])
    assert advice.line in block and all(w in block for w in advice.warnings)
    assert saving.cost_block(FittedCost(cost, contexts=(0, 2048, 8192, 32768)), "x")[
        "recommendation"
    ] == (advice.to_dict())
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(document))
    assert main(["compare", str(path), str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count(advice.line) == 2 and all(out.count(w) == 2 for w in advice.warnings)


# --- trust: no recommendation from a fit the calibration calls untrustworthy ---------------------


def test_a_refused_per_token_cost_gives_no_c_star_even_with_a_pair_term():
    """Issue 21: with the per-token cost refused it printed `C* = (1.72 - 1.43) ms / 0.0 us =
    126 tokens` (the pair term's C*) and then `Prefer DISAGGREGATION`."""
    from pytest_prefill.plan.advice import chunk_star_text

    cost = CostModel(
        prefill_pass_overhead=1.43e-3,
        prefill_per_token=0.0,
        prefill_per_pair=1e-10,
        decode_step_base=1.72e-3,
    )
    assert math.isfinite(cost.chunk_star()) and cost.chunk_star() > 0  # the pair term's C*
    advice = recommend(FittedCost(cost, frozenset({"prefill_per_token"})))
    assert advice.policy == "undetermined" and "Prefer" not in advice.line
    text = chunk_star_text(FittedCost(cost, frozenset({"prefill_per_token"})))
    assert "not determined" in text and f"= {cost.chunk_star():.0f} tokens" not in text
    assert "Prefer" not in text


@pytest.mark.parametrize(
    ("trust", "words"),
    [
        (dict(held_out=0.49), "held-out error 49% > 25%"),
        (dict(held_out=0.14, busy=True), "the machine was BUSY while it was timed and its "),
        (dict(held_out=None, busy=True), "held-out error was not computed"),
        (dict(held_out=math.nan), "held-out error not finite"),
    ],
)
def test_an_untrustworthy_fit_gives_no_recommendation(trust, words):
    from pytest_prefill.plan.advice import MAX_TRUSTED_HELD_OUT, Trust

    cost = PRESETS["lab-laptop"].cost
    doubted = recommend(FittedCost(cost, trust=Trust(**trust)))
    assert doubted.policy == "undetermined" and words in doubted.line
    assert "Prefer" not in doubted.line
    trusted = recommend(FittedCost(cost, trust=Trust(held_out=MAX_TRUSTED_HELD_OUT, busy=False)))
    assert trusted.line == recommend(FittedCost(cost)).line  # a trusted fit: the one rule's words


def test_a_sound_fit_on_a_busy_machine_recommends_with_the_caveat():
    from pytest_prefill.plan.advice import MAX_BUSY_HELD_OUT, Trust

    cost = PRESETS["lab-laptop"].cost
    sound = recommend(FittedCost(cost, trust=Trust(held_out=0.06, busy=True)))
    assert (
        sound.line == recommend(FittedCost(cost)).line
        and sound.policy == recommend(FittedCost(cost)).policy
    )
    (caveat,) = [w for w in sound.warnings if w.startswith("caveat:")]
    assert "BUSY" in caveat and "6.0%" in caveat
    edge = recommend(FittedCost(cost, trust=Trust(held_out=MAX_BUSY_HELD_OUT, busy=True)))
    assert edge.policy != "undetermined"
    over = recommend(FittedCost(cost, trust=Trust(held_out=MAX_BUSY_HELD_OUT * 1.5, busy=True)))
    assert over.policy == "undetermined" and f"<= {MAX_BUSY_HELD_OUT:.0%}" in over.line
    quiet = recommend(FittedCost(cost, trust=Trust(held_out=0.06, busy=False)))
    assert not [w for w in quiet.warnings if w.startswith("caveat:")]


def test_the_summary_states_c_star_with_its_trust_figures():
    """Issue 21: `C* = -83620 tokens ...; pass overhead is 185% of one decode step` with the
    BUSY warning and the 49% held-out error only in progress lines above."""
    from pytest_prefill.plan.advice import Trust
    from pytest_prefill.report.verdicts import verdict_block

    cost = PRESETS["lab-laptop"].cost
    busy = Trust(held_out=0.49, busy=True, unstable=3)
    line, advice = verdict_block(FittedCost(cost, trust=busy), "measured", [])[1:3]
    assert line.startswith("C* = ") and "held-out error 49.0%" in line
    assert "BUSY machine" in line and "3 unstable measurement(s)" in line
    assert advice.startswith("-> no recommendation: this fit is not trustworthy")
    quiet = verdict_block(FittedCost(cost, trust=Trust(0.049, False)), "measured", [])[1]
    assert "held-out error 4.9%, quiet machine" in quiet
    assert verdict_block(FittedCost(cost), "preset", [])[1].endswith("[not measured here]")
    refused = verdict_block(
        FittedCost(cost, frozenset({"prefill_per_token"}), trust=busy), "measured", []
    )[1]
    assert refused.startswith("C* not determined")


def test_a_calibration_documents_trust_and_every_reader_applies_it():
    """The calibration's trust figures travel with it: the JSON, then --cost FILE, the archive
    and compare read them back (trust_in) and refuse to recommend alike."""
    from pytest_prefill.plan.advice import Trust
    from pytest_prefill.plan.cost_document import trust_in

    cost = PRESETS["lab-laptop"].cost
    document = {
        "kind": "pytest-prefill/calibration",
        "cost_model": cost.to_dict(),
        "held_out_median_error": 0.49,
        "provenance": {"quiet": {"quiet": False, "warning": "BUSY MACHINE"}},
        "measurements": [{"measurement": {"warning": "unstable"}}, {"measurement": {}}],
    }
    assert trust_in(document) == Trust(0.49, True, 1)
    assert trust_in({"calibration": document}) == Trust(0.49, True, 1)  # inside a run
    assert trust_in(cost.to_dict()) is None  # a bare cost model: nothing to trust or doubt
    assert Trust.from_dict(Trust(0.49, True, 1).to_dict()) == Trust(0.49, True, 1)
