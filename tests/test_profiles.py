"""Engine profiles (sim/profiles.py): each default pinned to the value read from the engine's
source (the citation says where), validation naming the field, the flags in each engine's own
terms, and ``simulate(engine=...)`` with ``lab`` the default."""

from __future__ import annotations

import dataclasses
import math

import pytest
from strategies import V2, scenario

from pytest_prefill.plan.engine_commands import engine_flags, flags_text
from pytest_prefill.sim import (
    KNOBS,
    LAB,
    PROFILES,
    EngineProfile,
    get_profile,
    simulate,
)

pytestmark = pytest.mark.sim

# (first_token, max_batched_tokens, max_seqs) as each engine's source gives its default (see
# each profile's citations: file, version and the case taken)
DEFAULTS = {
    "lab": ("decode", None, None),
    "vllm": ("prefill", 2048, 256),  # arg_utils: vllm serve, GPU < 70 GiB or A100
    "sglang": ("prefill", 8192, None),  # server_args: chunked_prefill_size on an 80 GB GPU
    "llama.cpp": ("prefill", 2048, 4),  # -b 2048, -np -1 = auto -> 4 slots
    "transformers": ("prefill", 8192, 1024),  # _default_max_batch_tokens, FALLBACK_DEFAULTS
    "distserve": ("prefill", None, None),  # simdistserve: batch sizes 10**7, no token cap
}


def test_the_profiles_are_the_six_named_in_design():
    assert set(PROFILES) == set(DEFAULTS)
    assert get_profile("lab") is LAB


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_each_default_is_the_engines_own(name):
    profile = get_profile(name)
    assert (profile.first_token, profile.max_batched_tokens, profile.max_seqs) == DEFAULTS[name]
    kv = ("paged", 16, True) if name == "vllm" else ("reserve", 16, False)
    assert (profile.kv, profile.kv_block_tokens, profile.prefix_caching) == kv


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_each_default_cites_where_it_was_read(name):
    profile = get_profile(name)
    for knob in ("first_token", "max_batched_tokens", "max_seqs"):
        assert len(profile.sources[knob]) > 30, knob
    if name != "lab":
        assert profile.description


def test_the_vllm_profile_says_which_case_of_its_gpu_dependent_default_it_took():
    source = get_profile("vllm").sources["max_batched_tokens"]
    assert "70 GiB" in source and "A100" in source and "vllm/engine/arg_utils.py" in source


