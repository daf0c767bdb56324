"""A decode step of the packed pass (lab/packed.py) on a CPU, op by op as that code runs it:
per layer the seven projections (q, k, v, o; gate, up, down) over the step's rows, the decode
rows' attention over one gathered, zero-padded copy of their caches, and the output head over
every row. Two rules of the CPU's libraries set what a step moves beyond its FLOPs:

- the BLAS's single-precision GEMM runs fewer than ``GEMV_ROWS`` rows as one matrix-vector
  sweep over the weights per row, and wider ones as a GEMM that packs its weight operand
  (``PACK_PASSES`` passes over the weights' bytes, then the multiply at the GEMM's compute
  efficiency, on the packed copy the cache holds);
- the allocator maps a buffer larger than ``MMAP_THRESHOLD`` fresh from the kernel each time it
  is allocated, so every page of the step's gathered cache is faulted in and zeroed on each step
  past it (below it, the freed buffer is reused);
- a prefill pass's MLP holds ``MLP_BUFFERS`` buffers of the intermediate width at once per
  layer (gate, up, their activation and product), the largest of the pass: the heap grows at
  its top for them and, once they are freed, gives the pages back to the kernel when its top
  passes ``TRIM_THRESHOLD``, so every layer faults them in afresh (:func:`mlp_fresh_pages`).
  Not a decode step's: there the largest buffer freed is the gathered cache, and freeing a
  mapped buffer raises glibc's thresholds to its size, so the rows' small MLP buffers stay.

Standard library only."""

from __future__ import annotations

import dataclasses
import math

from pytest_prefill.plan.compute.devices import Device
from pytest_prefill.plan.compute.efficiency import Efficiency
from pytest_prefill.plan.compute.physics import CPU_GEMV_ROWS, CPU_PACK_PASSES
from pytest_prefill.plan.model_spec import ModelSpec

# The CPU BLAS's rule (plan/compute/physics): below GEMV_ROWS rows a matrix-vector sweep over
# the weights per row; from there the weights packed (PACK_PASSES passes over their bytes).
GEMV_ROWS = CPU_GEMV_ROWS
PACK_PASSES = CPU_PACK_PASSES
# glibc's largest dynamic mmap threshold on a 64-bit system (DEFAULT_MMAP_THRESHOLD_MAX,
# 4 MiB x sizeof(long)): a larger allocation is a fresh mapping each time, its pages faulted in.
MMAP_THRESHOLD = 32 * 2**20
PAGE_BYTES = 4096
# glibc's M_TRIM_THRESHOLD (128 KiB): a free leaving more than this at the heap's top returns it.
TRIM_THRESHOLD = 128 * 1024
# The MLP's buffers of the intermediate width alive together: gate, up, SiLU(gate), the product.
MLP_BUFFERS = 4
FLOAT_BYTES = 4  # the packed pass's activations on a CPU: the model's fp32


@dataclasses.dataclass(frozen=True, slots=True)
class KernelTerms:
    """How the CPU's libraries run a decode step's projections and buffers: ``sweep_k0``, the
    row width at which a matrix-vector sweep reaches half its bandwidth (each output row's dot
    product ends in a reduction and a store: a fixed cost per row beside its ``k`` values read;
    the fit takes the GEMM's own width ramp); ``fault``, seconds per page mapped fresh (the
    kernel's fault and zeroing)."""

    sweep_k0: float
    fault: float


def projections(model: ModelSpec) -> list[tuple[str, int, int]]:
    """One layer's linear layers as the packed pass calls them, (name, n, k): the attention's
    q, k, v and o projections one by one, the MLP's gate, up and down."""
    h, q = model.hidden_size, model.attention_heads * model.head_dim
    kv, width = model.kv_heads * model.head_dim, model.intermediate_size
    return [
        ("q_proj", q, h),
        ("k_proj", kv, h),
        ("v_proj", kv, h),
        ("o_proj", h, q),
        ("gate_proj", width, h),
        ("up_proj", width, h),
        ("down_proj", h, width),
    ]


