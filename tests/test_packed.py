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
