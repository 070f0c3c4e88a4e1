"""Incremental monitoring state: the daemon's analyses over a sliding window.

records (validated frames) -> :meth:`Monitor.ingest` -> window ->
:meth:`Monitor.tick` (every ``step_s`` of event time) -> :class:`MonitorView`
(what the metrics show) and events (what the demo prints).

What is kept, and why it is bounded:

* the last ``window_s`` of GPU flows (32 B each, capped at
  ``max_window_flows``; beyond, the oldest are shed and counted);
* per GPU pair, when it was last seen (pairs unseen for ``pair_ttl_s``
  are forgotten, so a finished job's NICs can join a new job);
* per job, the last ``step_history`` steps and the step-time histogram,
  and per kind of collective its counts and the last window's figures;
  a job gone for ``pair_ttl_s`` is dropped;
* the switch bandwidth sums of the windows still in the analysis window;
* the hashes of the records of the window, to drop re-deliveries;
* the GPU flows read but not yet taken in by a window (held for the
  window whose turn they reach: as far as the partitions' reads run
  apart in event time, and the lateness);
* per window analysed in the last ``pair_ttl_s``, its span and how many
  GPU flows of its time came late (see :meth:`Monitor.tick`).

Each tick runs :func:`prism.analysis.analyse.analyse` (the same analyses as ``prism
replay``) over the window, then merges: steps already reported are not
reported again (the rule of :mod:`prism.analysis.stitch`, which the
replay's time slices share), collectives count once (those that end
in the window's span past the last window's: :func:`prism.analysis.collectives.settled`),
the cross-step diagnosis runs over each
job's step history (so its baseline outlives the window), and each
anomaly is counted once.

Windows, and which records are late, follow each partition's own record
order (its *stream time*, see the comment above :meth:`Monitor.ingest`), not
the pace at which the partitions were read: GPU flows are held from their
reading to the window whose turn they reach. A window known to be incomplete
is not analysed: the input is more out of order than the window waits for
(records older than its end are still to come). Its jobs' steps are not
reported from it and no anomaly is raised from it; it is counted, logged
and shown by ``/readyz`` (see :meth:`Monitor.tick`). One that late flows of
its time reach after its analysis turns incomplete then.
"""
from __future__ import annotations

import copy
import logging
import threading
import time
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pandas as pd

from prism.analysis.analyse import Analysis, Settings, analyse, label_names, pair_kinds
from prism.analysis.collectives import settled_by_job, summarise
from prism.analysis.diagnosis import StageLagDiagnoser, SwitchBandwidth
from prism.analysis.jobs import JobRecogniser, gpu_clusters
from prism.analysis.parallelism import UNCERTAIN_BELOW
from prism.analysis.stitch import StepStitcher, median_step_ns
from prism.ingest.gpu_traffic import LATE, gpu_traffic
from prism.ingest.inventory import JobNames
from prism.ingest.records import FlowFormatError
from prism.ingest.topology import Topology
from prism.serve.window import FlowWindow, RecordDeduper, record_hashes, server_silences, span_into

log = logging.getLogger("prism.monitor")

__all__ = ["MonitorSettings", "Monitor", "fabric_slice_s", "iso_time", "MonitorView", "JobView", "CollectiveView", "WindowSpan", "STEP_BUCKETS_S", "bucket_index",
           "RECENT_ANOMALIES_PER_JOB", "RECENT_ANOMALIES"]

#: Step-duration histogram buckets (seconds): LLM steps run from tenths of
#: a second (small models) to minutes.
STEP_BUCKETS_S = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600)
_CROSS_STEP_KINDS = ("slow_step", "regime_change")
#: the current anomalies the view keeps (``prism_anomaly_info``): the last this many of each job (and of the fabric,
#: switches and links) ...
RECENT_ANOMALIES_PER_JOB = 5
#: ... and of those, the newest this many in all
RECENT_ANOMALIES = 50
_RECENT_FIELDS = ("kind", "job_id", "subject", "step", "start_ns", "score", "explanation")
_NONE = np.iinfo(np.int64).min  # no stream time yet


def iso_time(ns: int) -> str:
    """Event time as UTC ISO 8601 with milliseconds (for logs)."""
    return pd.Timestamp(int(ns), unit="ns", tz="UTC").isoformat(timespec="milliseconds")


