"""Fidelity: run scenarios for real on the engine and in the simulator with cost models
calibrated on that same engine, and set the simulator's error against the measured run-to-run
spread. Nothing here prints (progress goes to a callable); torch is imported lazily."""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pytest_prefill.lab.fidelity_result import (
    METRICS,
    Cell,
    FidelityResult,
    Scenario,
    iteration_errors,
    judged,
)
from pytest_prefill.sim import (
    POLICIES,
    CostModel,
    check_int,
    simulate,
)

MIN_RUNS = 3
DEFAULT_PROMPT_LENS = (256, 1024, 2048)
DEFAULT_CHUNK = 256
POISSON_COUNT = 8
POISSON_UTILIZATION = 0.5  # offered load: arrival rate x simulated service time per request
POISSON_MAX_SPAN = 2.0  # seconds: the arrival rate is raised if needed to keep runs short
AZURE_OUTPUT_SCALE = 8  # Azure conv outputs (median ~240 tokens) divided by this

Progress = Callable[[str], object]


def _say(progress: Progress | None, text: str) -> None:
    if progress is not None:
        progress(text)


def policies_for(device: Any, cuda_devices: int = 0) -> tuple[tuple[str, ...], dict[str, str]]:
    """The policies a fidelity run can run on ``device``, and why any other is not run.

    On CPU every policy runs (disaggregation as two processes on disjoint cores). On CUDA the
    colocated policies run on the one device; disaggregation is reported as not run: it needs
    two devices, and this build ships KV between processes through host memory only."""
    kind = getattr(device, "type", str(device))
    if not kind.startswith("cuda"):
        return tuple(POLICIES), {}
    reason = (
        f"not run: real disaggregation needs two devices (one per worker); {cuda_devices} CUDA "
        "device(s) here"
        if cuda_devices < 2
        else "not run: real disaggregation between CUDA devices is not built in this version "
        "(the engine ships KV through host shared memory, on CPU only)"
    )
    return tuple(p for p in POLICIES if p != "disaggregated"), {"disaggregated": reason}


def scenarios(
    cost: CostModel,
    *,
    prompt_lens: Sequence[int] = DEFAULT_PROMPT_LENS,
    azure: bool = True,
    seed: int = 0,
    count: int = POISSON_COUNT,
) -> tuple[list[Scenario], list[str]]:
    """The lab scenario at each prompt length, and a Poisson load with Azure conv lengths.
    Returns the scenarios and the reasons for any that were skipped."""
    from pytest_prefill.plan.traces import azure_trace_path
    from pytest_prefill.plan.workloads import lab_scenario

    out = [
        Scenario(
            f"lab {n}",
            tuple(lab_scenario(prompt_len=n)),
            f"2 live streams (128-token prompts, 256 tokens each) decoding; a {n}-token "
            "prompt (32 tokens out) arrives at 100 ms",
        )
        for n in prompt_lens
    ]
    path = azure_trace_path("conv") if azure else None
    if not azure:
        return out, ["Poisson/Azure scenario not asked for"]
    if path is None:
        return out, [
            "Poisson/Azure scenario skipped: the Azure conv trace is not in "
            "shared/data/azure-llm-inference-2023 (set PYTEST_PREFILL_AZURE_DIR)"
        ]
    return [*out, _poisson(cost, path, max(prompt_lens), seed, count)], []


def _poisson(cost: CostModel, path: Any, top: int, seed: int, count: int) -> Scenario:
    from pytest_prefill.plan.traces import load_azure
    from pytest_prefill.plan.workloads import poisson

    trace = load_azure(path, limit=2000)
    prompts = [min(r.prompt_len, top) for r in trace]
    outputs = [max(1, round(r.output_len / AZURE_OUTPUT_SCALE)) for r in trace]
    service = statistics.mean(
        cost.prefill_pass(p) + o * cost.decode_step_base
        for p, o in zip(prompts, outputs)  # noqa: B905
    )
    rate = max(POISSON_UTILIZATION / service, count / POISSON_MAX_SPAN)
    load = poisson(rate, count, prompt_len=prompts, output_len=outputs, seed=seed)
    return Scenario(
        "poisson azure",
        tuple(load),
        f"{count} Poisson arrivals at {rate:.2f}/s ({rate * service:.0%} offered load by the "
        f"simulator: {POISSON_UTILIZATION:.0%}, or more to keep the arrivals within "
        f"{POISSON_MAX_SPAN:.0f} s); prompt and output lengths drawn from the first 2,000 Azure "
        f"conv requests, prompts capped at {top}, outputs divided by {AZURE_OUTPUT_SCALE}",
    )


