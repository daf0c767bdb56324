"""A packed forward pass over a Hugging Face Qwen3 / Llama model's own weights: one pass takes rows
from several requests (prompt chunks and decode rows), runs the linear layers over all rows at once
and attention per request over that request's own KV cache. torch is imported lazily."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

# Architectures whose decoder layer is: RMSNorm -> attention (q/k/v/o projections, RoPE, GQA,
# optional per-head q/k RMSNorm) -> residual -> RMSNorm -> SwiGLU MLP -> residual.
SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama")


class KVCache:
    """One request's KV cache: ``data[layer, 0 or 1 (K, V), kv_head, position, head_dim]``, of
    which the first ``length`` positions are filled. Grows (by reallocation) when needed."""

    def __init__(self, data: Any, length: int = 0) -> None:
        if length < 0 or length > data.shape[3]:
            raise ValueError(f"length must be in [0, {data.shape[3]}], got {length!r}")
        self.data = data
        self.length = length

    @property
    def capacity(self) -> int:
        return int(self.data.shape[3])

    def reserve(self, tokens: int) -> None:
        """Make room for ``tokens`` positions in all."""
        if tokens <= self.capacity:
            return
        import torch

        shape = list(self.data.shape)
        shape[3] = max(tokens, 2 * self.capacity)
        grown = torch.empty(shape, dtype=self.data.dtype, device=self.data.device)
        grown[:, :, :, : self.length] = self.data[:, :, :, : self.length]
        self.data = grown

    def filled(self) -> Any:
        """A view of the filled positions."""
        return self.data[:, :, :, : self.length]


@dataclasses.dataclass
class Segment:
    """The rows one request contributes to a packed pass: ``tokens`` (1-D token ids) appended
    after the ``cache.length`` positions already in its cache. ``logits``: which rows' logits to
    return — ``"last"`` (the next-token prediction), ``"all"`` or ``"none"``."""

    cache: KVCache
    tokens: Any
    logits: str = "last"

    def __post_init__(self) -> None:
        if self.logits not in ("last", "all", "none"):
            raise ValueError(f"Segment.logits must be 'last', 'all' or 'none', got {self.logits!r}")
        if self.tokens.dim() != 1 or self.tokens.numel() < 1:
            raise ValueError("Segment.tokens must be a non-empty 1-D tensor of token ids")


def _rotate_half(x: Any) -> Any:
    import torch

    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class PackedModel:
    """Runs packed passes over ``model`` (a ``*ForCausalLM`` of a supported architecture).

    Uses the model's own modules for the norms, projections, MLP and rotary embedding, so every
    constant (``rms_norm_eps``, ``rope_theta``, scaling) is the model's; only the attention over
    the per-request caches is done here.

    Raises:
        ValueError: for an unsupported architecture or a sliding-window configuration.
    """

    def __init__(self, model: Any) -> None:
        config = model.config
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"packed pass supports model_type {', '.join(SUPPORTED_MODEL_TYPES)}; "
                f"got {model_type!r}"
            )
        layer_types = getattr(config, "layer_types", None) or ()
        if getattr(config, "use_sliding_window", False) or "sliding_attention" in layer_types:
            raise ValueError("packed pass does not support sliding-window attention layers")
        self.model = model
        self.config = config
        self.layers = list(model.model.layers)
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(getattr(config, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        self.scaling = self.head_dim**-0.5
        first = self.layers[0].self_attn.q_proj.weight
        self.device = first.device
        self.dtype = first.dtype

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def kv_bytes_per_token(self) -> int:
        element = self.layers[0].self_attn.k_proj.weight.element_size()
        return self.num_layers * self.num_kv_heads * self.head_dim * 2 * element

    def new_cache(self, capacity: int, *, shared: bool = False) -> KVCache:
        """An empty cache with room for ``capacity`` positions (in shared memory if asked)."""
        import torch

        shape = (self.num_layers, 2, self.num_kv_heads, max(1, capacity), self.head_dim)
        data = torch.empty(shape, dtype=self.dtype, device=self.device)  # only [:length] is read
        if shared:
            data.share_memory_()
        return KVCache(data)

    def forward(self, segments: Sequence[Segment]) -> list[Any]:
        """One packed pass. Appends each segment's rows to its cache and returns, per segment,
        its logits as asked (``[vocab]`` for ``"last"``, ``[rows, vocab]`` for ``"all"``, None).
        """
        import torch

        if not segments:
            raise ValueError("a packed pass needs at least one segment")
        if len({id(s.cache) for s in segments}) != len(segments):
            raise ValueError("each segment of a pass must have its own cache")
        with torch.inference_mode():
            bounds: list[tuple[int, int, int]] = []  # (first row, rows, cached positions)
            offset = 0
            positions = []
            for s in segments:
                n = int(s.tokens.numel())
                s.cache.reserve(s.cache.length + n)
                bounds.append((offset, n, s.cache.length))
                positions.append(torch.arange(s.cache.length, s.cache.length + n))
                offset += n
            ids = torch.cat([s.tokens.to(self.device) for s in segments])
            inner = self.model.model
            h = inner.embed_tokens(ids)
            cos, sin = inner.rotary_emb(h[None], torch.cat(positions).to(self.device)[None])
            rope = (cos[0][:, None, :], sin[0][:, None, :])
            masks = [self._mask(n, cached) for _, n, cached in bounds]
            for index, layer in enumerate(self.layers):
                x = layer.input_layernorm(h)
                h = h + self._attention(index, layer.self_attn, x, rope, segments, bounds, masks)
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            for s, (_, n, _) in zip(segments, bounds):  # noqa: B905
                s.cache.length += n
            return self._logits(h, segments, bounds)

    def _attention(
        self,
        index: int,
        attn: Any,
        x: Any,
        rope: tuple[Any, Any],
        segments: Sequence[Segment],
        bounds: Sequence[tuple[int, int, int]],
        masks: Sequence[Any],
    ) -> Any:
        """Layer ``index``'s attention output for every row: q/k/v over all rows at once, the
        new keys and values written into each segment's cache, attention per segment."""
        import torch
        import torch.nn.functional as F

        rows = x.shape[0]
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        q = attn.q_proj(x).view(rows, heads, dim)
        k = attn.k_proj(x).view(rows, kv_heads, dim)
        v = attn.v_proj(x).view(rows, kv_heads, dim)
        if getattr(attn, "q_norm", None) is not None:
            q = attn.q_norm(q)
            k = attn.k_norm(k)
        cos, sin = rope
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        out = torch.empty_like(q)
        for s, (first, n, cached), mask in zip(segments, bounds, masks):  # noqa: B905
            kv = s.cache.data[index]
            kv[0, :, cached : cached + n] = k[first : first + n].transpose(0, 1)
            kv[1, :, cached : cached + n] = v[first : first + n].transpose(0, 1)
            keys = kv[0, :, : cached + n]
            values = kv[1, :, : cached + n]
            if heads != kv_heads:
                keys = keys.repeat_interleave(heads // kv_heads, dim=0)
                values = values.repeat_interleave(heads // kv_heads, dim=0)
            query = q[first : first + n].transpose(0, 1)
            # 4-D inputs: with 3-D ones CPU SDPA falls back to its slow math kernel.
            o = F.scaled_dot_product_attention(
                query[None],
                keys[None],
                values[None],
                attn_mask=mask,
                is_causal=mask is None and n > 1,
                scale=self.scaling,
            )
            out[first : first + n] = o[0].transpose(0, 1)
        return attn.o_proj(out.reshape(rows, heads * dim))

    def _logits(
        self, h: Any, segments: Sequence[Segment], bounds: Sequence[tuple[int, int, int]]
    ) -> list[Any]:
        """Per segment, the logits it asked for (one lm_head call over every row wanted)."""
        import torch

        wanted = [
            (i, first + n - 1 if s.logits == "last" else slice(first, first + n))
            for i, (s, (first, n, _)) in enumerate(zip(segments, bounds))  # noqa: B905
            if s.logits != "none"
        ]
        results: list[Any] = [None] * len(segments)
        if not wanted:
            return results
        picked = [
            torch.arange(sel.start, sel.stop) if isinstance(sel, slice) else torch.tensor([sel])
            for _, sel in wanted
        ]
        logits = self.model.lm_head(self.model.model.norm(h[torch.cat(picked).to(self.device)]))
        at = 0
        for (i, sel), chosen in zip(wanted, picked):  # noqa: B905
            block = logits[at : at + len(chosen)]
            results[i] = block[0] if not isinstance(sel, slice) else block
            at += len(chosen)
        return results

    def _mask(self, n: int, cached: int) -> Any:
        """Boolean attention mask of ``n`` new rows over ``cached + n`` keys (None when SDPA's
        own causal flag or no mask is exact)."""
        if n == 1 or cached == 0:
            return None
        import torch

        keys = torch.arange(cached + n, device=self.device)
        limit = cached + torch.arange(n, device=self.device)
        return keys[None, :] <= limit[:, None]


class PackedRunner:
    """The operations a calibration times, done with the engine's packed pass (the calibrator's
    runner interface: ``time_prefill``, ``time_decode``; plus ``time_chunk`` and
    ``time_fused``). Decode rows are one segment each, as the engine runs them; ``seed`` fixes
    every input token."""

    name = "engine packed pass"

    def __init__(self, model: Any, *, seed: int = 0) -> None:
        import torch

        self.packed = model if isinstance(model, PackedModel) else PackedModel(model)
        self.seed = seed
        self.vocab = int(self.packed.config.vocab_size)
        self._generator = torch.Generator().manual_seed(seed)
        device = self.packed.device
        if device.type == "cuda":
            self._sync = lambda: torch.cuda.synchronize(device)
        else:
            self._sync = lambda: None

    def tokens(self, length: int) -> Any:
        import torch

        return torch.randint(0, self.vocab, (length,), generator=self._generator)

    def synthetic_cache(self, length: int, room: int) -> KVCache:
        """A cache holding ``length`` positions of random values, with ``room`` more free."""
        import torch

        cache = self.packed.new_cache(length + room)
        if length:
            tile = min(length, 256)  # values do not matter for timing; fill cheaply
            block = torch.randn(cache.data[:, :, :, :tile].shape, generator=self._generator)
            block = block.to(device=cache.data.device, dtype=cache.data.dtype)
            for at in range(0, length, tile):
                n = min(tile, length - at)
                cache.data[:, :, :, at : at + n] = block[:, :, :, :n]
        cache.length = length
        return cache

    def _measure(self, fn: Any, repeats: int, warmup: int, setup: Any = None) -> Any:
        import torch

        from pytest_prefill.measure.timing import measure

        torch.manual_seed(self.seed)
        with torch.inference_mode():
            return measure(fn, repeats=repeats, warmup=warmup, sync=self._sync, setup=setup)

    def time_fused(
        self,
        tokens: int,
        context: int,
        cache_lengths: Sequence[int],
        *,
        repeats: int,
        warmup: int,
        last_chunk: bool = False,
    ) -> Any:
        """One pass of a ``tokens``-token prompt piece over ``context`` cached positions (none
        when ``tokens`` is 0) plus one decode row per entry of ``cache_lengths``. A prompt's
        last piece also computes its next-token logits (``last_chunk``), as the engine does."""
        import torch

        rows = [self.synthetic_cache(n, 1) for n in cache_lengths]
        row_ids = [torch.tensor([t]) for t in self.tokens(len(rows)).tolist()]
        chunk = self.synthetic_cache(context, tokens) if tokens else None
        chunk_ids = self.tokens(tokens) if tokens else None
        if chunk is None and not rows:
            raise ValueError("a pass needs prompt tokens or decode rows")

        def setup() -> None:
            for cache, n in zip(rows, cache_lengths):  # noqa: B905
                cache.length = n
            if chunk is not None:
                chunk.length = context

        def one_pass() -> None:
            segments = []
            if chunk is not None:
                segments.append(Segment(chunk, chunk_ids, "last" if last_chunk else "none"))
            segments += [Segment(c, t) for c, t in zip(rows, row_ids)]  # noqa: B905
            logits = self.packed.forward(segments)
            picked = [x for x in logits if x is not None]
            if picked:
                torch.stack(picked).argmax(dim=-1).tolist()  # the engine reads its tokens

        return self._measure(one_pass, repeats, warmup, setup)

    def time_prefill(self, tokens: int, *, repeats: int, warmup: int) -> Any:
        """A whole prompt of ``tokens`` tokens into a fresh cache."""
        return self.time_fused(tokens, 0, (), repeats=repeats, warmup=warmup, last_chunk=True)

    def time_chunk(self, tokens: int, context: int, *, repeats: int, warmup: int) -> Any:
        """A ``tokens``-token chunk over ``context`` cached positions (not the prompt's last)."""
        return self.time_fused(tokens, context, (), repeats=repeats, warmup=warmup)

    def time_decode(self, cache_lengths: Sequence[int], *, repeats: int, warmup: int) -> Any:
        """A decode step of one row per entry of ``cache_lengths``."""
        if len(cache_lengths) == 0:
            raise ValueError("cache_lengths must name at least one sequence")
        return self.time_fused(0, 0, cache_lengths, repeats=repeats, warmup=warmup)

    def time_gaps(
        self, prompt_len: int, chunk: int, stream_context: int, *, repeats: int, warmup: int
    ) -> dict[str, Any]:
        """A live stream's gap between two tokens on the engine, as Measurements: ``baseline``
        (its decode step alone), ``shared`` (behind a whole ``prompt_len`` prefill pass) and
        ``fused`` (one pass fusing its decode row with the prompt's last ``chunk`` tokens)."""
        import torch

        chunk = min(chunk, prompt_len)
        stream = self.synthetic_cache(stream_context, 1)
        token = torch.tensor([int(self.tokens(1)[0])])
        prompt = self.tokens(prompt_len)

        def rewind() -> None:
            stream.length = stream_context

        def shared_gap() -> None:
            cache = self.packed.new_cache(prompt_len)
            self.packed.forward([Segment(cache, prompt)])
            self.packed.forward([Segment(stream, token)])

        return {
            "baseline": self.time_decode([stream_context], repeats=repeats, warmup=warmup),
            "shared": self._measure(shared_gap, repeats, warmup, rewind),
            "fused": self.time_fused(
                chunk,
                prompt_len - chunk,
                [stream_context],
                repeats=repeats,
                warmup=warmup,
                last_chunk=True,
            ),
        }


def calibration_runner(loaded: Any, *, seed: int = 0, packed: bool | None = None) -> Any:
    """The runner a calibration times with: the engine's packed pass when the architecture
    has one (it also times fused passes, for ``fusion_penalty``), else None -- the
    calibrator's own default, the Hugging Face forward. ``packed`` forces one or the other.
    The CLI and the plugin both call this, so they calibrate the same way.

    Raises:
        ValueError: when ``packed`` is True for an architecture the packed pass lacks.
    """
    supported = getattr(getattr(loaded, "config", None), "model_type", None) in (
        SUPPORTED_MODEL_TYPES
    )
    if packed is None:
        packed = supported
    return PackedRunner(loaded.model, seed=seed) if packed else None
