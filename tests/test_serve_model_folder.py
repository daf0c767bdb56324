"""make-model's folder: every word one token, silent output rows zeroed, a GGUF beside it when
asked, bad input named, and nothing half-written when it fails."""

from __future__ import annotations

import json
import os

import pytest

from pytest_prefill.serve.client.prompts import prompts_from_folder
from pytest_prefill.serve.launch import model_folder
from pytest_prefill.serve.launch.model_folder import build_vocabulary, make_model, silent_ids


def test_every_word_of_the_vocabulary_is_one_token():
    tokenizers = pytest.importorskip("tokenizers")
    assert tokenizers
    vocabulary = build_vocabulary(1024)
    tokenizer = model_folder.tokenizer_of(vocabulary)
    words = vocabulary.words
    assert len(tokenizer.encode("".join(words[:50])).ids) == 50
    assert tokenizer.encode("".join(words[:50])).ids == vocabulary.word_ids()[:50]
    assert len(vocabulary.tokens) <= 1024 and len(set(vocabulary.tokens)) == len(vocabulary.tokens)
    with pytest.raises(ValueError, match="vocab_size"):
        build_vocabulary(300)


def test_silent_rows_are_the_ones_that_stream_no_text():
    vocabulary = build_vocabulary(1024)
    silent = set(silent_ids(vocabulary, 1100))
    assert vocabulary.eos_id in silent and set(range(len(vocabulary.tokens), 1100)) <= silent
    assert not silent & set(vocabulary.word_ids())
    alphabet = model_folder.byte_alphabet()
    assert alphabet.index(vocabulary.tokens[ord(" ")]) == ord(" ") and ord(" ") in silent


def test_the_folder_is_a_model_transformers_loads(tmp_path):
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    made = make_model("tiny", tmp_path / "m")
    tokenizer = transformers.AutoTokenizer.from_pretrained(made.path)
    prompts = prompts_from_folder(made.path)
    text = prompts.text("key", 40)
    assert len(tokenizer(text)["input_ids"]) == 40
    model = transformers.AutoModelForCausalLM.from_pretrained(made.path)
    head = model.get_output_embeddings().weight.detach()
    vocabulary = build_vocabulary(min(made.vocab_size, 8192))
    zeroed = silent_ids(vocabulary, made.vocab_size)
    assert (
        float(head[zeroed].abs().sum()) == 0.0
        and float(head[vocabulary.word_ids()].abs().sum()) > 0
    )
    assert (
        json.loads((tmp_path / "m" / "config.json").read_text())["eos_token_id"]
        == vocabulary.eos_id
    )
    with pytest.raises(ValueError, match="already exists"):
        make_model("tiny", tmp_path / "m")
    with pytest.raises(ValueError, match="preset"):
        make_model("huge", tmp_path / "x")


def test_a_failure_leaves_nothing_half_written(tmp_path, monkeypatch):
    pytest.importorskip("torch")

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(model_folder, "write_gguf", broken)
    with pytest.raises(OSError, match="disk full"):
        make_model("tiny", tmp_path / "m", gguf=True)
    assert os.listdir(tmp_path) == []


def test_a_gguf_is_written_when_asked(tmp_path):
    pytest.importorskip("torch")
    gguf = pytest.importorskip("gguf")
    made = make_model("tiny", tmp_path / "m", gguf=True)
    reader = gguf.GGUFReader(made.gguf)
    names = {t.name for t in reader.tensors}
    assert "token_embd.weight" in names and "blk.1.ffn_down.weight" in names
    assert reader.fields["general.architecture"].contents() == "qwen3"
