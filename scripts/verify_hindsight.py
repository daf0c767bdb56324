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
import json
import math
import sys

from pytest_prefill.commands import verify as command
from pytest_prefill.plan.metrics import SLO
from pytest_prefill.serve.calibration.server_calibration import ServerCalibration
from pytest_prefill.serve.calibration.server_model import (
    Scheduling,
    ServerModel,
    scaled_cost,
    server_profile,
)
from pytest_prefill.verify.knee import ProbeRule, predict_knee, probe_load


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("document")
    command.add_arguments(parser)
    args = parser.parse_args(["--url", "http://unused", "--flags", "tokens=2", *argv])
    with contextlib.redirect_stdout(io.StringIO()):
        load, _, _ = command._load(args)
    with open(args.document, encoding="utf-8") as f:
        document = json.load(f)
    slo = SLO.parse(args.slo) if isinstance(args.slo, str) else args.slo
    kept = document["probe_rule"]  # the run's own probe start and attainment target
    rule = ProbeRule(target=kept["target"], start=kept["start"])
    for fs in document["flag_sets"]:
        measured, speeds = fs["measured"], fs.get("speeds") or []
        if not measured or not speeds or fs["predicted"] is None:
            print(f"{fs['flags']['label']}: no measured knee or no probe speeds")
            continue
        either_side = [
            s["estimate"]
            for probe, s in zip(measured["probes"], speeds)
            if s
            and math.isfinite(s["estimate"] or math.nan)
            and probe["rate"] in (measured["rate"], measured.get("high"))
        ]
        if not either_side:
            print(f"{fs['flags']['label']}: no fitted speed either side of the knee")
            continue
        k = math.exp(sum(map(math.log, either_side)) / len(either_side))
        s = fs["scheduling"]
        scheduling = Scheduling(  # the cap the server ran with (its profile's when uncapped)
            server_profile(s["engine"], s["max_batched_tokens"], s["max_seqs"]),
            float(s["kv_capacity_tokens"]),
        )
        calibration = ServerCalibration.from_dict(fs["calibration"])
        requests = probe_load(load, rule, fs["requests"])
        cost = scaled_cost(calibration.cost, k)
        at = predict_knee(
            requests, ServerModel(cost, calibration.overhead, scheduling), slo, rule.target
        ).rate
        knee, predicted = measured["knee"], fs["predicted"]["rate"]
        print(
            f"{fs['flags']['label']}: predicted {predicted:.3g} ({predicted / knee:.2f} of the "
            f"measured {knee:.3g}); at the speed of the probes either side of it "
            f"(x{' and x'.join(f'{x:.2f}' for x in either_side)}: x{k:.2f}) the simulator "
            f"puts it at {at:.3g} ({at / knee:.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
