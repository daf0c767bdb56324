"""Runs inside a venv with DistServe's simulator (simpy, numpy, pandas; ``PYTHONPATH`` the
DistServe checkout): reads a JSON job on stdin and prints a JSON answer. Not imported by the
package or the tests; ``benchmarks/test_distserve_placements.py`` runs it as a subprocess.

``{"arrivals": [N, seed]}`` -> DistServe's Poisson arrivals (its workload generator,
``get_gamma_interarrival`` with cv 1) at one request per second, in ms since the first.
``{"placement": ..., "lengths": ..., "seed": s, "slo": [ttft_ms, tpot_ms], "target": 0.9,
"tolerance": t}`` -> the highest per-GPU rate at which at least ``target`` of the requests meet
both bounds in DistServe's simulator (its TTFT and TPOT definitions), bisected to ``tolerance``
relative."""

import json
import sys

import simpy
from simdistserve.base.organize_data import (
    calculate_per_request_latency,
    organize_request_df,
    organize_request_event_df,
)
from simdistserve.base.scheduler import put_requests_with_interarrivals
from simdistserve.base.workload import convert_pd_pair_to_request, get_gamma_interarrival
from simdistserve.clusters.disagg import DisaggCluster
from simdistserve.constants import ModelTypes
from simdistserve.estimators.memory_estimator import get_max_num_tokens


def attainment(job, rate):
    p, tp_p, d, tp_d = job["placement"]
    model = ModelTypes.model_str_to_object(job["model"])
    config = dict(
        model_type=model,
        TP=tp_p,
        TP_Prefill=tp_p,
        TP_Decode=tp_d,
        prefill_max_batch_size=10**7,
        decode_max_batch_size=10**7,
        prefill_max_tokens=get_max_num_tokens(model, tp_p, 1),
        decode_max_tokens=get_max_num_tokens(model, tp_d, 1),
        enable_chunked_prefill=False,
        engine_type="distserve",
    )
    env = simpy.Environment()
    cluster = DisaggCluster(
        env=env, N_prefill_instance=p, N_decode_instance=d, worker_configs=config
    )
    requests = convert_pd_pair_to_request([tuple(x) for x in job["lengths"]])
    arrival = get_gamma_interarrival(len(requests), rate, 1.0, seed=job["seed"])
    cluster.run()
    put_requests_with_interarrivals(env, cluster.scheduler, arrival, requests)
    env.run()
    request_df = organize_request_df(requests)
    events = organize_request_event_df(requests)
    latency = calculate_per_request_latency(events, request_df.output_lens)
    ttft, tpot = job["slo"]
    met = (latency["first_token_latency"] <= ttft) & (latency["tpot"] <= tpot)
    return met.sum() / len(requests)


def best_rate(job):
    gpus = job["placement"][0] * job["placement"][1] + job["placement"][2] * job["placement"][3]
    ok = lambda per_gpu: attainment(job, per_gpu * gpus) >= job["target"]  # noqa: E731
    low, high = 0.0, 0.25
    while ok(high):
        low, high = high, high * 2
        if high > 1000:  # never missed: no knee to compare
            return float("inf")
    while high - low > job["tolerance"] * high:
        middle = (low + high) / 2
        low, high = (middle, high) if ok(middle) else (low, middle)
    return low


def main():
    job = json.load(sys.stdin)
    if "arrivals" in job:
        n, seed = job["arrivals"]
        gaps = get_gamma_interarrival(n, 1.0, 1.0, seed=seed)
        times, t = [], 0.0
        for g in gaps:
            t += g
            times.append(t)
        print(json.dumps(times))
        return
    print(json.dumps(best_rate(job)))


if __name__ == "__main__":
    main()
