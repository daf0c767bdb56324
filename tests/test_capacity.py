"""The capacity search: deployments, bracketing and bisection, its answer checked against fresh
simulations, executors (inline, process pool, a Dask LocalCluster), and every bad input."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import cost_models

import pytest_prefill
import pytest_prefill.plan.capacity as capacity_module
import pytest_prefill.plan.deployments as deployments_module
import pytest_prefill.plan.search_loop as search_loop
from pytest_prefill.plan.capacity import CapacityResult, capacity
from pytest_prefill.plan.deployments import Deployment, default_deployments, search_chunks
from pytest_prefill.plan.executors import InlineExecutor, dask_executor, local_executor
from pytest_prefill.plan.metrics import SLO, Distribution, ServingMetrics, serving_metrics
from pytest_prefill.plan.question import ServingQuestion
from pytest_prefill.plan.rate_search import MAX_SCALE, DeploymentResult, Probe
from pytest_prefill.plan.search_loop import ALL_SHORTCUTS
from pytest_prefill.plan.workloads import poisson, scale_rate
from pytest_prefill.sim import PRESETS, Request, simulate

pytestmark = pytest.mark.sim
PLAIN_PATH = dataclasses.replace(ALL_SHORTCUTS, seed=False)  # from the workload's own rate

COST = PRESETS["datacenter-illustrative"].cost
SLO_1S = SLO.parse("ttft:1s,tpot:100ms")


def small_load(count: int = 40, rate: float = 20.0, seed: int = 0) -> list[Request]:
    return poisson(
        rate,
        count,
        prompt_len=lambda rng: rng.randint(64, 3000),
        output_len=lambda rng: rng.randint(1, 60),
        seed=seed,
    )


def attainment_at(load, cost, slo, deployment, scale) -> float:
    """Attainment computed afresh: simulate and measure, without the search's code."""
    trace = simulate(
        deployment.policy, scale_rate(load, scale), cost, **deployment.simulate_options()
    )
    return serving_metrics(trace, slo=slo).attainment


# --- deployments --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "devices", "label"),
    [
        ("shared", 4, "shared ×4"),
        ("coscheduled", 2, "coscheduled ×2"),
        ("chunked:512", 4, "chunked 512 ×4"),
        ("chunked:100ms", 4, "chunked ≤100ms ×4"),
        ("disaggregated:1:3", 4, "disaggregated 1P:3D"),
        ("disaggregated:2P:2D", 4, "disaggregated 2P:2D"),
    ],
)
def test_deployment_parse_and_label(text, devices, label):
    deployment = Deployment.parse(text, devices)
    assert deployment.label == label and deployment.devices == devices


def test_deployments_map_to_simulate_options():
    assert Deployment("shared", 1).simulate_options() == {}
    assert Deployment("shared", 4).simulate_options() == {"replicas": 4}
    budget = Deployment("chunked", 2, chunk_budget=0.1).simulate_options()
    assert budget == {"chunk_budget": 0.1, "replicas": 2}
    split = Deployment("disaggregated", 4, prefill_workers=1).simulate_options()
    assert split == {"prefill_workers": 1, "decode_workers": 3}


@pytest.mark.parametrize(
    ("text", "devices", "message"),
    [
        ("bogus", 4, "unknown deployment 'bogus'; allowed: shared, coscheduled"),
        ("shared:3", 4, "unknown deployment"),
        ("chunked", 4, "needs its size, e.g. chunked:512"),
        ("chunked:abc", 4, "chunked takes TOKENS or a duration"),
        ("chunked:0", 4, "chunk must be an integer >= 1"),
        ("disaggregated:1:2", 4, "is not the 4 devices"),
        ("disaggregated:x:y", 4, "takes P:D"),
        ("disaggregated:0:4", 4, "prefill_workers must be an integer >= 1"),
        ("disaggregated:4:0", 4, "must leave a decode worker"),
        ("disaggregated", 4, "needs its size, e.g. disaggregated:1:3"),
        ("shared", 0, "devices must be an integer >= 1"),
    ],
)
def test_a_bad_deployment_is_a_named_error(text, devices, message):
    with pytest.raises(ValueError, match=message):
        Deployment.parse(text, devices)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"policy": "fastest"}, "policy must be one of"),
        ({"policy": "shared", "chunk": 64}, "apply to chunked deployments"),
        ({"policy": "chunked", "chunk": 64, "chunk_budget": 0.1}, "not both"),
        ({"policy": "chunked", "chunk_budget": -1.0}, "chunk_budget must be a positive"),
        ({"policy": "shared", "prefill_workers": 1}, "applies to disaggregated"),
        ({"policy": "disaggregated", "devices": 1, "prefill_workers": 1}, "needs devices >= 2"),
    ],
)
def test_a_bad_deployment_value_is_a_named_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Deployment(**{"devices": 4, **kwargs})


