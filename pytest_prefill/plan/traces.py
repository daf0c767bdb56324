"""Trace files as requests: the Azure LLM inference 2023 CSV (Patel et al., "Splitwise", ISCA
2024; CC-BY 4.0) and JSON-lines traces in the public form (Mooncake's), plain or gzip, each read
with a window and a limit, every bad line named; and the traces the package ships (``data/``).
Standard library only."""

from __future__ import annotations

import csv
import datetime
import gzip
import importlib.resources
import json
import math
import os
import re
import zlib
from collections.abc import Iterator
from typing import IO, cast

from pytest_prefill._io import ascii_int
from pytest_prefill.sim import Request, check_int, check_number

# A folder holding conv.csv / code.csv (plain or .gz) to read instead of the shipped Azure traces.
AZURE_DIR_ENV = "PYTEST_PREFILL_AZURE_DIR"
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
# A trace's line is one request: tens of bytes in the Azure CSV, a few kilobytes in a JSONL trace
# that lists its prompt's block hashes. A longer line is not a request, and reading it whole
# would cost memory for nothing (a 1 GiB line: 6 GB).
MAX_LINE_BYTES = 2**20
JSONL_KEYS = ("timestamp", "input_length", "output_length")  # Mooncake-style public traces
# Mooncake's hash_ids: one id per 512-token block of the prompt, kept as Request.prefix_blocks
JSONL_BLOCK_TOKENS = 512
AZURE_ATTRIBUTION = (
    "Azure LLM inference trace 2023 (AzurePublicDataset, CC-BY 4.0; Patel et al., "
    '"Splitwise: Efficient Generative LLM Inference Using Phase Splitting", ISCA 2024)'
)
MOONCAKE_ATTRIBUTION = (
    "Mooncake FAST'25 conversation trace (kvcache-ai/Mooncake, Apache-2.0; Qin et al., "
    '"Mooncake: Trading More Storage for Less Computation - A KVCache-centric Architecture for '
    'Serving LLM Chatbot", FAST 2025)'
)
# The traces shipped in the package's plan/data/ folder (its README.md: source and licence):
# workload name -> file.
SHIPPED_TRACES = {
    "azure-conv": "azure-conv.csv.gz",
    "azure-code": "azure-code.csv.gz",
    "mooncake-conv": "mooncake-conv.jsonl.gz",
}
GZIP_MAGIC = b"\x1f\x8b"


_PLAIN_MOMENT = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2}")


def _parse_timestamp(text: str) -> datetime.datetime:
    # "2023-11-16 18:17:03.9799600": seven fractional digits, which datetime does not take.
    head, _, frac = text.strip().partition(".")
    if _PLAIN_MOMENT.fullmatch(head):  # the trace's own form: the C parser, 10x strptime
        moment = datetime.datetime.fromisoformat(head)
    else:  # strptime also takes unpadded fields
        moment = datetime.datetime.strptime(head, "%Y-%m-%d %H:%M:%S")
    if frac:
        if not (frac.isascii() and frac.isdigit()):
            raise ValueError(f"bad fractional seconds {frac!r}")
        try:
            moment += datetime.timedelta(microseconds=round(int(frac) / 10 ** len(frac) * 1e6))
        except OverflowError:  # 9999-12-31 23:59:59.9999999 rounds past the last datetime
            raise ValueError(f"timestamp {text.strip()!r} is past the year 9999") from None
    return moment


def check_window_arguments(start: float, duration: float | None, limit: int | None) -> None:
    """A trace window's ``start`` (a finite number), ``duration`` (> 0 or None) and ``limit``
    (an integer >= 1 or None), each refused by name."""
    check_number("start", start)
    if duration is not None:
        check_number("duration", duration, positive=True)
    if limit is not None:
        check_int("limit", limit)


def load_azure(
    path: str | os.PathLike[str],
    *,
    start: float = 0.0,
    duration: float | None = None,
    limit: int | None = None,
    rate_scale: float = 1.0,
) -> list[Request]:
    """Requests from an Azure LLM inference 2023 CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Rows need not be in time order: they are sorted by timestamp (a stable sort, so equal
    timestamps keep the file's order), and times count from the earliest row. A request's id
    is ``az<row>``, its row in the file (0 for the first data row), whatever the order.

    Args:
        path: the CSV file (UTF-8).
        start, duration: keep rows whose time since the earliest row is in
            [start, start+duration) seconds (all rows when duration is None); kept arrivals are
            shifted to begin at 0.
        limit: keep at most this many rows (the earliest, after the window).
        rate_scale: multiply the arrival rate (divide every arrival time) by this factor.

    Raises:
        ValueError: naming the file and line, for a missing column, a bad timestamp, a
            non-positive token count, a field over the csv module's size limit or bytes that
            are not UTF-8; or naming the argument for a bad window, limit or scale.
        FileNotFoundError: when the file does not exist.
    """
    check_window_arguments(start, duration, limit)
    check_number("rate_scale", rate_scale, positive=True)
    rows = sorted(_azure_rows(path), key=lambda row: row[0])
    load: list[Request] = []
    for moment, index, prompt, output in rows:
        offset = (moment - rows[0][0]).total_seconds()
        if offset < start:
            continue
        if duration is not None and offset >= start + duration:
            break
        load.append(Request(f"az{index}", (offset - start) / rate_scale, prompt, output))
        if limit is not None and len(load) >= limit:
            break
    return load


