"""Flags shared by the commands that read or write the results archive (``--results``,
``--machine``) and the machine key they mean. Imports no torch."""

from __future__ import annotations

import argparse
import datetime
import os
from pathlib import Path
from typing import Any

from pytest_prefill.archive import saving
from pytest_prefill.commands._args import output_path
from pytest_prefill.machine import (
    KEY_PATTERN,
    cpu_model,
    machine_info,
    machine_key,
    nvidia_accelerators,
)

DEFAULT_RESULTS = "results"


def machine_key_type(text: str) -> str:
    if not KEY_PATTERN.match(text):
        raise argparse.ArgumentTypeError(
            f"must be lower-case letters, digits and dashes (a folder name), got {text!r}"
        )
    return text


def results_type(text: str) -> str:
    """The archive folder: a non-empty path (an empty one would mean the current folder, as the
    plugin's ``--prefill-results ''`` refuses to)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must name a folder, got ''")
    return text


def add_output_arguments(parser: argparse.ArgumentParser, json_help: str, save_help: str) -> None:
    """``--json PATH`` and ``--save`` (each worded by the command), then
    :func:`add_archive_arguments`."""
    parser.add_argument("--json", type=output_path, metavar="PATH", help=json_help)
    parser.add_argument("--save", action="store_true", help=save_help)
    add_archive_arguments(parser)


def add_archive_arguments(parser: argparse.ArgumentParser) -> None:
    """``--results DIR --machine KEY``."""
    parser.add_argument(
        "--results",
        type=results_type,
        default=DEFAULT_RESULTS,
        metavar="DIR",
        help=f"the results archive, one folder per machine (default {DEFAULT_RESULTS}/)",
    )
    parser.add_argument(
        "--machine",
        type=machine_key_type,
        default=None,
        metavar="KEY",
        help="the machine key (archive folder) to use instead of this machine's (default: "
        "the GPU nvidia-smi reports, else the CPU, e.g. nvidia-h200, cpu-amd-epyc)",
    )


def machine_of(args: argparse.Namespace, device: str | None = None) -> str:
    """``--machine``, else this machine's key for ``device`` (None: the default device)."""
    given = getattr(args, "machine", None)
    if given:
        return str(given)
    accelerators = [] if device == "cpu" else nvidia_accelerators()
    return machine_key(device, accelerators, cpu_model())


def save_calibration(args: argparse.Namespace, calibration: Any, origin: str) -> Path:
    """Archive ``calibration`` (a ``calibrate.Calibration``) as a run of ``--machine`` (else
    this machine) under ``--results``, as the plugin archives a pytest session's: where
    ``--prefill-cost archive``, ``--cost archive``, ``compare`` and ``runs`` find it."""
    info = calibration.provenance
    device = "cpu" if str(info.get("device", "")).startswith("cpu") else info.get("device")
    started, context = _run_context(args, device, info.get("torch_threads"))
    refused = calibration.refused()
    document = saving.run_document(
        **context,
        cost=saving.cost_block(
            calibration.cost, origin, None, refused, calibration.contexts, calibration.trust()
        ),
        calibration=calibration.to_dict(),
        command="prefill-bench " + " ".join(getattr(args, "argv", None) or ["calibrate"]),
    )
    return saving.save_run(args.results, document, when=started.astimezone())


def _run_context(
    args: argparse.Namespace, device: str | None, threads: Any
) -> tuple[datetime.datetime, dict[str, Any]]:
    """When a measuring command's run started, and the run document's machine, commit and
    settings (the command's measuring flags and its torch threads)."""
    accelerators = [] if device == "cpu" else nvidia_accelerators()
    machine = {**machine_info(device, accelerators), "key": machine_of(args, device)}
    commit, dirty = saving.git_state(os.getcwd())
    started = datetime.datetime.now(datetime.timezone.utc)
    settings = {k: getattr(args, k, None) for k in ("model", "device", "dtype", "repeats")}
    settings.update(
        warmup=getattr(args, "warmup", None),
        dry_run=getattr(args, "dry_run", None),
        threads=threads,
    )
    context = dict(created=started, machine=machine, commit=commit, dirty=dirty, settings=settings)
    return started, context


def save_tables(
    args: argparse.Namespace,
    provenance: Any,
    tables: Any,
    verdicts: Any,
    attachments: dict[str, str] | None = None,
) -> Path:
    """Archive a measuring command's printed tables and verdicts (no calibration of its own)
    as a run of ``--machine`` (else this machine) under ``--results``. ``tables``: (title,
    text, data) each; ``verdicts``: (name, HOLDS or FAILS, sentence) each; ``attachments``: suffix
    -> text stored beside the run (``saving.write_run``)."""
    device = "cpu" if str(provenance.get("device", "")).startswith("cpu") else None
    started, context = _run_context(args, device, provenance.get("threads"))
    document = saving.run_document(
        **context,
        tables=[{"title": t, "text": text, "data": data} for t, text, data in tables],
        verdicts=[{"name": n, "verdict": v, "sentence": s} for n, v, s in verdicts],
        command="prefill-bench " + " ".join(getattr(args, "argv", None) or ["fidelity"]),
    )
    return saving.save_run(
        args.results, document, when=started.astimezone(), attachments=attachments
    )
