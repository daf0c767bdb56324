"""``capacity --decode-cost SPEC``: the decode pool's own cost model for a disaggregated
deployment given with ``--cost`` (another TP's coefficients, another device's calibration),
``--cost`` then the prefill pool's and the KV link's; bad input in one line each."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from cli_errors import usage_error

from pytest_prefill.archive.cost_spec import resolve_cost
from pytest_prefill.cli import main
from pytest_prefill.report.assumptions import origin
from pytest_prefill.sim import get_preset

pytestmark = pytest.mark.sim

BASE = [
    "capacity",
    "--slo",
    "ttft:2s,tpot:100ms",
    "--num-prompts",
    "30",
    "--random-input-len",
    "256",
    "--random-output-len",
    "32",
    "--random-range-ratio",
    "0",
    "--workers",
    "1",
    "--tolerance",
    "0.2",
    "--no-devices-needed",
]
# each decode row adds 5 ms: TPOT passes 100 ms at about 18 rows (30 requests arrive)
FAST = dataclasses.replace(get_preset("datacenter-illustrative").cost, decode_per_seq=0.005)


def search(tmp_path: Path, *argv: str) -> dict:
    path, cost = tmp_path / "search.json", tmp_path / "cost.json"
    cost.write_text(json.dumps(FAST.to_dict()))
    assert main([*BASE, "--cost", str(cost), *argv, "--json", str(path)]) == 0
    return json.loads(path.read_text())


def test_the_decode_pool_runs_on_its_own_cost_and_a_slower_one_serves_less(tmp_path) -> None:
    slow = dataclasses.replace(FAST, decode_step_base=FAST.decode_step_base * 3)
    path = tmp_path / "decode.json"
    path.write_text(json.dumps(slow.to_dict()))
    split = ["--deployment", "disaggregated:1:1", "--devices", "2"]
    same = search(tmp_path, *split)["results"][0]
    own = search(tmp_path, *split, "--decode-cost", str(path))["results"][0]
    assert own["deployment"]["decode_cost"] == slow.to_dict()
    assert same["deployment"]["decode_cost"] is None
    assert same["status"] == own["status"] == "found"
    assert own["max_rate"] < same["max_rate"]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--deployment", "chunked:256"], "give a disaggregated:P:D --deployment"),
        ([], "give a disaggregated:P:D --deployment"),
        (["--deployment", "disaggregated:1:1", "--decode-cost", "nowhere.json"], "--decode-cost"),
        (["--deployment", "disaggregated:1:1", "--decode-cost", "measure"], "a preset or a cost"),
    ],
)
def test_bad_decode_cost_is_one_line(argv: list[str], words: str, capsys) -> None:
    given = argv if "--decode-cost" in argv else [*argv, "--decode-cost", "lab-laptop"]
    line = usage_error([*BASE, "--cost", "lab-laptop", "--devices", "2", *given], capsys)
    assert "--decode-cost" in line and words in line


def test_the_answer_names_the_cost_each_pool_ran_on(tmp_path, capsys) -> None:
    """The header and the Type: line's bracket say the prefill pool (and the KV link) ran on
    --cost's model and the decode pool on --decode-cost's; the --json's cost_source too. With
    no --decode-cost, neither names a decode pool's cost."""
    decode = resolve_cost("lab-laptop")
    split = ["--deployment", "disaggregated:1:1", "--devices", "2"]
    document = search(tmp_path, *split, "--decode-cost", "lab-laptop")
    prefill = resolve_cost(str(tmp_path / "cost.json"))  # the file search() gave as --cost
    text = capsys.readouterr().out
    header = text[text.index("Cost model: ") : text.index("\nWorkload: ")]
    assert header == (
        f"Cost model: prefill pool and the KV link (--cost): {prefill.source}\n"
        f"  decode pool (--decode-cost): {decode.source}"
    )
    assert (
        f"[prefill (--cost): {origin(prefill)}; decode (--decode-cost): {origin(decode)};" in text
    )
    assert document["cost_source"] == header.removeprefix("Cost model: ")
    alone = search(tmp_path, *split)
    text = capsys.readouterr().out
    assert "--decode-cost" not in text and "decode pool" not in alone["cost_source"]
