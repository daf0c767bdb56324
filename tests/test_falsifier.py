"""The falsifier: the claim is emitted before any measurement, the run ends with HOLDS or FAILS
against it, and the verdict rule and chunk choice follow their definitions."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("numpy")

from pytest_prefill.lab.falsifier import (  # noqa: E402
    CLAIM,
    FALLBACK_CHUNK,
    VERDICTS,
    chunk_from_cost,
    verdict,
)
from pytest_prefill.measure.timing import Measurement  # noqa: E402
from pytest_prefill.report.falsifier import stall_table, stall_table_of  # noqa: E402
from pytest_prefill.sim import PRESETS, CostModel  # noqa: E402


def test_the_claim_is_designs_sentence():
    assert CLAIM == (
        "If chunked prefill's worst decode gap is not below the shared worker's, chunking does "
        "not help on this hardware and the central claim is wrong here."
    )


def m(*samples: float) -> Measurement:
    return Measurement.from_samples(samples)


def test_verdict_holds_only_when_chunked_is_clearly_below_shared():
    assert verdict(m(0.20, 0.21, 0.22), m(0.05, 0.06, 0.07))[0] == "HOLDS"
    # chunked slower: fails
    assert verdict(m(0.05, 0.06, 0.07), m(0.20, 0.21, 0.22))[0] == "FAILS"
    # median lower, but the spreads overlap: not clearly below, fails
    assert verdict(m(0.10, 0.20, 0.30), m(0.05, 0.19, 0.29))[0] == "FAILS"
    outcome, line = verdict(m(0.05, 0.06, 0.07), m(0.20, 0.21, 0.22))
    assert line.startswith("FAILS") and "central claim is wrong here" in line


def test_chunk_comes_from_c_star_within_the_prompt():
    lab = PRESETS["lab-laptop"].cost
    assert chunk_from_cost(lab, 2048) == round(lab.chunk_star()) == 121
    assert chunk_from_cost(lab, 100) == 100
    negative = CostModel(prefill_pass_overhead=0.05, prefill_per_token=1e-5, decode_step_base=0.01)
    assert chunk_from_cost(negative, 2048) == FALLBACK_CHUNK
    free = CostModel(prefill_pass_overhead=0.001, prefill_per_token=0.0, decode_step_base=0.01)
    assert chunk_from_cost(free, 512) == 512


def test_stall_table_ratios_are_against_the_baseline():
    table = stall_table(
        m(0.01, 0.01, 0.01), m(0.05, 0.05, 0.05), m(0.02, 0.02, 0.02), prompt_len=2048, chunk=121
    )
    assert "BASELINE" in table and "1.00x" in table and "5.00x" in table and "2.00x" in table
    assert "2,048-token prefill" in table and "121-token chunk" in table


@pytest.fixture(scope="module")
def tiny(one_torch_thread):
    from pytest_prefill.measure.models import load_model

    return load_model("tiny", device="cpu")


def test_claim_first_then_tables_then_a_verdict(tiny, monkeypatch):
    from pytest_prefill.measure import sweep as sweeps
    from pytest_prefill.measure.runner import ModelRunner
    from pytest_prefill.report.falsifier import run_falsifier

    monkeypatch.setattr(sweeps, "CPU_PROMPT_LENS", (16, 32, 48, 64))
    monkeypatch.setattr(sweeps, "DEFAULT_CHUNKS", ((16, 32),))
    monkeypatch.setattr(sweeps, "DEFAULT_FUSED", ((8, 16, 2),))
    monkeypatch.setattr(sweeps, "DEFAULT_CACHE_LENS", (16, 64))
    log: list[tuple[str, str]] = []
    real_measure = ModelRunner.measure

    def spy(self, fn, **kwargs):
        log.append(("measure", ""))
        return real_measure(self, fn, **kwargs)

    monkeypatch.setattr(ModelRunner, "measure", spy)
    result = run_falsifier(
        tiny, prompt_len=64, repeats=2, warmup=0, emit=lambda text: log.append(("emit", text))
    )
    assert log[0] == ("emit", f"Falsifier: {CLAIM}")
    assert any(kind == "measure" for kind, _ in log)
    emitted = [text for kind, text in log if kind == "emit"]
    assert emitted[-1].startswith(("HOLDS", "FAILS"))
    assert result.verdict in VERDICTS and emitted[-1] == result.verdict_line
    from pytest_prefill.report.calibration import kv_table

    shown = "\n".join(emitted)
    assert stall_table_of(result) in shown and kv_table(list(result.kv_points)) in shown
    assert "upper bound on one fused iteration" in "\n".join(emitted)
    assert "C* = " in "\n".join(emitted)  # the quick calibration's derivation
    assert 1 <= result.chunk <= 64 and "quick calibration" in result.chunk_source
    # the quick calibration times the packed pass, as every other calibration does
    assert result.calibration.provenance["runner"] == "engine packed pass"
    document = json.loads(json.dumps(result.to_dict(), allow_nan=False))
    assert document["kind"] == "pytest-prefill/falsifier" and document["claim"] == CLAIM
    assert set(document["gaps"]) == {"baseline", "shared", "chunked"}
    assert document["calibration"]["kind"] == "pytest-prefill/calibration"


def test_dry_run_cuts_repeats_never_the_prompt(tiny, monkeypatch):
    from pytest_prefill.measure import calibrate as cal
    from pytest_prefill.measure import sweep as sweeps
    from pytest_prefill.report.falsifier import run_falsifier

    monkeypatch.setattr(sweeps, "DEFAULT_CACHE_LENS", (16,))
    result = run_falsifier(
        tiny, prompt_len=48, chunk=16, repeats=50, warmup=9, dry_run=True, emit=lambda text: None
    )
    assert result.prompt_len == 48 and result.chunk == 16 and result.chunk_source == "given"
    assert result.shared.repeats == cal.DRY_RUN_REPEATS
    assert result.provenance["dry_run"] is True and result.calibration is None


def test_a_given_cost_sets_the_chunk(tiny, monkeypatch):
    from pytest_prefill.measure import sweep as sweeps
    from pytest_prefill.report.falsifier import run_falsifier

    monkeypatch.setattr(sweeps, "DEFAULT_CACHE_LENS", (16,))
    result = run_falsifier(
        tiny,
        prompt_len=256,
        cost=PRESETS["lab-laptop"].cost,
        repeats=1,
        warmup=0,
        emit=lambda text: None,
    )
    assert result.chunk == 121 and "given cost" in result.chunk_source


@pytest.mark.parametrize(
    "kwargs",
    [
        {"prompt_len": 0},
        {"prompt_len": 10**9},
        {"chunk": 0},
        {"chunk": -4},
        {"repeats": 0},
        {"warmup": -1},
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(tiny, kwargs):
    from pytest_prefill.report.falsifier import run_falsifier

    emitted: list[str] = []
    with pytest.raises(ValueError):
        run_falsifier(tiny, **{"prompt_len": 32, **kwargs}, emit=emitted.append)
    assert emitted == []


def test_an_unusable_c_star_falls_back_to_the_smallest_useful_chunk(tiny, monkeypatch):
    from pytest_prefill.measure import sweep as sweeps
    from pytest_prefill.report.falsifier import run_falsifier

    monkeypatch.setattr(sweeps, "DEFAULT_CACHE_LENS", (16,))
    negative = CostModel(prefill_pass_overhead=0.05, prefill_per_token=1e-5, decode_step_base=0.01)
    result = run_falsifier(
        tiny, prompt_len=64, cost=negative, repeats=1, warmup=0, emit=lambda text: None
    )
    assert result.chunk == FALLBACK_CHUNK
    assert result.chunk_source.startswith("fallback") and "given cost" in result.chunk_source
