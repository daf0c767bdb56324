"""``prefill-bench capacity``: for a workload, an SLO and N devices, which deployment serves
the most requests per device — the search, its table, one line to act on, a plot and JSON."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from pytest_prefill._io import read_json, write_atomic, write_json_atomic
from pytest_prefill.archive.cost_spec import CostSpec
from pytest_prefill.commands._args import bounded_int, non_negative_float, output_path
from pytest_prefill.commands._deploy_args import (
    Deploying,
    check_deploy_args,
    check_deployment_tp,
    decode_pool_cost,
    keep_server_facts,
    search_deployments,
    served_name,
)
from pytest_prefill.commands._engine_args import (
    add_engine_argument,
    check_engine,
    engine_for,
    engine_note,
)
from pytest_prefill.commands._kind_args import (
    DEVICES_HELP,
    PRICE_HELP,
    KindSearch,
    across_kinds,
    check_kinds,
    devices_type,
    kind_plan,
)
from pytest_prefill.commands._measure_args import (
    add_cost_argument,
    progress,
)
from pytest_prefill.commands._options import add_defaulted
from pytest_prefill.commands._planning_cost import (
    add_planning_arguments,
    measured_model,
    planning_cost,
)
from pytest_prefill.commands._workload_args import (
    add_workload_arguments,
    capped_line,
    check_chunked_run,
    check_workload_args,
    positive_float,
    workload_from_args,
)
from pytest_prefill.plan.capacity import (
    DEFAULT_TOLERANCE,
    MIN_TOLERANCE,
    CapacityResult,
    burst_warning,
    capacity,
)
from pytest_prefill.plan.deployments import (
    Deployment,
    deployments_like,
    refused_kinds,
)
from pytest_prefill.plan.engine_commands import splits
from pytest_prefill.plan.executors import (
    CONNECT_TIMEOUT,
    check_cluster_address,
    dask_executor,
    search_executor,
)
from pytest_prefill.plan.kinds import result_prices
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.plan.question import DEFAULT_TARGET, ServingQuestion
from pytest_prefill.plan.sizing import DEFAULT_MAX_DEVICES, DevicesNeeded, devices_needed
from pytest_prefill.plan.workloads import Workload
from pytest_prefill.report.assumptions import (
    AnswerBasis,
    basis,
    header_source,
    mixed_models,
    pool_sources,
)
from pytest_prefill.report.capacity import (
    capacity_document,
    capacity_gate,
    capacity_svg,
    capacity_text,
)
from pytest_prefill.report.png import need_matplotlib, svg_to_png
from pytest_prefill.sim import CostModel, EngineProfile

HELP = "find the deployment that serves the most requests per device within an SLO"
DEFAULT_ENGINE = "vllm"  # capacity answers in a real engine's flags; the library's default is lab
MAX_DEVICES = 1024  # every device count's default deployments are a bounded set (deployments.py)
MAX_WORKERS = 256  # local processes
# Without --cost the search runs on a preset and says so on every answer line (refusing would
# leave a new user with nothing to try; a preset's answer, plainly labelled, shows what the
# tool does and what it needs: a calibration of their own server).
DEFAULT_COST = "lab-laptop"
BURST_POINTER = (
    "   (that rate is one burst draining, not a knee: see the warning under Workload; more "
    "--num-prompts measure it)"
)


def slo_type(text: str) -> SLO:
    try:
        return SLO.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def fraction_type(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    return value


def tolerance_type(text: str) -> float:
    """A relative precision in [MIN_TOLERANCE, 1]: below it the bisection's midpoints stop
    being distinct rates (1 + 1e-17 is 1.0), and no search needs rates closer than 0.01%."""
    value = fraction_type(text)
    if value < MIN_TOLERANCE:
        raise argparse.ArgumentTypeError(
            f"must be at least {MIN_TOLERANCE:g} (rates closer than that cannot be told apart "
            f"by a simulation), got {text!r}"
        )
    return value


def cluster_type(text: str) -> str:
    try:
        return check_cluster_address(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


@dataclasses.dataclass(frozen=True)
class CapacityQuestion:
    """What capacity's flags ask, checked (:func:`check`): the deployment (``deploying``), the
    ``devices`` a deployment uses (across kinds, the budgets' sum), the most the devices-needed
    search tries (``max_devices``; ``devices_needed``: whether it runs), whether --cost took
    its default (``cost_defaulted``), the search across kinds (None: one kind), the
    deployments given (None: the engine's defaults), --decode-cost's spec and the baseline's
    document (None: not given)."""

    deploying: Deploying
    devices: int
    max_devices: int
    devices_needed: bool = True
    cost_defaulted: bool = False
    kind_search: KindSearch | None = None
    deployments: tuple[Deployment, ...] | None = None
    decode_cost_spec: CostSpec | None = None
    baseline_document: Any = None


def check(args: argparse.Namespace) -> CapacityQuestion:
    """Before any work: the engine profile, the workload's flags, the deployments (and the
    chunked iterations a run would take where the flags alone decide them), a plot's suffix,
    workers beside a cluster; what the flags ask."""
    profile = check_engine(args)
    kinds = None
    if across_kinds(args):  # each kind's compute derived: no preset, no --cost
        kinds, deploying = check_kinds(args, profile)
        devices = kinds.devices
    else:
        deploying = check_deploy_args(args, profile, args.devices)  # --gpu, no --cost: derived
        devices = args.devices
    cost_defaulted = kinds is None and args.cost is None and getattr(args, "gpu", None) is None
    if args.plot and not args.plot.lower().endswith((".svg", ".png")):
        raise ValueError(f"--plot must name an .svg or a .png file, got {args.plot!r}")
    if args.plot and args.plot.lower().endswith(".png"):
        need_matplotlib()  # before the search: a usage error, not a lost search
    if args.cluster and args.workers:
        raise ValueError("--workers sizes the local pool; with --cluster the cluster decides")
    if args.fail_above is not None and not args.baseline:
        raise ValueError("--fail-above gates against a --baseline; give one")
    max_devices = args.max_devices
    if max_devices is None:
        max_devices = max(DEFAULT_MAX_DEVICES, devices)
    elif max_devices < devices:
        raise ValueError(
            f"--max-devices ({max_devices}) bounds the search for the devices the traffic "
            f"needs, from --devices ({devices}) up: it must be at least --devices"
        )
    baseline = read_json(args.baseline, "--baseline") if args.baseline else None
    deployments = None
    if args.deployment and kinds is None:
        deployments = _given(args.deployment, deploying, devices)
    decode = None
    if args.decode_cost is not None:
        pools, decode = decode_pool_cost(args, deployments or (), kinds is not None)
        deployments = tuple(pools)
    check_workload_args(args, _token_chunks(deployments), deploying.max_model_len)
    needed = args.devices_needed and kinds is None  # across kinds a budget bounds the search
    return CapacityQuestion(
        deploying,
        devices,
        max_devices,
        needed,
        cost_defaulted,
        kinds,
        deployments,
        decode,
        baseline,
    )


def _given(texts: Sequence[str], deploying: Deploying, devices: int) -> tuple[Deployment, ...]:
    """The --deployment specs on ``devices`` under the engine, each one it and the simulator
    run (and whose TP serves --model there)."""
    profile = deploying.profile
    deployments = tuple(Deployment.parse(text, devices, profile) for text in texts)
    split = next((d for d in deployments if d.policy == "disaggregated"), None)
    if split is not None and not splits(profile):
        raise ValueError(
            f"--deployment {split.label}: engine {profile.name!r} runs no prefill:decode "
            "split (--engine vllm, sglang, distserve or lab do)"
        )
    for deployment in deployments:
        for reason in refused_kinds([deployment], profile).values():
            raise ValueError(f"--deployment {deployment.label}: {reason}")
    check_deployment_tp(deploying.hardware, [d.tp for d in deployments], devices)
    return deployments


def _token_chunks(deployments: Sequence[Deployment] | None) -> list[int]:
    """The chunks in tokens among ``deployments`` (a budget's chunk is not known beforehand)."""
    return [d.chunk for d in deployments or () if d.chunk is not None]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_cost_argument(parser)
    parser.set_defaults(cost=None)  # unset: DEFAULT_COST, said plainly in the answer
    add_workload_arguments(parser, default="poisson")
    add_engine_argument(parser, DEFAULT_ENGINE)
    add_search_arguments(parser)
    where = parser.add_argument_group("where the simulations run")
    where.add_argument(
        "--workers",
        type=bounded_int(MAX_WORKERS, "processes"),
        help="local processes (default: one per core when more than 2 deployments are searched, "
        "else the search runs in this process)",
    )
    where.add_argument(
        "--cluster",
        type=cluster_type,
        metavar="tcp://HOST:PORT",
        help="a Dask scheduler to run on (pip install '.[cluster]'; the workers "
        "need pytest-prefill installed)",
    )
    out = parser.add_argument_group("output")
    out.add_argument(
        "--plot",
        type=output_path,
        metavar="PATH.svg|PATH.png",
        help='draw attainment against rate here (.png needs pip install ".[plot]")',
    )
    out.add_argument(
        "--json", type=output_path, metavar="PATH", help="write the whole search as JSON here"
    )
    add_gate_arguments(parser)
    add_planning_arguments(parser)
    parser.set_defaults(cost_fallback=DEFAULT_COST)  # no --cost, no --gpu: the preset


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """``--slo --devices --target --tolerance --deployment`` and the devices-needed search."""
    search = parser.add_argument_group("search")
    search.add_argument(
        "--slo",
        type=slo_type,
        required=True,
        metavar="BOUNDS",
        help="bounds a request must meet, e.g. ttft:1s,tpot:100ms (also e2el; units s, ms, us)",
    )
    search.add_argument(
        "--devices", type=devices_type, default=1, metavar="N|KIND=N,...", help=DEVICES_HELP
    )
    search.add_argument("--price", metavar="KIND=$/h,...", help=PRICE_HELP)
    target_help = "SLO attainment to keep, in (0, 1] (default {default})"
    add_defaulted(search, "--target", fraction_type, DEFAULT_TARGET, target_help)
    tolerance_help = "relative precision of each rate (default {default})"
    add_defaulted(search, "--tolerance", tolerance_type, DEFAULT_TOLERANCE, tolerance_help)
    search.add_argument(
        "--deployment",
        action="append",
        metavar="SPEC",
        help="compare only these (repeatable): shared, coscheduled, chunked:512, "
        "chunked:100ms (a per-iteration budget), disaggregated:1:3, each optionally with the "
        "engine's settings ,tokens=N (token budget) ,seqs=N (sequence cap) and ,tp=N (devices "
        "per instance; --devices = instances × N): chunked,tokens=2048,tp=2 "
        "(default: the engine's own settings: for vllm token budgets around C* and every "
        "disaggregated split; for lab shared, chunked around C* and at the TPOT bound, every "
        "split; TP 1, 2, 4, 8 as --devices allow); across --gpu kinds, pools of their own: "
        "disaggregated:P:D,p=KIND[:tpN],d=KIND[:tpN] (e.g. disaggregated:2:4,p=h100:tp2,d=l40s; "
        "a pool not named takes the other's kind, at TP 1)",
    )
    search.add_argument(
        "--decode-cost",
        metavar="SPEC",
        help="the decode pool's own cost model for each disaggregated --deployment (a preset "
        "or a cost JSON path, as --cost; e.g. another TP's coefficients): --cost is then the "
        "prefill pool's and the KV link's (default: --cost for both pools)",
    )
    search.add_argument(
        "--devices-needed",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also find the fewest devices that meet the SLO at the workload's own rate "
        "(default: on)",
    )
    search.add_argument(
        "--max-devices",
        type=bounded_int(MAX_DEVICES, "devices"),
        metavar="N",
        help=f"the most devices that search tries (default {DEFAULT_MAX_DEVICES}, or --devices "
        "when more)",
    )


def add_gate_arguments(parser: argparse.ArgumentParser) -> None:
    """``--baseline --fail-above``: the history and regression gate."""
    gate = parser.add_argument_group("history and regression gate (like pytest-benchmark's)")
    gate.add_argument(
        "--baseline",
        metavar="PATH.json",
        help="compare each deployment's goodput per device with a search --json wrote before",
    )
    gate.add_argument(
        "--fail-above",
        type=non_negative_float,
        metavar="PCT",
        help="with --baseline: exit 1 when a deployment's goodput per device fell by more than "
        "PCT percent (and more than the two searches' tolerances)",
    )


def _executor(
    args: argparse.Namespace, searches: int
) -> tuple[contextlib.AbstractContextManager, str]:
    """Where the simulations run, and the words that say so."""
    if args.cluster:
        return dask_executor(args.cluster, timeout=CONNECT_TIMEOUT), f"on {args.cluster}"
    return search_executor(searches, args.workers)


def _devices_needed(
    question: CapacityQuestion,
    serving: ServingQuestion,
    deploying: Deploying,
    result: CapacityResult,
) -> DevicesNeeded | None:
    """The fewest devices meeting the SLO at the workload's own rate (None: not asked for),
    trying the kinds of deployment the search compared (``serving``: what it asked)."""
    if not question.devices_needed:
        return None
    given = question.deployments or ()
    progress(f"looking for the devices this traffic needs (up to {question.max_devices}) ...")
    cost, slo = serving.cost, serving.slo

    def candidates(n: int) -> tuple[Deployment, ...]:
        moved = deployments_like(given, n, cost, slo, deploying.profile) if given else None
        return search_deployments(deploying, slo, cost, n, moved)

    start, most = question.devices, question.max_devices
    return devices_needed(serving, candidates, start=start, max_devices=most, known=result)


def _left_out(question: CapacityQuestion, profile: EngineProfile, cost: CostModel) -> str | None:
    """A note when the engine (``profile``) runs splits but the simulator does not under its
    settings on ``cost`` (so the default set has none)."""
    if question.deployments or question.devices < 2 or not splits(profile):
        return None
    split = Deployment("disaggregated", 2, prefill_workers=1)
    reason = refused_kinds([split], profile, cost).get("disaggregated")
    return f"  note: no disaggregated split compared: {reason}" if reason else None


def _answer_basis(
    args: argparse.Namespace,
    question: CapacityQuestion,
    deploying: Deploying,
    facts_line: str | None,
    spec: CostSpec,
    result: CapacityResult,
    needed: DevicesNeeded | None,
    lengths: Sequence[int] = (),
) -> AnswerBasis:
    """The model lines, the memory fraction, model and (where KV holds less than the context,
    by TP) max-model-len for the command, and what the Type: and Devices needed: lines rest on;
    ``lengths``: the workload's prompt + output lengths; ``facts_line``: the server facts
    kept."""
    assert spec.cost is not None
    hardware = deploying.hardware
    best = result.ranked()[0].deployment
    lines = []
    if question.cost_defaulted:
        lines.append(
            f"  (no --cost given: the preset {DEFAULT_COST}, not your hardware; give --cost "
            "with a calibration of your server: prefill-bench calibrate-server)"
        )
    if facts_line:
        lines.append(facts_line)
    fraction = served = None
    short: dict[int, int] = {}
    if hardware is not None:
        tps = sorted({r.deployment.tp for r in result.results})
        block, context = deploying.profile.kv_block_tokens, deploying.max_model_len
        lines += hardware.lines(tps, block, context, lengths)
        fraction, served = hardware.utilization, served_name(args.model)
        for tp in tps:
            tokens = hardware.short_of(tp, block, context)
            if tokens is not None:
                short[tp] = tokens
    model = measured_model(spec)
    server = deploying.server_facts is not None
    decode = question.decode_cost_spec
    type_basis = basis(spec, spec.cost, best, hardware, model, server, decode)
    chosen = needed.deployment if needed is not None else None
    needed_basis = (
        basis(spec, spec.cost, chosen, hardware, model, server, decode)
        if needed is not None
        else None
    )
    warning = mixed_models(spec, hardware, model)
    fp8 = hardware.model.fp8_storage if hardware is not None else (False, False)
    return AnswerBasis(
        tuple(lines), fraction, served, type_basis, needed_basis, short, warning, fp8
    )


def _notes(
    args: argparse.Namespace, question: CapacityQuestion, plan: _Plan, result: CapacityResult
) -> list[str]:
    """What the workload lost or assumed, a split left out, and a burst the probes measured
    (``plan.workload``'s)."""
    deploying, workload, cost = plan.deploying, plan.workload, plan.spec.cost
    assert cost is not None  # measured by resolve_cost_args
    capped = capped_line(workload, deploying.max_model_len_origin)
    burst = _burst(args, workload, result)
    notes = (capped, *workload.notes, _left_out(question, deploying.profile, cost), burst)
    return [line for line in notes if line]


def _burst(args: argparse.Namespace, workload: Workload, result: CapacityResult) -> str | None:
    """The warning that the best deployment's rate was measured as one burst (None: not)."""
    return burst_warning(
        [r.arrival for r in workload.requests],
        [r.output_len for r in workload.requests],
        args.slo,
        result.base_rate,
        result.ranked()[0].max_rate,
    )


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What a search runs on: the ``workload``, the deployment as the cost left it
    (``deploying``: the engine with the workload's prefix blocks, a derivation's hardware, a
    server calibration's facts and ``facts_line``, the line that says so), the cost ``spec``,
    the ``deployments`` to search, and across kinds what the answer rests on (``kind_basis``)
    and the notes on kinds the engine refuses (else None and none)."""

    workload: Workload
    deploying: Deploying
    spec: CostSpec
    deployments: tuple[Deployment, ...]
    facts_line: str | None = None
    kind_basis: AnswerBasis | None = None
    kind_notes: tuple[str, ...] = ()


def _plan(args: argparse.Namespace, question: CapacityQuestion, workload: Workload) -> _Plan:
    """The cost spec and the deployments to search (across kinds, each kind's)."""
    deploying, devices = question.deploying, question.devices
    if question.kind_search is not None:
        deploying = dataclasses.replace(deploying, profile=engine_for(deploying.profile, workload))
        search = kind_plan(question.kind_search, deploying.profile, args.model, workload.requests)
        spec, deployments, kind_basis, notes = search
        return _Plan(workload, deploying, spec, deployments, None, kind_basis, tuple(notes))
    deploying, spec = planning_cost(args, deploying, lambda: workload.requests)
    assert spec.cost is not None  # measured by resolve_cost_args
    deploying = dataclasses.replace(deploying, profile=engine_for(deploying.profile, workload))
    deploying, facts_line = keep_server_facts(deploying, spec)
    given = question.deployments
    deployments = search_deployments(deploying, args.slo, spec.cost, devices, given)
    if not deployments:
        assert deploying.server_facts is not None  # only its TP leaves none
        raise ValueError(
            f"--devices {devices}: the server's TP ({deploying.server_facts.tp}) does not "
            "divide them"
        )
    return _Plan(workload, deploying, spec, deployments, facts_line)


def run(args: argparse.Namespace, question: CapacityQuestion | None = None) -> int:
    if question is None:  # called without the command line's check
        question = check(args)
    workload = workload_from_args(args, question.deploying.max_model_len)
    kinds = question.kind_search
    plan = _plan(args, question, workload)
    deploying, spec, deployments = plan.deploying, plan.spec, plan.deployments
    assert spec.cost is not None  # measured by resolve_cost_args
    chunks = _token_chunks(deployments)
    check_chunked_run((r.prompt_len for r in workload.requests), chunks)
    pool, where = _executor(args, len(deployments))
    progress(f"searching {workload.description} {where} ...")
    began = time.perf_counter()
    with pool as executor:
        serving = ServingQuestion(
            workload,
            spec.cost,
            args.slo,
            args.target,
            deploying.profile,
            executor=executor,
            progress=progress,
        )
        result = capacity(
            serving,
            question.devices,
            deployments=deployments,
            tolerance=args.tolerance,
            budget=kinds.budget if kinds is not None else None,
        )
        needed = _devices_needed(question, serving, deploying, result)
        if kinds is not None and kinds.prices is not None:
            result = result_prices(result, workload.requests, kinds.prices)
    seconds = time.perf_counter() - began
    lengths = [r.prompt_len + r.output_len for r in workload.requests]
    basis = plan.kind_basis or _answer_basis(
        args, question, deploying, plan.facts_line, spec, result, needed, lengths
    )
    decode = question.decode_cost_spec
    source = pool_sources(header_source(spec.source, spec, deploying.hardware), decode)
    lines = capacity_text(result, source, needed, engine_note(args), basis).split("\n")
    # what the workload lost or assumed goes above the table, under the Workload line
    extra = [*plan.kind_notes, *_notes(args, question, plan, result)]
    at = next((i + 1 for i, line in enumerate(lines) if line.startswith("Workload: ")), 0)
    if _burst(args, workload, result):  # the rate below is a burst's: said beside it too
        best = next((i + 1 for i, line in enumerate(lines) if line.startswith("-> ")), None)
        if best is not None:
            lines.insert(best, BURST_POINTER)
    print("\n".join([*lines[:at], *extra, *lines[at:]]))
    simulations = result.simulations + (needed.simulations if needed is not None else 0)
    print(f"{simulations} simulations in {seconds:.1f} s {where}.")
    _write(args, result, spec, needed, basis, decode)
    if question.baseline_document is None:
        return 0
    passed, lines = capacity_gate(question.baseline_document, result, args.fail_above)
    print(f"\nAgainst the baseline {args.baseline}:")
    print("\n".join(lines))
    return 0 if passed else 1


def _write(
    args: argparse.Namespace,
    result: CapacityResult,
    spec: CostSpec,
    needed: DevicesNeeded | None,
    basis: AnswerBasis,
    decode: CostSpec | None,
) -> None:
    """--plot's drawing and --json's document, each said when written."""
    if args.plot:
        drawing = capacity_svg(result)
        png = args.plot.lower().endswith(".png")
        write_atomic(args.plot, svg_to_png(drawing) if png else drawing)
        print(f"wrote {args.plot}")
    if args.json:
        document = capacity_document(result, pool_sources(spec.source, decode), needed, basis)
        write_json_atomic(args.json, document)
        print(f"wrote {args.json}")
