"""What the plugin's fixtures hand a test: the simulator and the capacity search bound to the
session's cost model and engine profile, and the report a test adds tables and verdicts to."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from pytest_prefill.sim import CostModel, Trace, simulate

__all__ = ["CapacitySearch", "PrefillReport", "Scheduler"]


class Scheduler:
    """:func:`~pytest_prefill.sim.simulate` bound to a cost model and an engine profile
    (``--prefill-engine``; a call's own ``engine=`` wins): ``prefill_scheduler("chunked", load,
    chunk=256)``."""

    def __init__(self, cost: CostModel, engine: str = "vllm") -> None:
        self.cost, self.engine = cost, engine

    def __call__(self, policy: str, load: Sequence[Any], **options: Any) -> Trace:
        options.setdefault("engine", self.engine)
        return simulate(policy, load, self.cost, **options)

    def __repr__(self) -> str:
        return f"Scheduler({self.cost!r}, engine={self.engine!r})"


class PrefillReport:
    """Adds tables and verdicts to the run's report (terminal summary and archive)."""

    def __init__(
        self,
        record: Callable[[dict[str, Any]], None],
        test: str,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self._record = record
        self._say = say
        self.test = test

    def say(self, text: str) -> None:
        """Show ``text`` on the terminal now, around output capture (serial runs; under xdist
        workers have no terminal and it is dropped: record what matters as a table)."""
        if self._say is not None:
            for line in str(text).splitlines() or [""]:
                self._say(line)

    def table(self, title: str, text: str, data: Any = None) -> None:
        """A formatted table under ``title``; ``data`` (JSON-able) goes into the archive."""
        from pytest_prefill.report.verdicts import Table

        self._record({"kind": "table", **Table(title, text, data, self.test).to_dict()})

    def verdict(
        self,
        name: str,
        verdict: str,
        sentence: str,
        detail: str | None = None,
        *,
        asserted: bool | None = None,
    ) -> None:
        """HOLDS or FAILS for the claim ``sentence`` (printed with it in the summary).
        ``asserted=False`` says the test does not assert it: the summary prints it under
        "reported, not asserted:", as it does a FAILS in a test that passed."""
        from pytest_prefill.report.verdicts import Verdict

        entry = Verdict(name, verdict, sentence, detail, self.test, asserted).to_dict()
        self._record({"kind": "verdict", **entry})


class CapacitySearch:
    """:func:`~pytest_prefill.plan.capacity.capacity` bound to the session's cost model, each search
    added to the run's report (its table in the summary, the whole search in the archive):
    ``prefill_capacity(load, "ttft:1s,tpot:100ms", 4)``. Simulations run in the test's process unless
    ``workers=N`` (a process pool) or ``executor=`` says otherwise; under the engine profile
    of ``--prefill-engine`` unless ``engine=`` says otherwise. Keywords: the fields of
    :class:`~pytest_prefill.plan.question.ServingQuestion` (``target``, ``engine``, ...) and
    :func:`~pytest_prefill.plan.capacity.capacity`'s own (``deployments``, ``tolerance``, ...)."""

    def __init__(
        self,
        cost: CostModel,
        report: PrefillReport,
        cost_label: str,
        engine: str = "vllm",
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.cost, self.report, self.cost_label, self.engine = cost, report, cost_label, engine
        self.progress = progress  # a long search's progress lines: with -v only (not amid dots)

    def __call__(
        self,
        workload: Any,
        slo: Any,
        devices: int,
        *,
        title: str | None = None,
        workers: int = 1,
        **options: Any,
    ) -> Any:
        from pytest_prefill.plan.capacity import capacity
        from pytest_prefill.plan.executors import local_executor
        from pytest_prefill.plan.metrics import SLO
        from pytest_prefill.plan.question import ServingQuestion
        from pytest_prefill.report.capacity import capacity_document, capacity_text

        slo = SLO.parse(slo) if isinstance(slo, str) else slo
        with contextlib.ExitStack() as stack:
            if "executor" not in options:
                options["executor"] = stack.enter_context(local_executor(workers))
            options.setdefault("progress", self.progress)
            options.setdefault("engine", self.engine)
            fields = {f.name for f in dataclasses.fields(ServingQuestion)}
            asked = {k: options.pop(k) for k in list(options) if k in fields}
            question = ServingQuestion(workload, self.cost, slo, **asked)
            result = capacity(question, devices, **options)
        self.report.table(
            title or f"Capacity: {slo} on {devices} device(s); {result.workload}",
            capacity_text(result, self.cost_label),
            capacity_document(result, self.cost_label),
        )
        return result

    def __repr__(self) -> str:
        return f"CapacitySearch({self.cost!r})"