def fabric_slice_s(s: "MonitorSettings") -> float:
    """The short windows the switch sums are taken in before the diagnosis: about ``step_s`` (at most the switch
    window), a whole divisor of the switch window so that each lies inside one of its windows.

    >>> fabric_slice_s(MonitorSettings()), fabric_slice_s(MonitorSettings(window_s=3, step_s=1, switch_window_s=2))
    (15.0, 1.0)
    """
    sw = int(s.switch_window_s * 1e9)
    k = max(1, -(-sw // max(int(s.step_s * 1e9), 1)))
    while sw % k:
        k += 1
    return sw / k / 1e9


def bucket_index(bounds: Sequence[float], value: float) -> int:
    """Index of the histogram bucket of ``value`` (the first bound >= it; len(bounds) is +Inf).

    >>> bucket_index((1, 2), 1), bucket_index((1, 2), 1.5), bucket_index((1, 2), 9)
    (0, 1, 2)
    """
    return int(np.searchsorted(bounds, value, side="left"))


@dataclass
class MonitorSettings:
    """Window settings (the daemon's ``--window*`` flags)."""

    window_s: float = 120.0  # flows analysed per tick; holds several steps of the slowest job
    step_s: float = 15.0  # event time between ticks
    lateness_s: float = 2.0  # least wait for out-of-order records before analysing (more if the input is more disordered)
    pair_ttl_s: float = 600.0  # forget a GPU pair (and a job) unseen this long
    max_window_flows: int = 20_000_000  # memory bound: 32 B a flow
    switch_window_s: float = 60.0  # switch bandwidth comparison window
    step_history: int = 256  # steps kept per job for the cross-step baseline
    idle_flush_s: float = 3.0  # wall seconds without input before analysing the tail

    def __post_init__(self) -> None:
        for name in ("window_s", "step_s", "switch_window_s", "pair_ttl_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0 (got {getattr(self, name)})")
        if self.step_s > self.window_s:
            raise ValueError(f"step_s ({self.step_s}) must not exceed window_s ({self.window_s})")
        if self.lateness_s < 0:
            raise ValueError("lateness_s must be >= 0")


@dataclass
class JobView:
    """What the metrics say about one job."""

    job_id: str
    gpus: int
    servers: int
    dp: int = 0
    pp: int = 0
    steps: int = 0  # steps reported so far
    last_step_s: float | None = None
    slowdown: float | None = None  # last step / its baseline
    slow: bool = False
    bucket_counts: list = field(default_factory=lambda: [0] * (len(STEP_BUCKETS_S) + 1))
    step_sum_s: float = 0.0
    anomalies: Counter = field(default_factory=Counter)
    group_lag: dict = field(default_factory=dict)  # server -> ratio (pipeline-stage compute vs peers)
    pairs: dict = field(default_factory=dict)  # (type, "certain"|"uncertain") -> GPU pairs in the last window
    state: str = "running"  # running, hung (its last collective never completed) or ended (silent after a whole step)
    name: str = ""  # the scheduler's name for it, from the job inventory (--jobs.names); "" if none
    collectives: dict = field(default_factory=dict)  # kind -> CollectiveView (prism.analysis.collectives)


@dataclass
class CollectiveView:
    """One kind of collective of a job: counts since the job was first seen, and the figures of those counted at the last window that counted any."""

    count: int = 0  # collectives counted (each once, however many windows hold it)
    bytes: int = 0  # their wire bytes
    seconds: float = 0.0  # their durations summed
    duration_p50_s: float | None = None  # median and 95th percentile duration of the collectives counted at the last window
    duration_p95_s: float | None = None
    busbw: float | None = None  # their bus bandwidth: bytes over NIC-seconds (bytes/s)


@dataclass
class MonitorView:
    """An immutable-by-convention snapshot for the metrics endpoint."""

    jobs: dict = field(default_factory=dict)  # job_id -> JobView
    switches: dict = field(default_factory=dict)  # name -> (bytes/s, ratio)
    window_flows: int = 0
    pairs: int = 0
    analysed_to_ns: int | None = None
    lateness_ns: int = 0  # the wait for out-of-order records the last window used
    ticks: int = 0
    incomplete: bool = False  # the last window was incomplete (not analysed)
    anomalies: tuple = ()  # the current anomalies, oldest first: dicts of kind, job_id, subject, step, start_ns, score, explanation


@dataclass
class WindowSpan:
    """An analysed window: its event-time span, and the GPU flows of its time that came late.

    A late flow is counted against the window whose ``(previous end, end]``
    holds its start, so each is counted once though windows overlap.
    """

    begin: int
    end: int
    late: int = 0  # GPU flows of (previous end, end] that came after the window, or were dropped before it
    incomplete: bool = False  # not analysed (see Monitor.tick), or late flows of its time came after it
    why: str = ""  # what made it incomplete (for the log)


class _JobState:
    def __init__(self, job_id: str, history: int, hold_steps: float) -> None:
        self.view = JobView(job_id=job_id, gpus=0, servers=0)
        self.servers: set = set()
        self.history: deque = deque(maxlen=history)  # (step, start_ns, end_ns)
        self.stitcher = StepStitcher(hold_steps)  # which of a window's steps are new, and their numbers
        self.reported: dict = {}  # anomaly key -> start_ns
        self.warned_stepless = False  # the "no steps in a whole window" warning was logged
        self.collectives_to: int | None = None  # collectives that end up to here (event ns) are counted
        self.judged_to: int | None = None  # the end of the last window that judged it (its servers as then)


class Monitor:
    """The daemon's state between ticks (see the module docstring).

    Parameters
    ----------
    topology : Topology
    settings : MonitorSettings, optional
    analysis : prism.analysis.analyse.Settings, optional
        The analyses' settings (the same as ``prism replay``'s).

    Notes
    -----
    Thread safety: :meth:`ingest` and :meth:`tick` run on the daemon's loop;
    the metrics thread reads :attr:`view` (replaced whole after each tick)
    and :meth:`counters_snapshot` (taken under :attr:`lock`).
    """

    def __init__(self, topology: Topology, settings: MonitorSettings | None = None, analysis: Settings | None = None,
                 job_names: JobNames | None = None) -> None:
        self.topology = topology
        self.job_names = job_names  # the scheduler's names of jobs, by server (read again when its file changes)
        self.s = settings or MonitorSettings()
        self.analysis = analysis or Settings()
        self.lock = threading.Lock()
        self.window = FlowWindow(self.s.max_window_flows)
        self.dedupe = RecordDeduper(max_records=2 * self.s.max_window_flows)
        self.switch_bw = SwitchBandwidth(self.s.switch_window_s, hosts=topology.servers[topology.server_codes])
        # the flows' switch sums as they come, in short windows (a divisor of the switch window), moved into
        # switch_bw once a window passes their end (see _fold_fabric)
        self.fabric_in = SwitchBandwidth(fabric_slice_s(self.s), hosts=topology.servers[topology.server_codes])
        self.counters: dict[str, Counter] = defaultdict(Counter)
        self._n = len(topology)
        self._pair_keys = np.empty(0, dtype=np.int64)
        self._pair_last = np.empty(0, dtype=np.int64)
        self._pair_first = np.empty(0, dtype=np.int64)  # each pair's earliest flow start: a window's jobs are its pairs' up to its end
        # each live pair's type from the windows analysed (newest first): the flow kinds the switch diagnosis judges
        # apart; kept past the window that typed them, as the switch window outlasts it
        self._kind_keys = np.empty(0, dtype=np.int64)
        self._kind_types = np.empty(0, dtype=object)
        # each server's latest GPU flow start and latest silence (server_silences), from the flows up to each window's
        # end: whether a job came back after a silence (see _stable_ids), the same in every stage that cuts the window
        self._nic_server = topology.server_codes
        self._server_code = {str(s): i for i, s in enumerate(topology.servers)}
        self._server_last = np.full(len(self._server_code), -1, dtype=np.int64)
        self._silence_from = np.full(len(self._server_code), -1, dtype=np.int64)
        self._silence_to = np.full(len(self._server_code), -1, dtype=np.int64)
        self._servers_to: int | None = None  # the window end they are up to
        self.remote_components: dict[str, list[list[str]]] = {}
        self._jobs: dict[str, _JobState] = {}
        self._active: dict[tuple, int] = {}  # (kind, job, subject) of ongoing group/switch anomalies -> last tick
        self._switch_last: dict[tuple, int] = {}  # (kind, subject) -> last switch window flagged
        self._links_pending: set[tuple] = set()  # (kind, subject) of new slow links flagged by the last window, not yet reported
        self._fabric_anomalies: Counter = Counter()
        self._recent: dict[str, deque] = {}  # job_id ("" for the fabric) -> (sequence, anomaly) of its last RECENT_ANOMALIES_PER_JOB
        self._anomaly_seq = 0
        self.min_start: int | None = None  # earliest record start (for the first window)
        self.max_start: int | None = None  # latest record start over all partitions
        self._part_max: dict[str, int] = {}  # latest record start per partition
        self._part_seen: dict[str, float] = {}  # wall time of each partition's last batch
        self._last_input = -float("inf")  # wall time of the last batch from any partition
        self._resumed_at = -float("inf")  # wall time input came back after a quiet spell of idle_flush_s (see watermark)
        self.clock = time.monotonic  # wall clock of the idle rules (a seam for tests)
        # stream time (see _admit): each partition's records held until a window releases them, as
        # (stream time before each record, frame, its NICs a and b, read again), and what sets the first window and the
        # windows' lateness
        self._queued: dict[str, deque] = {}
        self._held: Counter[str] = Counter()  # records in _queued, per partition
        self._first: dict[str, int] = {}  # partition -> its first record's start (the first window ends a stride past the least)
        self._cells: dict[int, int] = {}  # step_s cell of a record's stream time -> the most a record was behind it
        self._lateness = int(self.s.lateness_s * 1e9)  # the lateness of the last window cut
        self._window_disorder = 0  # the disorder measured for the window being cut (for _log_window)
        self.released_to: int | None = None  # every record read with a stream time below this has been released
        self.backlogged: set[str] = set()  # partitions the source knows have unread records
        self.analysed_to: int | None = None
        self.events: deque = deque(maxlen=10_000)  # (kind, dict) for printing
        self.view = MonitorView()
        self.tick_seconds: list[float] = []  # processing time of each tick (drained by the metrics)
        self._ticks = 0
        self.jobs_ = pd.DataFrame(columns=["job_id", "ip", "server"])  # the last window's job membership
        self.windows: deque[WindowSpan] = deque()  # the windows analysed in the last pair_ttl_s of event time
        self.late_flows = 0  # GPU flows late for their window (counted against it), ever
        self.windows_incomplete = 0  # windows incomplete, ever (not analysed, or late flows came after them)

    # -- input ---------------------------------------------------------------
    # Which records are late, which are dropped and where windows end are a
    # function of each partition's own record order, not of how the
    # partitions' reads interleave or where poll batches fall, as a Kafka
    # Streams task's stream time and grace period make them:
    #
    # * a record's *stream time* is the latest start of the records before it
    #   in its own partition;
    # * window ends lie on a grid of ``step_s`` (multiples of it since the
    #   epoch; ``window_s`` apart, on the same grid, while catching up), the
    #   first the grid point nearest a stride past the earliest first record of the partitions;
    # * the lateness of the window ending at ``E`` is the configured one, or
    #   the most a record was behind its stream time among the records whose
    #   stream time lies in ``[E - window_s, E)``, at most half a window;
    # * the window is due once every partition's latest start (the watermark)
    #   has reached ``E`` plus that lateness; it takes in the records whose
    #   stream time is below ``E + lateness`` (all read by then) and no others,
    #   whatever else was read: records are counted and deduped as they are
    #   read and *released* into the window's state at the windows, partition
    #   by partition, each in its order;
    # * a released record older than the window reaches is dropped; one no
    #   later than the last window's end is late for the window of its time,
    #   which turns incomplete (after its analysis).
    #
    # The wall-clock rules (an idle partition stops holding the watermark, the
    # idle flush of a quiet input) stay read-speed dependent by nature.

    def ingest(self, flows: pd.DataFrame, partition: str = "0") -> None:
        """Count, dedupe and hold one validated batch (:func:`prism.ingest.records.validate_flows` output) for the
        window that releases it."""
        n = len(flows)
        if n == 0:
            return
        start = flows["start_ns"].to_numpy()
        new = self.dedupe.filter(record_hashes(flows), start)
        with self.lock:
            c = self.counters[partition]
            c["duplicate"] += int(n - new.sum())
            c["ingested"] += int(new.sum())
        if not new.all():
            flows = flows[new]
        if len(flows) == 0:
            return
        now = self.clock()
        if now - self._last_input > self.s.idle_flush_s:
            self._resumed_at = now
        self._last_input = self._part_seen[partition] = now
        # what is not GPU-to-GPU traffic is counted as read (it waits for no window)
        traffic = gpu_traffic(self.topology, flows["src"], flows["dst"])
        with self.lock:
            for reason, k in traffic.ignored.items():
                c[f"ignored:{reason}"] += k
        self._admit(flows.reset_index(drop=True), traffic.a, traffic.b, traffic.gpu, partition)

    def _admit(self, flows: pd.DataFrame, a: np.ndarray, b: np.ndarray, gpu: np.ndarray, partition: str) -> None:
        """Hold a deduped batch's GPU flows (``gpu``; NICs ``a``, ``b``), each with its stream time (over all the
        partition's records), until a window releases them (:meth:`_release`); measure its disorder (how far records
        come behind their stream time) for the windows' lateness."""
        start = flows["start_ns"].to_numpy().astype(np.int64, copy=False)
        prior = self._part_max.get(partition, _NONE)
        ahead = np.maximum.accumulate(np.r_[np.int64(prior), start])[:-1]  # each record's stream time (before it)
        # A collector batches records per GPU pair and per export interval, so a
        # partition delivers a pair's whole interval after another pair's: records
        # arrive up to an interval behind their stream time. A window cut while
        # part of an interval is still to come sees half the pairs, and types them
        # (and cuts the steps) wrong: the lateness follows the disorder measured.
        behind = np.where(ahead > _NONE, ahead - start, 0)
        out = behind > 0
        if out.any():
            cells, far = ahead[out] // int(self.s.step_s * 1e9), behind[out]
            keys, at = np.unique(cells, return_inverse=True)
            most = np.zeros(len(keys), dtype=np.int64)
            np.maximum.at(most, at, far)
            for k, v in zip(keys.tolist(), most.tolist()):
                self._cells[k] = max(self._cells.get(k, 0), v)
        self._first.setdefault(partition, int(start[0]))
        m = int(start.max())
        self._part_max[partition] = max(prior, m)
        self.max_start = m if self.max_start is None else max(self.max_start, m)
        if gpu.any():
            self._queued.setdefault(partition, deque()).append((ahead[gpu], flows[gpu].reset_index(drop=True), a[gpu], b[gpu],
                                                                self._rereading(partition)))
            self._held[partition] += int(gpu.sum())

    def _rereading(self, partition: str) -> bool:
        """Are ``partition``'s records being read now read again, from a taken-over partition's resume point? (A hook:
        the ingest stage's; never here.)"""
        return False

    def _release(self, below: int | None, begin: int | None) -> None:
        """Into the window: the held records whose stream time is below ``below`` (all, for None), partition by
        partition; those that started before ``begin`` dropped as late."""
        for p in sorted(self._queued):
            q = self._queued[p]
            while q:
                ahead, flows, a, b, reread = q[0]
                k = len(ahead) if below is None else int(np.searchsorted(ahead, below, side="left"))
                if k == 0:
                    break
                if k < len(ahead):
                    q[0] = (ahead[k:], flows.iloc[k:].reset_index(drop=True), a[k:], b[k:], reread)
                    flows, a, b = flows.iloc[:k], a[:k], b[:k]
                else:
                    q.popleft()
                self._held[p] -= k
                start = flows["start_ns"].to_numpy()
                self._take(flows, a, b, p, start < begin if begin is not None else np.zeros(len(start), dtype=bool), reread)
        top = max(self._part_max.values(), default=None)
        if below is None:
            below = None if top is None else top + 1  # every record read so far
        if below is not None:
            self.released_to = below if self.released_to is None else max(self.released_to, below)

    def stream_time(self, partition: str) -> int | None:
        """The latest start read from ``partition`` (None before its first record)."""
        return self._part_max.get(partition)

    def drop_held(self, partition: str) -> None:
        """Forget ``partition``'s records not released yet (it went to another replica, which reads them again)."""
        self._queued.pop(partition, None)
        self._held.pop(partition, None)

    def held(self) -> int:
        """GPU flows read and held for their window."""
        return sum(list(self._held.values()))  # one C call: safe from a scrape

    def _take(self, flows: pd.DataFrame, a: np.ndarray, b: np.ndarray, partition: str, late: np.ndarray, reread: bool = False) -> None:
        """GPU flows (NICs ``a``, ``b``) into the window: those ``late`` (older than it reaches) dropped, counted
        against their window."""
        start = flows["start_ns"].to_numpy()
        gpu = ~late
        with self.lock:
            c = self.counters[partition]
            c[f"ignored:{LATE}"] += int(late.sum())
            c["windowed"] += int(gpu.sum())
        self._note_late(late, a, b, start)
        if not gpu.any():
            return
        lo = int(start[gpu].min())
        self.min_start = lo if self.min_start is None else min(self.min_start, lo)
        a, b, start = a[gpu], b[gpu], start[gpu]
        duration = flows["duration_ns"].to_numpy()[gpu]
        size = flows["size"].to_numpy()[gpu]
        self.window.add(a, b, start, duration, size)
        self._see_pairs(a, b, start)
        self.fabric_in.partial_fit(start, duration, size, flows["switches"].array[gpu], src=a, dst=b)  # stays categorical: no re-factorising

    def _flag(self, span: WindowSpan, after: bool) -> None:
        """``span`` turned incomplete: before its analysis, or (``after``) when late flows of its time came after it.
        A hook (the ingest stage passes the flag on to the analyse stage); nothing here."""

    def _note_late(self, dropped: np.ndarray, a: np.ndarray, b: np.ndarray, start: np.ndarray) -> None:
        """Count the GPU flows a window takes in that came late, each against the window of its time.

        Late: started no later than the end of the last window analysed, so
        that window was analysed without it (``dropped``, older than the new
        window reaches, are among them: a window reaches back past the last
        one's end). Each counts against the analysed window whose
        ``(previous end, end]`` holds its start (the oldest window kept, for
        older ones), and that window turns incomplete (its steps and
        anomalies were reported without them; reported steps are never
        revised).
        """
        to = self.analysed_to
        if to is None or not self.windows:
            return  # the first window takes in everything held (it drops nothing)
        gpu_pair = (a >= 0) & (b >= 0) & (a != b)
        past = start[gpu_pair & (dropped | (start <= to))]
        if not len(past):
            return
        self.late_flows += len(past)
        ends = np.fromiter((w.end for w in self.windows), dtype=np.int64, count=len(self.windows))
        at, n = np.unique(np.minimum(np.searchsorted(ends, past, side="left"), len(ends) - 1), return_counts=True)
        for i, k in zip(at.tolist(), n.tolist()):
            w = self.windows[i]
            w.late += k
            if not w.incomplete:
                w.incomplete = True
                w.why = f"{w.late} GPU flows of its time came after it was analysed"
                self.windows_incomplete += 1
                self._flag(w, after=True)
                log.warning("window analysed before GPU flows of its time came: its steps and anomalies were reported without them",
                            extra={"fields": {"from": iso_time(w.begin), "to": iso_time(w.end), "late_flows": w.late}})

    def recent_incomplete(self) -> int:
        """Incomplete windows among those analysed in the last ``pair_ttl_s`` of event time (``/readyz``'s degraded)."""
        return sum(w.incomplete for w in list(self.windows))

    def disorder_ns(self) -> int:
        """How far behind its stream time a record came, at most, among those of the window being cut (event ns;
        uncapped)."""
        return self._window_disorder

    def _disorder_before(self, end: int) -> int:
        """The most a record was behind its stream time, over the records whose stream time is in [end - window, end)."""
        step = int(self.s.step_s * 1e9)
        lo, hi = (end - int(self.s.window_s * 1e9)) // step, end // step  # cells [lo, hi): hi's starts at end
        for k in [k for k in self._cells if k < lo - 1]:
            del self._cells[k]
        return max((v for k, v in self._cells.items() if lo <= k < hi), default=0)

    def _lateness_of(self, end: int) -> tuple[int, int]:
        """``(lateness, disorder)`` of the window ending at ``end``: the configured lateness, or the disorder measured
        before it if larger (out-of-order delivery adapts it; it shrinks again once the input is ordered), at most
        half a window."""
        d = self._disorder_before(end)
        return min(max(int(self.s.lateness_s * 1e9), d), int(self.s.window_s * 1e9) // 2), d

    def lateness_ns(self) -> int:
        """How long the last window waited for out-of-order records (event ns)."""
        return self._lateness

    def reject(self, rejects: Counter, partition: str = "0") -> None:
        """Add counts of rejected records by reason."""
        with self.lock:
            c = self.counters[partition]
            for reason, k in rejects.items():
                c[f"rejected:{reason}"] += int(k)

    def _see_pairs(self, a: np.ndarray, b: np.ndarray, start: np.ndarray) -> None:
        key = np.minimum(a, b).astype(np.int64) * self._n + np.maximum(a, b)
        # pairs seen before (nearly all, once the first windows are in) are updated in place
        start = np.asarray(start, dtype=np.int64)
        unseen = span_into(self._pair_keys, self._pair_first, self._pair_last, key, start)
        if not unseen.any():
            return
        k, t = key[unseen], start[unseen]
        o = np.lexsort((t, k))  # by key, then time: the first of each run is the earliest, the last the latest
        k, t = k[o], t[o]
        head, tail = np.r_[True, k[1:] != k[:-1]], np.r_[k[1:] != k[:-1], True]
        keys = np.concatenate([self._pair_keys, k[head]])
        o = np.argsort(keys, kind="stable")
        self._pair_keys = keys[o]
        self._pair_first = np.concatenate([self._pair_first, t[head]])[o]
        self._pair_last = np.concatenate([self._pair_last, t[tail]])[o]

    # -- partition state (for restarts and rebalances) ------------------------
    def counters_snapshot(self) -> dict[str, dict]:
        with self.lock:
            return {p: dict(c) for p, c in self.counters.items()}

    def restore_counters(self, partition: str, counts: dict) -> None:
        """Take a partition's published counts (another process counted them)."""
        with self.lock:
            self.counters[partition] = Counter({k: int(v) for k, v in counts.items()})

    def drop_counters(self, partition: str) -> None:
        with self.lock:
            self.counters.pop(partition, None)

    # -- job membership shared across replicas ------------------------------
    def local_components(self) -> list[list[str]]:
        """This replica's GPU clusters (union-find over its pairs), as IP lists."""
        if not len(self._pair_keys):
            return []
        labels = gpu_clusters(self._pair_keys // self._n, self._pair_keys % self._n, self._n)
        ips = self.topology.ips.to_numpy()
        df = pd.DataFrame({"label": labels, "ip": ips})[labels >= 0]
        return [g.tolist() for _, g in df.groupby("label")["ip"]]

    def _recogniser(self, end: int | None = None) -> JobRecogniser:
        """Jobs from the live pairs (those seen by ``end``, a window's end: not those only read ahead of it, which
        another process, reading at another pace, would not have) and the other replicas' components."""
        rec = JobRecogniser(self.topology)
        keys = self._pair_keys if end is None else self._pair_keys[self._pair_first <= end]
        if len(keys):
            rec.partial_fit_pairs(keys // self._n, keys % self._n)
        for comps in self.remote_components.values():
            for ips in comps:
                idx = self.topology.nic_index(pd.Series(ips))
                idx = idx[idx >= 0]
                if len(idx) > 1:
                    rec.partial_fit_pairs(np.full(len(idx) - 1, idx[0]), idx[1:])
        return rec

    # -- analysis -------------------------------------------------------------
    def watermark(self) -> int | None:
        """Event time every active partition has reached.

        Partitions are consumed unevenly (a backlog is read partition by
        partition), so the latest start over all of them would call the
        slower partitions' records late. The minimum over the partitions
        that delivered within ``idle_flush_s`` does not; an idle partition
        does not hold the others back.

        After a quiet spell of every partition (a pause of the collectors, a
        replica taking partitions over) the first partition read again
        would otherwise be the only active one, and its records would carry
        the watermark past what the others, read a moment later, hold: so
        every partition counts as active again for ``idle_flush_s`` from
        the moment input resumes.
        """
        if any(p not in self._part_max for p in self.backlogged):
            return None  # a partition with unread records has not been heard from yet
        if not self._part_max:
            return self.max_start
        now = self.clock()
        active = [t for p, t in self._part_max.items()
                  if p in self.backlogged or now - max(self._part_seen.get(p, 0), self._resumed_at) <= self.s.idle_flush_s]
        return min(active) if active else self.max_start

    def _next_end(self) -> int | None:
        """The next window's end (due or not): the point of the ``step_s`` grid nearest a stride (``step_s``, or
        ``window_s`` while catching up) past the last window (itself on the grid but for the final window of input gone
        quiet), or past the earliest first record of the partitions."""
        stride = int((self.s.window_s if self.catching_up() else self.s.step_s) * 1e9)
        if self.analysed_to is not None:
            since = self.analysed_to
        elif self._first:
            since = min(self._first.values())
        else:
            return None
        step = int(self.s.step_s * 1e9)
        return (since + stride + step // 2) // step * step  # the nearest: a first window of stride +- half a step

    def _due_end(self) -> tuple[int, int, int] | None:
        """``(end, lateness, disorder)`` of the next window if every partition has passed its end and lateness."""
        wm = self.watermark()
        end = self._next_end()
        if wm is None or end is None or wm < end:
            return None  # some partition's records of stream time before the end may still come
        lateness, d = self._lateness_of(end)
        return (end, lateness, d) if wm >= end + lateness else None

    def due(self) -> bool:
        """Has every partition passed the next window's end and its lateness?"""
        return self._due_end() is not None

    def catching_up(self) -> bool:
        """Is the source behind (records unread), with room in the window to read on?

        Behind on a backlog (a full topic, a restart, a burst), a window at
        every ``step_s`` of event time would analyse each flow
        ``window_s / step_s`` times over while its results are late anyway:
        windows then stride a whole ``window_s`` (each reaching back half a
        window, so no step falls between two). Once caught up, windows step
        at ``step_s`` again. A window already holding half of
        ``max_window_flows`` is analysed without waiting.
        """
        return bool(self.backlogged) and len(self.window) < self.s.max_window_flows // 2

    def pending(self) -> bool:
        """Is there input past the last analysis, or held (for the idle flush)?"""
        return (self.max_start is not None and (self.analysed_to is None or self.max_start > self.analysed_to)) or any(self._queued.values())

    def tick(self, final: bool = False, force: bool = False) -> MonitorView | None:
        """Analyse the next window due (:meth:`due`, see :meth:`_advance`) and publish a new view.

        ``final`` analyses up to the last record, everything held taken in
        (no lateness wait): the input has gone quiet. ``force`` re-runs the
        last window when none is due (another replica's job membership
        changed). Returns the new
        view, or None if there was nothing to analyse.
        """
        t0 = time.perf_counter()
        bounds = self._advance(final, force)
        if bounds is None:
            return None
        begin, end, lateness = bounds
        win_ns = int(self.s.window_s * 1e9)
        span = self._log_window(begin, end, lateness, final)
        if span.incomplete:
            return self._publish(end, lateness, self.view.switches, t0, incomplete=True)

        rec = self._recogniser(end)
        labels, jobs = rec.labels(), self._stable_ids(rec.predict())
        self.jobs_ = jobs
        a, b, start, duration, size = self.window.columns()
        cut = int(np.searchsorted(start, end, side="right"))
        an = analyse(a[:cut], b[:cut], start[:cut], duration[:cut], size[:cut], labels, jobs, self.topology,
                     capture_end=end, switch_bw=None, settings=self.analysis, phases=False)
        self._merge_jobs(jobs, an, end)
        self._merge_pair_kinds(an)
        self._merge_states(an.job_states)
        # a job seen for less than half a window has too few steps to cut
        # them reliably (the gap threshold needs several): wait for more
        first = pd.Series(start[:cut]).groupby(labels[a[:cut]]).min() if cut else pd.Series(dtype=np.int64)
        job_first = first.rename(index=label_names(labels, jobs, self.topology))
        young = set(job_first.index[(end - job_first) < int(self.s.window_s * 1e9) // 2]) if not final else set()
        self._merge_steps(an.steps[~an.steps["job_id"].isin(young)] if an.steps is not None else None, final, end)
        self._warn_stepless(job_first.index[end - job_first >= win_ns - int(self.s.step_s * 1e9)], an.steps)
        self._merge_groups(an.group_lag, an.anomalies, an.steps)
        self._merge_collectives(an.collectives, final, end)
        view = self._publish(end, lateness, self._merge_switches(final, end), t0)
        if log.isEnabledFor(logging.DEBUG):  # what each window covered: how far a backlog's windows stride
            log.debug("window analysed", extra={"fields": {"from": iso_time(begin), "to": iso_time(end), "flows": cut, "jobs": len(self._jobs),
                                                           "final": final, "seconds": round(time.perf_counter() - t0, 3)}})
        return view

    def _advance(self, final: bool, force: bool) -> tuple[int, int, int] | None:
        """The next window's ``(begin, end, lateness)``, its records released, what is older than it forgotten; None
        if none is due.

        The end is the next due point of the grid (the last record for
        ``final``: the input went quiet, no wait); ``force`` re-runs the last
        window. The window reaches back ``window_s``, and further: over
        everything released for the first window, to half a window before the
        last one while catching up (so no step falls between two windows).
        (:meth:`tick` and the ingest stage's tick share it: the same windows.)
        """
        if self.max_start is None:
            return None
        if final:
            end, lateness, self._window_disorder = self.max_start, self._lateness_of(self.max_start)[0], 0
        else:
            nxt = self._due_end()
            if nxt is None:
                if not force or self.analysed_to is None:
                    return None
                end, lateness = self.analysed_to, self._lateness
            else:
                end, lateness, self._window_disorder = nxt
        if self.analysed_to is not None and end <= self.analysed_to:
            if not force:
                return None
            end = self.analysed_to
        self._lateness = lateness
        win_ns = int(self.s.window_s * 1e9)
        begin = end - win_ns
        if self.analysed_to is not None:
            begin = min(begin, self.analysed_to - win_ns // 2)
        self._release(None if final else end + lateness, begin if self.analysed_to is not None else None)
        return self._forget(begin, end, lateness, final)

    def _forget(self, begin: int, end: int, lateness: int, final: bool) -> tuple[int, int, int]:
        """Drop the flows, record hashes, switch sums and GPU pairs older than the window ``[begin, end]`` (the first
        window: over everything taken in); its ``(begin, end, lateness)``."""
        if self.analysed_to is None and self.min_start is not None:
            begin = min(begin, self.min_start)
        self.window.evict(begin)
        self._see_servers(end)
        self.dedupe.evict(begin - lateness)
        self._fold_fabric(self.fabric_in.take_before(None if final else end))
        self.switch_bw.forget_before(begin)
        live = self._pair_last >= end - int(self.s.pair_ttl_s * 1e9)
        self._pair_keys, self._pair_last, self._pair_first = self._pair_keys[live], self._pair_last[live], self._pair_first[live]
        return begin, end, lateness

    def _see_servers(self, end: int) -> None:
        """Each server's latest GPU flow and silence, with the window's flows past the last window's end, up to ``end``."""
        a, b, start, _, _ = self.window.columns()
        lo = self._past_servers_to(start)
        hi = int(np.searchsorted(start, end, side="right"))
        if hi > lo:
            server_silences(self._nic_server, a[lo:hi], b[lo:hi], start[lo:hi], self._server_last, self._silence_from, self._silence_to,
                            np.int64(self.analysis.hang.min_silence_s * 1e9))
        self._servers_to = end if self._servers_to is None else max(self._servers_to, end)

    def _past_servers_to(self, start: np.ndarray) -> int:
        """The first of the window's flows (``start``, sorted) past the end the servers' silences are up to."""
        return 0 if self._servers_to is None else int(np.searchsorted(start, self._servers_to, side="right"))

    def _came_back(self, servers: Iterable[str], since: int | None, ahead: np.ndarray | None = None) -> bool:
        """Did ``servers`` all fall silent together, for the hang diagnosis's least silence (``min_silence_s``, 8 s) or
        more, a silence that ended (some of them sent again) after ``since``?

        Each server's latest silence (one still going on reaches the last window's end): their common part. A function
        of the flows up to the windows' ends, not of where the windows fell in the silence. With ``ahead``
        (:meth:`_first_ahead`: a revocation labels the flows read past the last window) a silence going on at the last
        window's end ends at the server's first flow read past it.
        """
        if since is None or self._servers_to is None:
            return False
        codes = [self._server_code[s] for s in servers if s in self._server_code]
        if not codes:
            return False
        min_gap = int(self.analysis.hang.min_silence_s * 1e9)
        frm: list[int] = []
        to: list[int | None] = []
        for c in codes:
            last = int(self._server_last[c])
            if last < 0:
                return False
            nxt = int(ahead[c]) if ahead is not None else -1
            if nxt >= 0 and nxt - last >= min_gap:  # back past the last window
                frm.append(last)
                to.append(nxt)
            elif nxt < 0 and self._servers_to - last >= min_gap:  # silent still
                frm.append(last)
                to.append(None)
            elif self._silence_to[c] >= 0:
                frm.append(int(self._silence_from[c]))
                to.append(int(self._silence_to[c]))
            else:
                return False  # never silent
        ended = [t for t in to if t is not None]
        if not ended:
            return False  # silent still: not back
        return min(ended) - max(frm) >= min_gap and min(ended) > since

    def _first_ahead(self) -> np.ndarray:
        """Each server's earliest GPU flow start past the last window's end, among the flows read (-1: none)."""
        none = np.iinfo(np.int64).max
        out = np.full(len(self._server_last), none, dtype=np.int64)
        a, b, start, _, _ = self.window.columns()
        lo = self._past_servers_to(start)
        for nic in (a[lo:], b[lo:]):
            np.minimum.at(out, self._nic_server[nic], start[lo:])
        return np.where(out == none, -1, out)

    def _fold_fabric(self, rows: pd.DataFrame) -> None:
        """The switch sums of short windows a window has passed (:meth:`SwitchBandwidth.take_before`): into the
        switch diagnosis's windows (the ingest stage forwards them to the fabric's owner instead)."""
        self.switch_bw.add_rows(rows)

    def _publish(self, end: int, lateness: int, switches, t0: float, incomplete: bool = False) -> MonitorView:
        """The window up to ``end`` is done (analysed, or not for being ``incomplete``): its view, and the tick's time."""
        self.analysed_to = end
        self._ticks += 1
        self.view = MonitorView(
            jobs={j: copy.deepcopy(st.view) for j, st in self._jobs.items()}, switches=switches, window_flows=len(self.window),
            pairs=len(self._pair_keys), analysed_to_ns=end, lateness_ns=lateness, ticks=self._ticks, incomplete=incomplete,
            anomalies=self.recent_anomalies(),
        )
        with self.lock:
            self.tick_seconds.append(time.perf_counter() - t0)
        return self.view

    def _log_window(self, begin: int, end: int, lateness: int, final: bool) -> WindowSpan:
        """Log the window about to be analysed; is it incomplete?

        Incomplete when GPU flows of its time may be missing from it (any
        one: a step boundary is a gap in a job's traffic, and one missing
        flow can make or close a gap, so no share of late flows is
        harmless), known before its analysis as input more out of order
        than the window waits for: records came further behind their stream
        time (the disorder measured before its end) than the lateness it
        used, which is capped at half a window, so records of its time may
        still come. A ``final`` window (the input went quiet) waits for none.
        (Late flows it does take in make the windows of their time
        incomplete: :meth:`_note_late`.)

        Such a window is not analysed: no steps, no anomalies, no job
        changes; it is counted (:attr:`windows_incomplete`) and logged.
        """
        disorder = 0 if final else self.disorder_ns()
        incomplete = disorder > lateness
        if self.windows and self.windows[-1].end == end:  # the last window re-run (force)
            span = self.windows[-1]
            incomplete = incomplete and not span.incomplete  # counted once
            span.incomplete = span.incomplete or incomplete
        else:
            span = WindowSpan(begin, end, 0, incomplete)
            self.windows.append(span)
            horizon = end - int(self.s.pair_ttl_s * 1e9)
            while len(self.windows) > 1 and self.windows[0].end < horizon:
                self.windows.popleft()
        if incomplete:
            self.windows_incomplete += 1
            span.why = (f"records arrive up to {disorder / 1e9:.1f} s behind their partition's latest, "
                        f"the window waits {lateness / 1e9:.1f} s (at most half a window)")
            self._flag(span, after=False)
            log.warning("window incomplete (late input): no steps or anomalies reported from it; %s", span.why,
                        extra={"fields": {"from": iso_time(begin), "to": iso_time(end), "late_flows": span.late, "disorder_s": round(disorder / 1e9, 3),
                                          "lateness_s": round(lateness / 1e9, 3)}})
        return span

    def _reload_job_names(self) -> None:
        """Read the job inventory again if its file changed (a scheduler export rewritten); a bad one keeps the last good."""
        names = self.job_names
        if names is None or names.path is None or not names.changed():
            return
        try:
            self.job_names = JobNames.from_csv(names.path, self.topology)
            log.info("job inventory read again", extra={"fields": {"file": names.path, "servers": len(self.job_names.by_server)}})
        except (FlowFormatError, FileNotFoundError) as e:
            names.seen()  # warn once per change, not every window
            log.warning("job inventory not read again; the last good one stands", extra={"fields": {"error": str(e)}})

    def _merge_jobs(self, jobs: pd.DataFrame, an: Analysis, end: int) -> None:
        # the job map is the live pairs' (pairs expire after pair_ttl_s): a job
        # whose id is gone has ended, or grown into a bigger one
        shapes = an.shapes.set_index("job_id") if an.shapes is not None and len(an.shapes) else None
        pair_counts = {}
        if an.pairs is not None and len(an.pairs) and "confidence" in an.pairs:
            certainty = np.where(an.pairs["confidence"].to_numpy(np.float64) < UNCERTAIN_BELOW, "uncertain", "certain")
            pair_counts = an.pairs.assign(certainty=certainty).groupby(["job_id", "type", "certainty"]).size()
        current = {job_id: set(g["server"]) for job_id, g in jobs.groupby("job_id", sort=True)}
        gone = {j: st for j, st in self._jobs.items() if j not in current}
        self._reload_job_names()
        for job_id, g in jobs.groupby("job_id", sort=True):
            job_id = cast(str, job_id)  # the job ids are strings (the stubs type a group key as any scalar)
            st = self._jobs.get(job_id)
            if st is None:
                # a job that grew (more of its servers seen, or another replica's
                # share merged in) keeps the history of what it absorbed
                absorbed = [o for o in gone.values() if o.servers and o.servers <= current[job_id]]
                st = max(absorbed, key=lambda o: o.view.steps) if absorbed else _JobState(job_id, self.s.step_history, self.SETTLE_STEPS)
                st.view.job_id = job_id
                self._jobs[job_id] = st
                name = self.job_names.name(current[job_id]) if self.job_names is not None else ""
                self.events.append(("job", {"job_id": job_id, "gpus": int(len(g)), "servers": int(g["server"].nunique()),
                                            **({"job_name": name} if name else {})}))
            # the id names the servers; the GPUs seen on them can still grow
            st.servers = current[job_id]
            st.judged_to = end
            st.view.gpus, st.view.servers = int(len(g)), len(st.servers)
            st.view.name = self.job_names.name(st.servers) if self.job_names is not None else ""
            if shapes is not None and job_id in shapes.index:
                st.view.dp, st.view.pp = int(shapes.at[job_id, "dp"]), int(shapes.at[job_id, "pp"])
            if len(pair_counts):
                st.view.pairs = {k[1:]: int(v) for k, v in pair_counts.items() if k[0] == job_id}
        for job_id in [j for j, st in self._jobs.items() if j not in current and st.view.job_id == j]:
            del self._jobs[job_id]
            self.events.append(("job_gone", {"job_id": job_id}))
        for job_id in [j for j, st in self._jobs.items() if st.view.job_id != j]:
            del self._jobs[job_id]  # absorbed into a bigger job under its new id

    def _stable_ids(self, jobs: pd.DataFrame, read_ahead: bool = False) -> pd.DataFrame:
        """``jobs`` with a job that had one server replaced under the id it had.

        A job restarted with a spare server in place of a broken one is the
        same job: from the restart the recogniser's id names its old and new
        servers, and once the old server's pairs expire (``pair_ttl_s``) it
        names it anew. Both are mapped back to the id the job has had (and so,
        window after window, are its servers as they were then): a job whose
        servers all fell silent for the hang diagnosis's least silence
        (``min_silence_s``, 8 s) or more and came back, since the last window
        that judged it, with one more server (:meth:`_came_back`: from the
        flows, wherever the windows fell), or a job with one server out and
        one in, at least two (all but one) of its servers kept. (A job that
        grows otherwise, more of its servers seen, takes the new id: see
        :meth:`_merge_jobs`.)

        The one rule of a job's id for every stage: the ingest stage keys the
        job topic by it (``IngestMonitor``, with the jobs it last labelled as
        :meth:`_known_jobs`), so a job restarted on a spare keeps its key, and
        with it its analyse replica, step history and anomaly state.
        ``read_ahead``: ``jobs`` hold the pairs read past the last window (a
        revocation's labels), whose flows end a silence too.
        """
        known = self._known_jobs()
        if not known or not len(jobs):
            return jobs
        ahead = self._first_ahead() if read_ahead else None
        current = {cast(str, job_id): set(g) for job_id, g in jobs.groupby("job_id", sort=True)["server"]}
        rename: dict[str, str] = {}
        for job_id, servers in current.items():
            if job_id in known:
                continue
            for old_id, (old, judged_to) in known.items():
                kept = old & servers
                if old_id in current or old_id in rename.values():
                    continue
                back = old < servers and len(servers - old) == 1 and self._came_back(old, judged_to, ahead)  # restarted on a spare
                swapped = not old <= servers and len(old - servers) <= 1 and len(servers - old) <= 1
                # the servers of a job kept under its old id (the recogniser names them anew at every window)
                same = old == servers
                if (back or swapped or same) and len(kept) >= max(2, len(old) - 1):
                    rename[job_id] = old_id
                    break
        return jobs.assign(job_id=jobs["job_id"].replace(rename)) if rename else jobs

    def _known_jobs(self) -> dict[str, tuple[set, int | None]]:
        """The jobs as the last window that judged them saw them: id -> (servers, that window's end)."""
        return {j: (st.servers, st.judged_to) for j, st in self._jobs.items() if st.view.job_id == j}

    def _merge_states(self, states: pd.DataFrame | None) -> None:
        """Each job's state (running, hung, ended) as the window's silences judge it; a job not judged keeps its last."""
        if states is None or not len(states):
            return
        for job_id, state in zip(states["job_id"], states["state"]):
            st = self._jobs.get(job_id)
            if st is not None:
                st.view.state = str(state)

    def _warn_stepless(self, whole_window_jobs: Iterable[str], steps: pd.DataFrame | None) -> None:
        """Warn once per job seen for a whole window without a step: its steps may be too long for the window.

        The timeline reports no steps rather than cut the bursts inside a
        collective when the window holds fewer than a few of the job's steps.
        """
        cut = set(steps["job_id"]) if steps is not None and len(steps) else set()
        for job_id in whole_window_jobs:
            st = self._jobs.get(job_id)
            if st is None or st.view.steps or st.warned_stepless or job_id in cut:
                continue
            st.warned_stepless = True
            log.warning("no training steps found in a whole window", extra={"fields": {
                "job": job_id, "window_s": self.s.window_s,
                "hint": "a window needs ten or more of the job's steps; if its steps are longer than a tenth of --window, raise --window"}})

    #: a step is reported once the window reaches this many of the job's median steps past its end
    #: (the hold of :class:`prism.analysis.stitch.StepStitcher`)
    SETTLE_STEPS = 0.5

    def _merge_steps(self, steps: pd.DataFrame | None, final: bool, end: int | None = None) -> None:
        if steps is None or steps.empty:
            return
        cs = self.analysis.cross_step
        for job_id, g in steps.sort_values("start_ns").groupby("job_id", sort=False):
            st = self._jobs.get(job_id)
            if st is None:
                continue
            s0s, e0s = g["start_ns"].to_numpy(), g["end_ns"].to_numpy()
            # the median over the job's step history (its baseline outlives the window), the window's before any
            median = median_step_ns(np.array([e - s for _, s, e in st.history]) if st.history else None, e0s - s0s)
            # Steps count once and are not revised: the last one waits for a window that reaches half a
            # step past it, as it may not have ended (see prism.analysis.stitch)
            new, numbers = st.stitcher.take(s0s, e0s, median, None if final or end is None else end)
            if not new.any():
                continue
            v = st.view
            for n, s0, e0 in zip(numbers.tolist(), s0s[new], e0s[new]):  # per step, not per flow
                st.history.append((n, int(s0), int(e0)))
                d = (e0 - s0) / 1e9
                v.bucket_counts[bucket_index(STEP_BUCKETS_S, d)] += 1
                v.step_sum_s += d
                v.steps += 1
            # the cross-step diagnosis over the history: its baseline outlives the window
            h = pd.DataFrame(list(st.history), columns=["step", "start_ns", "end_ns"]).assign(job_id=job_id)
            h["duration_ns"] = h["end_ns"] - h["start_ns"]
            fit = cs.fit(h)
            last = fit.baseline_.iloc[-1]
            v.last_step_s = float(h["duration_ns"].iloc[-1]) / 1e9
            v.slowdown = float(h["duration_ns"].iloc[-1]) / float(last["baseline_ns"])
            v.slow = bool(last["slow"])
            # a slow step among the last few may yet turn into a regime change
            settled = int(h["step"].iloc[-1]) - (0 if final else cs.regime_steps - 1)
            r: Any  # a row: the stubs type its fields as any scalar
            for r in fit.predict().itertuples(index=False):
                if r.kind == "slow_step" and r.step > settled:
                    continue
                self._report(st, (r.kind, r.start_ns), r._asdict())

    def _merge_collectives(self, instances: pd.DataFrame | None, final: bool, end: int) -> None:
        """Count each job's new collectives, and take their figures per kind.

        A collective counts in the window that holds its end with nothing
        after it that could continue it (:func:`prism.analysis.collectives.settled`),
        so once, though the windows overlap. The gauges (durations, bus
        bandwidth) are those of the collectives counted at this window; a
        kind with none keeps its last.
        """
        if instances is None or not len(instances):
            return
        ours = instances[instances["job_id"].isin(list(self._jobs))]
        after = {j: self._jobs[j].collectives_to for j in pd.unique(ours["job_id"])}
        taken, after = settled_by_job(ours, after, None if final else end)
        for job_id, to in after.items():
            self._jobs[job_id].collectives_to = to
        r: Any  # a row: the stubs type its fields as any scalar
        for r in summarise(taken).itertuples(index=False):  # per job and kind
            v = self._jobs[r.job_id].view.collectives.setdefault(r.kind, CollectiveView())
            v.count += int(r.collectives)
            v.bytes += int(r.bytes)
            v.seconds += float(r.duration_sum_ns) / 1e9
            v.duration_p50_s, v.duration_p95_s = float(r.duration_median_ns) / 1e9, float(r.duration_p95_ns) / 1e9
            v.busbw = float(r.busbw_gbps) * 1e9

    def _report(self, st: _JobState, key: tuple, row: dict) -> None:
        if key in st.reported:
            return
        st.reported[key] = row["start_ns"]
        if len(st.reported) > 4 * self.s.step_history:  # keep the keys of recent anomalies only
            for k in sorted(st.reported, key=st.reported.__getitem__)[: len(st.reported) // 2]:
                del st.reported[k]
        st.view.anomalies[row["kind"]] += 1
        if st.view.name:  # the scheduler's name (--jobs.names), in the event and its log line
            row["job_name"] = st.view.name
        self._note_anomaly(row)

    def _note_anomaly(self, row: dict) -> None:
        """An anomaly found: an event for the caller, and one of its job's (or the fabric's) recent ones for the view."""
        self.events.append(("anomaly", row))
        self._anomaly_seq += 1
        job = row.get("job_id")
        job = job if isinstance(job, str) else ""  # switches and links: no job
        q = self._recent.get(job)
        if q is None:
            q = self._recent[job] = deque(maxlen=RECENT_ANOMALIES_PER_JOB)
        q.append((self._anomaly_seq, {k: row.get(k) for k in _RECENT_FIELDS}))

    def recent_anomalies(self) -> tuple[dict, ...]:
        """The current anomalies, oldest first: the last :data:`RECENT_ANOMALIES_PER_JOB` of each job still
        recognised and of the fabric, and of those the newest :data:`RECENT_ANOMALIES`."""
        for job in [j for j in self._recent if j and j not in self._jobs]:
            del self._recent[job]  # the job ended, or was absorbed into a bigger one
        rows = sorted((x for q in self._recent.values() for x in q), key=lambda x: x[0])[-RECENT_ANOMALIES:]
        # each job's name as the inventory says now (it may have been renamed since the anomaly)
        names = {j: st.view.name for j, st in self._jobs.items() if st.view.name}
        return tuple(dict(r, job_name=names.get(r["job_id"], "") if isinstance(r["job_id"], str) else "") for _, r in rows)

    def _merge_groups(self, lag: pd.DataFrame | None, anomalies: pd.DataFrame | None, steps: pd.DataFrame | None) -> None:
        for js in self._jobs.values():
            js.view.group_lag = {}
        if lag is not None and len(lag):
            latest = lag.sort_values("step").groupby(["job_id", "server"]).tail(1)
            for r in latest.itertuples(index=False):
                if r.job_id in self._jobs:
                    self._jobs[r.job_id].view.group_lag[r.server] = round(float(r.ratio), 4)
        found = anomalies[~anomalies["kind"].isin(_CROSS_STEP_KINDS)] if anomalies is not None else anomalies
        now = self._ticks
        for r in (found.itertuples(index=False) if found is not None else ()):
            st = self._jobs.get(r.job_id)
            if st is None:
                continue
            # a lagging server stays one anomaly while it keeps lagging tick after tick
            key = (r.kind, r.job_id, r.subject)
            ongoing = self._active.get(key) == now - 1
            self._active[key] = now
            if not ongoing:
                row = r._asdict()
                row["step"] = self._hung_step(st, r.start_ns, steps) if r.kind == "hang" else self._global_step(st, r.start_ns)
                if r.kind == "slow_group" and row["step"] >= 0:  # the window's step numbers in its text, the job's in the row
                    row["explanation"] = StageLagDiagnoser.renumber(str(row["explanation"]), int(row["step"]))
                self._report(st, key + (r.start_ns,), row)
        for k in [k for k, t in self._active.items() if t < now - 1]:
            del self._active[k]

    @staticmethod
    def _hung_step(st: _JobState, hung_at: int, steps: pd.DataFrame | None) -> int:
        """The number of the step a job hung in: the next after its steps reported and those of the window not yet
        reported (a young job's wait for more of its steps) that ended before."""
        n = st.stitcher.next_step
        if steps is not None and len(steps):
            own = steps[steps["job_id"] == st.view.job_id]
            after = own["end_ns"] > st.stitcher.last_end if st.stitcher.last_end is not None else True
            n += int(((own["end_ns"] <= hung_at) & after).sum())
        return n

    @staticmethod
    def _global_step(st: _JobState, start_ns: int) -> int:
        for step, s0, _ in st.history:
            if s0 == start_ns:
                return step
        return -1

    def _merge_pair_kinds(self, an: Analysis) -> None:
        """The window's pair types over the earlier ones (a pair typed again takes its new type); pairs no longer live go."""
        pk = pair_kinds(an.pairs, self.topology)
        keys, types = self._kind_keys, self._kind_types
        if pk is not None:
            a, b, t = pk
            keys = np.concatenate([np.minimum(a, b).astype(np.int64) * self._n + np.maximum(a, b), keys])
            types = np.concatenate([np.asarray(t, dtype=object), types])
        keys, first = np.unique(keys, return_index=True)  # the first of each key: the newest
        live = np.isin(keys, self._pair_keys)
        self._kind_keys, self._kind_types = keys[live], types[first][live]

    def _switch_kinds(self, end: int | None, final: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``(a, b, type)`` of the pairs whose flows the switch diagnosis of the window ending at ``end`` judges apart,
        by kind: the live pairs' types from the windows analysed here (the analyse stage's fabric owner adds the other
        replicas' jobs')."""
        return (self._kind_keys // self._n, self._kind_keys % self._n, self._kind_types) if len(self._kind_keys) else None

    def _merge_switches(self, final: bool = False, end: int | None = None) -> dict:
        sd = self.analysis.switches.fit(self.switch_bw, self._switch_kinds(end, final))
        flagged_links = set()
        for r in sd.predict().sort_values("start_ns").itertuples(index=False):
            # one anomaly while the switch stays slow, window after window
            key, w = (r.kind, r.subject), int(r.start_ns) // self.switch_bw.window_ns
            last = self._switch_last.get(key)
            new = last is None or w > last + 1
            if new and r.kind == "slow_link" and not final:
                # A switch window still filling mixes the time before a fault with the time
                # after: when a switch degrades mid-window, its links (fewer flows) can cross
                # the threshold a window before the switch does, and its neighbours' links
                # with them; once the switch is flagged they are explained by it. A new slow
                # link is reported when it is still slow at the next window.
                flagged_links.add(key)
                if key not in self._links_pending:
                    continue
            if new:
                self._fabric_anomalies[r.kind] += 1
                self._note_anomaly(r._asdict())
            self._switch_last[key] = max(w, last if last is not None else w)
        self._links_pending = flagged_links
        bw = sd.bandwidth_
        out = {}
        if bw is not None and len(bw):
            sw = bw[bw["kind"] == "switch"]
            if len(sw):
                latest = sw[sw["window_start_ns"] == sw["window_start_ns"].max()]
                for r in latest.itertuples(index=False):
                    out[r.name] = (float(r.gbps) * 1e9, float(r.ratio) if pd.notna(r.ratio) else float("nan"))
        return out

    def steps_frame(self) -> pd.DataFrame:
        """The steps kept per job: ``job_id, step, start_ns, end_ns, duration_ns``."""
        rows = [(j, *h) for j, st in self._jobs.items() for h in st.history]
        df = pd.DataFrame(rows, columns=["job_id", "step", "start_ns", "end_ns"])
        return df.assign(duration_ns=df["end_ns"] - df["start_ns"])

    @property
    def fabric_anomalies(self) -> Counter:
        """Switch and link anomalies counted so far, by kind (no job)."""
        return Counter(self._fabric_anomalies)

