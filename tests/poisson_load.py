"""A small Poisson workload for the verify and knee-sizing tests: ``n`` requests arriving at
``rate`` a second (seed 3), prompts cycling ``prompt`` .. ``prompt + 48``, ``output`` tokens out."""

from __future__ import annotations

import random

from pytest_prefill.sim import Request


def poisson_load(n: int, rate: float, prompt: int = 64, output: int = 8) -> list[Request]:
    rng, t, load = random.Random(3), 0.0, []
    for i in range(n):
        load.append(Request(f"r{i}", t, prompt + 16 * (i % 4), output))
        t += rng.expovariate(rate)
    return load
