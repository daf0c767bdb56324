"""Calibrate the device under test: the measured tables, the fitted cost model (refused
constants recorded as 0, with their reasons), C* and the recommendation, and the KV cache's
size. The session calibrates once (``prefill_calibration``); the tables go to the summary and
the calibration into the run's archive, where ``--prefill-cost archive`` finds it later."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_prefill.report.calibration import calibration_tables, held_out_text
from pytest_prefill.report.sweep import kv_size_table

pytestmark = pytest.mark.gpu

TITLES = {
    "provenance": "Calibration: provenance",
    "prefill": "Calibration: prefill and chunk passes (median and spread; fit and held out)",
    "kv": "Calibration: decode step, batch 1, per cached-token count",
    "batch": "Calibration: decode step per batch size",
    "fused": "Calibration: fused passes (chunk + decode rows) against the fused rule",
    "constants": "Calibration: fitted cost model (refused constants recorded as 0)",
}
KV_PROMPTS = (512, 2048, 8192, 16384)


def test_calibration_tables_and_chunk_star(prefill_calibration, prefill_report):
    calibration = prefill_calibration
    for name, text in calibration_tables(calibration).items():
        prefill_report.table(TITLES.get(name, f"Calibration: {name}"), text)
    prefill_report.table(
        "Calibration: held-out error (the number to trust)",
        held_out_text(calibration),
        {
            "held_out_median_error": calibration.held_out_median,
            "in_sample_median_error": calibration.in_sample_median,
        },
    )
    host = calibration.provenance.get("host_share") or {}
    by_kind = ", ".join(f"{k} {v:.0%}" for k, v in (host.get("by_kind") or {}).items())
    peak = calibration.provenance.get("peak_device_memory_bytes")
    prefill_report.table(
        "Calibration: the host's share of each timed pass (enqueue time / synchronized wall time)",
        "\n".join(
            [
                host.get("line", "host share not recorded"),
                f"median by kind: {by_kind or 'n/a'}",
                "peak device memory: "
                + (f"{peak / 2**30:.2f} GiB" if isinstance(peak, int) else "n/a (not CUDA)"),
            ]
        ),
        {"host_share": host, "peak_device_memory_bytes": peak},
    )
    refused = [r.to_dict() for r in calibration.refusals]
    if refused:
        prefill_report.table(
            "Calibration: refused constants (recorded as 0)",
            "\n".join(f"{r['constant']}: {r['reason']}" for r in refused),
            refused,
        )
    advice = calibration.recommendation()
    prefill_report.table(
        "C* and the recommendation (from this calibration)",
        calibration.chunk_star_text(),
        {
            "chunk_star": calibration.cost.chunk_star(),
            "chunk_star_by_context": {
                str(c): calibration.cost.chunk_star(context=c) for c in calibration.contexts
            },
            "recommendation": advice.policy,
            "chunk": advice.chunk,
            "overhead_fraction": advice.overhead_fraction,
        },
    )

    cost = calibration.cost
    assert cost.decode_step_base > 0
    for refusal in calibration.refusals:
        if refusal.constant in {f.name for f in dataclasses.fields(cost)}:
            assert getattr(cost, refusal.constant) == 0 or refusal.constant == "decode_step_base"
    for key in ("device", "model", "dtype", "repeats", "host_share", "peak_device_memory_bytes"):
        assert key in calibration.provenance


def test_kv_cache_size(prefill_model, prefill_report):
    per_token = prefill_model.kv_bytes_per_token
    prefill_report.table(
        f"KV cache of {prefill_model.name} in {str(prefill_model.dtype).removeprefix('torch.')}:"
        f" {per_token:,} bytes per token; transfer times over ASSUMED links (not measured)",
        kv_size_table(per_token, KV_PROMPTS),
        {"kv_bytes_per_token": per_token, "prompt_lens": list(KV_PROMPTS)},
    )
    config = prefill_model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    element = 4 if "float32" in str(prefill_model.dtype) else 2
    assert per_token == config.num_hidden_layers * kv_heads * head_dim * 2 * element
