"""``capacity`` across device kinds: ``--gpu h100,l40s`` with a device budget per kind
(``--devices N``: N of each; ``--devices h100=4,l40s=2``), pools of their own
(``--deployment disaggregated:P:D,p=KIND[:tpN],d=KIND[:tpN]``) and ``--price KIND=$/h``; each
kind's compute derived from ``--model`` on it (plan/kinds.py, plan/pools.py, plan/pricing.py)."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence

from pytest_prefill.archive.cost_spec import CostSpec
from pytest_prefill.commands._args import bounded_int
from pytest_prefill.commands._compute_args import derive_on
from pytest_prefill.commands._deploy_args import Deploying, check_deploy_args, served_name
from pytest_prefill.plan.compute.derive import Deriver
from pytest_prefill.plan.compute.devices import device_named
from pytest_prefill.plan.deployments import Deployment, refused_kinds
from pytest_prefill.plan.device_memory import GiB, NoKVCache
from pytest_prefill.plan.engine_commands import engine_command
from pytest_prefill.plan.hardware import Hardware
from pytest_prefill.plan.kinds import Colocated, kind_deployments
from pytest_prefill.plan.model_spec import load_model_spec
from pytest_prefill.plan.pools import PoolSplit, parse_pools
from pytest_prefill.plan.pricing import parse_prices
from pytest_prefill.report.assumptions import AnswerBasis
from pytest_prefill.sim import CostModel, EngineProfile, Request

MAX_DEVICES_PER_KIND = 64  # a search across kinds tries every split the budgets allow
MAX_DEVICES = 1024  # as capacity's --devices: a bound on what the command line simulates
DEVICES_HELP = (
    "devices every deployment uses (default 1); with --gpu naming several kinds (or --price), "
    "the budget per kind: N (N of each kind) or KIND=N,KIND=N (e.g. h100=4,l40s=2); each "
    "deployment then uses at most that many of each kind and is ranked per device"
)
PRICE_HELP = (
    "$ per device-hour of each kind searched, e.g. h100=2.5,l40s=0.9: adds $/Mtok input and "
    "output (at the highest rate within the SLO) and ranks by it, cheapest first"
)
_count = bounded_int(MAX_DEVICES_PER_KIND, "devices of a kind")


def devices_type(text: str) -> int | dict[str, int]:
    """``--devices``: a count, or ``KIND=N,KIND=N`` (the kinds checked later, by name)."""
    if "=" not in text:
        return bounded_int(MAX_DEVICES, "devices")(text)
    out: dict[str, int] = {}
    for item in text.split(","):
        kind, sep, value = item.strip().partition("=")
        if not sep or not kind.strip():
            raise argparse.ArgumentTypeError(f"expected N or KIND=N,KIND=N, got {item!r}")
        try:
            out[kind.strip()] = _count(value.strip())
        except argparse.ArgumentTypeError as err:
            raise argparse.ArgumentTypeError(f"{kind.strip()}: {err}") from None
    return out


def gpu_kinds(text: str | None) -> list[str]:
    """``--gpu``'s device kinds, split at commas: a ``custom:`` spec keeps the ``field=value``
    items after it (``custom:tflops=…,tbs=…,gib=…,h100`` is two kinds)."""
    kinds: list[str] = []
    for item in (text or "").split(","):
        item = item.strip()
        if kinds and kinds[-1].lower().startswith("custom:") and "=" in item:
            kinds[-1] += f",{item}"
        elif item:
            kinds.append(item)
    return kinds


def is_pools(text: str) -> bool:
    """Whether a ``--deployment`` names pools of their own (``…,p=KIND`` or ``…,d=KIND``)."""
    return any(item.strip().lower().startswith(("p=", "d=")) for item in text.split(",")[1:])


def across_kinds(args: argparse.Namespace) -> bool:
    """Whether ``capacity`` searches across device kinds: several ``--gpu`` kinds, a budget
    per kind, ``--price`` or a ``--deployment`` of pools."""
    return (
        len(gpu_kinds(args.gpu)) > 1
        or isinstance(args.devices, dict)
        or args.price is not None
        or any(is_pools(text) for text in args.deployment or ())
    )


def _why_kinds(args: argparse.Namespace) -> str:
    """The flag that made :func:`across_kinds` true, as the user typed it."""
    if len(gpu_kinds(args.gpu)) > 1:
        return f"--gpu {args.gpu}: give one kind to answer on it alone"
    if isinstance(args.devices, dict):
        return "--devices KIND=N asks for one"
    if args.price is not None:
        return "--price asks for one"
    return "a --deployment of pools, p=KIND or d=KIND, asks for one"


@dataclasses.dataclass(frozen=True)
class KindSearch:
    """What a search across kinds compares: ``hardware`` of each kind (catalog key, its
    memory the catalog's), each kind's ``budget`` and ``tp`` (the smallest that holds the
    model), the ``splits`` given (empty: every deployment :func:`kind_deployments` allows),
    ``prices`` ($/device-hour per kind; None: not priced) and the ``devices`` the search
    spans (the budgets' sum, or the most a given split uses)."""

    hardware: Mapping[str, Hardware]
    budget: Mapping[str, int]
    tp: Mapping[str, int]
    splits: tuple[PoolSplit, ...] = ()
    prices: Mapping[str, float] | None = None
    devices: int = 1


def check_kinds(args: argparse.Namespace, profile: EngineProfile) -> tuple[KindSearch, Deploying]:
    """What a search across kinds under ``profile`` compares, and the deployment of its first
    kind (the model, its context).

    Raises:
        ValueError: in one line naming the flag: --cost, --device-memory or --host-from
            given (each kind's compute and memory are derived), no --model, an unknown kind, a
            budget for a kind not searched, a pool whose TP does not divide the heads or whose
            kind cannot hold the model, a kind the model fits on at no TP, prices for kinds not
            searched or missing, a negative price.
    """
    for flag, value in (("--cost", args.cost), ("--device-memory", args.device_memory)):
        if value is not None:
            raise ValueError(
                f"{flag}: a search across device kinds ({_why_kinds(args)}) derives each kind's "
                "compute and memory from --model and the catalog; drop it"
            )
    if args.model is None:
        raise ValueError("a search across device kinds (--gpu A,B, --price, pools) needs --model")
    gpus = gpu_kinds(args.gpu)
    custom = [g for g in gpus if g.lower().startswith("custom:")]
    if custom:
        raise ValueError(
            f"--gpu {custom[0]}: a search across device kinds takes catalog kinds; a custom "
            "device is answered alone (--gpu custom:… with one --devices count)"
        )
    try:
        keys = list(dict.fromkeys(device_named(g).key for g in gpus))
    except ValueError as err:
        raise ValueError(f"--gpu: {err}") from None
    given = list(args.deployment or ())
    plain = [text for text in given if not is_pools(text)]
    if plain:
        raise ValueError(
            f"--deployment {plain[0]}: a search across kinds takes pools of their own, "
            "disaggregated:P:D,p=KIND[:tpN],d=KIND[:tpN] (or leave --deployment out)"
        )
    splits = [_pools(text, args) for text in given]
    for split in splits:
        keys += [k for k in split.devices_by_kind() if k not in keys]
    if not keys:
        raise ValueError("--gpu: name the device kinds to search, e.g. --gpu h100,l40s")
    budget = _budget(args.devices, keys, splits)
    first = check_deploy_args(args, profile, budget[keys[0]], gpu=keys[0])  # model, context
    base = first.hardware
    assert base is not None  # --model given: its hardware
    block = profile.kv_block_tokens
    hardware = {k: _on(base, k) for k in keys}
    tp = {k: _smallest_tp(hardware[k], budget[k], k, block) for k in keys}
    for split in splits:
        for pool in (split.prefill, split.decode):
            try:
                hardware[pool.kind].kv(pool.tp, block)
            except NoKVCache as err:
                raise ValueError(
                    f"--deployment {split.label}: {pool.role} pool: {err.shortfall} (give the "
                    f"pool a larger TP, {pool.role[0]}={pool.kind}:tpN, or another kind)"
                ) from None
            except ValueError as err:
                raise ValueError(f"--deployment {split.label}: {pool.role} pool: {err}") from None
    prices = parse_prices(args.price, keys) if args.price is not None else None
    missing = [k for k in keys if prices is not None and k not in prices]
    if missing:
        raise ValueError(f"--price: no price for {', '.join(missing)} (give KIND=$/h for each)")
    devices = max(sum(budget.values()), *(sum(s.devices_by_kind().values()) for s in splits), 1)
    return KindSearch(hardware, budget, tp, tuple(splits), prices, devices), first


def _pools(text: str, args: argparse.Namespace) -> PoolSplit:
    try:
        return parse_pools(text, load_model_spec(args.model))
    except ValueError as err:
        raise ValueError(f"--deployment: {err}") from None


def _budget(
    devices: int | dict[str, int], keys: Sequence[str], splits: Sequence[PoolSplit]
) -> dict[str, int]:
    """Each kind's devices: ``--devices N`` of each, or the KIND=N given (every kind searched,
    no other); a kind only a given split names takes what the splits use."""
    if isinstance(devices, int):
        used = {k: max((s.devices_by_kind().get(k, 0) for s in splits), default=0) for k in keys}
        return {k: max(devices, used[k]) if splits else devices for k in keys}
    out = {}
    for name, n in devices.items():
        try:
            key = device_named(name).key
        except ValueError as err:
            raise ValueError(f"--devices: {err}") from None
        if key not in keys:
            raise ValueError(f"--devices: {name} is not a kind searched ({', '.join(keys)})")
        out[key] = n
    absent = [k for k in keys if k not in out]
    if absent:
        raise ValueError(f"--devices: give a count for {', '.join(absent)} too (KIND=N)")
    return out


def _on(hardware: Hardware, kind: str) -> Hardware:
    device = device_named(kind)
    return dataclasses.replace(
        hardware,
        device_memory=device.memory_bytes,
        memory_source=f"--gpu {device.key}, as its driver reports",
    )


def _smallest_tp(hardware: Hardware, devices: int, kind: str, block: int) -> int:
    """The smallest TP at which the model fits on ``kind`` within its ``devices`` (a TP that
    need not divide them: instances take whole TP groups; KV in blocks of ``block`` tokens)."""
    sizes = [n for n in (1, 2, 4, 8) if n <= devices and n in hardware.tp_sizes(n, block)]
    if not sizes:
        raise ValueError(
            f"--gpu {kind}: {hardware.model.name} fits on none of its {devices} devices at TP "
            "1, 2, 4 or 8 (give it more: --devices KIND=N)"
        )
    return sizes[0]


def kind_plan(
    search: KindSearch, profile: EngineProfile, model: str, load: Sequence[Request]
) -> tuple[CostSpec, tuple[Deployment, ...], AnswerBasis, list[str]]:
    """Each kind's derived cost under ``profile``, the deployments to compare (each with its
    own cost models), what the answer on --model (``model``) rests on, and a note per kind of
    deployment the engine refuses."""
    block = profile.kv_block_tokens
    prompts, outputs = [r.prompt_len for r in load], [r.output_len for r in load]
    derived: dict[str, tuple[Hardware, CostSpec]] = {}
    for kind, hardware in search.hardware.items():
        derived[kind] = derive_on(hardware, device_named(kind), profile.name, prompts, outputs)

    def cost_of(kind: str, tp: int) -> CostModel:
        hardware, spec = derived[kind]
        assert spec.cost is not None
        return hardware.instance_cost(spec.cost, tp, block)

    settings = {"max_batched_tokens": profile.max_batched_tokens}
    splits = search.splits
    colocated: list[Colocated] = []
    if not splits:
        colocated, found = kind_deployments(search.budget, search.tp)
        splits = tuple(found)
    out = [_colocated(c, cost_of(c.kind, c.tp), profile) for c in colocated]
    for split in splits:
        prefill, decode = split.costs(lambda pool: cost_of(pool.kind, pool.tp))
        out.append(Deployment.of_pools(split, prefill, decode, **settings))
    first = next(iter(derived.values()))[1]
    refused = refused_kinds(out, profile, first.cost)
    notes = [f"  note: no {kind} compared: {why}" for kind, why in refused.items()]
    kept = tuple(d for d in out if d.policy not in refused)
    return _spec(derived), kept, _basis(model, block, derived, search), notes


def _colocated(c: Colocated, cost: CostModel, profile: EngineProfile) -> Deployment:
    """A kind's colocated deployment under the engine's own settings (its token budget)."""
    policy = "chunked" if "budgets" in engine_command(profile).kinds else "shared"
    tokens = profile.max_batched_tokens if policy == "chunked" else None
    devices = c.replicas * c.tp
    return Deployment(policy, devices, max_batched_tokens=tokens, tp=c.tp, cost=cost, kind=c.kind)


def _spec(derived: Mapping[str, tuple[Hardware, CostSpec]]) -> CostSpec:
    """One cost spec for the search: the first kind's cost (the search's own), its source
    naming every kind's derivation."""
    first = next(iter(derived.values()))[1]
    kinds = ", ".join(derived)
    return dataclasses.replace(
        first,
        spec=f"derived:{kinds}",
        source=f"derived for each kind ({kinds}) from the model's shapes; each deployment's "
        "cost model derived for its kind at its own TP",
    )


def _host(hardware: Hardware) -> str:
    """``; host: <where the host's cost comes from>`` for a kind's derived compute."""
    deriver = hardware.derived
    return f"; host: {deriver.host.source}" if isinstance(deriver, Deriver) else ""


def _basis(
    model: str,
    block: int,
    derived: Mapping[str, tuple[Hardware, CostSpec]],
    search: KindSearch,
) -> AnswerBasis:
    """Per kind: its compute's derivation and error class, its memory and KV (in blocks of
    ``block`` tokens) at its TPs; the launch line serves --model (``model``)."""
    first = next(iter(derived.values()))[0]
    lines = [f"Model: {first.model.summary()} ({first.model.source})"]
    for kind, (hardware, spec) in derived.items():
        assert hardware.device_memory is not None
        pools = [p for s in search.splits for p in (s.prefill, s.decode) if p.kind == kind]
        tps = sorted({p.tp for p in pools} if pools else {search.tp[kind]})
        kv = "; ".join(f"KV at TP={tp}: {_kv(hardware, tp, block)}" for tp in tps)
        lines += [
            f"  {kind}: {hardware.device_memory / GiB:g} GiB ({hardware.memory_source}), "
            f"{hardware.utilization:g} for the engine; {kv}",
            f"    compute: {spec.label}{_host(hardware)}",
        ]
    rests = (
        "[each pool's compute derived for its kind at its TP (the error classes above); "
        "KV per instance by vLLM's rule, activation reserve estimated; the KV crosses the "
        "slower kind's link]"
    )
    utilization = first.utilization
    fp8 = first.model.fp8_storage
    return AnswerBasis(tuple(lines), utilization, served_name(model), rests, None, {}, None, fp8)


def _kv(hardware: Hardware, tp: int, block: int) -> str:
    kv = hardware.kv(tp, block)
    return kv.describe() if kv is not None else "the cost model's"