def test_default_deployments_cover_every_split_and_chunks_around_c_star():
    star = COST.chunk_star()
    chunks = search_chunks(COST)
    assert chunks == (round(star / 2), round(star), round(2 * star))
    deployments = default_deployments(COST, 4, SLO_1S)
    labels = [d.label for d in deployments]
    assert labels[0] == "shared ×4"
    assert [d.chunk for d in deployments if d.chunk] == list(chunks)
    assert "chunked ≤100ms ×4" in labels
    assert [d.prefill_workers for d in deployments if d.policy == "disaggregated"] == [1, 2, 3]
    assert not any(d.policy == "disaggregated" for d in default_deployments(COST, 1))
    assert not any(d.chunk_budget for d in default_deployments(COST, 4, SLO.parse("ttft:1s")))


def test_search_chunks_falls_back_when_c_star_is_no_size():
    laptop = PRESETS["lab-laptop"].cost
    star = laptop.chunk_star()
    assert search_chunks(laptop) == (round(star / 2), round(star), round(2 * star))
    tiny = type(laptop)(prefill_pass_overhead=0.01, prefill_per_token=1e-5, decode_step_base=0.01)
    assert search_chunks(tiny) == deployments_module.FALLBACK_CHUNKS


# --- the search, against a fake probe with a known answer ----------------------------------


def fake_metrics(attainment: float, n: int = 1000, latency: float = math.nan) -> ServingMetrics:
    """Metrics of ``n`` requests, ``attainment`` of them meeting a 1 s TTFT bound; every TTFT
    is ``latency`` (NaN: unknown)."""
    none = Distribution.of([], (50, 90, 99))
    ttft = none if math.isnan(latency) else Distribution.of([(latency, n)], (50, 90, 99))
    good = round(attainment * n)
    return ServingMetrics(
        n, 10.0, 0, 0, ttft, none, none, none, slo=SLO(ttft=1.0), good=good, met=(("ttft", good),)
    )


def fake_probe(curve, latency=lambda s: math.nan):
    def run(probing, deployment, scale, percentile=90.0, **_):
        rate = scale * probing.base_rate
        return Probe(scale, rate, fake_metrics(curve(scale), latency=latency(scale)))

    return run


@settings(max_examples=80, deadline=None)
@given(
    threshold=st.floats(0.002, 3000.0),
    tolerance=st.sampled_from([0.01, 0.05, 0.2]),
    start=st.sampled_from([1.0, 0.1, 30.0]),
)
def test_bisection_brackets_a_step_within_the_tolerance(threshold, tolerance, start):
    load = small_load(10)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            capacity_module, "probe", fake_probe(lambda s: 1.0 if s <= threshold else 0.5)
        )
        result, seeded = (
            capacity(
                ServingQuestion(
                    load,
                    COST,
                    SLO_1S,
                    shortcuts=dataclasses.replace(ALL_SHORTCUTS, seed=seed),
                    executor=InlineExecutor(),
                ),
                1,
                deployments=[Deployment("shared", 1)],
                tolerance=tolerance,
                start=start,
            )
            for seed in (False, True)
        )
    (found,) = result.results
    (estimated,) = seeded.results  # from the throughput estimate: another path, the same rate
    assert (estimated.best, estimated.status) == (found.best, found.status)
    assert found.monotone and not found.crossing
    assert found.best.scale <= threshold
    if found.status == "never missed":  # the threshold lies beyond the highest rate tried
        assert found.best.scale * 4 > MAX_SCALE
        return
    assert found.status == "found"
    assert threshold < found.miss.scale <= found.best.scale * (1 + tolerance) * (1 + 1e-12)
    # bracketing (x4 up or /2 down), bisection of a bracket of at most 4x, one verification
    bracketing = 1 + math.ceil(max(math.log(threshold / start, 4), math.log2(start / threshold), 0))
    bisection = math.ceil(math.log2(math.log(4) / math.log1p(tolerance)))
    assert len(found.probes) <= bracketing + 1 + bisection + 1


