"""transformers serve's decode step priced as its continuous batching runs it on a CPU
(plan/compute/cpu_serve.py): the rows' caches read back into one copy, with more than one row
that copy expanded to every query head and SDPA run dense over every row's keys under a mask;
and a calibration of that engine carried to another model through the same step."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pytest_prefill.commands._compute_args import served_by
from pytest_prefill.plan.compute.cpu_serve import (
    ATTENTION_OP,
    ServeAttention,
    attention_seconds,
    serve_decode_step,
)
from pytest_prefill.plan.compute.derive import TokenRange, derive_cost
from pytest_prefill.plan.compute.physics import Physics
from pytest_prefill.plan.compute.transfer import (
    ENGINE_STEPS,
    carry,
    cpu_efficiency,
    engine_step,
    linear_device,
    transfer,
)
from pytest_prefill.plan.model_spec import load_model_spec
from tests.test_compute_cpu import CPU
from tests.test_compute_transfer import EFFICIENCIES, HOST, MEASURED, TARGET, TERMS

pytestmark = pytest.mark.sim


def _model(name="medium"):
    return dataclasses.replace(load_model_spec(name), dtype="float32")


def _physics(name="medium", efficiencies=EFFICIENCIES, tp=1):
    model = _model(name)
    device = linear_device(CPU, model.dtype)
    return Physics(model, device, cpu_efficiency(device, efficiencies).table, tp)


@pytest.mark.parametrize("name", ["small", "medium"])
def test_one_row_reads_its_copy_once_and_scores_only_its_own_keys(name):
    model, keys = _model(name), 351
    one = ServeAttention(model, 1, keys)
    per_token = 2 * model.kv_heads * model.head_dim * model.kv_dtype_bytes
    assert one.kv_bytes * model.layers == model.kv_bytes_per_token
    # the new token written, every key read from the cache and written to the copy, then read
    assert one.moved() == per_token + 3 * keys * per_token
    assert one.flops() == 4 * model.attention_heads * model.head_dim * keys


@pytest.mark.parametrize("name", ["small", "medium"])
def test_more_rows_expand_the_copy_to_every_head_and_score_every_rows_keys(name):
    model, rows, keys = _model(name), 4, 4 * 351
    call = ServeAttention(model, rows, keys)
    assert call.expanded_bytes * model.kv_heads == call.kv_bytes * model.attention_heads
    mask = model.attention_heads * rows * keys * model.dtype_bytes
    copies = keys * (call.kv_bytes + 2 * call.expanded_bytes)  # repeat_kv read, write; SDPA read
    assert call.moved() == call.gathered() + copies + mask
    assert call.flops() == rows * ServeAttention(model, 1, keys).flops()


def test_the_bytes_grow_by_the_same_amount_for_each_key_at_a_given_row_count():
    model = _model()
    moved = [ServeAttention(model, 3, keys).moved() for keys in (600, 900, 1200)]
    assert moved[2] - moved[1] == pytest.approx(moved[1] - moved[0])
    per_key = (moved[1] - moved[0]) / 300
    expected = (
        3 * ServeAttention(model, 3, 3).kv_bytes + 2 * ServeAttention(model, 3, 3).expanded_bytes
    )
    assert per_key == pytest.approx(expected + model.attention_heads * 3 * model.dtype_bytes)


def test_the_attention_is_the_slower_of_its_bytes_and_its_flops():
    physics = _physics()
    call = ServeAttention(physics.model, 6, 6 * 309)
    eff, device = physics.efficiency, physics.device
    memory = call.moved() / (eff.attention_memory_efficiency * device.memory_bandwidth)
    compute = call.flops() / (eff.attention_compute_efficiency * device.peak("bf16"))
    assert attention_seconds(physics, 6, 6 * 309) == pytest.approx(max(memory, compute))
    slower = _physics(efficiencies={**EFFICIENCIES, "attention_memory": 0.25})
    halved = memory * EFFICIENCIES["attention_memory"] / 0.25
    assert attention_seconds(slower, 6, 6 * 309) == pytest.approx(max(halved, compute))


@pytest.mark.parametrize(("rows", "context"), [(1, 350), (3, 346), (6, 308)])
def test_the_step_is_the_physics_with_each_layers_attention_priced_as_the_server_runs_it(
    rows, context
):
    physics, kv = _physics(), rows * context
    ops = physics.pass_ops(rows, kv + rows, kv, rows, decode=True)
    attention = sum(op.seconds for op in ops if op.name == ATTENTION_OP)
    layers = physics.model.layers
    expected = (
        physics.decode_step(rows, kv)
        - attention
        + layers * attention_seconds(physics, rows, kv + rows)
    )
    assert serve_decode_step(physics, rows, kv) == pytest.approx(expected)


def test_a_batch_costs_more_per_row_than_the_physics_packed_attention_says():
    physics, context = _physics(), 350
    served = [serve_decode_step(physics, rows, rows * context) for rows in (1, 6)]
    physical = [physics.decode_step(rows, rows * context) for rows in (1, 6)]
    assert served[1] - served[0] > physical[1] - physical[0]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ((0, 10), "rows must be an integer >= 1"),
        ((True, 10), "rows must be an integer >= 1"),
        ((2, -1), "kv_tokens must be an integer >= 0"),
    ],
)
def test_a_bad_step_is_refused_naming_the_field(args, named):
    with pytest.raises(ValueError, match=named):
        serve_decode_step(_physics(), *args)


def test_the_server_runs_on_one_device():
    with pytest.raises(ValueError, match="tp must be 1"):
        serve_decode_step(_physics(tp=2), 1, 10)


@pytest.mark.parametrize(
    ("rows", "keys", "named"),
    [(0, 5, "rows must be"), (2, 0, "keys must be"), (3, 2, r"keys \(2\) must be at least")],
)
def test_bad_attention_shapes_are_refused_naming_the_field(rows, keys, named):
    with pytest.raises(ValueError, match=named):
        ServeAttention(_model(), rows, keys)


def test_transformers_is_the_engine_whose_step_differs():
    assert engine_step("transformers") is serve_decode_step
    assert engine_step("llama.cpp") is None and engine_step(None) is None
    assert set(ENGINE_STEPS) == {"transformers"}


def _served(model, span: TokenRange):
    device = linear_device(CPU, model.dtype)
    choice = cpu_efficiency(device, EFFICIENCIES)
    return derive_cost(model, device, choice, span, host=HOST, step=serve_decode_step)


def test_a_transformers_calibration_made_from_known_terms_carries_them_back():
    small = _model("small")
    made = _served(small, MEASURED)
    carried = carry(made.cost, small, CPU, MEASURED, "known", serve_decode_step)
    for name, eta in EFFICIENCIES.items():
        assert carried.efficiencies[name] == pytest.approx(eta, rel=1e-9)
    assert carried.host.per_layer == pytest.approx(HOST.per_layer, rel=1e-9)
    assert carried.host.per_request_layer == pytest.approx(HOST.per_request_layer, rel=1e-9)


def test_a_transformers_transfer_is_what_the_known_terms_give_the_larger_model():
    small, medium = _model("small"), _model("medium")
    calibration = _served(small, MEASURED).cost
    derived = transfer(calibration, small, medium, CPU, (MEASURED, TARGET), "known", "transformers")
    truth = _served(medium, TARGET).cost
    for term in TERMS:
        assert getattr(derived.cost, term) == pytest.approx(getattr(truth, term), rel=1e-9)
    # carried as the physics' own step instead, the same calibration gives another model
    other = transfer(calibration, small, medium, CPU, (MEASURED, TARGET), "known", "llama.cpp")
    assert other.cost.decode_per_seq != pytest.approx(truth.decode_per_seq, rel=1e-6)


@pytest.mark.parametrize(
    ("provenance", "engine"),
    [
        ({"server": {"engine": "transformers"}}, "transformers"),
        ({"server": {"engine": None}}, None),
        ({"server": []}, None),
        ({}, None),
        ([], None),
    ],
)
def test_host_from_reads_the_engine_its_calibration_measured(provenance, engine):
    assert served_by(provenance) == engine


def test_gpu_cpu_from_a_transformers_calibration_derives_through_its_step(tmp_path, capsys):
    from pytest_prefill.cli import main
    from tests.test_compute_transfer import PROBE_FIELD, SIMULATE, _calibration, _probe_record

    answers = {}
    for engine in ("transformers", "llama.cpp"):
        provenance = {
            "model": "small",
            "dtype": "float32",
            PROBE_FIELD: _probe_record(),
            "server": {"engine": engine},
        }
        folder = tmp_path / engine
        folder.mkdir()
        path, out = _calibration(folder, provenance), folder / "out.json"
        assert main([*SIMULATE, "--host-from", path, "--json", str(out)]) == 0
        capsys.readouterr()
        answers[engine] = json.loads(out.read_text())["cost_model"]
    # the same calibration carried through another engine's step gives another decode cost
    ours, other = answers["transformers"], answers["llama.cpp"]
    assert ours["decode_per_kv_token"] != pytest.approx(other["decode_per_kv_token"], rel=1e-6)