def _azure_rows(
    path: str | os.PathLike[str],
) -> Iterator[tuple[datetime.datetime, int, int, int]]:
    """(timestamp, row index, prompt tokens, output tokens) of every data row, in file order."""
    with open_trace(path) as handle:
        lines = _utf8_lines(handle, path)
        reader = csv.reader(lines)
        try:
            header = next(reader, None)
            if header is None or tuple(h.strip() for h in header) != AZURE_COLUMNS:
                raise ValueError(
                    f"{path}: header must be {','.join(AZURE_COLUMNS)}, got {header!r}"
                )
            for index, row in enumerate(reader):
                if not row:
                    continue
                line = reader.line_num
                try:
                    stamp, context, generated = row
                    moment = _parse_timestamp(stamp)
                    prompt, output = ascii_int(context.strip()), ascii_int(generated.strip())
                except ValueError as err:
                    raise ValueError(f"{path}:{line}: cannot read row {row!r} ({err})") from None
                if prompt < 1 or output < 1:
                    raise ValueError(f"{path}:{line}: token counts must be >= 1, got {row!r}")
                yield moment, index, prompt, output
        except csv.Error as err:  # e.g. a field over csv.field_size_limit() characters
            raise ValueError(f"{path}:{reader.line_num}: not a CSV row ({err})") from None


def open_trace(path: str | os.PathLike[str]) -> IO[bytes]:
    """``path`` opened for reading bytes, decompressed when it starts with gzip's magic bytes.

    Raises:
        FileNotFoundError: when the file does not exist.
    """
    with open(path, "rb") as probe:
        compressed = probe.read(2) == GZIP_MAGIC
    if compressed:
        return cast(IO[bytes], gzip.open(path, "rb"))
    return open(path, "rb")


def _utf8_lines(handle: IO[bytes], path: str | os.PathLike[str]) -> Iterator[str]:
    """The file's lines as text; bytes that are not UTF-8 (latin-1), a damaged gzip stream or
    a line over :data:`MAX_LINE_BYTES` are a ValueError naming the line (a leading byte-order
    mark is dropped)."""
    number = 0
    while raw := _read_line(handle, path, number + 1):
        number += 1
        if len(raw) > MAX_LINE_BYTES:
            raise ValueError(
                f"{path}:{number}: a line over {MAX_LINE_BYTES // 2**20} MiB; a trace has one "
                "request a line, so this is not one (not read further)"
            )
        try:
            yield raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(
                f"{path}:{number}: not UTF-8 text ({err.reason}: byte {raw[err.start]:#04x} "
                f"at column {err.start + 1})"
            ) from None


def _read_line(handle: IO[bytes], path: str | os.PathLike[str], number: int) -> bytes:
    try:
        return handle.readline(MAX_LINE_BYTES + 1)
    except (gzip.BadGzipFile, EOFError, zlib.error) as err:
        raise ValueError(f"{path}:{number}: a damaged gzip stream ({err})") from None


def shipped_trace_path(name: str) -> str | None:
    """Path of the trace the package ships as workload ``name`` (a key of
    :data:`SHIPPED_TRACES`), found with ``importlib.resources``; None if the install lacks it."""
    if name not in SHIPPED_TRACES:
        raise ValueError(f"shipped trace must be one of {', '.join(SHIPPED_TRACES)}, got {name!r}")
    path = importlib.resources.files("pytest_prefill.plan") / "data" / SHIPPED_TRACES[name]
    return str(path) if path.is_file() else None


