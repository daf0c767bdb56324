"""The request records and the run a verify document keeps (what ``bench --records`` writes, a
line each, and what ``verify --json`` keeps under each probe), each field broken one way at a
time: ``verify --rank`` reads the document back, or refuses it in one line naming the file and
the field, never a traceback. ``timeline --out`` writes drawings and traces the tool never
reads back; ``bench --records`` lines are read back only inside verify documents."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from pytest_prefill.cli import main
from pytest_prefill.measure.quiet import HostSteal
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.serve.load.records import BenchRun, ServerCounters, ServerRecord
from pytest_prefill.verify.knee import MeasuredKnee, Predicted, probe_of
from pytest_prefill.verify.probe_rule import FlagSet, ProbeRule
from pytest_prefill.verify.result import FlagSetResult, VerifyResult

SLO_USED = SLO(ttft=1.0)
BROKEN: dict[str, Any] = {
    "missing": None,  # the field removed
    "a string": "x",
    "a list": [1],
    "a list of strings": ["x"],
    "an object": {"a": 1},
    "nested": [[[1]]],
    "NaN": math.nan,
    "infinite": math.inf,
    "huge": 1e300,
    "huge integer": 10**30,
    "negative": -1,
    "fractional": 2.5,
    "true": True,
}


def _record(i: int) -> ServerRecord:
    start = 0.1 * i
    times = (start + 0.05, start + 0.07)
    return ServerRecord(f"r{i}", start, start, 16, 4, times, (2, 2), 16, 4, {"t": 1.0})


def _document() -> dict[str, Any]:
    counters = ServerCounters({"vllm:prompt_tokens_total": 1.0}, {"vllm:prompt_tokens_total": 9.0})
    run = BenchRun(
        tuple(_record(i) for i in range(3)),
        {"engine": "vllm"},
        {"rate": 5.0},
        "2026-01-02T03:04:05",
        server_counters=counters,
        host=HostSteal(0.001, 0.02),
    )
    probe = probe_of(run, SLO_USED, 1.0, 5.0, ("r0", "r1", "r2"))
    knee = MeasuredKnee((probe,), probe, None, 0.05)
    predicted = Predicted(5.0, "found", SLO_USED)
    result = FlagSetResult(FlagSet(16), predicted=predicted, measured=knee)
    return VerifyResult("w", SLO_USED, ProbeRule(), (result,), "vllm").to_dict()


PROBE = ("flag_sets", 0, "measured", "probes", 0)
# Objects broken field by field: a record, the run, its counters and host, the probe.
WHERE: tuple[tuple[Any, ...], ...] = (
    (*PROBE, "records", 1),
    (*PROBE, "run"),
    (*PROBE, "run", "server_counters"),
    (*PROBE, "run", "host"),
    PROBE,
)


def _inside(document: Any, where: tuple[Any, ...]) -> Any:
    for key in where:
        document = document[key]
    return document


def _cases() -> list[Any]:
    document = _document()
    return [
        pytest.param(where, field, value, id=f"{'.'.join(map(str, where))}.{field}-{how}")
        for where in WHERE
        for field in _inside(document, where)
        for how, value in BROKEN.items()
    ]


@pytest.mark.parametrize(("where", "field", "value"), _cases())
def test_a_record_broken_in_one_field_reads_or_is_refused_in_one_line(
    tmp_path, where, field, value, capsys
):
    document = _document()
    broken = _inside(document, where)
    if value is None:
        del broken[field]
    else:
        broken[field] = value
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(document))  # NaN and Infinity as Python's json writes them
    try:
        status = main(["verify", "--rank", str(path)])
    except SystemExit as exited:
        status = exited.code
        err = capsys.readouterr().err.strip()
        assert status == 2 and "\n" not in err and "Traceback" not in err, err
        assert str(path) in err and field in err, err  # names the file and the field
        return
    assert status in (0, 1)


def test_the_document_as_written_reads_back_whole(tmp_path, capsys):
    path = tmp_path / "verify.json"
    path.write_text(json.dumps(_document()))
    assert main(["verify", "--rank", str(path)]) in (0, 1)
    assert "Traceback" not in capsys.readouterr().err


def test_a_record_read_back_keeps_every_field():
    record = _record(2)
    assert ServerRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("chunk_tokens", [2], "as many"),  # one count for two chunk times
        ("chunk_times", [0.3, 0.25], "order"),  # a token before the one before it
        ("chunk_tokens", [0, 2], "at least 1"),
        ("arrival", -1.0, "at least 0"),
        ("prompt_len", 2.9, "an integer"),  # never truncated to 2
        ("output_tokens", "4", "an integer"),
        ("error", 5, "a string"),
        ("server_timings", [1], "an object"),
    ],
)
def test_a_record_that_cannot_be_is_refused_naming_the_field(field, value, words):
    data = _record(2).to_dict()
    data[field] = value
    with pytest.raises(ValueError, match=field) as refused:
        ServerRecord.from_dict(data, "records[2]")
    assert words in str(refused.value) and "records[2]" in str(refused.value)
