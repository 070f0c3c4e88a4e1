"""DP/PP accuracy (like LLMPrism's Table I) on SYNTHETIC clusters.

For each seed, generates the 'accuracy' preset (10 minutes), then classifies
the first 1, 3, 5 and 10 minutes of it with: the paper's size rule, the
paper's rule with its refinement, and ours (every addition); with
--ablation, also ours with one addition removed at a time.
Prints Markdown tables of accuracy = correctly labelled pairs / all pairs.

    python benchmarks/accuracy_pairs.py [--seeds 0,1,2] [--windows 1,3,5,10]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from prism.analysis.evaluation import gpu_flow_arrays, gpu_flow_ends, pair_type_truth
from prism.analysis.jobs import JobRecogniser
from prism.analysis.parallelism import ParallelismClassifier, SizeRuleClassifier
from prism.ingest.topology import Topology
from synthetic import preset

CONFIGS = {
    "paper, no refinement": lambda: SizeRuleClassifier.paper(refine=False),
    "paper + refinement": lambda: SizeRuleClassifier.paper(refine=True),
    "size rule + our earlier additions": lambda: SizeRuleClassifier(),
    "ours": lambda: ParallelismClassifier(),
}
ABLATIONS = {
    "size rule without one-way rule": dict(use_direction=False),
    "size rule without burstiness": dict(use_burstiness=False),
    "size rule without job DP sizes": dict(use_job_sizes=False),
    "size rule without recurring sizes": dict(size_repeats=1, min_size_share=0.0),
}


def accuracy(clf, a, b, start, size, labels, topo, truth_pairs, end=None):
    p = clf.fit(a, b, start, size, labels, end=end).pairs_
    t = pair_type_truth(p["a"], p["b"], topo, truth_pairs)
    pred = np.where(p["dp"], "DP", "PP")
    return float((t == pred).mean()), int((t != pred).sum()), len(t)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--windows", default="1,3,5,10", help="window lengths in minutes (prefixes of one capture)")
    ap.add_argument("--ablation", action="store_true", help="also run the ablation rows")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    windows = [float(w) for w in args.windows.split(",")]
    rows = []
    for seed in seeds:
        t0 = time.perf_counter()
        c = preset("accuracy", seed=seed, duration_s=max(windows) * 60).generate()
        topo = Topology.from_frame(c.topology)
        a, b, start, size = gpu_flow_arrays(c.flows, topo)
        end = gpu_flow_ends(c.flows, topo)
        w0 = c.meta["window_start_ns"]
        print(f"seed {seed}: {len(c.flows):,} flows generated in {time.perf_counter() - t0:.0f} s", flush=True)
        for w in windows:
            m = start < w0 + int(w * 60e9)
            labels = JobRecogniser(topo).partial_fit_pairs(a[m], b[m]).labels()
            configs = dict(CONFIGS)
            if args.ablation:
                configs.update({k: (lambda kw=kw: SizeRuleClassifier(**kw)) for k, kw in ABLATIONS.items()})
            for name, make in configs.items():
                t = time.perf_counter()
                acc, wrong, n = accuracy(make(), a[m], b[m], start[m], size[m], labels, topo, c.pairs, end=end[m])
                rows.append(dict(seed=seed, window=w, config=name, accuracy=acc, wrong=wrong, pairs=n, seconds=time.perf_counter() - t, flows=int(m.sum())))
                print(f"  {w:g} min  {name:32s} {acc:.4f} ({wrong} wrong of {n})  {time.perf_counter() - t:.1f} s", flush=True)
    df = pd.DataFrame(rows)
    table = df.groupby(["config", "window"], sort=False).agg(acc=("accuracy", "mean"), worst=("accuracy", "min"), wrong=("wrong", "sum"), pairs=("pairs", "sum")).reset_index()
    print()
    print("| classifier | " + " | ".join(f"{w:g} min" for w in windows) + " |")
    print("|---|" + "---|" * len(windows))
    for name in df["config"].unique():
        cells = []
        for w in windows:
            r = table[(table.config == name) & (table.window == w)].iloc[0]
            cells.append(f"{100 * r.acc:.2f}% ({r.wrong}/{r.pairs})")
        print(f"| {name} | " + " | ".join(cells) + " |")
    sp = df[df.config == "ours"]
    print(f"\nours: {sp.flows.sum() / sp.seconds.sum():,.0f} flows/s classification throughput (all windows, all seeds)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
