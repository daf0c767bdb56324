"""Flags shared by the commands that measure a running server (``bench``, ``calibrate-server``,
``fidelity-server``): where it is, what it is, how prompts are written, and the timeouts; and
the ``Target`` they name. Imports no torch."""

from __future__ import annotations

import argparse
import os

from pytest_prefill.commands._args import positive_int
from pytest_prefill.commands._workload_args import positive_float
from pytest_prefill.serve.calibration.server_calibration import ServerSweep
from pytest_prefill.serve.client.api import ENDPOINTS, ENGINES
from pytest_prefill.serve.client.prompts import TokenizerError
from pytest_prefill.serve.client.wire import DEFAULT_TIMEOUTS, Timeouts, Url
from pytest_prefill.serve.load.loadgen import Target, open_target


def url_type(text: str) -> Url:
    try:
        return Url.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


# A sweep's lengths do not depend on its budget: any budget above its live rows reads them.
LENGTHS_ONLY_BUDGET = 256


def max_prompt_type(text: str) -> int:
    """TOKENS: at least the calibration sweep's shortest lengths
    (:meth:`ServerSweep.within`)."""
    value = positive_int(text)
    try:
        ServerSweep(LENGTHS_ONLY_BUDGET).within(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("max_prompt ")) from None
    return value


def add_kv_tokens_argument(group: argparse._ArgumentGroup, default: str) -> None:
    """``--kv-tokens``: the server's KV cache in tokens, for the simulation of it; ``default``
    says what it is when not given."""
    group.add_argument(
        "--kv-tokens",
        type=positive_int,
        default=None,
        metavar="TOKENS",
        help="the server's KV cache in tokens (transformers: --cb-num-blocks x 256; llama.cpp "
        f"-c); default {default}",
    )


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("server")
    group.add_argument(
        "--url",
        type=url_type,
        required=True,
        help="the server's base URL, e.g. http://127.0.0.1:8000 (OpenAI-compatible)",
    )
    group.add_argument(
        "--engine",
        choices=ENGINES,
        default=None,
        help="what the server is, for exact output lengths (default: what its endpoints show; "
        "openai when they show nothing)",
    )
    group.add_argument(
        "--endpoint",
        choices=tuple(ENDPOINTS),
        default=None,
        help="completions (/v1/completions, the default), chat (/v1/chat/completions) or "
        "llama (llama.cpp's /completion, with server timings; the default for llama.cpp)",
    )
    group.add_argument(
        "--tokenizer",
        metavar="DIR",
        default=None,
        help="the served model's folder (its tokenizer.json, or make-model's word list), to "
        "write prompts of exact token lengths (default: ask the server's /tokenize)",
    )
    group.add_argument(
        "--token-ids",
        action="store_true",
        help="send prompts as token ids (vLLM, SGLang, llama.cpp take them)",
    )
    group.add_argument(
        "--server-flags",
        metavar="TEXT",
        default=None,
        help="the flags the server runs with, archived beside the figures (e.g. "
        "'--max-num-batched-tokens 256 --max-num-seqs 8')",
    )
    add_timeout_arguments(group)


TIMEOUT_HELP = {
    "connect": "seconds to connect",
    "stall": "seconds of silence mid-response before a request fails as stalled (a request "
    "queued that long behind others counts too)",
    "header": "seconds from a response's first byte to the end of its headers",
    "read": "seconds from a response's first byte to its end, for one that is not a stream "
    "(the model list, /tokenize)",
    "request": "seconds a request may take in all, its stream included (one that never ends)",
}


def add_timeout_arguments(group: argparse._ArgumentGroup) -> None:
    """``--api-key-env`` and the timeouts: ``--connect-timeout --stall-timeout
    --header-timeout --read-timeout --request-timeout``."""
    group.add_argument(
        "--api-key-env",
        metavar="VAR",
        default=None,
        help="send the API key in this environment variable as a bearer token",
    )
    for name, text in TIMEOUT_HELP.items():
        default = getattr(DEFAULT_TIMEOUTS, name)
        group.add_argument(
            f"--{name}-timeout",
            type=positive_float,
            default=default,
            metavar="S",
            help=f"{text} (default {default:g})",
        )


def timeouts_from_args(args: argparse.Namespace) -> Timeouts:
    return Timeouts(*(getattr(args, f"{name}_timeout") for name in TIMEOUT_HELP))


def _headers(args: argparse.Namespace) -> dict[str, str]:
    """Raises: ValueError naming ``--api-key-env``, for a variable that is not set or holds
    what an HTTP header cannot carry."""
    if not args.api_key_env:
        return {}
    key = os.environ.get(args.api_key_env)
    if not key:
        raise ValueError(f"--api-key-env {args.api_key_env}: that variable is not set")
    bad = next((c for c in key if ord(c) > 255 or c in "\r\n\0"), None)
    if bad is not None:
        raise ValueError(
            f"--api-key-env {args.api_key_env}: the key holds {bad!r}, which an HTTP header "
            "cannot carry (latin-1 only, no line breaks)"
        )
    return {"Authorization": f"Bearer {key}"}


async def target_from_args(args: argparse.Namespace) -> Target:
    """The server the flags name (``loadgen.open_target``).

    Raises:
        ValueError: naming the flag, for a tokenizer folder without words or an API key
            variable that is not set.
        ServerError: when the server cannot be reached or is not OpenAI-compatible.
    """
    headers = _headers(args)
    try:
        return await open_target(
            args.url,
            engine=args.engine,
            endpoint=args.endpoint,
            tokenizer=args.tokenizer,
            token_ids=args.token_ids,
            flags=args.server_flags,
            timeouts=timeouts_from_args(args),
            headers=headers,
        )
    except TokenizerError as err:
        raise ValueError(f"--tokenizer: {err}" if args.tokenizer else str(err)) from None
