"""A decode step of the packed pass priced as a CPU runs it (plan/compute/cpu_decode.py): the
projections the pass calls, the BLAS's matrix-vector sweeps below GEMV_ROWS rows and its packed
GEMM from there, the gathered cache's bytes, and its pages mapped fresh past the allocator's
mmap threshold."""

from __future__ import annotations

import dataclasses
import math

import pytest

from pytest_prefill.plan.compute.cpu_decode import (
    GEMV_ROWS,
    MLP_BUFFERS,
    MMAP_THRESHOLD,
    PACK_PASSES,
    PAGE_BYTES,
    TRIM_THRESHOLD,
    DecodeStep,
    KernelTerms,
    churned_pages,
    decode_working_set,
    fresh_pages,
    gathered_bytes,
    mlp_fresh_pages,
    projections,
)
from pytest_prefill.plan.compute.transfer import linear_device
from pytest_prefill.plan.model_spec import load_model_spec
from tests.test_compute_cpu import CPU, TRUE

KERNEL = KernelTerms(sweep_k0=40.0, fault=2e-6)


def _model(name):
    return dataclasses.replace(load_model_spec(name), dtype="float32")


def _step(name="small", kernel=KERNEL):
    model = _model(name)
    device = linear_device(CPU, model.dtype)
    return DecodeStep(model, device, TRUE.efficiency(CPU, model), kernel)


@pytest.mark.parametrize("name", ["tiny", "small", "medium"])
def test_the_projections_are_every_linear_weight_of_a_layer(name):
    model = _model(name)
    h, q = model.hidden_size, model.attention_heads * model.head_dim
    kv, width = model.kv_heads * model.head_dim, model.intermediate_size
    values = sum(n * k for _, n, k in projections(model))
    assert values == h * q + 2 * h * kv + q * h + 3 * h * width
    assert len(projections(model)) == 7  # q, k, v, o; gate, up, down: one call each


def test_below_gemv_rows_each_row_sweeps_the_weights_once_more():
    step = _step()
    t0 = step.efficiency.gemm_t0
    one = step.linear(1, 1152, 384) - t0
    for rows in range(2, GEMV_ROWS):
        assert step.linear(rows, 1152, 384) - t0 == pytest.approx(rows * one)


def test_from_gemv_rows_the_weights_are_packed_once_and_the_rows_multiplied():
    step = _step()
    eff, peak = step.efficiency, step.device.peak("bf16")
    n, k = 1152, 384
    packing = PACK_PASSES * n * k * 4 / (eff.memory_efficiency * step.device.memory_bandwidth)
    for rows in (GEMV_ROWS, 8, 64):
        multiply = 2.0 * rows * n * k / (eff.compute_efficiency(rows) * peak)
        assert step.linear(rows, n, k) == pytest.approx(eff.gemm_t0 + packing + multiply)
    # doubling the rows of a packed GEMM adds FLOPs, not another pass over the weights
    extra = step.linear(16, n, k) - step.linear(8, n, k)
    assert extra == pytest.approx(2.0 * 8 * n * k / (eff.compute_efficiency(8) * peak))


def test_a_narrow_row_sweeps_its_weights_slower_than_a_wide_one():
    step = _step()
    t0 = step.efficiency.gemm_t0
    narrow = (step.linear(1, 4096, 64) - t0) / (4096 * 64)
    wide = (step.linear(1, 64, 4096) - t0) / (64 * 4096)
    assert narrow / wide == pytest.approx((64 + KERNEL.sweep_k0) / 64 * 4096 / (4096 + 40.0))


def test_pages_are_mapped_fresh_only_past_the_mmap_threshold():
    assert fresh_pages(MMAP_THRESHOLD) == 0
    assert fresh_pages(1.0) == 0
    assert fresh_pages(MMAP_THRESHOLD + 1) == MMAP_THRESHOLD // PAGE_BYTES + 1
    assert fresh_pages(3 * MMAP_THRESHOLD) == 3 * MMAP_THRESHOLD // PAGE_BYTES


