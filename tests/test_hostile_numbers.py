"""Valid-looking but extreme numbers where they enter: a config.json's sizes, its
``tie_word_embeddings``, its size on disk, and verify's ``--margin``."""

from __future__ import annotations

import json

import pytest
from cli_errors import usage_error

from pytest_prefill import _io
from pytest_prefill.plan.model_spec import ARCHITECTURES, load_model_spec


def _config(tmp_path, **changes) -> str:
    folder = tmp_path / "model"
    folder.mkdir(exist_ok=True)
    name = next(iter(ARCHITECTURES))
    (folder / "config.json").write_text(json.dumps({**ARCHITECTURES[name], **changes}))
    return str(folder)


@pytest.mark.parametrize(
    "field, value",
    [("hidden_size", 10**300), ("num_hidden_layers", 10**399), ("vocab_size", 2**80)],
)
def test_an_absurd_size_is_refused_in_one_line_naming_the_field(tmp_path, field, value):
    with pytest.raises(ValueError) as caught:
        load_model_spec(_config(tmp_path, **{field: value}))
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400
    # past the JSON reader's integer cap the file is refused before any field is read
    assert field in message or "too large" in message


@pytest.mark.parametrize("tied", ["false", 0, None, [True]])
def test_tie_word_embeddings_must_be_a_boolean(tmp_path, tied):
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        load_model_spec(_config(tmp_path, tie_word_embeddings=tied))


def test_tie_word_embeddings_as_a_boolean_still_reads(tmp_path):
    tied = load_model_spec(_config(tmp_path, tie_word_embeddings=True))
    untied = load_model_spec(_config(tmp_path, tie_word_embeddings=False))
    difference = untied.parameters - tied.parameters
    assert difference == tied.vocab_size * tied.hidden_size  # the output head's own weights


def test_a_config_past_the_json_cap_is_refused_unread(tmp_path, monkeypatch):
    folder = _config(tmp_path)
    monkeypatch.setattr(_io, "MAX_JSON_BYTES", 64)  # the file is larger than this
    with pytest.raises(ValueError, match="config.json"):
        load_model_spec(folder)


@pytest.mark.parametrize("margin", ["1e-200", "1e-9"])
def test_a_vanishing_margin_is_a_usage_error(margin, capsys):
    argv = ["verify", "--url", "http://127.0.0.1:9", "--flags", "tokens=16", "--slo", "ttft:1s"]
    assert "margin" in usage_error([*argv, "--margin", margin], capsys)
