"""What a capacity answer tells a user to type: each engine's command line with the profile's
flags in its own terms, the split's flags, and the engines that run no split."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_prefill.plan.deployments import Deployment
from pytest_prefill.plan.engine_commands import (
    ENGINE_COMMANDS,
    MODEL,
    engine_command,
    launch_line,
    splits,
)
from pytest_prefill.sim import PROFILES, EngineProfile, get_profile

pytestmark = pytest.mark.sim


def test_every_profile_has_a_command_entry():
    assert set(PROFILES) <= set(ENGINE_COMMANDS)


def test_a_vllm_line_carries_its_budget_and_sequence_cap_as_flags():
    vllm = dataclasses.replace(get_profile("vllm"), max_batched_tokens=1024, max_seqs=128)
    line = launch_line(vllm, None, 4)
    assert line.startswith("vllm serve MODEL --max-num-batched-tokens 1024 --max-num-seqs 128")
    assert "× 4" in line


def test_a_vllm_split_names_each_side_and_its_count():
    line = launch_line(get_profile("vllm"), 3, 8)
    assert line.count("--max-num-batched-tokens 2048") == 2
    assert line.count("NixlConnector") == 2
    assert "(× 3, prefill)" in line and "(× 5, decode)" in line


def test_a_sequence_cap_is_typed_no_higher_than_the_budget():
    vllm = dataclasses.replace(get_profile("vllm"), max_batched_tokens=128, max_seqs=256)
    assert "--max-num-seqs 128" in launch_line(vllm, None, 1)


@pytest.mark.parametrize(
    ("name", "flags"),
    [
        ("llama.cpp", ["-b 2048", "-np 4"]),
        ("transformers", ["--cb-max-batch-tokens 8192"]),
        ("sglang", ["--chunked-prefill-size 8192"]),
    ],
)
def test_each_engine_is_started_with_its_own_flags(name, flags):
    profile = get_profile(name)
    line = launch_line(profile, None, 2)
    assert line.startswith(engine_command(profile).start or "")
    assert all(flag in line for flag in flags)


@pytest.mark.parametrize("name", ["llama.cpp", "transformers"])
def test_an_engine_without_a_split_refuses_one(name):
    profile = get_profile(name)
    assert not splits(profile)
    with pytest.raises(ValueError, match="runs no prefill:decode split"):
        launch_line(profile, 1, 2)


def test_an_engine_without_a_command_line_gets_a_sentence_naming_its_rule():
    for name in ("lab", "distserve"):
        profile = get_profile(name)
        line = launch_line(profile, 1, 4)
        assert "1 prefill + 3 decode" in line and profile.label() in line


def test_a_deployments_command_puts_its_settings_in_place_of_the_profiles():
    deployment = Deployment("chunked", 2, max_batched_tokens=512, max_seqs=64)
    line = deployment.command(get_profile("vllm"))
    assert "--max-num-batched-tokens 512 --max-num-seqs 64" in line
    own = Deployment("chunked", 2, max_batched_tokens=2048).command(get_profile("vllm"))
    assert "--max-num-seqs 256" in own  # the profile's cap, kept


def test_a_profile_of_another_name_has_no_command_line():
    mine = EngineProfile("mine", first_token="prefill", max_batched_tokens=1000)
    assert engine_command(mine).start is None and splits(mine)
    assert "mine" in launch_line(mine, None, 2)


def test_the_launch_settings_reach_every_line_a_deployment_types():
    """A colocated deployment's line and each pool's line of a split carry the settings: the
    memory fraction and the longest sequence as the engine's flags, the model in MODEL's
    place; without settings, the engine's defaults (no flags, MODEL)."""
    from pytest_prefill.plan.engine_commands import LaunchSettings
    from pytest_prefill.plan.pools import parse_pools
    from pytest_prefill.sim import PRESETS

    vllm, command = get_profile("vllm"), ENGINE_COMMANDS["vllm"]
    settings = LaunchSettings(memory_fraction=0.85, model="org/served", max_model_len=4096)
    split = parse_pools("disaggregated:1:2,p=h100,d=l40s")
    base = PRESETS["datacenter-illustrative"].cost
    pooled = Deployment.of_pools(split, *split.costs(lambda pool: base))
    for deployment in (Deployment("chunked", 2, max_batched_tokens=512, tp=2), pooled):
        lines = deployment.command(vllm, settings).splitlines()
        plain = deployment.command(vllm).splitlines()
        assert len(lines) == len(plain) == (2 if deployment.pools else 1)
        for line, bare in zip(lines, plain):
            assert f"{command.memory_flag} 0.85" in line and "org/served" in line
            assert f"{command.length_flag} 4096" in line and MODEL not in line
            assert command.memory_flag not in bare and command.length_flag not in bare
            assert MODEL in bare
