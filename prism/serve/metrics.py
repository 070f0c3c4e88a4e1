"""Prometheus exposition: a custom collector over the monitor, and the web server.

The collector yields metric families from the monitor's last published
view (:attr:`prism.serve.monitor.Monitor.view`) and its counters, so a scrape
never waits for an analysis and never sees half of one. Counters carry a
``partition`` label (the Kafka partition, or ``dir`` for a directory
source): a partition's counts move with it between replicas and across
restarts, so ``sum by () (max by (partition) (...))`` is exact across a
consumer group.

The web server answers ``/metrics``, ``/healthz`` (the daemon's loop is
alive) and ``/readyz`` (the source is connected and assigned).
"""
from __future__ import annotations

import logging
import math
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Sequence
from socketserver import ThreadingMixIn
from typing import cast
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import numpy as np
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from prism.ingest.gpu_traffic import IGNORE_REASONS
from prism.ingest.records import REJECT_REASONS
from prism.serve.monitor import STEP_BUCKETS_S, Monitor, bucket_index

__all__ = ["PrismCollector", "Health", "MetricsServer", "parse_listen_address"]

log = logging.getLogger("prism.web")

_WINDOW_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)


class Health:
    """Liveness and readiness, set by the daemon's loop."""

    def __init__(self, stall_s: float = 60.0) -> None:
        self.stall_s = stall_s
        self.last_beat = time.monotonic()
        self.ready = False
        self.reason = "starting"
        self.consumer_lag: int | None = None  # Kafka records behind, when known
        self.bad_files: list = []  # (file, error): the directory source's last skipped files
        self.source_resets = 0  # times the Kafka topic was found re-created (its log lost)

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    @property
    def alive(self) -> bool:
        return time.monotonic() - self.last_beat < self.stall_s


