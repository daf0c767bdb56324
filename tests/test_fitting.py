"""The cost model v2 fit on synthetic data: points drawn from a known model with proportional
noise. It must recover the constants (within what the noise allows), refuse a term the noise
hides, fit a floor only where short prompts are flat, compute the held-out error as defined
(refit without each prompt length, predict it), and record refused constants as 0."""

from __future__ import annotations

import math
import random
import statistics

import pytest

pytest.importorskip("numpy")

from pytest_prefill.measure.calibration_fit import (  # noqa: E402
    fit_cost_model,
    fit_prefill,
    held_out,
)
from pytest_prefill.measure.calibration_points import Point, predict  # noqa: E402
from pytest_prefill.measure.fitting import fit_terms  # noqa: E402
from pytest_prefill.measure.line_fit import CLEARLY  # noqa: E402
from pytest_prefill.measure.timing import Measurement  # noqa: E402
from pytest_prefill.sim import CostModel  # noqa: E402

TRUE = CostModel(
    prefill_pass_overhead=1.2e-3,
    prefill_per_token=150e-6,
    prefill_per_pair=60e-9,
    decode_step_base=5e-3,
    decode_per_seq=1.5e-3,
    decode_per_kv_token=40e-9,
    fusion_penalty=0.3,
)
PROMPTS = (32, 64, 128, 256, 512, 1024, 2048, 4096)
CHUNKS = ((256, 2048), (1024, 2048), (256, 8192), (1024, 8192))
FUSED = tuple((t, c, r) for t in (32, 128, 512) for c in (0, 2048) for r in (1, 8))
NOISE = 0.02  # relative: timing noise is proportional to the time


def noisy(rng: random.Random, seconds: float, noise: float = NOISE) -> Measurement:
    return Measurement.from_samples([seconds * (1 + rng.gauss(0, noise)) for _ in range(7)])


def v2_points(cost: CostModel, seed: int = 0, noise: float = NOISE) -> list[Point]:
    rng = random.Random(seed)
    pts = [Point("prefill", t, noisy(rng, cost.prefill_pass(t), noise)) for t in PROMPTS]
    pts += [
        Point("chunk", t, noisy(rng, cost.prefill_pass(t, c), noise), context=c) for t, c in CHUNKS
    ]
    pts += [
        Point("decode_kv", k, noisy(rng, cost.decode_step(1, k), noise))
        for k in (128, 1024, 4096, 16384)
    ]
    pts += [
        Point("decode_batch", b, noisy(rng, cost.decode_step(b, 128 * b), noise), context=128)
        for b in (1, 2, 4, 8)
    ]
    pts += [
        Point(
            "fused",
            t,
            noisy(rng, cost.iteration(((t, c),), r, 512 * r), noise),
            context=c,
            rows=r,
            row_context=512,
        )
        for t, c, r in FUSED
    ]
    return pts


@pytest.mark.parametrize("seed", range(5))
def test_the_fit_recovers_a_known_v2_model_under_proportional_noise(seed):
    fit = fit_cost_model(v2_points(TRUE, seed), kv_bytes_per_token=6144)
    cost = fit.cost
    assert not fit.refusals, [r.reason for r in fit.refusals]
    for name in (
        "prefill_pass_overhead",
        "prefill_per_token",
        "prefill_per_pair",
        "decode_step_base",
        "decode_per_seq",
        "decode_per_kv_token",
        "fusion_penalty",
    ):
        stderr = next(f.stderrs[name] for f in fit.fits.values() if name in f.names)
        assert 0 < stderr < getattr(cost, name) / 2, name  # supported: more than 2 SE from 0
        assert getattr(cost, name) == pytest.approx(getattr(TRUE, name), rel=0.25), name
    assert cost.kv_bytes_per_token == 6144
    assert fit.floor.knee == 0 and fit.floor.value == 0
    # the fit predicts its own points within a few times the noise
    assert fit.in_sample_median < 2 * NOISE
    assert fit.held_out_median < 3 * NOISE


