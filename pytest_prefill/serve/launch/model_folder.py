"""A servable random-weight model folder for any architecture preset, made offline: Hugging Face
format (config, safetensors weights, a tokenizer in which every word is one token) and,
optionally, a GGUF file for llama.cpp. torch, transformers, tokenizers and gguf are imported
lazily; nothing is downloaded.

The tokenizer is a byte-level BPE built, not trained: each word's prefixes are merges, so a
prompt of N words is exactly N tokens and the same ids come out of both formats. The output rows
of tokens that stream as no text (special tokens, bare bytes that are not printable ASCII,
whitespace) are zeroed, so greedy decoding emits words and every streamed chunk carries text.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import string
import tempfile
from collections.abc import Sequence
from typing import Any

from pytest_prefill.serve.client.prompts import WORDS_FILE

EOS_TOKEN = "<|endoftext|>"
CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
GGUF_FILE = "model.gguf"
# What marks a folder as make-model's: only such a folder is ever replaced (--overwrite).
MARKER_FILE = "prefill-model.json"
MIN_WORDS = 64
MAX_WORDS = 4000
WORD_LENGTHS = (3, 7)  # letters per word, inclusive
SEED = 0


def byte_alphabet() -> list[str]:
    """GPT-2's byte-to-character table: the character that stands for byte ``i`` at ``[i]``."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    table = dict(zip(printable, chars))
    return [chr(table[b]) for b in range(256)]


SPACE = byte_alphabet()[ord(" ")]  # "Ġ"


@dataclasses.dataclass(frozen=True)
class Vocabulary:
    """A BPE vocabulary: ``tokens`` in id order (256 bytes, the merged prefixes, then the special
    token), ``merges`` in rank order, and the ``words`` (each one token, with its leading space
    written as a plain space)."""

    tokens: tuple[str, ...]
    merges: tuple[tuple[str, str], ...]
    words: tuple[str, ...]

    @property
    def eos_id(self) -> int:
        return len(self.tokens) - 1

    def word_ids(self) -> list[int]:
        index = {t: i for i, t in enumerate(self.tokens)}
        return [index[SPACE + w.lstrip()] for w in self.words]


def build_vocabulary(size: int, *, seed: int = SEED) -> Vocabulary:
    """Random lowercase words, as many as fit in ``size`` tokens (at most ``MAX_WORDS``), with
    every prefix of " word" a merge, so each word is one token.

    Raises:
        ValueError: when ``size`` leaves room for fewer than ``MIN_WORDS`` words.
    """
    alphabet = byte_alphabet()
    budget = size - len(alphabet) - 1  # the special token
    rng = random.Random(seed)
    tokens = list(alphabet)
    known = set(tokens)
    merges: list[tuple[str, str]] = []
    words: list[str] = []
    for _ in range(MAX_WORDS * 20):
        if len(words) >= MAX_WORDS:
            break
        word = "".join(
            rng.choice(string.ascii_lowercase) for _ in range(rng.randint(*WORD_LENGTHS))
        )
        spelled = SPACE + word
        new = [spelled[:k] for k in range(2, len(spelled) + 1) if spelled[:k] not in known]
        if not new or spelled in known or len(merges) + len(new) > budget:
            continue
        for prefix in new:
            merges.append((prefix[:-1], prefix[-1]))
            tokens.append(prefix)
            known.add(prefix)
        words.append(" " + word)
    if len(words) < MIN_WORDS:
        raise ValueError(
            f"vocab_size {size} leaves room for {len(words)} single-token words; need at least "
            f"{MIN_WORDS} (a preset with vocab_size >= 1024 has room)"
        )
    # merges must be ranked so that a prefix exists before it is extended
    order = sorted(range(len(merges)), key=lambda i: len(merges[i][0]))
    ranked = tuple(merges[i] for i in order)
    return Vocabulary((*tokens, EOS_TOKEN), ranked, tuple(words))


