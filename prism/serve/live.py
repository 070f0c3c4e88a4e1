"""``prism demo``: a live SYNTHETIC cluster -> Kafka -> the daemon -> metrics.

Starts a local Kafka-compatible broker (:class:`prism.serve.broker.LocalBroker`)
unless one is given, streams a generated cluster's flows into it at the
pace they were "captured" (``speed`` times real time), runs the daemon on
it with its /metrics endpoint, prints jobs and anomalies as they appear,
and at the end compares what the daemon found with the generator's ground
truth.
"""
from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pandas as pd

from prism.analysis.diagnosis import ANOMALY_COLUMNS
from prism.ingest.topology import Topology
from prism.serve.build import build_daemon
from prism.serve.daemon import format_event
from prism.serve.monitor import MonitorSettings
from prism.serve.produce import FlowProducer
from prism.serve.settings import DaemonSettings, KafkaSettings
from prism.serve.sources import ensure_topic

if TYPE_CHECKING:
    from prism.serve.kafkaconf import KafkaSecurity

__all__ = ["LiveDemo", "DemoResult", "demo_settings", "stream_flows"]


@dataclass
class DemoResult:
    records_sent: int = 0
    ingested: int = 0
    jobs: pd.DataFrame | None = None
    steps: pd.DataFrame | None = None
    # each anomaly as the daemon reported it, with detected_ns: the event time the stream had reached then
    anomalies: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=ANOMALY_COLUMNS + ["detected_ns"]))
    seconds: float = 0.0


class StreamedCluster(Protocol):
    """What the demo streams of a generated cluster (``synthetic.GeneratedCluster``)."""

    flows: pd.DataFrame
    topology: pd.DataFrame


def stream_flows(producer: FlowProducer, flows: pd.DataFrame, speed: float = 1.0, slice_s: float = 1.0,
                 stop: threading.Event | None = None, on_slice: Callable[[int, float], object] | None = None) -> None:
    """Send ``flows`` in event-time slices, paced at ``speed`` x real time (0 = as fast as possible)."""
    flows = flows.sort_values("start_ns", kind="stable").reset_index(drop=True)
    if flows.empty:
        return
    t0_ev = int(flows["start_ns"].iloc[0])
    slice_ns = int(slice_s * 1e9)
    idx = ((flows["start_ns"].to_numpy() - t0_ev) // slice_ns).astype(np.int64)
    bounds = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1], True])
    t0 = time.monotonic()
    for i in range(len(bounds) - 1):
        if stop is not None and stop.is_set():
            return
        k = int(idx[bounds[i]])
        due = t0 + (k + 1) * slice_s / speed if speed > 0 else 0
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        producer.send(flows.iloc[bounds[i] : bounds[i + 1]])
        producer.flush()
        if on_slice is not None:
            on_slice(int(flows["start_ns"].iloc[bounds[i + 1] - 1]), time.monotonic())


def demo_settings() -> MonitorSettings:
    """The live demo's windows: short, so its two-minute cluster gets many of them."""
    return MonitorSettings(window_s=10, step_s=2, switch_window_s=5, lateness_s=1, idle_flush_s=2)