def test_a_curve_that_rises_again_is_reported_not_trusted():
    curve = lambda s: 1.0 if s <= 3 else (0.5 if s <= 5 else 0.95)  # noqa: E731
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(capacity_module, "probe", fake_probe(curve))
        result = capacity(
            ServingQuestion(small_load(10), COST, SLO_1S, executor=InlineExecutor()),
            1,
            deployments=[Deployment("shared", 1)],
        )
    (found,) = result.results
    assert found.best.scale <= 3 < found.miss.scale
    assert found.crossing and not found.monotone  # the verification probe at 2× the miss passed
    assert any("NOT monotone" in note for note in result.notes())


def test_halving_goes_on_while_latency_falls_even_at_zero_attainment():
    curve = lambda s: 0.0 if s > 0.01 else 1.0  # noqa: E731  overloaded down to 0.01
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(capacity_module, "probe", fake_probe(curve, lambda s: 5.0 * s))
        result = capacity(ServingQuestion(small_load(10), COST, SLO_1S, executor=InlineExecutor()), 1, deployments=[Deployment("shared", 1)])  # fmt: skip
    (found,) = result.results
    assert found.status == "found" and found.best.scale <= 0.01 < found.miss.scale


def test_halving_goes_on_while_it_helps():
    curve = lambda s: min(1.0, 0.05 / s)  # noqa: E731  attainment rises as the rate falls
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(capacity_module, "probe", fake_probe(curve))
        result = capacity(ServingQuestion(small_load(10), COST, SLO_1S, executor=InlineExecutor()), 1, deployments=[Deployment("shared", 1)])  # fmt: skip
    (found,) = result.results
    assert found.status == "found" and found.best.scale <= 0.05 / 0.9 < found.miss.scale


def test_a_rise_that_stays_below_the_target_is_noted():
    curve = lambda s: 0.95 if s <= 1 else (0.97 if s <= 3 else 0.1)  # noqa: E731
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(capacity_module, "probe", fake_probe(curve))
        result = capacity(
            ServingQuestion(
                small_load(10), COST, SLO_1S, shortcuts=PLAIN_PATH, executor=InlineExecutor()
            ),
            1,
            deployments=[Deployment("shared", 1)],
        )
    (found,) = result.results
    assert not found.monotone and not found.crossing
    assert any("rises from 95.0%" in note for note in result.notes())


def test_never_met_and_never_missed_are_said():
    deployments = [Deployment("shared", 1), Deployment("coscheduled", 1)]
    with pytest.MonkeyPatch.context() as patch:
        # out of reach: attainment and latency no longer change as the rate falls
        patch.setattr(capacity_module, "probe", fake_probe(lambda s: 0.0, lambda s: 2.0))
        never = capacity(
            ServingQuestion(small_load(10), COST, SLO_1S, executor=InlineExecutor()),
            1,
            deployments=deployments,
        )
        patch.setattr(capacity_module, "probe", fake_probe(lambda s: 1.0))
        always = capacity(
            ServingQuestion(small_load(10), COST, SLO_1S, executor=InlineExecutor()),
            1,
            deployments=deployments,
        )
    assert [r.status for r in never.results] == ["never met"] * 2
    # from the start, two halvings did not help: stop
    assert all(len([p for p in r.probes if p.scale <= 1.0]) == 3 for r in never.results)
    assert never.recommendation().startswith("No deployment meets")
    assert [r.status for r in always.results] == ["never missed"] * 2
    assert all(r.best.scale <= MAX_SCALE for r in always.results)
    assert "at least" in always.recommendation()


