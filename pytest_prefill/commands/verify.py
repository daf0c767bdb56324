"""``prefill-bench verify``: check a capacity answer on a server. For each flag set (from a
capacity answer's JSON or ``--flags``), the server runs it (``--launch`` restarts one under each;
``--url`` is one running it), is calibrated (or ``--cost`` reused; or ``--gpu``: its compute
derived, ``commands._verify_gpu``), its knee predicted and then measured by bounded probes; prints predicted against measured knees, their ratio, the
attainment at the predicted rate, and whether the ranking agrees."""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
from collections.abc import Callable
from typing import Any, cast

from pytest_prefill._io import read_json, write_json_atomic
from pytest_prefill.commands._args import (
    add_archive_arguments,
    non_negative_int,
    output_path,
    positive_int,
    save_tables,
)
from pytest_prefill.commands._options import add_defaulted
from pytest_prefill.commands._serve_args import (
    add_kv_tokens_argument,
    add_timeout_arguments,
    max_prompt_type,
    timeouts_from_args,
    url_type,
)
from pytest_prefill.commands._verify_gpu import (
    add_verify_gpu_arguments,
    check_verify_gpu,
    derived_prediction,
)
from pytest_prefill.commands._workload_args import (
    add_workload_arguments,
    check_workload_args,
    positive_float,
    workload_from_args,
    workload_lines,
)
from pytest_prefill.measure.quiet import QuietHost
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.serve.calibration.server_calibration import (
    ServerSweep,
    read_server_calibration,
)
from pytest_prefill.serve.calibration.server_model import PROFILED_ENGINES, need_profile
from pytest_prefill.serve.launch.launchers import LAUNCHED, READY, VLLM_READY, Launcher
from pytest_prefill.sim import Request
from pytest_prefill.verify.fields import Fields
from pytest_prefill.verify.interrupt import exit_status
from pytest_prefill.verify.probe_rule import ProbeRule
from pytest_prefill.verify.result import Derived, VerifyResult, read_verify
from pytest_prefill.verify.verification import FlagSet, Server, VerifyOptions, verify

HELP = "check a capacity answer on a server: predicted against measured knees, and the ranking"
DIVISORS = re.compile(r"^([0-9]{1,9}):([0-9]{1,9})$")  # ASCII digits only


