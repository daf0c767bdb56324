"""Workloads: the lab scenario, seeded Poisson loads, the Azure 2023 trace loader."""

from __future__ import annotations

import statistics

import pytest

from pytest_prefill.scheduler import Request
from pytest_prefill.workloads import azure_trace_path, lab_scenario, load_azure, poisson

pytestmark = pytest.mark.sim

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def write_csv(tmp_path, rows: list[str]):
    path = tmp_path / "trace.csv"
    path.write_text(HEADER + "".join(row + "\n" for row in rows))
    return path


def test_lab_scenario_has_live_streams_and_a_late_prompt():
    load = lab_scenario(streams=3, prompt_len=4096, arrival=0.2)
    live, long = load[:3], load[3]
    assert all(r.arrival == 0.0 for r in live)
    assert (long.id, long.arrival, long.prompt_len) == ("long", 0.2, 4096)


def test_poisson_is_seeded_and_has_the_asked_rate():
    a = poisson(20.0, 4000, seed=7)
    assert a == poisson(20.0, 4000, seed=7)
    assert a != poisson(20.0, 4000, seed=8)
    gaps = [y.arrival - x.arrival for x, y in zip(a, a[1:])]
    # mean inter-arrival 1/rate; its standard error is (1/rate)/sqrt(n) ~ 0.0008
    assert statistics.fmean(gaps) == pytest.approx(1 / 20.0, abs=5 * 0.05 / 4000**0.5)
    assert all(g >= 0 for g in gaps)


def test_poisson_samples_lengths_from_a_sequence_or_a_function():
    lengths = [100, 200, 300]
    load = poisson(5.0, 200, prompt_len=lengths, output_len=lambda rng: rng.randint(1, 4))
    assert {r.prompt_len for r in load} <= set(lengths)
    assert {r.output_len for r in load} <= {1, 2, 3, 4}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [(dict(rate=0), "rate"), (dict(count=-1), "count"), (dict(prompt_len=[]), "prompt_len")],
)
def test_poisson_refuses_bad_arguments(kwargs, field):
    args = {"rate": 1.0, "count": 3, **kwargs}
    with pytest.raises(ValueError, match=field):
        poisson(args.pop("rate"), args.pop("count"), **args)


def test_azure_loader_reads_seven_fractional_digits(tmp_path):
    path = write_csv(
        tmp_path,
        [
            "2023-11-16 18:17:03.9799600,4808,10",
            "2023-11-16 18:17:04.0319600,3180,8",
            "2023-11-16 18:17:05.5000000,110,27",
        ],
    )
    load = load_azure(path)
    assert [r.prompt_len for r in load] == [4808, 3180, 110]
    assert [r.arrival for r in load] == pytest.approx([0.0, 0.052, 5.5 - 3.97996])
    assert all(isinstance(r, Request) for r in load)


def test_azure_window_limit_and_rate_scale(tmp_path):
    rows = [f"2023-11-16 18:00:{s:02d}.0000000,{100 + s},{1 + s}" for s in range(0, 20)]
    path = write_csv(tmp_path, rows)
    window = load_azure(path, start=5, duration=10)
    assert [r.prompt_len for r in window] == list(range(105, 115))
    assert window[0].arrival == 0.0 and window[-1].arrival == pytest.approx(9.0)
    assert len(load_azure(path, limit=4)) == 4
    faster = load_azure(path, rate_scale=2.0)
    assert [r.arrival for r in faster] == pytest.approx([s / 2 for s in range(20)])


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (["2023-11-16 18:17:03.9799600,0,10"], "token counts must be >= 1"),
        (["not a time,10,10"], "trace.csv:2"),
        (["2023-11-16 18:17:03.9799600,10"], "trace.csv:2"),
    ],
)
def test_azure_loader_names_the_bad_line(tmp_path, rows, message):
    with pytest.raises(ValueError, match=message):
        load_azure(write_csv(tmp_path, rows))


def test_azure_loader_refuses_a_foreign_header(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(ValueError, match="header must be"):
        load_azure(path)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(start=-1), "start"),
        (dict(duration=0), "duration"),
        (dict(limit=0), "limit"),
        (dict(rate_scale=-2), "rate_scale"),
    ],
)
def test_azure_loader_refuses_bad_arguments(tmp_path, kwargs, field):
    with pytest.raises(ValueError, match=field):
        load_azure(write_csv(tmp_path, ["2023-11-16 18:17:03.9799600,10,10"]), **kwargs)


@pytest.mark.parametrize("name", ["code", "conv"])
def test_the_shared_azure_traces_load_whole(name):
    path = azure_trace_path(name)
    if path is None:
        pytest.skip("the Azure traces are not in ../shared/data/azure-llm-inference-2023")
    with open(path) as handle:
        rows = sum(1 for _ in handle) - 1
    load = load_azure(path)
    assert len(load) == rows
    assert all(b.arrival >= a.arrival for a, b in zip(load, load[1:]))
    assert load[-1].arrival < 3600 * 1.01  # each trace covers about an hour