def test_the_recommendation_compares_with_shared_and_names_close_runners_up():
    answers = {"shared": 1.0, "coscheduled": 2.05, "chunked": 2.0}

    def run(probing, deployment, scale, percentile=90.0, **_):
        return Probe(
            scale,
            scale * probing.base_rate,
            fake_metrics(1.0 if scale <= answers[deployment.policy] else 0.0),
        )

    deployments = [
        Deployment("shared", 1),
        Deployment("coscheduled", 1),
        Deployment("chunked", 1, chunk=64),
    ]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(capacity_module, "probe", run)
        result = capacity(
            ServingQuestion(small_load(10), COST, SLO_1S, executor=InlineExecutor()),
            1,
            deployments=deployments,
            tolerance=0.01,
        )
    line = result.recommendation()
    assert line.startswith("coscheduled ×1 serves 2× the requests per device of shared ×1")
    assert "chunked 64 ×1 is within 5%" in line
    assert [r.deployment.policy for r in result.ranked()] == ["coscheduled", "chunked", "shared"]


def test_progress_gets_one_line_per_deployment():
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(capacity_module, "probe", fake_probe(lambda s: 1.0 if s < 3 else 0.0))
        deployments = [Deployment("shared", 1), Deployment("coscheduled", 1)]
        capacity(
            ServingQuestion(
                small_load(10), COST, SLO_1S, executor=InlineExecutor(), progress=lines.append
            ),
            1,
            deployments=deployments,
        )
    assert sorted(line.split(":")[0] for line in lines) == ["coscheduled ×1", "shared ×1"]
    assert all(": found, " in line for line in lines)


# --- the search, against the simulator ----------------------------------------------------


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cost=cost_models(),
    seed=st.integers(0, 1000),
    ttft=st.floats(0.05, 2.0),
    tpot=st.floats(0.02, 0.3),
    target=st.sampled_from([0.5, 0.9, 1.0]),
    devices=st.sampled_from([1, 2]),
    pick=st.integers(0, 50),
)
def test_the_answer_meets_the_slo_at_its_rate_and_misses_it_above_the_tolerance(
    cost, seed, ttft, tpot, target, devices, pick
):
    load = small_load(30, seed=seed)
    slo = SLO(ttft=ttft, tpot=tpot)
    choices = default_deployments(cost, devices, slo)
    deployment = choices[pick % len(choices)]
    result = capacity(
        ServingQuestion(load, cost, slo, target=target, executor=InlineExecutor()),
        devices,
        deployments=[deployment],
    )
    (found,) = result.results
    if found.best is not None:
        assert attainment_at(load, cost, slo, deployment, found.best.scale) >= target
        assert found.max_rate == pytest.approx(found.best.scale * result.base_rate)
        assert found.goodput_per_device == pytest.approx(found.max_rate / devices)
        assert found.best.metrics.goodput <= found.best.metrics.request_throughput
    if found.miss is not None:
        assert attainment_at(load, cost, slo, deployment, found.miss.scale) < target
        if found.best is not None:
            assert found.miss.scale <= found.best.scale * (1 + result.tolerance) * (1 + 1e-12)
    for p in found.probes:
        assert 0.0 <= p.attainment <= 1.0
        if p.metrics is not None:  # None: the probe stopped once its verdict was fixed
            assert p.metrics.goodput <= p.metrics.request_throughput


def test_a_search_on_the_simulator_finds_the_shared_workers_limit():
    load = small_load(60)
    result = capacity(
        ServingQuestion(load, COST, SLO.parse("ttft:200ms,tpot:50ms"), executor=InlineExecutor()),
        1,
        deployments=[Deployment("shared", 1)],
    )
    (found,) = result.results
    assert found.status == "found" and found.binding in ("ttft", "tpot", "ttft+tpot")
    assert result.to_dict()["results"][0]["deployment"]["label"] == "shared ×1"


def test_default_deployments_of_four_devices_all_run():
    result = capacity(
        ServingQuestion(small_load(40), COST, SLO_1S, executor=InlineExecutor()), 4, tolerance=0.2
    )
    assert len(result.results) == len(default_deployments(COST, 4, SLO_1S))
    assert all(r.probes for r in result.results)


# --- executors ----------------------------------------------------------------------------


def comparable(result: CapacityResult) -> dict:
    return result.to_dict()


def test_a_process_pool_gives_the_inline_answer():
    load = small_load(30)
    deployments = default_deployments(COST, 2, SLO_1S)
    inline = capacity(
        ServingQuestion(load, COST, SLO_1S, executor=InlineExecutor()), 2, deployments=deployments
    )
    with local_executor(2) as pool:
        pooled = capacity(
            ServingQuestion(load, COST, SLO_1S, executor=pool), 2, deployments=deployments
        )
    assert comparable(pooled) == comparable(inline)