class PrismCollector:
    """Yields Prism's metric families (see the metric table in docs/daemon.md).

    Parameters
    ----------
    monitor : Monitor
    health : Health, optional
        Source of ``prism_consumer_lag_records`` and ``prism_up``-style state.

    Examples
    --------
    >>> from prism.ingest.topology import Topology
    >>> import pandas as pd
    >>> topo = Topology.from_frame(pd.DataFrame({"ip": ["10.0.0.1", "10.0.1.1"], "server": ["s0", "s1"]}))
    >>> reg = CollectorRegistry()
    >>> reg.register(PrismCollector(Monitor(topo)))
    >>> reg.get_sample_value("prism_jobs") == 0
    True
    """

    def __init__(self, monitor: Monitor, health: Health | None = None) -> None:
        self.monitor = monitor
        self.health = health
        self._win_counts = [0] * (len(_WINDOW_BUCKETS_S) + 1)
        self._win_sum = 0.0
        self._lock = threading.Lock()

    def describe(self) -> list[Metric]:
        return []  # no collect() at registration time

    def collect(self) -> Iterator[Metric]:
        m = self.monitor
        counts = m.counters_snapshot()
        view = m.view

        ing = CounterMetricFamily("prism_flows_ingested_total", "Valid flow records received (including those later ignored; re-deliveries once).", labels=["partition"])
        dup = CounterMetricFamily("prism_flows_duplicate_total", "Re-delivered flow records recognised and not counted again.", labels=["partition"])
        rej = CounterMetricFamily("prism_flows_rejected_total", "Malformed flow records (or whole messages) skipped, by reason.", labels=["partition", "reason"])
        ign = CounterMetricFamily("prism_flows_ignored_total", "Valid flow records that are not GPU-to-GPU training traffic, or arrived too late, by reason.", labels=["partition", "reason"])
        for p, c in sorted(counts.items()):
            ing.add_metric([p], c.get("ingested", 0))
            dup.add_metric([p], c.get("duplicate", 0))
            for r in REJECT_REASONS:
                rej.add_metric([p, r], c.get(f"rejected:{r}", 0))
            for r in IGNORE_REASONS:
                ign.add_metric([p, r], c.get(f"ignored:{r}", 0))
        yield from (ing, dup, rej, ign)
        shed = CounterMetricFamily("prism_flows_shed_total", "GPU flows dropped from the analysis window because it was full (--window.max-flows).")
        shed.add_metric([], m.window.shed)
        yield shed
        wf = GaugeMetricFamily("prism_window_flows", "GPU flows held in the analysis window.")
        wf.add_metric([], view.window_flows)
        yield wf

        jobs = view.jobs
        g = GaugeMetricFamily("prism_jobs", "Training jobs recognised.")
        g.add_metric([], len(jobs))
        yield g
        info = GaugeMetricFamily("prism_job_info", "A recognised job (value 1): its GPUs, servers and DP x PP shape.", labels=["job_id", "gpus", "servers", "dp", "pp"])
        last = GaugeMetricFamily("prism_step_duration_seconds", "Duration of the job's last complete step.", labels=["job_id"])
        hist = HistogramMetricFamily("prism_step_duration_histogram_seconds", "Step durations of the job.", labels=["job_id"])
        slowdown = GaugeMetricFamily("prism_step_slowdown_ratio", "Last step's duration over the job's baseline (median of recent normal steps).", labels=["job_id"])
        slow = GaugeMetricFamily("prism_slow_step", "1 if the job's last step was slow (cross-step diagnosis), else 0.", labels=["job_id"])
        steps = CounterMetricFamily("prism_steps_total", "Complete steps reconstructed for the job.", labels=["job_id"])
        anomalies = CounterMetricFamily("prism_anomalies_total", "Anomalies found, by kind and job (job_id empty for switches and links).", labels=["kind", "job_id"])
        lag = GaugeMetricFamily("prism_group_lag_ratio", "Pipeline-stage compute time of the group (server) over its peers' (1 = normal).", labels=["job_id", "group"])
        pairs = GaugeMetricFamily("prism_job_pairs", "GPU pairs of the job in the last window, by type (DP, PP) and certainty (confidence below 0.6: uncertain).",
                                  labels=["job_id", "type", "certainty"])
        for job_id, v in sorted(jobs.items()):
            info.add_metric([job_id, str(v.gpus), str(v.servers), str(v.dp), str(v.pp)], 1)
            for (kind, certainty), n in sorted(v.pairs.items()):
                pairs.add_metric([job_id, kind, certainty], n)
            steps.add_metric([job_id], v.steps)
            if v.last_step_s is not None:
                last.add_metric([job_id], v.last_step_s)
                slowdown.add_metric([job_id], v.slowdown if v.slowdown is not None else math.nan)
                slow.add_metric([job_id], 1.0 if v.slow else 0.0)
            hist.add_metric([job_id], cumulative_buckets(STEP_BUCKETS_S, v.bucket_counts), v.step_sum_s)
            for kind, n in sorted(v.anomalies.items()):
                anomalies.add_metric([kind, job_id], n)
            for server, r in sorted(v.group_lag.items()):
                lag.add_metric([job_id, server], r)
        for kind, n in sorted(m.fabric_anomalies.items()):
            anomalies.add_metric([kind, ""], n)
        yield from (info, pairs, last, hist, slowdown, slow, steps, anomalies, lag)

        bw = GaugeMetricFamily("prism_switch_bandwidth_bytes_per_second", "Effective bandwidth (bytes over busy time) of GPU traffic through the switch, last window.", labels=["switch"])
        ratio = GaugeMetricFamily("prism_switch_bandwidth_ratio", "Switch bandwidth over its tier's median (1 = like its peers).", labels=["switch"])
        for name, (bps, r) in sorted(view.switches.items()):
            bw.add_metric([name], bps)
            ratio.add_metric([name], r)
        yield from (bw, ratio)

        with m.lock:
            drained, m.tick_seconds = m.tick_seconds, []
        with self._lock:
            for sec in drained:
                self._win_counts[bucket_index(_WINDOW_BUCKETS_S, sec)] += 1
                self._win_sum += sec
            wp = HistogramMetricFamily("prism_window_processing_seconds", "Wall time of one window's analysis.")
            wp.add_metric([], cumulative_buckets(_WINDOW_BUCKETS_S, self._win_counts), self._win_sum)
        yield wp
        ticks = CounterMetricFamily("prism_windows_total", "Windows analysed.")
        ticks.add_metric([], view.ticks)
        yield ticks
        if view.analysed_to_ns is not None:
            wm = GaugeMetricFamily("prism_analysed_until_timestamp_seconds", "Event time up to which flows have been analysed.")
            wm.add_metric([], view.analysed_to_ns / 1e9)
            yield wm
            late = GaugeMetricFamily("prism_window_lateness_seconds",
                                     "Event time a window waits for out-of-order records: --window.lateness, or the disorder measured in the input if larger.")
            late.add_metric([], view.lateness_ns / 1e9)
            yield late
        if self.health is not None:
            up = GaugeMetricFamily("prism_ready", "1 when the source is connected and assigned.")
            up.add_metric([], 1.0 if self.health.ready else 0.0)
            yield up
            if self.health.bad_files:
                bad = GaugeMetricFamily("prism_source_bad_file_info", "A dump file the directory source skipped as unreadable (the last 10; value 1).", labels=["file", "error"])
                for name, err in self.health.bad_files:
                    bad.add_metric([name, err[:200]], 1.0)
                yield bad
            resets = CounterMetricFamily("prism_source_resets", "Times the Kafka topic was found re-created (new topic ID: the broker lost its log); every partition was read again from its start.")
            resets.add_metric([], self.health.source_resets)
            yield resets
            if self.health.consumer_lag is not None:
                cl = GaugeMetricFamily("prism_consumer_lag_records", "Kafka records (messages) behind the partitions' high watermarks.")
                cl.add_metric([], self.health.consumer_lag)
                yield cl


