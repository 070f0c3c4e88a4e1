"""``prism synth``: a SYNTHETIC cluster's flows, topology and ground truth."""
from __future__ import annotations

import argparse
import sys

from prism.common.argtypes import non_negative_int, output_directory, seconds
from prism.ingest.formats import written_suffixes


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.add_argument("--scenario", default=None, metavar="NAME",
                   help="instead of a preset, a cluster of the robustness matrix with one real-world confounder (or 'all'): "
                        "baseline, clip, embedding, pp-sizes, tp-pp-dp, overlap, dist-opt, collector, all")
    p.add_argument("--out", required=True, type=output_directory, help="output directory (made if missing)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--duration", type=seconds, default=None, metavar="SECONDS", help="capture window, at most 7 days (default: the preset's)")
    p.add_argument("--no-faults", action="store_true", help="the fault-free twin: same seed and random draws, no injected faults")
    p.add_argument("--format", default="parquet", choices=[s.lstrip(".") for s in written_suffixes()], help="flow file format (default: %(default)s)")
    p.set_defaults(func=cmd_synth)


def cmd_synth(args: argparse.Namespace) -> int:
    from synthetic import preset

    if args.scenario:
        from synthetic.scenarios import SCENARIOS, scenario_cluster

        if args.scenario not in SCENARIOS:
            print(f"prism synth: unknown scenario {args.scenario!r}; choose one of {', '.join(SCENARIOS)}", file=sys.stderr)
            return 2
        print(f"generating SYNTHETIC scenario '{args.scenario}' (seed {args.seed}{', no faults' if args.no_faults else ''})...", file=sys.stderr)
        cluster = scenario_cluster(args.scenario, seed=args.seed, duration_s=args.duration or 60.0, with_faults=not args.no_faults)
    else:
        gen = preset(args.preset, seed=args.seed, with_faults=not args.no_faults, duration_s=args.duration)
        print(f"generating SYNTHETIC cluster '{args.preset}' (seed {args.seed}{', no faults' if args.no_faults else ''})...", file=sys.stderr)
        cluster = gen.generate()
    path = cluster.write(args.out, fmt=args.format)
    n_jobs = cluster.jobs["job_id"].nunique()
    print(f"wrote {len(cluster.flows):,} flows to {path}, topology and ground truth ({n_jobs} jobs, {len(cluster.faults)} faults) to {args.out}")
    return 0
