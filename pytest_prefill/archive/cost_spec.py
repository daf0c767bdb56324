"""The one way a cost spec is resolved, shared by the plugin (``--prefill-cost``) and every
command's ``--cost``: a preset name, a JSON file (a bare cost model, a calibration or an
archived run), ``archive`` (the latest calibration archived for this machine) or ``measure``
(calibrate now: the caller measures, since only it knows the model and the device).
Standard library only."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Collection, Mapping
from typing import Any

from pytest_prefill._io import read_json
from pytest_prefill.archive import runs as archive
from pytest_prefill.plan.advice import STAR_CONTEXTS, Trust, star_contexts
from pytest_prefill.plan.cost_document import load_cost, trust_in
from pytest_prefill.sim import PRESETS, CostModel

COST_WORDS = ("archive", "measure")
KINDS = ("preset", "file", "archive", "measure", "derived")  # derived: from --gpu and --model


def _ignore(_: str) -> None:
    pass


@dataclasses.dataclass(frozen=True)
class CostSpec:
    """A resolved cost spec. ``cost`` is None for ``measure`` (known once calibrated);
    ``source`` is the line that says where the numbers come from, ``label`` its short form;
    ``refused`` names the constants the calibration behind it refused (they are 0 in ``cost``
    and the recommendation must know); ``contexts`` where C* is reported (within the measured
    model's context), as the calibration itself reports it."""

    spec: str
    kind: str
    cost: CostModel | None
    source: str
    label: str
    refused: tuple[str, ...] = ()
    contexts: tuple[int, ...] = STAR_CONTEXTS
    trust: Trust | None = None  # the calibration's trust figures (None: not measured)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.cost is None and self.kind != "measure":
            raise ValueError(f"a {self.kind} cost spec needs a cost model")

    def measured(
        self,
        cost: CostModel,
        source: str,
        refused: Collection[str] = (),
        contexts: tuple[int, ...] = STAR_CONTEXTS,
        trust: Trust | None = None,
    ) -> CostSpec:
        """This ``measure`` spec once the calibration is known."""
        return dataclasses.replace(
            self, cost=cost, source=source, refused=tuple(refused), contexts=contexts, trust=trust
        )


def refusals_in(document: Any) -> tuple[str, ...]:
    """The constants refused by the calibration inside a parsed calibration or run document
    (empty for a bare cost model or anything unreadable)."""
    if not isinstance(document, Mapping):
        return ()
    calibration = document.get("calibration", document)
    refusals = calibration.get("refusals") if isinstance(calibration, Mapping) else None
    if not isinstance(refusals, list):
        return ()
    return tuple(
        sorted(
            {
                r["constant"]
                for r in refusals
                if isinstance(r, Mapping) and isinstance(r.get("constant"), str)
            }
        )
    )


def contexts_in(document: Any) -> tuple[int, ...]:
    """Where C* is reported for the calibration inside a parsed calibration or run document:
    ``advice.STAR_CONTEXTS`` within its model's context (all of them when it does not say)."""
    calibration = document.get("calibration", document) if isinstance(document, Mapping) else None
    provenance = calibration.get("provenance") if isinstance(calibration, Mapping) else None
    limit = provenance.get("max_context") if isinstance(provenance, Mapping) else None
    valid = isinstance(limit, int) and not isinstance(limit, bool) and limit > 0
    return star_contexts(limit if valid else None)


def _basis_in_file(path: str) -> tuple[tuple[str, ...], tuple[int, ...], Trust | None]:
    """(refusals, contexts, trust) of a cost file's calibration."""
    try:
        document = read_json(path, "cost file")  # a compressed run file (.json.gz) too
    except (OSError, ValueError, RecursionError):
        # load_cost has read it already; a second read failing is not an answer
        return (), STAR_CONTEXTS, None
    return refusals_in(document), contexts_in(document), trust_in(document)


def resolve_cost(
    spec: str,
    *,
    results: str | os.PathLike[str] | None = None,
    machine: str | None = None,
    base: str | os.PathLike[str] | None = None,
    warn: archive.Warn = _ignore,
) -> CostSpec:
    """Resolve ``spec``.

    Args:
        results, machine: the archive and machine key that ``archive`` looks in.
        base: the folder a relative file path is taken from (default: the current directory).
        warn: told about each archive file skipped on the way (corrupt, foreign).

    Raises:
        ValueError: naming the spec and listing the presets and words, for an unknown name, a
            missing or unreadable file, or ``archive`` with nothing archived for ``machine``.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(
            f"cost must be a preset ({', '.join(PRESETS)}), a JSON path, or one of the words "
            f"{', '.join(COST_WORDS)}; got {spec!r}"
        )
    if spec == "measure":
        return CostSpec(
            spec,
            "measure",
            None,
            "measured now (calibrated when first needed)",
            "measure (calibrated once)",
        )
    if spec == "archive":
        if results is None or machine is None:
            raise ValueError("cost 'archive' needs a results folder and a machine key")
        cost, run = archive.archived_cost(results, machine, warn=warn)
        created = run.data.get("created", "undated")
        return CostSpec(
            spec,
            "archive",
            cost,
            f"archived calibration {run.path} ({created})",
            f"archive {run.path.name}",
            refusals_in(run.data),
            contexts_in(run.data),
            trust_in(run.data),
        )
    if spec in PRESETS:
        cost, source = load_cost(spec)
        return CostSpec(spec, "preset", cost, source, f"preset {spec} (not measured here)")
    looks_like_path = spec.endswith(".json") or os.sep in spec
    relative = base is not None and looks_like_path and not os.path.isabs(spec)
    path = os.path.join(base, spec) if relative else spec  # type: ignore[arg-type]
    try:
        cost, source = load_cost(path)
    except ValueError as err:
        if os.path.lexists(path):  # a file that is there and bad: the words are no help
            raise
        raise ValueError(f"{err} (or one of the words {', '.join(COST_WORDS)})") from None
    refused, contexts, trust = _basis_in_file(path)
    return CostSpec(spec, "file", cost, source, f"file {path}", refused, contexts, trust)
