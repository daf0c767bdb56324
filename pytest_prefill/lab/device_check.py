"""The device check's summary: from what scripts/device-check.sh brought into its folder so
far (preflight.json, run-calibration.json, run-falsifier.json, run-fidelity.json), the figures
a reader wants first -- the preflight's verdict, C* and the recommendation, the held-out error,
the host's share of the timed passes, the falsifier's verdict and fidelity -- each with what it
means, and what is missing. ``python -m pytest_prefill.lab.device_check OUT`` prints it.
Standard library only: it runs even where torch does not import."""

from __future__ import annotations

import gzip
import json
import math
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

STAGES = ("calibration", "falsifier", "fidelity")


def read(folder: str, name: str) -> Any:
    """The JSON document ``name`` in ``folder`` (``name.gz`` too), or None when absent or
    unreadable."""
    for candidate in (name, name + ".gz"):
        path = os.path.join(folder, candidate)
        if not os.path.isfile(path):
            continue
        try:
            opener = gzip.open if candidate.endswith(".gz") else open
            with opener(path, "rt", encoding="utf-8") as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return None
    return None


def _number(value: Any, form: str = "{:.3g}") -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value) if value is not None else "n/a"
    return form.format(value) if math.isfinite(value) else str(value)


def preflight_section(document: Any) -> list[str]:
    if not isinstance(document, Mapping):
        return ["preflight: MISSING (not run, or stopped before it wrote preflight.json)"]
    lines = [
        f"preflight: {'OK' if document.get('ok') else 'FAILED'} ({document.get('model')} on "
        f"{document.get('device')}, {document.get('dtype')})"
    ]
    for check in document.get("checks", []):
        mark = "ok" if check.get("ok") else "FAIL"
        lines.append(f"  [{mark}] {check.get('name')}: {check.get('detail')}")
    for shape, probe in (document.get("kernels") or {}).items():
        lines.append(f"  attention, {shape}: runs on {probe.get('runs_on')}")
    return lines


def calibration_section(run: Any) -> list[str]:
    calibration = run.get("calibration") if isinstance(run, Mapping) else None
    if not isinstance(calibration, Mapping):
        return ["calibration: MISSING (the stage did not finish or archived no calibration)"]
    provenance = calibration.get("provenance") or {}
    host = provenance.get("host_share") or {}
    held = calibration.get("held_out_median_error")
    refused = sorted({r.get("constant") for r in calibration.get("refusals", [])})
    by_context = calibration.get("chunk_star_by_context") or {}
    floor = calibration.get("floor") or {}
    peak = provenance.get("peak_device_memory_bytes")
    lines = [
        f"calibration: {provenance.get('model')} on {provenance.get('device_name')} "
        f"({provenance.get('dtype')}), runner {provenance.get('runner')}",
        f"  C* = {_number(calibration.get('chunk_star'), '{:.0f}')} tokens; by context: "
        + ", ".join(f"{c}: {_number(s, '{:.0f}')}" for c, s in by_context.items()),
        f"  recommendation: {calibration.get('recommendation')} "
        f"(chunk {calibration.get('recommended_chunk')})",
        f"  held-out error {_number(held, '{:.1%}')}: how far the fit predicts prompt lengths it "
        "was not fitted on (<= 25% to be trusted)",
        f"  host share {_number(host.get('median'), '{:.0%}')}: {host.get('line', 'not recorded')}",
        f"  refused (recorded as 0): {', '.join(refused) or 'none'}",
        f"  prefill floor {_number(floor.get('value'), '{:.3g}')} s up to "
        f"{floor.get('knee', 0)} tokens; peak device memory "
        + (f"{peak / 2**30:.2f} GiB" if isinstance(peak, (int, float)) else "n/a"),
    ]
    return lines


def verdict_section(run: Any, stage: str, meaning: str) -> list[str]:
    verdicts = run.get("verdicts") if isinstance(run, Mapping) else None
    if not isinstance(verdicts, list):
        return [f"{stage}: MISSING (the stage did not finish or archived nothing)"]
    found = [v for v in verdicts if isinstance(v, Mapping) and v.get("name") == stage]
    if not found:
        return [f"{stage}: no verdict recorded (see pytest-gpu.txt)"]
    lines = []
    for v in found:
        lines += [
            f"{stage}: {v.get('verdict')} -- {v.get('detail') or v.get('sentence')}",
            f"  claim: {v.get('sentence')}",
        ]
    return [*lines, f"  ({meaning})"]


def falsifier_chunk(run: Any) -> list[str]:
    tables = run.get("tables") if isinstance(run, Mapping) else None
    for table in tables if isinstance(tables, list) else []:
        data = table.get("data") if isinstance(table, Mapping) else None
        if isinstance(data, Mapping) and "chunk_source" in data:
            return [f"  chunk {data.get('chunk')} ({data.get('chunk_source')})"]
    return []


def summary(folder: str) -> list[str]:
    """Every section, in the order a reader wants them, and what is missing."""
    runs = {stage: read(folder, f"run-{stage}.json") for stage in STAGES}
    lines = [f"device check summary ({folder})", ""]
    lines += preflight_section(read(folder, "preflight.json")) + [""]
    lines += calibration_section(runs["calibration"]) + [""]
    lines += verdict_section(
        runs["falsifier"],
        "falsifier",
        "HOLDS: a chunk fused with the decode step stalls a live stream less than a whole "
        "prefill does, here",
    )
    lines += falsifier_chunk(runs["falsifier"]) + [""]
    lines += verdict_section(
        runs["fidelity"],
        "fidelity",
        "how closely the simulator, calibrated on this engine, predicts the engine's real runs",
    )
    missing = [name for name in STAGES if runs[name] is None]
    if missing:
        lines += ["", f"not brought back: {', '.join(missing)} (stopped, failed or not run)"]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1 or not os.path.isdir(args[0]):
        print("usage: python -m pytest_prefill.lab.device_check OUT_DIR", file=sys.stderr)
        return 2
    print("\n".join(summary(args[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
