"""The daemon split in two stages through a job-keyed Kafka topic (``prism daemon --role ingest|analyse``).

One daemon reads every GPU pair's flows and so cuts each job's steps from
all of them. Replicas of it in one consumer group split the input topic
(keyed by GPU pair) and each cuts steps from its share of each job's
flows: two replicas export every job, with diverging steps and anomalies.
This module repartitions by job, as Kafka Streams does with a
``through``/repartition topic: Kafka is the engine, no coordinator.

``--role ingest`` (consumer group ``--kafka.group-id`` on ``--kafka.topic``)
    decodes, validates, dedupes and counts the input (the flow counters are
    exported here), keeps the per-pair state and recognises whole jobs (job
    membership exchanged through the summaries topic, as replicas always
    did), and at every window (``--window.step`` of event time) forwards the GPU
    flows it took in since the last one to the **job topic**
    (``--kafka.job-topic``), one Arrow IPC message per job keyed by the job
    id, followed on every job-topic partition by a **watermark**: for each
    input partition it owns, the event time up to which it has forwarded
    (its window's end). The switch sums of its flows (per short window and
    path, see ``Monitor._fold_fabric``) go, once a window has passed them,
    under the fixed key :data:`FABRIC_KEY`. Only then does it publish its partition state and
    commit its input offsets: for each partition, the first offset of the
    oldest poll batch not all forwarded, with the counts as they were
    before it (at least once, counted once: a replica that takes the
    partition over reads those records again; the analyse stage drops
    re-deliveries by record hash).
``--role analyse`` (consumer group ``<group-id>-analyse`` on the job topic)
    holds whole jobs: each job's flows are in one job-topic partition, and
    so in one replica. Its event time is the minimum, over the input
    topic's partitions (their count travels with the watermarks), of the
    latest watermark for each: a window is analysed once every ingest
    replica has forwarded everything of its time; its windows end where
    the ingest stage's did, and one the ingest stage flagged incomplete
    (late input, in its watermark) is not analysed. It runs the same
    analyses as one daemon: jobs, steps, the per-job diagnosis, and exports
    the per-job metrics, each job from exactly one replica. The replica
    holding :data:`FABRIC_KEY`'s partition adds up every ingest replica's
    switch sums and diagnoses the fabric (switches and links) over them, as
    one daemon does over its own: the fabric's anomalies and metrics come
    from it alone (its state travels with the jobs'). It commits the
    job-topic offset a successor must replay from (just after the last
    watermark a window before its analysis) and publishes every job's state
    (stitcher, step history, counts, anomalies reported) to the summaries
    topic: a successor rebuilds the window by replaying and reports no step
    twice and misses none.

A job whose id changes (it grew: more of its servers seen, another ingest
replica's share merged in) is re-keyed: the ingest replica sends its whole
window of the job's flows under the new id (the new owner drops what it
already had by record hash) and a **retire** message for each old id on
that id's partition, on which its owner forgets the old job's pairs and
flows (the job is gone from its metrics at the next window) unless it
holds the new id's partition too. Both follow the window's watermark and
wait, as the next window's flows do, until the analyse replica has
analysed that window (see ``JobTopicSource``). An old id on another
replica's partition is named to the new id's owner first (``rekey``), and
its owner hands the job over as it retires it (``handover``: its pairs and
state): the new owner's windows from the re-key's on wait for it, so the
job keeps its step history as in one daemon (see
``AnalyseMonitor.expect_states``).

``--role all`` (the default) is the single-process daemon, unchanged.

The switch diagnosis judges each kind of flow (pair type) apart, and only
the replica holding a job types its pairs: every analyse replica sends,
after each window, its jobs' typed pairs (by job-topic partition, with the
window's end) under :data:`FABRIC_KEY`, and the fabric's owner holds each
window back until every other partition's are in (see
``AnalyseMonitor._kinds_ready``).

Message formats on the job topic: flow batches are the input's Arrow IPC
stream (``content-type`` header, and :data:`REPLICA_HEADER` naming the
ingest replica; flows that came late for an ingest window also carry
:data:`LATE_HEADER`, its end); control messages carry a
``prism-control`` header (``watermark``, ``retire`` or ``rekey``) and a
JSON value, or (``fabric``) an Arrow IPC stream of switch sums, or
(``kinds``) an Arrow IPC stream of typed pairs (``a, b, type, part``; its
window in the schema metadata under :data:`KINDS_META`), or
(``handover``) an Arrow IPC stream of a retired job's pairs (``key,
first, last``; the ids and the job's state under :data:`HANDOVER_META`).
"""
from __future__ import annotations

import bisect
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Collection
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from prism.analysis.analyse import label_names
from prism.ingest.messages import ARROW_CONTENT_TYPE, arrow_ipc, decode_messages
from prism.ingest.records import RejectCounter
from prism.serve.monitor import Monitor, MonitorView, WindowSpan, iso_time
from prism.serve.sources import KafkaSource, ensure_topic
from prism.serve.window import FlowWindow

__all__ = ["IngestMonitor", "AnalyseMonitor", "ForwardingSource", "JobTopicSource", "CONTROL_HEADER", "FABRIC_KEY", "HANDOVER_META", "KINDS_META",
           "LATE_HEADER",
           "REPLICA_HEADER",
           "analyse_group", "job_partition"]

log = logging.getLogger("prism.jobtopic")

CONTROL_HEADER = "prism-control"
#: on forwarded flows that came late: the end of the ingest window they came late for (see JobTopicSource: they wait
#: for the analyse stage's windows up to it)
LATE_HEADER = "prism-late-for"
#: on forwarded flows: the ingest replica that sent them (its watermarks say which window they follow; see JobTopicSource)
REPLICA_HEADER = "prism-replica"
#: the key (and so the job-topic partition) of the switch sums: the analyse replica holding its partition owns the fabric
FABRIC_KEY = "prism-fabric"
#: the schema metadata key of a typed-pairs (``kinds``) message: its window's end, whether final, the partitions it covers
KINDS_META = b"prism-kinds"
#: the schema metadata key of a hand-over message (a retired job's pairs): new id, old id, the job's state (first message;
#: ``state_bytes`` instead if it was too big to send)
HANDOVER_META = b"prism-handover"
_ARROW = ARROW_CONTENT_TYPE.encode()
#: the columns forwarded; switches are not (their sums go to the fabric's owner instead)
_SCHEMA = pa.schema([("start_ns", pa.int64()), ("duration_ns", pa.int64()), ("src", pa.string()), ("dst", pa.string()),
                     ("size", pa.int64()), ("switches", pa.string())])


def job_partition(job_id: str, partitions: int) -> int:
    """The job topic's partition of ``job_id``: Kafka's default partitioner (murmur2 of the key), as the Java client's."""
    from kafka.partitioner.default import murmur2

    return (murmur2(job_id.encode()) & 0x7FFFFFFF) % partitions


def analyse_group(group_id: str) -> str:
    """The analyse stage's consumer group on the job topic, beside the ingest stage's ``group_id``."""
    return f"{group_id}-analyse"


class _TeeWindow(FlowWindow):
    """A flow window that also keeps what was added since the last :meth:`take` (the flows to forward)."""

    def __init__(self, max_flows: int) -> None:
        super().__init__(max_flows)
        self.outbox: list[tuple] = []
        self.resuming = False  # the flows being added are a taken-over partition's, read again (never late)

    def add(self, a: np.ndarray, b: np.ndarray, start: np.ndarray, duration: np.ndarray, size: np.ndarray) -> None:
        super().add(a, b, start, duration, size)
        if len(a):
            self.outbox.append((np.asarray(a, np.int32), np.asarray(b, np.int32), np.asarray(start, np.int64),
                                np.asarray(duration, np.int64), np.asarray(size, np.int64), np.full(len(a), self.resuming)))

    def take(self, end: int | None, keep: bool = False) -> tuple[np.ndarray, ...]:
        """The outbox's flows that started by ``end`` (all, for None), removed from it (with ``keep``, left in it):
        ``(a, b, start, duration, size, resumed)``, the last whether each came from a partition read again."""
        if not self.outbox:
            return tuple(np.empty(0, dtype=t) for t in (np.int32, np.int32, np.int64, np.int64, np.int64, bool))
        cols = [np.concatenate([p[i] for p in self.outbox]) for i in range(6)]
        now = np.ones(len(cols[0]), dtype=bool) if end is None else cols[2] <= end
        rest = ~now
        if not keep:
            self.outbox = [tuple(c[rest] for c in cols)] if rest.any() else []
        return tuple(c[now] for c in cols)


