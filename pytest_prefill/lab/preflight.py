"""The device check's preflight: before anything is timed, is what will be timed right? The
packed pass against the Hugging Face forward, a prompt fed in chunks over its cache against the
whole prompt, decode rows batched against the forward, where the weights live and in which
dtype, and which SDPA kernels each attention shape may take. Correctness only (nothing here is
a timing); ``python -m pytest_prefill.lab.preflight --out FILE`` writes the JSON at once."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import sys
from collections.abc import Callable, Sequence
from typing import Any

from pytest_prefill._io import json_safe, write_json_atomic

KIND = "pytest-prefill/preflight"
# Largest |packed - HF| over the largest |HF| logit a check accepts, by dtype: float32 agrees
# to rounding; half precision differs by its own rounding of differently ordered sums.
TOLERANCE = {"float32": 1e-3, "bfloat16": 5e-2, "float16": 2e-2}
PROMPT = 96  # tokens of the prompt every check feeds
CHUNK = 40  # the chunk the chunked check feeds it in (the last chunk is shorter)
ROW_PROMPTS = (5, 33, 70)  # the decode rows' prompts: different lengths in one batched pass
BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")


@dataclasses.dataclass(frozen=True)
class Check:
    """One preflight check: its name, whether it passed, and its numbers in a line."""

    name: str
    ok: bool
    detail: str
    numbers: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail, **self.numbers}


def relative_error(got: Any, want: Any) -> float:
    """max |got - want| / max |want| (in float32)."""
    got, want = got.float(), want.float()
    scale = float(want.abs().max()) or 1.0
    return float((got - want).abs().max()) / scale


def _compare(name: str, got: Any, want: Any, dtype: str, what: str) -> Check:
    error = relative_error(got, want)
    agree = float((got.argmax(-1) == want.argmax(-1)).float().mean())
    limit = TOLERANCE.get(dtype, 5e-2)
    ok = error <= limit
    detail = (
        f"{what}: max |difference| / max |logit| = {error:.2e} (limit {limit:g} in {dtype}); "
        f"next-token argmax agrees on {agree:.0%} of rows"
    )
    return Check(name, ok, detail, {"relative_error": error, "limit": limit, "argmax": agree})


def placement(loaded: Any) -> Check:
    """Every parameter on the device asked for, in the dtype asked for."""
    import torch

    want = torch.device(loaded.device)
    devices = {str(p.device) for p in loaded.model.parameters()}
    dtypes = {str(p.dtype).removeprefix("torch.") for p in loaded.model.parameters()}
    on_device = all(p.device.type == want.type for p in loaded.model.parameters())
    ok = on_device and dtypes == {loaded.dtype_name}
    attention = str(getattr(loaded.config, "_attn_implementation", None) or "default")
    detail = (
        f"parameters on {', '.join(sorted(devices))} in {', '.join(sorted(dtypes))} "
        f"(asked: {want}, {loaded.dtype_name}); the HF forward's attention: {attention}"
    )
    numbers = {"devices": sorted(devices), "dtypes": sorted(dtypes), "attention": attention}
    return Check("placement and dtype", ok, detail, numbers)


def _hf(loaded: Any, ids: Any) -> Any:
    import torch

    with torch.inference_mode():
        return loaded.model(ids[None].to(loaded.device)).logits[0]


def packed_vs_hf(loaded: Any, packed: Any, prompt: Any) -> Check:
    """The packed pass's logits over a whole prompt against the HF forward's."""
    from pytest_prefill.lab.packed import Segment

    cache = packed.new_cache(len(prompt))
    got = packed.forward([Segment(cache, prompt.to(packed.device), "all")])[0]
    what = f"a {len(prompt)}-token prompt, packed pass vs HF forward"
    return _compare("packed pass vs HF forward", got, _hf(loaded, prompt), loaded.dtype_name, what)


def chunked_vs_whole(loaded: Any, packed: Any, prompt: Any) -> Check:
    """The prompt fed in chunks over its own cache against the whole prompt in one pass:
    every chunk's logits and the cache they leave."""
    import torch

    from pytest_prefill.lab.packed import Segment

    whole_cache = packed.new_cache(len(prompt))
    whole = packed.forward([Segment(whole_cache, prompt.to(packed.device), "all")])[0]
    cache = packed.new_cache(len(prompt))
    pieces = [
        packed.forward([Segment(cache, prompt[at : at + CHUNK].to(packed.device), "all")])[0]
        for at in range(0, len(prompt), CHUNK)
    ]
    check = _compare(
        "chunked over the cache vs whole prefill",
        torch.cat(pieces),
        whole,
        loaded.dtype_name,
        f"{len(prompt)} tokens in chunks of {CHUNK} over the cache vs one pass",
    )
    kv = relative_error(cache.filled(), whole_cache.filled())
    ok = check.ok and kv <= check.numbers["limit"]
    detail = f"{check.detail}; the caches differ by {kv:.2e} (relative)"
    return dataclasses.replace(check, ok=ok, detail=detail, numbers={**check.numbers, "kv": kv})


