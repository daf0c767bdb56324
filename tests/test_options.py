"""The options whose help states their default read it from the value they default to."""

from __future__ import annotations

import argparse
import dataclasses

from pytest_prefill.commands import verify as verify_command
from pytest_prefill.commands._args import positive_int
from pytest_prefill.commands._options import add_defaulted
from pytest_prefill.measure.quiet import QuietHost
from pytest_prefill.verify.probe_rule import ProbeRule


def _helps(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.option_strings[0]: a for a in parser._actions if a.option_strings}


def test_a_defaulted_option_states_the_default_it_takes() -> None:
    parser = argparse.ArgumentParser()
    add_defaulted(parser, "--rounds", positive_int, 7, "rounds (default {default})", "N")
    action = _helps(parser)["--rounds"]
    assert parser.parse_args([]).rounds == 7
    assert parser.parse_args(["--rounds", "3"]).rounds == 3
    assert action.help == "rounds (default 7)" and action.metavar == "N"


def test_verify_takes_its_rule_defaults_from_the_rules_and_states_them() -> None:
    parser = argparse.ArgumentParser()
    verify_command.add_arguments(parser)
    actions = _helps(parser)
    rule, host = ProbeRule(), QuietHost()
    for flag, field in verify_command._RULE_OPTIONS.items():
        owner = host if flag == "--max-steal" else rule
        default = getattr(owner, field[0])
        assert actions[flag].default == default, flag
        assert actions[flag].help is not None
        assert f"{default:g}" in actions[flag].help or f"{default:.2f}" in actions[flag].help
    assert {f.name for f in dataclasses.fields(ProbeRule)} >= {
        field for flag, (field, *_) in verify_command._RULE_OPTIONS.items() if flag != "--max-steal"
    }
