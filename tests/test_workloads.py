"""Workloads: the lab scenario, seeded Poisson loads, workloads by name; and the trace readers
(plan/traces: the Azure 2023 CSV, JSON lines)."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from pytest_prefill.plan.traces import azure_trace_path, load_azure, load_jsonl
from pytest_prefill.plan.workloads import (
    lab_scenario,
    poisson,
    resolve_workload,
    scale_rate,
)
from pytest_prefill.sim import Request

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


@pytest.mark.parametrize("spec", [1.5, "1024", True, None, 0])
def test_poisson_refuses_a_length_that_is_no_int_function_or_sequence(spec):
    with pytest.raises(ValueError, match="prompt_len must be an integer >= 1, a function"):
        poisson(1, 2, prompt_len=spec)


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


# --- workloads by name (the command line's --workload) and JSONL traces ---


def write_jsonl(tmp_path, rows, name="trace.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_jsonl_rows_are_read_in_time_order_and_extra_keys_ignored(tmp_path):
    rows = [
        {"timestamp": 3000, "input_length": 30, "output_length": 3, "hash_ids": [1, 2]},
        {"timestamp": 1000, "input_length": 10, "output_length": 1},
        {"timestamp": 1000.5, "input_length": 20, "output_length": 2},
    ]
    load = load_jsonl(write_jsonl(tmp_path, rows))
    assert [r.prompt_len for r in load] == [10, 20, 30]
    assert [r.arrival for r in load] == pytest.approx([0.0, 0.0005, 2.0])
    assert len({r.id for r in load}) == 3


def test_jsonl_window_and_limit(tmp_path):
    rows = [{"timestamp": s * 1000, "input_length": 1 + s, "output_length": 1} for s in range(20)]
    path = write_jsonl(tmp_path, rows)
    window = load_jsonl(path, start=5, duration=10)
    assert [r.prompt_len for r in window] == list(range(6, 16))
    assert window[0].arrival == 0.0
    assert len(load_jsonl(path, start=5, limit=3)) == 3


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not json\n", "trace.jsonl:3: not a JSON object"),
        ('{"timestamp": 1, "input_length": 5}\n', "needs the keys"),
        ('{"timestamp": "x", "input_length": 5, "output_length": 1}\n', "timestamp"),
        ('{"timestamp": 1, "input_length": 0, "output_length": 1}\n', "input_length"),
        ('{"timestamp": 1, "input_length": 5, "output_length": 2.5}\n', "output_length"),
        ("[1, 2, 3]\n", "needs the keys"),
    ],
)
def test_a_bad_jsonl_line_is_named(tmp_path, text, message):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n\n' + text)
    with pytest.raises(ValueError, match=message):
        load_jsonl(path)


def test_resolve_lab_is_the_lab_scenario_and_takes_no_rate():
    workload = resolve_workload("lab")
    assert list(workload.requests) == lab_scenario()
    with pytest.raises(ValueError, match="takes no request_rate"):
        resolve_workload("lab", request_rate=2.0)


def test_resolve_poisson_uses_rate_count_and_seed():
    workload = resolve_workload("poisson", request_rate=5.0, num_prompts=50, seed=3)
    assert list(workload.requests) == poisson(5.0, 50, seed=3)
    assert resolve_workload("poisson").requests == tuple(poisson(1.0, 1000, seed=0))


def test_resolve_a_trace_file_with_a_window_a_limit_and_a_request_rate(tmp_path):
    rows = [{"timestamp": s * 500, "input_length": 100 + s, "output_length": 4} for s in range(40)]
    path = write_jsonl(tmp_path, rows)
    workload = resolve_workload(str(path), window=(2.0, 12.0), num_prompts=10, request_rate=8.0)
    assert [r.prompt_len for r in workload.requests] == list(range(104, 114))
    assert workload.rate == pytest.approx(8.0)  # (n - 1) / span
    assert path.name in workload.description and "window 2:12" in workload.description
    assert str(path.parent) not in workload.description  # no absolute path in a title


def test_resolve_rate_scale_divides_arrivals(tmp_path):
    path = write_csv(tmp_path, [f"2023-11-16 18:00:{s:02d}.0000000,100,5" for s in range(10)])
    base = resolve_workload(str(path))
    faster = resolve_workload(str(path), rate_scale=4.0)
    assert [r.arrival for r in faster.requests] == pytest.approx(
        [r.arrival / 4 for r in base.requests]
    )
    assert faster.rate == pytest.approx(4 * base.rate)


def test_resolve_caps_prompts_at_the_models_context_and_counts_them(tmp_path):
    path = write_csv(
        tmp_path, [f"2023-11-16 18:00:0{s}.0000000,{1000 * s + 1},5" for s in range(5)]
    )
    workload = resolve_workload(str(path), max_model_len=2500)
    assert [r.prompt_len for r in workload.requests] == [1, 1001, 2001, 2500, 2500]
    assert workload.capped == 2


def test_resolve_an_azure_trace_carries_its_attribution():
    if azure_trace_path("conv") is None:
        pytest.skip("the Azure traces are not in ../shared/data/azure-llm-inference-2023")
    workload = resolve_workload("azure-conv", window=(0, 60))
    assert workload.requests and workload.requests[-1].arrival < 60
    assert "Splitwise" in (workload.attribution or "") and "CC-BY 4.0" in workload.attribution


@pytest.mark.parametrize(
    ("spec", "kwargs", "message"),
    [
        ("nonsense", {}, "is not one of lab, poisson, azure-conv, azure-code"),
        ("poisson", {"request_rate": 0}, "request_rate"),
        ("poisson", {"num_prompts": 0}, "num_prompts"),
        ("poisson", {"request_rate": 1.0, "rate_scale": 2.0}, "give one"),
        ("poisson", {"window": (5, 2)}, "window end must be after"),
        ("poisson", {"window": (-1, None)}, "window start"),
        ("poisson", {"window": (1e9, None)}, "has no request"),
        ("poisson", {"max_model_len": 0}, "max_model_len"),
        ("poisson", {"rate_scale": math.inf}, "rate_scale"),
        ("", {}, "workload must be"),
    ],
)
def test_resolve_refuses_bad_input(spec, kwargs, message):
    with pytest.raises(ValueError, match=message):
        resolve_workload(spec, **kwargs)


def test_resolve_refuses_a_file_it_cannot_read(tmp_path):
    path = tmp_path / "trace.txt"
    path.write_text("hello\n")
    with pytest.raises(ValueError, match=r"must end in \.csv .* or \.jsonl"):
        resolve_workload(str(path))


def test_scale_rate_refuses_a_non_positive_factor():
    with pytest.raises(ValueError, match="rate scale"):
        scale_rate(lab_scenario(), 0)


def test_azure_rows_out_of_time_order_are_sorted_not_dropped(tmp_path):
    stamps = ["18:17:10", "18:17:03", "18:17:05", "18:17:12"]
    path = write_csv(tmp_path, [f"2023-11-16 {t}.0000000,{10 + i},2" for i, t in enumerate(stamps)])
    load = load_azure(path)
    # every row, in time order from the earliest; an id is the row of the file
    assert [(r.id, r.arrival, r.prompt_len) for r in load] == [
        ("az1", 0.0, 11),
        ("az2", 2.0, 12),
        ("az0", 7.0, 10),
        ("az3", 9.0, 13),
    ]
    assert [r.id for r in load_azure(path, start=1, duration=7)] == ["az2", "az0"]
    assert [r.id for r in load_azure(path, limit=2)] == ["az1", "az2"]


def test_azure_loader_names_the_line_of_a_field_over_the_csv_limit(tmp_path):
    path = write_csv(
        tmp_path, ["2023-11-16 18:17:03.0,10,10", "2023-11-16 18:17:04.0,10," + "1" * 140_000]
    )
    with pytest.raises(ValueError, match=r"trace\.csv:3: not a CSV row \(field larger"):
        load_azure(path)


def test_azure_loader_names_the_file_and_line_of_bytes_that_are_not_utf8(tmp_path):
    path = tmp_path / "trace.csv"
    path.write_bytes(
        HEADER.encode() + b"2023-11-16 18:17:03.0,10,10\n2023-11-16 18:17:04.0,1\xff,2\n"
    )
    with pytest.raises(ValueError, match=r"trace\.csv:3: not UTF-8 text"):
        load_azure(path)


# --- input the hostile run found: one line naming the file and line, never a traceback ----------


@pytest.mark.parametrize(
    ("name", "content", "words"),
    [
        (
            "huge.jsonl",
            b'{"timestamp": 1' + b"0" * 400 + b', "input_length": 5, "output_length": 5}\n',
            "huge.jsonl:1: timestamp must be a finite number of ms",
        ),
        ("deep.jsonl", b"[" * 100_000 + b"]" * 100_000 + b"\n", "deep.jsonl:1: nests"),
        (
            "latin1.jsonl",
            '{"timestamp": 1, "input_length": 5, "output_length": 5, "x": "é"}\n'.encode("latin-1"),
            "latin1.jsonl:1: not UTF-8 text",
        ),
        ("zipped.jsonl", None, "zipped.jsonl:1: not UTF-8 text"),
        (
            "future.csv",
            (HEADER + "2023-01-01 00:00:00.0,5,5\n9999-12-31 23:59:59.9999999,5,5\n").encode(),
            "future.csv:3: cannot read row",
        ),
        (
            "digits.csv",
            (HEADER + "2023-01-01 00:00:00.0,١٢,5\n").encode(),
            "digits.csv:2: cannot read row",
        ),
        ("under.csv", (HEADER + "2023-01-01 00:00:00.0,1_000,5\n").encode(), "under.csv:2"),
        (
            "frac.csv",
            (HEADER + "2023-01-01 00:00:00.١٢,5,5\n").encode(),
            "frac.csv:2: cannot read row",
        ),
    ],
)
def test_a_trace_that_cannot_be_read_is_one_line_naming_file_and_line(
    tmp_path, name, content, words
):
    """6: a 400-digit timestamp (OverflowError), 100,000-deep nesting (RecursionError), the year
    9999 rounding up (OverflowError), gzip or latin-1 JSONL (no path, no line); 13: digits of
    other scripts and ``1_000`` were read as numbers in a CSV."""
    import gzip

    if content is None:
        content = gzip.compress(b'{"timestamp": 1, "input_length": 5, "output_length": 5}\n')
    path = tmp_path / name
    path.write_bytes(content)
    reader = load_jsonl if name.endswith(".jsonl") else load_azure
    with pytest.raises(ValueError) as info:
        reader(path)
    assert f"{path.parent}/{words}" in str(info.value)
    if name == "zipped.jsonl":
        assert "gzip-compressed: decompress it first" in str(info.value)


def test_a_trace_line_over_the_bound_is_refused_without_reading_it_whole(tmp_path, monkeypatch):
    """7: one 1 GiB line cost 6.2 GB and 31 s; lines are read at most MAX_LINE_BYTES at a time."""
    import pytest_prefill.plan.traces as traces

    monkeypatch.setattr(traces, "MAX_LINE_BYTES", 1000)
    path = tmp_path / "long.jsonl"
    line = '{"timestamp": 1, "input_length": 5, "output_length": 5, "pad": "%s"}\n'
    path.write_text(line % "" + line % ("x" * 5000))
    with pytest.raises(ValueError, match=r"long.jsonl:2: a line over"):
        load_jsonl(path)
    csv_path = write_csv(tmp_path, ["2023-01-01 00:00:00.0,5,5", "2023-01-01 00:00:01.0," * 200])
    with pytest.raises(ValueError, match=r"trace.csv:3: a line over"):
        load_azure(csv_path)
    assert traces.MAX_LINE_BYTES == 1000  # the bound the readers use is the module's


def test_a_byte_order_mark_is_accepted_in_jsonl_as_in_csv(tmp_path):
    """13: a BOM was accepted in .csv and refused in .jsonl."""
    row = b'{"timestamp": 0, "input_length": 5, "output_length": 2}\n'
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + row + row.replace(b"0,", b"1000,", 1))
    assert [r.arrival for r in load_jsonl(path)] == [0.0, 1.0]
    csv_path = tmp_path / "bom.csv"
    csv_path.write_bytes(b"\xef\xbb\xbf" + (HEADER + "2023-01-01 00:00:00.0,5,5\n").encode())
    assert len(load_azure(csv_path)) == 1


# --- the synthetic Mooncake-shaped trace (tests/data/mooncake-shaped.jsonl) ---------------


def test_the_shipped_mooncake_shaped_trace_is_its_generators_output():
    from pathlib import Path

    import mooncake_shaped

    shipped = Path(__file__).parent / "data" / "mooncake-shaped.jsonl"
    assert shipped.read_text() == mooncake_shaped.text()


def test_the_mooncake_shaped_trace_has_the_burst_and_the_shared_prefixes():
    import mooncake_shaped as m

    rows = m.rows()
    burst = [r for r in rows if r["timestamp"] == 0]
    assert len(burst) == m.BURST_PROMPTS and len(burst) >= len(rows) / 10
    assert all(r["input_length"] == m.BURST_PROMPT_LEN for r in burst)
    assert len({r["timestamp"] for r in rows}) < len(rows) / 4  # bunched arrivals
    for r in rows:  # one hash id per 512-token block, the system prompt's first
        assert len(r["hash_ids"]) == -(-r["input_length"] // m.BLOCK_TOKENS)
        assert r["hash_ids"][: m.SYSTEM_BLOCKS] == list(range(m.SYSTEM_BLOCKS))
    # a later turn starts with its conversation's earlier prompt's full blocks
    by_first_block = {}
    for r in rows:
        by_first_block.setdefault(r["hash_ids"][m.SYSTEM_BLOCKS], []).append(r)
    turns = [t for t in by_first_block.values() if len(t) > 1]
    assert len(turns) == m.BURST_PROMPTS + m.SHORT_CONVERSATIONS
    for conversation in turns:
        for a, b in zip(conversation, conversation[1:]):
            full = a["input_length"] // m.BLOCK_TOKENS
            assert b["hash_ids"][:full] == a["hash_ids"][:full]
            assert b["input_length"] > a["input_length"] + a["output_length"]


def test_a_jsonl_traces_hash_ids_are_kept_as_prefix_blocks_and_said(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [7, 8]},
        {"timestamp": 10, "input_length": 600, "output_length": 4},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    workload = resolve_workload(str(path))
    first, second = workload.requests
    assert first.prefix_blocks == (7, 8) and second.prefix_blocks == ()
    assert workload.prefix_block_tokens == 512
    assert any(
        "1 of 2 requests carry hash_ids" in note and "512 tokens" in note for note in workload.notes
    )
    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps(rows[1]) + "\n" + json.dumps({**rows[1], "timestamp": 20}) + "\n")
    assert resolve_workload(str(bare)).prefix_block_tokens is None


@pytest.mark.parametrize("hash_ids", ['"abc"', "[1, null]", "[[1]]", '[""]'])
def test_bad_hash_ids_name_the_file_and_line(tmp_path, hash_ids):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 4, "output_length": 1}\n'
        f'{{"timestamp": 1, "input_length": 4, "output_length": 1, "hash_ids": {hash_ids}}}\n'
    )
    with pytest.raises(ValueError, match=r"t\.jsonl:2: hash_ids: Request\.prefix_blocks"):
        resolve_workload(str(path))


@pytest.mark.parametrize(
    ("inputs", "outputs", "ratio"), [(512, 64, 0.0), (512, 64, 0.5), (3, 1, 0.9)]
)
def test_poisson_takes_vllms_random_lengths(inputs, outputs, ratio):
    from pytest_prefill.plan.workloads import resolve_workload

    load = resolve_workload("poisson", num_prompts=400, lengths=(inputs, outputs, ratio)).requests
    for n, seen in (
        (inputs, [r.prompt_len for r in load]),
        (outputs, [r.output_len for r in load]),
    ):
        low, high = max(1, int(n * (1 - ratio))), max(1, int(n * (1 + ratio)))
        assert low <= min(seen) and max(seen) <= high
        if high - low >= 10:
            assert max(seen) - min(seen) > (high - low) / 2, "drawn across the range"
        if ratio == 0:
            assert set(seen) == {n}


def test_random_lengths_are_poissons_only_and_checked():
    from pytest_prefill.plan.workloads import resolve_workload

    with pytest.raises(ValueError, match="range ratio"):
        resolve_workload("poisson", num_prompts=4, lengths=(512, 64, 1.0))
    with pytest.raises(ValueError, match="input length"):
        resolve_workload("poisson", num_prompts=4, lengths=(0, 64, 0.0))
    with pytest.raises(ValueError, match="lengths"):
        resolve_workload("lab", lengths=(512, 64, 0.0))
