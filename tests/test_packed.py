"""The packed pass gives the Hugging Face model's own logits: whole prompts, prompts fed in chunks,
and mixed passes of chunks and decode rows (float32 on CPU, tiny random models)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from pytest_prefill.lab.packed import KVCache, PackedModel, Segment  # noqa: E402

TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}  # float32; observed differences are ~1e-6


def _config(kind: str, **overrides):
    common = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=112,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=5000.0,
        initializer_range=0.2,  # large enough that logits differ visibly between positions
        attn_implementation="eager",
    )
    common.update(overrides)
    if kind == "qwen3":
        return transformers.Qwen3Config(head_dim=16, **common)
    return transformers.LlamaConfig(**common)


def _model(kind: str = "qwen3", **overrides):
    torch.manual_seed(0)
    config = _config(kind, **overrides)
    cls = transformers.Qwen3ForCausalLM if kind == "qwen3" else transformers.LlamaForCausalLM
    return cls(config).eval()


@pytest.fixture(scope="module")
def qwen3():
    return _model("qwen3")


def _reference(model, ids):
    with torch.inference_mode():
        return model(ids[None]).logits[0]


def _prompt(length: int, seed: int, vocab: int = 97):
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed))


def test_qwen3_has_its_distinctive_parts(qwen3):
    attn = qwen3.model.layers[0].self_attn
    assert attn.q_norm is not None and attn.k_norm is not None
    assert qwen3.config.num_key_value_heads < qwen3.config.num_attention_heads  # GQA


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_whole_prompts_in_one_pass_match_hf(kind):
    model = _model(kind)
    packed = PackedModel(model)
    prompts = [_prompt(n, seed) for seed, n in enumerate((1, 5, 33, 64))]
    caches = [packed.new_cache(len(p)) for p in prompts]
    logits = packed.forward([Segment(c, p, "all") for c, p in zip(caches, prompts)])  # noqa: B905
    for p, c, got in zip(prompts, caches, logits):  # noqa: B905
        torch.testing.assert_close(got, _reference(model, p), **TOLERANCE)
        assert c.length == len(p)


@pytest.mark.parametrize("chunk", [1, 7, 16, 50])
def test_prompt_fed_in_chunks_matches_hf(qwen3, chunk):
    packed = PackedModel(qwen3)
    prompt = _prompt(50, seed=chunk)
    cache = packed.new_cache(4)  # deliberately too small: the cache must grow
    pieces = []
    for start in range(0, len(prompt), chunk):
        pieces.append(packed.forward([Segment(cache, prompt[start : start + chunk], "all")])[0])
    torch.testing.assert_close(torch.cat(pieces), _reference(qwen3, prompt), **TOLERANCE)
    assert cache.length == len(prompt) and cache.capacity >= len(prompt)


def test_chunked_cache_equals_unchunked_cache(qwen3):
    packed = PackedModel(qwen3)
    prompt = _prompt(40, seed=3)
    whole, pieces = packed.new_cache(40), packed.new_cache(40)
    packed.forward([Segment(whole, prompt, "none")])
    for start in range(0, 40, 9):
        packed.forward([Segment(pieces, prompt[start : start + 9], "none")])
    torch.testing.assert_close(pieces.filled(), whole.filled(), **TOLERANCE)


def test_mixed_passes_of_chunks_and_decode_rows_match_hf(qwen3):
    """Two requests decode greedily while a third's prompt is fed in chunks in the same passes;
    every row's logits equal the HF model's over that request's whole token sequence."""
    packed = PackedModel(qwen3)
    live = [_prompt(n, seed) for seed, n in ((10, 12), (11, 30))]
    caches = [packed.new_cache(64) for _ in live]
    firsts = packed.forward([Segment(c, p, "last") for c, p in zip(caches, live)])  # noqa: B905
    sequences = [list(p.tolist()) + [int(f.argmax())] for p, f in zip(live, firsts)]  # noqa: B905
    decode_logits: list[list] = [[], []]
    newcomer = _prompt(45, seed=12)
    new_cache = packed.new_cache(45)
    chunk_logits = []
    for start in range(0, 45, 10):
        segments = [
            Segment(c, torch.tensor([seq[-1]]), "last")
            for c, seq in zip(caches, sequences)  # noqa: B905
        ]
        segments.append(Segment(new_cache, newcomer[start : start + 10], "all"))
        out = packed.forward(segments)
        for i in range(2):
            decode_logits[i].append(out[i])
            sequences[i].append(int(out[i].argmax()))
        chunk_logits.append(out[2])
    torch.testing.assert_close(torch.cat(chunk_logits), _reference(qwen3, newcomer), **TOLERANCE)
    for i, prompt in enumerate(live):
        full = torch.tensor(sequences[i][:-1])
        ref = _reference(qwen3, full)
        steps = len(decode_logits[i])
        torch.testing.assert_close(torch.stack(decode_logits[i]), ref[-steps:], **TOLERANCE)
        assert caches[i].length == len(prompt) + steps


def test_multi_head_attention_without_gqa():
    model = _model("qwen3", num_key_value_heads=4)
    packed = PackedModel(model)
    prompt = _prompt(20, seed=5)
    cache = packed.new_cache(20)
    first = packed.forward([Segment(cache, prompt[:8], "all")])[0]
    rest = packed.forward([Segment(cache, prompt[8:], "all")])[0]
    torch.testing.assert_close(torch.cat([first, rest]), _reference(model, prompt), **TOLERANCE)


