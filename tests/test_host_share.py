"""The host's share of each timed pass (enqueue time over synchronized wall time), recorded in
every measurement and summarised in a calibration's provenance; and a point that runs out of
memory is skipped with its size and what to try, not a crash. Timings come from a fake clock."""

from __future__ import annotations

import json
import math

import pytest

pytest.importorskip("numpy")

from pytest_prefill.measure import timing  # noqa: E402
from pytest_prefill.measure.calibrate import HOST_BOUND_SHARE, host_share_summary  # noqa: E402
from pytest_prefill.measure.calibration_points import Point  # noqa: E402
from pytest_prefill.measure.sweep import (  # noqa: E402
    OUT_OF_MEMORY_ADVICE,
    PassSweep,
    measure_decode_batch,
    measure_decode_kv,
)
from pytest_prefill.measure.timing import Measurement, measure  # noqa: E402

pytestmark = pytest.mark.sim


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("enqueue, device", [(1.0, 3.0), (2.0, 0.0), (0.5, 0.25)])
def test_the_host_share_is_enqueue_time_over_synchronized_wall_time(monkeypatch, enqueue, device):
    clock = FakeClock()
    monkeypatch.setattr(timing.time, "perf_counter", clock)
    waiting = [0.0]

    def work() -> None:  # the host enqueues for `enqueue` s; the device then runs `device` s
        clock.now += enqueue
        waiting[0] = device

    def sync() -> None:
        clock.now += waiting[0]
        waiting[0] = 0.0

    m = measure(work, repeats=5, warmup=1, sync=sync)
    assert m.samples == (enqueue + device,) * 5
    assert m.host == (enqueue,) * 5
    assert m.host_share == pytest.approx(enqueue / (enqueue + device))


def test_host_times_survive_the_json_round_trip_and_old_documents_still_read():
    m = Measurement.from_samples([2.0, 4.0, 3.0], host=[1.0, 1.0, 3.0])
    data = json.loads(json.dumps(m.to_dict()))
    assert data["host_share"] == pytest.approx(0.5)  # median of 0.5, 0.25, 1.0
    assert Measurement.from_dict(data) == m
    old = {k: v for k, v in data.items() if not k.startswith("host")}
    assert Measurement.from_dict(old).host_share is None


@pytest.mark.parametrize("host", [[1.0], [1.0, -1.0, 1.0], [1.0, math.nan, 1.0]])
def test_bad_host_times_are_refused(host):
    with pytest.raises(ValueError, match="host"):
        Measurement.from_samples([1.0, 1.0, 1.0], host=host)


def _point(kind: str, x: int, share: float) -> Point:
    wall = 1e-2
    return Point(kind, x, Measurement.from_samples([wall] * 3, host=[share * wall] * 3))


def test_a_host_bound_calibration_says_it_measures_the_eager_engine_on_this_host():
    points = [_point("prefill", 64, 0.99), _point("prefill", 512, 0.95), _point("decode_kv", 8, 1)]
    summary = host_share_summary(points, "cuda:0")
    assert summary["host_bound"] is True
    assert summary["median"] == pytest.approx(0.99)
    assert summary["by_kind"] == {"decode_kv": 1.0, "prefill": pytest.approx(0.97)}
    assert "this measures the eager engine on this host" in summary["line"]


def test_a_device_bound_calibration_says_the_timings_are_the_devices():
    points = [_point("prefill", 4096, 0.1), _point("prefill", 8192, 0.05)]
    summary = host_share_summary(points, "cuda:0")
    assert summary["median"] < HOST_BOUND_SHARE and summary["host_bound"] is False
    assert "the timings are the device's" in summary["line"]


def test_without_host_times_the_share_is_said_not_recorded():
    points = [Point("prefill", 64, Measurement.from_samples([1.0, 1.0, 1.0]))]
    assert host_share_summary(points, "cpu") == {
        "median": None,
        "host_bound": None,
        "line": "host share not recorded",
    }


class OutOfMemoryError(RuntimeError):  # named as torch's is
    pass


class SmallDevice:
    """A runner whose device holds passes up to ``limit`` tokens."""

    name = "fake"

    def __init__(self, limit: int) -> None:
        self.limit = limit

    def _pass(self, tokens: int) -> Measurement:
        if tokens > self.limit:
            raise OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return Measurement.from_samples([tokens * 1e-6] * 3)

    def time_prefill(self, tokens, *, repeats, warmup):
        return self._pass(tokens)

    def time_chunk(self, tokens, context, *, repeats, warmup):
        return self._pass(tokens + context)

    def time_decode(self, caches, *, repeats, warmup):
        return self._pass(sum(caches))


def test_out_of_memory_skips_the_point_naming_its_size_and_what_to_try():
    sweep = PassSweep(SmallDevice(1000), repeats=3, warmup=0)
    points = sweep.prefill([256, 512, 2048, 4096]) + sweep.chunks([(256, 512), (512, 1024)])
    assert [p.label() for p in points] == ["prefill 256", "prefill 512", "chunk 256 over 512"]
    assert sweep.skipped[0].startswith("prefill 2,048 tokens: out of memory (CUDA out of memory")
    assert sweep.skipped[1].startswith("chunk 512 over 1,024: out of memory")
    assert all(OUT_OF_MEMORY_ADVICE in reason for reason in sweep.skipped)
    skipped: list[str] = []
    kv = measure_decode_kv(SmallDevice(1000), [512, 4096], repeats=3, warmup=0, skipped=skipped)
    assert [p.x for p in kv] == [512] and "decode, 1 x 4,096 cached" in skipped[0]


def test_the_batch_sweep_skips_a_batch_too_large_and_keeps_the_rest_in_order():
    said: list[str] = []
    skipped: list[str] = []
    device = SmallDevice(1000)
    batch = measure_decode_batch(
        device, [2, 16, 4], context=100, repeats=3, warmup=0, progress=said.append, skipped=skipped
    )
    assert [(p.kind, p.x, p.context) for p in batch] == [
        ("decode_batch", 2, 100),
        ("decode_batch", 4, 100),
    ]
    tokens = [2 * 100, 4 * 100]  # rows x cached tokens each; the fake takes 1 us a token
    assert [p.measurement.median for p in batch] == pytest.approx([t * 1e-6 for t in tokens])
    assert len(skipped) == 1 and skipped[0].startswith(
        "decode, batch 16 x 100 cached: out of memory"
    )
    assert [line.split(":")[0] for line in said] == [
        "decode, batch   2 x 100 cached",
        skipped[0].split(":")[0],
        "decode, batch   4 x 100 cached",
    ]


def test_other_errors_are_not_taken_for_out_of_memory():
    class Broken(SmallDevice):
        def time_prefill(self, tokens, *, repeats, warmup):
            raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        PassSweep(Broken(10), repeats=3, warmup=0).prefill([64])
