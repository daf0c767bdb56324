"""Every document the tool writes and reads back, each top-level field broken one way at a time
(missing, of the wrong type, NaN, infinite, huge, negative): read back through the command
that reads it, the answer is the document read, or one line naming the file (exit 2, or 1
where the command says a server or a run failed), never a traceback.

Kinds read back: verify results (``verify --rank``), calibrations and bare cost models and
archived runs (``simulate --cost``), server calibrations (``verify --cost``), capacity answers
(``verify --answer``), the archive (``runs``). The tool writes records (``bench --records``)
and timeline outputs (``timeline --out``) but reads neither back."""

from __future__ import annotations

import datetime
import json
import math
from typing import Any

import pytest

from pytest_prefill.archive import saving
from pytest_prefill.cli import main
from pytest_prefill.measure.calibrate import Calibration
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.serve.calibration.calibration_fit import RequestOverhead
from pytest_prefill.serve.calibration.server_calibration import ServerCalibration, ServerSweep
from pytest_prefill.sim import CostModel
from pytest_prefill.verify.knee import Predicted
from pytest_prefill.verify.probe_rule import FlagSet, ProbeRule
from pytest_prefill.verify.result import FlagSetResult, VerifyResult

COST = CostModel(prefill_pass_overhead=0.029, prefill_per_token=5.5e-05, decode_step_base=0.035)
BROKEN: dict[str, Any] = {
    "missing": None,  # the field removed
    "a string": "x",
    "a list": [1],
    "an object": {"a": 1},
    "NaN": math.nan,
    "infinite": math.inf,
    "huge": 1e300,
    "negative": -1,
}
URL = ["--url", "http://127.0.0.1:9"]


def _calibration() -> Calibration:
    return Calibration(COST, {"device": "cpu"}, (), {}, ())


def _verify() -> dict[str, Any]:
    slo = SLO(ttft=1.0)
    result = FlagSetResult(FlagSet(16), predicted=Predicted(5.0, "found", slo))
    return VerifyResult("w", slo, ProbeRule(), (result,), "vllm").to_dict()


def _server_calibration() -> dict[str, Any]:
    overhead = RequestOverhead(0.0, 0.0, 0.0, "none")
    return ServerCalibration(_calibration(), overhead, (), ServerSweep(16)).to_dict()


def _answer() -> dict[str, Any]:
    deployment = {"policy": "chunked", "max_batched_tokens": 64, "max_seqs": 4}
    return {"slo": {"ttft": 1.0}, "target": 0.9, "results": [{"deployment": deployment}]}


SLO_FLAGS = ["--flags", "tokens=16", "--slo", "ttft:1s"]
# kind -> (a document as the tool writes it, the command line that reads it from PATH)
KINDS: dict[str, tuple[Any, list[str]]] = {
    "verify": (_verify(), ["verify", "--rank", "PATH"]),
    "calibration": (_calibration().to_dict(), ["simulate", "--cost", "PATH"]),
    "cost": (COST.to_dict(), ["simulate", "--cost", "PATH"]),
    "server calibration": (_server_calibration(), ["verify", *URL, "--cost", "PATH", *SLO_FLAGS]),
    "answer": (_answer(), ["verify", *URL, "--answer", "PATH"]),
}


# Objects inside a kind broken the same way, field by field: where each sits.
INNER: dict[str, tuple[tuple[Any, ...], ...]] = {
    "verify": (("flag_sets", 0), ("flag_sets", 0, "predicted")),
    "calibration": (("cost_model",),),
    "server calibration": (("server",), ("server", "sweep")),
    "answer": (("results", 0), ("results", 0, "deployment")),
}


def _broken(document: dict[str, Any]) -> list[tuple[str, str, Any]]:
    return [(field, how, value) for field in document for how, value in BROKEN.items()]


def _inside(document: Any, where: tuple[Any, ...]) -> Any:
    for key in where:
        document = document[key]
    return document


def _cases() -> list[Any]:
    cases = []
    for kind, (document, _) in KINDS.items():
        for where in ((), *INNER.get(kind, ())):
            named = ".".join(str(k) for k in (kind, *where))
            cases += [
                pytest.param(kind, where, field, how, value, id=f"{named}-{field}-{how}")
                for field, how, value in _broken(_inside(document, where))
            ]
    return cases


def _read_back(argv: list[str], path: str, capsys) -> None:
    """``argv`` run: it ends 0, or 1 or 2 with one line naming ``path``; never a traceback
    (an exception other than SystemExit fails the test by itself)."""
    try:
        status = main(argv)
    except ReadWhole:
        return
    except SystemExit as exited:
        status = exited.code
        err = capsys.readouterr().err.strip()
        assert status in (1, 2) and "\n" not in err and "Traceback" not in err, err
        if status == 2:
            assert path in err, err
        return
    assert status in (0, 1)


@pytest.mark.parametrize(("kind", "where", "field", "how", "value"), _cases())
def test_a_document_broken_in_one_field_reads_or_is_refused_in_one_line(
    tmp_path, monkeypatch, kind, where, field, how, value, capsys
):
    document, argv = KINDS[kind]
    whole = json.loads(json.dumps(document))  # a copy
    broken = _inside(whole, where)
    if how == "missing":
        del broken[field]
    else:
        broken[field] = value
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(whole))  # NaN and Infinity as Python's json writes them
    monkeypatch.setattr("pytest_prefill.commands.verify.verify", _no_server)
    _read_back([str(path) if a == "PATH" else a for a in argv], str(path), capsys)


class ReadWhole(Exception):
    """``verify`` read its inputs whole and would now start on a server (none is here)."""


def _no_server(*args: Any, **kwargs: Any) -> Any:
    raise ReadWhole


def _run_document() -> dict[str, Any]:
    return {"tables": [], "verdicts": [], "calibration": _calibration().to_dict()}


@pytest.mark.parametrize(
    ("field", "how", "value"),
    [pytest.param(*c, id=f"{c[0]}-{c[1]}") for c in _broken(_run_document())],
)
def test_an_archived_run_broken_in_one_field_is_listed_or_refused_in_one_line(
    tmp_path, field, how, value, capsys
):
    when = datetime.datetime(2026, 1, 2, 3, 4, 5)
    run = _run_document()
    path = saving.write_run(tmp_path, "cpu-test", run, commit="abcdef12", dirty=False, when=when)
    written = json.loads(path.read_text())
    if how == "missing":
        del written[field]
    else:
        written[field] = value
    path.write_text(json.dumps(written))
    _read_back(["runs", "cpu-test", "--results", str(tmp_path)], str(path), capsys)
    capsys.readouterr()
    _read_back(["simulate", "--cost", str(path)], str(path), capsys)
