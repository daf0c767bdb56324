"""The question the capacity searches answer, named once: serve a workload on a device's cost
model under an engine, within an SLO for a share of its requests; and how a search runs
(which shortcuts, on which executor, told progress to whom). Both
:func:`~pytest_prefill.plan.capacity.capacity` (the highest rate on N devices) and
:func:`~pytest_prefill.plan.sizing.devices_needed` (the fewest devices at the workload's own rate)
take one. Standard library only."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Sequence

from pytest_prefill.plan.metrics import SLO
from pytest_prefill.plan.search_loop import ALL_SHORTCUTS, Shortcuts
from pytest_prefill.plan.workloads import Workload
from pytest_prefill.sim import CostModel, EngineProfile, Request, simulated_engine

DEFAULT_TARGET = 0.9  # DistServe's attainment target
Progress = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class ServingQuestion:
    """Serve ``workload`` (a :class:`~pytest_prefill.plan.workloads.Workload` names itself) on
    a device whose cost model is ``cost``, under ``engine`` (a name from
    :data:`~pytest_prefill.sim.PROFILES` or an :class:`~pytest_prefill.sim.EngineProfile`;
    default ``"lab"``, the lab's loop), with at least ``target`` of the requests within
    ``slo``. A search answering it takes the ``shortcuts`` that save simulations (default all:
    :mod:`~pytest_prefill.plan.search_loop`; the answer is the same without them), runs its
    simulations on ``executor`` (None: the search's default) and calls ``progress`` with a line
    per step.

    Raises:
        ValueError: naming the field, for a cost that is not a CostModel, an SLO that is not an
            SLO, or a target outside (0, 1].
    """

    workload: Workload | Sequence[Request]
    cost: CostModel
    slo: SLO
    target: float = DEFAULT_TARGET
    engine: str | EngineProfile = "lab"
    shortcuts: Shortcuts = ALL_SHORTCUTS
    executor: concurrent.futures.Executor | None = None
    progress: Progress | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.cost, CostModel):
            raise ValueError(f"cost must be a CostModel, got {type(self.cost).__name__}")
        if not isinstance(self.slo, SLO):
            raise ValueError(
                f"slo must be an SLO (SLO.parse('ttft:1s,tpot:100ms')), got {self.slo!r}"
            )
        target = self.target
        number = isinstance(target, (int, float)) and not isinstance(target, bool)
        if not (number and 0 < target <= 1):
            raise ValueError(f"target attainment must be in (0, 1], got {target!r}")

    def requests(self) -> tuple[tuple[Request, ...], str, str | None]:
        """The workload's requests, description and attribution (:func:`workload_requests`)."""
        return workload_requests(self.workload)

    def profile(self) -> EngineProfile:
        """The engine profile the simulations run under, with the workload's prefix blocks
        (:func:`engine_for_workload`).

        Raises:
            ValueError: for an engine the simulator does not know, or a block size it refuses.
        """
        return engine_for_workload(simulated_engine(self.engine), self.workload)


def engine_for_workload(
    profile: EngineProfile, workload: Workload | Sequence[Request]
) -> EngineProfile:
    """``profile`` with a prefix cache on, its blocks the size a trace's hash ids name
    (:attr:`Workload.prefix_block_tokens`: Mooncake's 512); else ``profile`` as it is.

    Raises:
        ValueError: when the simulator refuses that block size under the profile.
    """
    block = workload.prefix_block_tokens if isinstance(workload, Workload) else None
    if not profile.prefix_caching or block is None or block == profile.prefix_block_tokens:
        return profile
    return simulated_engine(dataclasses.replace(profile, prefix_block_tokens=block))


def workload_requests(
    workload: Workload | Sequence[Request],
) -> tuple[tuple[Request, ...], str, str | None]:
    """The requests, the description and the attribution of ``workload``.

    Raises:
        ValueError: for no request, something that is not a Request, or arrivals all at once
            (no arrival rate to scale).
    """
    if isinstance(workload, Workload):
        load, name, attribution = workload.requests, workload.description, workload.attribution
    else:
        load, name, attribution = tuple(workload), f"{len(workload)} requests", None
    if not load:
        raise ValueError("workload has no request: a search needs at least two arrivals")
    if not all(isinstance(r, Request) for r in load):
        raise ValueError("workload must be a Workload or a sequence of Request")
    arrivals = [r.arrival for r in load]
    if max(arrivals) == min(arrivals):
        raise ValueError("workload's requests all arrive at once: it has no arrival rate to scale")
    return load, name, attribution