@dataclasses.dataclass
class _Runs:
    """What the real runs gathered, per (scenario, policy)."""

    summaries: dict[tuple[str, str], list[Any]] = dataclasses.field(default_factory=dict)
    setups: dict[str, str] = dataclasses.field(default_factory=dict)
    transfers: list[float] = dataclasses.field(default_factory=list)
    iterations: dict[str, dict[str, list[float]]] = dataclasses.field(default_factory=dict)

    def result(
        self,
        cells: Sequence[Cell],
        chosen: Sequence[Scenario],
        skipped: Sequence[str],
        not_run: Mapping[str, str],
        calibrations: Mapping[str, Any],
        link: Any,
        provenance: Mapping[str, Any],
        quiet: Any,
    ) -> FidelityResult:
        """The run's :class:`FidelityResult`, with what was gathered here."""
        iterations = {
            p: {k: tuple(v) for k, v in kinds.items()} for p, kinds in self.iterations.items()
        }
        return FidelityResult(
            cells=tuple(cells),
            scenarios=tuple(chosen),
            skipped=tuple(skipped),
            not_run=not_run,
            calibrations=calibrations,
            link=link,
            transfers=tuple(self.transfers),
            setups=self.setups,
            chunk=provenance["chunk"],
            runs=provenance["runs"],
            provenance=provenance,
            iterations=iterations,
            quiet=quiet,
        )

    def add(self, scenario: str, policy: str, run: Any, cost: CostModel) -> None:
        self.summaries.setdefault((scenario, policy), []).append(run.trace.summary())
        self.setups[policy] = run.setup
        for kind, errors in iteration_errors(run.trace, cost).items():
            self.iterations.setdefault(policy, {}).setdefault(kind, []).extend(errors)
        self.transfers += [e.duration for e in run.trace.events if e.kind == "transfer"]


def _cost_for(policy: str, costs: Mapping[str, CostModel]) -> CostModel:
    return costs["disaggregated worker" if policy == "disaggregated" else "single worker"]


def run_policies(
    chosen: Sequence[Scenario],
    policies: Sequence[str],
    model: Any,
    costs: Mapping[str, CostModel],
    *,
    runs: int,
    chunk: int,
    seed: int,
    cores: Sequence[int],
    threads: int,
    pool: Any = None,
    progress: Progress | None = None,
) -> _Runs:
    """Every scenario under every policy ``runs`` times for real (round robin, so that a slow
    spell of the machine spreads over policies rather than landing on one)."""
    from pytest_prefill.lab.execute import execute

    gathered = _Runs()
    for run in range(runs):
        for scenario in chosen:
            for policy in policies:
                result = execute(
                    policy,
                    scenario.load,
                    model,
                    chunk=chunk,
                    seed=seed + run,
                    cores=cores,
                    threads=threads,
                    workers=pool,
                )
                gathered.add(scenario.name, policy, result, _cost_for(policy, costs))
                _say(
                    progress,
                    f"run {run + 1}/{runs} {scenario.name} {policy}: {result.trace.summary()}",
                )
    return gathered


def cells_of(
    chosen: Sequence[Scenario],
    policies: Sequence[str],
    costs: Mapping[str, CostModel],
    summaries: Mapping[tuple[str, str], Sequence[Any]],
    chunk: int,
) -> list[Cell]:
    """Simulate each scenario under each policy and set it beside the measured runs."""
    cells = []
    for scenario in chosen:
        for policy in policies:
            predicted = simulate(
                policy, scenario.load, _cost_for(policy, costs), chunk=chunk
            ).summary()
            for metric in METRICS:
                cells.append(
                    Cell(
                        scenario.name,
                        policy,
                        metric,
                        getattr(predicted, metric),
                        tuple(getattr(s, metric) for s in summaries[(scenario.name, policy)]),
                        judged(metric, predicted),
                    )
                )
    return cells


def _check_arguments(runs: Any, chunk: Any, prompt_lens: Sequence[Any]) -> None:
    check_int("runs", runs, minimum=MIN_RUNS)
    check_int("chunk", chunk)
    if not prompt_lens:
        raise ValueError("prompt_lens must name at least one prompt length")
    for n in prompt_lens:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"prompt_lens must be positive integers, got {n!r}")


def _cuda_devices(device: Any) -> int:
    if not getattr(device, "type", str(device)).startswith("cuda"):
        return 0
    import torch

    return int(torch.cuda.device_count())


