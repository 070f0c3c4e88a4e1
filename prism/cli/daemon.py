"""``prism daemon``: the long-running service, its flags and its wiring."""
from __future__ import annotations

import sys

from prism import __version__
from prism.serve.kafkaconf import SECURITY_FLAGS, KafkaConnectError, check_connection, security_from_args
from prism.common.logs import setup_logging
from prism.common.output import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK




def add_command(sub):
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
