"""Accuracy of step timelines and diagnosis against the SYNTHETIC ground truth.

For each preset and seed: replays the cluster and its fault-free twin, and
prints a Markdown table of steps found, spurious steps, step-duration
error, injected faults found, and anomalies that no injected fault explains
(false positives), for the faulty run and the fault-free twin.

    python benchmarks/accuracy_timeline.py [--presets tiny,demo,accuracy] [--seeds 0,1,2]
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from prism.analysis.evaluation import job_name_map, score_anomalies, score_steps
from prism.ingest.topology import Topology
from prism.offline.replay import replay
from synthetic import preset


def run(name, seed, with_faults, tmp):
    c = preset(name, seed=seed, with_faults=with_faults).generate()
    d = Path(tmp) / f"{name}-{seed}-{with_faults}"
    c.write(d)
    r = replay([str(d / "flows.parquet")], Topology.from_csv(d / "topology.csv"), progress=False)
    names = job_name_map(r.jobs, c.jobs)
    sc = score_steps(r.analysis.steps, c.steps, names)
    faults, anomalies = score_anomalies(r.analysis.anomalies, c.faults, names, r.analysis.steps)
    return c, sc, faults, anomalies


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="tiny,demo,accuracy")
    ap.add_argument("--seeds", default="0,1,2")
    args = ap.parse_args()
    print("| preset | seed | window | true steps | found | spurious | mean step error | max step error | faults found | unexplained anomalies | fault-free twin: anomalies |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.presets.split(","):
            for seed in map(int, args.seeds.split(",")):
                c, sc, faults, anomalies = run(name, seed, True, tmp)
                _, _, _, twin = run(name, seed, False, tmp)
                found, true_n = int(sc["found"].sum()), int(sc["true_steps"].sum())
                err = (sc["mean_err"] * sc["found"]).sum() / max(found, 1)
                window = (c.meta["window_end_ns"] - c.meta["window_start_ns"]) / 1e9
                print(
                    f"| {name} | {seed} | {window:g} s | {true_n:,} | {found:,} ({found / true_n:.2%}) | {int(sc['spurious'].sum())} "
                    f"| {err:.1e} | {sc['max_err'].max():.1e} | {int(faults['matched'].sum())} / {len(faults)} "
                    f"| {int((~anomalies['matched']).sum())} of {len(anomalies)} | {len(twin)} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
