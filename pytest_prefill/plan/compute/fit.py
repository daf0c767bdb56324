"""Least squares in relative error for the derived cost model's terms, standard library only: the
normal equations solved by Gaussian elimination, a term refused (recorded 0 with its reason)
when the data gives it no support — fitted negative, never exercised, or too small to see."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType

SUPPORT = 0.005  # a term under 0.5% of every sample's time is not supported by the data


@dataclasses.dataclass(frozen=True, slots=True)
class Fit:
    """Fitted ``coefficients`` by term (a refused term is 0 and in ``refused`` with its
    reason) and the largest relative error over the samples, ``|fit − y| ÷ y``."""

    coefficients: Mapping[str, float]
    refused: Mapping[str, str]
    max_relative_error: float
    median_relative_error: float


def solve(matrix: list[list[float]], vector: list[float]) -> list[float] | None:
    """``matrix · x = vector`` by Gaussian elimination with partial pivoting (None: singular)."""
    size = len(vector)
    rows = [[*matrix[i], vector[i]] for i in range(size)]
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(rows[r][col]))
        scale = max(abs(v) for row in rows for v in row[:-1]) or 1.0
        if abs(rows[pivot][col]) <= 1e-12 * scale:
            return None
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(col + 1, size):
            factor = rows[r][col] / rows[col][col]
            for c in range(col, size + 1):
                rows[r][c] -= factor * rows[col][c]
    out = [0.0] * size
    for r in range(size - 1, -1, -1):
        tail = sum(rows[r][c] * out[c] for c in range(r + 1, size))
        out[r] = (rows[r][size] - tail) / rows[r][r]
    return out


def _weighted_least_squares(
    columns: Sequence[Sequence[float]], targets: Sequence[float]
) -> list[float] | None:
    """Minimise ``Σ ((A·x − y) ÷ y)²``: each sample weighted by ``1 ÷ y²``, columns scaled to
    unit size for the solve."""
    scales = [max(abs(v) for v in col) or 1.0 for col in columns]
    scaled = [[v / s for v in col] for col, s in zip(columns, scales, strict=True)]
    weights = [1.0 / (y * y) for y in targets]
    normal = [
        [sum(w * a * b for w, a, b in zip(weights, ci, cj, strict=True)) for cj in scaled]
        for ci in scaled
    ]
    right = [sum(w * a * y for w, a, y in zip(weights, ci, targets, strict=True)) for ci in scaled]
    solved = solve(normal, right)
    return None if solved is None else [x / s for x, s in zip(solved, scales, strict=True)]


def fit_terms(
    features: Mapping[str, Sequence[float]], targets: Sequence[float], support: float = SUPPORT
) -> Fit:
    """Fit ``targets ≈ Σ coefficient[t] · features[t]`` in relative error, refusing terms one at
    a time: a feature that is 0 in every sample, then the most negative coefficient, then a
    term whose share of every sample is under ``support``.

    Raises:
        ValueError: for no samples, a target that is not positive and finite, a feature of
            the wrong length, or no term left.
    """
    if not targets or any(not (math.isfinite(y) and y > 0) for y in targets):
        raise ValueError("targets must be positive finite seconds, at least one")
    for name, values in features.items():
        if len(values) != len(targets):
            raise ValueError(f"feature {name}: {len(values)} values for {len(targets)} targets")
    refused: dict[str, str] = {}
    for name, values in features.items():
        if not any(values):
            refused[name] = "no synthetic pass exercises it"
    while True:
        active = [n for n in features if n not in refused]
        if not active:
            raise ValueError("every term was refused: the synthetic passes support none")
        coefficients = _weighted_least_squares([features[n] for n in active], targets)
        if coefficients is None:
            refused[active[-1]] = "not separable from the other terms over this range"
            continue
        fitted = dict(zip(active, coefficients, strict=True))
        negative = min(active, key=lambda n: fitted[n])
        if fitted[negative] < 0:
            refused[negative] = "fitted negative: the physics gives it no support over this range"
            continue
        share = {
            n: max(fitted[n] * v / y for v, y in zip(features[n], targets, strict=True))
            for n in active
        }
        small = min(active, key=lambda n: share[n])
        if len(active) > 1 and share[small] < support:
            refused[small] = f"under {support:.1%} of every synthetic pass over this range"
            continue
        break
    errors = sorted(
        abs(sum(fitted[n] * features[n][i] for n in active) - y) / y for i, y in enumerate(targets)
    )
    return Fit(
        MappingProxyType({n: fitted.get(n, 0.0) for n in features}),
        MappingProxyType(refused),
        errors[-1],
        errors[len(errors) // 2],
    )
