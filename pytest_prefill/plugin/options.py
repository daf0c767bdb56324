"""The plugin's options: ``--prefill-*`` in a ``prefill`` group, each with an ini twin, and
their resolution into :class:`Settings` (a bad value is a ``pytest.UsageError`` naming the
option). Imports nothing heavy; torch only when CUDA is asked for by name and the NVIDIA driver
query saw no GPU."""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from typing import Any

import pytest

from pytest_prefill.archive.cost_spec import CostSpec, resolve_cost
from pytest_prefill.machine import (
    DEVICE_FORMS,
    KEY_PATTERN,
    Accelerator,
    check_device,
    cpu_model,
    machine_key,
    nvidia_accelerators,
)
from pytest_prefill.measure.models import DEFAULT_MODEL, MODEL_PRESETS  # imports no torch
from pytest_prefill.measure.timing import DEFAULT_REPEATS, DEFAULT_WARMUP
from pytest_prefill.plan.device_memory import kv_capacity
from pytest_prefill.plan.model_spec import load_model_spec
from pytest_prefill.sim import PRESETS, PROFILES, simulated_engine

CPU_MODEL = "tiny"  # the default with --prefill-device cpu: Qwen3-0.6B on a CPU takes hours
DEFAULT_COST = "lab-laptop"
# The fixtures' engine profile, as `prefill-bench capacity`'s (commands/capacity.py; a test holds
# them equal): an answer in a real engine's flags, never a time budget no engine has a flag for.
DEFAULT_ENGINE = "vllm"
DTYPE_NAMES = ("float32", "bfloat16", "float16", "fp32", "bf16", "fp16")


@dataclasses.dataclass(frozen=True)
class _Option:
    name: str  # --prefill-<name>; the ini twin is prefill_<name with _>
    help: str
    flag: bool = False
    metavar: str | None = None

    @property
    def flag_name(self) -> str:
        return f"--prefill-{self.name}"

    @property
    def ini(self) -> str:
        return "prefill_" + self.name.replace("-", "_")


OPTIONS = (
    _Option(
        "model",
        f"model under test: a preset ({', '.join(MODEL_PRESETS)}), a local "
        f"directory or a cached Hugging Face id; never downloads (default: {DEFAULT_MODEL}, "
        f"or {CPU_MODEL} with --prefill-device cpu)",
        metavar="SPEC",
    ),
    _Option(
        "device",
        f"device under test: {DEVICE_FORMS} (default: the first CUDA device; gpu "
        "tests are skipped when there is none)",
        metavar="DEVICE",
    ),
    _Option(
        "dtype",
        "float32, bfloat16 or float16 (default: bfloat16 on CUDA, float32 on CPU)",
        metavar="DTYPE",
    ),
    _Option(
        "repeats",
        f"timed repeats per measurement; the median is reported with its spread "
        f"(default {DEFAULT_REPEATS})",
        metavar="N",
    ),
    _Option(
        "warmup", f"untimed calls before each measurement (default {DEFAULT_WARMUP})", metavar="N"
    ),
    _Option(
        "dry-run", "shorten the repeats for a quick check (never the prompt length)", flag=True
    ),
    _Option(
        "cost",
        f"cost model of the session: a preset ({', '.join(PRESETS)}), a "
        "calibration or run JSON path, 'archive' (the latest calibration archived for this "
        "machine) or 'measure' (calibrate now, once per session) "
        f"(default {DEFAULT_COST})",
        metavar="SPEC",
    ),
    _Option(
        "engine",
        f"engine profile the scheduler and capacity fixtures simulate by default: "
        f"{', '.join(PROFILES)} (default {DEFAULT_ENGINE}, as prefill-bench capacity's; "
        "lab is the lab's loop; a test's own "
        "engine= wins)",
        metavar="NAME",
    ),
    _Option(
        "deploy-model",
        "the model the simulated deployment serves, for the cost-model fixture's KV bytes and "
        "capacity: a config.json (or its folder) or a preset such as llama-3-8b (with "
        "--prefill-device-memory; default: none, KV as the cost model says)",
        metavar="SPEC",
    ),
    _Option(
        "device-memory",
        "GiB of one device of the simulated deployment: with --prefill-deploy-model the "
        "cost-model fixture's KV capacity is what vLLM would allot at utilization 0.9",
        metavar="GIB",
    ),
    _Option(
        "results",
        "folder of the per-machine results archive (default: results/ under the "
        "rootdir; a relative path is taken from the current directory on the command line, "
        "from the rootdir in an ini file)",
        metavar="DIR",
    ),
    _Option(
        "save",
        "archive this run under --prefill-results/<machine>/ (its calibration, tables, "
        "verdicts and pytest-benchmark statistics); without it nothing is written, as "
        "pytest-benchmark writes only with --benchmark-autosave",
        flag=True,
    ),
    _Option(
        "no-archive",
        "never write this run into the results archive (the default without --prefill-save; "
        "kept for scripts that say so)",
        flag=True,
    ),
    _Option(
        "machine",
        "machine key: the archive folder and what 'archive' looks up (default: the GPU "
        "nvidia-smi reports, else the CPU, e.g. nvidia-h200, cpu-amd-epyc)",
        metavar="KEY",
    ),
    _Option(
        "server",
        "a running OpenAI-compatible server to measure, by its base URL (e.g. "
        "http://127.0.0.1:8000): what the prefill_server fixture and server-marked tests use "
        "(default: none; they skip)",
        metavar="URL",
    ),
    _Option(
        "threads",
        "torch CPU threads for the measurements (default 1 with --prefill-device cpu, where "
        "intra-op threads stall whenever another process holds a core; torch's own on CUDA); "
        "recorded in the calibration's provenance",
        metavar="N",
    ),
)