def _disaggregated(
    loaded: Any,
    chosen: Sequence[Scenario],
    policies: Sequence[str],
    calibrations: dict[str, Any],
    settings: dict[str, Any],
    timing: dict[str, Any],
) -> tuple[_Runs, Any]:
    """Start the two worker processes, calibrate them (both at once) and the link (through the
    run's path), then run every policy; the colocated ones run here while the workers idle."""
    from pytest_prefill.lab import fidelity_calibration as fc
    from pytest_prefill.lab.disaggregated import DisaggregatedWorkers

    progress = settings["progress"]
    _say(progress, "starting the prefill and decode worker processes")
    with DisaggregatedWorkers(loaded.model, cores=settings["cores"]) as pool:
        longest = max(timing["sweep"]["prompt_lens"])
        lens = sorted({min(n, longest) for n in fc.LINK_PROMPT_LENS})
        _say(progress, f"calibrating the KV link through the run's path at {lens} tokens")
        link = fc.measure_link(
            pool,
            loaded.kv_bytes_per_token,
            prompt_lens=lens,
            repeats=timing["repeats"],
            warmup=timing["warmup"],
        )
        _say(progress, "calibrating the two worker processes, both at once, on their cores")
        calibrations["disaggregated worker"] = fc.calibrate_workers(
            loaded, pool, link=link, progress=progress, **timing
        )
        costs = {name: c.cost for name, c in calibrations.items()}
        gathered = run_policies(chosen, policies, loaded.model, costs, pool=pool, **settings)
    return gathered, link


def run_fidelity(
    loaded: Any,
    *,
    runs: int = MIN_RUNS,
    chunk: int = DEFAULT_CHUNK,
    prompt_lens: Sequence[int] = DEFAULT_PROMPT_LENS,
    repeats: int | None = None,
    warmup: int | None = None,
    dry_run: bool = False,
    azure: bool = True,
    cores: Sequence[int] | None = None,
    threads: int | None = None,
    seed: int = 0,
    progress: Progress | None = None,
    probe: bool = True,
) -> FidelityResult:
    """Probe how quiet the machine is, calibrate on the engine, run every scenario under every
    policy the device allows ``runs`` times for real, simulate each with the engine-calibrated
    cost model, and compare.

    Equal total resources on CPU: the colocated policies may use all ``cores`` (default: every
    core this process may use) with ``threads`` torch threads (default 1: on a small shared
    CPU, intra-op threads stall whenever another process holds a core) and are simulated with a
    cost model calibrated that way; disaggregation runs two processes on disjoint halves of the
    cores, simulated with a cost model the two worker processes calibrate themselves, both at
    once, with the KV link calibrated through the path real transfers take. On CUDA the
    colocated policies run on the one device and disaggregation is reported as not run.

    Raises:
        ValueError: for runs < 3, a non-positive chunk or prompt length, a model the packed
            pass does not support, or fewer than two cores on CPU.
    """
    from pytest_prefill.lab import fidelity_calibration as fc
    from pytest_prefill.measure import calibrate as cal
    from pytest_prefill.measure.quiet import settle

    _check_arguments(runs, chunk, prompt_lens)
    repeats, warmup = cal.effective_repeats(repeats, warmup, dry_run)
    on_cpu = not getattr(loaded.device, "type", str(loaded.device)).startswith("cuda")
    cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
    threads = threads or 1
    policies, not_run = policies_for(loaded.device, _cuda_devices(loaded.device))
    quiet = settle() if probe else None
    if quiet is not None and quiet.warning:
        _say(progress, quiet.warning)
    timing: dict[str, Any] = {
        "repeats": repeats,
        "warmup": warmup,
        "dry_run": dry_run,
        "sweep": fc.fidelity_sweep(prompt_lens, chunk, on_cuda=not on_cpu),
        "seed": seed,
    }
    _say(progress, f"calibrating the engine: single worker, cores {cores}, {threads} thread(s)")
    with fc.pinned(cores, threads, on_cpu=on_cpu):
        single = fc.calibrate_engine(
            loaded, progress=progress, cores=cores, threads=threads, **timing
        )
    calibrations = {"single worker": single}
    chosen, skipped = scenarios(single.cost, prompt_lens=prompt_lens, azure=azure, seed=seed)
    shape: dict[str, Any] = {"runs": runs, "chunk": chunk, "cores": cores, "threads": threads}
    settings: dict[str, Any] = {**shape, "seed": seed, "progress": progress}
    if "disaggregated" in policies:  # it calibrates its own workers (added to calibrations)
        gathered, link = _disaggregated(loaded, chosen, policies, calibrations, settings, timing)
    else:
        costs = {"single worker": single.cost}
        gathered, link = run_policies(chosen, policies, loaded.model, costs, **settings), None
    info = cal.provenance(loaded, **timing, **shape, prompt_lens=list(prompt_lens))
    costs = {name: c.cost for name, c in calibrations.items()}
    cells = cells_of(chosen, policies, costs, gathered.summaries, chunk)
    return gathered.result(cells, chosen, skipped, not_run, calibrations, link, info, quiet)
