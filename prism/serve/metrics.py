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

import asyncio
import io
import logging
import math
import re
import socket
import ssl
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import numpy as np
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric

from prism.analysis.diagnosis import JOB_STATES
from prism.ingest.gpu_traffic import IGNORE_REASONS
from prism.ingest.records import REJECT_REASONS
from prism.serve.monitor import STEP_BUCKETS_S, Monitor, bucket_index

__all__ = ["PrismCollector", "Health", "MetricsServer", "parse_listen_address", "printable", "anomaly_info", "collective_families"]

log = logging.getLogger("prism.web")

_WINDOW_BUCKETS_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
#: ``prism_anomaly_info``: longest explanation and subject label (characters, escaped; a longer one ends in ``…``)
ANOMALY_EXPLANATION_CHARS = 200
ANOMALY_SUBJECT_CHARS = 120


def printable(text: object, limit: int = 200) -> str:
    """``text`` safe for a label value or a line of text: unprintable characters escaped, at most ``limit`` characters.

    A byte that was not UTF-8 (a file name's, kept by ``surrogateescape``) shows as ``\\xNN``; a control
    character as its escape; a longer text is cut, ending in ``…``.

    >>> print(printable("bad\\udcff\\x00\\nname.parquet"))
    bad\\xff\\x00\\x0aname.parquet
    >>> printable("x" * 10, limit=5)
    'xxxx…'
    """
    out: list[str] = []
    size = 0
    for c in str(text):
        o = ord(c)
        if 0xDC80 <= o <= 0xDCFF:
            piece = f"\\x{o - 0xDC00:02x}"
        elif c.isprintable():
            piece = c
        else:
            piece = f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"
        if size + len(piece) > limit:
            while out and size > limit - 1:
                size -= len(out.pop())
            out.append("…")
            break
        out.append(piece)
        size += len(piece)
    return "".join(out)


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
        self.handovers_out: tuple[int, int] | None = None  # the analyse stage: re-keyed jobs' states sent, and failed
        self.incomplete_windows = 0  # windows incomplete (late input) among those of the last --jobs.ttl of event time

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    @property
    def alive(self) -> bool:
        return time.monotonic() - self.last_beat < self.stall_s

    def readiness(self) -> tuple[int, str]:
        """``/readyz``'s status and body.

        503 until the source is connected and assigned. Then 200, also when
        dump files were skipped as unreadable: the daemon serves what it
        could read, and routing scrapes away from it (another replica reads
        the same directory) or restarting it would not bring the skipped rows
        back; the body then says ``degraded`` and names the files, as
        ``prism_source_bad_file_info`` does. Likewise when windows of the
        last ``--jobs.ttl`` of event time were incomplete (late input: no
        steps or anomalies from them, see ``prism_windows_incomplete``):
        another replica would get the same input.

        >>> h = Health(); h.ready = True; h.bad_files = [("a.parquet", "not a parquet file")]
        >>> print(h.readiness()[1], end="")
        ready, degraded: 1 dump file skipped as unreadable (its flows are missing from the metrics):
          a.parquet: not a parquet file
        >>> h.bad_files = []; h.incomplete_windows = 3
        >>> print(h.readiness()[1], end="")
        ready, degraded: 3 windows incomplete (late input): no steps or anomalies reported from them
        """
        if not self.ready:
            return 503, f"not ready: {printable(self.reason, 500)}\n"
        bad, late = list(self.bad_files), self.incomplete_windows
        if not bad and not late:
            return 200, "ready\n"
        lines = []
        if late:
            lines.append(f"ready, degraded: {late} window{'s' if late > 1 else ''} incomplete (late input): "
                         f"no steps or anomalies reported from {'them' if late > 1 else 'it'}")
        if bad:
            n = len(bad)
            lines.append(f"ready, degraded: {n} dump file{'s' if n > 1 else ''} skipped as unreadable ({'their' if n > 1 else 'its'} flows are missing from the metrics):")
            lines += [f"  {printable(name)}: {printable(err)}" for name, err in bad]
        return 200, "\n".join(lines) + "\n"


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
        win = CounterMetricFamily("prism_flows_windowed_total", "GPU-to-GPU flow records taken into the analysis window (ingested = windowed + ignored).",
                                  labels=["partition"])
        for p, c in sorted(counts.items()):
            ing.add_metric([p], c.get("ingested", 0))
            win.add_metric([p], c.get("windowed", 0))
            dup.add_metric([p], c.get("duplicate", 0))
            for r in REJECT_REASONS:
                rej.add_metric([p, r], c.get(f"rejected:{r}", 0))
            for r in IGNORE_REASONS:
                ign.add_metric([p, r], c.get(f"ignored:{r}", 0))
        yield from (ing, dup, rej, ign, win)
        shed = CounterMetricFamily("prism_flows_shed_total", "GPU flows dropped from the analysis window because it was full (--window.max-flows).")
        shed.add_metric([], m.window.shed)
        yield shed
        wf = GaugeMetricFamily("prism_window_flows", "GPU flows held in the analysis window.")
        wf.add_metric([], view.window_flows)
        yield wf
        if getattr(m, "handovers_taken", None) is None:  # not the analyse stage, whose flows wait as job-topic messages
            waiting = GaugeMetricFamily("prism_flows_waiting", "GPU flows read and waiting for their window (until every partition passed it); "
                                        "not bounded by --window.max-flows.")
            waiting.add_metric([], m.held())
            yield waiting

        jobs = view.jobs
        g = GaugeMetricFamily("prism_jobs", "Training jobs recognised.")
        g.add_metric([], len(jobs))
        yield g
        info = GaugeMetricFamily("prism_job_info", "A recognised job (value 1): its GPUs, servers, DP x PP shape and the scheduler's name "
                                 "(--jobs.names; empty if none).", labels=["job_id", "gpus", "servers", "dp", "pp", "job_name"])
        last = GaugeMetricFamily("prism_step_duration_seconds", "Duration of the job's last complete step.", labels=["job_id"])
        hist = HistogramMetricFamily("prism_step_duration_histogram_seconds", "Step durations of the job.", labels=["job_id"])
        slowdown = GaugeMetricFamily("prism_step_slowdown_ratio", "Last step's duration over the job's baseline (median of recent normal steps).", labels=["job_id"])
        slow = GaugeMetricFamily("prism_slow_step", "1 if the job's last step was slow (cross-step diagnosis), else 0.", labels=["job_id"])
        steps = CounterMetricFamily("prism_steps_total", "Complete steps reconstructed for the job.", labels=["job_id"])
        anomalies = CounterMetricFamily("prism_anomalies_total", "Anomalies found, by kind and job (job_id empty for switches and links).", labels=["kind", "job_id"])
        lag = GaugeMetricFamily("prism_group_lag_ratio", "Pipeline-stage compute time of the group (server) over its peers' (1 = normal).", labels=["job_id", "group"])
        pairs = GaugeMetricFamily("prism_job_pairs", "GPU pairs of the job in the last window, by type (DP, PP) and certainty (confidence below 0.6: uncertain).",
                                  labels=["job_id", "type", "certainty"])
        state = GaugeMetricFamily("prism_job_state", "The job's state (value 1 on the current one): running; hung (its last collective never "
                                  "completed and it went silent); ended (silent after a whole step).", labels=["job_id", "state"])
        for job_id, v in sorted(jobs.items()):
            info.add_metric([job_id, str(v.gpus), str(v.servers), str(v.dp), str(v.pp), v.name], 1)
            for name in JOB_STATES:
                state.add_metric([job_id, name], 1.0 if v.state == name else 0.0)
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
        yield from (info, state, pairs, last, hist, slowdown, slow, steps, anomalies, lag)
        yield from collective_families(jobs)
        yield anomaly_info(view.anomalies)

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
        inc = CounterMetricFamily("prism_windows_incomplete_total", "Windows with GPU flows of their time missing (late input): not analysed "
                                  "(no steps, no anomalies), or analysed before the late flows came.")
        inc.add_metric([], m.windows_incomplete)
        recent = GaugeMetricFamily("prism_windows_incomplete", "Incomplete windows among those of the last --jobs.ttl of event time (/readyz degraded).")
        recent.add_metric([], m.recent_incomplete())
        late_flows = CounterMetricFamily("prism_window_late_flows_total", "GPU flows that came after the window of their time was analysed, "
                                         "or too late to be kept (counted once, against that window).")
        late_flows.add_metric([], m.late_flows)
        yield from (inc, recent, late_flows)
        taken, missed = getattr(m, "handovers_taken", None), getattr(m, "handovers_missed", None)
        if taken is not None:  # the analyse stage (prism.serve.jobtopic.AnalyseMonitor)
            ho = CounterMetricFamily("prism_job_handovers_total", "Jobs re-keyed here from another analyse replica's id: their state taken "
                                     "(history kept), or given up after waiting (steps numbered from 0 here; see the log).", labels=["outcome"])
            ho.add_metric(["taken"], taken)
            ho.add_metric(["missed"], missed or 0)
            yield ho
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
                    bad.add_metric([printable(name), printable(err)], 1.0)
                yield bad
            resets = CounterMetricFamily("prism_source_resets", "Times the Kafka topic was found re-created (new topic ID: the broker lost its log); every partition was read again from its start.")
            resets.add_metric([], self.health.source_resets)
            yield resets
            if self.health.handovers_out is not None:
                out = CounterMetricFamily("prism_job_handovers_out_total", "Jobs re-keyed from an id this replica analysed to another replica's: "
                                          "sent: a state handed to the producer; failed: a state too big for a request, or a send "
                                          "that failed (also one counted sent; the new owner numbers the job's steps from 0).", labels=["outcome"])
                out.add_metric(["sent"], self.health.handovers_out[0])
                out.add_metric(["failed"], self.health.handovers_out[1])
                yield out
            if self.health.consumer_lag is not None:
                cl = GaugeMetricFamily("prism_consumer_lag_records", "Kafka records (messages) behind the partitions' high watermarks.")
                cl.add_metric([], self.health.consumer_lag)
                yield cl


