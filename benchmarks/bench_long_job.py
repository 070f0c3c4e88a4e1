"""Benchmark: one job, captures of growing length, replayed in bounded memory.

For each capture length, generates a SYNTHETIC cluster running one large
job (1,024 GPUs: TP 8 x PP 8 x DP 16), then replays it with every GPU flow
spilled to disk (``--spill-above 0``) twice, each in a fresh process:

* **whole** -- the job analysed at once (``--slice-flows`` past its flows):
  the analyses' temporaries grow with the capture;
* **sliced** -- the job analysed ``--slice-flows`` flows at a time, in
  overlapping time slices, the results stitched (``prism replay``'s
  default for a job of more than 6M flows, 6M at a time).

Prints a Markdown table: flows, wall time, peak RSS and bytes per flow at
the peak of each, and whether the two found the same steps (start and end
of every step), pair types and anomalies, with the generator's truth
(steps found, faults found).

    python benchmarks/bench_long_job.py [--durations 30,60,120] [--slice-flows 2000000] [--data DIR]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

GENERATE = """
import sys
from pathlib import Path
from synthetic.fabric import Fabric
from synthetic.faults import SlowServer, SlowStep
from synthetic.generator import ClusterGenerator
from synthetic.workload import JobSpec
MiB = 1 << 20
out, duration = Path(sys.argv[1]), float(sys.argv[2])
job = JobSpec("llama-405b", tp=8, pp=8, dp=16, microbatches=16, fwd_ms=18, grad_bytes=128 * MiB, bucket_bytes=64 * MiB, message_bytes=16 * MiB)
faults = [SlowStep("llama-405b", step=12, factor=1.7), SlowServer("llama-405b", server=9, from_step=30, factor=1.3)]
c = ClusterGenerator(Fabric(servers=136, servers_per_group=34, spines=8), [job], duration_s=duration, faults=faults, seed=0,
                     storage_flows_per_s=200).generate()
c.write(out)
print(len(c.flows))
"""


def replay(data: Path, out: Path, slice_flows: int) -> dict:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "prism", "replay", str(data / "flows.parquet"), "--topology", str(data / "topology.csv"),
                    "--out", str(out), "--no-progress", "--quiet", "--spill-above", "0", "--slice-flows", str(slice_flows)], check=True)
    wall = time.perf_counter() - t
    summary = json.loads((out / "summary.json").read_text())
    return dict(wall=wall, peak=summary["peak_rss_mib"], rows=summary["rows_read"])


def same(a: Path, b: Path) -> str:
    """What of the two replays' results agree."""
    out = []
    sa, sb = pd.read_csv(a / "steps.csv"), pd.read_csv(b / "steps.csv")
    ka, kb = set(zip(sa["start_ns"], sa["end_ns"])), set(zip(sb["start_ns"], sb["end_ns"]))
    out.append(f"steps {len(ka & kb):,} of {len(ka):,} / {len(kb):,}")
    pa, pb = pd.read_csv(a / "pairs.csv"), pd.read_csv(b / "pairs.csv")
    m = pa.merge(pb, on=["src", "dst"], suffixes=("_a", "_b"))
    out.append(f"pair types {int((m['type_a'] == m['type_b']).sum()):,} of {len(pa):,}")
    aa, ab = pd.read_csv(a / "anomalies.csv"), pd.read_csv(b / "anomalies.csv")
    key = ["kind", "subject", "start_ns"]
    common = len(aa[key].drop_duplicates().merge(ab[key].drop_duplicates()))
    out.append(f"anomalies {common} of {len(aa)} / {len(ab)}")
    return ", ".join(out)


def truth(data: Path, out: Path) -> str:
    """Steps found and faults found, against the generator's truth."""
    from prism.analysis.evaluation import job_name_map, score_anomalies, score_steps

    names = job_name_map(pd.read_csv(out / "jobs.csv"), pd.read_csv(data / "truth" / "jobs.csv"))
    steps = pd.read_csv(out / "steps.csv")
    end = json.loads((data / "manifest.json").read_text())["window_end_ns"]  # a step ending within one of the capture's end is not scored
    st = score_steps(steps, pd.read_csv(data / "truth" / "steps.csv"), names, capture_end=end)
    faults, anomalies = score_anomalies(pd.read_csv(out / "anomalies.csv"), pd.read_csv(data / "truth" / "faults.csv"), names, steps)
    return (f"{int(st['found'].sum()):,}/{int(st['true_steps'].sum()):,} steps, {int(st['spurious'].sum())} spurious; "
            f"{int(faults['matched'].sum())}/{len(faults)} faults, {int((~anomalies['matched']).sum())} unexplained")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--durations", default="30,60,120", help="capture lengths, seconds")
    ap.add_argument("--slice-flows", type=int, default=2_000_000)
    ap.add_argument("--data", help="directory to keep the generated captures (default: a temporary one)")
    args = ap.parse_args()
    root = Path(args.data or tempfile.mkdtemp(prefix="prism-long-"))
    print(f"SYNTHETIC one job (1,024 GPUs, TP 8 x PP 8 x DP 16), GPU flows spilled to disk; sliced: --slice-flows {args.slice_flows:,}\n")
    print("| capture | flows | whole: wall, peak RSS, B/flow | sliced: wall, peak RSS, B/flow | sliced vs whole | sliced vs truth |")
    print("|---|---:|---|---|---|---|")
    for d in map(float, args.durations.split(",")):
        data = root / f"job-{d:g}s"
        n = int(subprocess.run([sys.executable, "-c", GENERATE, str(data), str(d)], check=True, capture_output=True, text=True,
                               cwd=Path(__file__).resolve().parents[1]).stdout.split()[-1])
        w = replay(data, data / "whole", 1 << 62)
        s = replay(data, data / "sliced", args.slice_flows)
        cell = lambda r, n=n: f"{r['wall']:.1f} s, {r['peak']:,.0f} MiB, {r['peak'] * 2**20 / n:,.0f}"  # noqa: E731
        print(f"| {d:g} s | {n:,} | {cell(w)} | {cell(s)} | {same(data / 'whole', data / 'sliced')} | {truth(data, data / 'sliced')} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