@dataclasses.dataclass(frozen=True)
class Settings:
    """The session's resolved options. Plain data: the controller sends it to xdist workers."""

    model: str
    model_note: str
    device: str | None
    dtype: str | None
    repeats: int
    warmup: int
    dry_run: bool
    cost_spec: str
    cost_source: str
    cost_label: str
    cost_model: dict[str, Any] | None  # None for 'measure': known once calibrated
    cost_explicit: bool  # given by option or ini; else a session that calibrates uses that
    cost_refused: list[str]  # constants the calibration behind cost_model refused
    results: str
    archive: bool
    save: bool
    machine_key: str
    accelerators: list[dict[str, Any]]
    session_dir: str
    notes: list[str]  # archive files skipped while resolving, shown in header and summary
    threads: int | None = None  # torch CPU threads; None: torch's own
    server: str | None = None  # --prefill-server: the base URL of a server to measure
    cost_contexts: list[int] = dataclasses.field(default_factory=list)  # where C* is reported
    cost_trust: dict[str, Any] | None = None  # the calibration's trust figures (Trust.to_dict)
    engine: str = DEFAULT_ENGINE  # --prefill-engine: the fixtures' engine profile
    # --prefill-deploy-model and --prefill-device-memory: (model spec, bytes), None: not given
    deploy: tuple[str, float] | None = None

    @property
    def effective_device(self) -> str:
        return self.device or "cuda"


def add_options(parser: pytest.Parser) -> None:
    """Register every option in the ``prefill`` group, with its ini twin."""
    group = parser.getgroup("prefill", "pytest-prefill: prefill/decode interference")
    for opt in OPTIONS:
        if opt.flag:
            group.addoption(
                opt.flag_name,
                action="store_true",
                default=None,
                dest=opt.ini,
                help=opt.help + f" [ini: {opt.ini}]",
            )
            parser.addini(opt.ini, opt.help, type="bool", default=False)
        else:
            group.addoption(
                opt.flag_name,
                action="store",
                default=None,
                dest=opt.ini,
                metavar=opt.metavar,
                help=opt.help + f" [ini: {opt.ini}]",
            )
            parser.addini(opt.ini, opt.help, default="")


def _value(config: pytest.Config, opt: _Option) -> tuple[Any, str, bool]:
    """(value, how to name it in an error, whether it came from the ini file)."""
    given = config.getoption(opt.ini)
    if given is not None:
        if not opt.flag and not str(given).strip():
            raise pytest.UsageError(
                f"{opt.flag_name} is empty: give a value, or leave the option out for its default"
            )
        return given, opt.flag_name, False
    try:
        ini = config.getini(opt.ini)
    except (ValueError, pytest.UsageError) as err:  # pytest >= 9 raises UsageError itself
        allowed = " (true or false: 1/0, yes/no, on/off)" if opt.flag else ""
        raise pytest.UsageError(f"ini option {opt.ini}: {err}{allowed}") from None
    if opt.flag:
        return bool(ini), f"ini option {opt.ini}", True
    text = str(ini).strip()
    return (text or None), f"ini option {opt.ini}", True


