"""Benchmark: this checkout against another revision, in alternating runs on the same input.

A machine's speed drifts (on the project's machines by up to 40% within an
hour, with nothing else running), so a before/after pair of figures taken
at two times measures the drift as much as the change. This runs the same
work with both revisions one after the other, ``--rounds`` times, and
prints every pair and the median ratio (this checkout's time over the
other's: below 1 is faster):

* **replay**: ``prism replay`` of a generated SYNTHETIC cluster (``--preset``,
  default ``large``; kept in ``--data``), and a check that both revisions'
  outputs are byte-identical (``summary.json`` aside: it holds timings);
* **daemon**: ``prism daemon`` reading a topic of a local broker pre-filled
  with the SYNTHETIC ``demo`` cluster's Arrow messages, as in
  ``bench_daemon.py`` (each run in its own consumer group, from the start).

The other revision is checked out in a temporary git worktree and run with
this checkout's virtualenv, so their dependencies must match. Each side runs
once untimed first (numba compiles into each checkout's own cache).

    python benchmarks/bench_paired.py --base REV [--what replay,daemon] [--rounds 3] [--data DIR]
"""
from __future__ import annotations

import argparse
import filecmp
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def worktree(rev: str) -> Path:
    """A detached checkout of ``rev`` in a temporary directory."""
    path = Path(tempfile.mkdtemp(prefix="prism-base-")) / "checkout"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(path), rev], check=True)
    return path


def replay_once(cwd: Path, data: Path, out: Path) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one full replay run with ``cwd``'s prism."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "prism", "replay", str(data / "flows.parquet"), "--topology", str(data / "topology.csv"),
                    "--out", str(out), "--no-progress", "--quiet"], check=True, cwd=cwd)
    wall = time.perf_counter() - t
    return wall, json.loads((out / "summary.json").read_text())["peak_rss_mib"]


def same_outputs(a: Path, b: Path) -> list[str]:
    """Output files that differ between two replay directories (timings aside)."""
    names = sorted(({p.name for p in a.iterdir()} | {p.name for p in b.iterdir()}) - {"summary.json"})
    return [n for n in names if not ((a / n).is_file() and (b / n).is_file() and filecmp.cmp(a / n, b / n, shallow=False))]


def paired(label: str, rounds: int, run_base, run_head) -> list[tuple[float, float]]:
    """Alternate the two sides ``rounds`` times after an untimed warm-up of each; print the pairs.

    The side that goes first alternates too (base-head, head-base, ...): a
    drift within a round then favours neither.
    """
    run_base(), run_head()  # warm-up: numba's cache, the page cache
    pairs = []
    for r in range(rounds):
        if r % 2 == 0:
            base, head = run_base(), run_head()
        else:
            head, base = run_head(), run_base()
        pairs.append((base, head))
        print(f"| {label} | {r + 1} | {base:.2f} s | {head:.2f} s | {head / base:.2f} |", flush=True)
    return pairs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the revision to compare with (a commit, tag or branch)")
    ap.add_argument("--what", default="replay,daemon", help="comma-separated: replay, daemon")
    ap.add_argument("--rounds", type=int, default=3, help="timed pairs per measurement")
    ap.add_argument("--data", help="directory for the generated replay input (default: a temporary one; reused when it holds one)")
    ap.add_argument("--preset", default="large", help="SYNTHETIC preset replayed (default large, 13.6M flows)")
    args = ap.parse_args()
    what = set(args.what.split(","))
    unknown = what - {"replay", "daemon"}
    if unknown:
        ap.error(f"--what: unknown {', '.join(sorted(unknown))} (choose replay, daemon)")
    base = worktree(args.base)
    try:
        print(f"this checkout vs {args.base} ({subprocess.run(['git', '-C', str(base), 'rev-parse', '--short', 'HEAD'], capture_output=True, text=True).stdout.strip()})\n")
        print(f"| measurement | round | {args.base} | this checkout | ratio |")
        print("|---|---:|---:|---:|---:|")
        summary = []
        if "replay" in what:
            data = Path(args.data or tempfile.mkdtemp(prefix="prism-bench-"))
            if not (data / "flows.parquet").is_file():
                from bench_read_jobs import GENERATE

                data.mkdir(parents=True, exist_ok=True)
                subprocess.run([sys.executable, "-c", GENERATE, str(data), args.preset, "parquet"], check=True, capture_output=True)
            outs = {side: data / f"paired-{side}" for side in ("base", "head")}
            peaks: dict[str, float] = {}

            def side(name, cwd):
                def run():
                    wall, peak = replay_once(cwd, data, outs[name])
                    peaks[name] = max(peaks.get(name, 0.0), peak)
                    return wall
                return run

            pairs = paired(f"`prism replay` ({args.preset})", args.rounds, side("base", base), side("head", REPO))
            differ = same_outputs(outs["base"], outs["head"])
            summary.append(f"replay: median ratio {statistics.median(h / b for b, h in pairs):.2f}, peak memory "
                           f"{peaks['base']:,.0f} -> {peaks['head']:,.0f} MiB, outputs "
                           + ("byte-identical" if not differ else f"DIFFER: {', '.join(differ)}"))
        if "daemon" in what:
            from bench_daemon import fill_topic, time_daemon

            from prism.serve.broker import LocalBroker
            from synthetic import preset

            cluster = preset("demo", seed=0).generate()
            topo = Path(tempfile.mkdtemp(prefix="prism-bench-")) / "topology.csv"
            cluster.topology.to_csv(topo, index=False)
            with LocalBroker() as b:
                topic, _ = fill_topic(b.bootstrap, cluster, "arrow")
                runs = itertools.count()  # a consumer group per run: each reads the topic from the start

                def daemon(cwd):
                    return lambda: time_daemon(b.bootstrap, topic, len(cluster.flows), topo, group=f"paired-{next(runs)}", cwd=cwd)["wall"]

                pairs = paired("`prism daemon` (demo, Arrow)", args.rounds, daemon(base), daemon(REPO))
            n = len(cluster.flows)
            summary.append(f"daemon: median ratio {statistics.median(h / b for b, h in pairs):.2f}, records/s "
                           f"{statistics.median(n / b for b, _ in pairs):,.0f} -> {statistics.median(n / h for _, h in pairs):,.0f} (medians)")
        print()
        for line in summary:
            print(line)
        return 1 if any("DIFFER" in line for line in summary) else 0
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base)], check=False)


if __name__ == "__main__":
    raise SystemExit(main())
