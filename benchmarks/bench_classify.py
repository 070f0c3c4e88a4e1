"""Benchmark: BOCD throughput, and DP/PP classification of a 1,024-GPU job.

1. BOCD points/s on one core over 1,000 series of 200-2,000 points
   (``BOCD.fit_many``: all series advance together).
2. A SYNTHETIC 1,024-GPU job (TP 8 x PP 8 x DP 16) over a 10-minute window:
   flows, time to classify every GPU pair (BOCD + the rules), accuracy
   against the generator's truth.

    python benchmarks/bench_classify.py [--minutes 10]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from prism.analysis.changepoint import BOCD
from prism.analysis.evaluation import gpu_flow_arrays, pair_type_truth
from prism.analysis.jobs import JobRecogniser
from prism.analysis.parallelism import ParallelismClassifier
from prism.ingest.topology import Topology
from synthetic import ClusterGenerator, Fabric, JobSpec

MiB = 1 << 20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    series = [rng.normal(0, 1, rng.integers(200, 2000)) for _ in range(1000)]
    n = sum(len(s) for s in series)
    BOCD().fit_many(series[:50])  # warm-up
    t = time.perf_counter()
    BOCD().fit_many(series)
    dt = time.perf_counter() - t
    print("| measurement | result |")
    print("|---|---|")
    print(f"| BOCD, 1,000 series, {n:,} points, max_run 64 | {n / dt:,.0f} points/s ({dt:.2f} s) |")

    job = JobSpec("tp8-pp8-dp16", tp=8, pp=8, dp=16, microbatches=16, fwd_ms=40, grad_bytes=256 * MiB, bucket_bytes=96 * MiB, message_bytes=16 * MiB)
    gen = ClusterGenerator(Fabric(servers=128, servers_per_group=32, spines=16), [job], duration_s=args.minutes * 60, faults=[], seed=0, uniform_dp_share=0.1)
    t = time.perf_counter()
    c = gen.generate()
    gen_s = time.perf_counter() - t
    topo = Topology.from_frame(c.topology)
    a, b, start, size = gpu_flow_arrays(c.flows, topo)
    labels = JobRecogniser(topo).partial_fit_pairs(a, b).labels()
    t = time.perf_counter()
    clf = ParallelismClassifier().fit(a, b, start, size, labels)
    cls_s = time.perf_counter() - t
    p = clf.pairs_
    truth = pair_type_truth(p["a"], p["b"], topo, c.pairs)
    acc = (truth == np.where(p["dp"], "DP", "PP")).mean()
    print(f"| 1,024-GPU job, {args.minutes:g}-minute window: {len(a):,} flows, {len(p):,} pairs (generated in {gen_s:.0f} s) | classified in {cls_s:.1f} s ({len(a) / cls_s:,.0f} flows/s), accuracy {100 * acc:.2f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
