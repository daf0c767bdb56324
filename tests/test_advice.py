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
    advice = recommend(lab, {"prefill_per_token"})
    assert advice.policy == "undetermined" and advice.chunk is None
    assert chunk_star_text(lab, {"prefill_per_token"}).endswith(advice.line)


def test_the_fallback_is_the_smallest_useful_chunk():
    assert FALLBACK_CHUNK == MIN_USEFUL_CHUNK


@pytest.mark.parametrize("prompt_len", [0, -1, 1.5, True, "2048"])
def test_a_bad_prompt_length_is_refused_by_name(prompt_len):
    with pytest.raises(ValueError, match="prompt_len"):
        choose_chunk(PRESETS["lab-laptop"].cost, prompt_len)


def test_the_recommendation_is_json_able_with_infinite_c_star():
    free = cost_of(1e-3, 0.0, 1e-2)
    data = recommend(free).to_dict()
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

    from pytest_prefill.archive import runs as archive
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
    advice = recommend(cost, (), (0, 2048, 8192, 32768))
    assert advice.warnings, "a pair term and a fusion penalty each earn a warning"
    block = verdict_block(cost, "x", [], (), (0, 2048, 8192, 32768))
    assert advice.line in block and all(w in block for w in advice.warnings)
    assert archive.cost_block(cost, "x", contexts=(0, 2048, 8192, 32768))["recommendation"] == (
        advice.to_dict()
    )
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(document))
    assert main(["compare", str(path), str(path)]) == 0
    out = capsys.readouterr().out
    assert out.count(advice.line) == 2 and all(out.count(w) == 2 for w in advice.warnings)
