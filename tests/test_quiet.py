"""The quiet-machine probe and waiting for a quiet machine, with the machine's figures faked."""

from __future__ import annotations

import math

import pytest


def test_the_quiet_probe_counts_what_other_processes_used():
    from pytest_prefill.measure.quiet import QUIET_OTHER_CORES, quiet_probe

    ticks = iter([1000.0, 1000.0 + 150.0])  # 150 ticks of everyone's CPU time
    own = iter([10.0, 10.0 + 20.0])  # 20 of them ours

    quiet = quiet_probe(
        0.01, busy=lambda: next(ticks), own=lambda: next(own), ticks_per_second=100.0
    )
    # others used 130 ticks = 1.3 s of CPU over the probe's (short) wall time: busy
    assert quiet.other_cores is not None and quiet.other_cores > QUIET_OTHER_CORES
    assert not quiet.quiet and "BUSY MACHINE" in (quiet.warning or "")
    assert quiet.to_dict()["quiet"] is False


def test_the_quiet_probe_without_proc_stat_judges_by_jitter_alone():
    from pytest_prefill.measure.quiet import quiet_probe

    quiet = quiet_probe(0.01, busy=lambda: None, own=lambda: 0.0, workload=lambda: None)
    assert quiet.other_cores is None and quiet.seconds > 0
    assert quiet.quiet == (quiet.jitter <= 0.05)


@pytest.mark.parametrize("seconds", [0, -1, math.inf, math.nan, "1"])
def test_the_quiet_probe_refuses_a_bad_duration(seconds):
    from pytest_prefill.measure.quiet import quiet_probe

    with pytest.raises(ValueError, match="seconds"):
        quiet_probe(seconds)


def test_settle_probes_until_quiet_or_the_limit():
    from pytest_prefill.measure.quiet import Quietness, settle

    busy = Quietness(other_cores=1.0, jitter=0.01, cores=2, seconds=0.0)
    quiet = Quietness(other_cores=0.0, jitter=0.01, cores=2, seconds=0.0)
    answers = iter([busy, busy, quiet, busy])
    assert settle(10.0, probe=lambda: next(answers)) is quiet
    assert settle(0.0, probe=lambda: busy) is busy  # no time to wait: the first probe
    with pytest.raises(ValueError, match="limit"):
        settle(-1.0)
