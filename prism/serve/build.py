"""One wiring of the daemon: settings -> topology -> monitor -> metrics server -> source -> loop.

``prism daemon``, the live demo (``prism demo``) and the daemon tests each
used to put these parts together themselves, and they drifted (the health
check's stall time, which errors were caught, what was closed on the way
out). :func:`build_daemon` is the one place: it takes checked
:class:`~prism.serve.settings.DaemonSettings` and returns a
:class:`DaemonService` holding every part, to run in this thread (the
command) or on a thread of its own (the demo, the tests), and to close.

A part that cannot start raises :class:`StartupError` with the message the
command prints and its exit code (2: a bad setting or file; 1: Kafka
unreachable); what was started before it is stopped again.
"""
from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from prism import __version__
from prism.common.kernels import log_compile_state
from prism.common.output import EXIT_BAD_INPUT, EXIT_FAILED
from prism.ingest.inventory import JobNames
from prism.ingest.records import FlowFormatError
from prism.ingest.topology import Topology
from prism.serve.daemon import Daemon
from prism.serve.jobtopic import AnalyseMonitor, ForwardingSource, IngestMonitor, JobTopicSource, analyse_group
from prism.serve.kafkaconf import KafkaConnectError, KafkaSecurity, check_connection
from prism.serve.metrics import Health, MetricsServer, PrismCollector
from prism.serve.monitor import Monitor
from prism.serve.settings import DaemonSettings
from prism.serve.sources import DirectorySource, KafkaSource, ensure_topic
from prism.serve.warmup import warm_up

__all__ = ["DaemonService", "StartupError", "build_daemon"]

log = logging.getLogger("prism.daemon")


class StartupError(Exception):
    """A part of the daemon could not start: the message to print and the exit code (:mod:`prism.common.output`)."""

    def __init__(self, message: str, exit_code: int = EXIT_BAD_INPUT):
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(eq=False)
class DaemonService:
    """A wired daemon: its parts, and how to run and close them.

    ``registry`` is what ``server`` serves (tests read metrics from it);
    ``thread`` is set by :meth:`start`.
    """

    settings: DaemonSettings
    topology: Topology
    monitor: Monitor
    health: Health
    registry: CollectorRegistry
    server: MetricsServer
    source: KafkaSource | DirectorySource
    daemon: Daemon
    thread: threading.Thread | None = None
    _closed: bool = field(default=False, repr=False)

    def start(self) -> threading.Thread:
        """Run the loop on a thread of its own (a daemon thread: it does not keep the process up)."""
        self.thread = threading.Thread(target=self.daemon.run, name="prism-daemon", daemon=True)
        self.thread.start()
        return self.thread

    def run(self) -> None:
        """Run the loop in this thread until :meth:`stop` (a signal handler, say); then close."""
        try:
            self.daemon.run()
        finally:
            self.close()

    def stop(self, timeout_s: float | None = None) -> None:
        """Ask the loop to stop; if it runs on :meth:`start`'s thread, wait for that up to ``timeout_s``."""
        self.daemon.stop()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout=timeout_s)

    def close(self, timeout_s: float | None = 30.0) -> None:
        """Stop the loop, then close the source (leaving the consumer group) and the metrics server. Once."""
        if self._closed:
            return
        self._closed = True
        self.stop(timeout_s)
        self.source.close()
        self.server.stop()


def build_daemon(
    settings: DaemonSettings,
    topology: Topology | None = None,
    *,
    on_event: Callable[[str, dict], None] | None = None,
    warm: bool = True,
    free_port_if_taken: bool = False,
    log_startup: bool = False,
) -> DaemonService:
    """Wire a daemon from ``settings``; raise :class:`StartupError` if a part cannot start.

    Parameters
    ----------
    settings : DaemonSettings
    topology : Topology, optional
        Default: read from ``settings.topology`` (the ``--topology`` CSV).
    on_event : callable(kind, dict), optional
        Each new job and anomaly (see :class:`~prism.serve.daemon.Daemon`).
    warm : bool
        Load the compiled kernels now (:func:`~prism.serve.warmup.warm_up`),
        not inside the first window. The tests, which run many daemons in
        one process, skip it.
    free_port_if_taken : bool
        If ``settings.web_listen_address`` is taken, listen on a free port
        of the same host instead (the demo, which prints the address).
    log_startup : bool
        Log the effective settings once, as ``starting`` (``prism daemon``).
    """
    if topology is None:
        if settings.topology is None:
            raise ValueError("build_daemon: no topology (neither settings.topology nor a Topology given)")
        try:
            topology = Topology.from_csv(settings.topology)
        except (FlowFormatError, FileNotFoundError, ValueError) as e:
            raise StartupError(str(e)) from e
    try:
        names = JobNames.from_csv(settings.job_names, topology) if settings.job_names else None
    except (FlowFormatError, FileNotFoundError) as e:
        raise StartupError(str(e)) from e
    monitor_type = {"ingest": IngestMonitor, "analyse": AnalyseMonitor}.get(settings.role, Monitor)
    monitor = monitor_type(topology, settings.monitor, job_names=names)
    # a broker that cannot be reached is said before the warm-up, which compiles for 15-45 s on a cold cache
    _check_kafka(settings)
    # the compiled kernels load now, not inside the first window; before any
    # other thread runs, as the warm-up silences the prism loggers meanwhile
    compiling = log_compile_state(log, "daemon's start") if warm and log_startup else False
    warmed = warm_up() if warm else 0.0
    if compiling:
        log.info("kernels compiled", extra={"fields": {"seconds": round(warmed, 1), "cache": os.environ.get("NUMBA_CACHE_DIR", "beside the code")}})
    health = Health(stall_s=settings.health_stall_s)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PrismCollector(monitor, health))
    server = _start_server(registry, health, settings, free_port_if_taken)
    if log_startup:
        log.info("starting", extra={"fields": _startup_fields(settings, topology, server)})
        log.debug("compiled kernels loaded", extra={"fields": {"seconds": round(warmed, 3)}})
    try:
        source = _open_source(settings)
    except StartupError:
        server.stop()
        raise
    daemon = Daemon(source, monitor, health, on_event=on_event)
    return DaemonService(settings, topology, monitor, health, registry, server, source, daemon)


