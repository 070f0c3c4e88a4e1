"""``prism whatif``: a reconstructed timeline simulated as it was and under changes."""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from prism.common.argtypes import output_directory
from prism.common.output import EXIT_BAD_INPUT, add_output_flags, finish

if TYPE_CHECKING:
    from prism.whatif.run import WhatIfResult


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from prism.whatif.scenarios import SCENARIO_HELP

    p = sub.add_parser(
        "whatif",
        help="what-if replay: simulate a reconstructed timeline under changes (healthy switch, no stragglers...)",
        description=(
            "Turn an observed timeline into an execution graph (tasks on ranks or DP groups; pipeline send/receive "
            "pairs and collectives as synchronisations all members join) and simulate it, unchanged and under "
            "--scenario. Input: a 'prism replay' output directory (network only), an op-level trace with --ops "
            "(the StragglerAnalysis schema: dp_rank, stage, rank, step, optype, start_ts, duration, seq_id), or "
            "PyTorch profiler (Kineto) traces with --kineto, one per rank (GPU kernels on their streams, the host "
            "calls that launched them, NCCL collectives matched across ranks, steps from ProfilerStep#N; the "
            "summary's replay_error_* compares the unchanged graph's step times with the measured ones). "
            "Writes OUT/summary.json (per job: observed, replayed, baseline and predicted mean step time and the "
            "predicted speed-up, baseline over predicted; "
            "jobs that could not be modelled, with why), OUT/steps.csv, OUT/timeline.json (the predicted "
            "timeline, Chrome trace) and, with --attribute, OUT/attribution.csv. On op traces scenarios run "
            "without launch delays: compare 'predicted' with 'baseline', the observed work simulated the same way. "
            "On a network replay every job is predicted together: move-job:JOB@NAME takes JOB's traffic off a "
            "switch or link and gives the jobs that shared it with JOB the capacity it leaves (their shares measured "
            "in the capture, taken to overlap all the time the switch was slow); scale-dp:N re-costs each DP ring's collective "
            "for N replicas at the rate the ring was measured at (the spine tier's where a ring outgrows its leaf)."
        ),
    )
    p.add_argument("replay_dir", nargs="?", metavar="REPLAY_DIR", help="output directory of 'prism replay'")
    p.add_argument("--ops", metavar="TRACE", help="op-level trace (.parquet or .csv) instead of REPLAY_DIR")
    p.add_argument("--kineto", nargs="+", metavar="TRACE",
                   help="PyTorch profiler (Kineto) traces instead of REPLAY_DIR: a directory of them or the files "
                        "(.json, .json.gz), one per rank; every rank of the job (distributedInfo.world_size) must be there")
    p.add_argument("--partial", action="store_true",
                   help="with --kineto: model the ranks given although the job had more (a collective's last arrival "
                        "is then the last among them)")
    p.add_argument("--meta", metavar="YAML", help="with --ops: the job's parallel sizes (dp_size, pp_size, trial_name) and model (num_layers, layers_per_stage; "
                   "hidden_size, seq_length for hidden:H)")
    p.add_argument("--topology", metavar="CSV", help="with REPLAY_DIR: the topology (ip,server,rail,leaf) for heal-switch, heal-link and move-job to tell "
                        "which DP rings cross the switch, and for scale-dp which rings outgrow their leaf")
    p.add_argument("--scenario", action="append", default=[], metavar="S", help=SCENARIO_HELP)
    p.add_argument("--attribute", action="store_true",
                   help="attribute each job's slowdown (observed vs ideal: no straggler, no imbalance) to workers, DP "
                        "ranks, stages and op types (op traces) or DP rings, stages and servers (network): "
                        "OUT/attribution.csv and the summary's S, M_W, M_S")
    p.add_argument("--search", action="store_true",
                   help="with --ops: predict every pipeline stages x DP size x micro-batches configuration (TP fixed) "
                        "within --gpus, ranked by throughput per GPU; OUT/search.csv and the summary's search")
    p.add_argument("--gpus", type=int, metavar="N", help="with --search: the GPU budget")
    p.add_argument("--search-microbatches", metavar="M,M,...",
                   help="with --search: micro-batch counts to try (default: the observed global batch, M from DP)")
    p.add_argument("--search-steps", type=int, default=4, metavar="K",
                   help="with --search: simulate each configuration on the trace's first K steps (default 4)")
    p.add_argument("--chakra", metavar="DIR", type=output_directory,
                   help="with --ops or --kineto: also write the graph simulated (after the scenarios) as MLCommons Chakra "
                        "execution traces, the input of ASTRA-sim and SimAI: DIR/PREFIX.RANK.et per rank (compute nodes with "
                        "their durations, collectives, pipeline sends/receives, dependencies within each rank) and "
                        "DIR/PREFIX.comm_groups.json")
    p.add_argument("--chakra-prefix", default="workload", metavar="PREFIX",
                   help="with --chakra: the files' name before .RANK.et (default workload: pass DIR/workload to the simulator)")
    p.add_argument("--out", required=True, type=output_directory, help="output directory (made if missing)")
    p.add_argument("--quiet", action="store_true", help="print nothing on success")
    add_output_flags(p)
    p.set_defaults(func=cmd_whatif)


