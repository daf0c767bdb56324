"""What a hostile server or hostile files do to the client, each bounded: a stream that never
ends, headers and bodies that trickle, 1-byte chunks and 1-byte reads, JSON nested 10^5 deep,
usage claiming 10^9 tokens or twice the prompt, a malformed tokenizer, an API key HTTP cannot
carry, outputs that overwrite each other, and make-model's folder (only its own replaced, the
umask honoured, a full disk one line). The servers are tests/hostile.py's; every case ends in
seconds with one line naming the input (docs/faults.md lists the bounds)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
from cli_errors import usage_error
from hostile import (
    MODEL,
    WORDS,
    chunk,
    done,
    forever,
    json_response,
    serving,
    sse,
    streaming,
    token,
    trickle,
    write_words,
)

from pytest_prefill.cli import main
from pytest_prefill.serve.client import http, wire
from pytest_prefill.serve.client.api import most_tokens
from pytest_prefill.serve.client.identity import identify
from pytest_prefill.serve.client.prompts import TokenizerError, prompts_from_folder
from pytest_prefill.serve.client.wire import ServerError, Timeouts, Url
from pytest_prefill.serve.load.loadgen import Bounds, Schedule, Target, run_load
from pytest_prefill.sim import Request

ROOT = Path(__file__).resolve().parent.parent
QUICK = Timeouts(connect=2, stall=2, header=0.5, read=0.5, request=1.0)


def _bench(url: Url, requests: list[Request], timeouts: Timeouts = QUICK, **kwargs):
    async def go():
        identity = await identify(url, engine="openai", timeouts=timeouts)
        target = Target(url, identity, WORDS, timeouts=timeouts)
        kwargs.setdefault("bounds", Bounds(warmup=0))
        return await run_load(target, requests, **kwargs)

    return asyncio.run(go())


def _one_line_error(argv, capsys, code: int = 1) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# --- 1: a stream that never ends -------------------------------------------------------------


@pytest.mark.parametrize("piece", [token(), chunk(b": keep-alive\n\n")], ids=["tokens", "comments"])
def test_a_stream_that_never_ends_is_cut_at_the_request_timeout(piece):
    async def stream(writer, body):
        await forever(writer, piece, 0.05)

    start = time.perf_counter()
    with serving(streaming(stream)) as url:
        run = _bench(url, [Request("r0", 0.0, 8, 4)])
    assert time.perf_counter() - start < QUICK.request + 5
    (record,) = run.records
    assert not record.ok and (
        f"over {QUICK.request:g} s in all" in record.error or "claims" in record.error
    )


def test_ctrl_c_keeps_what_bench_measured_marked_incomplete(tmp_path):
    posts = []
    trickling = threading.Event()

    async def stream(writer, body):
        posts.append(body)
        if len(posts) == 1:
            writer.write(b"".join(token(usage={"completion_tokens": i + 1}) for i in range(4)))
            writer.write(done({"prompt_tokens": 8, "completion_tokens": 4}))
            return
        trickling.set()
        await forever(writer, chunk(b": keep-alive\n\n"), 0.05)

    out, records = tmp_path / "r.json", tmp_path / "r.jsonl"
    with serving(streaming(stream)) as url:
        argv = [sys.executable, "-m", "pytest_prefill", "bench", "--url", str(url)]
        argv += ["--tokenizer", write_words(tmp_path), "--engine", "openai", "--warmup", "0"]
        argv += ["--num-prompts", "3", "--arrivals", "poisson:20", "--max-concurrency", "1"]
        argv += ["--json", str(out), "--records", str(records)]
        bench = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert trickling.wait(60), "the second request never came"
            bench.send_signal(signal.SIGINT)
            _, err = bench.communicate(timeout=20)
        finally:
            bench.kill()
    assert bench.returncode == 130 and b"Traceback" not in err
    document = json.loads(out.read_text())
    assert document["incomplete"] is True and document["completed"] == 1
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert [r["error"] is None for r in lines] == [True, False]  # the third was never sent
    assert "interrupted" in lines[1]["error"]


# --- 2: a model list that trickles -----------------------------------------------------------


@pytest.mark.parametrize("part", ["header", "read"])
def test_a_trickling_model_list_is_cut_at_the_header_or_read_timeout(part):
    answer = json_response({"object": "list", "data": [{"id": MODEL}], "pad": "x" * 200})
    head, _, body = answer.partition(b"\r\n\r\n")

    async def handle(method, path, body_in, writer):
        if part == "header":
            await trickle(writer, answer, 0.05)
        else:
            writer.write(head + b"\r\n\r\n")
            await trickle(writer, body, 0.05)

    timeouts = Timeouts(connect=2, stall=5, header=0.5, read=0.5, request=60)
    start = time.perf_counter()
    with serving(handle) as url, pytest.raises(ServerError, match=f"{part} timeout"):
        asyncio.run(identify(url, timeouts=timeouts))
    assert time.perf_counter() - start < 0.5 + 5


# --- 3: a rate that would wait for ages ------------------------------------------------------


def test_an_arrival_rate_beyond_the_request_rates_bounds_is_refused(capsys):
    for rate in ("1e-9", "1e9"):
        argv = ["bench", "--url", "http://127.0.0.1:1", "--arrivals", f"poisson:{rate}"]
        assert "--arrivals" in usage_error(argv, capsys)


def test_a_send_due_after_the_time_bound_is_not_waited_for():
    async def stream(writer, body):
        writer.write(token(usage={"completion_tokens": 1}))
        writer.write(done({"prompt_tokens": 8, "completion_tokens": 1}))

    start = time.perf_counter()
    with serving(streaming(stream)) as url:
        requests = [Request(f"r{i}", 0.0, 8, 1) for i in range(3)]
        schedule = Schedule("poisson", request_rate=1e-6)  # the second is due in ~10^6 s
        run = _bench(url, requests, schedule=schedule, bounds=Bounds(max_duration=0.5, warmup=0))
    assert time.perf_counter() - start < 5
    assert len(run.records) == 1 and "time bound" in run.stopped


# --- 4: a body in 1-byte chunks --------------------------------------------------------------


def test_a_body_in_one_byte_chunks_is_read_in_linear_time():
    def parse_seconds(chunks: int) -> float:
        async def go() -> float:
            exchange = http._Exchange(b"", "GET x", QUICK, streamed=False)
            exchange.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            exchange.data_received(b"1\r\nx\r\n" * chunks + b"0\r\n\r\n")  # one read
            exchange.timer.cancel()
            start = time.thread_time()
            body, _, _ = http._dechunk(exchange)
            assert body == b"x" * chunks
            return time.thread_time() - start

        return asyncio.run(go())

    # 8x the chunks: ~8x the CPU when the parse is linear, ~64x when quadratic (as it was: a
    # copy of the rest of the read per chunk; 2 MB in 1-byte chunks took 30 s)
    small, large = parse_seconds(2**15), parse_seconds(2**18)
    assert large < 16 * small


def test_chunks_past_the_bound_are_one_line(monkeypatch):
    monkeypatch.setattr(http, "MAX_CHUNKS", 1000)
    payload = json.dumps({"data": [{"id": MODEL}], "pad": "x" * 2000}).encode()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
    framed = head + b"\r\n" + b"".join(chunk(payload[i : i + 1]) for i in range(len(payload)))

    async def handle(method, path, body, writer):
        writer.write(framed + chunk(b""))

    with serving(handle) as url, pytest.raises(ServerError, match="more than 1,000 HTTP chunks"):
        asyncio.run(identify(url, timeouts=QUICK))


# --- 5, 6: JSON nested 10^5 deep -------------------------------------------------------------

DEEP = b"[" * 100_000 + b"]" * 100_000


def test_an_event_nested_deep_fails_its_request_and_bench_still_writes(tmp_path, capsys):
    async def stream(writer, body):
        writer.write(token(usage={"completion_tokens": 1}) + sse(DEEP))
        writer.write(done({"prompt_tokens": 8, "completion_tokens": 2}))

    out, records = tmp_path / "r.json", tmp_path / "r.jsonl"
    with serving(streaming(stream)) as url:
        argv = ["bench", "--url", str(url), "--tokenizer", write_words(tmp_path)]
        argv += ["--engine", "openai", "--num-prompts", "2", "--arrivals", "burst"]
        argv += ["--json", str(out), "--records", str(records)]
        assert main(argv) == 1  # nothing completed
    printed = capsys.readouterr()
    assert "Traceback" not in printed.err
    assert f"deeper than {wire.MAX_JSON_DEPTH} levels" in printed.out
    assert json.loads(out.read_text())["failed"] == 2
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert len(lines) == 3 and all("deeper than" in r["error"] for r in lines)


def test_an_event_nested_deep_ends_a_calibration_in_one_line_and_exit_1(tmp_path, capsys):
    async def stream(writer, body):
        writer.write(token(usage={"completion_tokens": 1}) + sse(DEEP))
        writer.write(done({"prompt_tokens": 8, "completion_tokens": 2}))

    with serving(streaming(stream)) as url:
        argv = ["calibrate-server", "--url", str(url), "--tokenizer", write_words(tmp_path)]
        argv += ["--engine", "openai", "--budget", "256", "--json", str(tmp_path / "c.json")]
        line = _one_line_error(argv, capsys)
    assert "deeper than" in line and not (tmp_path / "c.json").exists()


def test_a_model_list_cut_short_says_so(capsys):
    async def handle(method, path, body, writer):
        writer.write(json_response({"data": [{"id": MODEL}]})[:-5])

    with serving(handle) as url, pytest.raises(ServerError, match="closed mid-body"):
        asyncio.run(identify(url, timeouts=QUICK))


def test_a_model_list_nested_deep_is_one_line_and_exit_1(capsys):
    async def handle(method, path, body, writer):
        writer.write(json_response(b'{"data": ' + DEEP + b"}"))

    with serving(handle) as url:
        line = _one_line_error(["bench", "--url", str(url), "--num-prompts", "1"], capsys)
    assert "GET" in line and "/v1/models" in line and "deeper than" in line


def test_nesting_is_counted_outside_strings_only():
    assert not wire.json_depth_over('{"a": "' + "[" * 500 + '"}')
    assert wire.json_depth_over("[" * 65 + "]" * 65) and not wire.json_depth_over(
        "[" * 64 + "]" * 64
    )


# --- 7: usage claiming a billion tokens ------------------------------------------------------


def test_a_claim_of_a_billion_tokens_is_refused_without_allocating_for_it():
    async def stream(writer, body):
        claim = {"completion_tokens": 10**9}
        writer.write(token(usage=claim) + token(usage=claim) + done({"prompt_tokens": 8, **claim}))

    with serving(streaming(stream)) as url:
        tracemalloc.start()
        try:
            run = _bench(url, [Request("r0", 0.0, 8, 128)])
            run.metrics()
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    (record,) = run.records
    assert not record.ok and "1,000,000,000 output tokens for a request of 128" in record.error
    assert peak < 16 * 2**20  # one float per claimed token would be 8 GB
    assert most_tokens(128) < 10**6


# --- 8: 1-byte reads -------------------------------------------------------------------------


def test_one_byte_reads_cost_memory_in_proportion_to_the_bytes(monkeypatch):
    reads = 200_000

    async def feed(cap: int) -> tuple[int, BaseException | None]:
        monkeypatch.setattr(http, "MAX_RESPONSE_BYTES", cap)
        exchange = http._Exchange(b"", "GET x", QUICK, streamed=True)
        exchange.data_received(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n")
        tracemalloc.start()
        try:
            for _ in range(reads):
                exchange.data_received(b"x")
                if exchange.done.done():
                    break
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        error = exchange.done.exception() if exchange.done.done() else None
        exchange.timer.cancel()
        return peak, error

    peak, error = asyncio.run(feed(2**30))
    assert error is None
    # the byte and one arrival time (offset and time: STAMP_BYTES) per read, doubled for the
    # arrays' growth; a tuple per read cost ~116 bytes
    assert peak < 2 * reads * (1 + http.STAMP_BYTES)
    _, error = asyncio.run(feed(reads))  # the bound counts what each read costs, not bytes only
    assert isinstance(error, ServerError) and "response over" in str(error)


# --- 9: a malformed tokenizer folder ---------------------------------------------------------

WORD_LISTS = {
    "words not strings": {"words": list(range(80)), "ids": list(range(80))},
    "no ids": {"words": list(WORDS.words)},
    "ids not numbers": {"words": list(WORDS.words), "ids": ["a"] * 80},
}
VOCABULARIES = {
    "vocab values lists": {"model": {"vocab": {"\u0120abc": [1]}}},
    "unigram entries empty": {"model": {"vocab": [[], [1], ["\u2581abc", 0.0]]}},
    "vocab a number": {"model": {"vocab": 3}},
}


@pytest.mark.parametrize(
    "name,document",
    [("prefill-words.json", d) for d in WORD_LISTS.values()]
    + [("tokenizer.json", d) for d in VOCABULARIES.values()],
    ids=[*WORD_LISTS, *VOCABULARIES],
)
def test_a_malformed_tokenizer_folder_is_one_line_naming_the_file(name, document, tmp_path, capsys):
    (tmp_path / name).write_text(json.dumps(document))
    with pytest.raises(TokenizerError, match=name):
        prompts_from_folder(tmp_path)
    with serving(streaming(lambda writer, body: asyncio.sleep(0))) as url:
        argv = ["bench", "--url", str(url), "--tokenizer", str(tmp_path), "--num-prompts", "1"]
        line = _one_line_error(argv, capsys, code=2)
    assert "--tokenizer" in line and name in line


# --- 12: usage counting twice the prompt -----------------------------------------------------


@pytest.mark.parametrize("extra", [lambda n: n, lambda n: 5], ids=["twice", "a template's 5"])
def test_a_prompt_count_far_over_the_asked_is_inexact_and_totalled(extra):
    async def stream(writer, body):
        prompt = len(body["prompt"].split())
        usage = {"prompt_tokens": prompt + extra(prompt), "completion_tokens": 2}
        writer.write(token(usage={"completion_tokens": 1}) + token(usage=usage) + done(usage))

    with serving(streaming(stream)) as url:
        run = _bench(url, [Request(f"r{i}", 0.0, 100 + i, 2) for i in range(3)])
    asked = sum(r.prompt_len for r in run.records)
    served = sum(r.prompt_len + extra(r.prompt_len) for r in run.records)
    assert len(run.completed) == 3
    assert run.metrics().total_input_tokens == served != asked
    assert len(run.inexact()) == (3 if extra(100) > 64 else 0)
    assert run.to_dict()["inexact"] == len(run.inexact())


# --- 13, 14: bench's outputs and its API key -------------------------------------------------


def test_json_and_records_naming_one_file_are_refused_when_parsed(tmp_path, capsys):
    same = tmp_path / "out.json"
    (tmp_path / "link.json").symlink_to(same)
    for other in (same, tmp_path / "link.json"):
        argv = ["bench", "--url", "http://127.0.0.1:1", "--json", str(same)]
        line = usage_error([*argv, "--records", str(other)], capsys)
        assert "--json" in line and "--records" in line
    assert not same.exists()


def test_an_api_key_http_cannot_carry_is_blamed_on_the_key(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PREFILL_TEST_KEY", "sk-\u20ac")
    with serving(streaming(lambda writer, body: asyncio.sleep(0))) as url:
        argv = ["bench", "--url", str(url), "--tokenizer", write_words(tmp_path)]
        argv += ["--api-key-env", "PREFILL_TEST_KEY", "--num-prompts", "1"]
        line = _one_line_error(argv, capsys, code=2)
    assert "--api-key-env PREFILL_TEST_KEY" in line and "--tokenizer" not in line
    assert "'\u20ac'" in line and "sk-" not in line  # the key itself is not printed


# --- 10, 11, 15: make-model's folder ---------------------------------------------------------


def test_overwrite_replaces_only_a_folder_make_model_made(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("mine")
    monkeypatch.chdir(project)
    line = _one_line_error(["make-model", "tiny", ".", "--overwrite"], capsys, code=2)
    assert "not made by make-model" in line and "prefill-model.json" in line
    assert os.listdir(project) == ["notes.txt"]
    assert main(["make-model", "tiny", str(tmp_path / "m")]) == 0
    (tmp_path / "m" / "extra").write_text("x")
    assert main(["make-model", "tiny", str(tmp_path / "m"), "--overwrite"]) == 0
    assert not (tmp_path / "m" / "extra").exists()  # make-model's own folder: replaced
    monkeypatch.chdir(tmp_path / "m")
    line = _one_line_error(["make-model", "tiny", ".", "--overwrite"], capsys, code=2)
    assert "holds the current directory" in line


def test_make_model_honours_the_umask(tmp_path):
    pytest.importorskip("torch")
    previous = os.umask(0o022)
    try:
        assert main(["make-model", "tiny", str(tmp_path / "m")]) == 0
    finally:
        os.umask(previous)
    folder = tmp_path / "m"
    assert folder.stat().st_mode & 0o777 == 0o755
    modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
    assert modes and set(modes.values()) == {0o644}, modes


def test_a_full_disk_under_make_model_is_one_line(tmp_path):
    pytest.importorskip("torch")
    # a file-size limit makes every write past 64 KiB fail as a full disk does (EFBIG, not
    # ENOSPC: the same OSError path, without filling a real disk)
    script = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))\n"
        "from pytest_prefill.cli import main\n"
        f"sys.exit(main(['make-model', 'tiny', {str(tmp_path / 'm')!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    line = lines[0]
    assert str(tmp_path / "m") in line and "writing the model failed" in line
    assert os.listdir(tmp_path) == []  # nothing half-written