def test_a_dask_local_cluster_gives_the_local_answer(monkeypatch):
    distributed = pytest.importorskip("distributed")
    # spawned workers import pytest_prefill from the same source tree as this process
    root = str(Path(pytest_prefill.__file__).resolve().parents[1])
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    )
    load = small_load(30)
    deployments = default_deployments(COST, 2, SLO_1S)
    with local_executor(2) as pool:
        local = capacity(
            ServingQuestion(load, COST, SLO_1S, executor=pool), 2, deployments=deployments
        )
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        dask_executor(cluster.scheduler_address) as executor,
    ):
        remote = capacity(
            ServingQuestion(load, COST, SLO_1S, executor=executor), 2, deployments=deployments
        )
    assert comparable(remote) == comparable(local)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


NEEDS_DISTRIBUTED = pytest.mark.skipif(
    importlib.util.find_spec("distributed") is None,
    reason="needs Dask's distributed (the cluster extra; .ci/run installs it for these tests)",
)


@NEEDS_DISTRIBUTED
def test_a_cluster_that_does_not_answer_is_a_clear_error_within_seconds():
    began = time.perf_counter()
    with pytest.raises(ValueError, match="no Dask scheduler answered at tcp://127.0.0.1"):
        with dask_executor(f"tcp://127.0.0.1:{free_port()}", timeout=3):
            pass
    assert time.perf_counter() - began < 10


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("", "must be like tcp://host:8786"),
        ("nowhere", "must be like"),
        ("foo://h:1", "only tcp:// is supported"),
        ("tls://127.0.0.1:8786", "only tcp:// is supported"),
        ("ucx://127.0.0.1:8786", "only tcp:// is supported"),
        ("tcp://127.0.0.1:99999", "must be like"),
    ],
)
def test_a_malformed_cluster_address_is_a_named_error(address, message):
    with pytest.raises(ValueError, match=message):
        with dask_executor(address, timeout=1):
            pass


def test_without_distributed_a_cluster_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)  # import fails
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(ValueError, match=r"pip install '\.\[cluster\]'"):
            with dask_executor(address, timeout=1):
                pass


def test_importing_the_package_imports_no_dask():
    code = (
        "import sys, pytest_prefill, pytest_prefill.plan.capacity, pytest_prefill.plan.executors, "
        "pytest_prefill.plan.metrics; "
        "bad = [m for m in ('dask', 'distributed', 'torch', 'numpy') if m in sys.modules]; "
        "assert not bad, bad"
    )
    root = str(Path(pytest_prefill.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"devices": 0}, "devices must be an integer >= 1"),
        ({"target": 0.0}, r"target attainment must be in \(0, 1\]"),
        ({"target": 1.5}, "target attainment"),
        ({"target": math.nan}, "target attainment"),
        ({"tolerance": 0}, "tolerance must be in"),
        ({"slo": "ttft:1s"}, "slo must be an SLO"),
        ({"cost": "datacenter-illustrative"}, "cost must be a CostModel"),
        ({"workload": []}, "workload has no request"),
        ({"workload": [Request("a", 1.0, 10, 1), Request("b", 1.0, 10, 1)]}, "all arrive at once"),
        ({"deployments": []}, "at least one deployment"),
        ({"deployments": [Deployment("shared", 2)]}, "uses 2 devices; this search compares 1"),
        ({"deployments": [Deployment("shared", 1)] * 2}, "repeated"),
        ({"start": 0.0}, "start must be a rate multiple"),
    ],
)
def test_bad_search_input_is_a_named_error(change, message):
    args = {"workload": small_load(5), "cost": COST, "slo": SLO_1S, "devices": 1, **change}
    asked = {k: args.pop(k) for k in ("workload", "cost", "slo", "target") if k in args}
    devices = args.pop("devices")
    with pytest.raises(ValueError, match=message):
        capacity(ServingQuestion(**asked, executor=InlineExecutor()), devices, **args)


def test_a_failing_simulation_reaches_the_caller():
    too_big = [Request("a", 0.0, 10, 1), Request("b", 1.0, 10, 1)]

    def broken(*args, **_):
        raise ValueError("simulation refused")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(capacity_module, "probe", broken)
        with pytest.raises(ValueError, match="simulation refused"):
            capacity(
                ServingQuestion(too_big, COST, SLO_1S, executor=InlineExecutor()),
                1,
                deployments=[Deployment("shared", 1)],
            )


