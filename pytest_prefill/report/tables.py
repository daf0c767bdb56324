"""Tables a person can read (tabulate), built from the simulator's and the calibrator's
results. Times are printed in milliseconds; every table says where its numbers come from."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from tabulate import tabulate

from pytest_prefill import units
from pytest_prefill.archive.runs import RunSummary, json_safe
from pytest_prefill.plan.advice import (
    STAR_CONTEXTS,
    TYPICAL_PROMPT,
    choose_chunk,
    recommend,
    star_text,
    typical_star,
)
from pytest_prefill.plan.sweep import SweepRow
from pytest_prefill.plan.workloads import lab_scenario
from pytest_prefill.scheduler import CostModel, Trace, simulate


def ms(seconds: float) -> str:
    """Seconds as milliseconds for a table cell, one decimal ("-" when not finite)."""
    return units.ms(seconds, 1)


def times(ratio: float) -> str:
    return "-" if math.isnan(ratio) else f"{ratio:.2f}x"


SWEEP_HEADERS = (
    "policy",
    "chunk",
    "TTFT p99 ms",
    "max stall ms",
    "TTFT cost",
    "stall gain",
    "GPU-s",
)


def sweep_table(rows: Sequence[SweepRow]) -> str:
    """The chunk sweep: one row per policy/chunk, shared first (the baseline of the ratios)."""
    body = [
        (
            r.policy,
            r.chunk if r.chunk is not None else "-",
            ms(r.summary.ttft_p99),
            ms(r.summary.max_stall),
            times(r.ttft_cost),
            times(r.stall_gain),
            f"{r.summary.gpu_seconds:.3f}",
        )
        for r in rows
    ]
    return tabulate(
        body,
        headers=SWEEP_HEADERS,
        tablefmt="simple",
        disable_numparse=True,
        colalign=("left",) + ("right",) * (len(SWEEP_HEADERS) - 1),
    )


def sweep_rows_json(rows: Sequence[SweepRow]) -> list[dict[str, object]]:
    """The sweep as JSON-safe dicts (NaN becomes null)."""

    def clean(value: float) -> float | None:
        return None if isinstance(value, float) and not math.isfinite(value) else value

    return [
        {
            "policy": r.policy,
            "chunk": r.chunk,
            "ttft_cost": clean(r.ttft_cost),
            "stall_gain": clean(r.stall_gain),
            **{k: clean(v) for k, v in r.summary.as_dict().items()},
        }
        for r in rows
    ]


# --- what a run reports: tables and verdicts, as the plugin's summary and archive hold them ---

VERDICTS = ("HOLDS", "FAILS")


def _text_field(field: str, value: object, *, allow_empty: bool = False) -> str:
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        raise ValueError(f"{field} must be a non-empty string, got {value!r}")
    return value


def _field(data: Mapping[str, Any], key: str) -> Any:
    """A field of an archived entry, unchecked (the constructor checks it)."""
    return data.get(key)


@dataclasses.dataclass(frozen=True, slots=True)
class Table:
    """A titled, already formatted table; ``data`` is its JSON form for the archive (or None);
    ``test`` is the node id of the test that produced it."""

    title: str
    text: str
    data: Any = None
    test: str = ""

    def __post_init__(self) -> None:
        _text_field("title", self.title)
        _text_field("text", self.text)
        object.__setattr__(self, "data", json_safe(self.data, f"table {self.title!r} data"))

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "text": self.text, "data": self.data, "test": self.test}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Table:
        return cls(
            _field(data, "title"),
            _field(data, "text"),
            _field(data, "data"),
            _field(data, "test") or "",
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """A falsifiable claim's outcome: HOLDS or FAILS, with the sentence it was judged against."""

    name: str
    verdict: str
    sentence: str
    detail: str | None = None
    test: str = ""

    def __post_init__(self) -> None:
        _text_field("name", self.name)
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}, got {self.verdict!r}")
        _text_field("sentence", self.sentence)
        if self.detail is not None:
            _text_field("detail", self.detail, allow_empty=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "verdict": self.verdict,
            "sentence": self.sentence,
            "detail": self.detail,
            "test": self.test,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verdict:
        return cls(
            _field(data, "name"),
            _field(data, "verdict"),
            _field(data, "sentence"),
            _field(data, "detail"),
            _field(data, "test") or "",
        )


def verdict_block(
    cost: CostModel | None,
    cost_line: str,
    verdicts: Sequence[Verdict],
    refused: Collection[str] = (),
    contexts: Sequence[int] = STAR_CONTEXTS,
) -> list[str]:
    """The short block a run's summary opens with: the cost model its tables used, C* and
    the recommendation (the one rule's words), and one line per verdict (its detail's first
    line: the falsifier's gaps, the fidelity's median error)."""
    lines = [f"cost model: {cost_line}"]
    if cost is not None:
        advice = recommend(cost, refused, contexts)
        typical = typical_star(cost)
        at = (
            ""
            if typical == advice.chunk_star
            else f" ({star_text(typical)} at {TYPICAL_PROMPT:,} of context)"
        )
        lines += [
            f"C* = {star_text(advice.chunk_star)} tokens{at}; pass overhead is "
            f"{advice.overhead_fraction:.0%} of one decode step",
            advice.line,
            *advice.warnings,
        ]
    for v in verdicts:
        detail = (v.detail or "").strip()
        text = detail.splitlines()[0] if detail else v.sentence
        for prefix in ("HOLDS: ", "FAILS: "):
            text = text.removeprefix(prefix)
        lines.append(f"{v.verdict}  {v.name}: {text}")
    return lines


def summary_lines(tables: Sequence[Table], verdicts: Sequence[Verdict]) -> list[str]:
    """The tables, then every verdict with its sentence, as lines for a terminal."""
    lines: list[str] = []
    for table in tables:
        heading = f"{table.title}  [{table.test}]" if table.test else table.title
        lines += [heading, "-" * min(len(heading), 100), *table.text.rstrip().splitlines(), ""]
    if verdicts:
        lines.append("Verdicts:")
        for v in verdicts:
            lines.append(f"  {v.verdict}  {v.name}: {v.sentence}")
            if v.detail:
                lines += [f"         {line}" for line in v.detail.rstrip().splitlines()]
    return lines


@dataclasses.dataclass(frozen=True)
class LabTimeline:
    """The lab scenario simulated under shared, chunked and disaggregated serving, with the
    chunk the one rule picks (:func:`advice.choose_chunk`) and a title that names the cost
    model. What both the archive's timeline and ``prefill-bench timeline`` draw."""

    traces: tuple[Trace, ...]
    chunk: int
    how: str  # why the chunk is what it is
    title: str


def lab_timeline(
    cost: CostModel,
    origin: str,
    *,
    streams: int = 2,
    prompt_len: int = 2048,
    arrival: float = 0.1,
    chunk: int | None = None,
    refused: Collection[str] = (),
) -> LabTimeline:
    """``streams`` live streams decoding and a ``prompt_len`` prompt (id "long") arriving at
    ``arrival`` seconds, under the three designs; ``chunk`` None means the one chunk rule."""
    load = lab_scenario(streams=streams, prompt_len=prompt_len, arrival=arrival)
    if chunk is None:
        chosen = choose_chunk(cost, prompt_len, refused)
        chunk, how = chosen.chunk, chosen.how
    else:
        how = "given"
    traces = (
        simulate("shared", load, cost),
        simulate("chunked", load, cost, chunk=chunk),
        simulate("disaggregated", load, cost),
    )
    title = (
        f"{streams} live stream{'s' * (streams != 1)} decoding; a "
        f'{prompt_len:,}-token prompt ("long") arrives at {arrival * 1e3:,.0f} ms. '
        f"Chunk {chunk:,} ({how}). Simulated from a cost model, not measured.\n"
        f"Cost model: {origin}"
    )
    return LabTimeline(traces, chunk, how, title)


def lab_timeline_svg(
    cost: CostModel,
    origin: str,
    *,
    prompt_len: int = 2048,
    max_bars: int = 150,
    refused: Collection[str] = (),
) -> str:
    """:func:`lab_timeline` as an SVG around the prompt (at most ``max_bars`` bars per policy,
    so a tiny chunk cannot make it megabytes)."""
    from pytest_prefill.report.timeline import focus_window, render_svg

    drawn = lab_timeline(cost, origin, prompt_len=prompt_len, refused=refused)
    window = focus_window(drawn.traces, "long")
    return render_svg(drawn.traces, window=window, max_bars=max_bars, title=drawn.title)


# Links for the KV-transfer table: stated assumptions, never measurements.
ASSUMED_LINKS = (("PCIe 4.0 x16", 25e9), ("NVLink-class", 300e9))


def kv_size_table(
    kv_bytes_per_token: float,
    prompt_lens: Sequence[int],
    links: Sequence[tuple[str, float]] = ASSUMED_LINKS,
) -> str:
    """KV cache size per prompt and its transfer time over each (assumed) link bandwidth."""
    headers = (
        "prompt tokens",
        "KV MiB",
        *(f"{name} ms (assumed {bw / 1e9:g} GB/s)" for name, bw in links),
    )
    body = [
        (
            f"{n:,}",
            f"{n * kv_bytes_per_token / 2**20:,.1f}",
            *(ms(n * kv_bytes_per_token / bw) for _, bw in links),
        )
        for n in prompt_lens
    ]
    return tabulate(
        body,
        headers=headers,
        tablefmt="simple",
        disable_numparse=True,
        colalign=("right",) * len(headers),
    )


def runs_table(summaries: Sequence[RunSummary]) -> str:
    """Archived runs, oldest first: id (what ``compare`` takes), date, commit, what made it,
    C* and the recommendation of its calibration, its verdicts."""
    body = [
        (
            r.id,
            r.created,
            r.commit,
            r.made_by if len(r.made_by) <= 48 else r.made_by[:47] + "…",
            "-" if r.chunk_star is None else star_text(r.chunk_star),
            r.recommendation or "-",
            ", ".join(f"{name} {verdict}" for name, verdict in r.verdicts) or "-",
            r.tables,
        )
        for r in summaries
    ]
    headers = ("id", "created", "commit", "made by", "C*", "recommendation", "verdicts", "tables")
    return tabulate(body, headers=headers, tablefmt="simple", disable_numparse=True)
