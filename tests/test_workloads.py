"""Workloads: the lab scenario, seeded Poisson loads, and workloads by name (a trace file read
through plan/traces, tests/test_traces.py)."""

from __future__ import annotations

import importlib.resources
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from trace_files import write_csv, write_jsonl

import pytest_prefill.plan.workloads as workloads
from pytest_prefill.plan.traces import SHIPPED_TRACES, load_azure, load_jsonl
from pytest_prefill.plan.workloads import (
    lab_scenario,
    poisson,
    resolve_workload,
    scale_rate,
)

pytestmark = pytest.mark.sim


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


# --- workloads by name (the command line's --workload) and JSONL traces ---


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
    workload = resolve_workload("azure-conv", window=(0, 60))
    assert workload.requests and workload.requests[-1].arrival < 60
    assert "Splitwise" in (workload.attribution or "") and "CC-BY 4.0" in workload.attribution


@pytest.mark.parametrize("name", sorted(SHIPPED_TRACES))
def test_a_shipped_trace_is_package_data_and_resolves_by_name(name):
    """Issue 50 item 9: azure-conv failed after a pip install (the traces lived beside the
    checkout). Each named trace is in the package, found through importlib.resources, and the
    workload by its name is that file's requests, with the source's attribution."""
    shipped = importlib.resources.files("pytest_prefill.plan") / "data" / SHIPPED_TRACES[name]
    assert shipped.is_file()
    reader = load_jsonl if ".jsonl" in SHIPPED_TRACES[name] else load_azure
    first = reader(str(shipped), limit=40)
    workload = resolve_workload(name, num_prompts=40)
    assert [(r.arrival, r.prompt_len, r.output_len) for r in workload.requests] == [
        (r.arrival, r.prompt_len, r.output_len) for r in first
    ]
    licence = "Apache-2.0" if name.startswith("mooncake") else "CC-BY 4.0"
    assert licence in (workload.attribution or "")
    readme = (importlib.resources.files("pytest_prefill.plan") / "data" / "README.md").read_text()
    assert SHIPPED_TRACES[name] in readme and licence in readme


def test_the_shipped_traces_resolve_with_no_checkout_beside_the_package(tmp_path):
    """Issue 50 item 9: only the package folder, copied where no ../shared exists, run from
    another folder."""
    package = Path(workloads.__file__).resolve().parents[1]
    shutil.copytree(
        package, tmp_path / "site" / "pytest_prefill", ignore=shutil.ignore_patterns("__pycache__")
    )
    code = (
        "from pytest_prefill.plan.workloads import resolve_workload as r; import pytest_prefill as p;"
        "print(p.__file__); print(*(len(r(n, num_prompts=5).requests) for n in "
        "('azure-conv', 'azure-code', 'mooncake-conv')))"
    )
    (tmp_path / "elsewhere").mkdir()
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    env.pop("PYTEST_PREFILL_AZURE_DIR", None)
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path / "elsewhere",
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    where, counts = done.stdout.splitlines()
    assert where.startswith(str(tmp_path / "site")) and counts == "5 5 5"


def test_a_missing_shipped_trace_names_where_it_looked_and_its_source(monkeypatch, tmp_path):
    """Issue 50 item 9: the error said "or the current folder", which was not looked in, and
    gave no source."""
    monkeypatch.setenv("PYTEST_PREFILL_AZURE_DIR", str(tmp_path))
    monkeypatch.setattr(workloads, "named_trace_path", lambda name: None)
    with pytest.raises(ValueError) as info:
        resolve_workload("azure-code")
    message = str(info.value)
    assert str(tmp_path / "code.csv") in message and "azure-code.csv.gz" in message
    assert "current folder" not in message and "AzurePublicDataset" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("spec", "kwargs", "message"),
    [
        ("nonsense", {}, "is not one of lab, poisson, azure-conv, azure-code, mooncake-conv"),
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


# --- input the hostile run found: one line naming the file and line, never a traceback ----------


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
