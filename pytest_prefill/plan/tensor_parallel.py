"""A cost model at tensor-parallel size N from one measured at TP=1 (DESIGN.md, "Deployments:
model, memory, parallelism"): each compute term ÷ (N · efficiency(N)), plus per iteration two
all-reduces per layer of ``tokens × hidden × b`` bytes over the device link. Standard library
only.

The efficiencies and the link come from Vidur's published profiles (microsoft/vidur at
7d47513, MIT licence, Copyright (c) Microsoft Corporation): ``data/profiling/compute/<gpu>/
<model>/mlp.csv`` times every operator of a layer outside attention's kernel (norms, QKV and
output projections, rotary embedding, the MLP, the residual add) at TP 1, 2, 4 and 8, and
``data/profiling/network/<gpu>_dgx/all_reduce.csv`` times all-reduces of 2 KiB to 64 MiB over
NVLink. Shipped here is only what is derived from them: per TP size, the sum of the medians
(``time_stats.<op>.median``, ms) of input_layernorm, attn_pre_proj, attn_rope, attn_post_proj,
post_attention_layernorm, mlp_up_proj, mlp_act, mlp_down_proj and add at seventeen token counts
from 1 to 4,096 (:data:`LINEAR_PROFILES`); and per TP size the all-reduce's latency and
bandwidth, a least-squares line through the rank-0 medians of a single node
(``devices_per_node == num_workers``) over 2 KiB to 64 MiB (:data:`ALL_REDUCE`).

The rule: a layer's time at TP=1 on T tokens, t1(T), is a fixed latency σ that no number of
devices shortens (kernel launches and their synchronisation: a constant per layer) plus work
that divides by Amdahl's law, a fraction ρ of it serial:

    t_N(T) = σ + (t1(T) − σ) · (ρ + (1 − ρ)/N)

Per token count this is Amdahl's law with a serial fraction ρ_T = ρ + (1 − ρ) · σ / t1(T):
large at small T (a launch-bound layer barely speeds up) and ρ at large T. The profiles show
exactly that (A100 Llama-3-8B at TP 8: 1.8–2.1 × the ideal time up to 256 tokens, 1.1–1.3 ×
from 1,024), which one ρ for every T cannot: fitted on TP 2 and 4, the single-ρ rule missed TP 8
there by 19% (median). ρ and σ are fitted by least squares of the samples ρ_T,N on 1/t1(T)
(a line: intercept ρ, slope (1 − ρ)σ) over the fitted TP sizes. Fitted on any two of TP 2, 4
and 8, it predicts the third within 10% (median over token counts) on every shipped profile;
tests/test_tensor_parallel.py pins every cell and docs/deployments.md tabulates the figures
(:func:`held_out_error`). Attention's own kernel (the pair term, the KV read) is not in these
profiles; it splits by heads and takes the work's efficiency.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Iterable, Mapping

from pytest_prefill.plan.device_memory import check_tp
from pytest_prefill.plan.model_spec import ModelSpec
from pytest_prefill.sim import CostModel

VIDUR = "Vidur's published profiles (microsoft/vidur, MIT licence)"
PROFILE_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
GPUS = ("h100", "a100")


@dataclasses.dataclass(frozen=True, slots=True)
class LinearProfile:
    """One model's layer (outside attention's kernel) on one GPU: its hidden size and, per TP
    size, the summed median time in ms at each of :data:`PROFILE_TOKENS`."""

    hidden_size: int
    times_ms: Mapping[int, tuple[float, ...]]


LINEAR_PROFILES: dict[tuple[str, str], LinearProfile] = {
    ("h100", "meta-llama/Llama-2-7b-hf"): LinearProfile(
        4096,
        {
            1: (
                0.175,
                0.171,
                0.172,
                0.172,
                0.181,
                0.181,
                0.183,
                0.199,
                0.286,
                0.345,
                0.3745,
                0.588,
                0.657,
                1.043,
                1.26,
                1.999,
                2.608,
            ),
            2: (
                0.1,
                0.098,
                0.099,
                0.099,
                0.104,
                0.103,
                0.1095,
                0.117,
                0.1425,
                0.199,
                0.2215,
                0.325,
                0.373,
                0.593,
                0.7025,
                1.04,
                1.377,
            ),
            4: (
                0.0635,
                0.063,
                0.063,
                0.0635,
                0.064,
                0.0695,
                0.071,
                0.0775,
                0.093,
                0.1215,
                0.135,
                0.175,
                0.2365,
                0.329,
                0.4175,
                0.605,
                0.7905,
            ),
            8: (
                0.041,
                0.045,
                0.0475,
                0.049,
                0.048,
                0.048,
                0.052,
                0.058,
                0.0685,
                0.088,
                0.096,
                0.126,
                0.151,
                0.1965,
                0.2725,
                0.38,
                0.5165,
            ),
        },
    ),
    ("h100", "codellama/CodeLlama-34b-Instruct-hf"): LinearProfile(
        8192,
        {
            1: (
                0.5075,
                0.5115,
                0.504,
                0.504,
                0.512,
                0.518,
                0.5225,
                0.551,
                0.636,
                1.192,
                1.113,
                1.81,
                2.372,
                3.281,
                4.3,
                6.46,
                8.818,
            ),
            2: (
                0.268,
                0.271,
                0.2725,
                0.2765,
                0.273,
                0.284,
                0.289,
                0.3005,
                0.375,
                0.543,
                0.61,
                0.906,
                1.192,
                1.79,
                2.236,
                3.429,
                4.428,
            ),
            4: (
                0.147,
                0.1585,
                0.16,
                0.155,
                0.157,
                0.1655,
                0.1585,
                0.171,
                0.2085,
                0.332,
                0.353,
                0.546,
                0.628,
                0.848,
                1.165,
                1.714,
                2.348,
            ),
            8: (
                0.091,
                0.089,
                0.095,
                0.092,
                0.093,
                0.1,
                0.0985,
                0.109,
                0.1345,
                0.183,
                0.208,
                0.2845,
                0.359,
                0.497,
                0.688,
                0.946,
                1.305,
            ),
        },
    ),
    ("h100", "meta-llama/Llama-2-70b-hf"): LinearProfile(
        8192,
        {
            1: (
                0.625,
                0.62,
                0.608,
                0.6085,
                0.615,
                0.6305,
                0.6335,
                0.648,
                0.764,
                1.266,
                1.256,
                2.2,
                2.935,
                4.219,
                5.376,
                7.968,
                11.02,
            ),
            2: (
                0.319,
                0.323,
                0.32,
                0.321,
                0.323,
                0.333,
                0.336,
                0.351,
                0.4075,
                0.7635,
                0.709,
                1.099,
                1.44,
                2.079,
                2.659,
                4.056,
                5.429,
            ),
            4: (
                0.179,
                0.179,
                0.184,
                0.187,
                0.1815,
                0.1915,
                0.191,
                0.199,
                0.24,
                0.3625,
                0.375,
                0.587,
                0.776,
                1.027,
                1.382,
                2.23,
                2.784,
            ),
            8: (
                0.1045,
                0.103,
                0.1035,
                0.105,
                0.1065,
                0.116,
                0.112,
                0.125,
                0.144,
                0.209,
                0.221,
                0.381,
                0.408,
                0.601,
                0.7965,
                1.143,
                1.52,
            ),
        },
    ),
    ("a100", "meta-llama/Meta-Llama-3-8B"): LinearProfile(
        4096,
        {
            1: (
                0.303,
                0.306,
                0.306,
                0.312,
                0.3165,
                0.341,
                0.351,
                0.412,
                0.609,
                0.867,
                1.083,
                1.655,
                2.348,
                3.341,
                4.549,
                6.412,
                8.549,
            ),
            2: (
                0.178,
                0.177,
                0.1805,
                0.182,
                0.1865,
                0.179,
                0.186,
                0.24,
                0.3615,
                0.4575,
                0.573,
                0.844,
                1.147,
                1.67,
                2.316,
                3.361,
                4.442,
            ),
            4: (
                0.106,
                0.101,
                0.104,
                0.104,
                0.107,
                0.112,
                0.113,
                0.142,
                0.235,
                0.271,
                0.375,
                0.4605,
                0.6535,
                0.8775,
                1.163,
                1.779,
                2.413,
            ),
            8: (
                0.065,
                0.07,
                0.071,
                0.078,
                0.082,
                0.073,
                0.074,
                0.105,
                0.136,
                0.156,
                0.203,
                0.258,
                0.345,
                0.508,
                0.65,
                0.979,
                1.351,
            ),
        },
    ),
}

# (latency s, bandwidth bytes/s) of one all-reduce among N devices of one DGX node
ALL_REDUCE: dict[str, dict[int, tuple[float, float]]] = {
    "h100": {2: (24.0e-6, 305.0e9), 4: (27.9e-6, 235.6e9), 8: (34.7e-6, 209.1e9)},
    "a100": {2: (45.4e-6, 171.7e9), 4: (54.4e-6, 121.7e9), 8: (70.4e-6, 103.6e9)},
}


@dataclasses.dataclass(frozen=True, slots=True)
class Fit:
    """The rule's two constants for one profile: ``rho``, the serial fraction of a layer's
    work, and ``fixed_ms``, the per-layer latency σ that does not divide (ms)."""

    rho: float
    fixed_ms: float

    def predict_ms(self, t1: float, tp: int) -> float:
        """A layer's time at ``tp`` from its time ``t1`` at TP=1 (ms)."""
        fixed = min(self.fixed_ms, t1)
        return fixed + (t1 - fixed) * (self.rho + (1 - self.rho) / tp)


