"""``prism daemon``: source -> monitor (windows, analyses) -> metrics.

The loop: poll the source (which decodes into the monitor), run a window's
analysis whenever event time has moved ``--window.step`` past the last one
(or the input has gone quiet with data unanalysed), publish, commit. The
analysis runs on a worker thread while the loop keeps the source alive
(a Kafka consumer that stops polling is dropped from its group) and reads
and decodes ahead, which the next poll ingests: decoding overlaps the
analysis. The metrics server reads the monitor's last view from its own
thread.

The settings (flags, ``--config.file``, their checks) are in
:mod:`prism.serve.settings`; the wiring of source, monitor, metrics server
and this loop in :mod:`prism.serve.build`.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from prism.ingest.gpu_traffic import NON_GPU_ADDRESS
from prism.serve.monitor import Monitor, MonitorView

if TYPE_CHECKING:
    from prism.serve.metrics import Health
    from prism.serve.sources import Source

__all__ = ["Daemon", "format_event"]

log = logging.getLogger("prism.daemon")


def format_event(kind: str, e: dict) -> str:
    """One readable line for a job or anomaly event."""
    named = f" ({e['job_name']})" if e.get("job_name") else ""  # the scheduler's name, with --jobs.names
    if kind == "job":
        return f"job      {e['job_id']}{named}  {e['gpus']} GPUs on {e['servers']} servers"
    if kind == "job_gone":
        return f"job gone {e['job_id']}"
    return f"anomaly  {e['kind']:<13} {e.get('job_id') or '-':<13}{named} {e['explanation']}"


class Daemon:
    """Run a source into a monitor until stopped.

    Parameters
    ----------
    source : KafkaSource or DirectorySource
    monitor : Monitor
    health : prism.serve.metrics.Health
    on_event : callable(kind, dict), optional
        Called for each new job and anomaly (the demo prints them);
        without it they are logged at info level.
    """

    def __init__(self, source: Source, monitor: Monitor, health: Health, on_event: Callable[[str, dict], object] | None = None) -> None:
        self.source, self.monitor, self.health = source, monitor, health
        self.on_event = on_event
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.topology_warned = False
        self._topology_matched = False  # some record matched: the check is settled for good
        self.clock = time.monotonic  # wall clock of the idle flush (a seam for tests)

    def run(self, max_seconds: float | None = None) -> None:
        m, s = self.monitor, self.monitor.s
        t_end = None if max_seconds is None else self.clock() + max_seconds
        quiet_since = self.clock()  # the input has been quiet since (the idle flush's clock)
        try:
            while not self.stop_event.is_set() and (t_end is None or self.clock() < t_end):
                self.health.beat()
                try:
                    got = self.source.poll(m, timeout_ms=200)
                except Exception as e:  # noqa: BLE001 - a broker outage must not end the daemon
                    self.health.reason = f"source error: {e}"
                    self.health.ready = bool(getattr(self.source, "ready", True))
                    log.warning("source: %s; retrying", e)
                    time.sleep(1)
                    continue
                self.health.ready = bool(getattr(self.source, "ready", True))
                self.health.reason = "ok" if self.health.ready else "waiting for partition assignment"
                self.health.bad_files = list(getattr(self.source, "bad_files", ()))
                self.health.source_resets = getattr(self.source, "resets", 0)
                sent = getattr(self.source, "handovers_sent", None)
                if sent is not None:  # the analyse stage
                    self.health.handovers_out = (sent, getattr(self.source, "handovers_failed", 0))
                self.health.incomplete_windows = m.recent_incomplete()
                now = self.clock()
                if got or not self._caught_up():
                    quiet_since = now
                if m.due():
                    self._tick(final=False)
                elif m.pending() and now - quiet_since > s.idle_flush_s:
                    self._tick(final=True)
                elif getattr(self.source, "components_changed", False) and m.analysed_to is not None:
                    # another replica's job membership changed: re-run the last window with it
                    self.source.components_changed = False  # type: ignore[attr-defined]  # an optional member, found above (see Source)
                    self._tick(final=False, force=True)
                self.health.consumer_lag = self.source.lag()
        except BaseException as e:
            self.error = e
            raise

    def _caught_up(self) -> bool:
        """Whether the source has read all the input there is now, as far as it knows (see ``caught_up`` in
        :class:`~prism.serve.sources.Source`): only then does quiet input count towards the idle flush.

        The tail analysed as final takes in everything read so far, and what is
        read after it is late. A Kafka consumer that holds no partition (its
        membership lost after a missed poll deadline), is rebalancing (the
        group's churn can last tens of seconds) or is behind its high
        watermarks reads nothing for a while although input is there: that
        spell is not quiet input. A source without ``caught_up`` (a
        directory) is quiet whenever a poll reads nothing.
        """
        caught_up = getattr(self.source, "caught_up", None)
        return caught_up is None or bool(caught_up())

    def _analyse(self, final: bool, force: bool) -> MonitorView | None:
        """The monitor's tick on the worker thread; the source kept alive meanwhile.

        A big window takes longer to analyse than a consumer group waits
        between polls (``max.poll.interval``): a consumer that stopped
        polling meanwhile would be dropped from the group, its partitions
        moved, and the replicas rebalanced at every window. The source's
        ``keep_alive`` polls, decoding a bounded amount ahead (then with its
        partitions paused); the monitor is not touched until the analysis
        is done.
        """
        keep_alive = getattr(self.source, "keep_alive", None)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="prism-analysis") as pool:
            done = pool.submit(self.monitor.tick, final=final, force=force)
            # asked whether it is done, not waited on with a timeout: from Python 3.11 the timeout's
            # exception is the built-in TimeoutError, so one raised by the analysis itself would be
            # taken for "not done yet" and the loop would never end
            while keep_alive is not None and not done.done():
                self.health.beat()
                keep_alive(timeout_ms=100)
            return done.result()

    #: records ingested before a topology that matched none of them is called suspicious
    TOPOLOGY_CHECK_RECORDS = 10_000

    def _check_topology(self) -> None:
        """Warn once when many records came in and none was between two GPU NICs of the topology."""
        if self.topology_warned or self._topology_matched:
            return
        counts = self.monitor.counters_snapshot().values()
        ingested = sum(c.get("ingested", 0) for c in counts)
        foreign = sum(c.get(f"ignored:{NON_GPU_ADDRESS}", 0) for c in counts)
        self._topology_matched = foreign < ingested
        if ingested >= self.TOPOLOGY_CHECK_RECORDS and foreign == ingested:
            self.topology_warned = True
            log.warning("none of the %d records ingested so far is between two GPU NICs of --topology "
                        "(prism_flows_ignored_total{reason=\"non_gpu_address\"}): is it this cluster's inventory?", ingested)

    def _tick(self, final: bool, force: bool = False) -> None:
        view = self._analyse(final, force)
        self.health.incomplete_windows = self.monitor.recent_incomplete()
        self._check_topology()
        if view is None:
            return
        try:
            self.source.publish()
            self.source.commit()
        except Exception as e:  # noqa: BLE001 - next window publishes again
            log.warning("publishing window state failed: %s", e)
        for kind, event in self._new_events():
            if self.on_event is not None:  # the caller shows events its own way (the demo prints them)
                self.on_event(kind, event)
            else:
                log.info(format_event(kind, event))

    def _new_events(self) -> list[tuple[str, dict]]:
        # the monitor's deque is bounded; the daemon drains it each window
        ev = self.monitor.events
        out = []
        while ev:
            out.append(ev.popleft())
        return out

    def stop(self) -> None:
        self.stop_event.set()