@dataclasses.dataclass(frozen=True, slots=True)
class DecodeStep:
    """``model``'s decode step on ``device`` (its peaks and the bandwidth the step's working set
    finds) at ``efficiency``'s fractions, with ``kernel``'s library terms."""

    model: ModelSpec
    device: Device
    efficiency: Efficiency
    kernel: KernelTerms

    @property
    def _bandwidth(self) -> float:
        return self.device.memory_bandwidth

    def linear(self, rows: int, n: int, k: int) -> float:
        """One projection over ``rows`` rows: below ``GEMV_ROWS``, a sweep over the weights per
        row (each the slower of its read and its FLOPs); else the weights packed
        (``PACK_PASSES`` passes over their bytes), then the multiply."""
        eff, peak = self.efficiency, self.device.peak("bf16")
        weights = float(n * k * self.model.weight_value_bytes)
        flops = 2.0 * n * k
        if rows < GEMV_ROWS:
            width = k / (k + self.kernel.sweep_k0)
            read = weights / (eff.memory_efficiency * width * self._bandwidth)
            return eff.gemm_t0 + rows * max(read, flops / (eff.compute_efficiency(1) * peak))
        packing = PACK_PASSES * weights / (eff.memory_efficiency * self._bandwidth)
        return eff.gemm_t0 + packing + rows * flops / (eff.compute_efficiency(rows) * peak)

    def linears(self, rows: int) -> float:
        """Every layer's projections and the output head (the tied embedding), over ``rows``."""
        m = self.model
        layer = sum(self.linear(rows, n, k) for _, n, k in projections(m))
        return m.layers * layer + self.linear(rows, m.vocab_size, m.hidden_size)

    def attention(self, rows: int, keys: int) -> float:
        """One layer's attention of ``rows`` rows over the gathered cache of ``keys`` positions
        each (padded to the longest): the slower of its FLOPs and its read of K and V."""
        m, eff = self.model, self.efficiency
        flops = 4.0 * m.attention_heads * m.head_dim * rows * keys
        read = rows * keys * 2.0 * m.kv_heads * m.head_dim * m.kv_dtype_bytes
        compute = flops / (eff.attention_compute_efficiency * self.device.peak("bf16"))
        return max(compute, read / (eff.attention_memory_efficiency * self._bandwidth))

    def gather(self, rows: int, keys: int, kv_tokens: int) -> float:
        """The step's copy of its rows' caches: a zeroed ``[layer, K/V, row, head, keys, d]``
        buffer written, the caches read into it, and its pages faulted in when the allocator
        maps it fresh (:func:`fresh_pages`)."""
        padded = gathered_bytes(self.model, rows, keys)
        moved = 2.0 * padded + kv_tokens * self.model.kv_bytes_per_token
        pages = fresh_pages(padded)
        return (
            moved / (self.efficiency.memory_efficiency * self._bandwidth)
            + pages * self.kernel.fault
        )

    def elementwise(self, rows: int) -> float:
        """One layer's norms, rotary embedding, SiLU and residual adds: memory only (a few
        reads and writes of each row's hidden and intermediate widths)."""
        m = self.model
        width = 8 * m.hidden_size + 3 * m.intermediate_size
        moved = float(rows) * FLOAT_BYTES * width
        return moved / (self.efficiency.memory_efficiency * self._bandwidth)

    def seconds(self, rows: int, kv_tokens: int) -> float:
        """Device seconds of a step of ``rows`` rows reading ``kv_tokens`` cached tokens in all
        (each row's cache ``kv_tokens / rows`` long)."""
        keys = math.ceil(kv_tokens / rows) + 1
        per_layer = self.attention(rows, keys) + self.elementwise(rows)
        return (
            self.linears(rows) + self.model.layers * per_layer + self.gather(rows, keys, kv_tokens)
        )


def gathered_bytes(model: ModelSpec, rows: int, keys: int) -> int:
    """Bytes of the decode rows' gathered cache: every layer's K and V for ``rows`` rows of
    ``keys`` positions."""
    return rows * keys * model.kv_bytes_per_token


def fresh_pages(nbytes: float) -> int:
    """Pages the allocator hands a buffer of ``nbytes`` fresh from the kernel on each
    allocation: all of them past ``MMAP_THRESHOLD``, none below (a freed buffer is reused)."""
    return math.ceil(nbytes / PAGE_BYTES) if nbytes > MMAP_THRESHOLD else 0


def churned_pages(nbytes: float) -> int:
    """Pages faulted in for buffers of ``nbytes`` in all, allocated together and freed together
    once per layer: every page when they pass ``TRIM_THRESHOLD`` (the heap grows at its top for
    them and returns the pages to the kernel once they are freed), none below."""
    return math.ceil(nbytes / PAGE_BYTES) if nbytes > TRIM_THRESHOLD else 0


def mlp_fresh_pages(model: ModelSpec, rows: int) -> int:
    """Pages one layer's MLP faults in over ``rows`` rows: its ``MLP_BUFFERS`` buffers of
    ``rows x intermediate`` fp32 values (:func:`churned_pages`)."""
    return churned_pages(MLP_BUFFERS * rows * model.intermediate_size * FLOAT_BYTES)


def decode_working_set(model: ModelSpec, rows: int, kv_tokens: int) -> float:
    """Bytes a decode step touches that its repeat finds again: the weights, the rows' caches
    and their gathered copy."""
    keys = math.ceil(kv_tokens / rows) + 1
    cached = kv_tokens * model.kv_bytes_per_token
    return float(model.weight_bytes + cached + gathered_bytes(model, rows, keys))