def fit_rule(profile: LinearProfile, sizes: Iterable[int]) -> Fit:
    """ρ and σ fitted on the TP ``sizes`` (each > 1): a least-squares line through the samples
    ``ρ_T,N = (t_N/t1 − 1/N) / (1 − 1/N)`` against ``1/t1(T)``, its intercept ρ and its slope
    (1 − ρ)σ; ρ clamped to [0, 1) and σ to ≥ 0."""
    one = profile.times_ms[1]
    points = [
        (1 / t1, (t / t1 - 1 / n) / (1 - 1 / n))
        for n in sizes
        for t, t1 in zip(profile.times_ms[n], one, strict=True)
    ]
    if not points or any(n <= 1 for n in sizes):
        raise ValueError("fit_rule needs TP sizes > 1 to fit")
    xs, ys = zip(*points, strict=True)
    slope, intercept = statistics.linear_regression(xs, ys)
    rho = min(0.99, max(0.0, intercept))
    return Fit(rho, max(0.0, slope / (1 - rho)))


def predicted_ms(profile: LinearProfile, fit: Fit, tp: int) -> tuple[float, ...]:
    """The layer's time at ``tp`` the rule predicts from its TP=1 times."""
    return tuple(fit.predict_ms(t, tp) for t in profile.times_ms[1])


