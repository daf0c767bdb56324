"""The trace readers (plan/traces): the Azure LLM inference 2023 CSV and JSON-lines traces, each
read with a window and a limit, every bad line named."""

from __future__ import annotations

import pytest
from trace_files import HEADER, write_csv, write_jsonl

from pytest_prefill.plan.traces import azure_trace_path, load_azure, load_jsonl, open_trace
from pytest_prefill.sim import Request

pytestmark = pytest.mark.sim


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
    assert path is not None, "the package ships both Azure traces"
    with open_trace(path) as handle:
        rows = sum(1 for _ in handle) - 1
    load = load_azure(path)
    assert len(load) == rows
    assert all(b.arrival >= a.arrival for a, b in zip(load, load[1:]))
    assert load[-1].arrival < 3600 * 1.01  # each trace covers about an hour


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
        ("zipped.jsonl", None, "zipped.jsonl:1: a damaged gzip stream"),
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

    if content is None:  # a gzip stream cut short
        content = gzip.compress(b'{"timestamp": 1, "input_length": 5, "output_length": 5}\n')[:-9]
    path = tmp_path / name
    path.write_bytes(content)
    reader = load_jsonl if name.endswith(".jsonl") else load_azure
    with pytest.raises(ValueError) as info:
        reader(path)
    assert f"{path.parent}/{words}" in str(info.value)


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_gzip_trace_reads_as_its_plain_text_does(tmp_path, suffix):
    """Issue 50 item 9: the shipped traces are gzip; a trace is read through gzip when its
    first bytes are gzip's, whatever its name."""
    import gzip

    plain = (
        write_csv(tmp_path, ["2023-11-16 18:17:03.5,10,2", "2023-11-16 18:17:04.0,20,3"])
        if suffix == ".csv"
        else write_jsonl(
            tmp_path,
            [
                {"timestamp": t, "input_length": 9, "output_length": 2, "hash_ids": [t]}
                for t in (0, 250, 900)
            ],
        )
    )
    zipped = tmp_path / f"zipped{suffix}.gz"
    zipped.write_bytes(gzip.compress(plain.read_bytes()))
    reader = load_jsonl if suffix == ".jsonl" else load_azure
    assert reader(zipped) == reader(plain) and reader(plain)


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