def test_an_unknown_profile_lists_the_allowed_ones():
    with pytest.raises(ValueError, match="allowed: lab, vllm, sglang, llama.cpp"):
        get_profile("tgi")
    with pytest.raises(ValueError, match="engine"):
        simulate("shared", scenario(V2), V2, engine="tgi")
    with pytest.raises(ValueError, match="engine must be a profile name"):
        simulate("shared", scenario(V2), V2, engine=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("first_token", "first"),
        ("max_batched_tokens", 0),
        ("max_batched_tokens", 1.5),
        ("max_seqs", -1),
        ("max_seqs", True),
        ("kv", "virtual"),
        ("kv_block_tokens", 0),
        ("prefix_caching", "yes"),
        ("prefix_block_tokens", 0),
        ("name", ""),
    ],
)
def test_a_bad_knob_is_refused_naming_it_and_replace_revalidates(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(get_profile("vllm"), **{field: value})


def test_replace_gives_a_changed_frozen_profile():
    vllm = get_profile("vllm")
    smaller = dataclasses.replace(vllm, max_batched_tokens=256)
    assert smaller.max_batched_tokens == 256 and vllm.max_batched_tokens == 2048
    assert smaller.changed() == ("max_batched_tokens",)
    assert "changed: max_batched_tokens" in smaller.label()
    with pytest.raises(dataclasses.FrozenInstanceError):
        smaller.max_seqs = 1  # type: ignore[misc]
    assert hash(smaller) != hash(vllm)


def test_the_sequence_cap_never_exceeds_the_token_budget():
    vllm = get_profile("vllm")
    assert vllm.seq_cap == 256
    assert dataclasses.replace(vllm, max_batched_tokens=128).seq_cap == 128
    assert get_profile("sglang").seq_cap == 8192  # no max_seqs: each row is a token
    assert LAB.seq_cap is None


def test_the_flags_are_in_each_engines_own_terms():
    assert engine_flags(get_profile("vllm")) == {
        "--max-num-batched-tokens": 2048,
        "--max-num-seqs": 256,
    }
    assert flags_text(get_profile("vllm")) == "--max-num-batched-tokens 2048 --max-num-seqs 256"
    assert engine_flags(get_profile("llama.cpp")) == {"-b": 2048, "-np": 4}
    assert engine_flags(get_profile("transformers")) == {"--cb-max-batch-tokens": 8192}
    assert engine_flags(get_profile("sglang")) == {"--chunked-prefill-size": 8192}
    assert engine_flags(LAB) == {} and engine_flags(get_profile("distserve")) == {}
    # a vLLM token budget below its sequence cap is typed as vLLM accepts it
    assert engine_flags(dataclasses.replace(get_profile("vllm"), max_batched_tokens=128)) == {
        "--max-num-batched-tokens": 128,
        "--max-num-seqs": 128,
    }


def test_the_label_names_the_profile_and_its_first_token_rule():
    assert LAB.label() == (
        "engine lab: first token after a decode step; no token budget; no sequence cap"
    )
    assert get_profile("vllm").label() == (
        "engine vllm: first token from the prefill; 2048 tokens an iteration; at most 256 requests"
    )


def test_citations_name_known_knobs():
    assert {knob for p in PROFILES.values() for knob, _ in p.citations} <= set(KNOBS)
    with pytest.raises(ValueError, match="citations"):
        EngineProfile("mine", citations=(("speed", "fast"),))


def test_lab_is_the_default_and_leaves_every_number_unchanged():
    load = scenario(V2)
    assert simulate("chunked", load, V2, chunk=128) == simulate(
        "chunked", load, V2, chunk=128, engine="lab"
    )
    assert simulate("shared", load, V2).engine is LAB


def test_a_profile_object_or_its_name_run_the_same():
    load = scenario(V2)
    by_name = simulate("chunked", load, V2, engine="vllm")
    by_value = simulate("chunked", load, V2, engine=get_profile("vllm"))
    assert by_name == by_value and by_name.engine.name == "vllm"


def test_what_paged_kv_does_not_simulate_yet_is_refused_naming_it():
    paged = get_profile("vllm")
    free = simulate("disaggregated", scenario(V2), V2, engine=paged)  # the reservation rule
    reserve = dataclasses.replace(paged, kv="reserve", prefix_caching=False)
    same = simulate("disaggregated", scenario(V2), V2, engine=reserve)
    assert list(free.steps()) == list(same.steps())
    with pytest.raises(ValueError, match="chunk_budget is not simulated under kv='paged'"):
        simulate("chunked", scenario(V2), V2, chunk_budget=0.05, engine=paged)
    reserve = dataclasses.replace(paged, kv="reserve", prefix_caching=True)
    with pytest.raises(ValueError, match="prefix_caching=True needs kv='paged'"):
        simulate("shared", scenario(V2), V2, engine=reserve)


def test_chunked_under_a_token_budget_needs_no_chunk():
    trace = simulate("chunked", scenario(V2), V2, engine="vllm")
    assert max(e.prefill_tokens + e.decode_rows for e in trace.events) <= 2048
    with pytest.raises(ValueError, match="chunk"):
        simulate("chunked", scenario(V2), V2)


def test_a_profile_keeps_the_engines_kv_defaults_in_its_sources():
    vllm = get_profile("vllm").sources
    assert "-> 16 on CUDA" in vllm["kv_block_tokens"] and "RECOMPUTE" in vllm["kv"]
    assert "enable_prefix_caching" in vllm["prefix_caching"]
    assert "not simulated yet" in get_profile("sglang").sources["kv"]
    assert math.isinf(V2.kv_capacity_tokens)  # the cost model, not the profile, bounds KV
