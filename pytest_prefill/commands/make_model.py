"""``prefill-bench make-model``: write a random-weight model folder a server can serve (Hugging
Face format with a tokenizer in which every word is one token; optionally GGUF for llama.cpp).
Nothing is downloaded."""

from __future__ import annotations

import argparse
import importlib

# What make-model imports, and the extra of pyproject.toml that installs it.
NEEDS = (("torch", "measure"), ("transformers", "measure"))
NEEDS_GGUF = (("gguf", "serve"),)

HELP = "write a random-weight servable model folder (HF format, optionally GGUF) for a preset"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from pytest_prefill.measure.models import MODEL_PRESETS

    parser.add_argument("preset", choices=tuple(MODEL_PRESETS), help="the architecture")
    parser.add_argument("folder", help="where to write it (a new folder)")
    parser.add_argument("--gguf", action="store_true", help="also write model.gguf for llama.cpp")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a folder make-model made (one holding prefill-model.json); any other is "
        "refused",
    )


def need(modules: tuple[tuple[str, str], ...]) -> None:
    """A one-line ValueError naming the extra to install, for the first of ``modules`` that
    cannot be imported."""
    for name, extra in modules:
        try:
            importlib.import_module(name)
        except ImportError:
            hint = ' (on a CPU-only machine: pip install "torch==2.13.0" first)' * (name == "torch")
            raise ValueError(
                f'make-model needs {name}: pip install ".[{extra}]" from the checkout{hint}'
            ) from None


def run(args: argparse.Namespace) -> int:
    need(NEEDS + (NEEDS_GGUF if args.gguf else ()))
    from pytest_prefill.serve.launch.model_folder import make_model

    made = make_model(args.preset, args.folder, gguf=args.gguf, overwrite=args.overwrite)
    print(
        f"wrote {made.path}: {args.preset}, {made.parameters / 1e6:.1f}M parameters, float32, "
        f"{made.words:,} one-token words" + (f"; GGUF {made.gguf}" if made.gguf else "")
    )
    print(
        f"serve it: transformers serve {made.path} --continuous-batching --device cpu "
        "--host 127.0.0.1 --port 8000 --cb-max-batch-tokens 256 --cb-num-blocks 64"
    )
    return 0
