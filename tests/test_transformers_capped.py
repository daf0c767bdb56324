"""``transformers serve`` under a sequence cap: its CLI has no flag for the scheduler's
``max_requests_per_batch``, so a flag set with ``seqs`` runs the same CLI through
``serve/launch/transformers_capped.py``, which sets that field's default. Asserted here without a
server: the command a launcher builds, the cap read back as the server's fact, the cap reaching
``ContinuousBatchingConfig``, bad usage refused. That the server then runs no more than the cap
at once is asserted against a real one in ``test_serve_verify.py``."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from pytest_prefill.serve.client.identity import ServerIdentity, server_facts
from pytest_prefill.serve.launch import transformers_capped
from pytest_prefill.serve.launch.launchers import Launcher
from pytest_prefill.serve.launch.process import transformers_serve

pytestmark = pytest.mark.sim  # no server, no hardware (the last test imports transformers)

HAS_CLI = bool(
    shutil.which("transformers", path=str(Path(sys.executable).parent))
    or shutil.which("transformers")
)


@pytest.mark.skipif(
    not HAS_CLI, reason="no transformers command: pip install 'transformers[serving]'"
)
def test_a_seq_cap_runs_the_same_cli_through_the_cap_script_and_reads_back(tmp_path):
    launcher = Launcher("transformers", str(tmp_path), kv_blocks=16)
    capped, _ = launcher.command(128, 3, 8000)
    plain, _ = launcher.command(128, None, 8000)
    assert capped[1] == "-I" and Path(capped[2]).name == "transformers_capped.py"
    assert capped[3:5] == ["--max-requests-per-batch", "3"]
    assert capped[5:] == plain[1:]  # the CLI's own arguments, unchanged
    assert "--max-requests-per-batch" not in plain

    def facts(argv):
        identity = ServerIdentity("http://x", ("m",), "transformers", "given", None, " ".join(argv))
        return server_facts(identity)

    assert facts(capped).max_seqs == 3 and facts(plain).max_seqs is None
    assert facts(capped).kv_capacity_tokens == facts(plain).kv_capacity_tokens == 16 * 256


@pytest.mark.parametrize("cap", [0, -1])
def test_a_cap_under_one_is_refused_by_name(cap):
    with pytest.raises(ValueError, match="max_requests"):
        transformers_serve("m", 8000, max_requests=cap)


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["serve"],
        ["--max-requests-per-batch"],
        ["--max-requests-per-batch", "0", "serve"],
        ["--max-requests-per-batch", "two", "serve"],
    ],
)
def test_the_cap_script_refuses_bad_usage_naming_its_flag(argv, capsys):
    assert transformers_capped.main(argv) == 2
    assert "--max-requests-per-batch" in capsys.readouterr().err


def test_the_cap_becomes_the_configs_default_and_a_given_value_stands(monkeypatch):
    transformers = pytest.importorskip("transformers")
    cli = pytest.importorskip("transformers.cli.transformers")
    config = transformers.ContinuousBatchingConfig
    monkeypatch.setattr(config, "__init__", config.__init__)  # restored after the test
    seen = {}

    def fake_cli():
        seen["argv"] = list(sys.argv)
        seen["default"] = config(max_batch_tokens=64).max_requests_per_batch
        seen["given"] = config(max_requests_per_batch=7).max_requests_per_batch
        return 0

    monkeypatch.setattr(cli, "main", fake_cli)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    assert transformers_capped.main(["--max-requests-per-batch", "3", "serve", "m"]) == 0
    assert seen == {"argv": ["transformers", "serve", "m"], "default": 3, "given": 7}
