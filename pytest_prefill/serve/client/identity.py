"""Which server a URL is: its models (``/v1/models``, which every OpenAI-compatible server has;
a URL without it fails here, within the connect timeout), its engine and version where it says
(vLLM's ``/version``, llama.cpp's ``/props``), and the flags the user says it runs with: what a
run archives beside its figures. Standard library only.

What a measured server runs with (:func:`server_facts`), as far as its flags, its endpoints and
the model folder it serves show: the KV bytes one token takes (from the folder's
``config.json``), its KV capacity, block size, sequence cap and tensor-parallel size (DESIGN.md,
"Deployments: model, memory, parallelism": a server calibration carries them, and ``capacity
--cost`` keeps them as the deployment's facts)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_prefill.plan.engine_commands import ENGINE_COMMANDS
from pytest_prefill.plan.model_spec import CONFIG_FILE, load_model_spec
from pytest_prefill.serve.client.api import ENGINES
from pytest_prefill.serve.client.http import exchange
from pytest_prefill.serve.client.wire import DEFAULT_TIMEOUTS, ServerError, Timeouts, Url

# Probes of the optional endpoints wait at most this long: a server without them must not
# slow every run down.
OPTIONAL_TIMEOUT = 3.0


@dataclasses.dataclass(frozen=True)
class ServerIdentity:
    """``engine`` is what the user said, else what the server's endpoints showed (``how``
    says which), else ``openai`` (a server this package knows nothing special about)."""

    url: str
    models: tuple[str, ...]
    engine: str
    how: str
    version: str | None = None
    flags: str | None = None
    details: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def model(self) -> str:
        return self.models[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "models": list(self.models),
            "engine": self.engine,
            "engine_from": self.how,
            "version": self.version,
            "flags": self.flags,
            "details": dict(self.details),
        }


def _models(url: Url, status: int, body: Any) -> tuple[str, ...]:
    data = body.get("data") if isinstance(body, dict) else None
    if status != 200 or not isinstance(data, list):
        raise ServerError(
            f"{url}: not an OpenAI-compatible server: GET /v1/models answered HTTP {status} "
            f"{'with no model list' if status == 200 else ''}".rstrip()
        )
    models = tuple(str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id"))
    if not models:
        raise ServerError(f"{url}: GET /v1/models lists no model (is one loaded?)")
    return models


async def _optional(url: Url, path: str, timeouts: Timeouts) -> Any:
    quick = Timeouts(min(timeouts.connect, OPTIONAL_TIMEOUT), OPTIONAL_TIMEOUT)
    try:
        response = await exchange(url, "GET", path, timeouts=quick)
        body = response.json()
    except ServerError:
        return None
    return body if response.status == 200 and isinstance(body, dict) else None


async def identify(
    url: Url,
    *,
    engine: str | None = None,
    flags: str | None = None,
    timeouts: Timeouts = DEFAULT_TIMEOUTS,
    headers: Mapping[str, str] | None = None,
) -> ServerIdentity:
    """Ask the server at ``url`` who it is.

    Raises:
        ValueError: for an ``engine`` not in ``api.ENGINES``.
        ServerError: when it cannot be reached, or is not an OpenAI-compatible server.
    """
    if engine is not None and engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    response = await exchange(url, "GET", "/v1/models", timeouts=timeouts, headers=headers)
    status, body = response.status, response.json()
    models = _models(url, status, body)
    entries = body["data"]
    props, version = await asyncio.gather(
        _optional(url, "/props", timeouts), _optional(url, "/version", timeouts)
    )
    details: dict[str, Any] = {}
    found, how, said = "openai", "nothing it serves names its engine", None
    if props is not None and "build_info" in props:
        found, how, said = "llama.cpp", "GET /props", str(props.get("build_info"))
        settings = props.get("default_generation_settings")
        details.update(
            total_slots=props.get("total_slots"),
            n_ctx=settings.get("n_ctx") if isinstance(settings, dict) else None,
        )
    elif version is not None and "version" in version:
        owner = str(entries[0].get("owned_by", "")) if isinstance(entries[0], dict) else ""
        found = "sglang" if "sglang" in owner else "vllm"
        how, said = "GET /version", str(version["version"])
    elif isinstance(entries[0], dict) and isinstance(entries[0].get("status"), dict):
        found, how = (
            "transformers",
            "GET /v1/models (a loaded-status entry, as transformers serve lists)",
        )
    if engine is not None:
        how = "given" + (f" (the server looks like {found})" if found != engine else "")
        found = engine
    return ServerIdentity(str(url), models, found, how, said, flags, details)


@dataclasses.dataclass(frozen=True)
class ServerFacts:
    """What the server runs with (None: not shown), each fact's source in ``sources``."""

    kv_bytes_per_token: int | None = None
    kv_capacity_tokens: int | None = None
    kv_block_tokens: int | None = None
    max_seqs: int | None = None
    tp: int = 1
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "kv_block_tokens": self.kv_block_tokens,
            "max_seqs": self.max_seqs,
            "tp": self.tp,
            "sources": dict(self.sources),
        }

    @classmethod
    def from_dict(cls, data: Any) -> ServerFacts | None:
        """The facts a calibration recorded (None: none, or not readable)."""
        if not isinstance(data, Mapping):
            return None
        values: dict[str, Any] = {}
        for key in ("kv_bytes_per_token", "kv_capacity_tokens", "kv_block_tokens", "max_seqs"):
            value = data.get(key)
            values[key] = value if _whole(value) else None
        tp = data.get("tp")
        sources = data.get("sources")
        return cls(
            **values,
            tp=tp if isinstance(tp, int) and _whole(tp) else 1,
            sources=dict(sources) if isinstance(sources, Mapping) else {},
        )

    def describe(self) -> str:
        """``TP 1, at most 8 requests, KV 174,720 tokens (--num-gpu-blocks-override × --block-size)``."""
        parts = [f"TP {self.tp}"]
        if self.max_seqs is not None:
            parts.append(f"at most {self.max_seqs:,} requests ({self.sources.get('max_seqs')})")
        if self.kv_capacity_tokens is not None:
            parts.append(
                f"KV {self.kv_capacity_tokens:,} tokens ({self.sources.get('kv_capacity_tokens')})"
            )
        if self.kv_bytes_per_token is not None:
            parts.append(
                f"{self.kv_bytes_per_token:,} bytes of KV per token "
                f"({self.sources.get('kv_bytes_per_token')})"
            )
        return ", ".join(parts)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def flag_values(flags: str | None, names: Sequence[str]) -> int | None:
    """The integer after the first of ``names`` in a command-line text (``--x N`` or
    ``--x=N``), None when absent or not a whole number >= 1."""
    if not flags:
        return None
    try:
        words = shlex.split(flags)
    except ValueError:
        words = flags.split()
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if name in names:
            text = value if eq else (words[i + 1] if i + 1 < len(words) else "")
            if text.isascii() and text.isdigit() and int(text) >= 1:
                return int(text)
    return None


