"""The cost-model presets (sim/presets.py): labelled with their source, the lab's C*."""

from __future__ import annotations

import pytest

from pytest_prefill.sim import (
    PRESETS,
)

pytestmark = pytest.mark.sim


def test_presets_say_where_their_numbers_come_from():
    for preset in PRESETS.values():
        assert preset.name and len(preset.source) > 40
    assert "published calibration" in PRESETS["lab-laptop"].source
    assert "ILLUSTRATIVE" in PRESETS["datacenter-illustrative"].source
    assert PRESETS["lab-laptop"].cost.kv_bytes_per_token == 28 * 8 * 128 * 2 * 2


def test_chunk_star_without_arguments_is_the_labs_formula_exactly():
    for preset in PRESETS.values():
        c = preset.cost
        assert (
            c.chunk_star() == (c.decode_step_base - c.prefill_pass_overhead) / c.prefill_per_token
        )
    assert round(PRESETS["lab-laptop"].cost.chunk_star()) == 121
