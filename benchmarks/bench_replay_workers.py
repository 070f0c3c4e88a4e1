"""Benchmark: ``prism replay --workers N`` (and ``--scheduler local``) against ``--workers 1``, in the same run.

Replays a generated SYNTHETIC cluster (``--preset``, default ``large``: six
jobs, 13.6M flows; kept in ``--data``) in alternating rounds: one process,
a process pool of ``--workers`` processes, and, when Dask distributed is
installed, a local Dask cluster of as many worker processes (``--scheduler
local``: each task reads its jobs' flows from the Parquet file itself).
Each run is a fresh process; each side runs once untimed first (numba's
cache, the page cache). Prints every round, then per side the median wall
time, its ratio to ``--workers 1`` (above 1 is faster), the peak memory of
the replay's process and of its largest worker process, and whether the
outputs are byte-identical to ``--workers 1`` (``summary.json`` aside: it
holds timings); then the CPU time of the replay's process and of its
workers, which other load on the machine does not change (the wall times
do: with every core busy, more processes cannot be faster).

Job recognition reads every flow in the replay's own process before any
job is handed out, and the biggest job is one task, so the speed-up is
bounded by those (Amdahl); on a 2-core machine expect at most ~1.6x.

    python benchmarks/bench_replay_workers.py [--workers 2] [--rounds 3] [--preset large] [--data DIR] [--no-dask]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_paired import same_outputs
from bench_read_jobs import GENERATE

#: one replay in a fresh process, then its peak memory and CPU time, and its workers' (peak: the largest waited-for descendant)
RUN = """
import json, resource, sys
from prism.cli import main
rc = main(sys.argv[1:])
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"rc": rc, "self_mib": me.ru_maxrss / 1024, "children_mib": kids.ru_maxrss / 1024,
                  "self_cpu": me.ru_utime + me.ru_stime, "children_cpu": kids.ru_utime + kids.ru_stime}))
"""

#: CPU seconds per side and round: (the replay's process, its workers together)
CPU: dict[str, list[tuple[float, float]]] = {}


def run(data: Path, out: Path, flags: list[str]) -> tuple[float, float, float]:
    """(wall seconds, peak MiB of the replay's process, peak MiB of its largest child) of one replay; its CPU time goes to :data:`CPU`."""
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", RUN, "replay", str(data / "flows.parquet"), "--topology", str(data / "topology.csv"),
                        "--out", str(out), "--no-progress", "--quiet", *flags], check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t
    m = json.loads(p.stdout.strip().splitlines()[-1])
    if m["rc"] != 0:
        raise SystemExit(f"replay {' '.join(flags)} exited {m['rc']}: {p.stderr}")
    CPU.setdefault(" ".join(flags), []).append((m["self_cpu"], m["children_cpu"]))
    return wall, m["self_mib"], m["children_mib"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="processes of the pool and of the local Dask cluster (default 2)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (each runs every side once, the order rotating)")
    ap.add_argument("--preset", default="large", help="SYNTHETIC preset replayed (default large, 13.6M flows)")
    ap.add_argument("--data", help="directory for the generated input (default: a temporary one; reused when it holds one)")
    ap.add_argument("--no-dask", action="store_true", help="leave out the local Dask cluster")
    args = ap.parse_args()
    data = Path(args.data or tempfile.mkdtemp(prefix="prism-bench-"))
    if not (data / "flows.parquet").is_file():
        data.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-c", GENERATE, str(data), args.preset, "parquet"], check=True, capture_output=True)
    sides = {"--workers 1": ["--workers", "1"], f"--workers {args.workers}": ["--workers", str(args.workers)]}
    if not args.no_dask and importlib.util.find_spec("distributed") is not None:
        sides[f"--scheduler local --workers {args.workers}"] = ["--scheduler", "local", "--workers", str(args.workers)]
    outs = {name: data / f"workers-out-{i}" for i, name in enumerate(sides)}
    for name, flags in sides.items():  # warm-up
        run(data, outs[name], flags)
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in sides}
    names = list(sides)
    print(f"`prism replay` of the {args.preset} preset ({data / 'flows.parquet'})\n")
    print("| round | side | wall | peak MiB (replay) | peak MiB (largest worker) |")
    print("|---:|---|---:|---:|---:|")
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:  # the first side rotates: a drift favours none
            wall, own, child = run(data, outs[name], sides[name])
            results[name].append((wall, own, child))
            print(f"| {r + 1} | `{name}` | {wall:.2f} s | {own:,.0f} | {child:,.0f} |", flush=True)
    base = statistics.median(w for w, _, _ in results[names[0]])
    print("\n| side | median wall | x --workers 1 | peak MiB (replay) | peak MiB (largest worker) | outputs |")
    print("|---|---:|---:|---:|---:|---|")
    for name in names:
        wall = statistics.median(w for w, _, _ in results[name])
        differ = same_outputs(outs[names[0]], outs[name])
        print(f"| `{name}` | {wall:.2f} s | {base / wall:.2f}x | {max(m for _, m, _ in results[name]):,.0f} | "
              f"{max(c for _, _, c in results[name]):,.0f} | " + ("byte-identical" if not differ else f"DIFFER: {', '.join(differ)}") + " |")
    # CPU time does not depend on what else runs: on a busy machine the wall times above say little, this does
    print("\n| side | CPU s, replay's process | CPU s, workers together | CPU s in all |")
    print("|---|---:|---:|---:|")
    for name in names:
        own, kids = (statistics.median(c[i] for c in CPU[" ".join(sides[name])][1:]) for i in (0, 1))  # [0]: the warm-up
        print(f"| `{name}` | {own:.2f} | {kids:.2f} | {own + kids:.2f} |")
    load = os.getloadavg()[0]
    for name in names[1:]:
        print(f"{name}: {base / statistics.median(w for w, _, _ in results[name]):.2f}x the speed of --workers 1 "
              f"(median of {args.rounds} rounds; load average {load:.1f} on {os.cpu_count()} CPUs at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
