"""The lab's scenario under each policy, as the plain-text table ``python path/to/sim`` prints."""

from __future__ import annotations

from .policies import POLICIES
from .presets import PRESETS
from .requests import Request
from .simulation import simulate


def lab_table() -> str:
    """The lab's scenario under each policy, as a plain-text table."""
    preset = PRESETS["lab-laptop"]
    cost = preset.cost
    streams = [Request(f"live{i}", 0.0, 128, 256) for i in range(2)]
    load = [*streams, Request("long", 0.1, 2048, 32)]
    chunk = max(1, round(cost.chunk_star()))
    rows = [("policy", "TTFT long (ms)", "max stall (ms)", "GPU-s", "makespan (s)")]
    for policy in POLICIES:
        trace = simulate(policy, load, cost, chunk=chunk)
        s = trace.summary()
        rows.append(
            (
                policy + (f" (chunk {chunk})" if policy == "chunked" else ""),
                f"{trace.requests['long'].ttft * 1e3:.1f}",
                f"{s.max_stall * 1e3:.1f}",
                f"{s.gpu_seconds:.3f}",
                f"{s.makespan:.3f}",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.rjust(w) if j else cell.ljust(w) for j, (cell, w) in enumerate(zip(row, widths))
        )
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    head = (
        f"Lab scenario: 2 live streams decoding, a 2048-token prompt arrives at 100 ms.\n"
        f"Cost model: preset '{preset.name}' ({preset.source})\n"
        f"C* = {cost.chunk_star():.0f} tokens\n"
    )
    return head + "\n".join(lines)
