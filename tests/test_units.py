"""How a duration is printed for a person: the unit that puts it between 1 and 1,000."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pytest_prefill.units import readable

pytestmark = pytest.mark.sim
SCALE = {"ns": 1e-9, "µs": 1e-6, "ms": 1e-3, "s": 1.0}


@given(st.floats(1e-9, 999.0), st.integers(2, 4))
def test_a_duration_reads_back_within_its_digits_in_a_unit_that_fits(seconds, digits):
    number, unit = readable(seconds, digits).split()
    value = float(number.replace(",", "")) * SCALE[unit]
    assert "e" not in number
    assert 1 <= float(number.replace(",", "")) < 1000 or unit == "s"
    assert math.isclose(value, seconds, rel_tol=10.0 ** (1 - digits))


def test_the_calibration_figure_a_new_user_met():
    assert readable(2.317e-05) == "23.2 µs"  # printed as 2.317e+04 ns before
    assert readable(0.0) == "0 s" and readable(math.inf) == "-"