class IngestMonitor(Monitor):
    """The ingest stage's monitor: counts and windows as a daemon's, jobs recognised, no per-job analysis.

    Its :meth:`tick` labels the flows taken in since the last one with their
    job and leaves them in :attr:`forward` (job id -> columns) for the
    source to send, with the window's end in :attr:`forwarded_to`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.window: _TeeWindow = _TeeWindow(self.s.max_window_flows)
        self.forward: dict[str, tuple] = {}  # job id -> (a, b, start, duration, size) to send
        # (job id, the end of the window they came late for) -> the flows taken in after it that started by its end
        self.forward_late: dict[tuple[str, int], tuple] = {}
        self.forward_resumed: dict[str, tuple] = {}  # job id -> flows of partitions taken over, read again (see _label)
        self.retire: dict[str, str] = {}  # old job id -> the id it is now part of
        self.forwarded_to: int | None = None  # event time forwarded up to (the last window's end)
        self.final = False  # the last window was the tail of a quiet input (no lateness wait)
        self._job_of = np.full(len(self.topology), -1, dtype=np.int64)  # NIC -> index into _ids of the job it was last sent under
        self._ids: list[str] = []
        self.flows_forwarded = 0
        self.rekeyed = 0  # jobs re-keyed (their window sent again under a new id)
        self.flags: list[list] = []  # windows turned incomplete since the last watermark: [begin, end, late flows, after, why]
        self.fabric_out: list[pd.DataFrame] = []  # switch sums of the short windows passed, to forward to the fabric's owner
        self.resuming: set[str] = set()  # input partitions just taken over, read again from their resume point until the next window
        self._resumed = False  # the batch being ingested is a resuming partition's
        self.out_lock = threading.Lock()  # a window's labelling vs. a revocation's (on the consumer's poll, during an analysis)
        # the jobs as the last window judged them (id -> servers, its end): the ids one daemon has in its job states,
        # which Monitor._stable_ids keeps a job restarted on a spare server under
        self._known: dict[str, tuple[set, int | None]] = {}

    def tick(self, final: bool = False, force: bool = False) -> MonitorView | None:
        """The window up to the watermark: jobs recognised, flows and switch sums ready to forward.

        The same window bounds as :meth:`Monitor.tick` (the lateness wait, the
        first window over everything read, the reach back while catching up).
        """
        with self.out_lock:
            return self._tick(final, force)

    def _tick(self, final: bool, force: bool) -> MonitorView | None:
        t0 = time.perf_counter()
        if force and self.final and not self.pending():
            # the final window re-run (another replica's job membership changed): still the tail of a quiet input; as
            # one that is not, its watermark would say so, and with nothing past it no idle flush would make it final
            # again (the analyse stage would wait for that partition's final mark for ever)
            final = True
        bounds = self._advance(final, force)
        if bounds is None:
            return None
        begin, end, lateness = bounds
        span = self._log_window(begin, end, lateness, final)
        self._label(end)
        if not span.incomplete:  # as one daemon's job states: a window it does not analyse judges no job
            self._known = {str(j): (set(g), end) for j, g in self.jobs_.groupby("job_id", sort=True)["server"]}
        self.forwarded_to, self.final = end, final
        if not force:
            self.resuming.clear()  # their records are forwarded with this window, and its watermark covers them
        return self._publish(end, lateness, {}, t0, incomplete=span.incomplete)  # the fabric is diagnosed by its owner

    def _fold_fabric(self, rows: pd.DataFrame) -> None:
        if len(rows):
            self.fabric_out.append(rows)

    def _known_jobs(self) -> dict[str, tuple[set, int | None]]:
        return self._known

    def take_fabric(self, all_: bool = False) -> pd.DataFrame | None:
        """The switch sums to forward (with ``all_``, also those of short windows not yet passed: a revocation), emptied."""
        with self.out_lock:
            if all_:
                self._fold_fabric(self.fabric_in.take_before(None))
            out, self.fabric_out = self.fabric_out, []
        return pd.concat(out, ignore_index=True) if out else None

    # A partition taken over (its replica died, a rebalance) is read again from where its
    # last owner had forwarded everything before (see ForwardingSource._resume_point):
    # its records up to this replica's next window are not late for the analyse stage,
    # whose event time that partition's watermark has held back (those its last owner
    # forwarded already are dropped there as re-deliveries).

    def _rereading(self, partition: str) -> bool:
        return partition in self.resuming  # the mark travels with the records held (see Monitor._admit)

    def _take(self, flows: pd.DataFrame, a: np.ndarray, b: np.ndarray, partition: str, late: np.ndarray, reread: bool = False) -> None:
        self._resumed = self.window.resuming = reread
        try:
            super()._take(flows, a, b, partition, np.zeros(len(late), dtype=bool) if reread else late, reread)
        finally:
            self._resumed = self.window.resuming = False

    def _note_late(self, dropped: np.ndarray, a: np.ndarray, b: np.ndarray, start: np.ndarray) -> None:
        if not self._resumed:
            super()._note_late(dropped, a, b, start)

    def label(self, end: int | None, keep: bool = False) -> None:
        """Take the outbox's flows up to ``end`` into :attr:`forward`, each under its job's id; re-key jobs whose id changed.

        With ``keep`` (a revocation, ahead of the window) the flows stay in the
        outbox as well: the next window labels them again with the jobs as
        recognised then. Labelled now, a job not yet seen whole has a piece's
        id; the window re-keys it (the window's flows sent again under the
        whole job's id, the piece's id retired), but flows past the window's
        end, taken out here, would have gone only under the retired id: lost
        to the whole job's owner (see ``tests/test_roles.py``). Those sent
        twice are dropped at the analyse stage as re-deliveries.
        """
        with self.out_lock:
            self._label(end, keep)

    def _label(self, end: int | None, keep: bool = False) -> None:
        late_for = None if keep else self.forwarded_to  # the last window: flows of its time taken in since came late for it
        rec = self._recogniser(end)
        # one daemon's ids: a job restarted on a spare keeps its key
        labels, jobs = rec.labels(), self._stable_ids(rec.predict(), read_ahead=end is None)
        self.jobs_ = jobs
        names = label_names(labels, jobs, self.topology)
        a, b, start, duration, size, resumed = self.window.take(end, keep)
        # a job whose id changed since its flows were last sent: the new id's owner gets the whole window (which holds
        # the outbox's flows too), the old ids are retired
        rekeyed = set()
        for lab, job_id in names.items():
            nics = np.flatnonzero(labels == lab)
            old = {self._ids[i] for i in np.unique(self._job_of[nics]).tolist() if i >= 0} - {job_id}
            if old:
                rekeyed.add(lab)
                wa, wb, ws, wd, wz = self.window.columns()
                cut = int(np.searchsorted(ws, end, side="right")) if end is not None else len(ws)
                m = labels[wa[:cut]] == lab
                self._add(job_id, (wa[:cut][m], wb[:cut][m], ws[:cut][m], wd[:cut][m], wz[:cut][m]))
                for o in old:
                    self.retire[o] = job_id
                self.rekeyed += 1
                log.info("job re-keyed on the job topic", extra={"fields": {"job": job_id, "was": ",".join(sorted(old))}})
            if job_id not in self._ids:
                self._ids.append(job_id)
            self._job_of[nics] = self._ids.index(job_id)
        job = labels[a] if len(a) else np.empty(0, dtype=np.int64)
        # late as Monitor._note_late counts them: not a taken-over partition's read again (the analyse stage's event time
        # waited for those)
        late = (start <= late_for) & ~resumed if late_for is not None else np.zeros(len(a), dtype=bool)
        for lab in np.unique(job).tolist():
            if lab < 0 or lab not in names:
                continue
            # a taken-over partition's, read again: windows the analyse stage has yet to cut need them (its event time
            # waited for that partition), so they go unattributed to a window and are not held back there
            m = (job == lab) & resumed
            self._add(names[lab], (a[m], b[m], start[m], duration[m], size[m]), self.forward_resumed)
            if lab in rekeyed:
                continue
            m = (job == lab) & ~late & ~resumed
            self._add(names[lab], (a[m], b[m], start[m], duration[m], size[m]))
            if late_for is not None:
                m = (job == lab) & late
                self._add((names[lab], late_for), (a[m], b[m], start[m], duration[m], size[m]))

    def _add(self, key: str | tuple[str, int], cols: tuple, out: dict | None = None) -> None:
        """Into ``out``, else :attr:`forward` (a job id) or :attr:`forward_late` (a job id and the window its flows came
        late for)."""
        if not len(cols[0]):
            return
        into: dict[Any, tuple] = out if out is not None else self.forward if isinstance(key, str) else self.forward_late
        have = into.get(key)
        into[key] = cols if have is None else tuple(np.concatenate([x, y]) for x, y in zip(have, cols))

    def _flag(self, span: WindowSpan, after: bool) -> None:
        self.flags.append([int(span.begin), int(span.end), int(span.late), bool(after), span.why])

    def take_flags(self) -> list[list]:
        """The windows turned incomplete since the last call (for the next watermark), emptied."""
        out, self.flags = self.flags, []
        return out

    def take_forward(self) -> tuple[dict[str, tuple], dict[str, str]]:
        """What to send (flows by job id, retired ids), emptied; the late flows are :meth:`take_late`'s."""
        out, self.forward = self.forward, {}
        retire, self.retire = self.retire, {}
        return out, retire

    def take_late(self) -> dict[tuple[str, int], tuple]:
        """The late flows to send, by (job id, the end of the window they came late for), emptied."""
        out, self.forward_late = self.forward_late, {}
        return out

    def take_resumed(self) -> dict[str, tuple]:
        """The flows of partitions taken over and read again, to send unattributed to a window, by job id, emptied."""
        out, self.forward_resumed = self.forward_resumed, {}
        return out

    def encode(self, cols: tuple) -> bytes:
        """Flow columns as an Arrow IPC stream in the input's format (addresses as text; no switches)."""
        a, b, start, duration, size = cols
        ips = self.topology.ips.to_numpy()
        src = pa.DictionaryArray.from_arrays(pa.array(a, pa.int32()), pa.array(ips, pa.string())).dictionary_decode()
        dst = pa.DictionaryArray.from_arrays(pa.array(b, pa.int32()), pa.array(ips, pa.string())).dictionary_decode()
        table = pa.Table.from_arrays([pa.array(start), pa.array(duration), src, dst, pa.array(size), pa.nulls(len(a), pa.string()).fill_null("")],
                                     schema=_SCHEMA)
        return arrow_ipc(table)