def collective_families(jobs: dict) -> list[Metric]:
    """The per-job collective metrics (:class:`prism.serve.monitor.CollectiveView` per job and kind), as NCCL Inspector
    reports them from inside NCCL but from the network: counts, bytes and time as counters, the last window's duration
    quantiles and bus bandwidth (of the collectives counted at the last window) as gauges (see :mod:`prism.analysis.collectives` for what the network can tell)."""
    labels = ["job_id", "kind"]
    count = CounterMetricFamily("prism_collectives_total", "Collectives of the job seen on the network, by kind (dp_collective, pp_sendrecv, "
                                "ep_alltoall, cp_ring): bursts of a group of servers (a PP send/recv: of a NIC pair).", labels=labels)
    nbytes = CounterMetricFamily("prism_collective_bytes_total", "Bytes the job's collectives put on the wire, by kind.", labels=labels)
    seconds = CounterMetricFamily("prism_collective_time_seconds_total", "The job's collectives' durations summed, by kind "
                                  "(over prism_collectives_total: the mean duration).", labels=labels)
    duration = GaugeMetricFamily("prism_collective_duration_seconds", "Duration of the job's collectives counted at the last window, by "
                                 "kind: median and 95th percentile (first flow start to last flow end).", labels=[*labels, "quantile"])
    busbw = GaugeMetricFamily("prism_collective_bus_bandwidth_bytes_per_second", "Bus bandwidth of the job's collectives counted at the "
                              "last window, by kind: wire bytes over sending NICs times duration (NCCL-tests' busbw, one NIC a rank).",
                              labels=labels)
    for job_id, v in sorted(jobs.items()):
        for kind, c in sorted(v.collectives.items()):
            count.add_metric([job_id, kind], c.count)
            nbytes.add_metric([job_id, kind], c.bytes)
            seconds.add_metric([job_id, kind], c.seconds)
            if c.duration_p50_s is not None:
                duration.add_metric([job_id, kind, "0.5"], c.duration_p50_s)
                duration.add_metric([job_id, kind, "0.95"], c.duration_p95_s)
            if c.busbw is not None and math.isfinite(c.busbw):
                busbw.add_metric([job_id, kind], c.busbw)
    return [count, nbytes, seconds, duration, busbw]


