"""argparse value types shared by the subcommands: a bad value is a usage error that says
what is allowed.

Also the flags shared by the commands that read or write the results archive (``--results``,
``--machine``) and the machine key they mean. Imports no torch."""

from __future__ import annotations

import argparse
import datetime
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pytest_prefill._io import ascii_float, ascii_int, check_output
from pytest_prefill.archive import saving
from pytest_prefill.machine import (
    KEY_PATTERN,
    cpu_model,
    machine_info,
    machine_key,
    nvidia_accelerators,
)
from pytest_prefill.plan.workloads import LAB_SCENARIO, LabScenario


def _number(text: str, kind: type, allowed: str) -> float:
    """``text`` read by :func:`ascii_int` or :func:`ascii_float` (``1_000`` and other scripts'
    digits are refused, as everywhere we read numbers)."""
    try:
        return ascii_int(text) if kind is int else ascii_float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}") from None


def positive_int(text: str) -> int:
    value = int(_number(text, int, "a positive integer"))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = int(_number(text, int, "an integer >= 0"))
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = _number(text, float, "a finite number >= 0")
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


# Bounds on what the simulating commands accept. The simulator's cost grows with the iterations
# a run takes (a chunked prompt takes prompt_len / chunk of them) and with the live streams; the
# library takes any size, the command line refuses sizes that would run for minutes.
MAX_PROMPT_LEN = 10_000_000  # tokens: beyond any model's context window
MAX_STREAMS = 10_000
MAX_CHUNKED_ITERATIONS = 1_000_000  # chunked iterations in one run: 5-15 s of simulation
# A timeline also lays out and draws what it simulated, three policies of it: a tenth of that.
MAX_TIMELINE_ITERATIONS = 100_000
MAX_SECONDS = 1e6  # an arrival time: ~11.6 days, where a float still resolves 1e-10 s


def bounded_int(maximum: int, unit: str) -> Callable[[str], int]:
    """An argparse type for an integer from 1 to ``maximum``."""

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(
                f"must be at most {maximum:,} {unit} (the command line's bound on what it "
                f"simulates; the library takes any size), got {text!r}"
            )
        return value

    return parse


prompt_len_type = bounded_int(MAX_PROMPT_LEN, "tokens")
streams_type = bounded_int(MAX_STREAMS, "streams")


def at_most(parse: Callable[[str], float], maximum: float, unit: str) -> Callable[[str], float]:
    """An argparse type: ``parse``'s number, refused above ``maximum`` (in ``unit``)."""

    def bounded(text: str) -> float:
        value = parse(text)
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:,.0f} {unit}, got {text!r}")
        return value

    return bounded


seconds_type = at_most(non_negative_float, MAX_SECONDS, "seconds")  # a time, 0 to MAX_SECONDS


def check_chunked_iterations(
    prompt_len: int, chunks: Iterable[int], limit: int = MAX_CHUNKED_ITERATIONS
) -> None:
    """ValueError naming the chunk when one would split the prompt into more than ``limit``
    iterations."""
    for chunk in chunks:
        iterations = -(-prompt_len // chunk)
        if iterations > limit:
            raise ValueError(
                f"chunk {chunk:,} would split the {prompt_len:,}-token prompt into "
                f"{iterations:,} iterations; the command line simulates at most "
                f"{limit:,} (give a larger --chunk or a shorter --prompt-len)"
            )


def output_path(text: str) -> str:
    """A file to write: a new path in an existing folder or a regular file (a symlink is written
    through), checked when the arguments are parsed, before anything is measured or simulated.
    What it may replace and what it must not name: :func:`.._outputs.check_outputs`, after."""
    try:
        check_output(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


LAB_DEFAULTS = {name: getattr(LAB_SCENARIO, name) for name in ("prompt_len", "streams", "arrival")}


def add_lab_scenario_arguments(parser: argparse.ArgumentParser) -> None:
    """``--prompt-len --streams --arrival``: the lab scenario's inputs (simulate, timeline).
    They parse to None when not given (so a command can tell them apart from their defaults);
    :func:`lab_scenario_given` then fills in the defaults."""
    parser.add_argument(
        "--prompt-len",
        type=prompt_len_type,
        help=f"tokens of the arriving prompt (default {LAB_DEFAULTS['prompt_len']})",
    )
    parser.add_argument(
        "--streams",
        type=streams_type,
        help=f"live streams already decoding (default {LAB_DEFAULTS['streams']})",
    )
    parser.add_argument(
        "--arrival",
        type=seconds_type,
        help=f"when the prompt arrives, seconds (default {LAB_DEFAULTS['arrival']}; at most "
        f"{MAX_SECONDS:,.0f})",
    )


def lab_scenario_of(args: argparse.Namespace) -> LabScenario:
    """The lab scenario ``--streams --prompt-len --arrival`` shape (after
    :func:`lab_scenario_given`)."""
    return LabScenario(args.streams, args.prompt_len, args.arrival)


def lab_scenario_given(args: argparse.Namespace) -> list[str]:
    """The lab-scenario flags given on the command line (as ``--prompt-len`` …); the others are
    set to their defaults."""
    given = []
    for name, default in LAB_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, default)
        else:
            given.append("--" + name.replace("_", "-"))
    return given


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
    document = saving.run_document(
        **context,
        cost=saving.cost_block(calibration.fitted(), origin),
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