def tokenizer_of(vocabulary: Vocabulary) -> Any:
    """A ``tokenizers.Tokenizer`` for ``vocabulary`` (byte-level, GPT-2's pre-tokenizer)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    ids = {token: i for i, token in enumerate(vocabulary.tokens[:-1])}
    tokenizer = Tokenizer(models.BPE(vocab=ids, merges=list(vocabulary.merges)))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(EOS_TOKEN, special=True)])
    return tokenizer


def silent_ids(vocabulary: Vocabulary, vocab_size: int) -> list[int]:
    """Ids of the model's ``vocab_size`` output rows that would stream as no visible text: the
    special token, bare bytes that are not printable ASCII (whitespace included), and the rows
    past the tokenizer's vocabulary."""
    alphabet = byte_alphabet()
    silent = []
    for i, token in enumerate(vocabulary.tokens):
        if i == vocabulary.eos_id:
            silent.append(i)
        elif len(token) == 1:
            byte = alphabet.index(token)
            if not (0x21 <= byte <= 0x7E):
                silent.append(i)
    return silent + list(range(len(vocabulary.tokens), vocab_size))


@dataclasses.dataclass(frozen=True)
class ModelFolder:
    """What :func:`make_model` wrote."""

    path: str
    preset: str
    parameters: int
    vocab_size: int
    words: int
    gguf: str | None