def cmd_whatif(args: argparse.Namespace) -> int:
    from prism.whatif.run import whatif_kineto, whatif_ops, whatif_replay, write_outputs
    from prism.whatif.scenarios import parse_scenario

    try:
        scenarios = [parse_scenario(s) for s in args.scenario]
        if args.search and not args.ops:
            raise ValueError("--search needs an op trace (--ops)")
        if args.search and (args.gpus is None or args.gpus < 1):
            raise ValueError("--search needs --gpus N (the GPU budget, N >= 1)")
        if args.search and args.search_steps < 1:
            raise ValueError(f"--search-steps {args.search_steps}: at least 1")
        if sum(map(bool, (args.ops, args.replay_dir, args.kineto))) != 1:
            raise ValueError("give one of REPLAY_DIR, --ops TRACE or --kineto TRACE...")
        if args.chakra and args.replay_dir:
            raise ValueError("--chakra needs ranks: give --ops or --kineto (a network replay models DP rings, not ranks)")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args.chakra_prefix):
            raise ValueError(f"--chakra-prefix {args.chakra_prefix!r}: letters, digits, '.', '_' and '-' only")
        if args.chakra:
            try:
                import prism.whatif.chakra  # noqa: F401  (protobuf, an extra)
            except ImportError as e:
                raise ValueError(f"--chakra needs protobuf ({e}): pip install 'prism-netdiag[chakra]'") from None
        if args.partial and not args.kineto:
            raise ValueError("--partial goes with --kineto")
        if args.meta and not args.ops:  # ignored otherwise: say so rather than run without what the user meant
            raise ValueError("--meta goes with --ops (the op trace's parallel sizes)")
        if args.topology and not args.replay_dir:
            raise ValueError("--topology goes with REPLAY_DIR (a 'prism replay' output directory)")
        if args.replay_dir and Path(args.replay_dir).is_file():
            raise ValueError(f"{args.replay_dir} is a file; an op-level trace goes with --ops, a 'prism replay' output directory as REPLAY_DIR")
        if args.ops:
            from prism.common.yamlfile import read_yaml

            meta = read_yaml(args.meta, "--meta") if args.meta else {}
            if not isinstance(meta, dict):
                raise ValueError(f"--meta {args.meta}: expected a mapping (dp_size, pp_size, trial_name)")
            result = whatif_ops(args.ops, meta, scenarios, attribution=args.attribute)
            if args.search:
                _search(args, meta, result)
        elif args.kineto:
            if args.attribute:
                raise ValueError("--attribute is not available for Kineto traces")
            result = whatif_kineto(args.kineto, scenarios, partial=args.partial)
        else:
            result = whatif_replay(args.replay_dir, scenarios, args.topology, attribution=args.attribute)
    except (ValueError, OSError) as e:
        print(f"prism whatif: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    write_outputs(args.out, result)
    chakra = None
    if args.chakra:
        from prism.whatif.chakra import write_chakra

        assert result.et_tasks is not None  # set by whatif_ops and whatif_kineto
        try:
            chakra = write_chakra(*result.et_tasks(), args.chakra, args.chakra_prefix)
        except (ValueError, OSError) as e:
            print(f"prism whatif: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
    warnings = list(result.warnings) + ([f"chakra: {w}" for w in chakra["warnings"]] if chakra else [])
    warnings += [f"job {job} not modelled: {reason}" for job, reason in result.skipped.items()]
    warnings += [f"job {job}: {w}" for job, j in result.jobs.items() for w in j.get("warnings", [])]
    if not result.jobs:
        warnings.append("no job was modelled")

    def text():
        label = ", ".join(args.scenario) or "no change"
        lines = [f"{'job':<16} {'observed':>10} {'replayed':>10} {'baseline':>10} {'predicted':>10} {'speed-up':>9}  "
                 f"(mean step over the steps modelled, s; {label})"]
        for job, j in result.jobs.items():
            lines.append(f"{job:<16} {j['observed_step_s']:>10.4f} {j['replayed_step_s']:>10.4f} {j['baseline_step_s']:>10.4f} "
                         f"{j['predicted_step_s']:>10.4f} {j['predicted_speedup']:>8.3f}x  replay error {j['replay_error_mean_pct']:.3f}% mean")
        if result.attribution is not None:
            lines.append(_format_attribution(result))
        if result.search is not None:
            lines.append(_format_search(result))
        extra = (", attribution.csv" if result.attribution is not None else "") + (", search.csv" if result.search is not None else "")
        lines.append(f"wrote summary.json, steps.csv, timeline.json{extra} to {args.out}")
        if chakra:
            lines.append(f"wrote {len(chakra['files'])} Chakra ET file(s) ({sum(chakra['nodes_per_rank'].values())} nodes) and "
                         f"{chakra['prefix']}.comm_groups.json to {chakra['dir']}")
        return "\n".join(lines)

    payload = {"jobs": result.jobs, "skipped": result.skipped, "out": str(args.out)}
    if chakra:
        payload["chakra"] = {k: v for k, v in chakra.items() if k != "warnings"}
    return finish(args, "whatif", payload, warnings, text=text)


def _format_attribution(result: WhatIfResult) -> str:
    """Per job: S, M_W, M_S and the top groups of each level."""
    assert result.attribution is not None  # called only for a what-if run with --attribute
    lines = []
    for job, j in result.jobs.items():
        a = j.get("attribution")
        if not a:
            continue
        head = f"\njob {job}: slowdown S = {a['slowdown']:.3f} (mean step {a['baseline_step_mean_s']:.4f} s, ideal {a['ideal_step_mean_s']:.4f} s)"
        if "m_w" in a:
            head += f"; M_W {a['m_w']:.1%} (workers {', '.join(map(str, a['m_w_workers']))}), M_S {a['m_s']:.1%}"
        lines.append(head)
        t = result.attribution[result.attribution["job_id"] == job]
        for level, rows in t.groupby("level", sort=False):
            top = ", ".join(f"{k} {s:.3f}" for k, s in rows[["key", "slowdown"]].head(3).itertuples(index=False))
            lines.append(f"  {level:<8} {top}{' ...' if len(rows) > 3 else ''}")
    return "\n".join(lines)


def _search(args: argparse.Namespace, meta: dict, result: WhatIfResult) -> None:
    """--search: every configuration within --gpus, into ``result`` (progress on stderr unless quiet or JSON)."""
    from prism.whatif.search import search_configs

    mbs = None
    if args.search_microbatches:
        try:
            mbs = sorted({int(x) for x in args.search_microbatches.split(",")})
        except ValueError:
            raise ValueError(f"--search-microbatches {args.search_microbatches!r}: whole numbers, comma-separated") from None
        if mbs[0] < 1 or mbs[-1] > 1024:
            raise ValueError(f"--search-microbatches {args.search_microbatches!r}: each from 1 to 1024")
    quiet = args.quiet or args.output == "json"
    table, summary = search_configs(args.ops, meta, args.gpus, mbs, steps=args.search_steps,
                                    progress=None if quiet else lambda s: print(f"prism whatif: search {s}", file=sys.stderr))
    result.search, result.search_table = summary, table


def _format_search(result: WhatIfResult) -> str:
    """The best configurations by throughput per GPU, and what was pruned."""
    s = result.search
    assert s is not None and result.search_table is not None
    o = s["observed"]
    lines = [f"\nsearch within {s['gpus']} GPUs (TP {s['tp']}; observed PP {o['pp']} DP {o['dp']} M {o['microbatches']}, "
             f"step {o['step_s']:.4f} s over {s['steps']} steps): {s['simulated']} of {s['candidates']} configurations simulated",
             f"  {'PP':>4} {'DP':>5} {'M':>5} {'GPUs':>5} {'step s':>9} {'thr/GPU':>8}"]
    for r in s["top"]:
        lines.append(f"  {r['pp']:>4} {r['dp']:>5} {r['microbatches']:>5} {r['gpus']:>5} {r['step_s']:>9.4f} {r['throughput_per_gpu']:>7.3f}x")
    if s["pruned"]:
        lines.append("  pruned: " + ", ".join(f"{n} {why}" for why, n in s["pruned"].items()))
    return "\n".join(lines)