def test_deployment_result_without_a_miss_binds_nothing():
    probe = Probe(1.0, 1.0, fake_metrics(1.0))
    result = DeploymentResult(Deployment("shared", 1), 0.9, (probe,), probe, None)
    assert result.binding == "-" and result.status == "never missed"


# --- what a hostile run found: hangs and tracebacks, each now bounded ---------------------------


def finishes_within(seconds: float, call):
    """``call()``'s result, or the exception it raised; a test failure (not a hang) when it is
    still running after ``seconds``."""
    import threading

    box: dict = {}

    def target():
        try:
            box["value"] = call()
        except BaseException as err:  # handed to the test
            box["error"] = err

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    return box.get("error", box.get("value"))


def test_a_tolerance_too_fine_to_separate_rates_is_refused():
    """1: with 1 + tolerance == 1.0 the bracket never closed (still running at 60 s)."""
    for tolerance in (1e-17, 1e-300):
        error = finishes_within(
            10,
            lambda t=tolerance: capacity(
                ServingQuestion(small_load(5), COST, SLO_1S, executor=InlineExecutor()),
                1,
                tolerance=t,
            ),
        )
        assert isinstance(error, ValueError) and "tolerance must be in [0.0001, 1]" in str(error)


class Peer:
    """A TCP server on 127.0.0.1 that accepts and then ``greet``s (bytes, or nothing)."""

    def __init__(self, greet: bytes = b"") -> None:
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.address = f"tcp://127.0.0.1:{self.sock.getsockname()[1]}"
        self.greet, self.held = greet, []
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)  # never closed while the test runs: a peer that stays
            if self.greet:
                conn.sendall(self.greet)

    def close(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()


@pytest.fixture
def peer():
    made = []

    def make(greet: bytes = b"") -> Peer:
        made.append(Peer(greet))
        return made[-1]

    yield make
    for p in made:
        p.close()


@NEEDS_DISTRIBUTED
def test_a_dask_peer_that_accepts_and_never_answers_is_an_error_within_the_timeout(peer):
    """2: something that accepts TCP and never speaks hung the command past 180 s."""
    silent = peer()
    began = time.perf_counter()
    error = finishes_within(15, lambda: dask_executor(silent.address, timeout=1).__enter__())
    assert isinstance(error, ValueError), error
    assert "sent no Dask scheduler handshake within 1 s" in str(error)
    assert time.perf_counter() - began < 10


@NEEDS_DISTRIBUTED
def test_a_dask_peer_that_answers_with_junk_is_an_error_at_once(peer):
    """4: junk was read as a frame length (a MemoryError after 20 s: 'Unable to allocate 3.07
    EiB') plus a traceback from Client.__del__."""
    junk = peer(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    error = finishes_within(15, lambda: dask_executor(junk.address, timeout=5).__enter__())
    assert isinstance(error, ValueError), error
    assert "answers, but not as a Dask scheduler" in str(error)


class FakeDistributed:
    """Stands for the ``distributed`` module: a client whose cluster has no worker left, and
    whose executor's futures therefore never finish (what dask does when every worker died)."""

    class Client:
        def __init__(self, address, **kwargs):
            import concurrent.futures

            self.pool = concurrent.futures.ThreadPoolExecutor(1)
            self.release = __import__("threading").Event()

        def get_executor(self, **kwargs):
            client = self

            class Never(__import__("concurrent.futures").futures.Executor):
                def submit(self, fn, *args, **kwargs):
                    return client.pool.submit(client.release.wait)

            return Never()

        def nthreads(self):
            return {}

        def close(self):
            self.release.set()
            self.pool.shutdown(wait=False)


def test_a_cluster_whose_workers_all_died_stops_the_search_with_a_message(peer, monkeypatch):
    """3: kill -9 every worker 4 s in and the search waited for ever, silently."""
    import pytest_prefill.plan.executors as executors

    monkeypatch.setitem(sys.modules, "distributed", FakeDistributed)
    monkeypatch.setattr(executors, "WORKERLESS_GRACE", 0.5)
    greeting = (58).to_bytes(8, "little") + b"x" * 58  # a scheduler's handshake, as sent
    scheduler = peer(greeting)

    def search():
        with dask_executor(scheduler.address, timeout=5) as executor:
            return capacity(
                ServingQuestion(small_load(10), COST, SLO_1S, executor=executor),
                1,
                deployments=[Deployment("shared", 1)],
            )

    error = finishes_within(20, search)
    assert isinstance(error, executors.ExecutorLost), error
    assert "has had no worker for 0.5 s" in str(error)


def test_a_broken_process_pool_is_named_not_a_traceback():
    """3: a local worker killed mid-search breaks the pool; the search says so."""
    import concurrent.futures

    from pytest_prefill.plan.executors import ExecutorLost

    class Broken(concurrent.futures.Executor):
        def submit(self, fn, *args, **kwargs):
            future = concurrent.futures.Future()
            future.set_exception(concurrent.futures.process.BrokenProcessPool("a child died"))
            return future

    with pytest.raises(ExecutorLost, match="a worker died"):
        capacity(ServingQuestion(small_load(5), COST, SLO_1S, executor=Broken()), 1)


def test_default_deployments_are_bounded_for_many_devices():
    """8: 1,024 devices gave 1,027 searches in lockstep (892 s, the first progress at 494 s)."""
    from pytest_prefill.plan.deployments import MAX_SPLITS

    for devices in (2, 16, 17, 64, 1024):
        splits = [d for d in default_deployments(COST, devices) if d.policy == "disaggregated"]
        assert 1 <= len(splits) <= MAX_SPLITS
        prefill = [d.prefill_workers for d in splits]
        assert prefill == sorted(set(prefill)) and prefill[0] == 1 and prefill[-1] == devices - 1
    every = default_deployments(COST, MAX_SPLITS + 1)
    assert len([d for d in every if d.policy == "disaggregated"]) == MAX_SPLITS


def test_a_long_search_says_how_far_it_is_before_any_deployment_finishes(monkeypatch):
    """8: progress only came when a deployment finished; in lockstep that is the end."""
    monkeypatch.setattr(search_loop, "PROGRESS_EVERY", 0.0)
    lines: list[str] = []
    with local_executor(2) as pool:
        capacity(
            ServingQuestion(small_load(10), COST, SLO_1S, executor=pool, progress=lines.append), 2
        )
    first_done = next(i for i, line in enumerate(lines) if "req/s (" in line)
    assert any("simulations done;" in line for line in lines[:first_done])


def _sigint_handler_name() -> str:
    import signal

    handler = signal.getsignal(signal.SIGINT)
    return "ignored" if handler == signal.SIG_IGN else str(handler)


def _sleep(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def test_pool_workers_leave_ctrl_c_to_the_caller():
    """10: Ctrl-C reaches the whole process group; workers printed KeyboardInterrupt
    tracebacks."""
    with local_executor(2) as pool:
        assert pool.submit(_sigint_handler_name).result() == "ignored"


def test_an_interrupted_pool_stops_its_workers_at_once():
    """10: after "interrupted" the command did not exit for 30 s: the pool waited for the
    simulations in flight."""

    def interrupted():
        with local_executor(2) as pool:
            futures = [pool.submit(_sleep, 30) for _ in range(2)]
            time.sleep(0.5)  # both running
            assert not any(f.done() for f in futures)
            raise KeyboardInterrupt

    began = time.perf_counter()
    assert isinstance(finishes_within(15, interrupted), KeyboardInterrupt)
    assert time.perf_counter() - began < 10


def test_a_pool_interrupted_while_it_finishes_stops_its_workers_at_once():
    """A Ctrl-C while the block's normal end waits for the pool's last tasks (the workers
    ignore SIGINT: waiting on them kept capacity alive for more than 30 s under load)."""

    import multiprocessing

    before = set(multiprocessing.active_children())
    workers = []

    def interrupted_at_the_end():
        with local_executor(2) as pool:
            futures = [pool.submit(_sleep, 30) for _ in range(2)]
            time.sleep(0.5)  # both running
            assert not any(f.done() for f in futures)
            workers.extend(p for p in multiprocessing.active_children() if p not in before)
            finish = pool.shutdown

            def shutdown(wait: bool = True, **kwargs):
                if wait:  # the Ctrl-C arrives while the block's end waits for its tasks
                    raise KeyboardInterrupt
                finish(wait=wait, **kwargs)

            pool.shutdown = shutdown  # type: ignore[method-assign]

    began = time.perf_counter()
    assert isinstance(finishes_within(15, interrupted_at_the_end), KeyboardInterrupt)
    assert time.perf_counter() - began < 10
    # none left running (asked of the OS: the pool's own thread may have reaped a worker, and
    # then its Process object cannot tell)
    assert len(workers) == 2 and not any(_running(w.pid) for w in workers)


def test_ctrl_c_during_capacity_exits_at_once_without_tracebacks(tmp_path):
    """10, end to end: SIGINT to the command's process group (what a terminal's Ctrl-C does)."""
    import signal

    root = str(Path(pytest_prefill.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "pytest_prefill", "capacity", "--slo", "ttft:1s,tpot:50ms"]
    # 60,000 prompts take ~30 s to search: the search is still running when SIGINT arrives
    argv += ["--workers", "2", "--num-prompts", "60000", "--devices", "4"]
    child = subprocess.Popen(
        argv,
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        # as in a terminal: a runner started in the background (`cmd &` in a script) ignores
        # SIGINT, and a child inherits an ignored signal across exec
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 30
        while (
            time.monotonic() < deadline
            and len([p for p in os.listdir("/proc") if p.isdigit() and _parent(p) == child.pid]) < 2
        ):
            time.sleep(0.1)  # until the pool's workers exist
        time.sleep(1.0)
        os.killpg(child.pid, signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    text = err.decode()
    assert child.returncode == 130, text
    assert "Traceback" not in text and "interrupted" in text


def _running(pid: int | None) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _parent(pid: str) -> int:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return -1


def test_non_monotone_is_flagged_only_beyond_the_sampling_error():
    """Issue 21: '(!) not monotone' fired on noise ('rises from 100.0% at 3.4 req/s to 100.0%
    at 6.8 req/s'; '11.6% -> 11.9%'), often on the recommended row."""
    from pytest_prefill.plan.rate_search import rises_beyond_noise

    def pair(a, b, n=1000):
        return Probe(1.0, 1.0, fake_metrics(a, n)), Probe(2.0, 2.0, fake_metrics(b, n))

    assert not rises_beyond_noise(*pair(0.999, 1.0))  # one request more: luck
    assert not rises_beyond_noise(*pair(0.116, 0.119))  # within 2 standard errors
    assert rises_beyond_noise(*pair(0.10, 0.30))
    assert rises_beyond_noise(*pair(0.10, 0.30, n=40))
    assert not rises_beyond_noise(*pair(0.50, 0.60, n=40))  # 4 of 40 requests: noise
    low, high = pair(0.89, 0.905)
    result = DeploymentResult(Deployment("shared", 1), 0.9, (low, high), high, low)
    assert result.monotone and not result.crossing  # a pass just above a miss: noise


def test_a_never_met_note_says_when_requests_arrive_together():
    # 8 instants of 5 long prompts each: one shared worker prefills a bunch in one pass, so a
    # bunch's TTFT is 5 prompts' prefill at any rate (alone each would meet the bound)
    cost = PRESETS["datacenter-illustrative"].cost
    bunched = [
        Request(f"b{i}-{j}", arrival=2.0 * i, prompt_len=4000, output_len=4)
        for i in range(8)
        for j in range(5)
    ]
    slo = SLO.parse("ttft:100ms")
    found = capacity(
        ServingQuestion(bunched, cost, slo, executor=InlineExecutor()),
        1,
        deployments=[Deployment("shared", 1)],
    )
    (only,) = found.results
    assert only.status == "never met" and only.alone == 0
    (note,) = [n for n in found.notes() if "missed the SLO even at" in n]
    assert "up to 5 at one instant; 8 distinct arrival times for 40 requests" in note
    apart = [dataclasses.replace(r, arrival=r.arrival + 0.3 * j) for j, r in enumerate(bunched)]
    spread = capacity(
        ServingQuestion(apart, cost, slo, executor=InlineExecutor()),
        1,
        deployments=[Deployment("shared", 1)],
    )
    assert spread.largest_bunch == 1
    assert not [n for n in spread.notes() if "arriving together" in n]
