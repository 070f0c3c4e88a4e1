"""What each pair-typing signal is worth, over the whole scenario matrix and the real-timing flows.

Pair typing alone (no replay), so the whole matrix runs in minutes: every
scenario of :mod:`synthetic.scenarios` (SYNTHETIC) at several seeds, and the
flows DERIVED FROM the real StragglerAnalysis traces at three placements.
Rows: the published size rule (LLMPrism Algorithm 2), the size rule with
our earlier additions, ours, and ours without each signal in turn
(:data:`prism.analysis.parallelism.SIGNALS`). Cells: accuracy, worst case, wrong
pairs, and pairs flagged uncertain.

    python benchmarks/ablation.py [--seeds 0,1,2] [--window 60]
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import pandas as pd

from prism.analysis.evaluation import gpu_flow_arrays, gpu_flow_ends, pair_type_truth
from prism.analysis.jobs import JobRecogniser
from prism.analysis.parallelism import SIGNALS, ParallelismClassifier, SizeRuleClassifier
from prism.ingest.topology import Topology
from synthetic.fromtrace import shared_data_dir

SA = shared_data_dir() / "straggler-analysis"

CONFIGS = {
    "LLMPrism size rule + refinement": lambda: SizeRuleClassifier.paper(refine=True),
    "size rule + our earlier additions": lambda: SizeRuleClassifier(),
    "ours": lambda: ParallelismClassifier(),
    **{f"ours without {s}": (lambda s=s: ParallelismClassifier(without=(s,))) for s in SIGNALS},
}


def clusters(seeds, window):
    from synthetic.scenarios import SCENARIOS, scenario_cluster

    if SA.is_dir():
        from synthetic.fromtrace import CollectorNoise, read_trace_job, trace_cluster

        for tp in (8, 2, 1):
            yield f"real traces tp={tp}", trace_cluster([read_trace_job(SA, "ST", tp=tp), read_trace_job(SA, "SE", tp=tp)], noise=CollectorNoise())
    for name in SCENARIOS:
        for seed in seeds:
            yield name, scenario_cluster(name, seed=seed, duration_s=window)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--window", type=float, default=60.0, help="capture seconds per scenario")
    args = ap.parse_args()
    rows = []
    for name, c in clusters([int(s) for s in args.seeds.split(",")], args.window):
        topo = Topology.from_frame(c.topology)
        a, b, start, size = gpu_flow_arrays(c.flows, topo)
        end = gpu_flow_ends(c.flows, topo)
        labels = JobRecogniser(topo).partial_fit_pairs(a, b).labels()
        for cfg, make in CONFIGS.items():
            clf = make()
            kw = {"server_of": topo.server_codes} if isinstance(clf, ParallelismClassifier) else {}
            p = clf.fit(a, b, start, size, labels, end=end, **kw).pairs_
            t = pair_type_truth(p["a"], p["b"], topo, c.pairs)
            pred = np.where(p["dp"], "DP", "PP")
            unc = int(p["uncertain"].sum()) if "uncertain" in p else 0
            rows.append(dict(scenario=name, config=cfg, acc=float((t == pred).mean()), wrong=int((t != pred).sum()), pairs=len(t), uncertain=unc))
        print(f"{name}: " + ", ".join(f"{r['config']} {r['acc']:.4f}" for r in rows[-len(CONFIGS):][:3]), file=sys.stderr, flush=True)
    df = pd.DataFrame(rows)
    real = df["scenario"].str.startswith("real")
    print("| pair typing | synthetic matrix: mean | worst | wrong / pairs | real-timing flows: mean | wrong / pairs | uncertain (all) |")
    print("|---|---|---|---|---|---|---|")
    for cfg in CONFIGS:
        s, r = df[(df.config == cfg) & ~real], df[(df.config == cfg) & real]
        rr = f"{100 * r.acc.mean():.2f}% | {r.wrong.sum()}/{r.pairs.sum()}" if len(r) else "- | -"
        print(f"| {cfg} | {100 * s.acc.mean():.2f}% | {100 * s.acc.min():.2f}% | {s.wrong.sum()}/{s.pairs.sum()} | {rr} | {df[df.config == cfg].uncertain.sum()} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
