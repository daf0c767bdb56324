"""The operations a calibration times, on a loaded model: a prefill pass into a fresh cache, a
chunk pass over an existing cache, and a decode step for a batch with given cache lengths.
Every pass runs under ``torch.inference_mode``; timed regions are synchronized (CUDA events on
CUDA); inputs are seeded. Works with transformers 4.5x (``past_key_values``) and 5.x (``cache``).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence
from typing import Any

from pytest_prefill.measure.models import LoadedModel, kv_geometry
from pytest_prefill.measure.timing import Measurement, measure, wall_and_host_timer
from pytest_prefill.sim import check_int

# Synthetic caches repeat a random tile of this many positions: timing does not depend on the
# values, and filling gigabytes with fresh random numbers would dominate a CPU run.
_TILE = 256


def cache_length(cache: Any) -> int:
    """Positions held in ``cache`` (0 for an empty one)."""
    return int(cache.get_seq_length()) if cache is not None else 0


def layer_tensors(cache: Any) -> list[tuple[Any, Any]]:
    """(keys, values) of each layer, on transformers 4.5x and 5.x."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))  # transformers < 4.56


def rewind(cache: Any, length: int) -> None:
    """Drop positions from the end of ``cache`` until it holds ``length``."""
    extra = cache_length(cache) - length
    if extra < 0:
        raise ValueError(f"cannot rewind a cache of {cache_length(cache)} to {length} positions")
    if extra:
        cache.crop(-extra)  # a negative crop removes tokens in 4.5x and 5.x alike


class DecodeBatch:
    """B sequences decoding together. Their caches are left-padded to the longest; row i's
    first ``pad[i]`` positions are masked out, so its position ids count from ``pad[i]``."""

    def __init__(self, cache: Any, lengths: Sequence[int]):
        self.cache = cache
        self.lengths = tuple(lengths)
        self.padded_length = max(self.lengths)
        self.pad = tuple(self.padded_length - n for n in self.lengths)

    @property
    def size(self) -> int:
        return len(self.lengths)

    @property
    def kv_tokens(self) -> int:
        """Cached tokens the next step reads, summed over rows (padding excluded)."""
        return cache_length(self.cache) * self.size - sum(self.pad)

    def rewind(self) -> None:
        """Back to the cache lengths the batch was built with."""
        rewind(self.cache, self.padded_length)


