"""Prompts of exact token lengths: built from words that are one token each in the server's
tokenizer (a leading space included), as text or as token ids. The words come from a model
folder this package made (``prefill-words.json``) or from any tokenizer's ``tokenizer.json``
(its byte-level or SentencePiece word tokens; read with ``tokenizers`` when installed, else as
plain JSON). Every request's prompt is drawn afresh from its id, so no two share a prefix a
server could cache — unless the request names its prompt's blocks (a trace's ``hash_ids``):
then each block id is a fixed run of words of the block size, the same for every request that
names it, and only the rest is drawn from the request's own key. Standard library only."""

from __future__ import annotations

import dataclasses
import os
import random
import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_prefill._io import read_json
from pytest_prefill.serve.client.http import exchange
from pytest_prefill.serve.client.wire import Timeouts, Url
from pytest_prefill.sim.checks import check_int

WORDS_FILE = "prefill-words.json"
MIN_WORDS = 64
# A vocabulary entry that is a whole lowercase word with its leading-space marker: GPT-2's
# byte-level "Ġ" or SentencePiece's "▁".
WORD_TOKEN = re.compile(r"^[\u0120\u2581]([a-z]{3,12})$")


class TokenizerError(ValueError):
    """A tokenizer folder without usable words (missing, malformed, too few)."""


@dataclasses.dataclass(frozen=True)
class Prompts:
    """Words (each with its leading space) and their token ids, in the same order."""

    words: tuple[str, ...]
    ids: tuple[int, ...]
    source: str

    def __post_init__(self) -> None:
        for i, (word, token) in enumerate(zip(self.words, self.ids)):
            if not isinstance(word, str) or not word:
                raise ValueError(f"{self.source}: word {i} is {word!r:.40}, not a word")
            if isinstance(token, bool) or not isinstance(token, int) or token < 0:
                raise ValueError(f"{self.source}: id {i} is {token!r:.40}, not a token id")
        if len(self.words) != len(self.ids):
            raise ValueError(f"{self.source}: {len(self.words)} words for {len(self.ids)} ids")
        if len(self.words) < MIN_WORDS:
            raise ValueError(
                f"{self.source}: {len(self.words)} single-token words found, need at least "
                f"{MIN_WORDS} to draw distinct prompts"
            )

    def _picks(self, key: str, length: int) -> list[int]:
        check_int("prompt length", length)
        rng = random.Random(zlib.crc32(key.encode()))
        return [rng.randrange(len(self.words)) for _ in range(length)]

    def text(self, key: str, length: int) -> str:
        """A prompt of ``length`` tokens, the same for the same ``key``."""
        return "".join(self.words[i] for i in self._picks(key, length))

    def token_ids(self, key: str, length: int) -> list[int]:
        """The token ids of :meth:`text` for the same key and length."""
        return [self.ids[i] for i in self._picks(key, length)]

    def _shared_picks(
        self, key: str, length: int, blocks: Sequence[int | str], block_tokens: int, salt: str
    ) -> list[int]:
        check_int("block_tokens", block_tokens)
        picks: list[int] = []
        for block in blocks:
            if len(picks) >= length:
                break
            picks += self._picks(f"{salt}/block/{type(block).__name__}/{block}", block_tokens)
        picks = picks[:length]
        if len(picks) < length:
            picks += self._picks(key, length - len(picks))
        return picks

    def shared_text(
        self, key: str, length: int, blocks: Sequence[int | str], block_tokens: int, salt: str = ""
    ) -> str:
        """A prompt of ``length`` tokens whose leading ``block_tokens``-token blocks are those
        ``blocks`` name (the same words for the same id and ``salt``, whoever asks), the
        tokens past the named blocks drawn from ``key``."""
        return "".join(
            self.words[i] for i in self._shared_picks(key, length, blocks, block_tokens, salt)
        )

    def shared_token_ids(
        self, key: str, length: int, blocks: Sequence[int | str], block_tokens: int, salt: str = ""
    ) -> list[int]:
        """The token ids of :meth:`shared_text` for the same arguments."""
        return [self.ids[i] for i in self._shared_picks(key, length, blocks, block_tokens, salt)]


def prompts_from_folder(folder: str | os.PathLike[str]) -> Prompts:
    """The single-token words of a model folder: its ``prefill-words.json`` when
    ``make-model`` wrote one, else the word tokens of its ``tokenizer.json``.

    Raises:
        TokenizerError: naming the file, when neither is there, one is malformed, or too few
            words are found.
    """
    try:
        return _prompts_from_folder(os.fspath(folder))
    except TokenizerError:
        raise
    except ValueError as err:
        raise TokenizerError(str(err)) from None