def trace_locations(name: str) -> list[str]:
    """Where workload ``name``'s trace is looked for, in order: for an Azure trace the folder
    in ``$PYTEST_PREFILL_AZURE_DIR`` when set (``conv.csv`` or ``conv.csv.gz``), then the file
    the package ships."""
    if name not in SHIPPED_TRACES:
        raise ValueError(f"shipped trace must be one of {', '.join(SHIPPED_TRACES)}, got {name!r}")
    places = []
    if name.startswith("azure-") and os.environ.get(AZURE_DIR_ENV):
        stem = os.path.join(os.environ[AZURE_DIR_ENV], f"{name.removeprefix('azure-')}.csv")
        places += [stem, f"{stem}.gz"]
    shipped = importlib.resources.files("pytest_prefill.plan") / "data" / SHIPPED_TRACES[name]
    return [*places, str(shipped)]


def named_trace_path(name: str) -> str | None:
    """The first of :func:`trace_locations` that is a file, or None."""
    return next((path for path in trace_locations(name) if os.path.isfile(path)), None)


def azure_trace_path(name: str) -> str | None:
    """Path of the Azure trace ``name`` (``"code"`` or ``"conv"``): the one in
    ``$PYTEST_PREFILL_AZURE_DIR`` when set, else the one the package ships; None if neither."""
    if name not in ("code", "conv"):
        raise ValueError(f"Azure trace name must be 'code' or 'conv', got {name!r}")
    return named_trace_path(f"azure-{name}")


def load_jsonl(
    path: str | os.PathLike[str],
    *,
    start: float = 0.0,
    duration: float | None = None,
    limit: int | None = None,
) -> list[Request]:
    """Requests from a JSON-lines trace, one object a line in the form public traces use:
    ``{"timestamp": ms, "input_length": tokens, "output_length": tokens}``, and ``hash_ids``
    where the trace has them (Mooncake's: one id per ``JSONL_BLOCK_TOKENS`` = 512-token block of
    the prompt), kept as each request's ``prefix_blocks``; other keys ignored.

    Rows are taken in time order (ties by line); arrivals are seconds since the earliest
    timestamp. ``start``/``duration`` keep rows in [start, start + duration) seconds and shift
    them to begin at 0; ``limit`` keeps the first rows after that.

    Raises:
        ValueError: naming the file and line, for a line that is not a JSON object with the
            three keys, a timestamp that is not a finite number, a length < 1, or ``hash_ids``
            that are not a list of integers or strings; or naming the
            argument for a bad window or limit.
        FileNotFoundError: when the file does not exist.
    """
    check_window_arguments(start, duration, limit)
    rows: list[tuple[float, int, int, tuple[int | str, ...], int]] = []
    with open_trace(path) as handle:
        for line, text in enumerate(_utf8_lines(handle, path), start=1):
            if text.strip():
                rows.append((*_jsonl_row(path, line, text), line))
    rows.sort(key=lambda row: (row[0], row[4]))
    origin = rows[0][0] if rows else 0.0
    load: list[Request] = []
    for stamp, prompt, output, blocks, line in rows:
        offset = (stamp - origin) / 1e3
        if offset < start or (duration is not None and offset >= start + duration):
            continue
        load.append(Request(f"j{line}", offset - start, prompt, output, prefix_blocks=blocks))
        if limit is not None and len(load) >= limit:
            break
    return load


def _jsonl_row(
    path: str | os.PathLike[str], line: int, text: str
) -> tuple[float, int, int, tuple[int | str, ...]]:
    where = f"{os.fspath(path)}:{line}"
    try:
        row = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not a JSON object ({err.msg})") from None
    except RecursionError:
        raise ValueError(f"{where}: nests arrays or objects too deeply to read") from None
    except ValueError as err:  # e.g. an integer over Python's digit limit
        raise ValueError(f"{where}: not a JSON object ({err})") from None
    if not isinstance(row, dict) or any(key not in row for key in JSONL_KEYS):
        raise ValueError(f"{where}: each line needs the keys {', '.join(JSONL_KEYS)}")
    stamp, prompt, output = (row[key] for key in JSONL_KEYS)
    number = not isinstance(stamp, bool) and isinstance(stamp, (int, float))
    if not (number and _finite(stamp)):
        shown = (
            repr(stamp)
            if len(repr(stamp)) <= 40
            else f"{repr(stamp)[:20]}... ({len(repr(stamp))} characters)"
        )
        raise ValueError(f"{where}: timestamp must be a finite number of ms, got {shown}")
    for key, value in (("input_length", prompt), ("output_length", output)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: {key} must be an integer >= 1, got {value!r}")
    try:
        blocks = Request("hash_ids", 0.0, 1, 1, prefix_blocks=row.get("hash_ids", ())).prefix_blocks
    except ValueError as err:
        raise ValueError(f"{where}: hash_ids: {str(err)[:200]}") from None
    return float(stamp), prompt, output, blocks


def _finite(value: float) -> bool:
    """Whether ``value`` is a float that is finite (an int too large for a float is not)."""
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False