def _integer(config: pytest.Config, opt: _Option, default: int, minimum: int) -> int:
    value, name, _ = _value(config, opt)
    if value is None:
        return default
    try:
        number = int(str(value).strip())
    except ValueError:
        number = minimum - 1
    if number < minimum:
        raise pytest.UsageError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return number


def _device_and_model(config: pytest.Config) -> tuple[str | None, str | None, str, str]:
    """(device, dtype, model, a note on how the model was chosen)."""
    opts = {o.name: o for o in OPTIONS}
    device, name, _ = _value(config, opts["device"])
    if device is not None:
        try:
            device = check_device(device)
        except ValueError as err:
            raise pytest.UsageError(f"{name}: {err}") from None
    dtype, name, _ = _value(config, opts["dtype"])
    if dtype is not None and dtype.lower() not in DTYPE_NAMES:
        raise pytest.UsageError(f"{name} must be one of {', '.join(DTYPE_NAMES)}, got {dtype!r}")
    model, name, _ = _value(config, opts["model"])
    model_note = ""
    if model is None:
        model = CPU_MODEL if device == "cpu" else DEFAULT_MODEL
        model_note = (
            "default for --prefill-device cpu; give --prefill-model qwen3-0.6b for the real shapes"
            if device == "cpu"
            else "default"
        )
    elif not model.strip():
        raise pytest.UsageError(f"{name} must name a model, got {model!r}")
    return device, (dtype.lower() if dtype else None), model, model_note


def _results(config: pytest.Config) -> str:
    results, name, from_ini = _value(config, {o.name: o for o in OPTIONS}["results"])
    if results is None:
        results_path = config.rootpath / "results"
    else:
        expanded = os.path.expanduser(results)
        if expanded.startswith("~"):  # ~user of a user this machine does not know
            raise pytest.UsageError(
                f"{name}: cannot expand {expanded.split('/')[0]!r} in {results!r}: no such user"
            )
        base = config.rootpath if from_ini else config.invocation_params.dir
        results_path = (base / expanded).resolve()
    if results_path.exists() and not results_path.is_dir():
        raise pytest.UsageError(f"{name} {results_path}: not a folder")
    return str(results_path)


def _machine(config: pytest.Config, device: str | None) -> tuple[str, list[Accelerator]]:
    """(the machine key, the accelerators the driver reports)."""
    accelerators = [] if device == "cpu" else nvidia_accelerators()
    if not accelerators and device is not None and device.startswith("cuda"):
        accelerators = _torch_accelerators()  # CUDA asked for by name: torch may see it
    given, name, _ = _value(config, {o.name: o for o in OPTIONS}["machine"])
    if given is None:
        return machine_key(device, accelerators, cpu_model()), accelerators
    if not KEY_PATTERN.match(given):
        raise pytest.UsageError(
            f"{name} must be lower-case letters, digits and dashes (a folder name), got {given!r}"
        )
    return given, accelerators


def _cost(config: pytest.Config, results: str, key: str, notes: list[str]) -> CostSpec:
    """The session's cost spec, by the one rule shared with the CLI."""
    spec, name, from_ini = _value(config, {o.name: o for o in OPTIONS}["cost"])
    try:
        return resolve_cost(
            spec or DEFAULT_COST,
            results=results,
            machine=key,
            base=config.rootpath if from_ini else None,
            warn=notes.append,
        )
    except ValueError as err:
        raise pytest.UsageError(f"{name}{' archive' if spec == 'archive' else ''}: {err}") from None