def _prompts_from_folder(path: str) -> Prompts:
    if not os.path.isdir(path):
        raise TokenizerError(f"tokenizer folder {path}: not a folder")
    made = os.path.join(path, WORDS_FILE)
    if os.path.isfile(made):
        data = read_json(made, "word list")
        words = data.get("words") if isinstance(data, dict) else None
        ids = data.get("ids") if isinstance(data, dict) else None
        if not isinstance(words, list) or not isinstance(ids, list):
            raise TokenizerError(
                f"{made}: not a word list (an object with lists 'words' and 'ids')"
            )
        return Prompts(tuple(words), tuple(ids), made)
    tokenizer = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(tokenizer):
        raise TokenizerError(f"tokenizer folder {path}: no {WORDS_FILE} and no tokenizer.json")
    return words_of_vocabulary(_vocabulary(tokenizer), tokenizer)


def _vocabulary(path: str) -> dict[str, int]:
    data = read_json(path, "tokenizer")
    model = data.get("model") if isinstance(data, dict) else None
    vocab = model.get("vocab") if isinstance(model, dict) else None
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
        return {
            entry[0]: i
            for i, entry in enumerate(vocab)
            if isinstance(entry, list) and entry and isinstance(entry[0], str)
        }
    if not isinstance(vocab, dict):
        raise TokenizerError(f"{path}: no model.vocab in this tokenizer.json")
    bad = next(
        ((k, v) for k, v in vocab.items() if isinstance(v, bool) or not isinstance(v, int)), None
    )
    if bad is not None:
        raise TokenizerError(
            f"{path}: model.vocab maps {bad[0]!r:.40} to {bad[1]!r:.40}, not an id"
        )
    return dict(vocab)


def words_of_vocabulary(vocab: dict[str, int], source: str, limit: int = 4096) -> Prompts:
    """The whole-word tokens of ``vocab`` (at most ``limit``, in id order)."""
    found = sorted(
        ((i, WORD_TOKEN.match(token)) for token, i in vocab.items()), key=lambda pair: pair[0]
    )
    pairs = [(" " + m.group(1), i) for i, m in found if m is not None][:limit]
    return Prompts(tuple(w for w, _ in pairs), tuple(i for _, i in pairs), source)


# Words a server's /tokenize is asked about: random lowercase strings; the pieces that come back
# as whole words with their leading space are the words prompts are built from.
CANDIDATES = 3000
CANDIDATE_SEED = 0
PIECE = re.compile(r"^(?: |\u0120|\u2581)([a-z]{2,12})$")


def _candidates() -> str:
    rng = random.Random(CANDIDATE_SEED)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = (
        "".join(rng.choice(letters) for _ in range(rng.randint(2, 6))) for _ in range(CANDIDATES)
    )
    return " " + " ".join(words)


async def prompts_from_server(
    url: Url, engine: str, timeouts: Timeouts, headers: Mapping[str, str]
) -> Prompts:
    """Single-token words found by the server's own ``/tokenize`` (llama.cpp with pieces, vLLM
    and SGLang with token strings).

    Raises:
        ValueError: for a server without ``/tokenize`` (give the model folder instead), or one
            whose tokenizer yields too few whole-word tokens.
        ServerError: when the server cannot be reached.
    """
    text = _candidates()
    if engine == "llama.cpp":
        payload: dict[str, Any] = {"content": text, "with_pieces": True}
    elif engine in ("vllm", "sglang"):
        payload = {"prompt": text, "return_token_strs": True}
    else:
        raise ValueError(
            f"a {engine} server has no /tokenize to find one-token words: give --tokenizer DIR "
            "(the served model's folder)"
        )
    response = await exchange(url, "POST", "/tokenize", payload, timeouts=timeouts, headers=headers)
    status, body = response.status, response.json()
    if status != 200 or not isinstance(body, dict) or not isinstance(body.get("tokens"), list):
        raise ValueError(f"{url}: POST /tokenize answered HTTP {status}; give --tokenizer DIR")
    if engine == "llama.cpp":
        pairs = [(t.get("piece"), t.get("id")) for t in body["tokens"] if isinstance(t, dict)]
    else:
        pairs = list(zip(body.get("token_strs") or [], body["tokens"]))
    seen: dict[str, int] = {}
    for piece, token in pairs:
        match = PIECE.match(piece) if isinstance(piece, str) else None
        if match and isinstance(token, int):
            seen.setdefault(" " + match.group(1), token)
    return Prompts(tuple(seen), tuple(seen.values()), f"{url} /tokenize")
