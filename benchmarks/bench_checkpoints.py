"""Benchmark: a day-long capture of a checkpointing data-parallel job, and what its first part says.

Generates one SYNTHETIC job like a held-out production one: pure data
parallel (DP 4 over 4 servers, 8 rails), a bucketed gradient all-reduce
then 1.5 s of optimizer (``--optimizer distributed``: ZeRO-1's
reduce-scatter, the optimizer, then the all-gather), 32 micro-batches of
accumulation, about 46 s a step, and a checkpoint every ``--every`` steps
that makes its step 1.7x longer (after the all-reduce; with the
distributed optimizer, between the reduce-scatter and the all-gather). Replays the whole capture (``--hours``)
and its first ``--prefix-hours`` (the same flows, cut), each in a fresh
process, and prints one Markdown table row each: flows, replay wall time
and its ratio to reading the same Parquet file with pyarrow (measured in
the same run), steps found against the truth (one-to-one within 1%,
spurious, mean duration error), checkpoint steps flagged as slow steps
that recur, anomalies not at a checkpoint, and whether the prefix's steps
are the whole capture's steps over the same span.

Before the step became the shortest period, four checkpoints in a capture
made it three "steps" of 6.4 hours.

    python benchmarks/bench_checkpoints.py [--hours 31] [--every 500] [--prefix-hours 25] [--optimizer allreduce|distributed] [--data DIR]
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pyarrow.parquet as pq

GENERATE = """
import sys
from pathlib import Path
from synthetic.fabric import Fabric
from synthetic.generator import ClusterGenerator
from synthetic.workload import JobSpec
MiB = 1 << 20
out, hours, every, dist_opt = Path(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "distributed"
job = JobSpec("zero1-ckpt", tp=8, pp=1, dp=4, microbatches=32, fwd_ms=470, grad_bytes=1024 * MiB, bucket_bytes=256 * MiB,
              message_bytes=32 * MiB, optimizer_ms=1500, distributed_optimizer=dist_opt, checkpoint_every=every, checkpoint_pause=0.7)
c = ClusterGenerator(Fabric(servers=8, servers_per_group=4, spines=2), [job], duration_s=hours * 3600, seed=0,
                     storage_flows_per_s=2).generate()
c.write(out)
print(len(c.flows))
"""


def replay(data: Path, out: Path) -> float:
    """Wall time of ``prism replay`` in a fresh process."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "prism", "replay", str(data / "flows.parquet"), "--topology", str(data / "topology.csv"),
                    "--out", str(out), "--no-progress", "--quiet"], check=True)
    return time.perf_counter() - t


def read_floor(data: Path) -> float:
    """Reading the flows with pyarrow: the floor a replay is compared with."""
    t = time.perf_counter()
    pq.read_table(data / "flows.parquet")
    return time.perf_counter() - t


def cut(data: Path, dest: Path, hours: float) -> None:
    """The capture's first ``hours``: its flows that start in them, the same topology, truth and manifest end."""
    dest.mkdir(parents=True, exist_ok=True)
    table = pq.read_table(data / "flows.parquet")
    t0 = pc.min(table["start_ns"]).as_py()
    end = int(t0 + hours * 3600e9)
    pq.write_table(table.filter(pc.less(table["start_ns"], end)), dest / "flows.parquet")
    shutil.copy(data / "topology.csv", dest / "topology.csv")
    shutil.copytree(data / "truth", dest / "truth", dirs_exist_ok=True)
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["window_end_ns"] = end
    (dest / "manifest.json").write_text(json.dumps(manifest))