def anomaly_info(rows: Sequence[dict]) -> GaugeMetricFamily:
    """``prism_anomaly_info``: 1 per current anomaly (the monitor keeps a bounded few), its explanation in a label.

    Labels are escaped and cut (:func:`printable`); ``step`` is empty when the
    anomaly is not tied to a step, ``job_id`` for switches and links. Two
    anomalies with the same labels are one series.

    >>> fam = anomaly_info([{"kind": "slow_step", "job_id": "job-1", "subject": "step 7", "step": 7, "explanation": "step 7 took\\n2x"},
    ...                     {"kind": "slow_switch", "job_id": "", "subject": "spine-0", "step": -1, "explanation": "x" * 500}])
    >>> [(s.labels["step"], s.labels["explanation"][-6:], len(s.labels["explanation"])) for s in fam.samples]
    [('7', '\\\\x0a2x', 17), ('', 'xxxxx…', 200)]
    """
    fam = GaugeMetricFamily("prism_anomaly_info", "A current anomaly (value 1): the last few of each job and of the fabric, with its "
                            "explanation (job_id empty for switches and links, job_name empty without --jobs.names, step empty when "
                            "not tied to a step).",
                            labels=["job_id", "job_name", "kind", "subject", "step", "explanation"])
    seen: set = set()
    for r in rows:
        step = r.get("step")
        try:
            step_label = str(int(step)) if step is not None and int(step) >= 0 else ""
        except (TypeError, ValueError):  # NaN
            step_label = ""
        job = r.get("job_id")
        labels = (printable(job if isinstance(job, str) else "", 100), printable(r.get("job_name") or "", 100), printable(r.get("kind") or "", 50),
                  printable(r.get("subject") or "", ANOMALY_SUBJECT_CHARS), step_label,
                  printable(r.get("explanation") or "", ANOMALY_EXPLANATION_CHARS))
        if labels not in seen:
            seen.add(labels)
            fam.add_metric(list(labels), 1)
    return fam


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