class ModelRunner:
    """Runs the passes a calibration needs on ``loaded``; ``seed`` fixes every input token."""

    name = "hf forward"

    def __init__(self, loaded: LoadedModel, *, seed: int = 0):
        import torch

        self.loaded = loaded
        self.model = loaded.model
        self.device = torch.device(loaded.device)
        self.dtype = loaded.dtype
        self.seed = seed
        params = inspect.signature(self.model.forward).parameters
        self._cache_argument = "cache" if "cache" in params else "past_key_values"
        self._generator = torch.Generator(device="cpu")
        self._generator.manual_seed(seed)

    # -- inputs and caches ------------------------------------------------------------------

    def tokens(self, length: int, batch: int = 1) -> Any:
        """Seeded random token ids, shape (batch, length), on the device."""
        import torch

        check_int("length", length)
        check_int("batch", batch)
        ids = torch.randint(0, self.loaded.vocab_size, (batch, length), generator=self._generator)
        return ids.to(self.device)

    def new_cache(self) -> Any:
        from transformers import DynamicCache

        try:
            return DynamicCache(config=self.loaded.config)
        except TypeError:  # transformers < 4.56 builds its layers lazily, without a config
            return DynamicCache()

    def synthetic_cache(self, length: int, batch: int = 1) -> Any:
        """A cache of ``length`` positions per row filled with random values (for timing)."""
        import torch

        check_int("length", length)
        check_int("batch", batch)
        layers, kv_heads, head_dim = kv_geometry(self.loaded.config)
        cache = self.new_cache()
        tile = min(length, _TILE)
        repeats = -(-length // tile)
        with torch.inference_mode():
            for layer in range(layers):
                pair = []
                for _ in range(2):
                    block = torch.randn(
                        (batch, kv_heads, tile, head_dim), generator=self._generator
                    ).to(device=self.device, dtype=self.dtype)
                    pair.append(block.repeat(1, 1, repeats, 1)[:, :, :length].contiguous())
                cache.update(pair[0], pair[1], layer)
        return cache

    def decode_batch(self, cache_lengths: Sequence[int]) -> DecodeBatch:
        """A batch of ``len(cache_lengths)`` sequences with synthetic caches of those lengths."""
        if len(cache_lengths) == 0:
            raise ValueError("cache_lengths must name at least one sequence")
        lengths = [check_int("cache length", n) for n in cache_lengths]
        return DecodeBatch(self.synthetic_cache(max(lengths), batch=len(lengths)), lengths)

    def stack(self, caches: Sequence[Any]) -> DecodeBatch:
        """One left-padded batch from single-sequence caches (their values are kept)."""
        import torch

        if len(caches) == 0:
            raise ValueError("stack needs at least one cache")
        lengths = [cache_length(c) for c in caches]
        longest = max(lengths)
        batched = self.new_cache()
        per_cache = [layer_tensors(c) for c in caches]
        with torch.inference_mode():
            for layer in range(len(per_cache[0])):
                pair = []
                for which in range(2):
                    rows = []
                    for tensors, n in zip(per_cache, lengths, strict=True):
                        row = tensors[layer][which]
                        pad = row.new_zeros((*row.shape[:2], longest - n, row.shape[3]))
                        rows.append(torch.cat([pad, row], dim=2))
                    pair.append(torch.cat(rows, dim=0))
                batched.update(pair[0], pair[1], layer)
        return DecodeBatch(batched, lengths)

    # -- passes -----------------------------------------------------------------------------

    def forward(
        self,
        input_ids: Any,
        cache: Any,
        *,
        attention_mask: Any = None,
        position_ids: Any = None,
        all_logits: bool = False,
    ) -> Any:
        """One forward pass appending ``input_ids`` to ``cache``; returns the logits (only the
        last position's unless ``all_logits``, as a serving engine computes them)."""
        import torch

        kwargs = {self._cache_argument: cache, "use_cache": True}
        if attention_mask is not None:
            kwargs["attention_mask"] = attention_mask
        if position_ids is not None:
            kwargs["position_ids"] = position_ids
        with torch.inference_mode():
            out = self.model(input_ids=input_ids, logits_to_keep=0 if all_logits else 1, **kwargs)
        return out.logits

    def prefill(self, input_ids: Any, *, all_logits: bool = False) -> tuple[Any, Any]:
        """A prefill pass of ``input_ids`` (batch, T) into a fresh cache: (logits, cache)."""
        cache = self.new_cache()
        return self.forward(input_ids, cache, all_logits=all_logits), cache

    def chunk(self, cache: Any, input_ids: Any, *, all_logits: bool = False) -> Any:
        """A chunk pass of ``input_ids`` over the positions already in ``cache``."""
        return self.forward(input_ids, cache, all_logits=all_logits)

    def decode(self, batch: DecodeBatch, next_ids: Any) -> Any:
        """One decode step: ``next_ids`` (B, 1), one token per sequence of ``batch``."""
        import torch

        if tuple(next_ids.shape) != (batch.size, 1):
            raise ValueError(f"next_ids must have shape ({batch.size}, 1), got {next_ids.shape}")
        if not any(batch.pad):
            return self.forward(next_ids, batch.cache)
        past = cache_length(batch.cache)
        mask = torch.ones((batch.size, past + 1), dtype=torch.long, device=self.device)
        for row, pad in enumerate(batch.pad):
            mask[row, :pad] = 0
        positions = torch.tensor(
            [[past - pad] for pad in batch.pad], dtype=torch.long, device=self.device
        )
        return self.forward(next_ids, batch.cache, attention_mask=mask, position_ids=positions)

    # -- timing -----------------------------------------------------------------------------

    def sync(self) -> None:
        """Wait for the device to finish queued work (a no-op on CPU)."""
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def timer(self, fn: Callable[[], object]) -> tuple[float, float]:
        """One call of ``fn``: (its seconds, CUDA events on CUDA and the wall clock elsewhere;
        the host's seconds until ``fn`` returned, the enqueue time)."""
        import torch

        if self.device.type != "cuda":
            return wall_and_host_timer(fn)
        with torch.cuda.device(self.device):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(self.device)
            start.record()
            began = time.perf_counter()
            fn()
            enqueued = time.perf_counter() - began
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3, enqueued

    def measure(
        self,
        fn: Callable[[], object],
        *,
        repeats: int,
        warmup: int,
        setup: Callable[[], object] | None = None,
    ) -> Measurement:
        """``timing.measure`` with this device's timer, under inference mode, seeded."""
        import torch

        torch.manual_seed(self.seed)
        with torch.inference_mode():
            return measure(
                fn, repeats=repeats, warmup=warmup, sync=self.sync, setup=setup, timer=self.timer
            )

    def time_prefill(self, tokens: int, *, repeats: int, warmup: int) -> Measurement:
        """A prefill pass of ``tokens`` tokens into a fresh cache."""
        ids = self.tokens(tokens)
        return self.measure(lambda: self.prefill(ids), repeats=repeats, warmup=warmup)

    def time_chunk(self, tokens: int, context: int, *, repeats: int, warmup: int) -> Measurement:
        """A chunk pass of ``tokens`` tokens over a cache of ``context`` positions."""
        ids = self.tokens(tokens)
        if context == 0:
            return self.time_prefill(tokens, repeats=repeats, warmup=warmup)
        cache = self.synthetic_cache(context)
        return self.measure(
            lambda: self.chunk(cache, ids),
            repeats=repeats,
            warmup=warmup,
            setup=lambda: rewind(cache, context),
        )

    def time_decode(
        self, cache_lengths: Sequence[int], *, repeats: int, warmup: int
    ) -> Measurement:
        """A decode step of ``len(cache_lengths)`` sequences with those cache lengths."""
        batch = self.decode_batch(cache_lengths)
        ids = self.tokens(1, batch=batch.size).reshape(batch.size, 1)
        return self.measure(
            lambda: self.decode(batch, ids), repeats=repeats, warmup=warmup, setup=batch.rewind
        )
