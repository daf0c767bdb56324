"""Offline, from verify documents (``prefill-bench verify --json``): the knee the simulator puts
each flag set at when it is given the server's own speed in the probes either side of the
measured knee (the geometric mean of their fitted factors), beside the knee it predicted.
Hindsight, not a prediction: it asks whether the scheduling model accounts for the knee once
the server's speed in those minutes is known.

    PYTHONPATH=. python scripts/verify_hindsight.py RUN.json --slo ttft:1s,tpot:150ms \\
        --workload azure-conv --max-model-len 8192 --lengths-divided-by 4:8

The SLO and workload options must be the run's own; the probe start and target come from the
document."""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import sys

from pytest_prefill.commands import verify as command
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.serve.calibration.server_model import ServerModel
from pytest_prefill.verify.knee import predict_knee
from pytest_prefill.verify.probe_rule import ProbeRule, probe_load
from pytest_prefill.verify.result import FlagSetResult, read_verify


def either_side(r: FlagSetResult) -> list[float]:
    """The fitted speeds of the probes either side of the measured knee."""
    m = r.measured
    if m is None:
        return []
    ends = [p for p in (m.low, m.high) if p is not None]
    return [
        s.estimate
        for probe, s in zip(m.probes, r.speeds)
        if any(probe is end for end in ends) and math.isfinite(s.estimate)
    ]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("document")
    command.add_arguments(parser)
    args = parser.parse_args(["--url", "http://unused", "--flags", "tokens=2", *argv])
    with contextlib.redirect_stdout(io.StringIO()):
        load, _, _ = command.workload_of(args)
    result = read_verify(args.document)
    slo = SLO.parse(args.slo) if args.slo else result.slo
    rule = ProbeRule(target=result.rule.target, start=result.rule.start)  # the run's own
    for r in result.results:
        label = r.flags.label
        speeds = either_side(r)
        if r.measured is None or r.predicted is None or r.calibration is None:
            print(f"{label}: no measured knee or no calibration")
            continue
        if not speeds or r.scheduling is None:
            print(f"{label}: no fitted speed either side of the knee")
            continue
        k = math.exp(sum(map(math.log, speeds)) / len(speeds))
        server_model = ServerModel.of(r.calibration, r.scheduling).scaled(k)
        requests = probe_load(load, rule, r.requests)
        at = predict_knee(requests, server_model, slo, rule.target).rate
        knee, predicted = r.measured.knee, r.predicted.rate
        print(
            f"{label}: predicted {predicted:.3g} ({predicted / knee:.2f} of the measured "
            f"{knee:.3g}); at the speed of the probes either side of it "
            f"(x{' and x'.join(f'{x:.2f}' for x in speeds)}: x{k:.2f}) the simulator puts it at "
            f"{at:.3g} ({at / knee:.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
