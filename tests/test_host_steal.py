"""The host's CPU steal (serve.host_steal): /proc/stat read and the steal fraction by its
formula, the quiet host's wait, its redo of a run the host stole from, its bounds, and a probe
search whose first probe is redone with a fresh salt, said in the progress and the report."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from poisson_load import poisson_load

from pytest_prefill.measure.quiet import HostSteal, QuietHost, cpu_times, quietly, steal_between
from pytest_prefill.serve.client.identity import identify
from pytest_prefill.serve.client.prompts import Prompts
from pytest_prefill.serve.load.loadgen import Target

WORDS = Prompts(
    tuple(f" w{chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(80)), tuple(range(80)), "test"
)

# user nice system idle iowait irq softirq steal guest guest_nice
LINE = "cpu  1000 5 200 3000 10 0 4 40 300 0\n"


class Host:
    """A /proc/stat stand-in: each reading adds 1,000 ticks, of which the host stole the
    fraction scripted for that interval (interval i lies between readings i and i+1)."""

    def __init__(self, stolen: dict[int, float] | None = None, default: float = 0.0):
        self.stolen, self.default, self.reads = stolen or {}, default, 0
        self.ticks = [0] * 10

    def __call__(self) -> tuple[int, ...]:
        if self.reads:
            steal = round(1000 * self.stolen.get(self.reads - 1, self.default))
            self.ticks[0] += 1000 - steal
            self.ticks[7] += steal
            self.ticks[8] += 500  # guest time, inside user time: not in the total
        self.reads += 1
        return tuple(self.ticks)


def _sleeps() -> tuple[list[float], object]:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    return slept, sleep


def test_cpu_times_reads_the_cpu_line_or_nothing(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(LINE + "cpu0 1 2 3 4 5 6 7 8 9 10\n")
    assert cpu_times(str(stat)) == (1000, 5, 200, 3000, 10, 0, 4, 40, 300, 0)
    assert cpu_times(str(tmp_path / "missing")) is None
    stat.write_text("cpu  1 2 3 4 5 6 7\n")  # no steal field (an old kernel)
    assert cpu_times(str(stat)) is None
    stat.write_text("cpu  1 2 x 4 5 6 7 8\n")
    assert cpu_times(str(stat)) is None


def test_steal_is_the_stolen_share_of_the_ticks_between_two_readings_guest_left_out():
    before = (1000, 5, 200, 3000, 10, 0, 4, 40, 300, 0)
    after = (1500, 5, 300, 3300, 10, 0, 6, 90, 700, 0)  # 500+100+300+2+50 = 952 ticks, 50 stolen
    assert steal_between(before, after) == pytest.approx(50 / 952)
    assert steal_between(before, before) is None  # no tick passed
    assert steal_between(None, after) is None and steal_between(before, None) is None


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_steal", 0.0),
        ("max_steal", 1.0),
        ("max_steal", True),
        ("max_wait", -1.0),
        ("max_wait", float("inf")),
        ("redo", -1),
        ("redo", 1.5),
        ("window", 0.0),
    ],
)
def test_a_quiet_host_refuses_what_cannot_bound_it(field, value):
    with pytest.raises(ValueError, match=field):
        QuietHost(**{field: value})


def _run(quiet: QuietHost, lines: list[str] | None = None) -> tuple[list[int], HostSteal]:
    attempts: list[int] = []

    async def measure(attempt: int) -> int:
        attempts.append(attempt)
        return attempt

    async def go():
        return await quiet.run(
            measure, what="probe 1", progress=(lines if lines is not None else []).append
        )

    kept, host = asyncio.run(go())
    assert kept == attempts[-1]  # the last attempt's result is the one kept
    return attempts, host


def test_a_run_on_a_quiet_host_runs_once_after_one_window():
    slept, sleep = _sleeps()
    attempts, host = _run(QuietHost(0.02, read=Host(default=0.004), sleep=sleep))
    assert attempts == [0] and slept == [5.0]
    assert host.steal == pytest.approx(0.004) and host.redone == () and host.quiet
    assert host.waited == 5.0 and not host.over and host.text() == "0.4%"


def test_a_run_the_host_stole_from_is_redone_with_each_attempts_steal_kept():
    slept, sleep = _sleeps()
    lines: list[str] = []
    # readings per attempt: wait's two, then the run's two: attempt a's run is interval 4a + 2
    host_of = Host({2: 0.05, 6: 0.03}, default=0.0)
    attempts, host = _run(QuietHost(0.02, read=host_of, sleep=sleep), lines)
    assert attempts == [0, 1, 2]
    assert host.redone == pytest.approx((0.05, 0.03)) and host.steal == 0.0 and not host.over
    assert host.text() == "0.0% (redone: 5.0%, 3.0%)"
    assert len(lines) == 2 and "probe 1: the host stole 5.0%" in lines[0] and "redone" in lines[0]


def test_redoing_stops_at_its_bound_and_the_run_kept_is_marked_over():
    slept, sleep = _sleeps()
    host_of = Host({2: 0.05, 6: 0.06, 10: 0.07}, default=0.0)
    attempts, host = _run(QuietHost(0.02, redo=2, read=host_of, sleep=sleep))
    assert attempts == [0, 1, 2]  # two redos, then kept whatever it took
    assert host.over and host.steal == pytest.approx(0.07)
    assert host.text() == "7.0% > 2.0% (redone: 5.0%, 6.0%)"


def test_the_wait_needs_a_window_under_half_the_limit_and_gives_up_at_its_longest():
    slept, sleep = _sleeps()
    # windows stealing 1.5% (over half of 2%) twice, then 0.9%: waits three windows
    attempts, host = _run(QuietHost(0.02, read=Host({0: 0.015, 2: 0.015}), sleep=sleep))
    assert slept == [5.0, 5.0, 5.0] and host.quiet and host.waited == 15.0
    slept, sleep = _sleeps()
    noisy = Host(default=0.015)  # never quiet: runs after max_wait, says so, keeps the run
    attempts, host = _run(QuietHost(0.02, max_wait=20.0, redo=0, read=noisy, sleep=sleep))
    assert slept == [5.0] * 4 and not host.quiet and attempts == [0]
    assert "after 20 s not quiet" in host.text()


def test_where_nothing_can_be_read_nothing_is_waited_for():
    slept, sleep = _sleeps()
    quiet = QuietHost(0.02, read=lambda: None, sleep=sleep)
    attempts, host = _run(quiet)
    assert attempts == [0] and slept == [] and host.steal is None and host.text() == "-"
    assert "nothing is waited for" in quiet.sentence()

    async def measure(attempt: int) -> str:
        return f"run {attempt}"

    assert asyncio.run(quietly(None, measure, "probe 1")) == ("run 0", None)


def test_a_probe_redone_for_steal_is_sent_afresh_and_the_report_says_so():
    from pytest_prefill.plan.metrics import SLO
    from pytest_prefill.report.verify import probe_table
    from pytest_prefill.serve.launch.reference import Behaviour, running
    from pytest_prefill.verify.knee import measure_knee
    from pytest_prefill.verify.probe_rule import ProbeRule, probe_load
    from pytest_prefill.verify.result import FlagSetResult, VerifyResult
    from pytest_prefill.verify.verification import FlagSet

    rule = ProbeRule(margin=0.15, max_probes=2, min_requests=4)
    load = probe_load(poisson_load(20, 20.0), rule)
    slept, sleep = _sleeps()
    lines: list[str] = []
    quiet = QuietHost(0.02, read=Host({2: 0.05}), sleep=sleep)  # probe 1's first attempt

    async def go():
        async with running(Behaviour(ttft=0.01, gap=0.002)) as url:
            target = Target(url, await identify(url, engine="openai"), WORDS)

            async def alive():
                return None

            return await measure_knee(
                target, load, SLO(ttft=1.0), rule, 1.0, alive=alive, quiet=quiet,
                progress=lines.append, tag="t-",
            )  # fmt: skip

    knee = asyncio.run(go())
    first, second = knee.probes
    assert first.run.host is not None and first.run.host.redone == pytest.approx((0.05,))
    assert second.run.host is not None and second.run.host.redone == ()
    assert {r.id.split("-")[1] for r in first.run.records} == {"p0r1"}  # the redo's own ids
    assert first.sent == first.good == len(load)  # the kept attempt's requests, every one met
    assert first.run.settings["prompt_salt"].endswith("-t-p0r1")  # salted afresh
    assert any("probe 1: the host stole 5.0%" in line for line in lines)
    assert any("host steal 0.0% (redone: 5.0%)" in line for line in lines)
    result = dataclasses.replace(FlagSetResult(FlagSet(128)), measured=knee)
    table = probe_table(VerifyResult("w", SLO(ttft=1.0), rule, (result,), "openai"))
    assert "host steal" in table and "0.0% (redone: 5.0%)" in table
    document = first.to_dict()["run"]["host"]
    assert document["redone"] == pytest.approx([0.05]) and document["over"] is False
