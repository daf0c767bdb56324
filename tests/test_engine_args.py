"""``--engine NAME`` on the commands that simulate: checked when the command line is parsed (a
usage error naming the option and the allowed profiles), the profile and its first-token rule
in every header, and capacity's default (vllm) said."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_errors import usage_error

from pytest_prefill.cli import main
from pytest_prefill.sim import PROFILES, get_profile

pytestmark = pytest.mark.sim

CAPACITY = ["capacity", "--slo", "ttft:2s,tpot:100ms", "--num-prompts", "30", "--workers", "1"]


def test_an_unknown_engine_is_a_usage_error_listing_the_profiles(capsys):
    line = usage_error([*CAPACITY, "--engine", "tgi"], capsys)
    assert "--engine" in line and "'tgi'" in line
    assert all(name in line for name in PROFILES)


def test_a_split_for_an_engine_without_one_is_refused_before_any_work(capsys):
    argv = [*CAPACITY, "--devices", "2", "--engine", "llama.cpp"]
    line = usage_error([*argv, "--deployment", "disaggregated:1:1"], capsys)
    assert "llama.cpp" in line and "runs no prefill:decode split" in line


def test_capacity_defaults_to_vllm_says_so_and_prints_the_flags(capsys):
    assert main([*CAPACITY, "--devices", "2", "--no-devices-needed"]) == 0
    out = capsys.readouterr().out
    vllm = get_profile("vllm")
    engine = next(line for line in out.splitlines() if line.startswith("Engine: "))
    assert vllm.label().removeprefix("engine ") in engine and "default" in engine
    typed = next(line for line in out.splitlines() if "Type: " in line)
    assert "vllm serve MODEL --max-num-batched-tokens" in typed and "--max-num-seqs" in typed
    assert "shared ×2" not in out  # vLLM has no unchunked mode: its deployments are budgets


def test_capacity_under_the_lab_keeps_the_labs_deployments(capsys):
    assert main([*CAPACITY, "--engine", "lab", "--no-devices-needed"]) == 0
    out = capsys.readouterr().out
    assert get_profile("lab").label().removeprefix("engine ") in out
    assert "shared ×1" in out and "Type: " not in out and "default" not in out.split("SLO:")[0]


@pytest.mark.parametrize("command", [["simulate"], ["timeline", "--text"], CAPACITY])
def test_every_simulating_command_checks_its_engine_at_parse_time(command, capsys):
    line = usage_error([*command, "--engine", "nonesuch"], capsys)
    assert "--engine" in line and "allowed: " + ", ".join(PROFILES) in line


def test_simulate_names_the_profile_above_the_policy_table_and_under_the_metrics(tmp_path, capsys):
    out_json = tmp_path / "sweep.json"
    argv = ["simulate", "--engine", "vllm", "--workload", "poisson", "--num-prompts", "20"]
    assert main([*argv, "--slo", "ttft:1s", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    label = get_profile("vllm").label().removeprefix("engine ")
    assert f"Engine: {label}" in out
    assert out.index(f"Engine: {label}") < out.index("policy ")
    assert "Simulated under engine vllm (first token from the prefill)." in out
    document = json.loads(out_json.read_text())
    assert document["engine"]["name"] == "vllm" and document["engine"]["first_token"] == "prefill"
    rows = document["rows"]
    assert all(r["serving_metrics"]["engine"] == "vllm" for r in rows)
    assert all(r["serving_metrics"]["first_token"] == "prefill" for r in rows)


def test_simulate_defaults_to_the_lab_and_says_so(capsys):
    assert main(["simulate"]) == 0
    out = capsys.readouterr().out
    assert f"Engine: {get_profile('lab').label().removeprefix('engine ')}" in out
    assert "Simulated under engine lab (first token after a decode step)." in out


def test_simulate_runs_a_workload_under_vllm_by_default_as_capacity_does(capsys):
    """Only the lab scenario keeps the lab's loop; a workload runs under the engine capacity and
    the plugin default to, and the header says it is the default."""
    assert main(["simulate", "--workload", "poisson", "--num-prompts", "20"]) == 0
    out = capsys.readouterr().out
    engine_line = next(line for line in out.splitlines() if line.startswith("Engine: "))
    assert engine_line.startswith(f"Engine: {get_profile('vllm').label().removeprefix('engine ')}")
    assert "this command's default" in engine_line
    assert "Simulated under engine vllm (first token from the prefill)." in out


def test_each_recommendation_says_which_question_it_answers(capsys):
    """simulate's C* rule and capacity's ranking answer different questions and say so."""
    from pytest_prefill.plan.advice import CAPACITY_QUESTION, RULE_QUESTION

    assert main(["simulate"]) == 0
    out = capsys.readouterr().out
    assert out.index("Prefer ") < out.index(RULE_QUESTION) < out.index("policy ")
    argv = ["capacity", "--slo", "ttft:2s,tpot:100ms", "--num-prompts", "20", "--workers", "1"]
    assert main([*argv, "--no-devices-needed"]) == 0
    out = capsys.readouterr().out
    assert CAPACITY_QUESTION in out and RULE_QUESTION not in out


def test_the_timeline_title_names_the_profile(capsys):
    assert main(["timeline", "--text", "--engine", "llama.cpp", "--width", "200"]) == 0
    out = capsys.readouterr().out
    assert f"Engine: {get_profile('llama.cpp').label().removeprefix('engine ')}" in out


# --- --prefix-caching on|off (issue 18) -------------------------------------------------------

MOONCAKE = str(Path(__file__).parent / "data" / "mooncake-shaped.jsonl")


def test_prefix_caching_on_runs_a_traces_hash_ids_and_shows_the_hit_rate(tmp_path, capsys):
    out_json = tmp_path / "sweep.json"
    argv = ["simulate", "--engine", "vllm", "--prefix-caching", "on", "--workload", MOONCAKE]
    assert main([*argv, "--chunk", "512", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "kept as prefix blocks of 512 tokens" in out
    from pytest_prefill.commands._engine_args import with_prefix_caching

    expected = with_prefix_caching(get_profile("vllm"), True, 512)
    assert f"Engine: {expected.label().removeprefix('engine ')}" in out
    header = next(line for line in out.splitlines() if line.startswith("policy "))
    assert "hit rate" in header and "preempted" in header
    rows = json.loads(out_json.read_text())["rows"]
    assert rows and all(r["serving_metrics"]["hit_rate"] > 0 for r in rows)
    for r in rows:
        metrics = r["serving_metrics"]
        assert metrics["hit_rate"] == metrics["cached_tokens"] / metrics["total_input_tokens"]
    assert "no disaggregated row" in out or any(r["policy"] == "disaggregated" for r in rows)


def test_prefix_caching_off_computes_every_prompt_token(tmp_path, capsys):
    out_json = tmp_path / "sweep.json"
    argv = ["simulate", "--engine", "vllm", "--prefix-caching", "off", "--workload", MOONCAKE]
    assert main([*argv, "--chunk", "512", "--json", str(out_json)]) == 0
    rows = json.loads(out_json.read_text())["rows"]
    assert all(r["serving_metrics"]["cached_tokens"] == 0 for r in rows)
    assert "hit rate" not in capsys.readouterr().out.split("Serving metrics")[0]


def test_capacity_with_prefix_caching_puts_the_hit_rate_in_its_table(capsys):
    argv = ["capacity", "--engine", "vllm", "--prefix-caching", "on", "--workload", MOONCAKE]
    argv += ["--slo", "ttft:2s,tpot:100ms", "--deployment", "chunked", "--workers", "1"]
    assert main([*argv, "--no-devices-needed", "--tolerance", "0.3"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("deployment "))
    assert header.split()[-2:] == ["rate", "preempted"]


CACHED_SPLIT = [
    (["timeline", "--text", "--engine", "vllm", "--prefix-caching", "on"], "disaggregated"),
    (
        [*CAPACITY, "--devices", "2", "--prefix-caching", "on", "--no-devices-needed"]
        + ["--deployment", "disaggregated:1:1", "--tolerance", "0.5"],
        "--deployment disaggregated 1P:1D",
    ),
]


@pytest.mark.parametrize(("argv", "words"), CACHED_SPLIT)
def test_a_split_with_the_cache_on_runs_or_is_refused_at_parse_time_as_the_simulator_says(
    argv, words, capsys
):
    import dataclasses

    from pytest_prefill.plan.engine_commands import refusal

    cached = dataclasses.replace(get_profile("vllm"), kv="paged", prefix_caching=True)
    reason = refusal("disaggregated", cached)
    if reason is None:
        assert main(argv) == 0
    else:
        line = usage_error(argv, capsys)
        assert words in line and reason[:40] in line


def test_a_bad_prefix_caching_value_is_a_usage_error(capsys):
    assert "invalid choice: 'maybe'" in usage_error(
        ["simulate", "--prefix-caching", "maybe"], capsys
    )


def test_the_gate_says_when_the_baseline_ran_another_engine(tmp_path, capsys):
    base = tmp_path / "base.json"
    argv = [*CAPACITY, "--deployment", "shared", "--no-devices-needed"]
    assert main([*argv, "--engine", "lab", "--json", str(base)]) == 0
    capsys.readouterr()
    assert main([*argv, "--engine", "lab", "--baseline", str(base)]) == 0
    assert "engine differs" not in capsys.readouterr().out
    assert main([*argv, "--engine", "vllm", "--baseline", str(base)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "engine differs" in x)
    assert get_profile("lab").label() in line and get_profile("vllm").label() in line
    old = json.loads(base.read_text())
    del old["engine"]  # a search written before the engine profiles ran the lab's loop
    base.write_text(json.dumps(old))
    assert main([*argv, "--engine", "lab", "--baseline", str(base)]) == 0
    assert "engine differs" not in capsys.readouterr().out


@pytest.mark.parametrize("name", list(PROFILES))
def test_the_header_says_how_the_profile_holds_kv_and_its_prefix_cache(name):
    from pytest_prefill.plan.sweep import engine_header

    profile = get_profile(name)
    header = engine_header(profile)
    assert header.startswith(f"Engine: {profile.label().removeprefix('engine ')}; KV ")
    paged = f"KV paged ({profile.kv_block_tokens}-token blocks)"
    assert (paged in header) == (profile.kv == "paged")
    assert ("KV reserved at admission" in header) == (profile.kv == "reserve")
    cache = f"prefix cache on ({profile.prefix_block_tokens}-token blocks)"
    assert (cache in header) == profile.prefix_caching