class WriteFailed(OSError):
    """Writing the model folder failed (a full disk, say); nothing was left behind."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.filename = path

    def __str__(self) -> str:
        return str(self.args[0])


def _check_arguments(preset: str, folder: Any, overwrite: bool) -> None:
    from pytest_prefill.measure.models import MODEL_PRESETS

    if preset not in MODEL_PRESETS:
        raise ValueError(f"preset must be one of {', '.join(MODEL_PRESETS)}, got {preset!r}")
    if not isinstance(folder, (str, os.PathLike)) or not str(folder):
        raise ValueError(f"folder must be a path, got {folder!r}")
    if not os.path.lexists(folder):
        return
    if not overwrite:
        raise ValueError(f"folder {folder}: already exists (give overwrite=True / --overwrite)")
    if os.path.islink(folder) or not os.path.isdir(folder):
        raise ValueError(f"folder {folder}: exists and is not a folder")
    if not os.path.isfile(os.path.join(folder, MARKER_FILE)):
        raise ValueError(
            f"folder {folder}: exists and was not made by make-model (it has no {MARKER_FILE}); "
            "it is not replaced: give a new folder, or remove this one yourself"
        )
    here = os.path.realpath(os.getcwd())
    real = os.path.realpath(folder)
    if here == real or here.startswith(real + os.sep):
        raise ValueError(f"folder {folder}: holds the current directory; it is not replaced")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _open_to_others(folder: str) -> None:
    """Give the folder and its files the modes the umask grants (mkdtemp and some writers
    make them private: a server running as another user could not read them)."""
    mask = _umask()
    os.chmod(folder, 0o777 & ~mask)
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        os.chmod(path, (0o777 if os.path.isdir(path) else 0o666) & ~mask)


def make_model(
    preset: str, folder: str | os.PathLike[str], *, gguf: bool = False, overwrite: bool = False
) -> ModelFolder:
    """Write a servable random-weight model of architecture ``preset`` to ``folder`` (float32,
    seeded: the same preset gives the same weights). The folder is assembled beside its
    destination and renamed into place, so a failure leaves nothing half-written.

    With ``overwrite``, only a folder this function made (it holds :data:`MARKER_FILE`) is
    replaced. The folder and its files get the modes the umask grants.

    Raises:
        ValueError: for an unknown preset, a folder that exists (unless ``overwrite``) or is not
            a folder, one ``overwrite`` may not replace (not made here, or holding the current
            directory), or a preset whose vocabulary is too small for one-token words.
        WriteFailed: an OSError naming the folder, when writing fails (a full disk).
    """
    _check_arguments(preset, folder, overwrite)
    from pytest_prefill.measure.models import load_model

    destination = os.path.abspath(folder)
    parent = os.path.dirname(destination)
    os.makedirs(parent, exist_ok=True)
    loaded = load_model(preset, device="cpu", dtype="float32")
    vocabulary = build_vocabulary(min(loaded.vocab_size, 8192))
    work = tempfile.mkdtemp(prefix=".tmp-model-", dir=parent)
    try:
        _zero_silent_rows(loaded.model, silent_ids(vocabulary, loaded.vocab_size))
        _write(loaded, vocabulary, work, preset, gguf=gguf)
        if os.path.lexists(destination):
            _check_arguments(preset, destination, True)  # still make-model's, as checked
            shutil.rmtree(destination)
        os.replace(work, destination)
    except BaseException as err:
        shutil.rmtree(work, ignore_errors=True)
        if isinstance(err, OSError) or type(err).__name__ == "SafetensorError":
            reason = getattr(err, "strerror", None) or str(err).splitlines()[0]
            raise WriteFailed(
                f"{destination}: writing the model failed ({reason}); nothing was left behind",
                destination,
            ) from None
        raise
    return ModelFolder(
        destination,
        preset,
        sum(p.numel() for p in loaded.model.parameters()),
        loaded.vocab_size,
        len(vocabulary.words),
        os.path.join(destination, GGUF_FILE) if gguf else None,
    )


def _write(loaded: Any, vocabulary: Vocabulary, work: str, preset: str, *, gguf: bool) -> None:
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a bar per shard on stderr: noise around an error line
    try:
        _write_hf(loaded, vocabulary, work)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    if gguf:
        write_gguf(loaded.model, loaded.config, vocabulary, os.path.join(work, GGUF_FILE))
    marker = {"made_by": "prefill-bench make-model", "preset": preset}
    with open(os.path.join(work, MARKER_FILE), "w", encoding="utf-8") as handle:
        json.dump(marker, handle)
    _open_to_others(work)


def _zero_silent_rows(model: Any, ids: Sequence[int]) -> None:
    import torch

    with torch.no_grad():
        model.get_output_embeddings().weight[list(ids)] = 0.0


def _write_hf(loaded: Any, vocabulary: Vocabulary, folder: str) -> None:
    from transformers import PreTrainedTokenizerFast

    config = loaded.model.config
    config.eos_token_id = vocabulary.eos_id
    config.pad_token_id = vocabulary.eos_id
    config.bos_token_id = None
    loaded.model.generation_config.eos_token_id = vocabulary.eos_id
    loaded.model.generation_config.pad_token_id = vocabulary.eos_id
    loaded.model.save_pretrained(folder)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer_of(vocabulary), eos_token=EOS_TOKEN, pad_token=EOS_TOKEN
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(folder)
    words = {"words": list(vocabulary.words), "ids": vocabulary.word_ids()}
    with open(os.path.join(folder, WORDS_FILE), "w", encoding="utf-8") as handle:
        json.dump(words, handle)


def write_gguf(model: Any, config: Any, vocabulary: Vocabulary, path: str) -> None:
    """The model as a GGUF file llama.cpp loads (architecture ``qwen3``, float32, GPT-2 style
    tokenizer with the same tokens and merges)."""
    import gguf

    from pytest_prefill.measure.models import kv_geometry

    layers, kv_heads, head_dim = kv_geometry(config)
    writer = gguf.GGUFWriter(path, "qwen3")
    writer.add_name("pytest-prefill random-weight model")
    writer.add_context_length(int(config.max_position_embeddings))
    writer.add_embedding_length(int(config.hidden_size))
    writer.add_block_count(layers)
    writer.add_feed_forward_length(int(config.intermediate_size))
    writer.add_head_count(int(config.num_attention_heads))
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(float(_rope_theta(config)))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(writer, vocabulary, int(config.vocab_size))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, layers)
    state = model.state_dict()
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    for name, tensor in state.items():
        target = names.get_name(name, try_suffixes=(".weight", ".bias"))
        if target is None:
            raise ValueError(f"no GGUF name for tensor {name!r}")
        writer.add_tensor(target, tensor.detach().to("cpu").float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _rope_theta(config: Any) -> float:
    parameters = getattr(config, "rope_parameters", None)
    if isinstance(parameters, dict) and "rope_theta" in parameters:
        return float(parameters["rope_theta"])
    return float(config.rope_theta)


def _add_tokenizer(writer: Any, vocabulary: Vocabulary, vocab_size: int) -> None:
    import gguf

    # the embedding has vocab_size rows: pad the token list with unused tokens to match
    padding = [f"[PAD{i}]" for i in range(vocab_size - len(vocabulary.tokens))]
    tokens = [*vocabulary.tokens, *padding]
    types = [gguf.TokenType.NORMAL] * len(tokens)
    types[vocabulary.eos_id] = gguf.TokenType.CONTROL
    for i in range(len(vocabulary.tokens), len(tokens)):
        types[i] = gguf.TokenType.UNUSED
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([f"{a} {b}" for a, b in vocabulary.merges])
    writer.add_eos_token_id(vocabulary.eos_id)
    writer.add_pad_token_id(vocabulary.eos_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
