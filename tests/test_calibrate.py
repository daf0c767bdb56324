"""Calibration: the sweep (defaults by device, the per-point budget), the KV capacity (CUDA via
a fake device), the JSON round trip (schema 2, and schema 1 still read), the printed report
(held-out error, C* by context, the recommendation), and calibrations of a fake runner on a
fake CUDA device and of the real tiny preset (properties only: no timing is asserted)."""

from __future__ import annotations

import json
import math
import types

import pytest

pytest.importorskip("numpy")

from pytest_prefill.measure import calibrate as cal  # noqa: E402
from pytest_prefill.measure import sweep as sweeps  # noqa: E402
from pytest_prefill.measure.calibration_document import Calibration  # noqa: E402
from pytest_prefill.measure.calibration_points import Point  # noqa: E402
from pytest_prefill.measure.timing import Measurement  # noqa: E402
from pytest_prefill.plan.advice import (  # noqa: E402
    MIN_USEFUL_CHUNK,
    TYPICAL_PROMPT,
    FittedCost,
    recommend,
)
from pytest_prefill.plan.cost_document import cost_from_json  # noqa: E402
from pytest_prefill.report.calibration import calibration_report, calibration_tables  # noqa: E402
from pytest_prefill.sim import CostModel  # noqa: E402

TRUE = CostModel(
    prefill_pass_overhead=1.2e-3,
    prefill_per_token=150e-6,
    prefill_per_pair=60e-9,
    decode_step_base=5e-3,
    decode_per_seq=1.5e-3,
    decode_per_kv_token=40e-9,
    fusion_penalty=0.3,
    kv_bytes_per_token=6144,
)


def exact(seconds: float) -> Measurement:
    """Five identical samples: a measurement with no scatter."""
    return Measurement.from_samples([seconds] * 5, warmup=1)


class FormulaRunner:
    """Times every operation by ``cost``'s formulas (no clock): what a calibration of a
    machine that is exactly the cost model would measure. Records what it was asked."""

    name = "formula runner"

    def __init__(self, cost: CostModel) -> None:
        self.cost = cost
        self.asked: list[tuple] = []

    def time_prefill(self, tokens, *, repeats, warmup):
        self.asked.append(("prefill", tokens))
        return exact(self.cost.prefill_pass(tokens))

    def time_chunk(self, tokens, context, *, repeats, warmup):
        self.asked.append(("chunk", tokens, context))
        return exact(self.cost.prefill_pass(tokens, context))

    def time_decode(self, cache_lengths, *, repeats, warmup):
        self.asked.append(("decode", tuple(cache_lengths)))
        return exact(self.cost.decode_step(len(cache_lengths), sum(cache_lengths)))

    def time_fused(self, tokens, context, cache_lengths, *, repeats, warmup):
        self.asked.append(("fused", tokens, context, len(cache_lengths)))
        rows, kv = len(cache_lengths), sum(cache_lengths)
        return exact(self.cost.iteration(((tokens, context),), rows, kv))


def fake_loaded(device: str = "cpu", max_context: int = 40960) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        name="formula",
        source="a cost model's formulas",
        device=types.SimpleNamespace(type=device.split(":")[0], __str__=lambda self: device),
        dtype_name="float32",
        config=types.SimpleNamespace(_attn_implementation="sdpa"),
        kv_bytes_per_token=TRUE.kv_bytes_per_token,
        max_context=max_context,
    )


@pytest.fixture
def formula_calibration(monkeypatch) -> Calibration:
    pytest.importorskip("torch")  # provenance records the library versions
    monkeypatch.setattr(cal, "device_name", lambda device: "a fake device")
    return cal.calibrate(
        fake_loaded(), runner=FormulaRunner(TRUE), repeats=5, warmup=1, probe=False
    )


