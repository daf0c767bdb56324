"""A packed forward pass over a Hugging Face Qwen3 / Llama model's own weights: one pass takes rows
from several requests (prompt chunks and decode rows), runs the linear layers over all rows at once
and attention per request over that request's own KV cache. torch is imported lazily."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
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

        Prompt pieces (segments of two or more tokens) attend one SDPA call each, causal from
        the bottom right (a whole prompt and a chunk over a cache take the same kernel family);
        one-token segments (decode rows) attend together in one batched SDPA call per layer
        (:class:`DecodeBatch`). Grouped-query attention is SDPA's own (``enable_gqa``): the
        cache is never copied per head.
        """
        import torch

        if not segments:
            raise ValueError("a packed pass needs at least one segment")
        if len({id(s.cache) for s in segments}) != len(segments):
            raise ValueError("each segment of a pass must have its own cache")
        # pieces first, then the decode rows: the rows are one contiguous block of the pass
        order = [i for i, s in enumerate(segments) if s.tokens.numel() > 1]
        order += [i for i, s in enumerate(segments) if s.tokens.numel() == 1]
        with torch.inference_mode():
            bounds: dict[int, tuple[int, int, int]] = {}  # (first row, rows, cached positions)
            offset = 0
            for i in order:
                s = segments[i]
                n = int(s.tokens.numel())
                s.cache.reserve(s.cache.length + n)
                bounds[i] = (offset, n, s.cache.length)
                offset += n
            pieces = [(segments[i], bounds[i]) for i in order if bounds[i][1] > 1]
            singles = [segments[i] for i in order if bounds[i][1] == 1]
            rows = DecodeBatch(self, singles, offset - len(singles))
            positions = [
                torch.arange(cached, cached + n, device=self.device) for _, (_, n, cached) in pieces
            ]
            ids = torch.cat([segments[i].tokens.to(self.device) for i in order])
            inner = self.model.model
            h = inner.embed_tokens(ids)
            cos, sin = inner.rotary_emb(h[None], torch.cat([*positions, rows.positions])[None])
            rope = (cos[0][:, None, :], sin[0][:, None, :])
            for index, layer in enumerate(self.layers):
                x = layer.input_layernorm(h)
                h = h + self._attention(index, layer.self_attn, x, rope, pieces, rows)
                h = h + layer.mlp(layer.post_attention_layernorm(h))
            rows.write_back()
            for i in order:
                segments[i].cache.length += bounds[i][1]
            return self._logits(h, segments, bounds)

    def _attention(
        self,
        index: int,
        attn: Any,
        x: Any,
        rope: tuple[Any, Any],
        pieces: Sequence[tuple[Segment, tuple[int, int, int]]],
        rows: DecodeBatch,
    ) -> Any:
        """Layer ``index``'s attention output for every row: q/k/v over all rows at once, each
        prompt piece's keys and values written into its cache and attended per piece, the
        decode rows' attended together."""
        import torch
        import torch.nn.functional as F

        total = x.shape[0]
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        q = attn.q_proj(x).view(total, heads, dim)
        k = attn.k_proj(x).view(total, kv_heads, dim)
        v = attn.v_proj(x).view(total, kv_heads, dim)
        if getattr(attn, "q_norm", None) is not None:
            q = attn.q_norm(q)
            k = attn.k_norm(k)
        cos, sin = rope
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        out = torch.empty_like(q)
        for s, (first, n, cached) in pieces:
            kv = s.cache.data[index]
            kv[0, :, cached : cached + n] = k[first : first + n].transpose(0, 1)
            kv[1, :, cached : cached + n] = v[first : first + n].transpose(0, 1)
            # 4-D inputs: with 3-D ones CPU SDPA falls back to its slow math kernel.
            o = F.scaled_dot_product_attention(
                q[first : first + n].transpose(0, 1)[None],
                kv[0, :, : cached + n][None],
                kv[1, :, : cached + n][None],
                attn_mask=causal_bias(n, cached + n),
                scale=self.scaling,
                enable_gqa=heads != kv_heads,
            )
            out[first : first + n] = o[0].transpose(0, 1)
        if rows.count:
            out[rows.first :] = rows.attend(
                index, q[rows.first :], k[rows.first :], v[rows.first :]
            )
        return attn.o_proj(out.reshape(total, heads * dim))

    def _logits(
        self, h: Any, segments: Sequence[Segment], bounds: Mapping[int, tuple[int, int, int]]
    ) -> list[Any]:
        """Per segment, the logits it asked for (one lm_head call over every row wanted; the
        rows are picked by slicing, so no index crosses from the host)."""
        import torch

        wanted = [
            (i, bounds[i][0] + bounds[i][1] - 1 if s.logits == "last" else bounds[i][0])
            for i, s in enumerate(segments)
            if s.logits != "none"
        ]
        results: list[Any] = [None] * len(segments)
        if not wanted:
            return results
        spans = [(at, 1 if segments[i].logits == "last" else bounds[i][1]) for i, at in wanted]
        picked = torch.cat([h[at : at + n] for at, n in spans])
        logits = self.model.lm_head(self.model.model.norm(picked))
        at = 0
        for (i, _), (_, n) in zip(wanted, spans):  # noqa: B905
            block = logits[at : at + n]
            results[i] = block[0] if segments[i].logits == "last" else block
            at += n
        return results


