"""The load generator against the reference server (same event loop, no engine): exact token
counts, lower bounds the server's own schedule sets, the schedule and bounds, and failures that
say what happened (unreachable, not OpenAI, stalled)."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time

import pytest

from pytest_prefill.serve.client.api import parse_chunk, request_body
from pytest_prefill.serve.client.http import exchange, stream_events
from pytest_prefill.serve.client.identity import identify
from pytest_prefill.serve.client.prompts import Prompts
from pytest_prefill.serve.client.wire import ServerError, Timeouts, Url
from pytest_prefill.serve.launch.reference import Behaviour, running
from pytest_prefill.serve.load.loadgen import Bounds, Schedule, Target, run_load
from pytest_prefill.sim import Request

WORDS = Prompts(
    tuple(f" w{chr(97 + i % 26)}{chr(97 + i // 26)}" for i in range(80)), tuple(range(80)), "test"
)


def _run(coroutine):
    return asyncio.run(coroutine)


async def _target(url: Url, **kwargs) -> Target:
    return Target(url, await identify(url, engine="openai"), WORDS, **kwargs)


def _load(n: int, spacing: float = 0.0, output_len: int = 5) -> list[Request]:
    return [Request(f"r{i}", i * spacing, 8 + i, output_len) for i in range(n)]


def test_url_parse_names_what_is_wrong():
    assert Url.parse("http://127.0.0.1:8000/base/").join("/v1/models") == "/base/v1/models"
    for bad in ("", "ftp://x", "127.0.0.1:8000", "http://:80", "http://h:99999"):
        with pytest.raises(ValueError, match="url"):
            Url.parse(bad)


def test_bodies_pin_the_output_length_the_way_each_engine_reads_it():
    hf = request_body("transformers", "completions", "m", "a b", 7)
    assert json.loads(hf["generation_config"]) == {
        "max_new_tokens": 7,
        "eos_token_id": -1,
        "do_sample": False,
    }
    assert "min_tokens" not in hf and "ignore_eos" not in hf  # transformers rejects them
    vllm = request_body("vllm", "completions", "m", [1, 2], 7)
    assert vllm["min_tokens"] == vllm["max_tokens"] == 7 and vllm["ignore_eos"] is True
    assert vllm["stream_options"]["continuous_usage_stats"] is True
    llama = request_body("llama.cpp", "llama", None, [1, 2], 7)
    assert llama["n_predict"] == 7 and llama["cache_prompt"] is False
    chat = request_body("openai", "chat", "m", "a b", 3)
    assert chat["messages"] == [{"role": "user", "content": "a b"}]
    with pytest.raises(ValueError, match="text prompt"):
        request_body("transformers", "completions", "m", [1, 2], 7)
    with pytest.raises(ValueError, match="engine"):
        request_body("tgi", "completions", "m", "a", 7)
    with pytest.raises(ValueError, match="output_len"):
        request_body("vllm", "completions", "m", "a", 0)


def test_chunks_count_tokens_from_cumulative_usage():
    def event(text, usage=None, finish=None):
        choice = {"index": 0, "text": text, "finish_reason": finish}
        return json.dumps({"choices": [choice], **({"usage": usage} if usage else {})})

    # continuous usage: a chunk carrying three tokens counts three
    assert parse_chunk("completions", event("abc", {"completion_tokens": 5}), 2).tokens == 3
    assert parse_chunk("completions", event("abc"), 2).tokens is None  # unknown: assumed 1
    final = parse_chunk("completions", event("", {"completion_tokens": 5, "prompt_tokens": 9}), 5)
    assert (final.tokens, final.output_tokens, final.prompt_tokens) == (0, 5, 9)
    usage_only = parse_chunk("completions", json.dumps({"choices": [], "usage": {}}), 5)
    assert usage_only.tokens == 0 and usage_only.done
    llama = parse_chunk("llama", json.dumps({"content": "x", "tokens_predicted": 4}), 3)
    assert llama.tokens == 1
    for bad, match in (("nope", "not JSON"), ("[1]", "object"), ('{"error": "boom"}', "boom")):
        with pytest.raises(ValueError, match=match):
            parse_chunk("completions", bad, 0)


def test_every_token_is_counted_and_no_earlier_than_the_server_sent_it():
    behaviour = Behaviour(ttft=0.03, gap=0.01)

    async def go():
        async with running(behaviour) as url:
            target = await _target(url)
            return await run_load(target, _load(6), schedule=Schedule("burst"))

    run = _run(go())
    assert len(run.completed) == 6 and not run.failed and len(run.warmup) == 1
    for record in run.records:
        assert record.exact  # one token per chunk, as the final usage confirms
        assert len(record.token_times) == record.output_len == 5
        assert record.ttft >= behaviour.ttft
        assert record.e2el >= behaviour.ttft + 4 * behaviour.gap
        assert all(b - a >= 0 for a, b in zip(record.token_times, record.token_times[1:]))
    metrics = run.metrics()
    assert metrics.completed == 6 and metrics.total_output_tokens == 30
    assert metrics.ttft.count == 6 and metrics.itl.count == 6 * 4


def test_concurrency_cap_is_never_exceeded():
    async def go():
        async with running(Behaviour(ttft=0.02, gap=0.005)) as url:
            target = await _target(url)
            return await run_load(
                target,
                _load(6),
                schedule=Schedule("burst", max_concurrency=2),
                bounds=Bounds(warmup=0),
            )

    run = _run(go())
    spans = [(r.arrival, r.chunk_times[-1]) for r in run.records]
    for start, _ in spans:
        overlapping = sum(1 for a, b in spans if a <= start < b)
        assert overlapping <= 2


def test_schedules_are_the_formulas():
    load = [Request(f"r{i}", 10.0 + 2.0 * i, 4, 2) for i in range(5)]
    assert Schedule("trace", rate_scale=2.0).send_times(load) == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert Schedule("burst").send_times(load) == [0.0] * 5
    poisson = Schedule("poisson", request_rate=4.0, seed=3).send_times(load)
    assert poisson == Schedule("poisson", request_rate=4.0, seed=3).send_times(load)
    assert poisson[0] == 0.0 and all(b > a for a, b in zip(poisson, poisson[1:]))
    with pytest.raises(ValueError, match="request_rate"):
        Schedule("poisson")
    with pytest.raises(ValueError, match="request_rate"):
        Schedule("trace", request_rate=1.0)
    with pytest.raises(ValueError, match="arrivals"):
        Schedule("steady")
    with pytest.raises(ValueError, match="max_concurrency"):
        Schedule(max_concurrency=0)
    with pytest.raises(ValueError, match="warmup"):
        Bounds(warmup=-1)


def test_bounds_cut_the_run():
    async def go(bounds):
        async with running(Behaviour(ttft=0.01, gap=0.002)) as url:
            return await run_load(await _target(url), _load(8, spacing=0.1), bounds=bounds)

    assert len(_run(go(Bounds(max_requests=3, warmup=0))).records) == 3
    timed = _run(go(Bounds(max_duration=0.25, warmup=0)))
    assert 1 <= len(timed.records) < 8 and "time bound" in timed.stopped


def test_unreachable_url_fails_within_seconds():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once it is closed
    start = time.perf_counter()
    with pytest.raises(ServerError, match="cannot connect"):
        _run(identify(Url.parse(f"http://127.0.0.1:{port}"), timeouts=Timeouts(connect=2)))
    assert time.perf_counter() - start < 5


def test_a_server_that_is_not_openai_is_named_so():
    async def go():
        async with running(Behaviour(not_openai=True)) as url:
            await identify(url)

    with pytest.raises(ServerError, match="not an OpenAI-compatible server"):
        _run(go())


def test_a_stall_mid_stream_times_out_with_a_clear_message():
    behaviour = Behaviour(ttft=0.01, gap=0.01, stall_after=2, stall_seconds=30.0)

    async def go():
        async with running(behaviour) as url:
            target = await _target(url, timeouts=Timeouts(connect=2, stall=0.3))
            return await run_load(target, _load(1, output_len=6), bounds=Bounds(warmup=0))

    start = time.perf_counter()
    run = _run(go())
    assert time.perf_counter() - start < 5
    (record,) = run.records
    assert not record.ok and "sent nothing for 0.3 s" in record.error
    assert run.metrics().completed == 0


def test_errors_of_the_server_are_reported_with_its_message():
    async def go():
        async with running() as url:
            response = await exchange(url, "GET", "/nothing")
            assert response.status == 404 and response.json() == {"detail": "Not Found"}
            await stream_events(url, "/v1/chat/completions", {"x": 1})

    with pytest.raises(ServerError, match="HTTP 404"):
        _run(go())


def test_the_bench_command_reports_vllm_metrics_and_writes_records(tmp_path, capsys):
    import subprocess
    import sys

    from pytest_prefill.cli import main

    (tmp_path / "prefill-words.json").write_text(
        json.dumps({"words": list(WORDS.words), "ids": list(WORDS.ids)})
    )
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest_prefill.serve.launch.reference",
            "--ttft",
            "0.01",
            "--gap",
            "0.002",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = server.stdout.readline().split("127.0.0.1:")[1].split()[0]
        records = tmp_path / "r.jsonl"
        argv = ["bench", "--url", f"http://127.0.0.1:{port}", "--tokenizer", str(tmp_path)]
        argv += ["--num-prompts", "4", "--request-rate", "50", "--records", str(records)]
        argv += ["--random-input-len", "8", "--random-output-len", "5", "--max-concurrency", "2"]
        assert main(argv) == 0
    finally:
        server.terminate()
        server.wait()
    out = capsys.readouterr().out
    assert "Successful requests:" in out and "Median TTFT (ms):" in out and "P99 ITL (ms):" in out
    assert re.search(r"^Maximum request concurrency: +2$", out, re.M)
    peak = re.search(r"^Peak concurrent requests: +(\d+)$", out, re.M)
    assert peak and 1 <= int(peak.group(1)) <= 2, out
    lines = records.read_text().splitlines()
    assert len(lines) == 5 and json.loads(lines[0])["warmup"] is True
    sent = [json.loads(line) for line in lines[1:]]
    assert {(r["prompt_len"], r["output_len"]) for r in sent} == {(8, 5)}  # vLLM's random lengths


@pytest.mark.parametrize(
    "argv,field",
    [
        (["bench", "--url", "ftp://x"], "--url"),
        (["bench", "--url", "http://127.0.0.1:1", "--arrivals", "poisson:fast"], "--arrivals"),
        (["bench", "--url", "http://127.0.0.1:1", "--percentiles", "50,150"], "--percentiles"),
        (["bench", "--url", "http://127.0.0.1:1", "--stall-timeout", "0"], "--stall-timeout"),
        (["calibrate-server", "--url", "http://127.0.0.1:1", "--budget", "0"], "--budget"),
        (
            ["fidelity-server", "--url", "http://127.0.0.1:1", "--budget", "256", "--runs", "0"],
            "--runs",
        ),
        (
            ["fidelity-server", "--url", "http://127.0.0.1:1", "--budget", "256"]
            + ["--engine", "openai"],
            "--engine",
        ),
        (
            ["calibrate-server", "--url", "http://127.0.0.1:1", "--budget", "256"]
            + ["--max-seqs", "0"],
            "--max-seqs",
        ),
        (["make-model", "huge", "out"], "preset"),
    ],
)
def test_bad_input_to_the_server_commands_is_one_line_naming_the_field(argv, field, capsys):
    from pytest_prefill.cli import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert field in err


def test_an_unreachable_url_is_one_line_and_exit_1(capsys, tmp_path):
    from pytest_prefill.cli import main

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = ["calibrate-server", "--url", f"http://127.0.0.1:{port}", "--budget", "256"]
    with pytest.raises(SystemExit) as exited:
        main([*argv, "--json", str(tmp_path / "c.json")])
    assert exited.value.code == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "cannot connect" in line and not (tmp_path / "c.json").exists()
