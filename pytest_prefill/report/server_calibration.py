"""A calibration from a running server, for a person: the calibration's own tables (TTFTs alone
with their fitted and held-out values, decode steps, fused iterations, the constants and
refusals), then what only a server has: the request's overhead kept apart from the cost model,
and the chunking its long prompts showed against the stated budget."""

from __future__ import annotations

from pytest_prefill.report.calibration import calibration_report
from pytest_prefill.serve.calibration.server_calibration import ServerCalibration
from pytest_prefill.units import ms


def overhead_lines(result: ServerCalibration) -> list[str]:
    o = result.overhead
    way_in = "not read" if o.to_engine != o.to_engine else f"{ms(o.to_engine)} ms"
    return [
        f"Request overhead (kept apart from the cost model): {ms(o.total)} ms a request alone "
        f"({o.how}); the way in, beside live streams: {way_in}; network round trip "
        f"(GET /v1/models): {ms(o.round_trip)} ms.",
        f"  A simulation adds {ms(o.arrival_delay)} ms to each arrival and {ms(o.from_engine)} ms "
        "to each token.",
    ]


def chunking_lines(result: ServerCalibration) -> list[str]:
    budget = result.sweep.budget
    lines = [f"Chunking (budget {budget:,} tokens an iteration, decode rows first):"]
    for c in result.chunking:
        verdict = (
            "as the budget says" if c.agrees else "NOT as the budget says: check the server's flags"
        )
        lines.append(
            f"  a {c.prompt_len:,}-token prompt amid {c.rows} streams: {c.seen:g} slow "
            f"iterations seen, {c.expected} expected -> {verdict}"
        )
    return lines


def profile_lines(result: ServerCalibration) -> list[str]:
    """The engine profile the server is simulated with, when the calibration recorded one."""
    profile = result.calibration.provenance.get("engine_profile")
    if not isinstance(profile, dict):
        return []
    changed = ", ".join(profile.get("changed") or ()) or "none"
    return [
        f"Simulate this server with engine profile {profile.get('engine')!r} (first token at "
        f"{profile.get('first_token')}, budget {profile.get('max_batched_tokens')}, sequence cap "
        f"{profile.get('max_seqs')}; changed from the profile: {changed})."
    ]


def server_calibration_report(result: ServerCalibration) -> str:
    return "\n".join(
        [
            calibration_report(result.calibration),
            "",
            "Prefill rows are each prompt's TTFT alone over HTTP: the request's overhead plus "
            "ceil(P / budget) passes.",
            *overhead_lines(result),
            *chunking_lines(result),
            *profile_lines(result),
        ]
    )
