"""The CPU's efficiencies fitted on calibrations of some model sizes: a calibration's points read
as samples, the physics priced at the model's widths, a fit that reproduces passes its own
terms generated, and a transfer that predicts a model left out of the fit."""

from __future__ import annotations

import dataclasses
import math

import pytest

from pytest_prefill.plan.compute.cpu import (
    COMPUTE_BOUNDS,
    DECODE_CALLS,
    FRACTIONS,
    GEMM_T0,
    KEY_BLOCK,
    MASK_FLOAT,
    MASK_READ,
    MASK_WRITTEN,
    POSITIVES,
    PREFILL_CALLS,
    SCORE_BYTES,
    CpuTerms,
    HostCost,
    Sample,
    causal_scores,
    device_for,
    diagonal_seconds,
    fit_cpu,
    linear_device,
    mask_positions,
    mask_seconds,
    predict,
    samples_of,
    score_seconds,
    scored_positions,
    transfers,
)
from pytest_prefill.plan.compute.devices import Device
from pytest_prefill.plan.compute.physics import Physics
from pytest_prefill.plan.cost_document import CALIBRATION_KIND
from pytest_prefill.plan.model_spec import load_model_spec

CPU = Device(
    key="cpu",
    name="a test CPU",
    architecture="cpu",
    peak_flops={"fp32": 80e9, "bf16": 1e9},
    memory_bandwidth=20e9,
    memory_bytes=16 * 2**30,
    link_bandwidth=20e9,
    link_latency=0.0,
    source="figures for a test",
)
# The efficiencies are fractions of HEADROOM times the probe's figures: these are 0.3, 0.7 and
# 0.9 of the probed GEMM rate, half its stream rate, and so on; a matrix-vector sweep at half its
# bandwidth 300 values wide; 5 us a torch call, 2 us a page.
TRUE = CpuTerms((0.075, 0.175, 0.225), 0.125, 0.15, 0.05, 0.0, 40.0, 300.0, HostCost(5e-6), 2e-6)


def _model(name):
    return dataclasses.replace(load_model_spec(name), dtype="float32")


def _passes(name, terms=TRUE):
    """A calibration's worth of passes of preset ``name``, timed by ``terms`` themselves."""
    model = _model(name)
    shapes = [("prefill", ((n, 0),), 0, 0) for n in (32, 128, 512, 2048)]
    shapes += [("prefill", ((256, c),), 0, 0) for c in (2048, 8192)]
    shapes += [("decode", (), 1, kv) for kv in (128, 4096, 16384)]
    shapes += [("decode", (), rows, rows * 128) for rows in (2, 4, 8)]
    out = []
    for kind, pieces, rows, kv in shapes:
        stub = Sample(model, kind, 1.0, f"{name} {kind}", pieces=pieces, rows=rows, kv_tokens=kv)
        out.append(dataclasses.replace(stub, seconds=predict(CPU, terms, stub)))
    return out


def _document(model="tiny", points=None):
    def point(kind, x, context=0, rows=0, median=0.01, low=0.008):
        return {
            "kind": kind,
            "x": x,
            "context": context,
            "rows": rows,
            "row_context": 0,
            "measurement": {"median": median, "min": low},
        }

    return {
        "kind": CALIBRATION_KIND,
        "provenance": {"model": model, "dtype": "float32"},
        "measurements": points
        if points is not None
        else [
            point("prefill", 128),
            point("chunk", 256, context=2048),
            point("decode_kv", 1024, rows=0),
            point("decode_kv", 1024, rows=3),
            point("decode_batch", 4, context=128),
            point("fused", 32, context=0, rows=2),
        ],
    }


def test_a_calibration_reads_as_prefill_and_decode_samples():
    samples = samples_of(_document())
    assert [s.kind for s in samples] == ["prefill", "prefill", "decode", "decode", "decode"]
    prefill, chunk, one, three, batch = samples
    assert prefill.pieces == ((128, 0),) and chunk.pieces == ((256, 2048),)
    assert (one.rows, one.kv_tokens) == (1, 1024)
    assert (three.rows, three.kv_tokens) == (3, 3 * 1024)
    assert (batch.rows, batch.kv_tokens) == (4, 4 * 128)
    assert all(s.model.dtype == "float32" and s.model.name == "tiny" for s in samples)
    assert {s.seconds for s in samples} == {0.01}
    assert {s.seconds for s in samples_of(_document(), "min")} == {0.008}