def held_out_error(profile: LinearProfile, fit_sizes: Iterable[int], held_out: int) -> float:
    """The median over token counts of |predicted / profiled − 1| at ``held_out``, the rule
    fitted on ``fit_sizes``."""
    fit = fit_rule(profile, fit_sizes)
    pairs = zip(predicted_ms(profile, fit, held_out), profile.times_ms[held_out], strict=True)
    return statistics.median(abs(p / t - 1) for p, t in pairs)


@dataclasses.dataclass(frozen=True, slots=True)
class TPRule:
    """How a TP=1 cost model becomes one at TP=N: the rule's ``rho`` (the work's serial
    fraction) and ``fixed_share`` (σ over the profiled layer's one-token time: the share of a
    pass's fixed time that does not divide) from ``profile`` on ``gpu``, and that GPU's
    all-reduce link."""

    gpu: str
    profile: str
    rho: float
    fixed_share: float = 0.0

    def efficiency(self, tp: int) -> float:
        """The work's Amdahl efficiency at ``tp``: 1 / (1 + ρ(N − 1))."""
        return 1 / (1 + self.rho * (check_tp(tp) - 1))

    def link(self, tp: int) -> tuple[float, float]:
        """(latency s, bandwidth bytes/s) of one all-reduce among ``tp`` devices (the nearest
        profiled size at or above it; 8 beyond)."""
        table = ALL_REDUCE[self.gpu]
        size = min((n for n in table if n >= tp), default=max(table))
        return table[size]

    def describe(self, tp: int) -> str:
        latency, bandwidth = self.link(tp)
        return (
            f"TP={tp} scaled from the TP=1 cost model by {VIDUR}: {self.gpu.upper()} "
            f"{self.profile} (the work {self.efficiency(tp):.0%} efficient at TP={tp}; "
            f"{self.fixed_share:.0%} of each pass's fixed time, kernel launches, not divided), "
            f"plus 2 all-reduces per layer ({latency * 1e6:.0f} us + bytes at "
            f"{bandwidth / 1e9:.0f} GB/s, {self.gpu.upper()} NVLink)"
        )