def test_a_machine_that_is_the_cost_model_calibrates_to_it(formula_calibration):
    cost = formula_calibration.cost
    for name in (
        "prefill_pass_overhead",
        "prefill_per_token",
        "prefill_per_pair",
        "decode_step_base",
        "decode_per_seq",
        "decode_per_kv_token",
        "fusion_penalty",
    ):
        assert getattr(cost, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name
    assert formula_calibration.refusals == ()
    assert formula_calibration.held_out_median < 1e-6
    assert math.isinf(cost.kv_capacity_tokens)  # CPU: none recorded
    assert "not recorded on CPU" in formula_calibration.provenance["kv_capacity"]


def test_the_default_sweep_measures_curvature_chunks_and_fused_passes(formula_calibration):
    kinds = {p.kind for p in formula_calibration.measurements}
    assert kinds == {"prefill", "chunk", "decode_kv", "decode_batch", "fused"}
    assert [p.x for p in formula_calibration.points("prefill")] == list(sweeps.CPU_PROMPT_LENS)
    chunks = {(p.x, p.context) for p in formula_calibration.points("chunk")}
    assert chunks == set(sweeps.DEFAULT_CHUNKS)
    assert {256, 1024} <= {x for x, _ in chunks} and {2048, 8192} <= {c for _, c in chunks}


def test_plan_sweep_defaults_by_device_and_caps_at_the_context():
    cpu = sweeps.plan_sweep(fake_loaded("cpu"))
    cuda = sweeps.plan_sweep(fake_loaded("cuda:0"))
    assert cpu.prompt_lens == sweeps.CPU_PROMPT_LENS
    assert cuda.prompt_lens == sweeps.CUDA_PROMPT_LENS and max(cuda.prompt_lens) >= 8192
    short = sweeps.plan_sweep(fake_loaded("cuda", max_context=4096))
    assert max(short.prompt_lens) == 4096
    assert all(t + c <= 4095 for t, c in short.chunks)  # 8k contexts do not fit: dropped
    assert max(short.cache_lens) == 4095
    with pytest.raises(ValueError, match="4 or more"):
        sweeps.plan_sweep(fake_loaded(), prompt_lens=(16, 32, 32, 64))
    with pytest.raises(ValueError, match="chunks"):
        sweeps.plan_sweep(fake_loaded(), chunks=((256,),))
    with pytest.raises(ValueError, match="budget"):
        sweeps.plan_sweep(fake_loaded(), budget=0)


def test_a_point_over_the_budget_is_skipped_and_recorded(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setattr(cal, "device_name", lambda device: "a fake device")
    slow = CostModel(prefill_pass_overhead=0.01, prefill_per_token=1e-3, decode_step_base=0.02)
    runner = FormulaRunner(slow)
    calibration = cal.calibrate(
        fake_loaded(), runner=runner, repeats=3, warmup=1, probe=False, budget=20.0, fused=()
    )
    # 4 calls per point: a pass is kept while the budget predicts <= 5 s per call
    kept = [p.x for p in calibration.points("prefill")]
    assert kept and max(kept) < 4096
    assert all(4 * sweeps.Budget(20.0, 4).predict(t) <= 20.0 for t in kept[1:])
    skipped = calibration.provenance["skipped"]
    assert skipped and all("budget" in s for s in skipped)
    assert ("prefill", 4096) not in runner.asked


def test_kv_capacity_on_a_fake_cuda_device_follows_the_formula():
    gib = 2**30
    cuda = types.SimpleNamespace(type="cuda")
    tokens, note = cal.device_kv_tokens(cuda, 114688, memory=lambda: (100 * gib, 140 * gib))
    expected = math.floor((100 * gib - cal.KV_HEADROOM_FRACTION * 140 * gib) / 114688)
    assert tokens == expected
    assert "headroom" in note and "GiB" in note
    full, why = cal.device_kv_tokens(cuda, 114688, memory=lambda: (1 * gib, 140 * gib))
    assert math.isinf(full) and "no room" in why
    cpu, why = cal.device_kv_tokens(types.SimpleNamespace(type="cpu"), 114688)
    assert math.isinf(cpu) and "CPU" in why


def test_a_fake_cuda_calibration_records_the_kv_capacity(monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setattr(cal, "device_name", lambda device: "a fake H200")
    gib = 2**30
    calibration = cal.calibrate(
        fake_loaded("cuda"),
        runner=FormulaRunner(TRUE),
        repeats=3,
        warmup=1,
        probe=False,
        memory=lambda: (120 * gib, 140 * gib),
        chunks=(),
        fused=(),
    )
    capacity = calibration.cost.kv_capacity_tokens
    assert capacity == math.floor((120 * gib - 0.1 * 140 * gib) / TRUE.kv_bytes_per_token)
    assert calibration.provenance["device_name"] == "a fake H200"
    assert Calibration.from_dict(json.loads(json.dumps(calibration.to_dict()))).cost == (
        calibration.cost
    )
    assert "fusion_penalty" in calibration.refused()  # no fused passes asked for


def test_the_calibration_round_trips_through_json(formula_calibration):
    document = json.loads(json.dumps(formula_calibration.to_dict(), allow_nan=False))
    assert document["kind"] == "pytest-prefill/calibration" and document["schema_version"] == 2
    again = Calibration.from_dict(document)
    assert again.cost == formula_calibration.cost
    assert again.measurements == formula_calibration.measurements
    assert again.fits == formula_calibration.fits
    assert again.predictions == formula_calibration.predictions
    assert again.floor == formula_calibration.floor
    assert cost_from_json(document, "test") == formula_calibration.cost
    assert document["held_out_median_error"] == pytest.approx(0.0, abs=1e-6)
    assert set(document["chunk_star_by_context"]) == {"0", "2048", "8192", "32768"}


def test_a_schema_1_calibration_still_loads_with_its_cost_model():
    old = {
        "kind": "pytest-prefill/calibration",
        "schema_version": 1,
        "cost_model": {
            "prefill_pass_overhead": 0.029,
            "prefill_per_token": 5.5e-5,
            "decode_step_base": 0.035,
        },
        "provenance": {"device": "cpu"},
        "measurements": [
            {"kind": "prefill", "x": 256, "context": 0, "measurement": exact(0.04).to_dict()}
        ],
        "fits": {"prefill": {"slope": 5.5e-5}},
        "refusals": [{"constant": "decode_per_seq", "reason": "not measured", "numbers": {}}],
    }
    calibration = Calibration.from_dict(old)
    assert calibration.cost.prefill_per_pair == 0 and calibration.fits == {}
    assert calibration.refused() == {"decode_per_seq"}


@pytest.mark.parametrize(
    "mangle",
    [
        lambda d: {**d, "kind": "something-else"},
        lambda d: {**d, "schema_version": 3},
        lambda d: {k: v for k, v in d.items() if k != "measurements"},
        lambda d: {**d, "cost_model": {**d["cost_model"], "decode_step_base": -1}},
        lambda d: {**d, "measurements": [{"kind": "prefill", "x": 0, "measurement": {}}]},
        lambda d: {**d, "refusals": [7]},
        lambda d: {**d, "fits": {"prefill": {"names": ["a"]}}},
        lambda d: [d],
    ],
)
def test_foreign_or_corrupt_calibrations_are_refused(formula_calibration, mangle):
    with pytest.raises(ValueError, match="calibration|cost model|decode_step_base"):
        Calibration.from_dict(mangle(formula_calibration.to_dict()))


@pytest.mark.parametrize(
    "point",
    [
        lambda: Point("nonsense", 1, exact(1.0)),
        lambda: Point("prefill", 0, exact(1.0)),
        lambda: Point("chunk", 256, exact(1.0), context=-1),
        lambda: Point("fused", 256, exact(1.0), rows=0),
    ],
)
def test_bad_points_are_refused_by_field(point):
    with pytest.raises(ValueError, match="point"):
        point()


def test_the_report_shows_every_section_and_the_held_out_error(formula_calibration):
    tables = calibration_tables(formula_calibration)
    assert set(tables) == {"provenance", "prefill", "kv", "batch", "fused", "constants"}
    for name in ("prefill_per_pair", "fusion_penalty", "kv_capacity_tokens", "prefill floor"):
        assert name in tables["constants"]
    report = calibration_report(formula_calibration)
    assert "Held-out error" in report and "held out ms" in report
    assert "C* by context" in report
    assert report.endswith(formula_calibration.chunk_star_text())
    assert "No constant refused." in report


def test_c_star_by_context_falls_and_drives_the_recommendation(formula_calibration):
    cost = formula_calibration.cost
    stars = [cost.chunk_star(context=c) for c in formula_calibration.contexts]
    assert stars == sorted(stars, reverse=True) and stars[0] == cost.chunk_star()
    advice = formula_calibration.recommendation()
    typical = cost.chunk_star(context=TYPICAL_PROMPT)
    if typical >= MIN_USEFUL_CHUNK and advice.policy == "chunked":
        assert advice.chunk == round(typical)
    # the chunk that rides free at 32k context is tiny here: the plain warning says so
    assert any("DISAGGREGATION wins" in w for w in advice.warnings)
    assert any("fusion_penalty" in w for w in advice.warnings)


def test_the_recommendation_uses_c_star_at_a_typical_prompt():
    roomy = CostModel(
        prefill_pass_overhead=1e-3,
        prefill_per_token=10e-6,
        prefill_per_pair=0.5e-9,
        decode_step_base=20e-3,
    )
    advice = recommend(FittedCost(roomy))
    assert advice.policy == "chunked"
    assert advice.chunk == round(roomy.chunk_star(context=TYPICAL_PROMPT))
    assert advice.chunk < round(roomy.chunk_star())  # later chunks attend to more context
    assert "typical" in advice.line


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
    from pytest_prefill.measure.models import load_model

    loaded = load_model("tiny", device="cpu")
    lines: list[str] = []
    from pytest_prefill.lab.packed import calibration_runner

    calibration = cal.calibrate(
        loaded,
        runner=calibration_runner(loaded),
        repeats=2,
        warmup=0,
        prompt_lens=(16, 32, 48, 64),
        chunks=((16, 32),),
        cache_lens=(16, 256, 10**9),
        batch_sizes=(1, 2),
        batch_context=16,
        fused=((8, 16, 2),),
        progress=lines.append,
        probe=False,
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
    assert len(calibration.measurements) == 4 + 1 + 3 + 2 + 1
    assert calibration.provenance["runner"] == "engine packed pass"  # the default for Qwen3
    assert len(lines) >= len(calibration.measurements) + 1
    for refusal in calibration.refusals:
        # refused constants are 0, except the documented stand-ins a model needs
        # (a decode step and a prefill pass must take time), which say what they used
        expected = refusal.numbers.get("used", 0)
        assert getattr(cost, refusal.constant) == pytest.approx(expected), refusal.reason
    assert Calibration.from_dict(json.loads(json.dumps(calibration.to_dict()))).cost == cost


def test_calibrate_rejects_too_few_prompt_lengths():
    pytest.importorskip("torch")
    from pytest_prefill.measure.models import load_model

    with pytest.raises(ValueError, match="4 or more"):
        cal.calibrate(load_model("tiny", device="cpu"), prompt_lens=(16, 32, 32, 64))


def test_a_refused_per_token_cost_leaves_the_recommendation_undetermined():
    flat_prefill = [Point("prefill", t, exact(30e-3)) for t in (256, 512, 1024, 2048)]
    points = flat_prefill + [Point("decode_kv", 128, exact(35e-3))]
    fit = cal.fit_cost_model(points)
    calibration = Calibration.from_fit(fit, {}, points)
    assert "prefill_per_token" in calibration.refused()
    assert calibration.recommendation().policy == "undetermined"
    assert "no recommendation" in calibration.chunk_star_text()