@pytest.mark.parametrize(
    ("document", "statistic", "words"),
    [
        (_document(), "mean", "statistic must be one of median, min"),
        ({"kind": "something else"}, "median", "not a pytest-prefill calibration"),
        (_document(model="no-such-model"), "median", "no-such-model"),
        (_document(points=[{"kind": "prefill"}]), "median", "malformed measurement"),
    ],
)
def test_bad_documents_are_refused_in_one_line(document, statistic, words):
    with pytest.raises(ValueError, match=words) as info:
        samples_of(document, statistic)
    assert "\n" not in str(info.value)


def test_the_linear_peak_is_the_dtype_the_model_ran_in():
    assert linear_device(CPU, "float32").peak("bf16") == CPU.peak("fp32")
    assert linear_device(CPU, "bfloat16").peak("bf16") == CPU.peak("bf16")


def test_a_narrow_model_reaches_less_of_the_peaks_than_a_wide_one():
    tiny, small = (TRUE.efficiency(CPU, _model(n)) for n in ("tiny", "small"))
    for m in (1, 100, 10_000):
        assert tiny.compute_efficiency(m) < small.compute_efficiency(m) < 1
    hidden = _model("small").hidden_size
    assert small.compute_efficiency(100) == pytest.approx(0.175 * hidden / (hidden + 40.0))


def test_on_one_core_a_gemms_memory_and_compute_time_add():
    table = TRUE.efficiency(CPU, _model("small"))
    compute, memory = 2e-3, 3e-3
    flops = compute * table.compute_efficiency(512) * 80e9
    moved = memory * table.memory_efficiency * 20e9
    seconds = table.gemm_seconds(512, flops, moved, 80e9, 20e9)
    assert seconds == pytest.approx(table.gemm_t0 + compute + memory)


def test_a_whole_prompt_scores_its_causal_triangle_and_a_chunk_its_whole_mask():
    # within one key block every key is scored: the triangle and the rest of the square
    assert causal_scores(4) == (4 + 3 + 2 + 1) + 4 * 4 // 2
    assert causal_scores(KEY_BLOCK) == KEY_BLOCK * (KEY_BLOCK + 1) // 2 + KEY_BLOCK**2 // 2
    # past it, the triangle and half a block a row (the blocks the diagonal crosses, whole)
    t = 4 * KEY_BLOCK
    assert causal_scores(t) == t * (t + 1) // 2 + t * KEY_BLOCK // 2
    assert scored_positions([(4, 6)]) == 4 * 10
    assert scored_positions([(t, 0), (4, 6)]) == causal_scores(t) + 40
    assert mask_positions([(4, 0), (4, 6), (2, 1)]) == [4 * 10, 2 * 3]


def test_the_diagonals_blocks_cost_their_products_at_attentions_efficiency():
    model = _model("small")
    stub = Sample(model, "prefill", 1.0, "x", pieces=((2048, 0),))
    physics = Physics(model, device_for(CPU, stub, None), TRUE.efficiency(CPU, model))
    extra = causal_scores(2048) - 2048 * 2049 // 2
    flops = 4.0 * model.attention_heads * model.head_dim * extra * model.layers
    rate = physics.efficiency.attention_compute_efficiency * physics.device.peak("bf16")
    assert diagonal_seconds(model, [(2048, 0)], physics) == pytest.approx(flops / rate)
    assert diagonal_seconds(model, [(256, 2048)], physics) == 0.0  # a chunk's mask: no block left


def test_the_softmax_bytes_grow_with_the_heads_not_the_head_dim():
    model = _model("small")
    pieces = [(256, 2048)]
    seconds = score_seconds(model, pieces, 1e9)
    scores = 256 * (256 + 2048) * model.attention_heads * model.layers
    assert seconds == pytest.approx(scores * SCORE_BYTES / 1e9)
    wide = dataclasses.replace(model, head_dim=4 * model.head_dim)
    assert score_seconds(wide, pieces, 1e9) == seconds
    more = dataclasses.replace(model, attention_heads=2 * model.attention_heads)
    assert score_seconds(more, pieces, 1e9) == pytest.approx(2 * seconds)


def test_a_chunk_pays_for_its_masks_and_a_whole_prompt_for_none():
    model = _model("tiny")
    stub = Sample(model, "prefill", 1.0, "x", pieces=((256, 0),))
    physics = Physics(model, device_for(CPU, stub, None), TRUE.efficiency(CPU, model))
    assert mask_seconds(model, [(256, 0)], physics, 2e-6) == 0.0
    positions = 256 * (256 + 2048)
    bandwidth = physics.efficiency.memory_efficiency * physics.device.memory_bandwidth
    moved = positions * (MASK_WRITTEN + MASK_READ + MASK_FLOAT * model.attention_heads)
    pages = math.ceil(positions * MASK_WRITTEN / 4096)
    expected = model.layers * (moved / bandwidth + pages * 2e-6)
    assert mask_seconds(model, [(256, 2048)], physics, 2e-6) == pytest.approx(expected)