class AnalyseMonitor(Monitor):
    """The analyse stage's monitor: a daemon's analyses, on event time the ingest stage's watermarks say is complete.

    The flows come from the job topic, whole jobs per partition. The
    watermark is the minimum over the input topic's partitions of the latest
    watermark the ingest stage sent for each (None until every input
    partition has one); the ingest stage already waited for out-of-order
    records, so no lateness is added here. The input flow counters are the
    ingest stage's: this stage exports none (:meth:`counters_snapshot` is
    empty), and counts the flows it received in :attr:`flows_received`.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.marks: dict[int, dict[int, tuple[int, bool]]] = {}  # job-topic partition -> input partition -> (forwarded up to, final)
        self.owned: set[int] = set()  # the job-topic partitions this replica holds
        self.inputs: int | None = None  # the input topic's partition count
        self.flows_received = 0
        self.retired: list[str] = []
        self.restored: dict[str, dict] = {}  # job id -> state published by a previous owner, taken when the job is next seen
        # ingest windows flagged incomplete, not yet applied: (replica, begin, end, after) -> {"at": the watermark it came with, ...}
        self.flags: dict[tuple, dict] = {}
        self._flags_done: dict[tuple, int] = {}  # applied (each comes once per job-topic partition): key -> its watermark
        self.ends: list[int] = []  # the ingest stage's window ends received, past the last window here (sorted)
        self._tick_to: int | None = None  # the end of the window being analysed
        self.fabric_part: int | None = None  # the job-topic partition of the switch sums (FABRIC_KEY): its holder owns the fabric
        self.fabric_rows = 0  # switch-sum rows received
        self.gone: set[str] = set()  # jobs retired (ended, re-keyed, absorbed) since the last publish: their states are deleted
        self.tombstones = 0  # job states deleted (tombstones written)
        self.job_parts: int | None = None  # the job topic's partition count
        # the typed pairs of every job-topic partition's jobs as its holder published them (read on the fabric partition):
        # partition -> [(window end they hold from, final, a, b, type)] in the order read
        self.kinds_in: dict[int, list[tuple]] = {}
        self.kinds_out: list[tuple] = []  # this replica's typed pairs at each window, to publish: (end, final, partitions, a, b, type, partition)
        self.kinds_rows = 0  # typed pairs received
        self._kinds_chunks: dict[tuple, list] = {}  # (replica, end, final) -> the messages of a window's typed pairs read so far
        self._quiet_to: int | None = None  # event time up to which this replica, with no flows yet, sent no typed pairs (_quiet)
        # a job re-keyed from ids other replicas held (see expect_states): new id -> (old ids whose states are still
        # to come, since (clock), how long to wait), new id -> old id -> the state handed over (None: none), and
        # new id -> old id -> the first window end its state is for (the re-key's; None: every window)
        self.awaiting: dict[str, tuple[set[str], float, float]] = {}
        self.handed: dict[str, dict[str, dict | None]] = {}
        self.rekeyed_at: dict[str, dict[str, int | None]] = {}
        # handed-over pairs not yet in this replica's: (the first window end they are for, or None, keys, first, last)
        self._handed_pairs: list[tuple[int | None, np.ndarray, np.ndarray, np.ndarray]] = []
        self.handovers_taken = 0  # re-keyed jobs that took a state another replica handed over
        self.handovers_missed = 0  # states waited for in vain (see expect_states)
        # (new id, old id, replica) -> (since (clock), the messages read so far)
        self._handover_chunks: dict[tuple, tuple[float, dict[int, tuple]]] = {}
        self._handed_since: dict[str, float] = {}  # new id -> when its first state was handed over (clock)

    def ingest(self, flows: pd.DataFrame, partition: str = "0") -> None:
        self.flows_received += len(flows)
        super().ingest(flows, partition)

    def mark(self, value: dict, part: int = 0) -> None:
        """Take an ingest replica's watermark read on job-topic partition ``part``:
        ``{"inputs": n, "partitions": {input partition: forwarded up to}, "final": bool}``."""
        self.inputs = int(value["inputs"])
        marks = self.marks.setdefault(part, {})
        for p, end in value["partitions"].items():
            p = int(p)
            marks[p] = (max(int(end), marks.get(p, (int(end), False))[0]), bool(value.get("final")))
        at = value.get("end")
        if at is None:
            return
        i = bisect.bisect_left(self.ends, int(at))
        if i == len(self.ends) or self.ends[i] != int(at):
            self.ends.insert(i, int(at))
        for begin, end, late, after, why in value.get("incomplete", ()):
            key = (str(value.get("replica", "")), int(begin), int(end), bool(after))
            if key not in self._flags_done:
                self.flags.setdefault(key, {"at": int(at), "late": int(late), "why": str(why)})

    def complete_to(self) -> int | None:
        """Event time every input partition has been forwarded up to, on every job-topic partition held;
        None while one has not been heard from.

        Per job-topic partition: the watermark follows the flows it covers on
        that partition only (Kafka orders a partition, not a topic), so one
        read from another partition says nothing of this one's flows.
        """
        if self.inputs is None or not self.owned:
            return None
        out = None
        for q in self.owned:
            marks = self.marks.get(q, {})
            if any(p not in marks for p in range(self.inputs)):
                return None
            low = min(marks[p][0] for p in range(self.inputs))
            out = low if out is None else min(out, low)
        return out

    def all_final(self) -> bool:
        return self.inputs is not None and bool(self.owned) and all(
            self.marks.get(q, {}).get(p, (0, False))[1] for q in self.owned for p in range(self.inputs))

    # -- windows at the ingest stage's window ends ---------------------------------
    # A window here ends where an ingest replica's window ended: the first end
    # received a ``--window.step`` past the last window, once every input
    # partition has been forwarded up to it. Every end up to the event time
    # complete here has been received (on each job-topic partition a replica's
    # watermarks come in order, and each goes to every partition), so the
    # windows are a function of the ingest stage's windows, not of the order in
    # which the job topic's partitions were read: a successor replaying the job
    # topic cuts the same windows, and with one ingest replica they are its own
    # (so one daemon's, reading alike).

    def _first_end(self) -> int | None:
        """The end of the next window to be cut from the ends received (due or not), or None: the first end a
        ``--window.step`` past the last window (not one the final window of input gone quiet takes in)."""
        to = self.complete_to()
        step = int(self.s.step_s * 1e9)
        last = self.analysed_to
        for e in self.ends:
            if last is None or e - last >= step:
                return None if to is not None and e >= to and self.all_final() else e
        return None

    def _next_end(self) -> int | None:
        """The end of the next window due (not the last one of input gone quiet: the final window's), or None."""
        to = self.complete_to()
        e = self._first_end()
        if to is None or e is None or e > to:
            return None
        return e if self._kinds_ready(e, False) and not self._awaits_states(e) else None

    def holds_back(self, after: int | None) -> bool:
        """Whether what an ingest replica sent after its window ending at ``after`` (the next window's flows, flows
        that came late for that one, a retire) waits for an analysis here: the next window here ends by then. One
        daemon analysed that window before it read them, so this stage's analysis of it must not see them either,
        however far it has read. (Nothing waits on a replica with no flows yet: it analyses no window before it has
        some.)"""
        if after is None or self.max_start is None:
            return False
        e = self._first_end()
        return e is not None and e <= after

    def due(self) -> bool:
        return self._next_end() is not None

    def watermark(self) -> int | None:
        return self._tick_to if self._tick_to is not None else self.complete_to()

    def lateness_ns(self) -> int:
        return 0  # waited for by the ingest stage

    def disorder_ns(self) -> int:
        return 0  # the job topic interleaves ingest replicas' batches; the ingest stage measured the input's disorder

    def pending(self) -> bool:
        """Input past the last analysis that only a final window reaches (every ingest replica went quiet)."""
        to = self.complete_to()
        return to is not None and self.all_final() and (self.analysed_to is None or to > self.analysed_to)

    def tick(self, final: bool = False, force: bool = False) -> MonitorView | None:
        to = self.complete_to()
        if to is None:
            return None
        final = final and self.all_final()
        view: MonitorView | None
        if not self.owns_fabric() and (len(self.switch_bw.table()) or len(self.fabric_in.table()) or self._switch_last or self.kinds_in):
            self._drop_fabric()
        if final:  # the last window reaches the ingest stage's tail, not only this replica's latest flow
            if not self._kinds_ready(max(self.max_start or to, to), True) or self._awaits_states(None):
                return None  # the fabric's owner waits for every partition's typed pairs of the tail; a re-keyed job's state
            quiet = False
            self.max_start = max(self.max_start or to, to)
            self._add_handed_pairs(None)
            view = super().tick(final=True, force=force)
        else:
            quiet = self.max_start is None and self._quiet(to)
            self._tick_to = self._next_end()
            if self._tick_to is not None:
                self._add_handed_pairs(self._tick_to)
            try:
                view = super().tick(final=False, force=force) if self._tick_to is not None or force else None
            finally:
                self._tick_to = None
        if self.analysed_to is not None:
            del self.ends[:bisect.bisect_right(self.ends, self.analysed_to)]
            if view is not None:
                self._queue_kinds(self.analysed_to, final)
        return self.view if view is None and quiet else view  # nothing analysed, but typed pairs (none) to publish

    def _quiet(self, to: int) -> bool:
        """No flows here yet: the partitions' typed pairs (none) up to ``to`` are queued for the fabric's owner, once for
        each advance of the event time, so that the owner does not wait on this replica; whether they were."""
        if self._quiet_to is not None and to <= self._quiet_to:
            return False
        self._quiet_to = to
        if self.job_parts is None or not self.owned:
            return False
        empty = np.empty(0, dtype=np.int64)
        self.kinds_out.append((int(to), False, sorted(self.owned), empty, empty, np.empty(0, dtype=object), empty))
        return True

    def counters_snapshot(self) -> dict[str, dict]:
        return {}

    # -- the fabric (switches and links): one owner -----------------------------------
    # Every ingest replica forwards the switch sums of its flows, per short
    # window (see Monitor._fold_fabric), under FABRIC_KEY; the replica holding
    # that partition adds them up across ingest replicas and, once a window
    # passes a short window's end (so every input partition has been
    # forwarded past it), moves it into the diagnosis's windows: the fabric is
    # diagnosed over one daemon's sums, from one replica.

    def owns_fabric(self) -> bool:
        return self.fabric_part is not None and self.fabric_part in self.owned

    # -- the flow kinds of the fabric: every replica's typed pairs ------------------
    # The switch diagnosis judges each kind of flow (pair type) apart, looking each
    # NIC pair's type up in the types of the live pairs the windows analysed have
    # found. One daemon types every pair; here each replica types its own jobs'.
    # So every analyse replica sends, after each window, the typed pairs of the
    # jobs of each job-topic partition it holds (all of them: a pair typed in an
    # earlier window keeps its type while it is live), with the window's end, to
    # the fabric partition. The fabric's owner holds its window back until every
    # other partition's holder has sent those of a window ending there or later,
    # and judges the fabric with, for each partition, the types sent for that
    # window (or, failing it, the latest window before): one daemon's types at that
    # window, whatever the order the job topic was read in.

    def _kinds_wanted(self) -> list[int]:
        """The job-topic partitions whose typed pairs the fabric's owner takes from their holders (those it does not hold)."""
        if not self.owns_fabric() or self.job_parts is None:
            return []
        return [q for q in range(self.job_parts) if q not in self.owned]

    def _kinds_ready(self, end: int, final: bool) -> bool:
        """Whether every other partition's holder has sent its typed pairs of the window ending at ``end`` or later (for the
        final window: of a window reaching the ingest stage's tail, its own final window)."""
        at = self.complete_to() if final else end
        for q in self._kinds_wanted():
            if at is None or not any(e >= at for e, *_ in self.kinds_in.get(q, ())):
                return False
        return True

    def take_kinds(self, meta: dict, table: pa.Table) -> None:
        """A replica's typed pairs of the partitions it holds (``meta``: ``end``, ``final``, ``parts``; ``chunk`` of
        ``chunks`` messages), read on the fabric partition; taken once the window's last chunk is in."""
        end, final = int(meta["end"]), bool(meta.get("final"))
        key = (str(meta.get("replica", "")), end, final)
        chunks = self._kinds_chunks.setdefault(key, [])
        if int(meta.get("chunk", 0)) == 0:
            chunks.clear()  # the first of a window's messages (a replica that sends a window again starts it again)
        chunks.append(table.replace_schema_metadata(None))
        if len(chunks) < int(meta.get("chunks", 1)):
            return
        del self._kinds_chunks[key]
        table = pa.concat_tables(chunks)
        a, b = table.column("a").to_numpy().astype(np.int64), table.column("b").to_numpy().astype(np.int64)
        types = np.asarray(table.column("type").to_pylist(), dtype=object)
        part = table.column("part").to_numpy()
        for q in meta.get("parts", ()):
            if int(q) in self.owned:
                continue  # its jobs are this replica's: their pairs typed here
            m = part == int(q)
            self.kinds_in.setdefault(int(q), []).append((end, final, a[m], b[m], types[m]))
        self.kinds_rows += len(a)

    def _switch_kinds(self, end: int | None, final: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        own = super()._switch_kinds(end, final)
        wanted = set(self._kinds_wanted())
        if end is not None:
            keep = end - int(self.s.window_s * 1e9)  # a partition held here: its pairs kept a while, should it move away again
            for q in [q for q in self.kinds_in if q not in wanted]:
                self.kinds_in[q] = [g for g in self.kinds_in[q] if g[0] >= keep]
        if end is None or not wanted:
            return own
        to = self.complete_to()
        tables = [own] if own is not None else []
        for q, got in list(self.kinds_in.items()):
            i: int | None
            if final:  # the holder's window reaching the tail: its final one (the last read), else one ending there
                cand = [i for i, g in enumerate(got) if to is not None and g[0] >= to]
                pick = [k for k in cand if got[k][1]] or cand
                i = pick[-1] if pick else None
            else:
                exact = [i for i, g in enumerate(got) if g[0] == end]
                before = [i for i, g in enumerate(got) if g[0] < end]
                after = [i for i, g in enumerate(got) if g[0] > end]
                i = (exact[-1] if exact else max(before, key=lambda i: (got[i][0], i)) if before
                     else min(after, key=lambda i: (got[i][0], -i)) if after else None)
            if q not in wanted or i is None:
                continue
            tables.append(got[i][2:])
            self.kinds_in[q] = [g for g in got if g[0] >= got[i][0]]  # the older ones are superseded
        if not tables:
            return None
        return tuple(np.concatenate([t[k] for t in tables]) for k in range(3))  # type: ignore[return-value]

    def _queue_kinds(self, end: int, final: bool) -> None:
        """This replica's typed pairs after its window ending at ``end``, by the job-topic partition of their job, for the
        source to send."""
        if self.job_parts is None or not self.owned:
            return
        keys, types = self._kind_keys, self._kind_types
        a, b = keys // self._n, keys % self._n
        nic_part = np.full(self._n + 1, -1, dtype=np.int64)
        if len(self.jobs_):
            ids = self.jobs_["job_id"].astype(str).to_numpy()
            of = {j: job_partition(j, self.job_parts) for j in set(ids.tolist())}
            idx = self.topology.nic_index(self.jobs_["ip"].astype(str))
            ok = idx >= 0
            nic_part[idx[ok]] = np.array([of[j] for j in ids[ok].tolist()], dtype=np.int64)
        part = nic_part[a]
        owned = np.array(sorted(self.owned), dtype=np.int64)
        part = np.where(np.isin(part, owned), part, owned[0])  # a pair of no job held now: one of the partitions held
        self.kinds_out.append((int(end), bool(final), owned.tolist(), a, b, types, part))

    def take_kinds_out(self) -> list[tuple]:
        out, self.kinds_out = self.kinds_out, []
        return out

    def take_fabric(self, rows: pd.DataFrame) -> None:
        """An ingest replica's switch sums (:meth:`SwitchBandwidth.take_before`'s rows)."""
        self.fabric_in.add_rows(rows)
        self.fabric_rows += len(rows)

    def _drop_fabric(self) -> None:
        """The fabric partition went to another replica: its sums, the anomalies it reported, its metrics go with it."""
        hosts = self.switch_bw.hosts
        self.switch_bw = type(self.switch_bw)(self.s.switch_window_s, hosts=hosts)
        self.fabric_in = type(self.fabric_in)(self.fabric_in.window_ns / 1e9, hosts=hosts)
        self._switch_last, self._links_pending = {}, set()
        self._fabric_anomalies.clear()
        self.kinds_in.clear()
        self._recent.pop("", None)

    def fabric_state(self) -> dict:
        """What a successor needs not to report a switch or link anomaly twice, and to count on (JSON-able)."""
        return {"fabric": True, "switch_last": [[k[0], k[1], int(w)] for k, w in self._switch_last.items()],
                "links_pending": [list(k) for k in self._links_pending], "anomalies": dict(self._fabric_anomalies)}

    def _restore_fabric(self, state: dict) -> None:
        for kind, subject, w in state.get("switch_last", ()):
            key = (kind, subject)
            self._switch_last[key] = max(int(w), self._switch_last.get(key, int(w)))
        self._links_pending |= {tuple(k) for k in state.get("links_pending", ())}
        for kind, n in state.get("anomalies", {}).items():
            self._fabric_anomalies[kind] = max(int(n), self._fabric_anomalies[kind])

    # -- incomplete windows: the ingest stage's word ----------------------------------
    # The ingest stage knows which of its windows miss GPU flows of their time
    # (dropped as too old, or input more out of order than it waits for) and
    # sends each with the watermark of the window it was found at. A window
    # here is incomplete when a flag came with a watermark in its span from
    # the last window's end: the rule is a function of the windows, not of
    # when the flags were read (every copy of a flag precedes, on each
    # job-topic partition, the watermarks that let a window past it).

    def _admit(self, flows: pd.DataFrame, a: np.ndarray, b: np.ndarray, gpu: np.ndarray, partition: str) -> None:
        """Straight into the window: the ingest stage held the records to their window, dropped (and counted) what
        was too late; the windows here are the ingest stage's (:meth:`_advance`)."""
        start = flows["start_ns"].to_numpy()
        m = int(start.max())
        self.max_start = m if self.max_start is None else max(self.max_start, m)
        self._part_max[partition] = max(self._part_max.get(partition, m), m)
        self._take(flows[gpu], a[gpu], b[gpu], partition, np.zeros(int(gpu.sum()), dtype=bool))

    def _advance(self, final: bool, force: bool) -> tuple[int, int, int] | None:
        """The window up to the ingest stage's window end being cut (:meth:`tick`; the last flow for ``final``), with
        what is older than it forgotten; no lateness: the ingest stage waited for out-of-order records."""
        if self.max_start is None:
            return None
        end = self.max_start if final else self.watermark()
        if end is None:
            return None
        if self.analysed_to is not None and end <= self.analysed_to:
            if not force:
                return None
            end = self.analysed_to
        win_ns = int(self.s.window_s * 1e9)
        begin = end - win_ns
        if self.analysed_to is not None:
            begin = min(begin, self.analysed_to - win_ns // 2)
        return self._forget(begin, end, 0, final)

    def _note_late(self, dropped: np.ndarray, a: np.ndarray, b: np.ndarray, start: np.ndarray) -> None:
        """Nothing: the ingest stage counts late flows and flags their windows (a late flow it forwards is not late here)."""

    def _log_window(self, begin: int, end: int, lateness: int, final: bool) -> WindowSpan:
        prev = self.analysed_to
        due = sorted((k, f) for k, f in self.flags.items() if f["at"] <= end)
        for k, f in due:
            del self.flags[k]
            self._flags_done[k] = f["at"]
        horizon = end - int(self.s.pair_ttl_s * 1e9)
        for k in [k for k, at in self._flags_done.items() if at < horizon]:
            del self._flags_done[k]
        late, why = 0, []
        for (replica, _, e, after), f in due:
            if after and prev is not None and e <= prev:
                self._incomplete_after(e, f["late"], f"ingest replica {replica}: {f['why']}")
            else:
                late += f["late"]
                why.append(f"ingest replica {replica}: {f['why']}")
        incomplete = bool(why)
        if self.windows and self.windows[-1].end == end:  # the last window re-run (force)
            span = self.windows[-1]
            span.late += late
            incomplete = incomplete and not span.incomplete
            span.incomplete = span.incomplete or incomplete
        else:
            span = WindowSpan(begin, end, late, incomplete)
            self.windows.append(span)
            while len(self.windows) > 1 and self.windows[0].end < horizon:
                self.windows.popleft()
        if incomplete:
            self.windows_incomplete += 1
            span.why = "; ".join(why)
            log.warning("window incomplete (late input): no steps or anomalies reported from it; %s", span.why,
                        extra={"fields": {"from": iso_time(begin), "to": iso_time(end), "late_flows": late}})
        return span

    def _incomplete_after(self, at: int, late: int, why: str) -> None:
        """The window analysed here whose span from the previous window's end holds ``at`` missed late flows (the
        ingest stage's window ending at ``at`` had them after it): it turns incomplete, once."""
        ends = [w.end for w in self.windows]
        if not ends:
            return
        w = self.windows[min(int(np.searchsorted(ends, at, side="left")), len(ends) - 1)]
        w.late += late
        if not w.incomplete:
            w.incomplete, w.why = True, why
            self.windows_incomplete += 1
            log.warning("window analysed before GPU flows of its time came: its steps and anomalies were reported without them",
                        extra={"fields": {"from": iso_time(w.begin), "to": iso_time(w.end), "late_flows": w.late}})

    def job_states(self) -> dict[str, dict]:
        """What a successor needs of each job not to report a step or an anomaly twice, and to count on (JSON-able).

        The step stitcher's place, the step history (the cross-step
        baseline), the counts the metrics show and the anomalies reported.
        """
        out = {job_id: self._job_state(job_id, st) for job_id, st in list(self._jobs.items()) if st.view.job_id == job_id}
        if self.owns_fabric():
            out[FABRIC_KEY] = self.fabric_state()
        return out

    def _job_state(self, job_id: str, st: Any) -> dict:
        v = st.view
        return {
            "next_step": st.stitcher.next_step, "last_end": st.stitcher.last_end, "history": [[int(x) for x in h] for h in st.history],
            "steps": v.steps, "bucket_counts": [int(x) for x in v.bucket_counts], "step_sum_s": v.step_sum_s,
            "last_step_s": v.last_step_s, "slowdown": v.slowdown, "slow": v.slow, "anomalies": dict(v.anomalies),
            "reported": [[[_plain(x) for x in k], int(t)] for k, t in st.reported.items()],
            # lagging servers flagged by the last window: still lagging at the next is the same anomaly
            "ongoing": [[_plain(x) for x in k] for k, t in self._active.items() if k[1] == job_id and t == self._ticks - 1],
        }

    def _apply_state(self, st: Any, state: dict) -> None:
        """Make ``st`` the job as ``state`` (:meth:`_job_state`) left it: its steps, history and anomalies."""
        st.stitcher.next_step, st.stitcher.last_end = int(state["next_step"]), state["last_end"]
        st.history.clear()
        st.history.extend(tuple(h) for h in state["history"])
        v = st.view
        v.steps, v.bucket_counts, v.step_sum_s = int(state["steps"]), list(state["bucket_counts"]), float(state["step_sum_s"])
        v.last_step_s, v.slowdown, v.slow = state["last_step_s"], state["slowdown"], bool(state["slow"])
        v.anomalies.clear()
        v.anomalies.update(state["anomalies"])
        st.reported.clear()
        st.reported.update({tuple(k): t for k, t in state["reported"]})
        for k in state.get("ongoing", ()):
            self._active[tuple(k)] = self._ticks - 1  # as if flagged by the window before this one

    # -- a job re-keyed across replicas keeps its history ------------------------------------
    # One daemon gives a job that grew (a new id: more of its servers seen) the
    # state of the biggest job it absorbed (Monitor._merge_jobs). Here the old
    # ids may be other replicas' (their job-topic partitions): the ingest stage
    # tells the new id's owner which (``rekey``, after the window's watermark),
    # and each old id's owner, applying its ``retire``, hands the job's state
    # over on the new id's partition (``handover``). The new id's owner holds
    # its windows from the re-key's on (``at``) until every state is in, then
    # takes the biggest, as one daemon does; the pairs handed over join its own
    # at that window. The old owner applies the retire once it has analysed the
    # window before it, which needs nothing of the new owner's windows from the
    # re-key's on: no replica waits on one waiting on it (the windows before go
    # on, and with them the typed pairs the fabric's owner waits for). Both
    # messages may be read in either order. A successor of the old owner replays
    # the retire (it follows the last watermark its predecessor's replay
    # offset may stand after) and hands the state over again; a successor of
    # the new owner with the job's own published state waits for none.

    def expect_states(self, job_id: str, old: Collection[str], wait_s: float, at: int | None = None) -> None:
        """Hold the windows ending at ``at`` or later (None: every window) until the states of ``old`` (ids on partitions
        other replicas hold) are handed over for ``job_id``, at most ``wait_s`` of wall time (an old owner that lost its
        partition meanwhile: its successor hands them over). Not when the job is here already (with a history of its
        own, or published for a successor). Several ingest replicas may each name some of the old ids: all are waited
        for, from the first naming, each from its own re-key's window (one daemon's job, new at a window, absorbs the
        jobs gone by then; one named for a later window joins it once it is here: its state is not taken)."""
        st = self._jobs.get(job_id)
        if (st is not None and st.view.job_id == job_id) or job_id in self.restored:
            return
        ats = self.rekeyed_at.setdefault(job_id, {})
        for o in old:
            had = ats.get(o, at)
            ats[o] = None if at is None or had is None else min(at, had)
        waiting = set(old) - set(self.handed.get(job_id, ()))
        if not waiting:
            return
        since, before = self.clock(), self.awaiting.get(job_id)
        if before is not None:
            waiting |= before[0]
            since = min(since, before[1])
        self.awaiting[job_id] = (waiting, since, float(wait_s))

    def note_handed_state(self, job_id: str, old: str, state: dict | None) -> None:
        """The state ``old`` had when it was retired into ``job_id`` (None: its owner had none: no steps yet). A state
        handed over twice (a retire sent again, a successor's replay) keeps the one with most steps; None never
        replaces one."""
        if job_id not in self.handed:
            self._handed_since[job_id] = self.clock()
        had = self.handed.setdefault(job_id, {}).get(old)
        if had is None or (state is not None and int(state["steps"]) > int(had["steps"])):
            self.handed[job_id][old] = state
        waiting = self.awaiting.get(job_id)
        if waiting is not None:
            waiting[0].discard(old)
            if not waiting[0]:
                del self.awaiting[job_id]

    def pair_base(self) -> int:
        """The NIC count a pair key is ``a * n + b`` in (the topology's: the same on every replica)."""
        return int(self._n)

    def state_of(self, job_id: str) -> dict | None:
        """The state of ``job_id`` to hand over to the replica its new id is on: as analysed here, or else the one it
        would have taken (the one with most steps of those a predecessor published and other replicas handed over for
        it: re-keyed again before a window here), or None."""
        st = self._jobs.get(job_id)
        if st is not None and st.view.job_id == job_id:
            return self._job_state(job_id, st)
        states = [s for s in (self.restored.get(job_id), *self.handed.get(job_id, {}).values()) if s is not None]
        return max(states, key=lambda s: int(s["steps"])) if states else None

    def awaits_state_of(self, job_id: str) -> bool:
        """Whether a state handed over for ``job_id`` is still to come (within the wait's bound): its retire waits for
        it, so that the state handed on is the one ``job_id`` would have taken."""
        self._awaits_states(None)  # gives up the waits past their bound
        return job_id in self.awaiting

    def _awaits_states(self, end: int | None) -> bool:
        """Is a re-keyed job's state still to come for the window ending at ``end`` (None: the final window)? (One waited
        for longer than its bound is given up, with a warning; one whose partition moved away is its new holder's to
        wait for.) The windows before the re-key's are not held: the old owner's hand-over may need them analysed here
        (their typed pairs, if it owns the fabric)."""
        now = self.clock()
        for job_id, (old, since, wait_s) in list(self.awaiting.items()):
            if self.job_parts and self.owned and job_partition(job_id, self.job_parts) not in self.owned:
                del self.awaiting[job_id]
            elif now - since > wait_s:
                del self.awaiting[job_id]
                self.handovers_missed += 1
                log.warning("re-keyed job analysed without the state of its old ids: no replica handed it over in time; its steps "
                            "are numbered from 0 here", extra={"fields": {"job": job_id, "was": ",".join(sorted(old)), "waited_s": round(now - since, 1)}})
        return any(self._wanted_at(job_id, o, end) for job_id, (old, _, _) in self.awaiting.items() for o in old)

    def _wanted_at(self, job_id: str, old: str, end: int | None) -> bool:
        """Whether ``old``'s state is for ``job_id``'s window ending at ``end`` (None: the final window) or before."""
        at = self.rekeyed_at.get(job_id, {}).get(old)
        return end is None or at is None or at <= end

    def _add_handed_pairs(self, end: int | None) -> None:
        """Add the handed-over pairs meant for the window ending at ``end`` (None: all) to this replica's, before its job
        recognition: one daemon's pairs of that window, not of an earlier one, however early the hand-over was read."""
        keep: list[tuple[int | None, np.ndarray, np.ndarray, np.ndarray]] = []
        for at, keys, first, last in self._handed_pairs:
            if end is not None and at is not None and at > end:
                keep.append((at, keys, first, last))
                continue
            a, b = keys // self._n, keys % self._n
            self._see_pairs(np.r_[a, a], np.r_[b, b], np.r_[first, last])
        self._handed_pairs = keep

    def restore_job(self, job_id: str, state: dict) -> None:
        """A previous owner's state of ``job_id`` (:meth:`job_states`), taken when the job is next recognised here
        (the fabric's at once)."""
        if job_id == FABRIC_KEY:
            self._restore_fabric(state)
            return
        st = self._jobs.get(job_id)
        if st is None or not st.view.steps:
            self.restored[job_id] = state

    def _merge_jobs(self, jobs: pd.DataFrame, an: Any, end: int) -> None:
        before = {j for j, st in self._jobs.items() if st.view.job_id == j}
        super()._merge_jobs(jobs, an, end)
        self.gone |= before - set(self._jobs)
        self.gone -= set(self._jobs)  # back under the same id (a job restarted on its servers): a state of its own again
        for job_id in [j for j in self.restored if j in self._jobs]:
            state, st = self.restored.pop(job_id), self._jobs[job_id]
            if st.view.steps:
                continue  # it has a history of its own here
            self._apply_state(st, state)
        # a job re-keyed from other replicas' ids: the biggest of the jobs it absorbed, here or handed over (one daemon's);
        # states for a job whose partition moved away are its new holder's
        for job_id in [j for j in self.handed if self.job_parts and self.owned and job_partition(j, self.job_parts) not in self.owned]:
            del self.handed[job_id]
        # a job here waits for no more states (those named for later windows: one daemon's job, here, absorbs none)
        for job_id in [j for j in self.awaiting if j in self._jobs]:
            old = {o for o in self.awaiting.pop(job_id)[0] if self._wanted_at(job_id, o, end)}
            if old:  # a window forced through the wait
                self.handovers_missed += 1
                log.warning("re-keyed job analysed without the state of its old ids", extra={"fields": {"job": job_id, "was": ",".join(sorted(old))}})
        for job_id in [j for j in self.handed if j in self._jobs]:
            states = [s for o, s in self.handed.pop(job_id).items() if s is not None and self._wanted_at(job_id, o, end)]
            st = self._jobs[job_id]
            if job_id in before or not states:
                continue  # it was here already (the states came for a window it had analysed: a replay)
            best = max(states, key=lambda s: int(s["steps"]))
            if int(best["steps"]) > st.view.steps:
                self._apply_state(st, best)
                self.handovers_taken += 1
                log.info("re-keyed job took the state of its old id from another replica",
                         extra={"fields": {"job": job_id, "steps": int(best["steps"])}})
        for job_id in [j for j in self.rekeyed_at if j in self._jobs or j not in self.awaiting and j not in self.handed]:
            del self.rekeyed_at[job_id]

    def retire_job(self, job_id: str, ips: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Forget the pairs and flows of a job now keyed under another id (another replica may own it), and what was
        handed over for it (re-keyed again before a window here: see :meth:`state_of`); return the pairs forgotten
        (key, first seen, last seen, those handed over among them: see :meth:`take_handover`)."""
        self.forget_handed(job_id)
        idx = self.topology.nic_index(pd.Series(ips))
        gone = np.zeros(self._n, dtype=bool)
        gone[idx[idx >= 0]] = True
        none = np.empty(0, dtype=np.int64)
        if not gone.any():
            return none, none, none
        keep = ~(gone[self._pair_keys // self._n] | gone[self._pair_keys % self._n])
        out = [(self._pair_keys[~keep], self._pair_first[~keep], self._pair_last[~keep])]
        self._pair_keys, self._pair_last, self._pair_first = self._pair_keys[keep], self._pair_last[keep], self._pair_first[keep]
        handed = []
        for at, keys, first, last in self._handed_pairs:
            mine = gone[keys // self._n] | gone[keys % self._n]
            out.append((keys[mine], first[mine], last[mine]))
            if not mine.all():
                handed.append((at, keys[~mine], first[~mine], last[~mine]))
        self._handed_pairs = handed
        a, b = self.window.columns()[:2]
        self.window.keep(~(gone[a] | gone[b]))
        self.retired.append(job_id)
        keys, first, last = (np.concatenate(c) for c in zip(*out))
        return keys, first, last

    def prune_handovers(self, max_age_s: float) -> None:
        """Forget what was handed over and will not be used: for a job whose partition is no longer held (its new
        holder's), a hand-over whose messages are not all in ``max_age_s`` of wall time after its first (its sender
        failed part way; a successor sends it whole again), and states older than that whose job did not come by the
        windows they were for (analysed here since)."""
        now = self.clock()

        def moved(job_id: str) -> bool:
            return bool(self.job_parts and self.owned and job_partition(job_id, self.job_parts) not in self.owned)

        for key, (since, _) in list(self._handover_chunks.items()):
            if moved(key[0]) or now - since > max_age_s:
                del self._handover_chunks[key]
        to = self.analysed_to
        for job_id in list(self.handed):
            if moved(job_id) or (now - self._handed_since.get(job_id, now) > max_age_s and job_id not in self.awaiting and to is not None
                                 and all(at is None or at <= to for at in self.rekeyed_at.get(job_id, {}).values())):
                self.forget_handed(job_id)
        self._handed_since = {j: t for j, t in self._handed_since.items() if j in self.handed}

    def absorb(self, job_id: str, into: str) -> None:
        """``job_id`` retired into ``into``, both here: its job is absorbed at the next window (one daemon's rule), or, if
        it has none here yet (re-keyed again before a window here), ``into`` is handed what was handed over for it."""
        st = self._jobs.get(job_id)
        self.note_handed_state(into, job_id, None if st is not None and st.view.job_id == job_id else self.state_of(job_id))
        self.forget_handed(job_id)

    def forget_handed(self, job_id: str) -> None:
        """``job_id`` is gone here (retired, or absorbed here into another id): no state is waited for or kept for it."""
        self.awaiting.pop(job_id, None)
        self.handed.pop(job_id, None)
        self.rekeyed_at.pop(job_id, None)

    def take_handover(self, meta: dict, table: pa.Table) -> None:
        """One message of a retired job's hand-over (``handover``: its pairs, the job's state in the first): once every
        message is in, the pairs join this replica's at the re-key's window (one daemon's job recognition still sees the
        old servers' pairs until they expire) and the state waits for it (:meth:`note_handed_state`)."""
        key = (str(meta["job"]), str(meta["from"]), str(meta.get("replica", "")))
        chunks = self._handover_chunks.setdefault(key, (self.clock(), {}))[1]
        chunks[int(meta["chunk"])] = (meta, table)
        if len(chunks) < int(meta["chunks"]):
            return
        del self._handover_chunks[key]
        job_id, old = key[:2]
        dropped = chunks[0][0].get("state_bytes")
        if dropped is not None and old in self.awaiting.get(job_id, (set(),))[0]:
            self.handovers_missed += 1  # it will not come: the job is analysed without it at once
            log.warning("re-keyed job analysed without the state of its old id: too big to hand over; its steps are numbered from "
                        "0 here", extra={"fields": {"job": job_id, "was": old, "state_bytes": int(dropped)}})
        st = self._jobs.get(job_id)
        if (st is None or st.view.job_id != job_id) and int(meta.get("nics", self._n)) == self._n:
            pairs = pa.concat_tables([t for _, t in chunks.values()])
            keys, first, last = (pairs[c].to_numpy().astype(np.int64) for c in ("key", "first", "last"))
            at = meta.get("at")
            self._handed_pairs.append((None if at is None else int(at), keys, first, last))
            if at is None:
                self._add_handed_pairs(None)  # a re-key at a revocation: its window is not known
        self.note_handed_state(job_id, old, chunks[0][0].get("state"))


def _late_for(headers: dict) -> int | None:
    """The end of the ingest window a forwarded flow message's flows came late for (``prism-late-for``), or None."""
    value = headers.get(LATE_HEADER)
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _plain(x: Any) -> Any:
    """A numpy scalar as the Python one (for JSON)."""
    return x.item() if hasattr(x, "item") else x


class ForwardingSource(KafkaSource):
    """The ingest stage's source: a :class:`KafkaSource` that, on publishing a window, first forwards it to the job topic."""

    def __init__(self, bootstrap_servers: str, *args: Any, job_topic: str, job_partitions: int, **kwargs: Any) -> None:
        super().__init__(bootstrap_servers, *args, **kwargs)
        self.job_topic = job_topic
        ensure_topic(bootstrap_servers, job_topic, job_partitions, security=kwargs.get("security"))
        self._job_parts: list[int] | None = None
        self._inputs: int | None = None
        # per input partition, the poll batches not all forwarded yet: (first offset, the counts before it, latest start,
        # the partition's stream time after it)
        self._unsent: dict[Any, deque] = {}
        self._revoking: set = set()  # the partitions being revoked (see _resume_point)

    #: flows per job-topic message: about 600 kB of Arrow, under the producer's 1 MiB request size
    MESSAGE_FLOWS = 10_000

    def _job_partitions(self) -> list[int]:
        """The job topic's partitions (waits for its metadata, at most 30 s)."""
        if self._job_parts is None:
            deadline = time.monotonic() + 30
            parts = None
            while not parts and time.monotonic() < deadline:
                parts = self.producer.partitions_for(self.job_topic)
            self._job_parts = sorted(parts or [])
        return self._job_parts

    def _input_count(self) -> int | None:
        if self._inputs is None:
            parts = self.consumer.partitions_for_topic(self.topic)
            self._inputs = len(parts) if parts else None
        return self._inputs

    #: switch-sum rows per message (about 60 bytes a row)
    FABRIC_ROWS = 10_000

    # -- a successor resumes where everything before was forwarded ------------------
    # The published (and committed) offset of a partition is not where reading
    # stands but the first offset of the oldest poll batch whose flows have not
    # all been forwarded (some are still held for a later window, or start past
    # the last window's end: the lateness wait, the step in progress), with the
    # counts as they were before it: a replica that takes the partition over
    # (this one died, a rebalance) reads those records again and counts them
    # once, and the analyse stage gets every flow (those sent already are
    # dropped there as re-deliveries).

    #: poll batches kept per partition at most (a record far in the future would hold the resume point back)
    MAX_UNSENT = 10_000

    def _before_batch(self, monitor: Monitor, tp: Any, frames: list, first_offset: int) -> None:
        starts = [int(f["start_ns"].max()) for f in frames if len(f)]
        if not starts:
            return
        q = self._unsent.setdefault(tp, deque(maxlen=self.MAX_UNSENT))
        reach = max(starts + [monitor.stream_time(self.partition_name(tp)) or max(starts)])  # its records' stream times are below
        q.append((first_offset, monitor.counters_snapshot().get(self.partition_name(tp), {}), max(starts), reach))

    def _resume_point(self, tp: Any, offset: int, counters: dict) -> tuple[int, dict]:
        m = self.monitor
        q = self._unsent.get(tp)
        if not q or not isinstance(m, IngestMonitor):
            return offset, counters
        released = m.released_to
        # a batch is forwarded once every record of it left the hold (Monitor._release) and started by the last window's
        # end; on revocation (all taken in is sent, whatever its start) once every record left the hold
        revoking = tp in self._revoking
        while q and released is not None and q[0][3] < released and (revoking or (m.forwarded_to is not None and q[0][2] <= m.forwarded_to)):
            q.popleft()
        return (q[0][0], q[0][1]) if q else (offset, counters)

    def _settle_assigned(self, batch: dict) -> None:
        gone = [tp for tp in self._revoked if tp not in self.consumer.assignment()]
        super()._settle_assigned(batch)
        owned = self.consumer.assignment()
        for tp in [tp for tp in self._unsent if tp not in owned]:
            del self._unsent[tp]  # its new owner resumes it
        if isinstance(self.monitor, IngestMonitor):
            for tp in gone:
                self.monitor.drop_held(self.partition_name(tp))  # its new owner reads them again from the resume point
            # read again from a published resume point (taken over, or ours from a previous life). One kept where
            # reading stood, one no replica has forwarded from (a new group's), or one whose log the broker lost reads
            # on as one daemon does: its records are judged late alike
            self.monitor.resuming |= {self.partition_name(tp) for tp in self._moved if tp in self.positions}

    def publish(self, only: Collection[Any] | None = None) -> None:
        m = self.monitor
        if isinstance(m, IngestMonitor):
            if only is not None:
                # revoked: what was taken in past the last window goes now, before the partition's state
                # (its next owner resumes after it); the switch sums too (they add up at the fabric's owner)
                m.label(None, keep=True)  # sent again, labelled by the next window: a label now may be a piece's id
                self._send(m, None, fabric=m.take_fabric(all_=True))
                # all taken in is sent: its next owner resumes at the oldest batch still held (see _resume_point)
                self._revoking = set(only)
                try:
                    super().publish(only)
                finally:
                    self._revoking = set()
                return
            elif m.forwarded_to is not None:
                self._send(m, m.forwarded_to, fabric=m.take_fabric())
        super().publish(only)

    def _send(self, m: IngestMonitor, end: int | None, fabric: pd.DataFrame | None = None) -> None:
        parts = self._job_partitions()
        if fabric is not None and len(fabric):
            p = parts[job_partition(FABRIC_KEY, len(parts))]
            for lo in range(0, len(fabric), self.FABRIC_ROWS):
                table = pa.Table.from_pandas(fabric.iloc[lo:lo + self.FABRIC_ROWS], preserve_index=False)
                self.producer.send(self.job_topic, key=FABRIC_KEY.encode(), value=arrow_ipc(table), partition=p,
                                   headers=[(CONTROL_HEADER, b"fabric")])
        flows, retire = m.take_forward()
        # the new id's owner learns which old ids' states to wait for from this window on (see
        # AnalyseMonitor.expect_states: in whichever order the partitions are read); a retired id's owner hands the
        # job's state over and forgets its flows; the new id's owner gets them
        # (when both ids are on one partition, nothing is retired: the flows sent again are re-deliveries there)
        moved: dict[str, list[str]] = {}
        for old, new in retire.items():
            if job_partition(old, len(parts)) != job_partition(new, len(parts)):
                moved.setdefault(new, []).append(old)
        for new, olds in sorted(moved.items()):
            self.producer.send(self.job_topic, key=new.encode(), partition=parts[job_partition(new, len(parts))],
                               value=json.dumps({"job": new, "from": sorted(olds), "replica": self.replica_id, "at": end}).encode(),
                               headers=[(CONTROL_HEADER, b"rekey")])
        for new, olds in moved.items():
            ips = [ip for ip, j in zip(m.jobs_["ip"], m.jobs_["job_id"]) if j == new]
            for old in olds:
                self.producer.send(self.job_topic, key=old.encode(), partition=parts[job_partition(old, len(parts))],
                                   value=json.dumps({"job": old, "into": new, "ips": ips, "replica": self.replica_id, "at": end}).encode(),
                                   headers=[(CONTROL_HEADER, b"retire")])
        late, resumed = m.take_late(), m.take_resumed()
        mine = (REPLICA_HEADER, self.replica_id.encode())
        sends = [*((j, c, [mine]) for j, c in flows.items()), *((j, c, [mine, (LATE_HEADER, str(int(w)).encode())]) for (j, w), c in late.items()),
                 *((j, c, []) for j, c in resumed.items())]
        for job_id, cols, more in sends:
            headers = [("content-type", _ARROW), *more]
            for lo in range(0, len(cols[0]), self.MESSAGE_FLOWS):  # per message, not per flow
                chunk = tuple(c[lo:lo + self.MESSAGE_FLOWS] for c in cols)
                self.producer.send(self.job_topic, key=job_id.encode(), value=m.encode(chunk), partition=parts[job_partition(job_id, len(parts))],
                                   headers=headers)
        m.flows_forwarded += sum(len(c[0]) for d in (flows, late, resumed) for c in d.values())
        inputs = self._input_count()
        if end is not None and inputs is not None:
            owned = sorted(tp.partition for tp in self.consumer.assignment() if tp not in self._revoked)
            value = json.dumps({"inputs": inputs, "partitions": {str(p): end for p in owned}, "final": m.final, "end": end,
                                "replica": self.replica_id, "incomplete": m.take_flags()}).encode()
            for p in parts:
                self.producer.send(self.job_topic, key=b"", value=value, partition=p, headers=[(CONTROL_HEADER, b"watermark")])
        self.producer.flush(timeout=30)


class JobTopicSource(KafkaSource):
    """The analyse stage's source: the job topic's flows, watermarks and retire messages applied to the monitor (what
    follows a window not yet analysed here held back)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._replay: dict = {}  # partition -> [(event time complete to, offset after its watermark)]
        self._to_commit: dict = {}
        self._replay_from: dict = {}  # partition -> the replay offset last published (a successor reads from there)
        self._last_msg: dict[str, tuple[Any, int]] = {}  # job id (message key) -> (partition, offset) of its last message read
        self._kinds_at: deque = deque(maxlen=100_000)  # (window end, partition, offset) of the typed-pair messages read
        self._held: list[tuple] = []  # (partition, item, after) read but waiting for a window (see _ingest)
        self._after: dict[tuple[Any, str], int] = {}  # (partition, ingest replica) -> the end of its last watermark read there
        self.held_back = 0  # runs of flows and retire messages that waited for a window
        self.handovers_sent = 0  # retired jobs' states sent to their new id's owner
        self.handovers_failed = 0  # retired jobs' states that did not go: too big for a request, or the send failed
        super().__init__(*args, **kwargs)
        # how long a re-keyed job's new owner waits for an old id's state: a live old owner sends it within a window's
        # analysis (``max_poll_interval_ms``) or leaves the group, and its successor replays the retire and sends it
        self.handover_wait_s = max(60.0, 3 * self.consumer.config["max_poll_interval_ms"] / 1000)

    def _decode(self, batch: dict) -> list:
        """As :meth:`KafkaSource._decode`, with frames and control messages (``(kind, value)``) in offset order."""
        out = []
        for tp, recs in batch.items():
            if not recs:
                continue
            items: list = []
            run: list = []
            run_from: tuple = (None, None)  # the run's (late for, ingest replica)
            rejects = RejectCounter()
            for r in recs:
                if r.key:
                    self._last_msg[r.key.decode("utf-8", "replace")] = (tp, r.offset)
                headers = dict(r.headers or ())
                kind = headers.get(CONTROL_HEADER)
                if kind is None:
                    sender = headers.get(REPLICA_HEADER)
                    came = (_late_for(headers), None if sender is None else bytes(sender).decode("utf-8", "replace"))
                    if run and came != run_from:
                        items.extend(self._frames(tp, run, rejects, *run_from))
                        run = []
                    run.append(r)
                    run_from = came
                    continue
                items.extend(self._frames(tp, run, rejects, *run_from))
                run = []
                try:
                    if kind == b"fabric":
                        items.append(("fabric", pa.ipc.open_stream(r.value).read_all().to_pandas(), r.offset))
                    elif kind in (b"kinds", b"handover"):
                        table = pa.ipc.open_stream(r.value).read_all()
                        meta = KINDS_META if kind == b"kinds" else HANDOVER_META
                        items.append((kind.decode(), (json.loads((table.schema.metadata or {})[meta]), table), r.offset))
                    else:
                        items.append((kind.decode(), json.loads(r.value), r.offset))
                except (ValueError, KeyError, pa.ArrowException):
                    log.warning("job topic: unreadable control message at %s[%s]@%s", tp.topic, tp.partition, r.offset)
            items.extend(self._frames(tp, run, rejects, *run_from))
            out.append((tp, items, rejects.counts, recs[0].offset, recs[-1].offset + 1, len(recs)))
        return out

    def _frames(self, tp: Any, run: list, rejects: RejectCounter, late_for: int | None, sender: str | None) -> list:
        """A run of flow messages of one ingest replica (None: not named), late for one of its windows or none:
        ``("flows", (frame, late_for, sender), first offset)`` items."""
        if not run:
            return []
        msgs = ((r.value, r.headers, f"{tp.topic}[{tp.partition}]@{r.offset}") for r in run)
        frames = decode_messages(msgs, rejects, f"{tp.topic}[{tp.partition}]@{run[0].offset}-{run[-1].offset}", self.max_message_bytes)
        return [("flows", (f, late_for, sender), run[0].offset) for f in frames]

    # -- each window sees what one daemon's saw ---------------------------------------
    # The job topic holds, per partition, each ingest window's flows and then its
    # watermark; after it come the next window's: its flows, flows that came late
    # for the window (sent apart, naming the window: LATE_HEADER), a job's whole
    # window sent again under a new id, the old id's retire message. Read in one
    # poll with the watermark, they would join an analysis one daemon ran without
    # them (a retire would wipe the job's flows before it), and whether they did
    # would depend on how much a poll returned. So what an ingest replica sent
    # after its watermark for a window waits (in :attr:`_held`, in the order read)
    # until the windows here up to that one are analysed; the watermark read last
    # on the partition from that replica (REPLICA_HEADER, and the retire's
    # "replica") names the window. Other control messages are applied at once
    # (the watermarks decide when a window is due; typed pairs and switch sums
    # name their windows). Nothing more is fetched while items wait and a window
    # is due (decoded ahead instead, within the read-ahead bound): the loop
    # analyses it first.

    def _ingest(self, monitor: Monitor, decoded: list) -> int:
        n = 0
        if isinstance(monitor, AnalyseMonitor):
            self._note_assignment(monitor)  # a retire or rekey read here asks which partitions are held
            self._release(monitor)
        for tp, items, rejects, _, next_offset, messages in decoded:
            part = self.partition_name(tp)
            for item in items:
                after = self._follows(tp, item)
                if isinstance(monitor, AnalyseMonitor) and self._holds(monitor, item, after):
                    self._held.append((tp, item, after))
                    self.held_back += 1
                else:
                    self._apply(monitor, tp, part, item)
            monitor.reject(rejects, part)
            self.positions[tp] = next_offset
            n += messages
        monitor.backlogged = self._backlog({})
        if isinstance(monitor, AnalyseMonitor):
            self._note_assignment(monitor)
        return n

    def _note_assignment(self, monitor: AnalyseMonitor) -> None:
        monitor.owned = {tp.partition for tp in self.consumer.assignment()}
        parts = self.consumer.partitions_for_topic(self.topic)
        if parts:
            monitor.fabric_part = job_partition(FABRIC_KEY, len(parts))
            monitor.job_parts = len(parts)
        monitor.prune_handovers(self.handover_wait_s)  # those of partitions revoked, or past the wait's bound

    @staticmethod
    def _records(decoded: list) -> int:
        return sum(len(value[0]) for d in decoded for kind, value, _ in d[1] if kind == "flows")

    def _follows(self, tp: Any, item: tuple) -> int | None:
        """The end of the ingest window ``item`` was sent after (a watermark: noted, None), as read on ``tp``: the one
        its late flows name, else its sender's last watermark read there; None if unknown (not named, or no watermark
        of its sender read since the partition was assigned)."""
        kind, value, _ = item
        if kind == "watermark":
            if value.get("end") is not None:
                self._after[(tp, str(value.get("replica", "")))] = int(value["end"])
            return None
        if kind == "flows":
            late_for, sender = value[1], value[2]
            return late_for if late_for is not None or sender is None else self._after.get((tp, sender))
        if kind in ("retire", "rekey") and value.get("replica") is not None:
            return self._after.get((tp, str(value["replica"])))
        return None

    def _apply(self, monitor: Monitor, tp: Any, part: str, item: tuple) -> None:
        kind, value, offset = item
        if kind == "flows":
            monitor.ingest(value[0], part)
        elif not isinstance(monitor, AnalyseMonitor):
            return
        elif kind == "watermark":
            monitor.mark(value, tp.partition)
            self._note_replay(monitor, tp, offset + 1)
        elif kind == "retire":
            into, job = value.get("into"), str(value["job"])
            if into is not None and monitor.job_parts and job_partition(str(into), monitor.job_parts) in monitor.owned:
                monitor.absorb(job, str(into))  # absorbed here, as one daemon does: nothing to wait for
                return  # the new id's flows come here too: the job's pairs and flows stay (those sent twice are dropped)
            state = monitor.state_of(job)
            pairs = monitor.retire_job(job, list(value.get("ips", ())))
            if into is not None:
                self._hand_over(monitor, job, str(into), state, pairs, value.get("at"))
        elif kind == "rekey":
            parts = monitor.job_parts
            old = [str(o) for o in value.get("from", ()) if not (parts and job_partition(str(o), parts) in monitor.owned)]
            if old:
                at = value.get("at")
                monitor.expect_states(str(value["job"]), old, self.handover_wait_s, None if at is None else int(at))
        elif kind == "handover":
            monitor.take_handover(*value)
        elif kind == "fabric":
            monitor.take_fabric(value)
        elif kind == "kinds":
            monitor.take_kinds(*value)
            self._kinds_at.append((int(value[0]["end"]), tp, offset))

    def _hand_over(self, monitor: AnalyseMonitor, job: str, into: str, state: dict | None, pairs: tuple[np.ndarray, ...],
                   at: int | None = None) -> None:
        """Send ``job``'s state (or None) and its pairs (key, first, last) to the owner of ``into``'s partition (see
        AnalyseMonitor.expect_states): they go out with the next publish, before the offsets past the retire are
        committed."""
        from kafka.errors import KafkaError

        parts = sorted(self.consumer.partitions_for_topic(self.topic) or ())
        if not parts:
            return
        fields = {"job": into, "was": job}
        n, per = len(pairs[0]), self.HANDOVER_PAIRS
        cuts = [(lo, min(lo + per, n)) for lo in range(0, n, per)] or [(0, 0)]
        limit = int(getattr(self.producer, "config", {}).get("max_request_size", 1 << 20)) - self.RECORD_OVERHEAD

        def messages(cuts: list[tuple[int, int]], head: dict) -> list[bytes]:
            out = []
            for k, (lo, hi) in enumerate(cuts):
                meta = {"job": into, "from": job, "replica": self.replica_id, "chunk": k, "chunks": len(cuts), "nics": monitor.pair_base(),
                        "at": at, **(head if k == 0 else {})}
                table = pa.table({c: pa.array(x[lo:hi], pa.int64()) for c, x in zip(("key", "first", "last"), pairs)})
                out.append(arrow_ipc(table.replace_schema_metadata({HANDOVER_META: json.dumps(meta)})))
            return out

        values = messages(cuts, {"state": state})
        if len(values[0]) > limit and cuts[0] != (0, 0):
            values = messages([(0, 0), *cuts], {"state": state})  # a big state alone in the first message
        if len(values[0]) > limit:
            # past the producer's request size: the pairs go, and the new owner is told the state does not (it waits no
            # longer, and counts it missed)
            self.handovers_failed += 1
            log.warning("re-keyed job's state too big to hand over: its new owner numbers its steps from 0",
                        extra={"fields": {**fields, "state_bytes": len(values[0]), "max_request_size": limit + self.RECORD_OVERHEAD}})
            values, state = messages(cuts, {"state": None, "state_bytes": len(values[0])}), None
        failed: list[BaseException] = []

        def refused(e: BaseException) -> None:  # on the producer's thread; once per hand-over
            if not failed:
                failed.append(e)
                self.handovers_failed += 1
                log.warning("re-keyed job's hand-over not sent: %s", e, extra={"fields": fields})

        try:
            for value in values:
                future = self.producer.send(self.topic, key=into.encode(), partition=parts[job_partition(into, len(parts))], value=value,
                                            headers=[(CONTROL_HEADER, b"handover")])
                if future is not None:
                    future.add_errback(refused)
        except KafkaError as e:  # the new owner waits for it in vain, within its bound
            refused(e)
            return
        if state is not None:
            self.handovers_sent += 1
        log.info("re-keyed job's state handed over", extra={"fields": {**fields, "steps": state["steps"] if state else 0}})

    @staticmethod
    def _holds(monitor: AnalyseMonitor, item: tuple, after: int | None) -> bool:
        if item[0] == "retire" and monitor.awaits_state_of(str(item[1]["job"])):
            return True  # re-keyed again before its state came: it hands that on (see AnalyseMonitor.state_of)
        return item[0] in ("flows", "retire", "rekey") and monitor.holds_back(after)

    def _release(self, monitor: AnalyseMonitor) -> None:
        """Apply the held items whose windows may now be read (in the order read). Those of a partition revoked, or
        not assigned while the group rebalances, stay until the assignment settles (then its new owner's, or ours)."""
        if not self._held:
            return
        owned = self.consumer.assignment()
        held, self._held = self._held, []
        for tp, item, after in held:
            if tp not in owned or tp in self._revoked or self._holds(monitor, item, after):
                self._held.append((tp, item, after))
            else:
                self._apply(monitor, tp, self.partition_name(tp), item)

    def poll(self, monitor: Monitor, timeout_ms: int = 500) -> int:
        """As :meth:`KafkaSource.poll`; while items wait for a window that is due, only they are taken (what is fetched
        meanwhile is decoded ahead, as during an analysis, up to the same bound), and the loop analyses the window."""
        if isinstance(monitor, AnalyseMonitor) and self._held and not self._rebalanced:
            self.monitor = monitor
            self._release(monitor)
            if self._held and monitor.due():
                self.keep_alive(timeout_ms=0)
                return 0
        return super().poll(monitor, timeout_ms)

    def _topic_recreated(self) -> bool:
        recreated = super()._topic_recreated()
        if recreated:
            self._held.clear()  # read again from the start
            self._after.clear()
        return recreated

    def _settle_assigned(self, batch: dict) -> None:
        super()._settle_assigned(batch)
        owned = self.consumer.assignment()
        self._held = [h for h in self._held if h[0] in owned]  # a revoked partition's are its new owner's
        # the watermarks read before a partition moved (to a replay offset) say nothing of what comes next
        self._after = {k: v for k, v in self._after.items() if k[0] in owned and k[0] not in self._moved}
        m = self.monitor
        parts = self.consumer.partitions_for_topic(self.topic) or set()
        if not isinstance(m, AnalyseMonitor) or not parts:
            return
        mine = {tp.partition for tp in owned}
        prefix = f"jobstate/{self.group_id}/"
        for key, state in list(self.summaries.items()):
            if key.startswith(prefix) and job_partition(key[len(prefix):], len(parts)) in mine:
                m.restore_job(key[len(prefix):], state)

    # -- a successor resumes exactly ----------------------------------------------
    # Offsets are committed (and published) not where reading stands but where a
    # successor must replay from to rebuild the window: just after a watermark at
    # least a window older than the analysis. The jobs' states (stitcher, step
    # history, counts, anomalies reported) go to the summaries topic with them, so
    # the successor reports no step twice and misses none.

    def _note_replay(self, monitor: AnalyseMonitor, tp: Any, offset: int) -> None:
        """After a watermark at ``offset - 1``: a successor replaying from ``offset`` has every flow after what it completed."""
        marks = monitor.marks.get(tp.partition, {})
        if monitor.inputs is None or any(p not in marks for p in range(monitor.inputs)):
            return
        low = min(marks[p][0] for p in range(monitor.inputs))
        q = self._replay.setdefault(tp, [])
        q.append((low, offset))
        if len(q) > 4096:
            del q[: len(q) - 4096]

    def replay_offsets(self) -> dict:
        """Per partition held: the offset a successor replays from (just after the last watermark a whole window
        before the analysis); partitions with none yet are left out (a successor reads them from the start)."""
        m = self.monitor
        if not isinstance(m, AnalyseMonitor) or m.analysed_to is None:
            return {}
        horizon = m.analysed_to - int(m.s.window_s * 1e9)
        # the typed pairs of the windows past the horizon (a successor owning the fabric judges those windows again
        # with them): not replayed past
        self._kinds_at = deque((x for x in self._kinds_at if x[0] > horizon), maxlen=self._kinds_at.maxlen)
        cap: dict = {}
        for _, tp, off in self._kinds_at:
            cap[tp] = min(off, cap.get(tp, off))
        out = {}
        for tp, q in self._replay.items():
            safe = [off for low, off in q if low <= horizon and off <= cap.get(tp, off)]
            if safe:
                out[tp] = safe[-1]
                self._replay[tp] = [(low, off) for low, off in q if off >= safe[-1]]
        return out

    def publish(self, only: Collection[Any] | None = None) -> None:
        """Partition state (the replay offset) and the jobs' states of the partitions held (or ``only`` those)."""
        m = self.monitor
        if not isinstance(m, AnalyseMonitor):
            return
        self._send_kinds(m)
        offsets = self.replay_offsets()
        self._replay_from.update(offsets)
        now = time.time()
        for tp, off in offsets.items():
            if (only is not None and tp not in only) or (only is None and tp in self._revoked):
                continue
            value = {"offset": off, "counters": {}, "replica": self.replica_id, "time": now, "topic_id": self._topic_id}
            self.producer.send(self.summary_topic, key=self._state_key(tp).encode(), value=json.dumps(value).encode())
        parts = self.consumer.partitions_for_topic(self.topic) or set()
        mine = {tp.partition for tp in (only if only is not None else self.consumer.assignment())}
        states = m.job_states()
        if only is None:
            self._tombstone(m, set(states), mine)
        for job_id, state in states.items():
            if parts and job_partition(job_id, len(parts)) in mine:
                self.producer.send(self.summary_topic, key=self._job_key(job_id).encode(), value=json.dumps(state).encode())
        self.producer.flush(timeout=30)
        self._to_commit = offsets

    def _send_kinds(self, m: AnalyseMonitor) -> None:
        """The typed pairs of the windows analysed since the last call, to the fabric partition (its holder judges the
        fabric with every partition's)."""
        out = m.take_kinds_out()
        if not out or m.fabric_part is None:
            return
        for end, final, parts, a, b, types, part in out:
            chunks = max(1, -(-len(a) // self.KINDS_ROWS))
            for k in range(chunks):
                lo, hi = k * self.KINDS_ROWS, (k + 1) * self.KINDS_ROWS
                meta = {"end": end, "final": final, "parts": parts, "replica": self.replica_id, "chunk": k, "chunks": chunks}
                table = pa.table({"a": pa.array(a[lo:hi], pa.int32()), "b": pa.array(b[lo:hi], pa.int32()),
                                  "type": pa.array([str(x) for x in types[lo:hi]], pa.string()).dictionary_encode(),
                                  "part": pa.array(part[lo:hi], pa.int32())}).replace_schema_metadata({KINDS_META: json.dumps(meta)})
                self.producer.send(self.topic, key=FABRIC_KEY.encode(), value=arrow_ipc(table), partition=m.fabric_part,
                                   headers=[(CONTROL_HEADER, b"kinds")])

    #: typed pairs per message (about 13 bytes a pair: under the producer's 1 MiB request size)
    KINDS_ROWS = 50_000
    #: a retired job's pairs per hand-over message (24 bytes a pair; the job's state, in the first, is what the
    #: summaries topic already carries in one message)
    HANDOVER_PAIRS = 20_000
    #: bytes of a record's request besides its value (key, headers, batch framing), kept below the request size
    RECORD_OVERHEAD = 1024

    def _tombstone(self, m: AnalyseMonitor, alive: set[str], mine: set[int]) -> None:
        """Delete the states of retired jobs (a tombstone: the compacted topic forgets them, a successor takes none).

        Not before a successor's replay starts past the job's last message
        on the job topic (its last flows, or its retire): a successor that
        replayed them without the state would report the job's steps again.
        A job of a partition no longer held is its new owner's to delete.
        """
        for job_id in sorted(m.gone - alive):
            tp, off = self._last_msg.get(job_id, (None, -1))
            if tp is not None and tp.partition not in mine:
                m.gone.discard(job_id)
                continue
            if tp is not None and self._replay_from.get(tp, -1) <= off:
                continue  # a successor would still replay it
            self.producer.send(self.summary_topic, key=self._job_key(job_id).encode(), value=None)
            m.gone.discard(job_id)
            self._last_msg.pop(job_id, None)
            m.tombstones += 1
        for job_id in [j for j, (tp, off) in self._last_msg.items()
                       if j not in m.gone and j not in alive and self._replay_from.get(tp, -1) > off]:
            del self._last_msg[job_id]  # a key never recognised as a job here (re-keyed away at once), now past replay

    def commit(self, only: Collection[Any] | None = None) -> None:
        """Commit the replay offsets the last :meth:`publish` wrote (not where reading stands)."""
        self._commit_offsets(self._to_commit, only)

    def _job_key(self, job_id: str) -> str:
        return f"jobstate/{self.group_id}/{job_id}"

    def read_summaries(self, catch_up: bool = False) -> None:
        """As :meth:`KafkaSource.read_summaries`; a job state deleted meanwhile (its job retired) is not taken."""
        super().read_summaries(catch_up)
        m = self.monitor
        if isinstance(m, AnalyseMonitor) and m.restored:
            for job_id in [j for j in m.restored if self._job_key(j) not in self.summaries]:
                del m.restored[job_id]