def test_kv_bytes_per_token_follows_the_config(qwen3):
    packed = PackedModel(qwen3)
    config = qwen3.config
    expected = config.num_hidden_layers * config.num_key_value_heads * config.head_dim * 2 * 4
    assert packed.kv_bytes_per_token == expected


def test_unsupported_architecture_is_refused():
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50)
    with pytest.raises(ValueError, match="model_type"):
        PackedModel(transformers.GPT2LMHeadModel(config))


def test_bad_segments_are_refused(qwen3):
    packed = PackedModel(qwen3)
    cache = packed.new_cache(8)
    with pytest.raises(ValueError, match="logits"):
        Segment(cache, torch.tensor([1]), "first")
    with pytest.raises(ValueError, match="tokens"):
        Segment(cache, torch.tensor([], dtype=torch.long))
    with pytest.raises(ValueError, match="own cache"):
        packed.forward([Segment(cache, torch.tensor([1])), Segment(cache, torch.tensor([2]))])
    with pytest.raises(ValueError, match="segment"):
        packed.forward([])
    with pytest.raises(ValueError, match="length"):
        KVCache(cache.data, length=cache.capacity + 1)


def test_packed_runner_times_every_operation_the_calibrator_asks_for(qwen3):
    from pytest_prefill.lab.packed import PackedRunner

    runner = PackedRunner(qwen3, seed=1)
    for m in (
        runner.time_prefill(16, repeats=2, warmup=1),
        runner.time_chunk(8, 24, repeats=2, warmup=0),
        runner.time_decode([5, 30], repeats=2, warmup=0),
        runner.time_fused(8, 24, [5, 30], repeats=2, warmup=0, last_chunk=True),
    ):
        assert m.repeats == 2 and m.minimum > 0
    gaps = runner.time_gaps(40, 16, 12, repeats=2, warmup=0)
    assert set(gaps) == {"baseline", "shared", "fused"}
    with pytest.raises(ValueError, match="prompt tokens or decode rows"):
        runner.time_fused(0, 0, [], repeats=1, warmup=0)


def test_synthetic_cache_holds_its_length_and_room(qwen3):
    from pytest_prefill.lab.packed import PackedRunner

    cache = PackedRunner(qwen3).synthetic_cache(300, 7)
    assert cache.length == 300 and cache.capacity == 307
    assert torch.isfinite(cache.filled()).all()


class _SdpaCalls(torch.overrides.TorchFunctionMode):
    """Records each SDPA call's (query shape, key shape, mask type, enable_gqa)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            mask = kwargs.get("attn_mask")
            self.calls.append(
                (args[0].shape, args[1].shape, type(mask).__name__, kwargs.get("enable_gqa"))
            )
        return func(*args, **kwargs)


def test_decode_rows_attend_in_one_call_per_layer_and_gqa_copies_no_cache(qwen3, monkeypatch):
    """Rows of different cache lengths, listed around a prompt piece, give the HF logits; the
    pass makes one SDPA call per piece and one for all the rows per layer, with SDPA's own GQA
    (no repeat_interleave of the cache) and the bottom-right causal bias for every piece."""
    packed = PackedModel(qwen3)
    lengths = (3, 17, 9, 30)
    prompts = [_prompt(n, seed) for seed, n in enumerate(lengths)]
    caches = [packed.new_cache(n + 1) for n in lengths]
    firsts = packed.forward([Segment(c, p, "last") for c, p in zip(caches, prompts)])  # noqa: B905
    nexts = [int(f.argmax()) for f in firsts]
    newcomer = _prompt(12, seed=40)
    fresh = packed.new_cache(12)
    segments = [Segment(c, torch.tensor([t]), "last") for c, t in zip(caches, nexts)]  # noqa: B905
    segments.insert(2, Segment(fresh, newcomer, "all"))
    monkeypatch.setattr(
        torch.Tensor, "repeat_interleave", lambda *a, **k: pytest.fail("the cache was copied")
    )
    with _SdpaCalls() as spy:
        out = packed.forward(segments)
    monkeypatch.undo()
    layers, heads = qwen3.config.num_hidden_layers, qwen3.config.num_attention_heads
    kv_heads = qwen3.config.num_key_value_heads
    assert len(spy.calls) == layers * 2  # the piece, and every row at once
    piece, rows = spy.calls[:2]
    assert piece[2] == "CausalBias" and piece[3] is True  # SDPA's own GQA
    assert rows[2] == "Tensor" and rows[0][:3] == (len(lengths), kv_heads, heads // kv_heads)
    torch.testing.assert_close(out[2], _reference(qwen3, newcomer), **TOLERANCE)
    rows = [x for i, x in enumerate(out) if i != 2]
    for prompt, token, got, cache in zip(prompts, nexts, rows, caches):  # noqa: B905
        full = torch.cat([prompt, torch.tensor([token])])
        torch.testing.assert_close(got, _reference(qwen3, full)[-1], **TOLERANCE)
        assert cache.length == len(full)


def test_a_whole_prompt_and_a_chunk_over_a_cache_use_the_same_causal_bias(qwen3):
    packed = PackedModel(qwen3)
    cache = packed.new_cache(40)
    with _SdpaCalls() as spy:
        packed.forward([Segment(cache, _prompt(24, seed=1), "none")])  # whole prompt
        packed.forward([Segment(cache, _prompt(16, seed=2), "none")])  # a chunk over 24 cached
    assert {mask for _, _, mask, _ in spy.calls} == {"CausalBias"}
    assert len(spy.calls) == 2 * qwen3.config.num_hidden_layers
