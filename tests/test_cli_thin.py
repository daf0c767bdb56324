"""The command line is thin (issue 47): a command's ``check`` turns the parsed flags into a
frozen value that ``run`` takes (cli.main hands it over), and leaves the flags as parsed: no
state rides on ``args`` from one helper to the next."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from pytest_prefill.cli import build_parser
from pytest_prefill.commands._args import LAB_DEFAULTS
from pytest_prefill.plan.compute.devices import device_named

MODEL = ["--model", "qwen3-0.6b"]
COMMAND_LINES = [
    ["capacity", "--slo", "ttft:1s"],
    ["capacity", "--slo", "ttft:1s", *MODEL, "--gpu", "h100", "--devices", "2"],
    ["capacity", "--slo", "ttft:1s", *MODEL, "--gpu", "h100,l40s", "--devices", "2"],
    ["capacity", "--slo", "ttft:1s", "--deployment", "disaggregated:1:1", "--devices", "2"],
    [
        "capacity",
        "--slo",
        "ttft:1s",
        "--deployment",
        "disaggregated:1:1",
        "--devices",
        "2",
        "--decode-cost",
        "datacenter-illustrative",
    ],
    ["simulate", "--workload", "poisson", *MODEL, "--device-memory", "80"],
    ["simulate", *MODEL, "--gpu", "h100"],
    ["timeline", "--text", *MODEL, "--device-memory", "24"],
]


def _parsed(argv: list[str]) -> argparse.Namespace:
    return build_parser(argv[0]).parse_args(argv)


@pytest.mark.parametrize("argv", COMMAND_LINES, ids=" ".join)
def test_check_leaves_the_flags_as_parsed_and_returns_a_frozen_value(argv):
    args = _parsed(argv)
    before = dict(vars(args))
    checked = args._check(args)
    after = dict(vars(args))
    # the lab scenario's flags take their defaults where not given: the parse step's only work
    filled = {name for name in LAB_DEFAULTS if before.get(name, 0) is None}
    assert {k: v for k, v in after.items() if k not in filled} == {
        k: v for k, v in before.items() if k not in filled
    }
    assert set(after) == set(before)  # nothing added to args for a later helper to read
    assert dataclasses.is_dataclass(checked)
    field = dataclasses.fields(checked)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(checked, field, None)


def test_the_checked_deployment_carries_what_the_flags_derive():
    """--gpu without --cost derives the compute on that device; the hardware sizes the KV cache
    from the device's memory; --max-model-len unset is the model's context."""
    args = _parsed(["simulate", *MODEL, "--gpu", "h100"])
    deploying = args._check(args)
    assert deploying.derive and deploying.cost is None
    assert deploying.gpu_device == device_named("h100")
    assert deploying.hardware.device_memory == deploying.gpu_device.memory_bytes
    assert deploying.max_model_len == deploying.hardware.model.max_position_embeddings
    assert deploying.max_model_len_origin == "qwen3-0.6b's context"


def test_a_search_across_kinds_spans_each_kinds_budget_and_leaves_devices_as_typed():
    """Across kinds a deployment may use every kind's budget, which bounds the search (no
    devices-needed search); ``--devices`` stays the budgets the user typed."""
    budgets = {"h100": 2, "l40s": 3}
    typed = ",".join(f"{kind}={n}" for kind, n in budgets.items())
    args = _parsed(
        ["capacity", "--slo", "ttft:1s", *MODEL, "--gpu", "h100,l40s", "--devices", typed]
    )
    question = args._check(args)
    assert question.devices == sum(budgets.values())
    assert not question.devices_needed
    assert question.kind_search.budget == {device_named(k).key: n for k, n in budgets.items()}
    assert args.devices == budgets