class LiveDemo:
    """Wire a generated cluster, a broker, a producer and a daemon together.

    Parameters
    ----------
    cluster : synthetic.GeneratedCluster
    bootstrap : str, optional
        An existing Kafka cluster; by default a local broker is started.
    listen : str
        ``--web.listen-address`` of the daemon (port 0 picks a free one).
    settings : MonitorSettings, optional
        Default :func:`demo_settings`.
    speed : float
        Stream at this multiple of real time.
    fmt : {"arrow", "jsonl"}
    security : prism.serve.kafkaconf.KafkaSecurity, optional
        TLS and SASL settings for ``bootstrap`` (the local broker is plaintext).
    """

    def __init__(self, cluster: StreamedCluster, bootstrap: str | None = None, listen: str = "127.0.0.1:9464", settings: MonitorSettings | None = None,
                 speed: float = 1.0, fmt: str = "arrow", partitions: int = 4, printer: Callable[[str], object] = print,
                 security: KafkaSecurity | None = None) -> None:
        self.cluster, self.bootstrap, self.listen, self.security = cluster, bootstrap, listen, security
        self.settings = settings or demo_settings()
        self.speed, self.fmt, self.partitions, self.printer = speed, fmt, partitions, printer
        run = uuid.uuid4().hex[:8]
        # fresh names on a shared cluster, so an earlier run's offsets and summaries do not apply
        self.topic = f"prism-demo-flows-{run}" if bootstrap else "prism-flows"
        self.summary_topic = f"prism-demo-summaries-{run}" if bootstrap else "prism-summaries"
        self.group = f"prism-demo-{run}" if bootstrap else "prism"

    def run(self, timeout_s: float = 600.0) -> DemoResult:
        from prism.serve.broker import LocalBroker

        res = DemoResult()
        broker = None
        service = producer = None
        t_start = time.monotonic()
        try:
            if self.bootstrap is None:
                # started inside the try: whatever fails from here on (Ctrl-C while it starts too), it is stopped
                broker = LocalBroker()
                broker.start()
                self.bootstrap = broker.bootstrap
                self.printer(f"broker   Tansu (Kafka protocol) on {self.bootstrap}")
            ensure_topic(self.bootstrap, self.topic, self.partitions, security=self.security)
            stream: dict[str, float] = {}  # wall clock and event time at the stream's start: maps "now" to stream time

            def on_event(kind, e):
                if kind == "anomaly":
                    now = None
                    if stream and self.speed > 0:
                        now = stream["ev0"] + int((time.monotonic() - stream["wall0"]) * self.speed * 1e9)
                    res.anomalies.loc[len(res.anomalies)] = [e.get(c) for c in ANOMALY_COLUMNS] + [now]
                self.printer(f"{time.monotonic() - t_start:6.1f}s  {format_event(kind, e)}")

            # the demo's windows are small: 10 s for one's analysis is plenty, and a dead consumer is noticed sooner
            settings = DaemonSettings(monitor=self.settings, web_listen_address=self.listen, max_poll_interval_s=10.0,
                                      kafka=KafkaSettings(self.bootstrap, self.topic, self.group, self.summary_topic, replica_id="demo",
                                                          session_timeout_s=6.0, security=self.security))
            # the compiled kernels load in here, not inside the first window (time to detect)
            service = build_daemon(settings, Topology.from_frame(self.cluster.topology), on_event=on_event, free_port_if_taken=True)
            self.printer(f"metrics  http://{service.server.address}/metrics   (also /healthz, /readyz)")
            monitor, source, daemon = service.monitor, service.source, service.daemon
            thread = service.start()
            # the daemon is running before the traffic flows, as on a platform: a consumer group that settles
            # after the stream began starts on a backlog, and its first window sees a partial step
            wait_until = time.monotonic() + 60
            while not source.ready and thread.is_alive() and time.monotonic() < wait_until:
                time.sleep(0.05)
            if not source.ready:
                if daemon.error is not None:
                    raise daemon.error
                raise RuntimeError("the daemon's consumer group got no partitions within 60 s")
            self.printer(f"group    the daemon's consumer has its partitions ({time.monotonic() - t_start:.1f} s)")
            producer = FlowProducer(self.bootstrap, self.topic, fmt=self.fmt, security=self.security)
            n = len(self.cluster.flows)
            self.printer(f"stream   {n:,} SYNTHETIC flow records at {self.speed:g}x real time into topic {self.topic}")
            stream.update(ev0=int(self.cluster.flows["start_ns"].min()), wall0=time.monotonic())
            stream_flows(producer, self.cluster.flows, self.speed)
            res.records_sent = producer.records_sent
            # wait until every record is counted and the tail analysed
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline and thread.is_alive():
                counts = monitor.counters_snapshot()
                res.ingested = sum(c.get("ingested", 0) + c.get("duplicate", 0) for c in counts.values())
                done = res.ingested >= res.records_sent and monitor.analysed_to is not None and monitor.analysed_to >= (monitor.max_start or 0)
                if done:
                    break
                time.sleep(0.2)
            service.stop(timeout_s=30)
            if daemon.error is not None:
                raise daemon.error
            res.jobs = monitor.jobs_
            res.steps = monitor.steps_frame()
            counts = monitor.counters_snapshot()
            res.ingested = sum(c.get("ingested", 0) for c in counts.values())
            res.seconds = time.monotonic() - t_start
            return res
        finally:
            if producer is not None:
                producer.close()
            if service is not None:
                service.close()
            if broker is not None:
                broker.stop()
