"""The engine schedules exactly as the simulator does (a fake-clock run equals ``simulate()``), and
real runs on a tiny random Qwen3 give valid traces and the model's own greedy tokens."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pytest_prefill.lab.loop import replay
from pytest_prefill.plan.workloads import lab_scenario, poisson
from pytest_prefill.sim import (
    LINK,
    POLICIES,
    PRESETS,
    CostModel,
    Request,
    check_invariants,
    close,
    simulate,
)

# ---------------------------------------------------------------------------------------------
# The scheduler: the engine on a fake clock is the simulator.


@st.composite
def cost_models(draw):
    term = st.floats(0, 0.05, allow_nan=False, allow_infinity=False)
    return CostModel(
        prefill_pass_overhead=draw(term),
        prefill_per_token=draw(st.floats(1e-6, 1e-3)),
        decode_step_base=draw(st.floats(1e-3, 0.05)),
        decode_per_seq=draw(st.sampled_from([0.0, 1e-3])),
        decode_per_kv_token=draw(st.sampled_from([0.0, 1e-7, 3e-6])),
        kv_bytes_per_token=draw(st.sampled_from([0.0, 1024.0, 114688.0])),
        link_bandwidth=draw(st.sampled_from([math.inf, 1e9, 25e9])),
        link_latency=draw(st.sampled_from([0.0, 2e-5, 5e-3])),
    )


@st.composite
def loads(draw):
    n = draw(st.integers(1, 8))
    arrivals = draw(st.lists(st.floats(0, 0.5), min_size=n, max_size=n))
    # Coinciding arrivals exercise the FCFS tie-break by id. On a nanosecond grid: the
    # simulator's clock ticks every 2**-64 s, and arrivals closer than that are simultaneous.
    arrivals = [round(a, 2) if draw(st.booleans()) else round(a, 9) for a in arrivals]
    return [
        Request(f"r{i}", a, draw(st.integers(1, 600)), draw(st.integers(1, 40)))
        for i, a in enumerate(arrivals)
    ]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(POLICIES),
    load=loads(),
    cost=cost_models(),
    chunk=st.integers(1, 700),
)
# A KV arriving exactly at a decode step's end: in float sums the engine's clock drifted an ulp
# off the simulator's ticks and the request joined one step late (hypothesis found it).
@example(
    policy="disaggregated",
    load=[Request(f"r{i}", 0.0, 1, 1) for i in range(3)]
    + [Request("r3", 0.5, 1, 1), Request("r4", 0.0, 397, 1), Request("r5", 0.0, 600, 2)],
    cost=CostModel(prefill_pass_overhead=0.0, prefill_per_token=0.001, decode_step_base=0.001),
    chunk=1,
)
def test_engine_on_a_fake_clock_is_the_simulator(policy, load, cost, chunk):
    assert_same_schedule(
        replay(policy, load, cost, chunk=chunk), simulate(policy, load, cost, chunk=chunk)
    )


def assert_same_schedule(engine, simulated):
    """The same iterations in the same order with the same pieces, rows and KV reads, and the
    same request records; times equal up to float rounding (the simulator sums exact ticks,
    the engine's fake clock adds floats)."""
    a, b = list(engine.steps()), list(simulated.steps())
    shape = lambda e: (e.resource, e.kind, e.prefill, e.decode_ids, e.kv_tokens, e.pieces)  # noqa: E731
    assert [shape(e) for e in a] == [shape(e) for e in b]
    for x, y in zip(a, b):
        assert close(x.start, y.start) and close(x.end, y.end), (x, y)
    assert engine.requests.keys() == simulated.requests.keys()
    for rid, x in engine.requests.items():
        y = simulated.requests[rid]
        assert (x.decode_resource, x.prefill_resource) == (y.decode_resource, y.prefill_resource)
        pairs = [
            (x.prefill_start, y.prefill_start),
            (x.prefill_end, y.prefill_end),
            (x.kv_ready, y.kv_ready),
        ]
        pairs += list(zip(x.token_times, y.token_times, strict=True))
        assert all(close(p, q) for p, q in pairs), rid


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_engine_on_a_fake_clock_is_the_simulator_on_named_scenarios(policy, preset):
    cost = PRESETS[preset].cost
    for load in (lab_scenario(), poisson(8.0, 40, prompt_len=[64, 700, 3000], output_len=[4, 90])):
        engine = replay(policy, load, cost, chunk=256)
        assert_same_schedule(engine, simulate(policy, load, cost, chunk=256))
        assert check_invariants(engine, load, cost) == []


def test_the_engine_schedules_with_the_simulators_own_worker():
    from pytest_prefill import sim
    from pytest_prefill.lab import loop as engine

    assert engine.Worker is sim.Worker
    timed = sim.TimedWorker(
        0, sim.Worker("w", "shared"), sim.TickCost(sim.PRESETS["lab-laptop"].cost)
    )
    assert isinstance(timed.rules, sim.Worker)  # the fast path times the rules, never copies them


def test_replay_validates_like_simulate():
    cost = PRESETS["lab-laptop"].cost
    load = lab_scenario()
    with pytest.raises(ValueError, match="policy"):
        replay("fifo", load, cost)
    with pytest.raises(ValueError, match="chunk"):
        replay("chunked", load, cost)
    with pytest.raises(ValueError, match="chunk"):
        replay("chunked", load, cost, chunk=0)
    with pytest.raises(ValueError, match="prefill_workers"):
        replay("disaggregated", load, cost, prefill_workers=2)
    with pytest.raises(ValueError, match="duplicate"):
        replay("shared", [*load, load[0]], cost)
    with pytest.raises(ValueError, match="cost"):
        replay("shared", load, {"decode_step_base": 1})


# ---------------------------------------------------------------------------------------------
# Real runs on a tiny random model.

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=2048,
        initializer_range=0.2,
    )
    return transformers.Qwen3ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def small_load():
    return [
        Request("a", 0.0, 40, 12),
        Request("b", 0.0, 17, 9),
        Request("c", 0.01, 150, 5),  # arrives while a and b decode
        Request("d", 0.01, 3, 1),
    ]


