"""Cost files with valid but extreme numbers given to ``simulate --cost``: handled or refused
in one line, never an OverflowError or IndexError."""

from __future__ import annotations

import json

import pytest

from pytest_prefill.cli import main

BASE = {
    "prefill_pass_overhead": 0.029,
    "prefill_per_token": 5.5e-05,
    "decode_step_base": 0.035,
    "decode_per_seq": 0.0,
    "decode_per_kv_token": 0.0,
    "kv_bytes_per_token": 114688.0,
}


@pytest.mark.parametrize(
    "change",
    [
        {"prefill_per_token": 1e300},
        {"decode_step_base": 1.7e308},
        {"prefill_per_token": 5e-324},
        {"kv_capacity_tokens": 1},
    ],
)
def test_an_extreme_cost_is_handled_or_refused_in_one_line(tmp_path, change, capsys):
    path = tmp_path / "cost.json"
    path.write_text(json.dumps({**BASE, **change}))
    try:
        status = main(["simulate", "--cost", str(path)])
    except SystemExit as exited:
        status = exited.code
        err = capsys.readouterr().err.strip()
        assert status == 2 and "\n" not in err and err.startswith("prefill-bench simulate: error:")
    else:
        assert status == 0
