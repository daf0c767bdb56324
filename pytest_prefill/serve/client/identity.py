"""Which server a URL is: its models (``/v1/models``, which every OpenAI-compatible server has;
a URL without it fails here, within the connect timeout), its engine and version where it says
(vLLM's ``/version``, llama.cpp's ``/props``), and the flags the user says it runs with: what a
run archives beside its figures. Standard library only."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any

from pytest_prefill.serve.client.api import ENGINES
from pytest_prefill.serve.client.http import request_json
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
        status, body = await request_json(url, "GET", path, timeouts=quick)
    except ServerError:
        return None
    return body if status == 200 and isinstance(body, dict) else None


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
    status, body = await request_json(url, "GET", "/v1/models", timeouts=timeouts, headers=headers)
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
