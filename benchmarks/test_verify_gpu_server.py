"""``verify --gpu cpu --model tiny`` on a real `transformers serve`: the knee predicted from the
compute derived for the `tiny` preset on this CPU (its probe, and the host cost `small`'s server
calibration implies: a transfer, as ``--host-from`` carries it), then measured by probes on a
server launched serving `tiny` — the derived compute tested on a real server, nothing calibrated
on `tiny`. Reported, never asserted: the predicted and measured knees and their ratio. Minutes
long, so it runs only when PREFILL_VERIFY_GPU names a folder: `small`'s model, the CPU probe and
its calibration are read from there when present (as benchmarks/test_compute_server_transfer.py
writes them), else made and measured there. Skipped without the serve extra. One command
(about 2 minutes on this 2-core box, busy; 1.5 with `small`'s calibration already there):

    PREFILL_VERIFY_GPU=/tmp/verify-gpu python -m pytest -s -n 0 -p no:cacheprovider \\
        benchmarks/test_verify_gpu_server.py
"""

from __future__ import annotations

import os

import pytest

from benchmarks.test_compute_server_transfer import BUDGET, _calibrated, server_folder

pytestmark = pytest.mark.server

SLO = "ttft:1s,tpot:150ms"
WORKLOAD = ["--workload", "poisson", "--num-prompts", "300", "--request-rate", "2"]
LENGTHS = ["--random-input-len", "192", "--random-output-len", "16"]
PROBES = ["--margin", "0.1", "--max-probes", "7", "--max-probe-seconds", "20", "--ignore-steal"]


def test_verify_predicts_tinys_knee_from_derived_compute():
    folder = server_folder("PREFILL_VERIFY_GPU", "verify --gpu on a real server")
    from pytest_prefill.cli import main
    from pytest_prefill.serve.launch.model_folder import make_model
    from pytest_prefill.verify.result import read_verify

    small = _calibrated(folder, "small")  # the CPU's probe and the host cost, carried
    tiny = os.path.join(folder, "tiny")
    if not os.path.isdir(tiny):
        make_model("tiny", tiny)
    out = os.path.join(folder, "verify-tiny.json")
    argv = ["verify", "--launch", "transformers", "--model", tiny]
    argv += ["--gpu", "cpu", "--host-from", small, "--flags", f"tokens={BUDGET}", "--slo", SLO]
    status = main([*argv, *WORKLOAD, *LENGTHS, *PROBES, "--json", out, "--force"])
    result = read_verify(out)
    assert result.derived is not None  # predicted from derived compute, nothing calibrated
    (flag_set,) = result.results
    assert flag_set.calibration is None and flag_set.load_check is None
    judged, measured = flag_set.agreement, flag_set.measured
    assert measured is not None and flag_set.predicted is not None
    verdict = f"[{judged.low:.3g}, {judged.high:.3g}] {judged.verdict}" if judged else "not judged"
    print(
        f"\nexit status {status}; predicted {flag_set.predicted.rate:.3g} req/s, measured "
        f"{measured.knee:.3g} ({measured.status}); predicted/measured {verdict}"
    )