def test_exact_points_give_the_constants_exactly():
    fit = fit_cost_model(v2_points(TRUE, noise=0.0))
    for name in ("prefill_per_token", "prefill_per_pair", "decode_per_seq", "fusion_penalty"):
        assert getattr(fit.cost, name) == pytest.approx(getattr(TRUE, name), rel=1e-6)
    assert all(abs(p.error) < 1e-9 for p in fit.predictions)


def test_a_pair_term_the_noise_hides_is_refused_and_recorded_as_zero():
    # 20 ns per pair and only 2,048 tokens: attention is under 1% of the longest pass,
    # far below 3x a 5% scatter
    faint = CostModel(
        prefill_pass_overhead=1e-3,
        prefill_per_token=150e-6,
        prefill_per_pair=0.02e-9,
        decode_step_base=5e-3,
    )
    rng = random.Random(3)
    points = [Point("prefill", t, noisy(rng, faint.prefill_pass(t), 0.05)) for t in PROMPTS[:-1]]
    points.append(Point("decode_kv", 128, noisy(rng, faint.decode_step(1, 128), 0.05)))
    fit = fit_cost_model(points)
    refused = {r.constant: r for r in fit.refusals}
    assert fit.cost.prefill_per_pair == 0
    assert "prefill_per_pair" in refused
    numbers = refused["prefill_per_pair"].numbers
    assert (
        numbers["effect"] <= CLEARLY * numbers["scatter"]
        or numbers["estimate"] <= 0
        or (abs(numbers["estimate"]) <= 2 * numbers["stderr"])
    )
    assert fit.cost.prefill_per_token == pytest.approx(faint.prefill_per_token, rel=0.1)


def test_a_negative_estimate_is_refused_never_recorded():
    # a pass that costs less per token as prompts grow (impossible for a cost) -> refused
    points = [Point("prefill", t, noisy(random.Random(t), 0.05 - 5e-6 * t, 0.0)) for t in PROMPTS]
    points.append(Point("decode_kv", 64, noisy(random.Random(1), 5e-3, 0.0)))
    fit = fit_cost_model(points)
    assert fit.cost.prefill_per_token == 0 and fit.cost.prefill_per_pair == 0
    assert any("negative" in r.reason for r in fit.refusals)
    assert all(v >= 0 for v in fit.cost.to_dict().values() if isinstance(v, float))


def knee_points(floor: float, seed: int = 4) -> list[Point]:
    """GPU-shaped: flat (memory-bound) up to the knee, then linear plus attention."""
    rng = random.Random(seed)
    cost = CostModel(
        prefill_pass_overhead=2e-3, prefill_per_token=170e-6, prefill_per_pair=3e-9,
        decode_step_base=55e-3,
    )  # fmt: skip
    lengths = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
    points = [
        Point("prefill", t, noisy(rng, max(floor, cost.prefill_pass(t)), 0.01)) for t in lengths
    ]
    return [*points, Point("decode_kv", 128, noisy(rng, 55e-3, 0.01))]


def test_short_flat_prompts_get_a_named_floor_not_a_negative_overhead():
    fit = fit_cost_model(knee_points(60e-3))
    assert fit.floor.knee in (128, 256)  # the longest flat prompt (256 is just above the knee)
    assert fit.floor.value == pytest.approx(60e-3, rel=0.03)
    assert "flat" in fit.floor.reason
    assert fit.cost.prefill_pass_overhead >= 0
    assert fit.held_out_median < 0.05 and fit.in_sample_median < 0.03
    for p in fit.predictions:
        if p.point.kind == "prefill" and p.point.x <= fit.floor.knee:
            assert p.fitted == pytest.approx(fit.floor.value)


def test_no_floor_where_the_shortest_prompts_lie_on_the_terms():
    fit = fit_cost_model(v2_points(TRUE, 1))
    assert fit.floor.knee == 0 and "no floor" in fit.floor.reason
    assert fit.cost.prefill_floor == 0