def _hf_greedy(model, prompt, steps):
    """The emitted tokens: the predictions of decode steps 1..steps (the prefill's prediction is
    the first decode step's input)."""
    ids = prompt.tolist()
    with torch.inference_mode():
        for _ in range(steps + 1):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return tuple(ids[len(prompt) + 1 :])


@pytest.fixture(scope="module")
def real_runs(tiny, small_load):
    from pytest_prefill.lab.execute import execute

    return {
        policy: execute(policy, small_load, tiny, chunk=32, seed=7, threads=1)
        for policy in ("shared", "coscheduled", "chunked")
    }


@pytest.mark.parametrize("policy", ["shared", "coscheduled", "chunked"])
def test_real_run_trace_passes_the_invariants(real_runs, small_load, policy):
    trace = real_runs[policy].trace
    assert trace.policy == policy
    assert check_invariants(trace, small_load) == []
    kinds = {e.kind for e in trace.events}
    expected = {
        "shared": {"prefill", "decode"},
        "coscheduled": {"prefill", "fused", "decode"},
        "chunked": {"prefill", "fused", "decode"},
    }[policy]
    assert expected <= kinds


def test_real_chunked_run_respects_the_chunk_budget(real_runs):
    assert all(e.prefill_tokens <= 32 for e in real_runs["chunked"].trace.events)
    assert max(e.prefill_tokens for e in real_runs["coscheduled"].trace.events) >= 150


def test_real_runs_emit_the_models_own_greedy_tokens(real_runs, tiny, small_load):
    from pytest_prefill.lab.loop import make_prompts

    prompts = make_prompts(sorted(small_load, key=lambda r: (r.arrival, r.id)), 300, seed=7)
    expected = {r.id: _hf_greedy(tiny, prompts[r.id], r.output_len) for r in small_load}
    for run in real_runs.values():
        assert dict(run.tokens) == expected


def test_real_run_idles_until_arrivals(tiny):
    from pytest_prefill.lab.execute import execute

    load = [Request("late", 0.05, 8, 2)]
    trace = execute("shared", load, tiny).trace
    assert trace.requests["late"].prefill_start >= 0.05
    assert check_invariants(trace, load) == []


def test_real_disaggregated_run_uses_two_processes(tiny, small_load, real_runs):
    import os

    from pytest_prefill.lab.disaggregated import split_cores
    from pytest_prefill.lab.execute import execute

    if len(os.sched_getaffinity(0)) < 2:
        with pytest.raises(ValueError, match="2 CPU cores"):
            split_cores(sorted(os.sched_getaffinity(0)))
        pytest.skip("disaggregation needs two cores")
    run = execute("disaggregated", small_load, tiny, seed=7)
    trace = run.trace
    assert check_invariants(trace, small_load) == []
    assert "two processes" in run.setup
    transfers = [e for e in trace.events if e.resource == LINK]
    assert sorted(e.prefill[0][0] for e in transfers) == sorted(r.id for r in small_load)
    for r in small_load:
        record = trace.requests[r.id]
        assert record.prefill_end <= record.kv_ready < record.first_token
    # The KV cache crossed the process boundary intact: the same greedy tokens as one worker.
    assert run.tokens == real_runs["shared"].tokens


def test_split_cores_is_disjoint_and_refuses_one_core():
    from pytest_prefill.lab.disaggregated import split_cores

    prefill, decode = split_cores([3, 0, 1, 2])
    assert prefill == [0, 1] and decode == [2, 3]
    with pytest.raises(ValueError, match="2 CPU cores"):
        split_cores([0])