def tp_rule(model: ModelSpec, gpu: str = "h100") -> TPRule:
    """The rule for ``model`` on ``gpu``: the profile of that GPU nearest in hidden size (ties:
    the first listed), fitted on every profiled TP size.

    Raises:
        ValueError: for a GPU with no profile.
    """
    if gpu not in GPUS:
        raise ValueError(f"TP profiles exist for {', '.join(GPUS)}, not {gpu!r}")
    candidates = [(k, p) for k, p in LINEAR_PROFILES.items() if k[0] == gpu]
    (_, name), profile = min(
        candidates, key=lambda kp: abs(math.log(kp[1].hidden_size / model.hidden_size))
    )
    fit = fit_rule(profile, [n for n in profile.times_ms if n > 1])
    share = min(1.0, fit.fixed_ms / profile.times_ms[1][0])
    return TPRule(gpu, name, fit.rho, share)


def cost_at_tp(cost: CostModel, model: ModelSpec, tp: int, rule: TPRule) -> CostModel:
    """``cost`` (measured at TP=1) at TP=``tp``: its work ÷ (tp · efficiency), every term but a
    share ``rule.fixed_share`` of each pass's fixed time (``prefill_pass_overhead``,
    ``decode_step_base``), which stays; and per iteration 2 all-reduces per layer: their latency
    on each pass's fixed cost, their bytes (``hidden × dtype bytes`` per token) on each token's
    and each decode row's cost. TP=1 is ``cost`` itself."""
    if check_tp(tp) == 1:
        return cost
    shrink = 1 / (tp * rule.efficiency(tp))
    share = rule.fixed_share

    def fixed_part(seconds: float) -> float:
        return seconds * (share + (1 - share) * shrink)

    latency, bandwidth = rule.link(tp)
    collectives = 2 * model.layers
    fixed = collectives * latency
    per_token = collectives * model.hidden_size * model.dtype_bytes / bandwidth
    return dataclasses.replace(
        cost,
        prefill_pass_overhead=fixed_part(cost.prefill_pass_overhead) + fixed,
        prefill_per_token=cost.prefill_per_token * shrink + per_token,
        prefill_per_pair=cost.prefill_per_pair * shrink,
        decode_step_base=fixed_part(cost.decode_step_base) + fixed + per_token,
        decode_per_seq=cost.decode_per_seq * shrink + per_token,
        decode_per_kv_token=cost.decode_per_kv_token * shrink,
    )
