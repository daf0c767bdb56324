"""The falsifier's chunk honours its calibration: labelled "C* of ..." only when that C* is
determined (the per-token cost not refused, C* >= 1, the fit trusted); through the plugin, from
``--prefill-cost`` or the session's calibration, with their refusals and trust figures."""

from __future__ import annotations

import importlib.metadata
import json

import pytest

pytest.importorskip("numpy")

from pytest_prefill.lab.falsifier import FALLBACK_CHUNK, chunk_for  # noqa: E402
from pytest_prefill.plan.advice import MAX_TRUSTED_HELD_OUT, Trust, choose_chunk  # noqa: E402
from pytest_prefill.sim import CostModel  # noqa: E402

COST = CostModel(prefill_pass_overhead=2e-3, prefill_per_token=1e-5, decode_step_base=2e-2)
ENTRY_POINT = any(
    ep.value == "pytest_prefill.plugin" for ep in importlib.metadata.entry_points(group="pytest11")
)
PLUGIN = [] if ENTRY_POINT else ["-p", "pytest_prefill.plugin"]


def test_a_determined_c_star_is_labelled_as_c_star():
    chunk, source = chunk_for(COST, 4096, "the session's calibration", (), Trust(0.03, False))
    assert chunk == choose_chunk(COST, 4096).chunk == round(COST.chunk_star())
    assert source == "C* of the session's calibration"


def test_a_refused_per_token_cost_gives_the_fallback_never_labelled_c_star():
    chunk, source = chunk_for(COST, 4096, "the session's calibration", ("prefill_per_token",))
    assert chunk == FALLBACK_CHUNK
    assert "C* not determined" in source and "C* of" not in source


def test_an_untrusted_fit_is_not_labelled_c_star():
    untrusted = Trust(2 * MAX_TRUSTED_HELD_OUT, False)
    chunk, source = chunk_for(COST, 4096, "the session's calibration", (), untrusted)
    assert chunk == round(COST.chunk_star())  # the fit's figure, said to be a guess
    assert "not determined" in source and "not trusted" in source and "C* of" not in source


LABEL_TEST = """
from pytest_prefill.lab.falsifier import chunk_for
from pytest_prefill.plugin.fixtures import falsifier_cost


def test_label(request):
    given = falsifier_cost(request)
    chunk, source = chunk_for(given.cost, 2048, given.source, given.refused, given.trust)
    with open("label.txt", "w") as handle:
        handle.write(f"{chunk}|{source}")
"""

STUB = """
import pytest
import pytest_prefill.measure.calibrate as calibrate_module
from pytest_prefill.measure.calibration_document import Calibration
from pytest_prefill.measure.calibration_points import Refusal
from pytest_prefill.sim import CostModel


def stub_calibrate(loaded, **kwargs):
    cost = CostModel(prefill_pass_overhead=0.002, prefill_per_token=0.0, decode_step_base=0.02)
    refused = (Refusal("prefill_per_token", "within the noise", {}),)
    return Calibration(cost, {"device": "cpu", "model": "stub"}, (), {}, refused)


calibrate_module.calibrate = stub_calibrate


class _Dummy:
    config = None
    model = None


@pytest.fixture(scope="session")
def prefill_model():
    return _Dummy()
"""


@pytest.fixture(autouse=True)
def _not_inside_xdist(monkeypatch):
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_ADDOPTS"):
        monkeypatch.delenv(name, raising=False)


def _label(pytester, *args):
    pytester.makepyfile(test_label=LABEL_TEST)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *PLUGIN, *args)
    assert result.ret == 0, result.stdout.str()
    chunk, source = (pytester.path / "label.txt").read_text().split("|", 1)
    return int(chunk), source


def test_a_given_calibration_with_a_refused_per_token_cost_is_no_c_star(pytester):
    document = {
        "kind": "pytest-prefill/calibration",
        "schema_version": 2,
        "cost_model": {**COST.to_dict(), "prefill_per_token": 0.0},
        "provenance": {"device": "cpu"},
        "measurements": [],
        "fits": {},
        "refusals": [{"constant": "prefill_per_token", "reason": "noise", "numbers": {}}],
    }
    path = pytester.path / "calibration.json"
    path.write_text(json.dumps(document))
    chunk, source = _label(pytester, f"--prefill-cost={path}")
    assert chunk == FALLBACK_CHUNK and "C* not determined" in source and "C* of" not in source


def test_the_sessions_calibration_passes_its_refusals_to_the_falsifier(pytester):
    pytest.importorskip("torch")
    pytester.makeconftest(STUB)
    chunk, source = _label(pytester, "--prefill-device=cpu")
    assert chunk == FALLBACK_CHUNK
    assert "the session's calibration" in source and "C* of" not in source
