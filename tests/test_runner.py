"""The model runner computes what the model computes: prefill + decode steps give the logits of
one full forward pass, a chunked prefill fills the same cache as an unchunked one, and a padded
batch decodes each row as if it were alone. Timed helpers are checked for shape, not speed."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from pytest_prefill.measure.models import load_model  # noqa: E402
from pytest_prefill.measure.runner import (  # noqa: E402
    DecodeBatch,
    ModelRunner,
    cache_length,
    layer_tensors,
    rewind,
)
from pytest_prefill.measure.timing import Measurement  # noqa: E402

ATOL = 1e-4  # float32 on CPU; different kernels (full vs cached attention) round differently


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_torch_thread):
    return None


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return ModelRunner(load_model("tiny", device="cpu"))


def full_logits(runner: ModelRunner, ids):
    with torch.inference_mode():
        return runner.model(input_ids=ids).logits


def test_prefill_then_decode_steps_match_one_full_forward(runner):
    ids = runner.tokens(40)
    expected = full_logits(runner, ids)
    logits, cache = runner.prefill(ids[:, :32], all_logits=True)
    assert torch.allclose(logits, expected[:, :32], atol=ATOL)
    batch = DecodeBatch(cache, [32])
    for position in range(32, 40):
        step = runner.decode(batch, ids[:, position : position + 1])
        assert torch.allclose(step[0, -1], expected[0, position], atol=ATOL)
    assert cache_length(cache) == 40


def test_prefill_returns_only_the_last_positions_logits_by_default(runner):
    logits, _ = runner.prefill(runner.tokens(12))
    assert logits.shape == (1, 1, runner.loaded.vocab_size)


@pytest.mark.parametrize("cuts", [(16,), (5, 17, 30), (1, 2, 3)])
def test_chunked_prefill_fills_the_same_cache(runner, cuts):
    ids = runner.tokens(37)
    whole_logits, whole = runner.prefill(ids)
    _, chunked = runner.prefill(ids[:, : cuts[0]])
    bounds = [*cuts, ids.shape[1]]
    for start, end in zip(bounds, bounds[1:], strict=False):
        last = runner.chunk(chunked, ids[:, start:end])
    assert cache_length(chunked) == cache_length(whole) == 37
    for (k1, v1), (k2, v2) in zip(layer_tensors(whole), layer_tensors(chunked), strict=True):
        assert k1.shape == k2.shape
        assert torch.allclose(k1, k2, atol=ATOL) and torch.allclose(v1, v2, atol=ATOL)
    assert torch.allclose(last[0, -1], whole_logits[0, -1], atol=ATOL)


def test_a_padded_batch_decodes_each_row_as_if_alone(runner):
    prompts = [runner.tokens(n) for n in (20, 7, 13)]
    caches = [runner.prefill(p)[1] for p in prompts]
    batch = runner.stack(caches)
    assert batch.lengths == (20, 7, 13) and batch.pad == (0, 13, 7)
    assert batch.kv_tokens == 40
    next_ids = runner.tokens(1, batch=3)
    logits = runner.decode(batch, next_ids)
    for row, prompt in enumerate(prompts):
        alone = full_logits(runner, torch.cat([prompt, next_ids[row : row + 1]], dim=1))
        assert torch.allclose(logits[row, -1], alone[0, -1], atol=ATOL)


def test_synthetic_caches_have_the_asked_lengths(runner):
    cache = runner.synthetic_cache(300, batch=2)
    layers, kv_heads, head_dim = (
        runner.loaded.config.num_hidden_layers,
        runner.loaded.config.num_key_value_heads,
        runner.loaded.config.head_dim,
    )
    tensors = layer_tensors(cache)
    assert len(tensors) == layers
    assert all(k.shape == (2, kv_heads, 300, head_dim) == v.shape for k, v in tensors)
    batch = runner.decode_batch([50, 300])
    assert batch.padded_length == 300 and batch.pad == (250, 0)


def test_rewind_returns_a_cache_to_its_length(runner):
    batch = runner.decode_batch([16])
    runner.decode(batch, runner.tokens(1))
    runner.decode(batch, runner.tokens(1))
    assert cache_length(batch.cache) == 18
    batch.rewind()
    assert cache_length(batch.cache) == 16
    with pytest.raises(ValueError, match="rewind"):
        rewind(batch.cache, 17)


def test_tokens_are_seeded():
    loaded = load_model("tiny", device="cpu")
    a, b = ModelRunner(loaded, seed=3), ModelRunner(loaded, seed=3)
    assert torch.equal(a.tokens(10, batch=2), b.tokens(10, batch=2))
    assert a.tokens(10).max() < loaded.vocab_size


def test_timed_helpers_return_measurements(runner):
    for m in (
        runner.time_prefill(16, repeats=2, warmup=1),
        runner.time_chunk(8, 24, repeats=2, warmup=0),
        runner.time_decode([8, 32], repeats=3, warmup=1),
    ):
        assert isinstance(m, Measurement)
        assert m.median > 0 and m.warmup in (0, 1)
    assert runner.time_decode([8], repeats=3, warmup=0).repeats == 3


@pytest.mark.parametrize("bad", [0, -3, 1.5, True])
def test_bad_lengths_are_refused(runner, bad):
    with pytest.raises(ValueError):
        runner.tokens(bad)
    with pytest.raises(ValueError):
        runner.decode_batch([bad])


def test_decode_checks_the_token_shape(runner):
    batch = runner.decode_batch([4, 4])
    with pytest.raises(ValueError, match="shape"):
        runner.decode(batch, runner.tokens(1))
