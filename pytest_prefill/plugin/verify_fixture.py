"""The ``prefill_verify`` fixture: :func:`~pytest_prefill.verify.verification.verify` on the server
``--prefill-server`` names (one flag set: the one it runs) or under a launcher
(``serve.launch.launchers.Launcher``: restarted under each flag set), its table and the ranking's
verdict added to the run's report. Imports nothing heavy until called."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_prefill.plugin.session import state_of


class Verifier:
    """``prefill_verify(flags, load, slo, launcher=None, **options)``: ``flags`` are
    ``FlagSet`` values or their text (``"tokens=256,seqs=8"``), ``slo`` an ``SLO`` or its text;
    ``options`` are ``verify.verification.VerifyOptions``' fields (``rule``, ``sweep``,
    ``calibration``, ``calibrate_once``, ``workload``, ...). Returns the ``VerifyResult``."""

    def __init__(self, report: Any, url: str | None, verbose: bool = False) -> None:
        self.report, self.url, self.verbose = report, url, verbose

    def __call__(
        self,
        flags: Any,
        load: Any,
        slo: Any,
        *,
        launcher: Any = None,
        engine: str | None = None,
        tokenizer: str | None = None,
        title: str | None = None,
        **options: Any,
    ) -> Any:
        from pytest_prefill.plan.metrics import SLO
        from pytest_prefill.report.verify import ranking_line, verify_report
        from pytest_prefill.serve.client.wire import Url
        from pytest_prefill.verify.verification import FlagSet, Server, VerifyOptions, verify

        if launcher is None and self.url is None:
            pytest.skip("no server to verify on: give --prefill-server URL (or a launcher)")
        if launcher is None:
            assert self.url is not None
            server = Server(url=Url.parse(self.url), engine=engine, tokenizer=tokenizer)
        else:
            server = Server(launcher=launcher, engine=engine, tokenizer=tokenizer)
        flag_sets = [FlagSet.parse(f) if isinstance(f, str) else f for f in flags]
        slo = SLO.parse(slo) if isinstance(slo, str) else slo
        # progress only with -v, as the capacity fixture: quiet between the test dots otherwise
        options.setdefault("progress", self.report.say if self.verbose else None)
        result = verify(server, flag_sets, load, slo, VerifyOptions(**options))
        text = verify_report(result)
        self.report.table(title or f"verify: {slo}", text, result.to_dict())
        if result.best_verdict is not None:
            self.report.verdict("verify ranking", result.best_verdict, ranking_line(result))
        return result


@pytest.fixture
def prefill_verify(request: pytest.FixtureRequest, prefill_report: Any) -> Verifier:
    """Check flag sets' predicted knees on a server (see :class:`Verifier`)."""
    settings = state_of(request.config).settings
    return Verifier(prefill_report, settings.server, request.config.option.verbose > 0)
