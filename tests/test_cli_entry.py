"""The ``prefill-bench`` program's exit (cli.entry)."""

from __future__ import annotations

import pytest

import pytest_prefill.cli as cli


class Exited(Exception):
    pass


def _hard_exit(status: int) -> None:
    raise Exited(status)


@pytest.mark.parametrize("status", [0, 1, 2])
def test_a_finished_command_exits_with_its_status_through_the_interpreter(monkeypatch, status):
    monkeypatch.setattr(cli, "main", lambda: status)
    monkeypatch.setattr(cli.os, "_exit", _hard_exit)
    with pytest.raises(SystemExit) as exit_:
        cli.entry()
    assert exit_.value.code == status


def test_an_interrupted_command_leaves_at_once_with_130(monkeypatch):
    monkeypatch.setattr(cli, "main", lambda: cli.INTERRUPTED)
    monkeypatch.setattr(cli.os, "_exit", _hard_exit)
    with pytest.raises(Exited) as exit_:  # not SystemExit: the exit hooks are skipped
        cli.entry()
    assert exit_.value.args == (130,)