def _start_server(registry: CollectorRegistry, health: Health, settings: DaemonSettings, free_port_if_taken: bool) -> MetricsServer:
    """The metrics endpoint, listening; a bad ``--web.config.file`` or an address that cannot be bound is a usage error."""
    address = settings.web_listen_address
    try:
        try:
            return MetricsServer(registry, health, address, web_config=settings.web_config_file).start()
        except OSError:
            if not free_port_if_taken:
                raise
            host = address.rpartition(":")[0] or "127.0.0.1"
            return MetricsServer(registry, health, f"{host}:0", web_config=settings.web_config_file).start()
    except ValueError as e:
        raise StartupError(str(e)) from e
    except OSError as e:
        raise StartupError(f"--web.listen-address {address}: {e}") from e


def _check_kafka(settings: DaemonSettings) -> None:
    """Connect to the brokers once (see :func:`check_connection`): a failure is one clear line, exit 1."""
    if settings.kafka is not None:
        try:
            check_connection(settings.kafka.bootstrap_servers, settings.kafka.security)
        except KafkaConnectError as e:
            raise StartupError(str(e), EXIT_FAILED) from e


def _open_source(settings: DaemonSettings) -> KafkaSource | DirectorySource:
    """The directory or Kafka source (its brokers checked by :func:`_check_kafka` before)."""
    kafka = settings.kafka
    try:
        if kafka is None:
            assert settings.source_dir is not None  # DaemonSettings has exactly one source
            return DirectorySource(settings.source_dir)
        common: dict[str, Any] = dict(security=kafka.security, replica_id=kafka.replica_id, max_message_bytes=kafka.max_message_bytes,
                      max_poll_interval_ms=int(settings.max_poll_interval_s * 1000), session_timeout_ms=int(kafka.session_timeout_s * 1000))
        if settings.role == "ingest":
            return ForwardingSource(kafka.bootstrap_servers, kafka.topic, kafka.group_id, kafka.summary_topic, job_topic=kafka.job_topic,
                                    job_partitions=kafka.job_topic_partitions, **common)
        if settings.role == "analyse":
            ensure_topic(kafka.bootstrap_servers, kafka.job_topic, kafka.job_topic_partitions, security=kafka.security)
            return JobTopicSource(kafka.bootstrap_servers, kafka.job_topic, analyse_group(kafka.group_id), kafka.summary_topic,
                                  **common)
        return KafkaSource(kafka.bootstrap_servers, kafka.topic, kafka.group_id, kafka.summary_topic, **common)
    except (FileNotFoundError, ValueError) as e:
        raise StartupError(str(e)) from e
    except KafkaConnectError as e:
        raise StartupError(str(e), EXIT_FAILED) from e
    except Exception as e:  # kafka-python's errors after the connection check (a broker gone meanwhile)
        raise StartupError(f"cannot reach Kafka at {kafka.bootstrap_servers if kafka else None}: {type(e).__name__}: {e}", EXIT_FAILED) from e


def _startup_fields(settings: DaemonSettings, topology: Topology, server: MetricsServer) -> dict[str, object]:
    """The effective settings, logged once at start, so that a log shows what this run was doing."""
    ms = settings.monitor
    fields: dict[str, object] = {"version": __version__, "web": server.url, "web_auth": "basic" if server.web.auth_required else "none",
              "topology_nics": len(topology.nics), "topology_servers": int(topology.nics["server"].nunique()), "window": f"{ms.window_s:g}s",
              "step": f"{ms.step_s:g}s", "lateness": f"{ms.lateness_s:g}s", "max_flows": ms.max_window_flows, "jobs_ttl": f"{ms.pair_ttl_s:g}s"}
    if settings.kafka is None:
        fields.update(source=settings.source_dir)
    else:
        k = settings.kafka
        security = k.security if k.security is not None else KafkaSecurity()
        fields.update(kafka=k.bootstrap_servers, topic=k.topic, group=k.group_id, kafka_security=security.describe(), role=settings.role)
        if settings.role == "ingest":
            fields.update(job_topic=k.job_topic)
        elif settings.role == "analyse":  # it reads the job topic, in a group of its own
            fields.update(topic=k.job_topic, group=analyse_group(k.group_id))
    return fields

