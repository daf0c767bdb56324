"""Small trace files written for a test: an Azure-format CSV and a JSON-lines trace."""

from __future__ import annotations

import json

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def write_csv(tmp_path, rows: list[str]):
    path = tmp_path / "trace.csv"
    path.write_text(HEADER + "".join(row + "\n" for row in rows))
    return path


def write_jsonl(tmp_path, rows, name="trace.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
