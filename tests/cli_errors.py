"""What a bad command line gives, for the argument tests (tests/test_cli_args.py,
tests/test_engine_args.py)."""

from __future__ import annotations

import pytest

from pytest_prefill.cli import main


def usage_error(argv, capsys) -> str:
    """The one error line a bad command line gives (exit 2, nothing on stdout)."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    printed = capsys.readouterr()
    assert printed.out == "" and "Traceback" not in printed.err
    return printed.err.strip().splitlines()[-1]
