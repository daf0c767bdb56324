"""The model a deployment serves, as its memory sees it: a Hugging Face ``config.json`` (a
folder or the file) or a named architecture preset → layers, hidden size, attention and KV
heads, head dim, dtype and the parameter count, and from them the KV bytes one token adds,
the weights' bytes and the default ``max_model_len`` (DESIGN.md, "Deployments: model, memory,
parallelism"). Standard library only; nothing is loaded or downloaded."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from pytest_prefill._io import read_json

CONFIG_FILE = "config.json"
# No model's size (layers, widths, vocabulary, context, experts) comes near this; past it a
# parameter count overflows a float and means nothing.
MAX_SIZE = 10**12

# What every Qwen3 preset here shares with Qwen3-0.6B as published: its context, norms, rope,
# tied embeddings and activation (the presets differ only in their shapes).
QWEN3_FAMILY = {
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
    "attention_bias": False,
}

# Qwen3-0.6B as published (config.json of Qwen/Qwen3-0.6B); measure/models builds it with
# random weights, since timing does not depend on weight values.
QWEN3_06B = {
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    **QWEN3_FAMILY,
}

# A 2-layer Qwen3 for CI: a few milliseconds per decode step on a small CPU. The context is
# as long as Qwen3-0.6B's so the decode sweep covers the same cache lengths.
TINY = {
    "vocab_size": 1024,
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    **QWEN3_FAMILY,
}

# A 4-layer Qwen3 for CPU fidelity runs: wide enough to be compute-bound (a decode step costs
# about five times an empty pass of the same depth on one core; the tiny preset is
# interpreter-bound) and small enough that a whole fidelity run takes minutes. Qwen3's ratios:
# 2 attention heads per KV head, intermediate = 3 x hidden, tied embeddings.
SMALL = {
    "vocab_size": 8192,
    "hidden_size": 384,
    "intermediate_size": 1152,
    "num_hidden_layers": 4,
    "num_attention_heads": 6,
    "num_key_value_heads": 3,
    "head_dim": 64,
    **QWEN3_FAMILY,
}

# A 6-layer Qwen3 between `small` and Qwen3-0.6B, for the model-size transfer on a CPU (fit the
# device's efficiencies on two presets, predict the third): four times `small`'s weights per
# layer, a calibration of a few minutes on one core. Qwen3's ratios as `small`.
MEDIUM = {
    "vocab_size": 16384,
    "hidden_size": 640,
    "intermediate_size": 1920,
    "num_hidden_layers": 6,
    "num_attention_heads": 10,
    "num_key_value_heads": 5,
    "head_dim": 64,
    **QWEN3_FAMILY,
}

# Meta-Llama-3-8B's config.json as published (meta-llama/Meta-Llama-3-8B): 8,030,261,248
# parameters, bf16.
LLAMA_3_8B = {
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "attention_bias": False,
    "torch_dtype": "bfloat16",
}

# Meta-Llama-3.1-8B's config.json as published (meta-llama/Llama-3.1-8B): Llama-3-8B's shapes
# (and so its parameters and KV bytes per token) with a 131,072-token context by llama3 rope
# scaling, long enough for Mooncake's prompts (to 126k tokens).
LLAMA_3_1_8B = {
    **LLAMA_3_8B,
    "max_position_embeddings": 131072,
    "rope_scaling": {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
}

ARCHITECTURES: dict[str, Mapping[str, Any]] = {
    "qwen3-0.6b": {"model_type": "qwen3", "torch_dtype": "bfloat16", **QWEN3_06B},
    "medium": {"model_type": "qwen3", "torch_dtype": "bfloat16", **MEDIUM},
    "small": {"model_type": "qwen3", "torch_dtype": "bfloat16", **SMALL},
    "tiny": {"model_type": "qwen3", "torch_dtype": "bfloat16", **TINY},
    "llama-3-8b": LLAMA_3_8B,
    "llama-3.1-8b": LLAMA_3_1_8B,
}

# What a launch line serves for a preset: the published model it has the shapes of.
SERVED_IDS = {
    "qwen3-0.6b": "Qwen/Qwen3-0.6B",
    "llama-3-8b": "meta-llama/Meta-Llama-3-8B",
    "llama-3.1-8b": "meta-llama/Llama-3.1-8B",
}

DTYPE_BYTES = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
REQUIRED = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
)
# Model types whose transformers config class defaults tie_word_embeddings to False (a config
# of another type must say); and those with a norm on each head's queries and keys.
UNTIED_BY_DEFAULT = ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe")
QK_NORM = ("qwen3", "qwen3_moe")
# vLLM's names: ``--quantization fp8`` stores every linear layer's weights (attention, MLP,
# experts; not the embeddings or lm_head) in one byte; ``--kv-cache-dtype fp8`` the KV cache.
QUANTIZATIONS = ("", "fp8")
KV_CACHE_DTYPES = {"auto": None, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}
# A mixture of experts: the config keys that count the routed experts, as each family names
# them (Mixtral: num_local_experts; Qwen2/3-MoE: num_experts; DeepSeek: n_routed_experts).
EXPERT_COUNT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


@dataclasses.dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's shapes and dtype; where they were read (``source``).

    Raises:
        ValueError: naming the field, for a size that is not an integer >= 1, KV heads that do
            not divide the attention heads, or an unknown dtype.
    """

    name: str
    source: str
    layers: int
    hidden_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    dtype: str = "bfloat16"
    tied_embeddings: bool = False
    qk_norm: bool = False
    attention_bias: bool = False
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate_size: int = 0
    shared_expert_intermediate_size: int = 0
    dense_layers: int = 0
    quantization: str = ""
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        for name in (
            "layers",
            "hidden_size",
            "attention_heads",
            "kv_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIZE:
                raise ValueError(
                    f"model {self.name}: {name} must be an integer in [1, {MAX_SIZE:.0e}], "
                    f"got {_short(value)}"
                )
        if self.attention_heads % self.kv_heads:
            raise ValueError(
                f"model {self.name}: num_key_value_heads ({self.kv_heads}) must divide "
                f"num_attention_heads ({self.attention_heads})"
            )
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(
                f"model {self.name}: dtype must be one of {', '.join(DTYPE_BYTES)}, "
                f"got {self.dtype!r}"
            )
        self._check_experts()
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(
                f"model {self.name}: quantization must be fp8 or none, got {self.quantization!r}"
            )
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(
                f"model {self.name}: kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                f"got {self.kv_cache_dtype!r}"
            )

    def _check_experts(self) -> None:
        moe = ("experts_per_token", "expert_intermediate_size")
        for name in (*moe, "experts", "shared_expert_intermediate_size", "dense_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SIZE:
                raise ValueError(
                    f"model {self.name}: {name} must be an integer in [0, {MAX_SIZE:.0e}], "
                    f"got {_short(value)}"
                )
        if self.experts == 0:
            if any(getattr(self, name) for name in (*moe, "shared_expert_intermediate_size")):
                raise ValueError(f"model {self.name}: expert sizes given without experts")
            return
        for name in moe:
            if getattr(self, name) < 1:
                raise ValueError(f"model {self.name}: a mixture of experts needs {name} >= 1")
        if self.experts_per_token > self.experts:
            raise ValueError(
                f"model {self.name}: experts_per_token ({self.experts_per_token}) exceeds the "
                f"{self.experts} experts"
            )
        if self.dense_layers > self.layers:
            raise ValueError(f"model {self.name}: dense_layers exceeds the {self.layers} layers")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def weight_value_bytes(self) -> int:
        """Bytes of one linear-layer weight: 1 under fp8 quantization, else the dtype's."""
        return 1 if self.quantization == "fp8" else self.dtype_bytes

    @property
    def kv_dtype_bytes(self) -> int:
        """Bytes of one cached K or V value: the KV cache dtype's, else the model's."""
        return KV_CACHE_DTYPES[self.kv_cache_dtype] or self.dtype_bytes

    @property
    def fp8_storage(self) -> tuple[bool, bool]:
        """Whether the linear layers' weights and the KV cache are stored in fp8 (what a
        launch line must then ask the engine for)."""
        return self.quantization == "fp8", self.kv_cache_dtype != "auto"

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of one token over all layers: ``2 · L · H_kv · d · b``."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def sparse_layers(self) -> int:
        """Layers whose MLP is the experts (the others are dense)."""
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def embedding_parameters(self) -> int:
        """The embeddings and an untied output head (never quantized)."""
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    def _linear_parameters(self, experts: int) -> int:
        """Every layer's linear weights, with ``experts`` of the routed experts counted."""
        h, d = self.hidden_size, self.head_dim
        q, kv = self.attention_heads * d, self.kv_heads * d
        attention = h * q + 2 * h * kv + q * h
        dense = 3 * h * self.intermediate_size
        sparse = 3 * h * self.expert_intermediate_size * experts + h * self.experts
        sparse += 3 * h * self.shared_expert_intermediate_size
        return (
            self.layers * attention
            + self.dense_layers * dense
            + self.sparse_layers * sparse
            + (0 if self.is_moe else self.layers * dense)
        )

    @property
    def _small_parameters(self) -> int:
        """Biases and norms (kept in the model's dtype)."""
        h, d = self.hidden_size, self.head_dim
        per_layer = 2 * h + (2 * d if self.qk_norm else 0)
        if self.attention_bias:
            per_layer += (self.attention_heads + 2 * self.kv_heads) * d
        return self.layers * per_layer + h

    def _parameters_with(self, experts: int) -> int:
        """Embeddings, the linear layers with ``experts`` routed experts, and the small ones."""
        return self.embedding_parameters + self._linear_parameters(experts) + self._small_parameters

    @property
    def parameters(self) -> int:
        """Counted from the shapes: embeddings (and an untied output head), per layer the
        attention projections (with their biases and Qwen3's per-head q/k norms), the gated MLP
        (gate, up, down; a mixture of experts: every expert, the router and any shared expert)
        and two RMSNorms, and the final norm."""
        return self._parameters_with(self.experts)

    @property
    def active_parameters(self) -> int:
        """The parameters one token computes with: :attr:`parameters` with only
        ``experts_per_token`` of the routed experts."""
        return self._parameters_with(self.experts_per_token)

    @property
    def weight_bytes(self) -> int:
        """All weights in memory: linear layers at :attr:`weight_value_bytes`, the rest at
        the dtype's."""
        linear = self._linear_parameters(self.experts)
        return linear * self.weight_value_bytes + (self.parameters - linear) * self.dtype_bytes

    def summary(self) -> str:
        """``llama-3-8b: 8.03B parameters bf16 (14.96 GiB), 32 layers, 8 KV heads × 128,
        131,072 bytes of KV per token, context 8,192``."""
        experts = (
            f" ({self.experts} experts, {self.experts_per_token} per token: "
            f"{self.active_parameters / 1e9:.3g}B active)"
            if self.is_moe
            else ""
        )
        weights = f"{self.dtype}" + (" weights fp8" if self.quantization else "")
        kv = " (fp8 KV cache)" if self.kv_dtype_bytes != self.dtype_bytes else ""
        return (
            f"{self.name}: {self.parameters / 1e9:.3g}B parameters{experts} {weights} "
            f"({self.weight_bytes / 2**30:.2f} GiB), {self.layers} layers, {self.kv_heads} KV "
            f"heads × {self.head_dim}, {self.kv_bytes_per_token:,} bytes of KV per "
            f"token{kv}, context {self.max_position_embeddings:,}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
            "parameters": self.parameters,
            "weight_bytes": self.weight_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
        }


def _field(config: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in config or config[key] is None:
        raise ValueError(f"{where}: config.json has no {key!r}, which the model's size needs")
    return config[key]


def _size(config: Mapping[str, Any], key: str, where: str) -> int:
    value = _field(config, key, where)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_SIZE:
        raise ValueError(
            f"{where}: {key!r} must be an integer in [1, {MAX_SIZE:.0e}], got {_short(value)}"
        )
    return value


def _short(value: Any) -> str:
    """``value`` as the message shows it: an integer of hundreds of digits by its size."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**18:
        return f"an integer of {len(str(abs(value)))} digits"
    return f"{value!r:.60}"


def _dtype(config: Mapping[str, Any], where: str) -> str:
    value = config.get("torch_dtype", config.get("dtype"))
    if value is None:
        raise ValueError(
            f"{where}: config.json has no 'torch_dtype' (or 'dtype'): the weights' "
            "and KV cache's bytes per value depend on it"
        )
    name = str(value).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ValueError(
            f"{where}: torch_dtype must be one of {', '.join(DTYPE_BYTES)}, got {value!r}"
        )
    return name


def _tied(config: Mapping[str, Any], model_type: str, where: str) -> bool:
    if "tie_word_embeddings" in config:
        tied = config["tie_word_embeddings"]
        if not isinstance(tied, bool):
            raise ValueError(
                f"{where}: 'tie_word_embeddings' must be true or false, got {tied!r:.60}"
            )
        return tied
    if model_type in UNTIED_BY_DEFAULT:
        return False
    raise ValueError(
        f"{where}: config.json has no 'tie_word_embeddings' and model_type {model_type!r} has "
        "no known default: the parameter count depends on it"
    )


def model_from_config(config: Mapping[str, Any], name: str, source: str) -> ModelSpec:
    """The :class:`ModelSpec` a Hugging Face config describes. ``num_key_value_heads`` and
    ``head_dim`` take transformers' own defaults (the attention heads; hidden ÷ heads).

    Raises:
        ValueError: naming the field, for one missing or malformed, or a mixture of experts.
    """
    if not isinstance(config, Mapping):
        raise ValueError(f"{name}: a config must be a JSON object, got {type(config).__name__}")
    experts = _experts(config, name)
    sizes = {key: _size(config, key, name) for key in REQUIRED}
    heads = sizes["num_attention_heads"]
    kv_heads = (
        _size(config, "num_key_value_heads", name) if "num_key_value_heads" in config else heads
    )
    head_dim = (
        _size(config, "head_dim", name)
        if config.get("head_dim") is not None
        else sizes["hidden_size"] // heads
    )
    model_type = str(config.get("model_type", ""))
    return ModelSpec(
        name=name,
        source=source,
        layers=sizes["num_hidden_layers"],
        hidden_size=sizes["hidden_size"],
        attention_heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=sizes["intermediate_size"],
        vocab_size=sizes["vocab_size"],
        max_position_embeddings=sizes["max_position_embeddings"],
        dtype=_dtype(config, name),
        tied_embeddings=_tied(config, model_type, name),
        qk_norm=model_type in QK_NORM,
        attention_bias=bool(config.get("attention_bias", False)),
        quantization=_quantization(config, name),
        **experts,
    )


def _experts(config: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A mixture of experts' fields as :class:`ModelSpec` names them ({} for a dense model):
    Mixtral (``num_local_experts``; each expert ``intermediate_size`` wide), Qwen2/3-MoE
    (``num_experts``, ``moe_intermediate_size``, Qwen2's ``shared_expert_intermediate_size``,
    ``mlp_only_layers`` / ``decoder_sparse_step``), DeepSeek-MoE (``n_routed_experts``,
    ``n_shared_experts``, ``first_k_dense_replace``); every one needs ``num_experts_per_tok``.

    Raises:
        ValueError: in one line naming the field, for an expert field missing, or multi-head
            latent attention (DeepSeek-V2/V3's ``kv_lora_rank``), which is not modelled.
    """
    counted = [k for k in EXPERT_COUNT_KEYS if isinstance(config.get(k), int) and config[k] > 1]
    if not counted:
        if all(config.get(k) is None for k in EXPERT_COUNT_KEYS) and config.get(
            "num_experts_per_tok"
        ):
            raise ValueError(
                f"{where}: config.json has num_experts_per_tok={config['num_experts_per_tok']!r} "
                f"(a mixture of experts) but no {' / '.join(EXPERT_COUNT_KEYS)}, which its "
                "compute and memory need"
            )
        return {}
    key = counted[0]
    if config.get("kv_lora_rank") is not None:
        raise ValueError(
            f"{where}: kv_lora_rank: multi-head latent attention (DeepSeek-V2/V3) is not "
            "modelled; only grouped-query attention is"
        )
    label = f"{where}: config.json has {key}={config[key]} (a mixture of experts)"

    def need(field: str) -> int:
        if field not in config or config[field] is None:
            raise ValueError(f"{label} but no {field!r}, which its compute and memory need")
        return _size(config, field, where)

    per_token = need("num_experts_per_tok")
    size = (
        need("intermediate_size") if key == "num_local_experts" else need("moe_intermediate_size")
    )
    shared = int(config.get("shared_expert_intermediate_size") or 0)
    shared += int(config.get("n_shared_experts") or 0) * size
    layers = _size(config, "num_hidden_layers", where)
    dense = int(config.get("first_k_dense_replace") or 0)
    only = config.get("mlp_only_layers") or []
    step = int(config.get("decoder_sparse_step") or 1)
    if only or step > 1:
        dense = sum(1 for i in range(layers) if i in only or (i + 1) % step)
    return {
        "experts": config[key],
        "experts_per_token": per_token,
        "expert_intermediate_size": size,
        "shared_expert_intermediate_size": shared,
        "dense_layers": dense,
    }


def _quantization(config: Mapping[str, Any], where: str) -> str:
    """``fp8`` for a checkpoint its config says is fp8 (``quantization_config.quant_method``),
    else none; another quantization is refused in one line (its bytes are not modelled)."""
    quant = config.get("quantization_config")
    if not quant:
        return ""
    method = quant.get("quant_method") if isinstance(quant, Mapping) else None
    if method == "fp8":
        return "fp8"
    raise ValueError(
        f"{where}: quantization_config quant_method {method!r} is not modelled (fp8 is)"
    )


def load_model_spec(spec: str) -> ModelSpec:
    """The model ``spec`` names: a preset of :data:`ARCHITECTURES`, a ``config.json`` file or a
    folder holding one.

    Raises:
        ValueError: naming the spec, for neither, a file that is not JSON, or a field missing.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(
            f"model must be a preset ({', '.join(ARCHITECTURES)}) or a config.json (or a folder "
            f"holding one), got {spec!r}"
        )
    if spec in ARCHITECTURES:
        return model_from_config(ARCHITECTURES[spec], spec, f"architecture preset {spec}")
    path = os.path.join(spec, CONFIG_FILE) if os.path.isdir(spec) else spec
    if not os.path.isfile(path):
        raise ValueError(
            f"model {spec!r}: not a preset ({', '.join(ARCHITECTURES)}), a config.json or a "
            "folder holding one"
        )
    try:  # read_json: capped at MAX_JSON_BYTES, refused unread past it, as every JSON
        config = read_json(path, "config.json")
    except ValueError as err:
        raise ValueError(f"model {spec!r}: {err}") from None
    if not isinstance(config, dict):
        raise ValueError(
            f"model {spec!r}: {path} must hold a JSON object, got {type(config).__name__}"
        )
    stem = os.path.splitext(os.path.basename(path))[0]
    folder = os.path.basename(os.path.dirname(os.path.abspath(path)))
    name = (folder if os.path.basename(path) == CONFIG_FILE else stem) or spec
    return model_from_config(config, name, f"config.json at {os.path.abspath(path)}")