def flags_type(text: str) -> FlagSet:
    try:
        return FlagSet.parse(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def divisors_type(text: str) -> tuple[int, int]:
    match = DIVISORS.match(text.strip())
    if match is None or 0 in (int(match.group(1)), int(match.group(2))):
        raise argparse.ArgumentTypeError(f"must be PROMPT:OUTPUT divisors >= 1, got {text!r}")
    return int(match.group(1)), int(match.group(2))


def fraction_type(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1), got {text!r}")
    return value


def _server_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("server (a running --url, or --launch under each flag set)")
    where = group.add_mutually_exclusive_group()
    where.add_argument("--url", type=url_type, help="a running server (it runs one flag set)")
    where.add_argument(
        "--launch", choices=LAUNCHED, help="start this engine under each flag set, stop it after"
    )
    group.add_argument(
        "--model",
        metavar="PATH",
        help="--launch: the model folder (a .gguf for llama.cpp); --gpu: the model whose compute "
        "is derived (a config.json, a folder holding one, or a preset), with --url too",
    )
    group.add_argument(
        "--program",
        metavar="PATH",
        help="--launch llama.cpp: the llama-server binary; vllm: the Python of vLLM's venv",
    )
    group.add_argument(
        "--no-pin",
        action="store_true",
        help="--launch: leave CPU placement to the OS (default: the server's compute on a core "
        "of its own, its other processes and this load generator on the rest; Linux)",
    )
    add_kv_tokens_argument(group, "the launcher's, a running server's unbounded")
    group.add_argument(
        "--engine",
        choices=PROFILED_ENGINES,
        help="what the server is (default: it says; one that does not is refused before "
        "anything is measured: only these engines are simulated)",
    )
    group.add_argument(
        "--tokenizer", metavar="DIR", help="the served model's folder (default --model)"
    )
    group.add_argument(
        "--health-timeout",
        type=positive_float,
        metavar="S",
        help="--launch: seconds a started server has to answer /health (default "
        f"{READY:g}, vLLM {VLLM_READY:g})",
    )
    add_timeout_arguments(group)


# The flags that default to a field of a rule (ProbeRule, QuietHost): the field, the type, the
# metavar, and the help, which states the default in its {default} (and may name the rule's
# other fields: {rule.redo}).
_RULE_OPTIONS: dict[str, tuple[str, Callable[[str], object], str | None, str]] = {
    "--margin": (
        "margin",
        fraction_type,
        None,
        "attainment's standard error at the target per probe is at most this ({default:g})",
    ),
    "--tolerance": ("tolerance", fraction_type, None, "bisection stops within ({default:g})"),
    "--max-probes": ("max_probes", positive_int, None, "per flag set ({default})"),
    "--max-probe-seconds": (
        "max_seconds",
        positive_float,
        "S",
        "probes are lengthened until a --within overload is predicted to miss the target by "
        "--margin, while a probe lasts at most this at the predicted knee ({default:g})",
    ),
    "--probe-start": (
        "start",
        non_negative_int,
        "K",
        "probes skip the workload's first K requests ({default})",
    ),
    "--within": (
        "within",
        fraction_type,
        None,
        "the goal: the predicted knee within this of the measured one ({default:.2f})",
    ),
    "--max-steal": (
        "max_steal",
        fraction_type,
        "F",
        "a probe or load-check run during which the host took more than this fraction of the "
        "CPU (a VM's hypervisor running other guests: /proc/stat's steal) is redone, at most "
        "{rule.redo} times, and each first waits for {rule.window:g} s in which it took at "
        "most half of it, at most {rule.max_wait:g} s ({default:g})",
    ),
}


def _rule_option(group: argparse._ArgumentGroup, rule: object, flag: str) -> None:
    field, kind, metavar, text = _RULE_OPTIONS[flag]
    default = getattr(rule, field)
    group.add_argument(
        flag,
        type=kind,
        default=default,
        metavar=metavar,
        help=text.format(default=default, rule=rule),
    )


def _probe_arguments(parser: argparse.ArgumentParser) -> None:
    probes = parser.add_argument_group("probes")
    rule = ProbeRule()  # the defaults the help states
    for flag in ("--margin", "--tolerance", "--max-probes"):
        _rule_option(probes, rule, flag)
    probes.add_argument(
        "--short-probes",
        action="store_true",
        help="probes of the binomial length only, not also long enough for a --within "
        "overload to build a queue of one TTFT bound and to miss the target in the simulator "
        "(a burst's knee, not a sustained rate's)",
    )
    _rule_option(probes, rule, "--max-probe-seconds")
    _rule_option(probes, rule, "--probe-start")
    probes.add_argument(
        "--probe-requests",
        type=positive_int,
        metavar="N",
        help="every probe sends the workload's first N requests after --probe-start (at least "
        "rule 1's; default: the first flag set sizes them for all, so separate runs may differ)",
    )
    probes.add_argument(
        "--no-load-check",
        action="store_true",
        help="predict from the calibration alone: do not first send as many requests as a "
        "probe, those after the probes', at the predicted knee and scale the cost model to the "
        "speed the server shows under that load",
    )
    _rule_option(probes, rule, "--within")


def _host_arguments(parser: argparse.ArgumentParser) -> None:
    host = parser.add_argument_group("the host (a VM's CPU steal)")
    _rule_option(host, QuietHost(), "--max-steal")  # the default the help states
    host.add_argument(
        "--ignore-steal",
        action="store_true",
        help="do not watch the host's CPU steal: every run at once, kept whatever it took",
    )


def _calibration_arguments(parser: argparse.ArgumentParser) -> None:
    cal = parser.add_argument_group("calibration")
    cal.add_argument("--cost", metavar="JSON", help="reuse this server calibration for all")
    cal.add_argument(
        "--calibrate-once",
        action="store_true",
        help="calibrate under the first flag set only and reuse it",
    )
    add_defaulted(cal, "--repeats", positive_int, 2, "calibration rounds ({default})")
    prompt_help = "the calibration's longest prompt ({default})"
    add_defaulted(cal, "--max-prompt", max_prompt_type, 2048, prompt_help, "TOKENS")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _server_arguments(parser)
    what = parser.add_argument_group("what to check")
    what.add_argument(
        "--answer",
        metavar="JSON",
        help="a capacity answer (capacity --json): its colocated deployments' settings, SLO "
        "and target",
    )
    what.add_argument(
        "--flags",
        type=flags_type,
        action="append",
        metavar="tokens=N[,seqs=N]",
        help="a flag set (repeat for several): the token budget and sequence cap",
    )
    what.add_argument(
        "--rank",
        nargs="+",
        metavar="JSON",
        help="no server: the flag sets of earlier runs' --json files (one server start each) "
        "in one table, and their ranking",
    )
    what.add_argument("--slo", metavar="BOUNDS", help="e.g. ttft:2s,tpot:200ms (else the answer's)")
    what.add_argument(
        "--target",
        type=fraction_type,
        help=f"attainment target (default {ProbeRule().target:g})",
    )
    add_workload_arguments(parser, default="poisson")
    parser.add_argument(
        "--lengths-divided-by",
        type=divisors_type,
        metavar="P:O",
        help="divide the workload's prompt and output lengths (e.g. 4:8 for a small model)",
    )
    _probe_arguments(parser)
    _host_arguments(parser)
    _calibration_arguments(parser)
    add_verify_gpu_arguments(parser)
    parser.add_argument("--json", type=output_path, metavar="PATH", help="write the result JSON")
    parser.add_argument("--save", action="store_true", help="archive it as a run")
    add_archive_arguments(parser)


def answer_of(path: str) -> tuple[list[FlagSet], SLO, float]:
    """The colocated deployments' flag sets, the SLO and the target of a capacity answer.

    Raises:
        ValueError: naming the file, for anything that is not one, or one with no colocated
            deployment at a token budget.
    """
    data = read_json(path, "capacity answer")
    try:
        fields = Fields(data, f"{path}: answer")
        bounds = fields.child("slo")
        if bounds is None:
            raise ValueError(f"{path}: not a capacity answer (capacity --json): missing 'slo'")
        slo = bounds.build(SLO, **bounds.data)
        target = fields.number("target")
        if not 0 < target < 1:
            raise ValueError(f"{path}: answer.target must be a fraction in (0, 1), got {target!r}")
        results = fields.children("results")
        flags = []
        for i, result in enumerate(results):
            if result is None:
                raise ValueError(f"{path}: results[{i}] must be an object")
            d = result.child("deployment")
            if d is None:
                raise ValueError(f"{result.where}: missing 'deployment' (an object)")
            if d.raw("policy") == "disaggregated" or not d.raw("max_batched_tokens"):
                continue
            seqs = d.optional_integer("max_seqs")
            flag = d.build(FlagSet, d.integer("max_batched_tokens"), seqs)
            if flag not in flags:
                flags.append(flag)
    except (KeyError, TypeError, AttributeError) as err:
        raise ValueError(f"{path}: not a capacity answer (capacity --json): {err!s}") from None
    if not flags:
        raise ValueError(f"{path}: no colocated deployment at a token budget to verify")
    return flags, slo, target


def check(args: argparse.Namespace) -> None:
    """What the command line can refuse before anything starts."""
    if args.rank:
        given = [
            f
            for f in ("url", "launch", "answer", "flags", "slo", "cost", "gpu", "json")
            if getattr(args, f)
        ]
        if given:
            flags = ", ".join(f"--{f}" for f in given)
            raise ValueError(
                f"--rank reads earlier runs only: {flags} has no use beside it (--save archives "
                "the ranking)"
            )
        return
    if args.url is None and args.launch is None:
        raise ValueError("give --url (a running server) or --launch ENGINE (or --rank JSON...)")
    check_workload_args(args)
    if args.answer is None and not args.flags:
        raise ValueError("give --answer (a capacity answer's JSON) or --flags tokens=N[,seqs=N]")
    if args.answer is None and args.slo is None:
        raise ValueError("--slo is needed without --answer")
    if args.slo is not None:
        SLO.parse(args.slo)  # refused here, read in run
    if args.launch is not None and args.model is None:
        raise ValueError("--launch needs --model (the model folder; a .gguf for llama.cpp)")
    launched = [
        flag
        for flag, given in (
            ("--model", args.model and not args.gpu),
            ("--program", args.program),
            ("--no-pin", args.no_pin),
            ("--health-timeout", args.health_timeout),
        )
        if given
    ]
    if args.url is not None and launched:
        raise ValueError(
            f"{launched[0]} goes with --launch, not --url (with --url, --model is the model "
            "whose compute --gpu derives)"
        )
    check_verify_gpu(args, args.engine or args.launch)


def workload_of(args: argparse.Namespace) -> tuple[list[Request], str, int | None]:
    """The workload's requests (lengths divided as asked), its description, and its hash-id
    block size (divided as the prompts are)."""
    workload = workload_from_args(args)
    for line in workload_lines(workload):
        print(line)
    load = list(workload.requests)
    description = workload.description
    block = workload.prefix_block_tokens
    if args.lengths_divided_by:
        p, o = args.lengths_divided_by
        block = max(block // p, 1) if block is not None else None
        load = [
            dataclasses.replace(
                r, prompt_len=max(r.prompt_len // p, 1), output_len=max(r.output_len // o, 1)
            )
            for r in load
        ]
        description += f"; prompts / {p}, outputs / {o}"
    return load, description, block


def _server(args: argparse.Namespace, block: int | None, derived: Derived | None) -> Server:
    """The server ``--url`` names (its KV: ``--kv-tokens``, else the ``derived`` compute's,
    else unbounded), else the one ``--launch`` starts (its own KV; its tokenizer:
    ``--tokenizer``, else the model folder but llama.cpp's GGUF)."""
    launcher, tokenizer, kv_tokens = None, args.tokenizer, args.kv_tokens
    if kv_tokens is None and derived is not None:
        kv_tokens = derived.cost.kv_capacity_tokens
    if args.url is None:
        launcher, kv_tokens = _launcher(args), None
        tokenizer = args.tokenizer or (args.model if args.launch != "llama.cpp" else None)
    return Server(
        url=args.url,
        launcher=launcher,
        engine=args.engine,
        tokenizer=tokenizer,
        kv_tokens=kv_tokens,
        timeouts=timeouts_from_args(args),
        prefix_block_tokens=block,
    )


def _launcher(args: argparse.Namespace) -> Launcher:
    kv = {"kv_tokens": args.kv_tokens} if args.kv_tokens else {}
    return Launcher(
        args.launch,
        args.model,
        args.program,
        pin=not args.no_pin,
        ready_timeout=args.health_timeout,
        **kv,
    )


def progress(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


@dataclasses.dataclass(frozen=True)
class VerifyCall:
    """What the command line asks ``verify`` for, read from the Namespace once: the flag sets,
    the SLO, and :func:`~pytest_prefill.verify.verification.verify`'s options (the probe rule,
    the calibration to reuse or the sweep to measure one, and the rest)."""

    flags: tuple[FlagSet, ...]
    slo: SLO
    options: VerifyOptions

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> VerifyCall:
        """Raises: ValueError naming the file, for an answer or a calibration that is not one."""
        flags, target = list(args.flags or []), args.target
        slo = SLO.parse(args.slo) if args.slo is not None else None
        if args.answer is not None:
            answered, answer_slo, answer_target = answer_of(args.answer)
            flags = flags or answered
            slo, target = slo or answer_slo, target or answer_target
        assert slo is not None  # check(): --slo is needed without --answer
        rule = ProbeRule(
            target=target or ProbeRule().target,
            margin=args.margin,
            tolerance=args.tolerance,
            max_probes=args.max_probes,
            sustained=not args.short_probes,
            within=args.within,
            max_seconds=args.max_probe_seconds,
            start=args.probe_start,
        )
        calibration = None
        if args.cost is not None:
            calibration = read_server_calibration(args.cost)
        sweep = ServerSweep(flags[0].budget, repeats=args.repeats).within(args.max_prompt)
        quiet = None if args.ignore_steal else QuietHost(args.max_steal)
        options = VerifyOptions(
            rule,
            sweep,
            calibration,
            args.calibrate_once,
            probe_requests=args.probe_requests,
            load_check=not args.no_load_check,
            quiet=quiet,
        )
        return cls(tuple(flags), slo, options)


def run(args: argparse.Namespace) -> int:
    from pytest_prefill.report.verify import combined_report, verify_report

    if args.rank:
        runs = [read_verify(path) for path in args.rank]
        text = combined_report(runs)
        print(text)
        if args.save:
            _save_ranking(args, runs, text)
        return 0
    call = VerifyCall.from_args(args)
    engine = args.engine or args.launch
    if args.url is not None and args.engine is None:
        engine = _engine_named(args)
    load, description, block = workload_of(args)
    derived = derived_prediction(args, engine, load) if args.gpu else None
    options = dataclasses.replace(
        call.options, workload=description, progress=progress, derived=derived
    )
    result = verify(_server(args, block, derived), call.flags, load, call.slo, options)
    text = verify_report(result)
    print(text)
    _write(args, result, text)
    if result.interrupted:
        return _interrupted(args, result, len(call.flags))
    # a flag set ended early (not started, or its server died) is not a clean check
    return 0 if result.compared and not any(r.ended for r in result.results) else 1


def _engine_named(args: argparse.Namespace) -> str:
    """The engine the server at ``--url`` says it is, one this tool simulates: asked once
    before anything is measured, so that a plain OpenAI server is refused before calibrating.

    Raises:
        ValueError: naming ``--engine`` and the engines it may be.
        ServerError: the server cannot be reached, or is not OpenAI-compatible.
    """
    import asyncio

    from pytest_prefill.serve.client.identity import identify

    timeouts = timeouts_from_args(args)
    who = asyncio.run(identify(args.url, timeouts=timeouts))
    need_profile(who.engine, who.url, who.how)
    return who.engine


def _interrupted(args: argparse.Namespace, result: VerifyResult, flag_sets: int) -> int:
    """Say what a run a signal ended kept; a shell's status for that signal (SIGINT 130,
    SIGTERM 143)."""
    kept = f"kept in {args.json}, marked interrupted" if args.json else "not kept (no --json)"
    print(
        f"interrupted by {result.interrupted}: {len(result.results)} of {flag_sets} flag "
        f"set(s) started; what was measured is {kept}",
        file=sys.stderr,
    )
    return exit_status(result.interrupted)


def slim(document: dict[str, Any]) -> dict[str, Any]:
    """A verify document without the per-request records of its probes and load checks (each
    probe keeps its summary and its outcomes, enough to recompute the knee and its interval):
    what an archive keeps of a run whose records run to megabytes."""
    out = json.loads(json.dumps(document))
    for flag_set in out.get("flag_sets") or []:
        for probe in (flag_set.get("measured") or {}).get("probes") or []:
            probe.pop("records", None)
        for run in (flag_set.get("load_check") or {}).get("runs") or []:
            run.pop("records", None)
    return cast(dict[str, Any], out)


def _save_ranking(args: argparse.Namespace, runs: list[VerifyResult], text: str) -> None:
    """Archive ``--rank``'s table and rankings (one per engine), with each run's document
    (slim)."""
    from pytest_prefill.report.verify import combined_rankings, engine_of

    rankings = combined_rankings(runs)
    several = len(rankings) > 1
    verdicts = []
    for result in runs:
        engine = f"{engine_of(result)} " if several else ""
        for r in result.results:
            judged = r.agreement
            if judged is not None:
                line = f"predicted/measured {judged.ratio:.3g} [{judged.low:.3g}, "
                line += f"{judged.high:.3g}] against ±{judged.within:.0%}"
                verdicts.append((f"knee {engine}{r.flags.label}", judged.verdict, line))
    for engine, verdict, line in rankings:
        if verdict is not None:  # one flag set: no ranking to judge
            name = f"verify ranking {engine}" if several else "verify ranking"
            verdicts.append((name, verdict, line))
    data = {"runs": [slim(r.to_dict()) for r in runs], "files": list(args.rank)}
    provenance = {"device": "server", "threads": None}
    path = save_tables(args, provenance, [("verify ranking", text, data)], verdicts)
    print(f"archived: {path}")


def _write(args: argparse.Namespace, result: VerifyResult, text: str) -> None:
    document: dict[str, Any] = result.to_dict()
    if args.json:
        write_json_atomic(args.json, document)
        print(f"wrote {args.json}")
    if args.save:
        provenance = {"device": "server", "threads": None}
        line = text.splitlines()[-1]
        verdict = result.best_verdict  # None: one flag set, no ranking to judge
        path = save_tables(
            args,
            provenance,
            [("verify on " + (result.engine or "a server"), text, document)],
            [("verify ranking", verdict, line)] if verdict is not None else [],
        )
        print(f"archived: {path}")