def causal_bias(rows: int, keys: int) -> Any:
    """Causal attention of ``rows`` new rows over ``keys`` keys, aligned at the bottom right
    (the last row sees every key): SDPA's own bias, so a whole prompt (``rows == keys``) and a
    chunk over a cache dispatch to the same fused kernels and no mask is materialised."""
    from torch.nn.attention.bias import causal_lower_right

    return causal_lower_right(rows, keys)


class DecodeBatch:
    """A pass's decode rows (one-token segments, the pass's last ``count`` rows from ``first``),
    attended together: each row's filled cache is gathered once per pass into one zero-padded
    ``[layer, K/V, row, kv_head, position, dim]`` tensor, each layer writes the rows' new keys
    and values into it with one indexed store and attends with one masked SDPA call, and the
    new positions are written back to the caches once after the last layer. The gather costs a
    read of the rows' caches per pass (device memory); it replaces a Python loop of ~8 calls
    per row per layer (host dispatch, which bounds an eager engine's short passes)."""

    def __init__(self, packed: PackedModel, segments: Sequence[Segment], first: int) -> None:
        import torch

        self.packed = packed
        self.segments = list(segments)
        self.count = len(self.segments)
        self.first = first
        device = packed.device
        lengths = [s.cache.length for s in self.segments]
        self.positions = torch.tensor(lengths, dtype=torch.long, device=device)
        if not self.count:
            return
        keys = max(lengths) + 1
        shape = (packed.num_layers, 2, self.count, packed.num_kv_heads, keys, packed.head_dim)
        self.kv = torch.zeros(shape, dtype=packed.dtype, device=device)  # padding must be finite
        for i, (s, n) in enumerate(zip(self.segments, lengths)):  # noqa: B905
            if n:
                self.kv[:, :, i, :, :n] = s.cache.data[:, :, :, :n]
        self.rows = torch.arange(self.count, device=device)
        span = torch.arange(keys, device=device)
        self.mask = (span[None, :] <= self.positions[:, None])[:, None, None, :]

    def attend(self, index: int, q: Any, k: Any, v: Any) -> Any:
        """Layer ``index``: store the rows' new keys and values, attend; ``[rows, heads, dim]``."""
        import torch.nn.functional as F

        packed = self.packed
        layer = self.kv[index]
        layer[0, self.rows, :, self.positions] = k
        layer[1, self.rows, :, self.positions] = v
        # GQA without copying the cache: a row's query heads that share a KV head are that
        # head's query rows (head h reads KV head h // group), all under the row's one mask;
        # a masked SDPA call takes no enable_gqa on CUDA's fused kernels, this needs none.
        group = packed.num_heads // packed.num_kv_heads
        query = q.reshape(self.count, packed.num_kv_heads, group, packed.head_dim)
        o = F.scaled_dot_product_attention(
            query, layer[0], layer[1], attn_mask=self.mask, scale=packed.scaling
        )
        return o.reshape(self.count, packed.num_heads, packed.head_dim)

    def write_back(self) -> None:
        """Each row's new position, every layer's, into its own cache."""
        for i, s in enumerate(self.segments):
            n = s.cache.length
            s.cache.data[:, :, :, n] = self.kv[:, :, i, :, n]


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

        device = self.packed.device  # every input is on the device before anything is timed
        rows = [self.synthetic_cache(n, 1) for n in cache_lengths]
        row_ids = [torch.tensor([t], device=device) for t in self.tokens(len(rows)).tolist()]
        chunk = self.synthetic_cache(context, tokens) if tokens else None
        chunk_ids = self.tokens(tokens).to(device) if tokens else None
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
            if picked:  # the engine's next tokens, picked on the device; the timer's closing
                torch.stack(picked).argmax(dim=-1)  # sync waits for them (the read is ~us)

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
        token = torch.tensor([int(self.tokens(1)[0])], device=self.packed.device)
        prompt = self.tokens(prompt_len).to(self.packed.device)

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