def resolve(config: pytest.Config) -> Settings:
    """Read and check every option; a bad value is a UsageError naming the option."""
    opts = {o.name: o for o in OPTIONS}
    device, dtype, model, model_note = _device_and_model(config)
    repeats = _integer(config, opts["repeats"], DEFAULT_REPEATS, 1)
    warmup = _integer(config, opts["warmup"], DEFAULT_WARMUP, 0)
    threads: int | None = _integer(config, opts["threads"], 0, 1) or None
    if threads is None and device == "cpu":
        threads = 1
    dry_run = bool(_value(config, opts["dry-run"])[0])
    server = _server(config, opts["server"])
    engine = _engine(config, opts["engine"])
    no_archive = bool(_value(config, opts["no-archive"])[0])
    save = bool(_value(config, opts["save"])[0])
    if save and no_archive:
        raise pytest.UsageError("--prefill-save and --prefill-no-archive contradict each other")
    results = _results(config)
    key, accelerators = _machine(config, device)
    notes: list[str] = []
    cost = _cost(config, results, key, notes)
    explicit = _value(config, opts["cost"])[0] is not None
    label = cost.label
    if not explicit:
        label += "; a session that calibrates (gpu tests) uses its calibration instead"
    deploy = _deploy(config, opts["deploy-model"], opts["device-memory"])
    if deploy is not None:
        label += f"; KV sized for {deploy[0]} on {deploy[1] / 2**30:g} GiB devices"
    return Settings(
        model=model,
        model_note=model_note,
        device=device,
        dtype=dtype,
        repeats=repeats,
        warmup=warmup,
        dry_run=dry_run,
        cost_spec=cost.spec,
        cost_source=cost.source,
        cost_label=label,
        cost_model=None if cost.cost is None else cost.cost.to_dict(),
        cost_explicit=explicit,
        cost_refused=list(cost.refused),
        cost_contexts=list(cost.contexts),
        cost_trust=None if cost.trust is None else cost.trust.to_dict(),
        results=results,
        archive=not no_archive,
        save=save,
        machine_key=key,
        accelerators=[a.to_dict() for a in accelerators],
        session_dir=tempfile.mkdtemp(prefix="pytest-prefill-"),
        notes=notes,
        threads=threads,
        server=server,
        engine=engine,
        deploy=deploy,
    )


def _deploy(config: pytest.Config, model: _Option, memory: _Option) -> tuple[str, float] | None:
    """(the deployment's model spec, one device's bytes), checked: both or neither given, a
    readable model whose weights leave a KV block (a UsageError naming the option)."""
    spec, spec_name, _ = _value(config, model)
    gib, memory_name, _ = _value(config, memory)
    if spec is None and gib is None:
        return None
    if spec is None or gib is None:
        raise pytest.UsageError(
            "--prefill-deploy-model and --prefill-device-memory go together: give both"
        )
    try:
        size = float(str(gib).strip())
    except ValueError:
        size = math.nan
    if not (math.isfinite(size) and size > 0):
        raise pytest.UsageError(f"{memory_name} must be a positive number of GiB, got {gib!r}")
    try:
        kv_capacity(load_model_spec(str(spec).strip()), size * 2**30)
    except ValueError as err:
        raise pytest.UsageError(f"{spec_name}: {err}") from None
    return str(spec).strip(), size * 2**30


def _engine(config: pytest.Config, opt: _Option) -> str:
    """The fixtures' engine profile, checked (unknown, or not simulated yet: a UsageError
    naming the option and the allowed profiles)."""
    value, name, _ = _value(config, opt)
    if value is None:
        return DEFAULT_ENGINE
    try:
        return simulated_engine(str(value).strip()).name
    except ValueError as err:
        raise pytest.UsageError(f"{name}: {err}") from None


def _server(config: pytest.Config, opt: _Option) -> str | None:
    """The server's URL, checked (a bad one is a UsageError naming the option)."""
    from pytest_prefill.serve.client.wire import Url

    value, name, _ = _value(config, opt)
    if value is None:
        return None
    try:
        return str(Url.parse(str(value)))
    except ValueError as err:
        raise pytest.UsageError(f"{name}: {err}") from None


def _torch_accelerators() -> list[Accelerator]:
    """The CUDA devices torch sees (ROCm builds included), when the NVIDIA driver query saw
    none; empty without torch or CUDA."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    return [Accelerator(i, torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count())]


BENCHMARK_STORAGE = "file://./.benchmarks"  # pytest-benchmark's default storage


def keep_benchmark_storage_out(config: pytest.Config) -> None:
    """pytest-benchmark creates its storage folder (``.benchmarks/``) in the working directory
    whenever it starts, saving or not. Unless this run saves or compares (then the folder is
    asked for) or names a storage, point it at the temporary folder, so a project's run leaves
    no ``.benchmarks/`` behind."""
    option = config.option
    if getattr(option, "benchmark_storage", None) != BENCHMARK_STORAGE:
        return  # pytest-benchmark is not installed, or the storage was moved already
    given = [*config.invocation_params.args, *config.getini("addopts")]
    if any(str(arg).startswith("--benchmark-storage") for arg in given):
        return
    if option.benchmark_save or option.benchmark_autosave or option.benchmark_compare:
        return
    folder = os.path.join(tempfile.gettempdir(), "pytest-prefill-benchmarks")
    option.benchmark_storage = f"file://{folder}"
