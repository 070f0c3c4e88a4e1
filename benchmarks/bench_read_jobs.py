"""Benchmark: generate the SYNTHETIC 'large' preset, then replay it.

Prints a Markdown table: generation throughput; per flow format, replay
throughput and peak memory for read + job recognition (``--stop-after
jobs``); then on the first format the replay up to DP/PP pairs, up to
step timelines, the full replay with diagnosis and the Chrome trace, and
the full replay with every GPU flow spilled to disk (``--spill-above 0``:
the memory a capture too long for memory is replayed in).

Every replay row also shows its time as a multiple of the **floor**
measured in the same run: a fresh Python process that only reads the same
file into an Arrow table with pyarrow (``pq.read_table``, or pyarrow's CSV
reader). Both are the best of three (``--repeats``) and include interpreter
start-up and imports.

Every step runs in its own process, started from this small one: Linux keeps
a process's peak RSS across exec, so a replay forked from a parent that held
the generated cluster would report the parent's memory as its own.

    python benchmarks/bench_read_jobs.py [--data DIR] [--formats parquet,csv] [--duration S] [--repeats N]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GENERATE = """
import sys, time
from pathlib import Path
from synthetic import preset
from synthetic.generator import write_flows
out, name, formats = Path(sys.argv[1]), sys.argv[2], sys.argv[3].split(",")
duration = float(sys.argv[4]) if len(sys.argv) > 4 else None
t = time.perf_counter()
c = preset(name, duration_s=duration).generate()
gen_s = time.perf_counter() - t
c.write(out)
for fmt in formats:
    if fmt != "parquet":
        write_flows(c.flows, out / f"flows.{fmt}")
print(len(c.flows), c.jobs["ip"].nunique(), gen_s)
"""


FLOOR = """
import sys
import pyarrow.csv as pc, pyarrow.parquet as pq
path = sys.argv[1]
t = pq.read_table(path) if path.endswith(".parquet") else pc.read_csv(path)
print(t.num_rows)
"""


def pyarrow_floor(path: Path, repeats: int = 3) -> float:
    """Best wall time of a fresh process reading ``path`` with pyarrow and nothing else."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", FLOOR, str(path)], check=True, capture_output=True)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", help="directory to keep the generated cluster (default: a temporary one)")
    ap.add_argument("--preset", default="large")
    ap.add_argument("--formats", default="parquet,csv", help="comma-separated flow formats to time")
    ap.add_argument("--duration", type=float, help="seconds of capture to generate (default: the preset's; 'large' gives 10M flows at 29.4)")
    ap.add_argument("--repeats", type=int, default=3, help="replays per row; the best wall time and the largest peak memory are shown")
    args = ap.parse_args()
    data = Path(args.data or tempfile.mkdtemp(prefix="prism-bench-"))
    data.mkdir(parents=True, exist_ok=True)
    formats = args.formats.split(",")
    gen = subprocess.run([sys.executable, "-c", GENERATE, str(data), args.preset, ",".join(formats)] + ([str(args.duration)] if args.duration else []),
                         check=True, capture_output=True, text=True)
    n, gpus, gen_s = gen.stdout.split()
    n, gpus, gen_s = int(n), int(gpus), float(gen_s)
    floors = {fmt: pyarrow_floor(data / f"flows.{fmt}") for fmt in formats}
    print("| step | wall time | throughput | x pyarrow read | peak memory |")
    print("|---|---|---|---|---|")
    print(f"| generate `{args.preset}` ({gpus:,} GPUs, {n:,} flows) | {gen_s:.1f} s | {n / gen_s:,.0f} flows/s | | |")
    for fmt in formats:
        print(f"| floor: pyarrow reads flows.{fmt} into an Arrow table (fresh process, best of 3) | {floors[fmt]:.2f} s | "
              f"{n / floors[fmt]:,.0f} flows/s | 1x | |")
    runs = [(fmt, "jobs", []) for fmt in formats] + [(formats[0], stop, []) for stop in ("pairs", "steps", "diagnosis")]
    runs.append((formats[0], "diagnosis", ["--spill-above", "0"]))  # every GPU flow to disk, read back a batch of whole jobs at a time
    for fmt, stop, extra in runs:
        path = data / f"flows.{fmt}"
        out = data / f"replay-{fmt}-{stop}{'-spilled' if extra else ''}"
        wall, peak = float("inf"), 0.0
        for _ in range(args.repeats):  # best of N, as the floor: this machine's timings vary by 10-20%
            t = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "prism", "replay", str(path), "--topology", str(data / "topology.csv"), "--out", str(out),
                 "--no-progress", "--quiet", "--stop-after", stop, *extra],
                check=True,
            )
            wall = min(wall, time.perf_counter() - t)
            summary = json.loads((out / "summary.json").read_text())
            peak = max(peak, summary["peak_rss_mib"])
        rows = summary["rows_read"]
        what = {"jobs": "read + jobs", "pairs": "+ DP/PP pairs", "steps": "+ step timelines", "diagnosis": "+ diagnosis, trace: everything"}[stop]
        if extra:
            largest = max((j.get("flows", 0) for j in summary["jobs"]), default=0)
            what = f"everything, GPU flows spilled to disk; memory bound: the largest job, {largest:,} flows"
        print(
            f"| `prism replay --stop-after {stop}{' ' + ' '.join(extra) if extra else ''}` ({what}), {fmt}, {path.stat().st_size / 2**20:,.0f} MiB "
            f"| {wall:.1f} s | {rows / wall:,.0f} flows/s | {wall / floors[fmt]:.0f}x | {peak:,.0f} MiB |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
