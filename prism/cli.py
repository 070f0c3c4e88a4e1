"""The ``prism`` command line: a thin front-end over the modules.

Flags follow Prometheus' style (``--web.listen-address``) where they name a
setting of a long-running component; one-shot commands take plain options.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from . import __version__
from .readers import DEFAULT_CHUNK_ROWS

EXIT_BAD_INPUT = 2


def _add_synth(sub):
    p = sub.add_parser(
        "synth",
        help="generate a SYNTHETIC cluster: flows, topology and ground truth",
        description=(
            "Generate a seeded synthetic training cluster (rail-optimised leaf/spine fabric, Megatron-style "
            "jobs, 1F1B pipelines, DP ring all-reduce, storage noise, injected faults) and write "
            "OUT/flows.<format>, OUT/topology.csv, OUT/truth/{jobs,pairs,steps,faults}.csv and OUT/manifest.json."
        ),
    )
    p.add_argument("--preset", default="demo", choices=["tiny", "demo", "large", "accuracy"], help="cluster size and jobs (default: %(default)s)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--duration", type=float, default=None, metavar="SECONDS", help="capture window (default: the preset's)")
    p.add_argument("--no-faults", action="store_true", help="the fault-free twin: same seed and random draws, no injected faults")
    p.add_argument("--format", default="parquet", choices=["parquet", "csv", "csv.gz", "jsonl", "jsonl.gz"], help="flow file format (default: %(default)s)")
    p.set_defaults(func=cmd_synth)


def _add_replay(sub):
    p = sub.add_parser(
        "replay",
        help="analyse captured flow dumps offline",
        description=(
            "Read flow records (CSV, Parquet or JSON Lines, optionally .gz; - for JSON Lines on stdin), "
            "recognise jobs, tell DP from PP pairs, reconstruct every job's training steps, diagnose slow steps, "
            "slow servers and slow switches, and write jobs.csv, pairs.csv, steps.csv, phases.csv, anomalies.csv, "
            "switches.csv, timeline.json (open it in ui.perfetto.dev) and summary.json to --out. Malformed rows "
            "are counted by reason and skipped; traffic to or from addresses not in the topology (storage, "
            "management) is counted and kept out of jobs."
        ),
    )
    p.add_argument("flows", nargs="+", metavar="FLOWS", help="flow files, in time order")
    p.add_argument("--topology", required=True, help="CSV with ip,server (optional rail,leaf): one row per GPU NIC")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--chunk-rows", type=int, default=DEFAULT_CHUNK_ROWS, help="rows per chunk; bounds memory, about 1.2 KiB per row at peak (default: %(default)s)")
    p.add_argument("--progress", dest="progress", action="store_true", default=None, help="always show a progress bar")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="never show a progress bar")
    p.add_argument("--quiet", action="store_true", help="print nothing on success")
    p.add_argument(
        "--stop-after", choices=["jobs", "pairs", "steps", "diagnosis"], default="diagnosis",
        help="last analysis to run: 'jobs' is a quick job inventory whose memory does not grow with the flows; "
        "'pairs' adds DP/PP types, 'steps' the step timelines, 'diagnosis' the anomalies (default: %(default)s)",
    )
    p.add_argument("--plots", action="store_true", help="also write steps.png (step time per job, anomalies marked) and switches.png (bandwidth heat map)")
    p.add_argument(
        "--switch-window", type=float, default=None, metavar="SECONDS",
        help="window of the switch bandwidth comparison, aligned to the epoch (default: 300; LLMPrism used 3600)",
    )
    p.set_defaults(func=cmd_replay)


def _add_demo(sub):
    p = sub.add_parser(
        "demo",
        help="generate the demo cluster, replay it and compare with its ground truth",
        description=(
            "Runs end to end with no external services: generates the SYNTHETIC 'demo' cluster, replays "
            "its flows, prints what Prism found and how it compares with the generator's ground truth."
        ),
    )
    p.add_argument("--out", default=None, help="keep the cluster and the results here (default: a temporary directory)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--preset", default="demo", choices=["tiny", "demo", "large", "accuracy"], help="cluster (default: %(default)s)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    p.set_defaults(func=cmd_demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prism",
        description="Prism: black-box performance diagnosis of LLM training jobs from mirrored RoCEv2 network flows.",
        epilog="Run 'prism COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"prism {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_demo(sub)
    _add_replay(sub)
    _add_synth(sub)
    return parser


def cmd_synth(args) -> int:
    from synthetic import preset

    gen = preset(args.preset, seed=args.seed, with_faults=not args.no_faults, duration_s=args.duration)
    print(f"generating SYNTHETIC cluster '{args.preset}' (seed {args.seed}{', no faults' if args.no_faults else ''})...", file=sys.stderr)
    cluster = gen.generate()
    path = cluster.write(args.out, fmt=args.format)
    n_jobs = cluster.jobs["job_id"].nunique()
    print(f"wrote {len(cluster.flows):,} flows to {path}, topology and ground truth ({n_jobs} jobs, {len(cluster.faults)} faults) to {args.out}")
    return 0


def cmd_replay(args) -> int:
    from .records import FlowFormatError
    from .replay import format_summary, replay
    from .topology import Topology

    try:
        topo = Topology.from_csv(args.topology)
        kw = {"switch_window_s": args.switch_window} if args.switch_window else {}
        if args.switch_window is not None and args.switch_window <= 0:
            print("prism replay: error: --switch-window must be > 0 seconds", file=sys.stderr)
            return EXIT_BAD_INPUT
        res = replay(args.flows, topo, out_dir=args.out, chunk_rows=args.chunk_rows, progress=args.progress, stop_after=args.stop_after, plots=args.plots, **kw)
    except (FlowFormatError, FileNotFoundError) as e:
        print(f"prism replay: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if not args.quiet:
        print(format_summary(res))
        print(f"results in {args.out}")
    return 0


def cmd_demo(args) -> int:
    from synthetic import preset

    from .evaluation import adjusted_rand_index, job_name_map, score_anomalies, score_steps
    from .replay import format_summary, replay
    from .topology import Topology

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="prism-demo-"))
    cluster_dir, result_dir = out / "cluster", out / "replay"
    print(f"[1/3] generating the SYNTHETIC '{args.preset}' cluster (seed {args.seed}) in {cluster_dir}")
    cluster = preset(args.preset, seed=args.seed).generate()
    flows_path = cluster.write(cluster_dir)
    print(f"      {len(cluster.flows):,} flows, {cluster.jobs['job_id'].nunique()} jobs, {len(cluster.faults)} injected faults")
    print(f"[2/3] prism replay {flows_path} --topology {cluster_dir / 'topology.csv'} --out {result_dir}")
    res = replay([str(flows_path)], Topology.from_csv(cluster_dir / "topology.csv"), out_dir=result_dir, plots=not args.no_plots)
    print("\n".join("      " + line for line in format_summary(res).splitlines()))
    print("[3/3] compared with the ground truth")
    truth = cluster.jobs
    found = res.jobs.set_index("ip")["job_id"]
    merged = truth.assign(found=found.reindex(truth["ip"]).to_numpy())
    missing = int(merged["found"].isna().sum())
    extra = len(set(res.jobs["ip"]) - set(truth["ip"]))
    ari = adjusted_rand_index(merged["job_id"], merged["found"].fillna("<none>"))
    names = merged.dropna().groupby("found")["job_id"].agg(lambda s: ",".join(sorted(set(s))))
    for job_id, g in res.jobs.groupby("job_id"):
        print(f"      {job_id} = truth job {names.get(job_id, '?')} ({len(g)} GPUs)")
    jobs_ok = ari == 1.0 and missing == 0 and extra == 0
    print(f"      jobs {'MATCH' if jobs_ok else 'DIFFER FROM'} the ground truth: adjusted Rand index {ari:.4f}, {missing} GPUs missed, {extra} extra")
    pairs = res.pairs.merge(cluster.pairs, on=["src", "dst"], how="outer", suffixes=("", "_truth"), indicator=True)
    both = pairs[pairs["_merge"] == "both"]
    correct = int((both["type"] == both["type_truth"]).sum())
    pairs_ok = correct == len(pairs)
    print(f"      DP/PP pair types {'MATCH' if pairs_ok else 'DIFFER FROM'} the ground truth: {correct:,} of {len(pairs):,} pairs correct")
    job_names = job_name_map(res.jobs, truth)
    sc = score_steps(res.analysis.steps, cluster.steps, job_names)
    found, true_n = int(sc["found"].sum()), int(sc["true_steps"].sum())
    err = (sc["mean_err"] * sc["found"]).sum() / max(found, 1)
    print(f"      steps: {found:,} of {true_n:,} true steps found ({found / max(true_n, 1):.1%}), {int(sc['spurious'].sum())} spurious, "
          f"mean duration error {err:.1e} ({err * 100:.1e} %)")
    faults, anomalies = score_anomalies(res.analysis.anomalies, cluster.faults, job_names, res.analysis.steps)
    unexplained = anomalies[~anomalies["matched"]]
    for r in faults.itertuples(index=False):
        print(f"      injected {r.kind:<11} {r.job_id or r.subject:<12} {'FOUND' if r.matched else 'MISSED'}")
    print(f"      anomalies: {len(anomalies)} reported, {len(anomalies) - len(unexplained)} explained by injected faults, {len(unexplained)} unexplained")
    print(f"results: {result_dir}" + ("  (open timeline.json in ui.perfetto.dev; steps.png, switches.png)" if not args.no_plots else ""))
    diag_ok = bool(faults["matched"].all()) and unexplained.empty
    return 0 if jobs_ok and pairs_ok and diag_ok else 1


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. piped into head
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
