"""Money (DESIGN.md, "Deployments", pools of their own): ``--price KIND=$/h`` per device kind,
and what a deployment's device-hours cost per million tokens served within the SLO, input and
output apart (as users buy them): under disaggregation the prefill pool's hours go to the input
tokens and the decode pool's to the output tokens; colocated, the devices' hours are split by
the share of their busy time spent on prompts (:func:`prompt_share`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping

from pytest_prefill.plan.compute.devices import device_named
from pytest_prefill.plan.deployments import Deployment
from pytest_prefill.plan.pools import PoolSplit
from pytest_prefill.sim import Event

MILLION = 1e6
HOUR = 3600.0


def parse_prices(text: str, kinds: Iterable[str]) -> dict[str, float]:
    """``h100=2.5,l40s=0.9`` ($ per device-hour) as {catalog key: price}, for the device
    ``kinds`` searched (catalog names or aliases).

    Raises:
        ValueError: in one line, for an item not KIND=PRICE, an unknown kind, a kind not
            searched, a price that is negative or not a finite number, or a kind twice.
    """
    searched = {device_named(k).key for k in kinds}
    out: dict[str, float] = {}
    for item in str(text).split(","):
        kind, sep, value = item.strip().partition("=")
        if not sep or not kind.strip():
            raise ValueError(f"--price: expected KIND=$/device-hour, e.g. h100=2.5; got {item!r}")
        try:
            key = device_named(kind).key
        except ValueError as err:
            raise ValueError(f"--price: {err}") from None
        if key not in searched:
            raise ValueError(
                f"--price: {kind.strip()!r} is not a kind searched ({', '.join(sorted(searched))})"
            )
        try:
            price = float(value)
        except ValueError:
            price = math.nan
        if not math.isfinite(price) or price < 0:
            raise ValueError(f"--price: {kind.strip()}={value.strip()}: a price is a number >= 0")
        if key in out:
            raise ValueError(f"--price: {key} is priced twice")
        out[key] = price
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class TokenPrice:
    """What serving costs at a rate within the SLO: ``dollars_per_hour`` for the devices, and
    per million tokens served, input and output apart and both together.

    Raises:
        ValueError: naming the field, for a negative or non-finite figure.
    """

    dollars_per_hour: float
    input_per_mtok: float
    output_per_mtok: float
    per_mtok: float

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not (isinstance(value, (int, float)) and value >= 0 and not math.isnan(value)):
                raise ValueError(f"{f.name} must be >= 0, got {value!r}")


def token_price(
    rate: float,
    mean_prompt: float,
    mean_output: float,
    input_dollars: float,
    output_dollars: float,
) -> TokenPrice:
    """The price of a million tokens at ``rate`` requests/s of ``mean_prompt`` input and
    ``mean_output`` output tokens, when ``input_dollars`` an hour pay for the input tokens
    and ``output_dollars`` for the output (inf where nothing is served).

    Raises:
        ValueError: for a negative rate, mean or dollar figure.
    """
    for name, value in (
        ("rate", rate),
        ("mean_prompt", mean_prompt),
        ("mean_output", mean_output),
        ("input_dollars", input_dollars),
        ("output_dollars", output_dollars),
    ):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")

    def per_million(dollars: float, tokens_per_second: float) -> float:
        if tokens_per_second <= 0:
            return math.inf
        return dollars / (tokens_per_second * HOUR) * MILLION

    total = input_dollars + output_dollars
    return TokenPrice(
        total,
        per_million(input_dollars, rate * mean_prompt),
        per_million(output_dollars, rate * mean_output),
        per_million(total, rate * (mean_prompt + mean_output)),
    )


def dollars_per_hour(devices: Mapping[str, int], prices: Mapping[str, float]) -> float:
    """Device-hours of each kind at its price.

    Raises:
        ValueError: naming a kind with devices but no price.
    """
    missing = sorted(k for k, n in devices.items() if n and k not in prices)
    if missing:
        raise ValueError(f"--price: no price for {', '.join(missing)} (give KIND=$/h for each)")
    return sum(n * prices[k] for k, n in devices.items())


def prompt_share(events: Iterable[Event]) -> float:
    """The share of compute busy time spent on prompts: a prefill pass's all, a decode step's
    none, a fused iteration's in proportion of its prompt tokens to its tokens (prompt tokens
    plus decode rows: a stated split, not a measurement). 0 when nothing was busy."""
    prompt = busy = 0.0
    for e in events:
        if e.kind == "transfer":
            continue
        busy += e.duration
        if e.kind == "prefill":
            prompt += e.duration
        elif e.kind == "fused":
            prompt += e.duration * e.prefill_tokens / (e.prefill_tokens + e.decode_rows)
    return prompt / busy if busy > 0 else 0.0


def split_price(
    split: PoolSplit,
    prices: Mapping[str, float],
    rate: float,
    mean_prompt: float,
    mean_output: float,
) -> TokenPrice:
    """A P:D split's price at ``rate``: its prefill pool's hours pay for the input tokens, its
    decode pool's for the output tokens."""
    prefill = dollars_per_hour({split.prefill.kind: split.prefill.devices}, prices)
    decode = dollars_per_hour({split.decode.kind: split.decode.devices}, prices)
    return token_price(rate, mean_prompt, mean_output, prefill, decode)


def colocated_price(
    kind: str,
    devices: int,
    prices: Mapping[str, float],
    rate: float,
    mean_prompt: float,
    mean_output: float,
    share: float,
) -> TokenPrice:
    """Colocated ``devices`` of ``kind`` at ``rate``: their hours split between input and
    output by ``share``, the prompts' share of busy time (:func:`prompt_share`).

    Raises:
        ValueError: for a share outside [0, 1], or no price for ``kind``.
    """
    if not (isinstance(share, (int, float)) and 0 <= share <= 1):
        raise ValueError(f"share must be within [0, 1], got {share!r}")
    total = dollars_per_hour({device_named(kind).key: devices}, prices)
    return token_price(rate, mean_prompt, mean_output, total * share, total * (1 - share))


def deployment_price(
    deployment: Deployment,
    prices: Mapping[str, float],
    rate: float,
    mean_prompt: float,
    mean_output: float,
    share: Callable[[], float],
) -> TokenPrice:
    """``deployment``'s price at ``rate`` (``share()``: a colocated one's prompt share of
    busy time, asked only for a colocated deployment serving a rate).

    Raises:
        ValueError: for a deployment of no named kind, or a kind with no price.
    """
    if deployment.pools is not None:
        return split_price(deployment.pools, prices, rate, mean_prompt, mean_output)
    if deployment.kind is None:
        raise ValueError(f"deployment {deployment.label}: price it by naming its device kind")
    fraction = share() if rate > 0 else 0.5
    return colocated_price(
        deployment.kind, deployment.devices, prices, rate, mean_prompt, mean_output, fraction
    )