def cumulative_buckets(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    """``(le, cumulative count)`` pairs for a HistogramMetricFamily, from per-bucket counts.

    >>> cumulative_buckets((1, 2), [3, 0, 1])
    [('1', 3), ('2', 3), ('+Inf', 4)]
    """
    return list(zip([*map(str, bounds), "+Inf"], np.cumsum(counts).tolist()))


def parse_listen_address(text: str) -> tuple[str, int]:
    """``host:port`` (``[::1]:9464`` for IPv6; ``:9464`` for all interfaces).

    >>> parse_listen_address("127.0.0.1:9464")
    ('127.0.0.1', 9464)
    >>> parse_listen_address("[::1]:0")
    ('::1', 0)
    """
    host, sep, port = str(text).rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--web.listen-address: expected HOST:PORT, got {text!r}")
    if int(port) > 65535:
        raise ValueError(f"--web.listen-address: port {port} is out of range (0-65535; 0 picks a free port)")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class _Server(ThreadingMixIn, WSGIServer):
    """One thread per connection, at most ``max_connections`` at a time.

    Idle or slow clients cannot pile up threads: a connection over the cap is
    answered 503 at once and closed, and one that sends no complete request
    within the handler's timeout is dropped (``_QuietHandler.timeout``).
    """

    daemon_threads = True
    request_queue_size = 128  # listen backlog; socketserver's 5 stalls connects in a burst
    max_connections = 64

    def __init__(self, *args, **kwargs):
        self._slots = threading.BoundedSemaphore(self.max_connections)
        self.refused = 0  # connections answered 503 over the cap
        self.connection_errors = 0  # connections that ended in an error (failed TLS handshakes, clients gone)
        super().__init__(*args, **kwargs)

    def process_request(self, request, client_address):
        if not self._slots.acquire(blocking=False):
            self.refused += 1
            try:
                if isinstance(request, ssl.SSLSocket):  # no handshake in the accept loop: just close
                    raise OSError
                request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 25\r\n\r\ntoo many open connections")
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request, client_address):
        # a failed TLS handshake (no client certificate, a plain-HTTP client) or a client gone mid-request:
        # the client's problem, not ours; socketserver would print a traceback for each
        self.connection_errors += 1
        log.debug("connection from %s ended in an error", client_address, exc_info=True)


class _Server6(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    timeout = 10.0  # seconds a client may take to send its request (idle sockets are dropped)

    def log_message(self, *args):  # scrapes every 15 s would flood the log
        pass


class MetricsServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on a background thread.

    ``web_config`` is a ``--web.config.file`` path (:mod:`prism.serve.webconfig`):
    TLS, client certificates and basic auth; ``/healthz`` and ``/readyz``
    need no password.
    """

    def __init__(self, registry: CollectorRegistry, health: Health, address: str = "127.0.0.1:9464",
                 max_connections: int = 64, idle_timeout_s: float = 10.0, web_config: str | None = None) -> None:
        from prism.serve.webconfig import OPEN_PATHS, WebAuth

        host, port = parse_listen_address(address)
        metrics_app = make_wsgi_app(registry)
        self.web = web = WebAuth(web_config)

        def routes(environ, start_response):
            path = environ.get("PATH_INFO", "/")
            if path == "/healthz":
                ok = health.alive
                start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
                return [b"ok\n" if ok else b"main loop stalled\n"]
            if path == "/readyz":
                ok = health.ready
                start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
                return [b"ready\n" if ok else f"not ready: {health.reason}\n".encode()]
            if path in ("/metrics", "/"):
                return metrics_app(environ, start_response)
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"try /metrics, /healthz or /readyz\n"]

        def app(environ, start_response):
            web.refresh()
            extra = list(web.config.headers)

            def respond(status, headers, exc_info=None):
                return start_response(status, headers + extra, exc_info)

            if environ.get("PATH_INFO", "/") not in OPEN_PATHS and not web.check(environ.get("HTTP_AUTHORIZATION")):
                respond("401 Unauthorized", [("Content-Type", "text/plain"), ("WWW-Authenticate", 'Basic realm="prism"')])
                return [b"Unauthorized\n"]
            return routes(environ, respond)

        base = _Server6 if ":" in host else _Server
        server_class = cast("type[_Server]", type(base.__name__, (base,), {"max_connections": int(max_connections)}))
        handler_class = type("_Handler", (_QuietHandler,), {"timeout": float(idle_timeout_s)})
        self.httpd = make_server(host, port, app, server_class=server_class, handler_class=handler_class)
        if web.context is not None:
            # the handshake runs in the connection's thread (on its first read, within the idle timeout), not in accept();
            # each handshake takes the current context, so a rotated certificate applies without a restart
            assert web.config.tls is not None  # a context is made from the TLS settings only
            listen_ctx = web.config.tls.context()

            def current_context(sslsock, server_name, _ctx):
                web.refresh()
                sslsock.context = web.context

            listen_ctx.sni_callback = current_context
            self.httpd.socket = listen_ctx.wrap_socket(self.httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.scheme = "https" if web.context is not None else "http"
        self.port = self.httpd.server_port
        self.address = f"{'[' + host + ']' if ':' in host else host}:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="prism-metrics", daemon=True)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}/metrics"

    def start(self) -> "MetricsServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