def score(data: Path, out: Path) -> dict:
    """Steps and checkpoint steps against the truth (the steps that end inside the capture)."""
    from prism.analysis.evaluation import job_name_map, score_steps

    names = job_name_map(pd.read_csv(out / "jobs.csv"), pd.read_csv(data / "truth" / "jobs.csv"))
    end = json.loads((data / "manifest.json").read_text())["window_end_ns"]
    truth = pd.read_csv(data / "truth" / "steps.csv")
    truth = truth[truth["end_ns"] <= end]
    steps = pd.read_csv(out / "steps.csv")
    st = score_steps(steps, truth, names, capture_end=end)
    dur = truth["end_ns"] - truth["start_ns"]
    ckpt = truth[dur > 1.4 * dur.median()]  # the steps that hold a checkpoint
    a = pd.read_csv(out / "anomalies.csv")
    slow = a[a["kind"] == "slow_step"]
    at_ckpt = slow["start_ns"].apply(lambda s: bool((np.abs(ckpt["start_ns"] - s) <= 0.01 * dur.median()).any()))
    return dict(found=int(st["found"].sum()), true=int(st["true_steps"].sum()), spurious=int(st["spurious"].sum()),
                error=float(st["mean_err"].mean()), ckpt=len(ckpt),
                flagged=int(at_ckpt.sum()), periodic=int(slow[at_ckpt.to_numpy()]["explanation"].str.contains("recur every").sum()),
                other=int(len(a) - at_ckpt.sum()), steps=steps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hours", type=float, default=31.0, help="capture length (default %(default)g)")
    ap.add_argument("--every", type=int, default=500, help="a checkpoint every this many steps (default %(default)d)")
    ap.add_argument("--prefix-hours", type=float, default=25.0, help="the first part replayed on its own (default %(default)g)")
    ap.add_argument("--optimizer", choices=("allreduce", "distributed"), default="allreduce",
                    help="gradient all-reduce then the optimizer, or ZeRO-1's reduce-scatter, optimizer, all-gather (default %(default)s)")
    ap.add_argument("--data", help="directory to keep the generated capture (default: a temporary one)")
    args = ap.parse_args()
    root = Path(args.data or tempfile.mkdtemp(prefix="prism-ckpt-"))
    whole = root / f"job-{args.optimizer}-{args.hours:g}h"
    print(f"SYNTHETIC one pure-DP job (32 GPUs, ~46 s steps, optimizer: {args.optimizer}), a checkpoint every {args.every} steps "
          "(1.7x step)\n", flush=True)
    if not (whole / "flows.parquet").exists():
        subprocess.run([sys.executable, "-c", GENERATE, str(whole), str(args.hours), str(args.every), args.optimizer], check=True, capture_output=True,
                       cwd=Path(__file__).resolve().parents[1])
    prefix = root / f"job-{args.optimizer}-{args.prefix_hours:g}h"
    cut(whole, prefix, args.prefix_hours)
    print("| capture | flows | replay | vs pyarrow read | steps found | spurious | mean step error | checkpoints flagged (periodic) "
          "| other anomalies |")
    print("|---|---:|---:|---:|---|---:|---:|---|---:|")
    found = {}
    for data, hours in ((prefix, args.prefix_hours), (whole, args.hours)):
        floor = read_floor(data)
        wall = replay(data, data / "out")
        s = score(data, data / "out")
        found[hours] = s.pop("steps")
        n = pq.ParquetFile(data / "flows.parquet").metadata.num_rows
        print(f"| {hours:g} h | {n:,} | {wall:.1f} s | {wall / floor:.1f}x | {s['found']:,}/{s['true']:,} | {s['spurious']} | "
              f"{s['error']:.2e} | {s['flagged']}/{s['ckpt']} ({s['periodic']}) | {s['other']} |", flush=True)
    a, b = found[args.prefix_hours], found[args.hours]
    pa = set(zip(a["start_ns"], a["end_ns"]))
    pb = {x for x in zip(b["start_ns"], b["end_ns"]) if x[1] <= a["end_ns"].max()}
    print(f"\nthe first {args.prefix_hours:g} h on their own: {len(pa & pb):,} of {len(pb):,} steps of the whole capture's same span, "
          f"{len(pa - pb)} others")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
