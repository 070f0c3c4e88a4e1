"""``prism synth``: a SYNTHETIC cluster's flows, topology and ground truth."""
from __future__ import annotations

import argparse
import sys

from prism.common.argtypes import bounded_int, non_negative_int, output_directory, output_file, seconds
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
    p.add_argument("--pcap", type=output_file, default=None, metavar="FILE",
                   help="also write the flows as a SYNTHETIC capture of RoCEv2 mirrored over ERSPAN (pcap, ns timestamps; end the name in "
                        ".synthetic.pcap to say so), with OUT/switch_map.yaml for `prism collect --switch-map`. Written in chunks: "
                        "memory stays bounded whatever the flow count")
    p.add_argument("--pcap.max-packets", dest="pcap_max_packets", type=bounded_int(2, 1 << 20), default=16, metavar="N",
                   help="packets written per message (FIRST, N-2 more, LAST); the skipped middle packets show as lost in `prism collect`, "
                        "sizes stay exact (default: %(default)s)")
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
    if args.pcap:
        return _write_pcap(cluster.flows, args)
    return 0


def _write_pcap(flows, args: argparse.Namespace) -> int:
    import os
    import time
    from pathlib import Path

    import yaml

    from synthetic.pcapgen import write_roce_pcap

    t0, shown = time.monotonic(), [0]

    def progress(done: int, total: int) -> None:
        tenth = 10 * done // max(total, 1)
        if tenth > shown[0] and total >= 10_000:  # a line per tenth on long writes
            shown[0] = tenth
            size = os.path.getsize(args.pcap) if os.path.exists(args.pcap) else 0
            print(f"  pcap: {done:,} of {total:,} flows ({10 * tenth}%), {size / 1e6:,.0f} MB, {time.monotonic() - t0:.0f} s", file=sys.stderr)

    print(f"writing a SYNTHETIC RoCEv2-in-ERSPAN capture of {len(flows):,} flows to {args.pcap} "
          f"(at most {args.pcap_max_packets} packets per message)...", file=sys.stderr)
    try:
        Path(args.pcap).parent.mkdir(parents=True, exist_ok=True)
        info = write_roce_pcap(flows, args.pcap, max_packets=args.pcap_max_packets, progress=progress)
        switch_map = Path(args.out) / "switch_map.yaml"
        switch_map.write_text(yaml.safe_dump(info["switch_map"]))
    except OSError as e:
        print(f"prism synth: error: cannot write the capture {args.pcap!r}: {e.strerror or e}", file=sys.stderr)
        return 2
    print(f"wrote {info['packets']:,} packets ({len(info['expected']):,} messages, {info['capped_messages']:,} cut to "
          f"{args.pcap_max_packets} packets) to {args.pcap}; read it with: prism collect {args.pcap} --switch-map {switch_map} --out FILE")
    return 0
