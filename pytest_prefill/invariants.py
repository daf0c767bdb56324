"""Temporary: the oracle lives in :mod:`pytest_prefill.sim.oracle`."""

from pytest_prefill.sim.oracle import check_invariants, close, iteration_cost

__all__ = ["check_invariants", "close", "iteration_cost"]
