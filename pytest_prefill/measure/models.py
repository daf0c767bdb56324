"""The model under test: an architecture preset with random weights, a local directory, or an id
in the offline Hugging Face cache. Never downloads. torch and transformers are imported lazily."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
from typing import Any

from pytest_prefill.machine import check_device
from pytest_prefill.plan.model_spec import MEDIUM, QWEN3_06B, SMALL, TINY

# The Qwen3 architecture presets (plan/model_spec holds their shapes), built with random weights.
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "qwen3-0.6b": QWEN3_06B,
    "medium": MEDIUM,
    "small": SMALL,
    "tiny": TINY,
}
DEFAULT_MODEL = "qwen3-0.6b"  # what the plugin and every measuring command load unless told
MODEL_PRESET_SOURCES = {
    "qwen3-0.6b": "architecture preset: the exact Qwen3-0.6B shapes (hidden 1024, 28 layers, 16 "
    "attention heads, 8 KV heads, head dim 128, intermediate 3072, vocab 151,936, tied "
    "embeddings), random weights",
    "medium": "architecture preset: a 6-layer Qwen3 for the CPU's model-size transfer (hidden "
    "640, 10 attention heads, 5 KV heads, head dim 64, intermediate 1920, vocab 16,384), random "
    "weights",
    "small": "architecture preset: a 4-layer Qwen3 for CPU fidelity runs (hidden 384, 6 "
    "attention heads, 3 KV heads, head dim 64, intermediate 1152, vocab 8,192), random weights",
    "tiny": "architecture preset: a 2-layer Qwen3 for CI (hidden 64, 4 heads, 2 KV heads, head "
    "dim 16, vocab 1,024), random weights",
}

DTYPES = {
    "float32": "float32",
    "fp32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
}
_SEED = 0


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """A causal LM ready to run, and where it came from.

    ``device`` is a ``torch.device``, ``dtype`` a ``torch.dtype``; ``source`` is one line
    saying how the model was built; ``kv_bytes_per_token`` is the KV cache one token occupies
    across all layers in ``dtype``; ``max_context`` is the longest sequence the config allows.
    """

    model: Any
    config: Any
    name: str
    device: Any
    dtype: Any
    source: str
    kv_bytes_per_token: int
    max_context: int

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)


def validate_device(device: str) -> str:
    """Return ``device`` if it is ``cpu``, ``cuda`` or ``cuda:N``; else raise ValueError."""
    return check_device(device)


def validate_dtype(dtype: str) -> str:
    """The canonical torch name of ``dtype`` (aliases fp32, bf16, fp16 accepted)."""
    if not isinstance(dtype, str) or dtype.lower() not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return DTYPES[dtype.lower()]


def kv_geometry(config: Any) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) of a decoder config."""
    heads = int(config.num_attention_heads)
    kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads)
    return int(config.num_hidden_layers), kv_heads, head_dim


def kv_bytes_per_token(config: Any, dtype_bytes: int) -> int:
    """Bytes of K and V one token adds to the cache: layers x KV heads x head dim x 2 x bytes."""
    layers, kv_heads, head_dim = kv_geometry(config)
    return layers * kv_heads * head_dim * 2 * dtype_bytes


def _resolve_device(device: str | None) -> Any:
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    validate_device(device)
    resolved = torch.device(device)
    if resolved.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} asked for, but CUDA is not available here")
        if resolved.index is not None and resolved.index >= torch.cuda.device_count():
            raise ValueError(
                f"device {device!r} asked for, but only {torch.cuda.device_count()} CUDA "
                "device(s) are visible"
            )
    return resolved