def batched_rows_vs_hf(loaded: Any, packed: Any, prompts: Sequence[Any]) -> Check:
    """Decode rows of different cache lengths in one batched pass against the HF forward over
    each row's whole sequence."""
    import torch

    from pytest_prefill.lab.packed import Segment

    device = packed.device
    caches = [packed.new_cache(len(p) + 1) for p in prompts]
    firsts = packed.forward(
        [Segment(c, p.to(device), "last") for c, p in zip(caches, prompts, strict=True)]
    )
    nexts = [int(f.argmax()) for f in firsts]
    rows = [
        Segment(c, torch.tensor([t], device=device)) for c, t in zip(caches, nexts, strict=True)
    ]
    got = torch.stack(packed.forward(rows))
    want = torch.stack(
        [
            _hf(loaded, torch.cat([p, torch.tensor([t])]))[-1]
            for p, t in zip(prompts, nexts, strict=True)
        ]
    )
    lengths = ", ".join(str(len(p)) for p in prompts)
    what = f"{len(prompts)} decode rows over {lengths} cached tokens in one pass vs HF"
    return _compare("batched decode rows vs HF forward", got, want, loaded.dtype_name, what)


def kernel_probe(packed: Any) -> dict[str, Any]:
    """Per attention shape the packed pass makes, which SDPA backends accept it (each tried
    alone) and the first of them in the dispatcher's order: the kernel it runs on."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from pytest_prefill.lab.packed import causal_bias

    heads, kv_heads, dim = packed.num_heads, packed.num_kv_heads, packed.head_dim
    group = heads // kv_heads

    def tensor(*shape: int) -> Any:
        return torch.randn(shape, dtype=packed.dtype, device=packed.device)

    keys = 512
    shapes: dict[str, Callable[[], Any]] = {
        "whole prompt (512 tokens)": lambda: F.scaled_dot_product_attention(
            tensor(1, heads, keys, dim),
            tensor(1, kv_heads, keys, dim),
            tensor(1, kv_heads, keys, dim),
            attn_mask=causal_bias(keys, keys),
            enable_gqa=group > 1,
        ),
        "chunk of 128 over 384 cached": lambda: F.scaled_dot_product_attention(
            tensor(1, heads, 128, dim),
            tensor(1, kv_heads, keys, dim),
            tensor(1, kv_heads, keys, dim),
            attn_mask=causal_bias(128, keys),
            enable_gqa=group > 1,
        ),
        "decode rows (4, masked)": lambda: F.scaled_dot_product_attention(
            tensor(4, kv_heads, group, dim),
            tensor(4, kv_heads, keys, dim),
            tensor(4, kv_heads, keys, dim),
            attn_mask=torch.ones(4, 1, 1, keys, dtype=torch.bool, device=packed.device),
        ),
    }
    out: dict[str, Any] = {}
    for name, call in shapes.items():
        accepted = []
        for backend in BACKENDS:
            if not hasattr(SDPBackend, backend):
                continue
            try:
                with torch.inference_mode(), sdpa_kernel([getattr(SDPBackend, backend)]):
                    call()
                accepted.append(backend.lower())
            except RuntimeError:
                continue
        out[name] = {"accepted": accepted, "runs_on": accepted[0] if accepted else None}
    return out


def preflight(loaded: Any, *, seed: int = 0) -> dict[str, Any]:
    """Every check on ``loaded`` (a ``models.LoadedModel``), as a JSON-able document."""
    import torch

    from pytest_prefill.lab.packed import PackedModel

    generator = torch.Generator().manual_seed(seed)
    vocab = int(loaded.config.vocab_size)

    def prompt(n: int) -> Any:
        return torch.randint(0, vocab, (n,), generator=generator)

    checks = [placement(loaded)]
    try:
        packed = PackedModel(loaded.model)
    except ValueError as err:
        checks.append(Check("packed pass", False, f"not run: {err}"))
        kernels: dict[str, Any] = {}
    else:
        whole = prompt(PROMPT)
        checks += [
            packed_vs_hf(loaded, packed, whole),
            chunked_vs_whole(loaded, packed, whole),
            batched_rows_vs_hf(loaded, packed, [prompt(n) for n in ROW_PROMPTS]),
        ]
        kernels = kernel_probe(packed)
    return {
        "kind": KIND,
        "ok": all(c.ok for c in checks),
        "model": loaded.name,
        "device": str(loaded.device),
        "dtype": loaded.dtype_name,
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "checks": [c.to_dict() for c in checks],
        "kernels": kernels,
    }


def preflight_lines(document: dict[str, Any]) -> list[str]:
    """The preflight in a few lines, for a terminal or a summary."""
    lines = [
        f"preflight {'OK' if document['ok'] else 'FAILED'}: {document['model']} on "
        f"{document['device']} in {document['dtype']} (torch {document['torch']})"
    ]
    for check in document["checks"]:
        lines.append(f"  [{'ok' if check['ok'] else 'FAIL'}] {check['name']}: {check['detail']}")
    for shape, probe in document["kernels"].items():
        accepted = ", ".join(probe["accepted"]) or "none"
        lines.append(f"  attention, {shape}: runs on {probe['runs_on']} (accepted: {accepted})")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """``--model``, ``--device``, ``--dtype``, ``--out FILE``: 0 when every check passed."""
    from pytest_prefill.measure.models import load_model

    parser = argparse.ArgumentParser(prog="python -m pytest_prefill.lab.preflight")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default=None)
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args(argv)
    try:
        loaded = load_model(args.model, device=args.device, dtype=args.dtype)
    except ValueError as err:
        parser.error(str(err))
    document = preflight(loaded)
    write_json_atomic(args.out, json_safe(document, "preflight"))
    print("\n".join(preflight_lines(document)), flush=True)
    return 0 if document["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