def test_the_host_cost_is_the_torch_calls_the_pass_makes():
    host = HostCost(1e-6)
    base, piece, layer, piece_layer = PREFILL_CALLS
    assert host.prefill(4, 3) == pytest.approx(
        1e-6 * (base + 3 * piece + 4 * (layer + 3 * piece_layer))
    )
    base, row, layer = DECODE_CALLS
    assert host.decode(4, 3) == pytest.approx(1e-6 * (base + 3 * row + 4 * layer))
    # one more layer costs the same calls whatever the model's widths
    assert host.decode(5, 3) - host.decode(4, 3) == pytest.approx(1e-6 * layer)


def test_terms_read_back_from_their_vector():
    values = TRUE.values()
    assert list(values) == [*FRACTIONS, *POSITIVES]
    assert len(TRUE.compute) == len(COMPUTE_BOUNDS)


def test_a_fit_reproduces_the_passes_its_terms_made():
    samples = _passes("tiny") + _passes("small")
    fit = fit_cpu(CPU, samples, rounds=400)
    assert fit.fitted_on == ("tiny", "small")
    assert fit.in_sample_median < 0.02


def test_a_model_left_out_is_predicted_every_way_round():
    samples = _passes("tiny") + _passes("small") + _passes("medium")
    results = transfers(CPU, samples, rounds=400)
    assert [r.held_out for r in results] == ["tiny", "small", "medium"]
    for r in results:
        assert r.held_out not in r.fitted_on and len(r.fitted_on) == 2
        assert r.median("decode") < 0.02  # every decode term is seen at every model's widths
    # small's widths lie between tiny's and medium's: every pass of it is predicted
    between = results[1]
    assert max(between.worst("prefill"), between.worst("decode")) < 0.02
    assert results[2].median("prefill") < 0.02


def test_fitted_on_one_head_dim_every_term_comes_back():
    # small and medium share head dim 64: attention's work that does not grow with the head
    # dim is priced by its bytes, not fitted, so nothing is left that only tiny's 16 would show
    fit = fit_cpu(CPU, _passes("small") + _passes("medium"), rounds=400)
    found, true = fit.terms.values(), TRUE.values()
    for name in true:
        assert found[name] == pytest.approx(true[name], rel=0.02), name
    assert fit.terms.gemm_t0 == GEMM_T0 == 0.0  # not fitted: a call's time holds it


def test_too_little_to_fit_is_refused():
    with pytest.raises(ValueError, match="at least"):
        fit_cpu(CPU, _passes("tiny")[:3])
    with pytest.raises(ValueError, match="2 or more models"):
        transfers(CPU, _passes("tiny"))


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"kind": "train"}, "prefill or decode"),
        ({"seconds": 0.0}, "positive"),
        ({"seconds": math.nan}, "positive"),
        ({"kind": "decode", "rows": 0}, "rows"),
        ({"pieces": ()}, "piece"),
    ],
)
def test_a_bad_sample_is_refused(fields, words):
    base = {"kind": "prefill", "seconds": 1.0, "label": "x", "pieces": ((8, 0),)}
    with pytest.raises(ValueError, match=words):
        Sample(_model("tiny"), **{**base, **fields})


def test_a_working_set_the_cache_holds_moves_at_its_bandwidth_and_a_larger_one_at_memorys():
    from pytest_prefill.plan.compute.cpu import HEADROOM, Cache

    cache = Cache(size=32e6, bandwidth=60e9)
    memory = CPU.memory_bandwidth
    assert cache.bandwidth_for(16e6, memory) == cache.bandwidth == cache.bandwidth_for(32e6, memory)
    # a sweep repeated over more than the cache holds evicts each line before its next use
    assert cache.bandwidth_for(32e6 + 1, memory) == memory == cache.bandwidth_for(1e12, memory)
    tiny, medium = _passes("tiny")[0], _passes("medium")[0]
    assert tiny.working_set < medium.working_set
    seen = [device_for(CPU, s, cache).memory_bandwidth for s in (tiny, medium)]
    assert seen[0] == cache.bandwidth * HEADROOM > seen[1]
    assert device_for(CPU, tiny, None).memory_bandwidth == memory * HEADROOM
    with pytest.raises(ValueError, match="cache size"):
        Cache(size=0, bandwidth=1e9)
