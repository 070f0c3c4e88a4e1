"""Where the daemon's flow records come from: a Kafka topic or a directory.

Both sources decode into the :class:`~prism.serve.monitor.Monitor` themselves
(``poll``), and after each published window the daemon calls ``publish``
then ``commit``: offsets are committed only once the results that include
them are out (at least once).

Kafka
-----
A consumer group over ``topic`` (kafka-python). Besides offsets, each
replica writes two kinds of keyed records to a compacted *summaries* topic
(Kafka is the only coordinator):

``partition/<group>/<topic>/<p>``
    the partition's next offset and its record counters. A replica that
    takes the partition over (rebalance, restart) resumes from that offset
    with those counts, so nothing is lost and nothing counted twice even if
    the process died between publishing and committing.
``components/<group>/<replica>``
    the replica's GPU clusters (IP lists). Every replica reads every other
    replica's, so job recognition sees the whole cluster although each
    replica holds only its partitions' GPU pairs.

Directory
---------
``--source DIR`` reads flow dumps (any format :mod:`prism.ingest.formats` knows)
that appear in DIR, in modification-time order, each once it has stopped
growing (write to a temporary name and rename into place to be safe).

Another source
--------------
:class:`Source` is the extension point: what the daemon loop
(:class:`prism.serve.daemon.Daemon`) calls on a source, and nothing else.
A new source is one class implementing it (see ``docs/design.md``,
"Extension points").
"""
from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from prism.ingest.messages import DEFAULT_MAX_MESSAGE_BYTES, decode_messages
from prism.ingest.readers import FlowReader, detect_format
from prism.ingest.records import FlowFormatError, RejectCounter
from prism.serve.metrics import printable
from prism.serve.monitor import Monitor

if TYPE_CHECKING:
    from kafka import TopicPartition

    from prism.serve.kafkaconf import KafkaSecurity

__all__ = ["Source", "KafkaSource", "DirectorySource", "ensure_topic"]

log = logging.getLogger("prism.sources")


@runtime_checkable
class Source(Protocol):
    """Where the daemon's flow records come from: the extension point for a new one.

    The daemon loop (:class:`prism.serve.daemon.Daemon`) calls exactly these
    members, from one thread: :meth:`poll` over and over, :meth:`lag` after
    each poll, and after each published window :meth:`publish` then
    :meth:`commit`; ``prism daemon`` calls :meth:`close` on the way out,
    and the health endpoint reports :attr:`ready`. A source decodes into the
    monitor itself, so records reach the windows the same way whatever
    their origin (a file format, a message codec).

    The loop also looks these up, where a source has them (they are not
    part of the protocol: a source without them is taken as without the
    behaviour):

    ``keep_alive(timeout_ms)``
        called repeatedly while a window is analysed on another thread
        (Kafka: stay in the consumer group; decode ahead without touching
        the monitor);
    ``components_changed`` (bool)
        set when another replica's job membership changed: the loop re-runs
        the last window and clears it;
    ``bad_files`` (sequence of (file, error)), ``resets`` (int)
        reported on the health endpoint and as metrics;
    ``caught_up()`` (bool)
        whether the source has read all the input there is now, as far as it
        knows: the loop counts quiet input towards the idle flush (the tail
        analysed as final) only while it says so. A source without it is
        taken as caught up whenever a poll reads nothing.

    Like prometheus client_python's ``Collector``, this is a
    :class:`typing.Protocol`: a class with these members is a source
    whether or not it names this class; the built-in ones subclass it to
    say so (and so that mypy checks them).
    """

    #: records can be read (Kafka: partitions assigned; a directory: it can be listed)
    ready: bool

    def poll(self, monitor: Monitor, timeout_ms: int = 500) -> int:
        """Ingest what has arrived into ``monitor`` (``monitor.ingest``, ``monitor.reject``), waiting up to
        ``timeout_ms`` when nothing has; return how many units (messages, files) were read, 0 for none."""
        ...

    def lag(self) -> int | None:
        """How far behind the input the source is (records, files), None when unknown."""
        ...

    def publish(self, only: Collection[Any] | None = None) -> None:
        """Make what was ingested up to now durable elsewhere (state for another replica), before :meth:`commit`."""
        ...

    def commit(self, only: Collection[Any] | None = None) -> None:
        """Mark what was ingested up to now as done: a restart resumes after it (at least once)."""
        ...

    def close(self) -> None:
        """Release connections and files; the source is not used after it."""
        ...


