"""What one forward pass costs on a device, operation by operation, from a model's shapes: every
GEMM of a layer by its (m, n, k) split by TP, attention per (query, key) pair and per cached
token read, the per-layer all-reduces, a mixture of experts' routed GEMMs, at efficiencies
fitted on public per-op data (DESIGN.md, "Compute from the model and the device"). Standard
library only."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from pytest_prefill.plan.compute.devices import Device
from pytest_prefill.plan.compute.efficiency import AttentionCall, Efficiency
from pytest_prefill.plan.model_spec import ModelSpec
from pytest_prefill.sim.cost import Piece, piece_sums

ACTIVATION_BYTES = 2  # activations stay in bf16 (fp8 quantization scales them per GEMM only)
# A CPU's BLAS (MKL's sgemm, torch's on x86) runs a GEMM of fewer than CPU_GEMV_ROWS rows as one
# matrix-vector sweep over the weights per row (2 or 3 rows read every weight 2 or 3 times);
# from there it packs the weights before it multiplies: it reads them and writes their packed
# copy (a store that first reads the line it fills), CPU_PACK_PASSES passes over their bytes.
CPU_GEMV_ROWS = 4
CPU_PACK_PASSES = 3


def weight_passes(architecture: str, rows: int) -> int:
    """How many times a GEMM of ``rows`` rows moves its weights' bytes on a device of
    ``architecture``: once on a GPU; on a CPU once per row below ``CPU_GEMV_ROWS``, else
    ``CPU_PACK_PASSES``."""
    if architecture != "cpu":
        return 1
    return rows if rows < CPU_GEMV_ROWS else CPU_PACK_PASSES


def expected_experts(rows: int, experts: int, per_token: int) -> float:
    """How many distinct experts ``rows`` tokens touch, each routed to ``per_token`` of
    ``experts`` at random: ``E · (1 − (1 − k/E)^rows)`` (a decode step reads only these)."""
    if rows < 1:
        return 0.0
    return experts * (1 - (1 - per_token / experts) ** rows)


@dataclasses.dataclass(frozen=True, slots=True)
class Op:
    """One operation of a pass: its FLOPs, the bytes it moves, and what it costs."""

    name: str
    flops: float
    bytes: float
    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class Physics:
    """``model`` on ``device`` at tensor parallelism ``tp``, at ``efficiency``'s fractions of
    the device's peaks. Linear layers run at the fp8 peak under ``--quantization fp8``, else
    bf16.

    Raises:
        ValueError: in one line, for a TP that does not divide the attention heads, or fp8
            weights on a device without an fp8 peak.
    """

    model: ModelSpec
    device: Device
    efficiency: Efficiency
    tp: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.tp, bool) or not isinstance(self.tp, int) or self.tp < 1:
            raise ValueError(f"tp must be an integer >= 1, got {self.tp!r}")
        if self.model.attention_heads % self.tp:
            raise ValueError(
                f"tp={self.tp} does not divide {self.model.name}'s "
                f"{self.model.attention_heads} attention heads"
            )
        if self.model.quantization == "fp8" and not self.device.has_fp8:
            raise ValueError(
                f"--quantization fp8: {self.device.name} has no fp8 peak (fp8 GEMMs need Ada, "
                "Hopper, Blackwell or CDNA3); serve it in bf16"
            )

    @property
    def linear_peak(self) -> float:
        return self.device.peak("fp8" if self.model.quantization == "fp8" else "bf16")

    def gemm(self, name: str, m: int, n: int, k: int, *, weights: float | None = None) -> Op:
        """``t0 + (c^q + w^q)^(1/q)``, c = 2mnk / (ηc(m)·P), w = bytes / (ηm·W) (the
        efficiency table's roofline); bytes: the weights (``weights`` when given, else k·n
        values; a CPU moves them :func:`weight_passes` times) and the activations in and out."""
        weight_bytes = k * n * self.model.weight_value_bytes if weights is None else weights
        passes = weight_passes(self.device.architecture, m)
        moved = passes * weight_bytes + (m * k + m * n) * ACTIVATION_BYTES
        flops = 2.0 * m * n * k
        return Op(name, flops, moved, self._gemm_seconds(m, flops, moved))

    def _gemm_seconds(self, m: int, flops: float, moved: float) -> float:
        bandwidth = self.device.memory_bandwidth
        return self.efficiency.gemm_seconds(m, flops, moved, self.linear_peak, bandwidth)

    def layer_gemms(self, tokens: int) -> list[Op]:
        """One layer's GEMMs over ``tokens`` rows (per TP rank)."""
        m, tp, h, d = self.model, self.tp, self.model.hidden_size, self.model.head_dim
        q = m.attention_heads * d // tp
        kv = max(1, m.kv_heads // tp) * d
        ops = [
            self.gemm("qkv_proj", tokens, q + 2 * kv, h),
            self.gemm("o_proj", tokens, h, q),
        ]
        return ops

    def mlp(self, tokens: int, *, dense: bool) -> list[Op]:
        """One layer's MLP over ``tokens`` rows: the gated MLP (gate and up as one GEMM, then
        down), or the routed experts (their rows: tokens × experts per token; the weights read:
        the experts those rows touch) with the router and any shared expert."""
        m, tp, h = self.model, self.tp, self.model.hidden_size
        if dense or not m.is_moe:
            width = m.intermediate_size // tp
            return [
                self.gemm("gate_up_proj", tokens, 2 * width, h),
                self.gemm("down_proj", tokens, h, width),
            ]
        width = max(1, m.expert_intermediate_size // tp)
        rows = tokens * m.experts_per_token
        touched = expected_experts(tokens, m.experts, m.experts_per_token)
        ops = [
            self.grouped_gemm("experts_gate_up", rows, touched, 2 * width, h),
            self.grouped_gemm("experts_down", rows, touched, h, width),
            self.gemm("router", tokens, m.experts, h, weights=m.experts * h * m.dtype_bytes),
        ]
        if m.shared_expert_intermediate_size:
            shared = m.shared_expert_intermediate_size // tp
            ops += [
                self.gemm("shared_gate_up", tokens, 2 * shared, h),
                self.gemm("shared_down", tokens, h, shared),
            ]
        return ops

    def grouped_gemm(self, name: str, rows: int, touched: float, n: int, k: int) -> Op:
        """The experts' GEMM as one grouped launch: ``rows`` routed rows over the ``touched``
        experts (each a GEMM of ``rows ÷ touched`` rows at that size's ηc), reading only the
        touched experts' weights."""
        moved = touched * k * n * self.model.weight_value_bytes + rows * (k + n) * ACTIVATION_BYTES
        flops = 2.0 * rows * n * k
        per_expert = max(1, round(rows / touched))
        return Op(name, flops, moved, self._gemm_seconds(per_expert, flops, moved))

    def attention(self, pairs: int, tokens: int, kv_read: int, sequences: int, decode: bool) -> Op:
        """One layer's attention over ``sequences`` sequences: ``pairs`` (query, key) pairs at
        ``4 · heads · d`` FLOPs each (QKᵀ and PV) and ``kv_read`` cached tokens' K and V read.
        Prefill (plan/compute/efficiency.py's form): a fixed and a per-sequence cost, plus the
        pairs' compute (the diagonal's tiles whole, at the head size's efficiency) plus Q, K, V
        and O moved; decode: a fixed and a per-head cost, plus the larger of the pairs' compute
        and the cache's read."""
        m, tp, eff = self.model, self.tp, self.efficiency
        heads, kv_heads = m.attention_heads // tp, max(1, m.kv_heads // tp)
        cached = float(kv_read) * 2 * kv_heads * m.head_dim * m.kv_dtype_bytes
        peak, bandwidth = self.device.peak("bf16"), self.device.memory_bandwidth
        if decode:
            call = AttentionCall(sequences, heads, m.head_dim, cached)
            seconds = eff.decode_attention_seconds(pairs, call, peak, bandwidth)
            return Op("attention", 4.0 * heads * m.head_dim * pairs, cached, seconds)
        moved = cached + tokens * m.head_dim * (2 * heads + 2 * kv_heads) * ACTIVATION_BYTES
        computed = eff.prefill_computed_pairs(pairs, tokens)
        call = AttentionCall(sequences, heads, m.head_dim, moved)
        seconds = eff.prefill_attention_seconds(computed, call, peak, bandwidth)
        return Op("attention", 4.0 * heads * m.head_dim * computed, moved, seconds)

    def elementwise(self, tokens: int) -> Op:
        """One layer's fused norms and activation (two add+RMSNorms read and write the hidden
        state and the residual; SiLU-and-mul reads the gated pair and writes one): memory only."""
        m = self.model
        width = (
            m.expert_intermediate_size * m.experts_per_token if m.is_moe else m.intermediate_size
        )
        moved = float(tokens) * ACTIVATION_BYTES * (8 * m.hidden_size + 3 * width // self.tp)
        seconds = moved / (self.efficiency.memory_efficiency * self.device.memory_bandwidth)
        return Op("elementwise", 0.0, moved, seconds)

    def allreduces(self, tokens: int) -> Op:
        """A layer's two all-reduces at TP > 1 (after attention and after the MLP) of
        ``tokens × hidden`` activations, ring algorithm: ``2(n−1)/n`` of the bytes on the bus."""
        if self.tp == 1:
            return Op("allreduce", 0.0, 0.0, 0.0)
        size = float(tokens) * self.model.hidden_size * ACTIVATION_BYTES
        bus = size * 2 * (self.tp - 1) / self.tp
        return Op("allreduce", 0.0, 2 * bus, 2 * self.efficiency.allreduce_seconds(size, self.tp))

    def pass_ops(
        self, tokens: int, pairs: int, kv_read: int, logits: int, decode: bool = False
    ) -> list[Op]:
        """Every operation of a forward pass over ``tokens`` rows, ``pairs`` attention pairs
        and ``kv_read`` cached tokens read, for ``logits`` sequences (each makes one row of
        logits); ``decode``: a decode step (one token per sequence)."""
        m = self.model
        layer = [
            *self.layer_gemms(tokens),
            self.attention(pairs, tokens, kv_read, max(1, logits), decode),
            self.elementwise(tokens),
            self.allreduces(tokens),
        ]
        ops = [dataclasses.replace(op, seconds=op.seconds * m.layers) for op in layer]
        for dense, count in (
            (True, m.dense_layers if m.is_moe else m.layers),
            (False, m.sparse_layers),
        ):
            if count:
                ops += [
                    dataclasses.replace(op, seconds=op.seconds * count)
                    for op in self.mlp(tokens, dense=dense)
                ]
        head = self.gemm(
            "lm_head",
            max(1, logits),
            m.vocab_size // self.tp,
            m.hidden_size,
            weights=m.vocab_size // self.tp * m.hidden_size * m.dtype_bytes,
        )
        return [*ops, head]

    def prefill_pass(self, pieces: Iterable[Piece]) -> float:
        """Seconds of device time for a prefill pass over prompt pieces ``(T, C)`` (each piece
        reads its C cached tokens once per layer and makes one row of logits)."""
        listed: Sequence[Piece] = tuple(pieces)
        tokens, pairs, context = piece_sums(listed)
        if tokens < 1:
            raise ValueError("a prefill pass needs at least one new token")
        return sum(op.seconds for op in self.pass_ops(tokens, pairs, context, len(listed)))

    def decode_step(self, rows: int, kv_tokens: int) -> float:
        """Seconds of device time for a decode step of ``rows`` sequences reading ``kv_tokens``
        cached tokens in all (one new token each: ``rows`` pairs past the cache)."""
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise ValueError(f"rows must be an int >= 1, got {rows!r}")
        return sum(
            op.seconds for op in self.pass_ops(rows, kv_tokens + rows, kv_tokens, rows, decode=True)
        )
