"""Flags shared by the commands that measure a running server (``bench``, ``calibrate-server``,
``fidelity-server``): where it is, what it is, how prompts are written, and the timeouts; and
the ``Target`` they name. Imports no torch."""

from __future__ import annotations

import argparse
import os

from pytest_prefill.commands._workload_args import positive_float
from pytest_prefill.serve.api import ENDPOINTS, ENGINES
from pytest_prefill.serve.http import DEFAULT_CONNECT_TIMEOUT, DEFAULT_STALL_TIMEOUT, Timeouts, Url
from pytest_prefill.serve.loadgen import Target, open_target


def url_type(text: str) -> Url:
    try:
        return Url.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


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


def add_timeout_arguments(group: argparse._ArgumentGroup) -> None:
    """``--api-key-env --connect-timeout --stall-timeout``."""
    group.add_argument(
        "--api-key-env",
        metavar="VAR",
        default=None,
        help="send the API key in this environment variable as a bearer token",
    )
    group.add_argument(
        "--connect-timeout",
        type=positive_float,
        default=DEFAULT_CONNECT_TIMEOUT,
        metavar="S",
        help=f"seconds to connect (default {DEFAULT_CONNECT_TIMEOUT:g})",
    )
    group.add_argument(
        "--stall-timeout",
        type=positive_float,
        default=DEFAULT_STALL_TIMEOUT,
        metavar="S",
        help="seconds of silence mid-response before a request fails as stalled (default "
        f"{DEFAULT_STALL_TIMEOUT:g}; a request queued that long behind others counts too)",
    )


def _headers(args: argparse.Namespace) -> dict[str, str]:
    if not args.api_key_env:
        return {}
    key = os.environ.get(args.api_key_env)
    if not key:
        raise ValueError(f"--api-key-env {args.api_key_env}: that variable is not set")
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
            timeouts=Timeouts(args.connect_timeout, args.stall_timeout),
            headers=headers,
        )
    except ValueError as err:
        raise ValueError(f"--tokenizer: {err}" if args.tokenizer else str(err)) from None