def test_the_fitted_floor_is_the_cost_models_so_the_simulator_prices_short_prompts_by_it():
    fit = fit_cost_model(knee_points(60e-3))
    assert fit.cost.prefill_floor == fit.floor.value > 0
    for p in fit.predictions:
        if p.point.kind == "prefill":  # what the simulator computes is what the fit predicted
            assert fit.cost.prefill_pass(p.point.x) == pytest.approx(p.fitted)
    shortest = min(p.point.x for p in fit.predictions if p.point.kind == "prefill")
    assert fit.cost.prefill_pass(shortest) == fit.floor.value
    assert CostModel.from_dict(fit.cost.to_dict()) == fit.cost


def test_held_out_error_is_a_refit_without_each_prompt_length():
    points = v2_points(TRUE, 2)
    per_kv = TRUE.decode_per_kv_token
    held = held_out(points, per_kv)
    passes = [i for i, p in enumerate(points) if p.kind in ("prefill", "chunk")]
    assert sorted(held) == passes  # every prefill and chunk point is predicted once
    for length in (256, 4096):
        rest = [p for p in points if p.kind in ("prefill", "chunk") and p.x != length]
        terms, floor = fit_prefill(rest, per_kv)
        model = CostModel(
            prefill_pass_overhead=terms.values["prefill_pass_overhead"],
            prefill_per_token=terms.values["prefill_per_token"],
            prefill_per_pair=terms.values["prefill_per_pair"],
            decode_step_base=TRUE.decode_step_base,
            decode_per_kv_token=per_kv,
        )
        for i in passes:
            if points[i].x == length:
                assert held[i] == pytest.approx(predict(model, floor, points[i]), rel=1e-12)


def test_held_out_needs_three_prompt_lengths():
    points = [p for p in v2_points(TRUE) if p.kind == "decode_kv" or p.x in (256, 512)]
    points = [p for p in points if p.kind != "chunk"]
    assert held_out(points, 0.0) == {}


def test_fit_terms_weights_relative_errors():
    # y = 1 + x, with one point 10% off: the relative fit spreads the error in proportion
    xs = [1.0, 10.0, 100.0, 1000.0]
    ys = [2.0, 11.0, 101.0 * 1.1, 1001.0]
    fit = fit_terms({"a": [1.0] * 4, "b": xs}, ys)
    residuals = [(fit.predict({"a": 1.0, "b": x}) - y) / y for x, y in zip(xs, ys, strict=True)]
    # the relative residuals are what least squares made small: the small points are not
    # sacrificed to the large ones
    assert statistics.median(abs(r) for r in residuals) < 0.05


@pytest.mark.parametrize(
    ("columns", "ys", "match"),
    [
        ({}, [1.0], "at least one term"),
        ({"a": [1.0]}, [], "at least one"),
        ({"a": [1.0, 2.0]}, [1.0], "has 2 values"),
        ({"a": [-1.0]}, [1.0], ">= 0"),
        ({"a": [1.0]}, [0.0], "> 0"),
        ({"a": [1.0]}, [math.nan], "> 0"),
    ],
)
def test_fit_terms_rejects_bad_input(columns, ys, match):
    with pytest.raises(ValueError, match=match):
        fit_terms(columns, ys)


def test_prefill_curve_fits_bare_pairs_and_holds_each_length_out():
    from pytest_prefill.measure.calibration_fit import prefill_curve

    truth = CostModel(
        prefill_pass_overhead=3e-3, prefill_per_token=80e-6, prefill_per_pair=4e-9,
        decode_step_base=30e-3,
    )  # fmt: skip
    lengths = (256, 512, 1024, 2048, 4096, 8192)
    fit, floor, in_sample, held = prefill_curve(lengths, [truth.prefill_pass(t) for t in lengths])
    assert fit.values["prefill_per_pair"] == pytest.approx(4e-9, rel=1e-6)
    assert floor.knee == 0
    assert max(abs(e) for e in in_sample + held) < 1e-6
    with pytest.raises(ValueError, match="3 or more"):
        prefill_curve((256, 256, 512), (1.0, 1.0, 2.0))