#: A compacted topic (the summaries: the latest record per key) rolls a segment hourly: Kafka never compacts the
#: segment it is writing to, a week's by default, so the topic would otherwise grow for a week before any cleaning.
COMPACTED_TOPIC_CONFIGS = {"cleanup.policy": "compact", "segment.ms": str(3_600_000)}


def ensure_topic(bootstrap: str, topic: str, partitions: int = 1, compact: bool = False, timeout_s: float = 30.0,
                 security: KafkaSecurity | None = None) -> bool:
    """Create ``topic`` if it does not exist; return True if created (``security``: a KafkaSecurity, default plaintext)."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000), client_id="prism-admin",
                             **(security.client_options() if security is not None else {}))
    try:
        if topic in admin.list_topics():
            return False
        cfg = dict(COMPACTED_TOPIC_CONFIGS) if compact else {}
        try:
            admin.create_topics([NewTopic(topic, partitions, 1, topic_configs=cfg)])
        except TopicAlreadyExistsError:
            return False
        return True
    finally:
        admin.close()


class KafkaSource(Source):
    """Consume flow records from Kafka (see the module docstring); a :class:`Source`.

    Parameters
    ----------
    bootstrap_servers : str
        ``host:port[,host:port]``.
    topic, group_id : str
    summary_topic : str
        Compacted topic for partition state and job membership.
    replica_id : str, optional
        This replica's name in the summaries (default: host name).
    max_message_bytes : int
        Larger messages are rejected as ``oversized_message``.
    max_poll_interval_ms, session_timeout_ms : int
        Consumer-group timeouts: a dead replica's partitions move after
        ``session_timeout_ms``; a window's analysis must finish within
        ``max_poll_interval_ms``.
    security : prism.serve.kafkaconf.KafkaSecurity, optional
        TLS and SASL settings for every client (default: plaintext).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str = "prism-flows",
        group_id: str = "prism",
        summary_topic: str = "prism-summaries",
        replica_id: str | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        max_poll_interval_ms: int = 30_000,
        session_timeout_ms: int = 6_000,
        max_poll_records: int = 2_000,
        security: KafkaSecurity | None = None,
    ) -> None:
        from kafka import KafkaConsumer, KafkaProducer, TopicPartition

        self._tp = TopicPartition
        self.topic, self.group_id, self.summary_topic = topic, group_id, summary_topic
        self.replica_id = replica_id or socket.gethostname()
        self.max_message_bytes = int(max_message_bytes)
        self.monitor: Monitor | None = None
        self.positions: dict = {}  # TopicPartition -> next offset to read (after the last ingested)
        self.summaries: dict[str, dict] = {}  # latest value per key of the summaries topic
        self.ready = False
        self.resets = 0  # times the topic was found re-created (prism_source_resets_total)
        ensure_topic(bootstrap_servers, summary_topic, 1, compact=True, security=security)
        common = dict(bootstrap_servers=bootstrap_servers, reconnect_backoff_max_ms=2000, request_timeout_ms=max(session_timeout_ms + 5000, 15000),
                      **(security.client_options() if security is not None else {}))
        self.consumer = KafkaConsumer(
            group_id=group_id, enable_auto_commit=False, auto_offset_reset="earliest", client_id=f"prism-{self.replica_id}",
            max_poll_interval_ms=max_poll_interval_ms, session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=max(session_timeout_ms // 3, 500), max_poll_records=max_poll_records,
            **common,  # default fetch sizes: small per-partition fetches keep partitions interleaved in time
        )
        self.summary_consumer = KafkaConsumer(enable_auto_commit=False, auto_offset_reset="earliest", group_id=None, **common)
        self.producer = KafkaProducer(acks="all", linger_ms=5, enable_idempotence=False, **{k: v for k, v in common.items() if k != "request_timeout_ms"})
        self._summary_tps = None
        self.components_changed = False  # another replica's job membership changed: re-run the window
        self._pending: set = set()  # assigned partitions not yet settled
        self._committed: set = set()  # partitions we have committed offsets for
        self._revoked: set = set()  # revoked, not yet known to be elsewhere
        self._moved: set = set()  # partitions the last settling moved from where reading stood (see _settle_assigned)
        self._rebalanced = False
        self._stash: dict = {}  # revoked partitions' last offset and counts, in case they come back
        self._topic_id: str | None = None  # the topic's UUID when first seen; a new one means the topic was re-created
        self._prefetched: list = []  # decoded during an analysis, not yet ingested (see keep_alive)
        self._prefetched_records = 0
        self.read_ahead_dropped = 0  # records decoded ahead then dropped, to be read again (a rebalance, a re-created topic)
        self.consumer.subscribe([topic], listener=_Rebalance(self))

    # -- summaries topic -------------------------------------------------------
    def _summary_partitions(self):
        if self._summary_tps is None:
            parts = self.summary_consumer.partitions_for_topic(self.summary_topic)
            if not parts:
                return []
            self._summary_tps = [self._tp(self.summary_topic, p) for p in sorted(parts)]
            self.summary_consumer.assign(self._summary_tps)
            self.summary_consumer.seek_to_beginning(*self._summary_tps)
        return self._summary_tps

    #: A catch-up of the summaries topic stops here (seconds), with a warning: a
    #: safety net, not a deadline. It ends at the end offsets taken when it
    #: started, however long that takes; past --kafka.max-poll-interval the
    #: group moves this replica's partitions away meanwhile, and the next
    #: assignment's catch-up goes on from where this one stood.
    SUMMARY_CATCH_UP_LIMIT_S = 600.0
    #: Seconds between the progress lines of a long catch-up.
    SUMMARY_CATCH_UP_LOG_S = 10.0
    #: Polls (of 100 ms) in a row that move no offset end a catch-up, with a warning: a consumer that fetches
    #: nothing (a broker that lost and re-created the topic, its fetches failing) must not hold the daemon, and
    #: its group membership, for the whole safety limit.
    SUMMARY_CATCH_UP_STALL_POLLS = 50

    def read_summaries(self, catch_up: bool = False) -> None:
        """Take new summary records; with ``catch_up``, every record up to the end offsets the topic has now.

        A successor (a partition assigned) must start from its predecessor's
        latest states, so it reads the summaries topic to the end offsets
        captured when the catch-up starts (records written meanwhile are taken
        by later reads), with a progress line every
        :attr:`SUMMARY_CATCH_UP_LOG_S` and a warning if it gives up at
        :attr:`SUMMARY_CATCH_UP_LIMIT_S`. Without ``catch_up``, only what has
        already been fetched (no wait).
        """
        tps = self._summary_partitions()
        if not tps:
            return
        if catch_up:
            self._catch_up_summaries(tps)
        else:
            self._take_summaries(self.summary_consumer.poll(timeout_ms=0))
        if self.monitor is not None:
            prefix = f"components/{self.group_id}/"
            remote = {
                k[len(prefix):]: v.get("components", []) for k, v in self.summaries.items()
                if k.startswith(prefix) and k[len(prefix):] != self.replica_id
            }
            if remote != self.monitor.remote_components:
                self.monitor.remote_components = remote
                self.components_changed = True

    def _take_summaries(self, batch: dict) -> int:
        """Apply a fetched batch of summary records (latest value per key; a tombstone deletes); return how many."""
        n = 0
        for recs in batch.values():
            n += len(recs)
            for r in recs:
                key = r.key.decode("utf-8", "replace") if r.key else ""
                if r.value is None:
                    self.summaries.pop(key, None)
                    continue
                try:
                    self.summaries[key] = json.loads(r.value)
                except ValueError:
                    log.warning("summaries: unreadable value under %s", key)
        return n

    def _catch_up_summaries(self, tps: list) -> None:
        """Read the summaries topic up to the end offsets it has when called (see :meth:`read_summaries`)."""
        consumer = self.summary_consumer
        start = last_log = time.monotonic()
        try:
            end = consumer.end_offsets(tps)
        except Exception as e:  # noqa: BLE001 - the broker did not answer: read to the high watermarks as they come
            log.warning("summaries: could not read the topic's end offsets (%s); reading up to its high watermarks", e)
            end = None

        def to_go() -> int | None:  # offsets left before the end captured (not records: compaction leaves gaps)
            return None if end is None else sum(max(end[tp] - consumer.position(tp), 0) for tp in tps)

        read = stalled = 0
        left = to_go()
        while end is None or left:
            batch = consumer.poll(timeout_ms=100)
            read += self._take_summaries(batch)
            if end is None and not batch and all(
                    consumer.highwater(tp) is not None and consumer.position(tp) >= consumer.highwater(tp) for tp in tps):
                break
            now, before, left = time.monotonic(), left, to_go()
            stalled = 0 if batch or left != before else stalled + 1
            fields = {"topic": self.summary_topic, "records": read, "offsets_to_go": left, "seconds": round(now - start, 1)}
            if now - start >= self.SUMMARY_CATCH_UP_LIMIT_S or stalled >= self.SUMMARY_CATCH_UP_STALL_POLLS:
                why = f"after {now - start:.0f} s" if stalled < self.SUMMARY_CATCH_UP_STALL_POLLS else f"after {stalled} polls that read nothing"
                log.warning("summaries: catch-up stopped %s, %s offsets before the end it started from (%d records read): "
                            "the partitions assigned start from the states read so far, which may be stale",
                            why, left, read, extra={"fields": fields})
                return
            if now - last_log >= self.SUMMARY_CATCH_UP_LOG_S:
                last_log = now
                log.info("summaries: catching up, %d records read in %.0f s, %s offsets to go", read, now - start, left,
                         extra={"fields": fields})
        took = time.monotonic() - start
        if took >= self.SUMMARY_CATCH_UP_LOG_S:  # a short one (the usual) says nothing
            log.info("summaries: caught up, %d records read in %.0f s", read, took,
                     extra={"fields": {"topic": self.summary_topic, "records": read, "seconds": round(took, 1)}})

    def _state_key(self, tp) -> str:
        return f"partition/{self.group_id}/{tp.topic}/{tp.partition}"

    @staticmethod
    def partition_name(tp: TopicPartition) -> str:
        return f"{tp.topic}/{tp.partition}"

    def _on_assigned(self, assigned) -> None:
        # runs on the consumer's IO thread, where blocking calls are not
        # allowed: note the partitions, and settle them in poll()
        self._pending.update(assigned)
        self._rebalanced = True
        self.ready = True

    def _settle_assigned(self, batch: dict) -> None:
        """Pick where newly assigned partitions start; drop records fetched before that."""
        pending, self._pending = self._pending, set()
        revoked, self._revoked = self._revoked, set()
        self._rebalanced = False
        owned = self.consumer.assignment()
        stood = {tp: self.positions.get(tp) for tp in pending}
        for tp in revoked - set(owned):
            # gone to another replica, which takes over the published counts
            if self.monitor is not None:
                self.monitor.drop_counters(self.partition_name(tp))
            self.positions.pop(tp, None)
            self._stash.pop(tp, None)
        self.read_summaries(catch_up=True)
        for tp in pending:
            if tp not in owned:
                continue
            name = self.partition_name(tp)
            # where this partition's counts and offset stand, newest wins: the
            # published state (another replica's, or our previous life's), what
            # we held when it was revoked, or what we still hold
            known = [c for c in (self.summaries.get(self._state_key(tp)), self._stash.pop(tp, None)) if c is not None and self._same_topic(c)]
            if tp in self.positions and self.monitor is not None:
                known.append({"offset": self.positions[tp], "counters": self.monitor.counters_snapshot().get(name, {}), "local": True})
            best = max(known, key=lambda c: int(c["offset"]), default=None)
            if best is not None and not best.get("local") and self.monitor is not None:
                self.monitor.restore_counters(name, best.get("counters", {}))
            if tp in self._committed and self._committed_offset(tp) is None:
                # we committed here before and the broker has forgotten it: the
                # broker lost its log (e.g. restarted with memory storage), and the
                # partition's records are new: read them from the start
                log.warning("partition %s: the broker forgot our committed offset; reading it from the beginning", name)
                self._seek(tp, None, batch)
                self._committed.discard(tp)
                self._summary_tps = None  # the summaries topic was lost with it: re-read from its start
                self.summaries.clear()
            elif best is not None:
                # the group resets a reassigned partition to its committed offset,
                # which lags the counts: go back to where the counts stand
                self._seek(tp, int(best["offset"]), batch)
                log.info("partition %s: resuming at offset %s", name, best["offset"])
        # read from elsewhere than where reading stood (a published resume point, the log's start): what was read of
        # it before says nothing of what comes next
        self._moved = {tp for tp, at in stood.items() if tp in owned and self.positions.get(tp) != at}

    def _current_topic_id(self) -> str | None:
        # the topic's UUID from the consumer's metadata (Metadata v10+; kafka-python
        # keeps it in the cluster view it refreshes after every reconnect). No
        # public accessor exists; None (an older client or broker) disables the check.
        try:
            tid = self.consumer._client.cluster.topic_id(self.topic)  # noqa: SLF001 - no public accessor (above)
        except AttributeError:
            return None
        return None if tid is None else str(tid)

    def _same_topic(self, state: dict) -> bool:
        """Whether a published partition state belongs to the topic as it is now (not to a deleted namesake)."""
        return state.get("topic_id") is None or self._topic_id is None or state["topic_id"] == self._topic_id

    def _topic_recreated(self) -> bool:
        """Whether the topic has a new ID since we last looked; if so, read every partition from the start.

        A broker that lost its log (memory storage, a restored cluster) comes
        back with the topic re-created: its offsets start again at 0 and ours
        point into records we have never seen. Offsets and timing cannot tell
        (the new log may already be longer than our position); the topic ID can.
        """
        tid = self._current_topic_id()
        if tid is None or tid == self._topic_id:
            return False
        if self._topic_id is None:
            self._topic_id = tid
            return False
        log.warning("topic %s was re-created (topic ID %s -> %s): the broker lost its log; reading every partition from the beginning",
                    self.topic, self._topic_id, tid)
        self._topic_id = tid
        # the group may have dropped us already (its state went with the log):
        # forget every position, not only the assigned partitions', so that no
        # rebalance resumes at an old offset
        self.positions.clear()
        for tp in self.consumer.assignment():
            self.consumer.seek_to_beginning(tp)
        self._committed.clear()
        self._stash.clear()
        self._summary_tps = None  # lost with it: re-read from its start
        self.summaries.clear()
        self.resets += 1
        return True

    def _committed_offset(self, tp):
        try:
            return self.consumer.committed(tp)
        except Exception:  # noqa: BLE001 - unknown: keep our position
            return -1

    def _seek(self, tp, offset, batch: dict) -> None:
        if offset is None:
            self.consumer.seek_to_beginning(tp)
            self.positions.pop(tp, None)
            batch.pop(tp, None)  # re-fetched from the start
            return
        self.consumer.seek(tp, offset)
        self.positions[tp] = offset
        batch.pop(tp, None)  # fetched from the old position: re-fetched from the new one

    def _on_revoked(self, revoked) -> None:
        # runs on the consumer's IO thread, where a blocking commit is not
        # allowed: the published state (another client) carries the offsets
        if self.monitor is not None and revoked:
            self.publish(only=revoked)
            counts = self.monitor.counters_snapshot()
            for tp in revoked:
                if tp in self.positions:
                    self._stash[tp] = {"offset": self.positions[tp], "counters": counts.get(self.partition_name(tp), {})}
                self._revoked.add(tp)  # its counts stay exported until we know it went elsewhere

    # -- the daemon's interface -------------------------------------------------
    #: records decoded ahead while a window is analysed, at most (then the
    #: partitions are paused): about 50 MB of frames
    PREFETCH_RECORDS = 500_000

    def poll(self, monitor: Monitor, timeout_ms: int = 500) -> int:
        """Read one batch into ``monitor``; return the number of messages.

        What :meth:`keep_alive` decoded during the last analysis is ingested
        first, without reading more, so the loop checks for a due window
        between the two.
        """
        self.monitor = monitor
        if self._prefetched:
            # revoked, the join still under way: the assignment is the old one
            # until it ends, but the revoked partitions' state is already
            # published for their next owner
            if not self._rebalanced and not self._revoked:
                decoded = self._take_prefetched()
                monitor.backlogged = self._backlog({d[0]: True for d in decoded})  # as for a fetched batch, below
                return self._ingest(monitor, decoded)
            self._rewind_prefetched()  # fetched around a rebalance: read again once settled
        paused = self.consumer.paused()
        if paused:
            self.consumer.resume(*paused)  # after keep_alive
        batch = self._fetch(timeout_ms)
        if self._topic_recreated():
            batch = {}  # fetched from the new log at the old offsets: read again from the start
        if self._rebalanced:
            self._settle_assigned(batch)
        # partitions with unread records (this batch's included) hold the
        # watermark back while the batch is ingested (see Monitor.watermark)
        monitor.backlogged = self._backlog(batch)
        return self._ingest(monitor, self._decode(batch))

    def _fetch(self, timeout_ms: int) -> dict:
        """A poll's records by partition, the next fetch already on its way.

        kafka-python (3.0) sends a fetch from a poll that finds nothing
        buffered, then waits for it and returns its records; nothing more is
        asked for until the next poll. Polled again right away, without
        waiting, it sends the next fetch now: the broker serves it while
        this batch is decoded and ingested, as the Java consumer pipelines
        its fetches. On the demo's backlog, the poll loop waited 15 ms of
        every 35 ms for the broker before. What that second poll returns
        (records that arrived in between) joins the batch.

        A rebalance can begin in that second poll: the first one's records
        of a partition no longer assigned are then left to its next owner,
        which reads on from the offset this replica published on revocation
        (the records would otherwise be counted by both).
        """
        batch = dict(self.consumer.poll(timeout_ms=timeout_ms))
        if batch:
            for tp, recs in self.consumer.poll(timeout_ms=0).items():
                batch[tp] = batch[tp] + recs if tp in batch else recs  # in offset order: this poll's come after
            owned = self.consumer.assignment()
            batch = {tp: recs for tp, recs in batch.items() if tp in owned}
        return batch

    def _decode(self, batch: dict) -> list:
        """``(partition, frames, reject counts, first offset, next offset, messages)`` per partition of a fetched batch."""
        out = []
        for tp, recs in batch.items():
            if not recs:
                continue
            rejects = RejectCounter()
            msgs = ((r.value, r.headers, f"{tp.topic}[{tp.partition}]@{r.offset}") for r in recs)
            frames = decode_messages(msgs, rejects, f"{tp.topic}[{tp.partition}]@{recs[0].offset}-{recs[-1].offset}", self.max_message_bytes)
            out.append((tp, frames, rejects.counts, recs[0].offset, recs[-1].offset + 1, len(recs)))
        return out

    def _ingest(self, monitor: Monitor, decoded: list) -> int:
        n = 0
        for tp, frames, rejects, first_offset, next_offset, messages in decoded:
            part = self.partition_name(tp)
            self._before_batch(monitor, tp, frames, first_offset)
            for flows in frames:
                monitor.ingest(flows, part)
            monitor.reject(rejects, part)
            self.positions[tp] = next_offset
            n += messages
        monitor.backlogged = self._backlog({})
        self.read_summaries()
        return n

    def _before_batch(self, monitor: Monitor, tp: Any, frames: list, first_offset: int) -> None:
        """A poll's frames of ``tp``, from ``first_offset`` on, are about to be ingested (a hook; nothing here)."""

    def _resume_point(self, tp: Any, offset: int, counters: dict) -> tuple[int, dict]:
        """Where a successor resumes ``tp`` and the counts it takes (a hook): here, where reading stands, and the counts now."""
        return offset, counters

    def keep_alive(self, timeout_ms: int = 100) -> None:
        """Poll while a window is analysed, so the group keeps this consumer.

        Up to :attr:`PREFETCH_RECORDS` records are fetched and decoded
        meanwhile (decoding overlaps the analysis), and ingested by the next
        :meth:`poll`; the monitor is not touched. Their offsets count as read
        only then: a commit after this window does not include them. Past
        the bound, or around a rebalance, every partition is paused and
        nothing is kept: records that come back anyway (a partition assigned
        during this call) go back (a seek to their first offset) to be read
        by the next :meth:`poll`.
        """
        if not self._rebalanced and self._prefetched_records < self.PREFETCH_RECORDS:
            paused = self.consumer.paused()
            if paused:
                self.consumer.resume(*paused)
            batch = self._fetch(timeout_ms)
            if self._topic_recreated():
                self._drop_prefetched()  # positions and fetch offsets are reset: read all again
                return
            if self._rebalanced:  # assigned or revoked meanwhile: settle before reading on
                for tp, recs in batch.items():
                    if recs and tp in self.consumer.assignment():
                        self.consumer.seek(tp, recs[0].offset)
                self._rewind_prefetched()
                return
            decoded = self._decode(batch)
            self._prefetched.extend(decoded)
            self._prefetched_records += self._records(decoded)
            return
        self.consumer.pause(*self.consumer.assignment())
        for tp, recs in self.consumer.poll(timeout_ms=timeout_ms).items():
            if recs:
                self.consumer.seek(tp, recs[0].offset)

    @staticmethod
    def _records(decoded: list) -> int:
        """Flow records in :meth:`_decode` output."""
        return sum(len(f) for d in decoded for f in d[1])

    def _take_prefetched(self) -> list:
        owned = set(self.consumer.assignment())
        out = [d for d in self._prefetched if d[0] in owned]  # a revoked partition's records are its new owner's
        self.read_ahead_dropped += self._prefetched_records - self._records(out)
        self._prefetched, self._prefetched_records = [], 0
        return out

    def _rewind_prefetched(self) -> None:
        """Drop what was decoded ahead; its partitions (those still ours) read again from its first offset."""
        first: dict[TopicPartition, int] = {}
        for tp, _, _, offset, _, _ in self._prefetched:
            first.setdefault(tp, offset)
        owned = set(self.consumer.assignment())
        for tp, offset in first.items():
            if tp in owned:
                self.consumer.seek(tp, offset)
        self._drop_prefetched()

    def _drop_prefetched(self) -> None:
        self.read_ahead_dropped += self._prefetched_records
        self._prefetched, self._prefetched_records = [], 0

    def _backlog(self, batch: dict) -> set:
        """Assigned partitions with records not yet ingested (high watermark unknown: assume so)."""
        out = set()
        for tp in self.consumer.assignment():
            hw = self.consumer.highwater(tp)
            if tp in batch or hw is None or self.positions.get(tp, 0) < hw:
                out.add(self.partition_name(tp))
        return out

    def caught_up(self) -> bool:
        """Whether every record there is now has been read and ingested, as far as this consumer knows.

        Not while it holds no partition (none assigned yet, or its group
        membership lost: a consumer that missed its poll deadline rejoins
        with none), while a rebalance is under way (from a revocation until
        the assignment that follows is settled: the group's churn can last
        tens of seconds, during which no poll reads anything), nor while an
        assigned partition is behind its high watermark or has none known
        yet (no fetch answered since it was assigned), nor with records
        decoded ahead and not yet ingested. The high watermarks are those of
        the last fetch responses (every poll fetches; the broker answers
        within ``fetch.max.wait.ms``), so a stale one is below the log's end:
        a partition seen behind is behind. The daemon counts quiet input
        towards its idle flush only while this holds (see
        :meth:`prism.serve.daemon.Daemon._caught_up`).
        """
        from kafka.errors import IllegalStateError

        if self._rebalanced or self._revoked or self._prefetched:
            return False
        try:
            return bool(self.consumer.assignment()) and not self._backlog({})
        except IllegalStateError:  # a partition revoked meanwhile (the group's IO thread): rebalancing
            return False

    def lag(self) -> int | None:
        """Kafka records behind the high watermarks of the assigned partitions."""
        total, known = 0, False
        for tp in self.consumer.assignment():
            hw = self.consumer.highwater(tp)
            if hw is None:
                continue
            pos = self.positions.get(tp)
            if pos is None:
                try:
                    pos = self.consumer.position(tp, timeout_ms=100)
                except Exception:  # noqa: BLE001 - lag is best effort
                    continue
            total += max(hw - (pos or 0), 0)
            known = True
        return total if known else None

    def publish(self, only: Collection[Any] | None = None) -> None:
        """Write partition state and job membership to the summaries topic."""
        if self.monitor is None:
            return
        counts = self.monitor.counters_snapshot()
        now = time.time()
        for tp, off in list(self.positions.items()):
            if only is not None and tp not in only:
                continue
            if only is None and tp in self._revoked:
                # published when it was revoked; its next owner publishes it from now on, and a rewrite
                # here (while this replica's join is pending) could overwrite the owner's newer state
                continue
            off, c = self._resume_point(tp, off, counts.get(self.partition_name(tp), {}))
            value = {"offset": off, "counters": c, "replica": self.replica_id, "time": now, "topic_id": self._topic_id}
            self.producer.send(self.summary_topic, key=self._state_key(tp).encode(), value=json.dumps(value).encode())
        if only is None:
            comps = self.monitor.local_components()
            value = {"components": comps, "replica": self.replica_id, "time": now}
            self.producer.send(self.summary_topic, key=f"components/{self.group_id}/{self.replica_id}".encode(), value=json.dumps(value).encode())
        self.producer.flush(timeout=30)

    def commit(self, only: Collection[Any] | None = None) -> None:
        """Commit where a successor resumes (:meth:`_resume_point`; of ``only`` those partitions)."""
        self._commit_offsets({tp: self._resume_point(tp, off, {})[0] for tp, off in self.positions.items()}, only)

    def _commit_offsets(self, positions: dict, only: Collection[Any] | None = None) -> None:
        """Commit ``positions`` (partition -> next offset), of ``only`` those partitions if given; a failure is logged."""
        from kafka.structs import OffsetAndMetadata

        offsets = {tp: OffsetAndMetadata(off, "", -1) for tp, off in positions.items() if only is None or tp in only}
        if offsets:
            try:
                self.consumer.commit(offsets)
                self._committed.update(offsets)
            except Exception as e:  # noqa: BLE001 - the published state holds the offset too
                log.warning("offset commit failed (%s); the published state keeps the offsets", e)

    def close(self) -> None:
        for c in (self.consumer, self.summary_consumer):
            try:
                c.close(autocommit=False)
            except Exception:  # noqa: BLE001
                pass
        try:
            self.producer.close(timeout=5)
        except Exception:  # noqa: BLE001
            pass


try:
    from kafka import ConsumerRebalanceListener as _ListenerBase
except ImportError:  # pragma: no cover - older kafka-python
    _ListenerBase = object


class _Rebalance(_ListenerBase):
    """Publishes revoked partitions' state; resumes assigned ones from theirs."""

    def __init__(self, source: KafkaSource):
        self.source = source

    def on_partitions_revoked(self, revoked):
        self.source._on_revoked(set(revoked))  # noqa: SLF001 - this listener is KafkaSource's own

    def on_partitions_assigned(self, assigned):
        self.source._on_assigned(set(assigned))  # noqa: SLF001 - this listener is KafkaSource's own


class DirectorySource(Source):
    """Tail a directory of flow dumps (no Kafka); a :class:`Source`."""

    PARTITION = "dir"

    def __init__(self, directory: str | os.PathLike, chunk_rows: int = 1 << 18) -> None:
        self.dir = Path(directory)
        if not self.dir.is_dir():
            raise FileNotFoundError(f"--source {self.dir}: not a directory")
        self.chunk_rows = chunk_rows
        self.done: set[str] = set()
        self._sizes: dict[str, int] = {}
        self.ready = True
        self.files_read = 0
        self.bad_files: deque = deque(maxlen=10)  # (file, error) of the last files skipped as unreadable

    def _candidates(self) -> list[Path]:
        out = []
        try:
            listing = list(self.dir.iterdir())
        except OSError as e:
            # gone, or no longer readable: not ready until it is back
            self.ready = False
            raise OSError(f"--source {self.dir}: cannot list the directory ({e.strerror or e})") from e
        self.ready = True
        for p in listing:
            if p.name.startswith(".") or not p.is_file() or str(p) in self.done:
                continue
            try:
                detect_format(str(p))
            except FlowFormatError:
                continue  # not a flow dump (e.g. a .tmp being written)
            out.append(p)
        return sorted(out, key=lambda p: (p.stat().st_mtime, p.name))

    def poll(self, monitor: Monitor, timeout_ms: int = 500) -> int:
        """Ingest the oldest settled dump (one file a poll) into ``monitor``; return 1, or 0 (after waiting) for none."""
        for p in self._candidates():
            size = p.stat().st_size
            if self._sizes.get(str(p)) != size:  # still growing (or first seen): wait a poll
                self._sizes[str(p)] = size
                continue
            rejects = RejectCounter()
            try:
                for chunk in FlowReader(str(p), chunk_rows=self.chunk_rows, rejects=rejects):
                    monitor.ingest(chunk, self.PARTITION)
            except (FlowFormatError, OSError) as e:
                # skipped for good (the rows before the damage were ingested): one
                # bad file must not hold back the files after it
                log.error("skipping %s: %s", printable(p.name), printable(e, 500))  # a file's bytes, not terminal escapes, in the log
                rejects.add("malformed_file", 1, str(e))
                self.bad_files.append((p.name, str(e)))
            monitor.reject(rejects.counts, self.PARTITION)
            self.done.add(str(p))
            self._sizes.pop(str(p), None)
            self.files_read += 1
            return 1
        time.sleep(timeout_ms / 1000)
        return 0

    def lag(self) -> int | None:
        """Dumps waiting to be read."""
        return len(self._candidates())

    def publish(self, only: Collection[Any] | None = None) -> None:
        """Nothing: a directory keeps no state for another replica."""

    def commit(self, only: Collection[Any] | None = None) -> None:
        """Nothing: what was read is remembered in memory only (a restart reads the directory again)."""

    def close(self) -> None:
        """Nothing to release: each dump is closed once read."""

