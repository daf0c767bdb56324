"""Calibration: fitting a cost model from points built by formula (recovered, refused when
flat or impossible), the C* block and the recommendation, the JSON round trip, and one real
calibration of the tiny preset (properties only: no timing is asserted)."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("numpy")

from pytest_prefill import calibrate as cal  # noqa: E402
from pytest_prefill.calibrate import (  # noqa: E402
    Calibration,
    Point,
    chunk_star_text,
    fit_cost_model,
    recommend,
)
from pytest_prefill.costs import cost_from_json  # noqa: E402
from pytest_prefill.scheduler import PRESETS, CostModel  # noqa: E402
from pytest_prefill.timing import Measurement  # noqa: E402

TRUE = CostModel(
    prefill_pass_overhead=29e-3,
    prefill_per_token=55e-6,
    decode_step_base=35e-3,
    decode_per_seq=0.5e-3,
    decode_per_kv_token=2e-9,
    kv_bytes_per_token=114688,
)


def exact(seconds: float) -> Measurement:
    """Five identical samples: a measurement with no scatter."""
    return Measurement.from_samples([seconds] * 5, warmup=1)


def points_from(cost: CostModel, *, context: int = 128) -> list[Point]:
    prefill = [Point("prefill", t, exact(cost.prefill_pass(t))) for t in (256, 512, 1024, 2048)]
    kv = [Point("decode_kv", k, exact(cost.decode_step(1, k))) for k in (128, 1024, 4096, 16384)]
    batch = [
        Point("decode_batch", b, exact(cost.decode_step(b, b * context)), context=context)
        for b in (1, 2, 4, 8)
    ]
    return prefill + kv + batch


def test_fit_recovers_a_cost_model_from_its_own_predictions():
    cost, fits, refusals = fit_cost_model(points_from(TRUE), kv_bytes_per_token=114688)
    assert refusals == []
    for name in (
        "prefill_pass_overhead",
        "prefill_per_token",
        "decode_step_base",
        "decode_per_seq",
        "decode_per_kv_token",
    ):
        assert getattr(cost, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name
    assert cost.kv_bytes_per_token == 114688
    assert set(fits) == {"prefill", "decode_kv", "decode_batch"}


def test_a_flat_decode_refuses_the_per_kv_cost_and_records_zero():
    flat = CostModel(prefill_pass_overhead=29e-3, prefill_per_token=55e-6, decode_step_base=35e-3)
    points = [p for p in points_from(flat) if p.kind != "decode_kv"]
    # the lab's finding: flat within noise from 128 to 16,384 cached tokens
    points += [
        Point("decode_kv", k, Measurement.from_samples([35e-3 + d, 35.5e-3 + d, 36e-3 + d]))
        for k, d in ((128, 0.0), (1024, 0.2e-3), (4096, -0.1e-3), (16384, 0.1e-3))
    ]
    cost, _, refusals = fit_cost_model(points)
    refused = {r.constant: r for r in refusals}
    assert cost.decode_per_kv_token == 0
    assert "flat within noise" in refused["decode_per_kv_token"].reason
    assert refused["decode_per_kv_token"].numbers["effect"] >= 0
    medians = [p.measurement.median for p in points if p.kind == "decode_kv"]
    assert cost.decode_step_base == pytest.approx(sum(medians) / len(medians))


def test_a_negative_intercept_refuses_the_pass_overhead():
    # prefill proportional to tokens minus a constant: the overhead would be negative
    points = [Point("prefill", t, exact(60e-6 * t - 5e-3)) for t in (256, 512, 1024, 2048)]
    points.append(Point("decode_kv", 128, exact(20e-3)))
    cost, _, refusals = fit_cost_model(points)
    refused = {r.constant: r for r in refusals}
    assert cost.prefill_pass_overhead == 0
    assert "negative" in refused["prefill_pass_overhead"].reason
    xs = [256, 512, 1024, 2048]
    through_origin = sum(x * (60e-6 * x - 5e-3) for x in xs) / sum(x * x for x in xs)
    assert cost.prefill_per_token == pytest.approx(through_origin)
    assert "not measured" in refused["decode_per_seq"].reason
    assert "one cache length" in refused["decode_per_kv_token"].reason


def test_refused_constants_are_zero_and_never_negative():
    falling = CostModel(prefill_pass_overhead=1e-3, prefill_per_token=1e-6, decode_step_base=5e-3)
    points = [p for p in points_from(falling) if p.kind != "decode_batch"]
    points += [Point("decode_batch", b, exact(9e-3 - 1e-3 * b), context=128) for b in (1, 2, 4)]
    cost, _, refusals = fit_cost_model(points)
    assert cost.decode_per_seq == 0
    assert any(r.constant == "decode_per_seq" and "negative" in r.reason for r in refusals)
    assert all(v >= 0 for v in cost.to_dict().values() if isinstance(v, float))


def test_fit_needs_prefill_lengths_and_a_decode_point():
    with pytest.raises(ValueError, match="prefill"):
        fit_cost_model([Point("decode_kv", 128, exact(1e-3))])
    with pytest.raises(ValueError, match="decode"):
        fit_cost_model([Point("prefill", t, exact(t * 1e-6)) for t in (1, 2)])


def test_chunk_star_block_has_exactly_the_issue_shape_for_the_lab_laptop():
    assert chunk_star_text(PRESETS["lab-laptop"].cost) == (
        "C* = (decode_step - pass_overhead) / prefill_per_token\n"
        "   = (35.73 - 29.03) ms / 55.2 us\n"
        "   = 121 tokens\n"
        "\n"
        "pass overhead is 81% of one decode step\n"
        "-> chunking has almost no room here. Prefer DISAGGREGATION."
    )


def costs(overhead: float, per_token: float, decode: float) -> CostModel:
    return CostModel(
        prefill_pass_overhead=overhead, prefill_per_token=per_token, decode_step_base=decode
    )


@pytest.mark.parametrize(
    ("cost", "policy", "words"),
    [
        (costs(40e-3, 50e-6, 35e-3), "disaggregated", "C* <= 0"),
        (costs(35e-3, 50e-6, 35e-3), "disaggregated", "C* <= 0"),
        (costs(20e-3, 10e-6, 35e-3), "disaggregated", "almost no room"),
        (costs(1e-3, 1e-3, 10e-3), "disaggregated", "under 16 tokens"),
        (costs(1e-3, 10e-6, 10e-3), "chunked", "chunk ~ 900 tokens"),
        (costs(1e-3, 0.0, 10e-3), "chunked", "any chunk"),
    ],
)
def test_recommendation_follows_its_documented_thresholds(cost, policy, words):
    advice = recommend(cost)
    assert advice.policy == policy
    assert words in advice.line and str(advice) == advice.line
    assert advice.overhead_fraction == pytest.approx(
        cost.prefill_pass_overhead / cost.decode_step_base
    )
    if policy == "chunked" and math.isfinite(advice.chunk_star):
        assert advice.chunk == round(cost.chunk_star())
    block = chunk_star_text(cost)
    assert block.endswith(advice.line)
    if advice.chunk_star <= 0:
        assert "C* <= 0" in block


def calibration_of(cost: CostModel) -> Calibration:
    fitted, fits, refusals = fit_cost_model(points_from(cost))
    provenance = {
        "device": "cpu",
        "model": "formula",
        "dtype": "float32",
        "repeats": 5,
        "warmup": 1,
        "dry_run": False,
        "date": "2025-01-01T00:00:00+00:00",
    }
    return Calibration(fitted, provenance, tuple(points_from(cost)), fits, tuple(refusals))


def test_calibration_round_trips_through_json():
    calibration = calibration_of(TRUE)
    document = json.loads(json.dumps(calibration.to_dict(), allow_nan=False))
    assert document["kind"] == "pytest-prefill/calibration" and document["schema_version"] == 1
    again = Calibration.from_dict(document)
    assert again.cost == calibration.cost
    assert again.measurements == calibration.measurements
    assert again.fits == calibration.fits
    assert cost_from_json(document, "test") == calibration.cost


@pytest.mark.parametrize(
    "mangle",
    [
        lambda d: {**d, "kind": "something-else"},
        lambda d: {**d, "schema_version": 2},
        lambda d: {k: v for k, v in d.items() if k != "measurements"},
        lambda d: {**d, "cost_model": {**d["cost_model"], "decode_step_base": -1}},
        lambda d: {**d, "measurements": [{"kind": "prefill", "x": 0, "measurement": {}}]},
        lambda d: {**d, "refusals": [7]},
        lambda d: [d],
    ],
)
def test_foreign_or_corrupt_calibrations_are_refused(mangle):
    with pytest.raises(ValueError, match="calibration|cost model|decode_step_base"):
        Calibration.from_dict(mangle(calibration_of(TRUE).to_dict()))


def test_tables_and_report_show_every_section():
    calibration = calibration_of(TRUE)
    tables = calibration.tables()
    assert set(tables) == {"provenance", "prefill", "kv", "batch", "constants"}
    assert "16,384" in tables["kv"] and "decode_per_kv_token" in tables["constants"]
    report = calibration.report()
    assert report.endswith(calibration.chunk_star_text())
    assert "No constant refused." in report


@pytest.mark.parametrize(
    ("repeats", "warmup", "dry_run", "expected"),
    [
        (None, None, False, (cal.DEFAULT_REPEATS, cal.DEFAULT_WARMUP)),
        (None, None, True, (cal.DRY_RUN_REPEATS, cal.DRY_RUN_WARMUP)),
        (2, 0, True, (2, 0)),
        (50, 9, True, (cal.DRY_RUN_REPEATS, cal.DRY_RUN_WARMUP)),
    ],
)
def test_dry_run_caps_repeats_and_warmup(repeats, warmup, dry_run, expected):
    assert cal.effective_repeats(repeats, warmup, dry_run) == expected


@pytest.fixture
def one_thread(one_torch_thread):
    return None


def test_calibrating_tiny_gives_a_valid_cost_model_with_provenance(one_thread):
    from pytest_prefill.models import load_model

    loaded = load_model("tiny", device="cpu")
    lines: list[str] = []
    calibration = cal.calibrate(
        loaded,
        repeats=2,
        warmup=0,
        prompt_lens=(16, 32, 48, 64),
        cache_lens=(16, 256, 10**9),
        batch_sizes=(1, 2),
        batch_context=16,
        progress=lines.append,
    )
    cost = calibration.cost
    assert isinstance(cost, CostModel) and cost.decode_step_base > 0
    assert cost.kv_bytes_per_token == loaded.kv_bytes_per_token
    info = calibration.provenance
    for key in (
        "device",
        "device_name",
        "model",
        "dtype",
        "torch",
        "transformers",
        "repeats",
        "warmup",
        "date",
        "dry_run",
    ):
        assert key in info, key
    assert (info["model"], info["dtype"], info["repeats"], info["warmup"]) == (
        "tiny",
        "float32",
        2,
        0,
    )
    # the cache sweep is capped at the model's context, leaving room for the decoded token
    assert [p.x for p in calibration.points("decode_kv")] == [16, 256, loaded.max_context - 1]
    assert len(calibration.measurements) == 4 + 3 + 2 == len(lines) - 1
    for refusal in calibration.refusals:
        if refusal.constant != "decode_step_base":
            assert getattr(cost, refusal.constant) == 0
    assert Calibration.from_dict(json.loads(json.dumps(calibration.to_dict()))).cost == cost


def test_calibrate_rejects_too_few_prompt_lengths():
    pytest.importorskip("torch")
    from pytest_prefill.models import load_model

    with pytest.raises(ValueError, match="4 or more"):
        cal.calibrate(load_model("tiny", device="cpu"), prompt_lens=(16, 32, 32, 64))


def test_a_refused_per_token_cost_leaves_the_recommendation_undetermined():
    cost = costs(40e-3, 0.0, 35e-3)
    assert recommend(cost).policy == "disaggregated"
    advice = recommend(cost, {"prefill_per_token"})
    assert advice.policy == "undetermined" and advice.chunk is None
    assert chunk_star_text(cost, {"prefill_per_token"}).endswith(advice.line)
    # a calibration applies its own refusals
    flat_prefill = [Point("prefill", t, exact(30e-3)) for t in (256, 512, 1024, 2048)]
    points = flat_prefill + [Point("decode_kv", 128, exact(35e-3))]
    fitted, fits, refusals = fit_cost_model(points)
    calibration = Calibration(fitted, {}, tuple(points), fits, tuple(refusals))
    assert "prefill_per_token" in calibration.refused()
    assert calibration.recommendation().policy == "undetermined"
    assert "no recommendation" in calibration.chunk_star_text()
