"""Model presets and the loader: exact shapes, defaults, offline-only loading, clear errors."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from pytest_prefill.measure.models import (  # noqa: E402
    MODEL_PRESETS,
    LoadedModel,
    kv_bytes_per_token,
    load_model,
    preset_config,
    validate_device,
    validate_dtype,
)
from pytest_prefill.sim import PRESETS  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def one_thread(one_torch_thread):
    return None


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    return load_model("tiny", device="cpu")


def test_importing_the_package_imports_no_heavy_library():
    code = (
        "import sys, pytest_prefill, pytest_prefill.cli; pytest_prefill.cli.build_parser(); "
        "print([m for m in ('torch', 'numpy', 'transformers') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_qwen3_preset_has_the_published_shapes():
    config = preset_config("qwen3-0.6b")
    assert (
        config.hidden_size,
        config.num_hidden_layers,
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
        config.intermediate_size,
        config.vocab_size,
    ) == (1024, 28, 16, 8, 128, 3072, 151936)
    assert config.tie_word_embeddings is True


def test_qwen3_kv_bytes_match_the_simulator_preset():
    # DESIGN.md: 28 layers x 8 KV heads x 128 head dim x 2 (K and V) x 2 bytes (bf16)
    expected = 28 * 8 * 128 * 2 * 2
    assert kv_bytes_per_token(preset_config("qwen3-0.6b"), 2) == expected
    assert PRESETS["lab-laptop"].cost.kv_bytes_per_token == expected


def test_tiny_is_a_small_qwen3():
    config = preset_config("tiny")
    assert config.model_type == "qwen3"
    assert 2 <= config.num_hidden_layers <= 4
    assert set(MODEL_PRESETS) >= {"qwen3-0.6b", "tiny"}


def test_tiny_loads_with_cpu_defaults(tiny):
    assert tiny.name == "tiny"
    assert str(tiny.device) == "cpu" and tiny.dtype == torch.float32
    assert tiny.dtype_name == "float32"
    assert not tiny.model.training
    assert "random weights" in tiny.source
    assert tiny.kv_bytes_per_token == kv_bytes_per_token(tiny.config, 4)
    assert tiny.max_context == tiny.config.max_position_embeddings
    assert next(tiny.model.parameters()).dtype == torch.float32


def test_dtype_is_honoured():
    half = load_model("tiny", device="cpu", dtype="bf16")
    assert half.dtype == torch.bfloat16
    assert next(half.model.parameters()).dtype == torch.bfloat16
    assert half.kv_bytes_per_token == kv_bytes_per_token(half.config, 2)


def test_the_same_preset_gets_the_same_weights(tiny):
    again = load_model("tiny", device="cpu")
    for a, b in zip(tiny.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_local_directory_loads_offline(tiny, tmp_path):
    tiny.model.save_pretrained(tmp_path)
    loaded = load_model(str(tmp_path), device="cpu")
    assert str(tmp_path) in loaded.source
    assert loaded.kv_bytes_per_token == tiny.kv_bytes_per_token
    ids = torch.arange(8).reshape(1, 8)
    with torch.inference_mode():
        assert torch.allclose(loaded.model(input_ids=ids).logits, tiny.model(input_ids=ids).logits)


def test_a_missing_model_names_where_it_looked():
    with pytest.raises(ValueError, match="looked in") as err:
        load_model("nobody/no-such-model", device="cpu")
    assert "downloads are off" in str(err.value)


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "", "CPU"])
def test_bad_devices_are_refused(device):
    with pytest.raises(ValueError, match="device"):
        validate_device(device)
    with pytest.raises(ValueError, match="device"):
        load_model("tiny", device=device)


def test_cuda_asked_for_where_there_is_none():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ValueError, match="CUDA is not available"):
        load_model("tiny", device="cuda")


@pytest.mark.parametrize("spec", ["", "   ", None])
def test_empty_model_spec_is_refused(spec):
    with pytest.raises(ValueError, match="preset"):
        load_model(spec)


def test_bad_dtype_is_refused():
    assert validate_dtype("BF16") == "bfloat16"
    with pytest.raises(ValueError, match="dtype"):
        load_model("tiny", device="cpu", dtype="int8")


def test_running_the_model_raises_no_deprecation_warning(tiny):
    from pytest_prefill.measure.runner import DecodeBatch, ModelRunner

    runner = ModelRunner(tiny)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        _, cache = runner.prefill(runner.tokens(8))
        runner.decode(DecodeBatch(cache, [8]), runner.tokens(1))