def _dtype_kwarg() -> str:
    """``dtype`` on transformers >= 4.56, ``torch_dtype`` before (the old name warns on 5.x)."""
    import transformers

    major, minor = (int(p) for p in re.findall(r"\d+", transformers.__version__)[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def preset_config(name: str) -> Any:
    """The transformers ``Qwen3Config`` of preset ``name`` (no weights are built).

    Raises:
        ValueError: for an unknown preset.
    """
    from transformers import Qwen3Config

    if name not in MODEL_PRESETS:
        raise ValueError(f"unknown model preset {name!r}; known: {', '.join(MODEL_PRESETS)}")
    fields = dict(MODEL_PRESETS[name])
    rope_theta = fields.pop("rope_theta")
    # transformers 5.x keeps RoPE settings in rope_parameters; 4.5x takes rope_theta (and would
    # silently store an unknown rope_parameters, so ask the signature rather than try)
    if "rope_parameters" in inspect.signature(Qwen3Config.__init__).parameters:
        return Qwen3Config(
            **fields, rope_parameters={"rope_type": "default", "rope_theta": rope_theta}
        )
    return Qwen3Config(**fields, rope_theta=rope_theta)


def _build_preset(name: str, device: Any, dtype: Any) -> tuple[Any, Any]:
    import torch
    from transformers import Qwen3ForCausalLM

    config = preset_config(name)
    torch.manual_seed(_SEED)
    with torch.device(device):
        model = Qwen3ForCausalLM._from_config(config, **{_dtype_kwarg(): dtype})
    return model, config


def _from_pretrained(spec: str, device: Any, dtype: Any) -> tuple[Any, Any, str]:
    # Offline before transformers/huggingface_hub read their settings, and local_files_only
    # in case they already did: a run never downloads.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    from transformers import AutoModelForCausalLM

    if os.path.isdir(spec):
        where = f"the local directory {os.path.abspath(spec)}"
    else:
        try:
            from huggingface_hub import constants

            cache = constants.HF_HUB_CACHE
        except Exception:  # pragma: no cover - huggingface_hub always ships with transformers
            cache = "the Hugging Face cache"
        where = f"the offline Hugging Face cache {cache}"
    try:
        model = AutoModelForCausalLM.from_pretrained(
            spec, local_files_only=True, **{_dtype_kwarg(): dtype}
        )
    except (OSError, ValueError) as err:
        # transformers' own text talks of connecting to the Hub, which a run never does
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        detail = "" if "huggingface.co" in first or "connect" in first else f" ({first})"
        raise ValueError(
            f"model {spec!r} not found: looked in {where} (downloads are off). Give a "
            f"preset ({', '.join(MODEL_PRESETS)}), a local model directory, or an id already "
            f"in the cache.{detail}"
        ) from None
    return model.to(device), model.config, f"loaded from {where}"


def load_model(spec: str, *, device: str | None = None, dtype: str | None = None) -> LoadedModel:
    """Build or load the model named by ``spec``, in eval mode on ``device`` in ``dtype``.

    Args:
        spec: a preset in ``MODEL_PRESETS`` (checked first), a local model directory, or a
            Hugging Face id already in the local cache (offline mode is forced).
        device: ``cpu``, ``cuda`` or ``cuda:N``; default ``cuda`` when available, else ``cpu``.
        dtype: ``float32``, ``bfloat16`` or ``float16``; default bfloat16 on CUDA, float32 on CPU.

    Raises:
        ValueError: for a bad device or dtype, CUDA asked for but absent, or a model that is
            neither a preset nor found locally (the message says where it looked).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(
            f"model must be a preset ({', '.join(MODEL_PRESETS)}), a local directory or a "
            f"cached Hugging Face id, got {spec!r}"
        )
    if dtype is not None:
        dtype = validate_dtype(dtype)
    import torch

    resolved_device = _resolve_device(device)
    dtype_name = dtype or ("bfloat16" if resolved_device.type == "cuda" else "float32")
    torch_dtype = getattr(torch, dtype_name)
    if spec in MODEL_PRESETS:
        model, config = _build_preset(spec, resolved_device, torch_dtype)
        source = MODEL_PRESET_SOURCES[spec]
    else:
        model, config, source = _from_pretrained(spec, resolved_device, torch_dtype)
    model.eval()
    dtype_bytes = torch.empty((), dtype=torch_dtype).element_size()
    max_context = int(getattr(config, "max_position_embeddings", 0) or 0) or 2**31 - 1
    return LoadedModel(
        model=model,
        config=config,
        name=spec,
        device=resolved_device,
        dtype=torch_dtype,
        source=source,
        kv_bytes_per_token=kv_bytes_per_token(config, dtype_bytes),
        max_context=max_context,
    )
