"""Issue 13's scheduler.py cases (fixed in core's rewrite): numbers that overflow a run are a
ValueError naming the problem, never a traceback or a trace with tokens missing."""

from __future__ import annotations

import json
import math

import pytest

from pytest_prefill.cli import main
from pytest_prefill.plan.workloads import lab_scenario
from pytest_prefill.scheduler import CostModel, Request, get_preset, simulate

pytestmark = pytest.mark.sim

POLICIES = ("shared", "coscheduled", "chunked", "disaggregated")


def huge(decode_step_base: float) -> CostModel:
    return CostModel(
        prefill_pass_overhead=0.01, prefill_per_token=1e-5, decode_step_base=decode_step_base
    )


def complete_or_refused(policy, load, cost):
    """Either a ValueError, or a trace in which every request got all its tokens, at finite,
    non-decreasing times."""
    try:
        trace = simulate(policy, load, cost, chunk=64)
    except ValueError:
        return
    for r in load:
        times = trace.requests[r.id].token_times
        assert len(times) == r.output_len, f"{policy}: {r.id} got {len(times)} of {r.output_len}"
        assert all(math.isfinite(t) for t in times) and list(times) == sorted(times)
    trace.summary()


@pytest.mark.parametrize("field", ["prefill_pass_overhead", "decode_step_base"])
def test_a_cost_of_400_digits_is_a_value_error_naming_the_field(field):
    fields = {"prefill_pass_overhead": 0.01, "prefill_per_token": 1e-5, "decode_step_base": 0.03}
    with pytest.raises(ValueError, match=field):
        CostModel(**{**fields, field: 10**400})


def test_an_arrival_of_400_digits_is_a_value_error_naming_the_field():
    with pytest.raises(ValueError, match="arrival"):
        Request("a", 10**400, 10, 3)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_decode_step_of_6e307_gives_every_token_or_an_error(policy):
    complete_or_refused(policy, [Request("a", 0.0, 10, 3)], huge(6e307))


@pytest.mark.parametrize("policy", POLICIES)
def test_a_decode_step_of_1e308_gives_every_token_or_an_error(policy):
    complete_or_refused(policy, lab_scenario(), huge(1e308))


def test_a_kv_transfer_that_overflows_is_a_value_error():
    with pytest.raises(ValueError, match="link_bandwidth"):
        cost = CostModel(
            prefill_pass_overhead=0.01,
            prefill_per_token=1e-5,
            decode_step_base=0.03,
            kv_bytes_per_token=1e300,
            link_bandwidth=1e-300,
        )
        simulate("disaggregated", [Request("a", 0.0, 10, 3)], cost)


@pytest.mark.parametrize("load", [None, 3, "abc"])
def test_a_load_that_is_no_sequence_of_requests_is_a_value_error(load):
    with pytest.raises(ValueError, match="load"):
        simulate("shared", load, get_preset("lab-laptop").cost)


@pytest.mark.parametrize("command", [["simulate"], ["timeline", "--text"]])
def test_the_commands_give_one_line_for_a_cost_that_overflows(command, tmp_path, capsys):
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(huge(1e308).to_dict()))
    with pytest.raises(SystemExit) as exit_info:
        main([*command, "--cost", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(err) == 1 and "float range" in err[0]
