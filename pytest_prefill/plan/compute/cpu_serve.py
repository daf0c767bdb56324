"""A decode step of ``transformers serve --continuous-batching`` on a CPU, where its attention
runs (its default there: SDPA over a paged cache, in the model's fp32, one torch thread), as
transformers' code runs it (generation/continuous_batching and integrations/sdpa_attention):
the step's rows are packed into one sequence of ``rows`` query tokens, and each layer

- writes the rows' new keys and values into the paged cache (``index_copy_``),
- reads every row's whole cache back, its new token included, into one contiguous copy
  (``index_select`` over the step's read index: ``keys`` tokens, all rows together),
- with one row, attends over that copy directly (its query heads grouped onto the KV heads);
  with more, expands the copy to every query head (``repeat_kv``: SDPA's grouped path is
  taken only without a mask, and the packed rows need a block-diagonal one) and runs SDPA
  dense over the ``rows x keys`` score matrix of each head under the additive float mask, so
  each row also scores every other row's keys, masked off.

Its linear layers run as any eager torch model's (plan/compute/physics: the CPU BLAS's rule);
this module prices what differs, the attention: memory-bound on a CPU at these sizes, the
bytes its copies move (read and written) beside its dense FLOPs. Standard library only."""

from __future__ import annotations

import dataclasses

from pytest_prefill.plan.compute.physics import Physics
from pytest_prefill.plan.model_spec import ModelSpec

ATTENTION_OP = "attention"  # the physics' op this module prices in transformers' way


@dataclasses.dataclass(frozen=True, slots=True)
class ServeAttention:
    """The bytes and FLOPs of one layer's attention in a decode step of ``rows`` packed rows
    over ``keys`` key positions in all (the rows' cached tokens and their new ones)."""

    model: ModelSpec
    rows: int
    keys: int

    def __post_init__(self) -> None:
        for name in ("rows", "keys"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.keys < self.rows:
            raise ValueError(f"keys ({self.keys}) must be at least rows ({self.rows})")

    @property
    def kv_bytes(self) -> int:
        """One token's K and V of one layer over the KV heads (as the paged cache holds them)."""
        m = self.model
        return 2 * m.kv_heads * m.head_dim * m.kv_dtype_bytes

    @property
    def expanded_bytes(self) -> int:
        """One token's K and V of one layer over every query head (``repeat_kv``'s copy)."""
        m = self.model
        return 2 * m.attention_heads * m.head_dim * m.kv_dtype_bytes

    @property
    def expands(self) -> bool:
        """Whether the step expands K and V to the query heads: with more than one row."""
        return self.rows > 1

    def gathered(self) -> float:
        """The cache write of the rows' new tokens and the read-back: every key read from the
        paged cache and written to its contiguous copy."""
        return float(self.rows * self.kv_bytes + 2 * self.keys * self.kv_bytes)

    def attended(self) -> float:
        """What SDPA and its preparation move: one row reads the gathered copy; more rows
        read it, write its copy expanded to every head, then read that per head with the
        ``rows x keys`` float mask (broadcast to each head)."""
        if not self.expands:
            return float(self.keys * self.kv_bytes)
        m = self.model
        mask = m.attention_heads * self.rows * self.keys * m.dtype_bytes
        return float(self.keys * (self.kv_bytes + 2 * self.expanded_bytes) + mask)

    def moved(self) -> float:
        """Bytes the layer's attention reads and writes."""
        return self.gathered() + self.attended()

    def flops(self) -> float:
        """QK^T and PV over the scores SDPA computes: every row against the keys it reads
        (with more than one row, every row against every row's keys)."""
        m = self.model
        scored = self.rows * self.keys if self.expands else self.keys
        return 4.0 * m.attention_heads * m.head_dim * scored


def attention_seconds(physics: Physics, rows: int, keys: int) -> float:
    """One layer's attention in transformers serve's decode step on ``physics``' device: the
    slower of its FLOPs at the attention's compute efficiency and its bytes at the attention's
    memory efficiency."""
    call = ServeAttention(physics.model, rows, keys)
    eff, device = physics.efficiency, physics.device
    compute = call.flops() / (eff.attention_compute_efficiency * device.peak("bf16"))
    memory = call.moved() / (eff.attention_memory_efficiency * device.memory_bandwidth)
    return max(compute, memory)


def serve_decode_step(physics: Physics, rows: int, kv_tokens: int) -> float:
    """Device seconds of transformers serve's decode step of ``rows`` rows reading
    ``kv_tokens`` cached tokens in all: the physics' linear layers, norms and output head, and
    each layer's attention as :func:`attention_seconds` prices it (at TP 1: the server runs
    on one device).

    Raises:
        ValueError: for rows below 1, cached tokens below 0, or a TP above 1.
    """
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be an integer >= 1, got {rows!r}")
    if isinstance(kv_tokens, bool) or not isinstance(kv_tokens, int) or kv_tokens < 0:
        raise ValueError(f"kv_tokens must be an integer >= 0, got {kv_tokens!r}")
    if physics.tp != 1:
        raise ValueError(f"transformers serve runs on one device: tp must be 1, got {physics.tp}")
    ops = physics.pass_ops(rows, kv_tokens + rows, kv_tokens, rows, decode=True)
    rest = sum(op.seconds for op in ops if op.name != ATTENTION_OP)
    return rest + physics.model.layers * attention_seconds(physics, rows, kv_tokens + rows)