def server_facts(identity: ServerIdentity) -> ServerFacts:
    """What ``identity``'s flags (given by the user), endpoints and model folder show."""
    found: dict[str, Any] = {}
    sources: dict[str, str] = {}
    command = ENGINE_COMMANDS.get(identity.engine)
    read_back = command.read_back if command is not None else {}
    for fact, names in read_back.items():
        value = flag_values(identity.flags, names)
        if value is not None:
            found[fact], sources[fact] = value, f"the server's {names[0]}"
    details = identity.details
    if identity.engine == "llama.cpp":  # GET /props: the slots and the context they share
        for fact, key in (("max_seqs", "total_slots"), ("kv_capacity_tokens", "n_ctx")):
            if fact not in found and _whole(details.get(key)):
                found[fact], sources[fact] = details[key], f"GET /props {key}"
    block = command.kv_block_tokens if command is not None else None
    if block is not None and "kv_blocks" in found:
        found.setdefault("kv_block_tokens", block)
        sources.setdefault("kv_block_tokens", f"{identity.engine}'s default block")
    blocks = found.pop("kv_blocks", None)
    if blocks is not None and "kv_block_tokens" in found:
        found["kv_capacity_tokens"] = blocks * found["kv_block_tokens"]
        sources["kv_capacity_tokens"] = f"{sources.pop('kv_blocks')} × the block size"
    model = identity.model
    if os.path.isfile(os.path.join(model, CONFIG_FILE)):
        try:
            found["kv_bytes_per_token"] = load_model_spec(model).kv_bytes_per_token
            sources["kv_bytes_per_token"] = f"{model}/{CONFIG_FILE} (its dtype)"
        except ValueError as err:
            sources["kv_bytes_per_token"] = f"not read: {err}"
    tp = found.pop("tp", 1)
    return ServerFacts(**found, tp=tp, sources=sources)
