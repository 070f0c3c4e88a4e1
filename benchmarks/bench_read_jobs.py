"""Benchmark: generate the SYNTHETIC 'large' preset, then read + recognise jobs.

Prints generation throughput and, per flow format, replay (read + job
recognition) throughput and peak memory. Each replay runs in its own process
so that its peak RSS is its own.

    python benchmarks/bench_read_jobs.py [--data DIR] [--formats parquet,csv.gz]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="directory to keep the generated cluster (default: a temporary one)")
    ap.add_argument("--preset", default="large")
    ap.add_argument("--formats", default="parquet,csv", help="comma-separated flow formats to time")
    args = ap.parse_args()
    from synthetic import preset
    from synthetic.generator import write_flows

    data = Path(args.data or tempfile.mkdtemp(prefix="prism-bench-"))
    t = time.perf_counter()
    cluster = preset(args.preset).generate()
    gen_s = time.perf_counter() - t
    n = len(cluster.flows)
    gpus = cluster.jobs["ip"].nunique()
    cluster.write(data)
    print(f"| generate `{args.preset}` ({gpus:,} GPUs, {n:,} flows) | {gen_s:.1f} s | {n / gen_s:,.0f} flows/s | |")
    for fmt in args.formats.split(","):
        path = data / f"flows.{fmt}"
        if not path.exists():
            write_flows(cluster.flows, path)
        out = data / f"replay-{fmt}"
        t = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "prism", "replay", str(path), "--topology", str(data / "topology.csv"), "--out", str(out), "--no-progress", "--quiet"],
            check=True,
        )
        wall = time.perf_counter() - t
        summary = json.loads((out / "summary.json").read_text())
        rows = summary["rows_read"]
        peak = f"{summary['peak_rss_mib']:,.0f} MiB"
        print(f"| replay (read + jobs), {fmt}, {path.stat().st_size / 2**20:,.0f} MiB | {wall:.1f} s | {rows / wall:,.0f} flows/s | {peak} |")
    del cluster
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