#: the longest request head (request line and headers) a client may send; a scrape's is a few hundred bytes
MAX_REQUEST_HEAD = 16 * 1024
_MAX_HEADER_LINES = 100
_TOKEN = re.compile(rb"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")


def _open_files_limit() -> int | None:
    """The process's soft limit on open files (None if unlimited or unknown)."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY or soft <= 0 else int(soft)


class _HttpServer:
    """HTTP/1.1 for a WSGI app on an asyncio loop: idle and slow clients hold no thread and cannot starve requests.

    * a connection must finish its TLS handshake within ``handshake_timeout_s``
      and send its whole request head within ``request_timeout_s`` of connecting
      (a client trickling one header line at a time is cut off at that deadline);
      it then has ``request_timeout_s`` again to take its answer;
    * at most ``max_connections`` connections are open; a new one beyond that
      closes the oldest connection that has not sent a request yet or has been
      answered (``evicted``), so idle sockets and clients that never read their
      answer can neither hold the cap nor lock a scraper out;
    * the app runs on ``workers`` threads (a scrape's collect, a password's
      bcrypt check), at most ``max_pending`` requests queued (then 503);
      paths in ``inline_paths`` (the probes) are answered on the loop itself, so
      they never wait behind scrapes;
    * one request a connection (``Connection: close``), as wsgiref did.
    """

    def __init__(self, sock: socket.socket, app: Callable, *, context: Callable[[], ssl.SSLContext | None], inline_paths: Collection[str],
                 scheme: str, max_connections: int, workers: int, max_pending: int, handshake_timeout_s: float, request_timeout_s: float) -> None:
        self.app, self.context, self.inline_paths, self.scheme = app, context, frozenset(inline_paths), scheme
        self.max_connections, self.max_pending = max(int(max_connections), 1), max(int(max_pending), 1)
        self.handshake_timeout_s, self.request_timeout_s = float(handshake_timeout_s), float(request_timeout_s)
        self.server_name, self.server_port = sock.getsockname()[:2]
        self.conns: dict[_Connection, None] = {}  # open connections, oldest first
        self.pending = 0  # requests handed to the workers and not answered yet
        self.refused = 0  # connections closed at once: the cap was full of connections being answered
        self.evicted = 0  # connections without a request closed to make room for a new one
        self.timed_out = 0  # connections closed at their deadline (request head or answer not done in time)
        self.connection_errors = 0  # failed TLS handshakes (no client certificate, plain HTTP, too slow), malformed requests
        self.busy = 0  # requests answered 503 because max_pending were queued
        self.executor = ThreadPoolExecutor(max_workers=max(int(workers), 1), thread_name_prefix="prism-web")
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(self._loop_error)
        self._server = self.loop.run_until_complete(self.loop.create_server(lambda: _Connection(self), sock=sock, backlog=128))
        self._thread = threading.Thread(target=self.loop.run_forever, name="prism-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        if self._thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(timeout=10)
            except Exception:  # noqa: BLE001 - stopping goes on: the loop is stopped below either way
                log.debug("metrics server shutdown", exc_info=True)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        else:
            self.loop.run_until_complete(self._shutdown())
        self.executor.shutdown(wait=False, cancel_futures=True)
        if not self._thread.is_alive():
            self.loop.close()

    async def _shutdown(self) -> None:
        self._server.close()
        for conn in list(self.conns):
            conn.close(abort=True)
        await asyncio.sleep(0.05)  # the transports' connection_lost callbacks close their sockets

    def _loop_error(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        # a client's misbehaviour (reset mid-write, a TLS alert) is the client's problem, not a traceback in our log
        log.debug("metrics server: %s", context.get("message"), exc_info=context.get("exception"))

    def admit(self, conn: "_Connection") -> bool:
        """Register a new connection; at the cap, close the oldest waiting one (or refuse this one if none waits)."""
        if len(self.conns) >= self.max_connections:
            # answered ones too: over TLS a client that never reads keeps its answer (and our close_notify) pending
            oldest = next((c for c in self.conns if c.waiting or c.answered), None)
            if oldest is None:
                self.refused += 1
                conn.close(abort=True)
                return False
            self.evicted += 1
            oldest.close(abort=True)
        self.conns[conn] = None
        return True


class _Connection(asyncio.Protocol):
    """One client connection of :class:`_HttpServer`: TLS handshake, request head, one answer."""

    def __init__(self, server: _HttpServer) -> None:
        self.server = server
        self.transport: asyncio.BaseTransport | None = None
        self.waiting = True  # in the handshake or reading the request head: may be evicted
        self.closed = False
        self.answered = False  # the answer is handed to the transport: may be evicted too
        self.handshaking = False  # data that arrives before start_tls returns the TLS transport waits in buf
        self.buf = bytearray()
        self.deadline: asyncio.TimerHandle | None = None
        self.peer: object = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        srv = self.server
        self.transport = transport
        self.peer = transport.get_extra_info("peername")
        if not srv.admit(self):
            return
        self.deadline = srv.loop.call_later(srv.request_timeout_s, self._deadline_passed)
        ctx = srv.context()
        if ctx is not None:
            # our protocol must see no byte of the handshake: start_tls takes the transport over from here
            cast(asyncio.ReadTransport, transport).pause_reading()
            self.handshaking = True
            srv.loop.create_task(self._handshake(transport, ctx))

    async def _handshake(self, raw: asyncio.BaseTransport, ctx: ssl.SSLContext) -> None:
        srv = self.server
        try:
            tls = await srv.loop.start_tls(cast(asyncio.WriteTransport, raw), self, ctx, server_side=True, ssl_handshake_timeout=srv.handshake_timeout_s)
        except Exception:  # noqa: BLE001 - a failed handshake: no client certificate, plain HTTP, too slow, or the client gone
            if not self.closed:
                srv.connection_errors += 1
                log.debug("TLS handshake with %s failed", self.peer, exc_info=True)
            self.close(abort=True)
            return
        if tls is None or self.closed:
            if tls is not None:
                tls.abort()
            return
        self.transport = tls
        self.handshaking = False
        if self.buf:
            self.data_received(b"")  # the request came with the end of the handshake

    def data_received(self, data: bytes) -> None:
        if not self.waiting:
            return  # bytes after the request head (a body we do not read): ignored
        self.buf += data
        if self.handshaking:
            if len(self.buf) > MAX_REQUEST_HEAD:
                self.close(abort=True)
            return
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > MAX_REQUEST_HEAD:
                self._error("431 Request Header Fields Too Large")
            return
        if end > MAX_REQUEST_HEAD:
            self._error("431 Request Header Fields Too Large")
            return
        head = bytes(self.buf[:end])
        self.buf.clear()
        self._dispatch(head)

    def eof_received(self) -> bool | None:
        if self.waiting or self.transport is None or self.transport.get_extra_info("sslcontext") is not None:
            return None  # closed (TLS has no half-close)
        return True  # a plain-HTTP client that half-closes after its request still gets the answer

    def connection_lost(self, exc: Exception | None) -> None:
        self._forget()

    def _deadline_passed(self) -> None:
        self.server.timed_out += 1
        log.debug("connection from %s closed at its deadline", self.peer)
        self.close(abort=True)

    def _forget(self) -> None:
        self.closed = True
        self.waiting = False
        if self.deadline is not None:
            self.deadline.cancel()
            self.deadline = None
        self.server.conns.pop(self, None)

    def close(self, abort: bool = False) -> None:
        transport = self.transport
        self._forget()
        if transport is not None and not transport.is_closing():
            transport.abort() if abort and isinstance(transport, asyncio.WriteTransport) else transport.close()
        elif transport is not None and abort and isinstance(transport, asyncio.WriteTransport):
            transport.abort()

    def _error(self, status: str) -> None:
        self.server.connection_errors += 1
        self.waiting = False
        self._respond(status, [("Content-Type", "text/plain")], status.encode() + b"\n")

    def _dispatch(self, head: bytes) -> None:
        srv = self.server
        self.waiting = False
        environ = self._environ(head)
        if environ is None:
            self._error("400 Bad Request")
            return
        head_only = environ["REQUEST_METHOD"] == "HEAD"
        if environ["PATH_INFO"] in srv.inline_paths:
            try:
                status, headers, body = _run_wsgi(srv.app, environ)
            except Exception:  # noqa: BLE001 - a probe's failure is a 500, not a dropped connection
                log.exception("metrics endpoint: %s failed", environ["PATH_INFO"])
                status, headers, body = "500 Internal Server Error", [("Content-Type", "text/plain")], b"internal error\n"
            self._respond(status, headers, body, head_only=head_only)
            return
        if srv.pending >= srv.max_pending:
            srv.busy += 1
            self._respond("503 Service Unavailable", [("Content-Type", "text/plain"), ("Retry-After", "1")], b"busy: too many requests queued\n")
            return
        srv.pending += 1
        future = srv.loop.run_in_executor(srv.executor, _run_wsgi, srv.app, environ)

        def answered(f: asyncio.Future) -> None:
            srv.pending -= 1
            if f.cancelled() or self.closed:
                return
            if f.exception() is not None:
                log.error("metrics endpoint: %s failed", environ["PATH_INFO"], exc_info=f.exception())
                self._respond("500 Internal Server Error", [("Content-Type", "text/plain")], b"internal error\n")
                return
            status, headers, body = f.result()
            self._respond(status, headers, body, head_only=head_only)

        future.add_done_callback(answered)

    def _environ(self, head: bytes) -> dict | None:
        """The WSGI environ of a request head; None if it is malformed."""
        srv = self.server
        lines = head.split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not _TOKEN.match(parts[0]) or not parts[2].startswith(b"HTTP/1.") or not parts[1] or len(lines) > _MAX_HEADER_LINES:
            return None
        method, target, version = (p.decode("latin-1") for p in parts)
        if "://" in target and not target.startswith("/"):
            target = "/" + target.split("://", 1)[1].partition("/")[2]  # absolute form: http://host/metrics
        path, _, query = target.partition("?")
        environ: dict = {
            "REQUEST_METHOD": method, "SCRIPT_NAME": "", "PATH_INFO": urllib.parse.unquote(path, "latin-1"), "QUERY_STRING": query,
            "SERVER_NAME": str(srv.server_name), "SERVER_PORT": str(srv.server_port), "SERVER_PROTOCOL": version,
            "REMOTE_ADDR": str(self.peer[0]) if isinstance(self.peer, tuple) else "",
            "wsgi.version": (1, 0), "wsgi.url_scheme": srv.scheme, "wsgi.input": io.BytesIO(b""), "wsgi.errors": sys.stderr,
            "wsgi.multithread": True, "wsgi.multiprocess": False, "wsgi.run_once": False,
        }
        for line in lines[1:]:
            name, sep, value = line.partition(b":")
            if not sep or not _TOKEN.match(name):
                return None  # also obsolete line folding (a line starting with a space)
            key = name.decode("latin-1").upper().replace("-", "_")
            key = key if key in ("CONTENT_TYPE", "CONTENT_LENGTH") else "HTTP_" + key
            text = value.strip(b" \t").decode("latin-1")
            environ[key] = f"{environ[key]},{text}" if key in environ else text
        if environ.get("HTTP_TRANSFER_ENCODING") or environ.get("CONTENT_LENGTH", "0").strip() not in ("", "0"):
            return None  # the endpoint takes no request bodies
        return environ

    def _respond(self, status: str, headers: list[tuple[str, str]], body: bytes, head_only: bool = False) -> None:
        transport = self.transport
        if self.closed or not isinstance(transport, asyncio.WriteTransport) or transport.is_closing():
            return
        names = {k.lower() for k, _ in headers}
        headers = [*headers, *([("Content-Length", str(len(body)))] if "content-length" not in names else []), ("Connection", "close")]
        out = f"HTTP/1.1 {status}\r\n".encode("latin-1") + b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in headers) + b"\r\n"
        transport.write(out if head_only else out + body)
        self.answered = True
        # the answer has request_timeout_s to be taken; a client that does not read is dropped then
        if self.deadline is not None:
            self.deadline.cancel()
        self.deadline = self.server.loop.call_later(self.server.request_timeout_s, self._deadline_passed)
        transport.close()  # after the buffer is written; connection_lost forgets the connection


def _run_wsgi(app: Callable, environ: dict) -> tuple[str, list[tuple[str, str]], bytes]:
    """Call a WSGI app; its status, headers and whole body."""
    started: list = []

    def start_response(status, headers, exc_info=None):
        started[:] = [status, list(headers)]
        return lambda data: None

    result = app(environ, start_response)
    try:
        body = b"".join(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()
    return started[0], started[1], body

class MetricsServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` on a background thread.

    ``web_config`` is a ``--web.config.file`` path (:mod:`prism.serve.webconfig`):
    TLS, client certificates and basic auth; ``/healthz`` and ``/readyz``
    need no password. Idle, half-open and slow connections cannot starve a
    scrape or a probe (see :class:`_HttpServer`): a TLS handshake must end
    within ``handshake_timeout_s``, a request head arrive within
    ``request_timeout_s``, and at most ``max_connections`` are open (bounded
    by half the open-files limit), the oldest idle one closed for a new one.
    """

    def __init__(self, registry: CollectorRegistry, health: Health, address: str = "127.0.0.1:9464", max_connections: int = 512,
                 request_timeout_s: float = 10.0, web_config: str | None = None, handshake_timeout_s: float = 5.0, workers: int = 4) -> None:
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
                code, text = health.readiness()
                start_response("200 OK" if code == 200 else "503 Service Unavailable", [("Content-Type", "text/plain; charset=utf-8")])
                return [text.encode("utf-8", "backslashreplace")]
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

        def tls_context() -> ssl.SSLContext | None:
            # each handshake takes the current context, so a rotated certificate applies without a restart
            web.refresh()
            return web.context

        files = _open_files_limit()
        if files is not None:
            max_connections = min(max_connections, max(files // 2, 8))  # the rest for Kafka, dumps, logs
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
            sock.listen(128)  # socketserver's 5 stalled connects in a burst
            self.scheme = "https" if web.context is not None else "http"
            self.httpd = _HttpServer(sock, app, context=tls_context if web.context is not None else (lambda: None), inline_paths=OPEN_PATHS,
                                     scheme=self.scheme, max_connections=max_connections, workers=workers, max_pending=4 * workers,
                                     handshake_timeout_s=handshake_timeout_s, request_timeout_s=request_timeout_s)
        except BaseException:
            sock.close()
            raise
        self.port = self.httpd.server_port
        self.address = f"{'[' + host + ']' if ':' in host else host}:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.address}/metrics"

    def start(self) -> "MetricsServer":
        self.httpd.start()
        return self

    def stop(self) -> None:
        self.httpd.stop()