def test_the_gather_writes_a_zeroed_padded_copy_and_reads_the_caches():
    step = _step("medium")
    model, bandwidth = step.model, step.device.memory_bandwidth
    rows, length = 2, 1000
    keys = length + 1
    padded = gathered_bytes(model, rows, keys)
    assert padded == rows * keys * model.kv_bytes_per_token
    assert padded <= MMAP_THRESHOLD
    moved = 2 * padded + rows * length * model.kv_bytes_per_token
    seconds = step.gather(rows, keys, rows * length)
    assert seconds == pytest.approx(moved / (step.efficiency.memory_efficiency * bandwidth))


def test_a_step_whose_gathered_cache_passes_the_threshold_pays_for_every_page():
    model = _model("medium")
    below = math.floor(MMAP_THRESHOLD / model.kv_bytes_per_token) - 1  # keys that still fit
    costly, free = _step("medium"), _step("medium", dataclasses.replace(KERNEL, fault=0.0))
    for length in (below - 1, 4 * below):
        padded = gathered_bytes(model, 1, length + 1)
        gap = costly.seconds(1, length) - free.seconds(1, length)
        assert gap == pytest.approx(fresh_pages(padded) * KERNEL.fault)
    assert costly.seconds(1, below - 1) == free.seconds(1, below - 1)


def test_a_longer_cache_or_more_rows_never_makes_a_step_cheaper():
    step = _step()
    lengths = [step.seconds(1, n) for n in (128, 1024, 4096, 16384)]
    assert lengths == sorted(lengths)
    rows = [step.seconds(r, r * 128) for r in (1, 2, 3)]
    assert rows == sorted(rows)


def test_the_working_set_counts_the_weights_the_caches_and_their_gathered_copy():
    model = _model("small")
    cached = 4 * 100 * model.kv_bytes_per_token
    expected = model.weight_bytes + cached + gathered_bytes(model, 4, 101)
    assert decode_working_set(model, 4, 400) == expected


def test_a_gpu_moves_a_gemms_weights_once_a_cpu_per_row_then_packed():
    from pytest_prefill.plan.compute.physics import weight_passes

    assert [weight_passes("hopper", m) for m in (1, 2, 3, 4, 512)] == [1, 1, 1, 1, 1]
    assert [weight_passes("cpu", m) for m in range(1, GEMV_ROWS)] == list(range(1, GEMV_ROWS))
    assert {weight_passes("cpu", m) for m in (GEMV_ROWS, 8, 512)} == {PACK_PASSES}


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 64])
def test_the_per_op_physics_on_a_cpu_moves_the_weights_as_the_blas_does(rows):
    from pytest_prefill.plan.compute.physics import ACTIVATION_BYTES, Physics, weight_passes

    model = _model("small")
    device = linear_device(CPU, model.dtype)
    cpu = Physics(model, device, TRUE.efficiency(CPU, model))
    gpu = Physics(model, dataclasses.replace(device, architecture="hopper"), cpu.efficiency)
    n, k = 1152, 384
    weights = n * k * model.weight_value_bytes
    activations = rows * (n + k) * ACTIVATION_BYTES
    assert gpu.gemm("up", rows, n, k).bytes == weights + activations
    assert cpu.gemm("up", rows, n, k).bytes == weight_passes("cpu", rows) * weights + activations


def test_buffers_freed_together_are_faulted_in_afresh_only_past_the_trim_threshold():
    assert churned_pages(TRIM_THRESHOLD) == 0
    assert churned_pages(TRIM_THRESHOLD + 1) == math.ceil((TRIM_THRESHOLD + 1) / PAGE_BYTES)
    model = _model("small")
    for rows in (1, 8, 512):
        nbytes = MLP_BUFFERS * rows * model.intermediate_size * 4
        assert mlp_fresh_pages(model, rows) == churned_pages(nbytes)
    assert mlp_fresh_pages(model, 1) == 0 < mlp_fresh_pages(model, 512)


def test_a_step_pays_for_its_gathered_pages_and_no_mlp_pages():
    # freeing the mapped gather raises glibc's thresholds past the rows' MLP buffers
    step = _step("medium")
    model = step.model
    free = _step("medium", dataclasses.replace(KERNEL, fault=0.0))
    rows, kv = 8, 8 * 4096
    assert mlp_fresh_pages(model, rows) > 0  # a prefill of 8 tokens would fault them in
    gathered = fresh_pages(gathered_bytes(model, rows, 4097))
    assert gathered > 0
    extra = gathered * KERNEL.fault
    assert step.seconds(rows, kv) - free.seconds(rows, kv) == pytest.approx(extra)
