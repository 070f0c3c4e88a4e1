"""A re-keyed job's hand-over between analyse replicas (``prism daemon --role analyse``), without a broker.

The old id's owner, applying the ``retire``, sends the job's pairs and state
(``handover`` messages on the new id's partition); the new id's owner, told by
``rekey`` which old ids to wait for, takes them. These tests drive the real
encode (:meth:`JobTopicSource._hand_over`) and decode (``_decode``, ``_apply``)
through a producer that keeps what is sent; the broker test is
``tests/test_roles.py::test_a_job_re_keyed_to_another_replica_keeps_its_history``.
"""
import json
from collections import deque
from types import SimpleNamespace

import numpy as np
import pytest
from support import DAEMON_SETTINGS as SETTINGS

from prism.ingest.topology import Topology
from prism.serve.monitor import MonitorSettings

PARTS = 4


class _Sent:
    """A producer that keeps what is sent (topic, key, value, partition, headers)."""

    def __init__(self):
        self.msgs = []

    def send(self, topic, key=None, value=None, partition=None, headers=None):
        self.msgs.append((topic, key, value, partition, dict(headers or ())))

    def flush(self, timeout=None):
        pass


class _Held:
    """A consumer that holds some of the job topic's partitions (no broker)."""

    def __init__(self, tps):
        self.tps = set(tps)
        self.config = {"max_poll_interval_ms": 20_000}

    def assignment(self):
        return set(self.tps)

    def highwater(self, tp):
        return None

    def partitions_for_topic(self, topic):
        return set(range(PARTS))


def _replica(topo, settings, parts, name):
    """A JobTopicSource over an AnalyseMonitor holding the job topic's partitions ``parts``, fed by hand."""
    from kafka.structs import TopicPartition

    from prism.serve.jobtopic import AnalyseMonitor, JobTopicSource

    src = JobTopicSource.__new__(JobTopicSource)
    src.monitor = AnalyseMonitor(topo, settings)
    src.consumer = _Held({TopicPartition("jobs", p) for p in parts})
    src.topic, src.positions, src._revoked, src._held, src._after, src.held_back = "jobs", {}, set(), [], {}, 0
    src._last_msg, src._kinds_at, src._replay, src.max_message_bytes, src._rebalanced = {}, deque(), {}, 8 << 20, False
    src.replica_id, src.producer, src.handovers_sent, src.handover_wait_s = name, _Sent(), 0, 60.0
    src._note_assignment(src.monitor)
    return src


def _read(src, msgs):
    """Give ``src`` the job-topic messages ``msgs`` (as a :class:`_Sent` producer kept them) in one poll, each on its
    partition in the order sent."""
    from kafka.structs import TopicPartition

    batch: dict = {}
    for topic, key, value, part, headers in msgs:
        if topic == "jobs":
            recs = batch.setdefault(TopicPartition("jobs", part), [])
            recs.append(SimpleNamespace(key=key, value=value, headers=list(headers.items()), offset=len(recs)))
    return src._ingest(src.monitor, src._decode(batch))


def _control(kind, value, part):
    return ("jobs", str(value["job"]).encode(), json.dumps(value).encode(), part, {"prism-control": kind.encode()})


def _id_on_another_partition(job_id, prefix="grown"):
    from prism.serve.jobtopic import job_partition

    return next(f"{prefix}-{i}" for i in range(100) if job_partition(f"{prefix}-{i}", PARTS) != job_partition(job_id, PARTS))


@pytest.fixture(scope="module")
def analysed(cluster):
    """The tiny cluster's topology, the daemon tests' settings and one job's flows (``tp8-dp4``, in time order)."""
    ips = set(cluster.jobs[cluster.jobs["job_id"] == "tp8-dp4"]["ip"])
    f = cluster.flows[cluster.flows["src"].astype(str).isin(ips) & cluster.flows["dst"].astype(str).isin(ips)]
    return Topology.from_frame(cluster.topology), MonitorSettings(**SETTINGS), f.sort_values("start_ns", kind="stable").reset_index(drop=True)


def _old_owner(analysed):
    """An analyse replica that has analysed the job's flows (every window, the ingest stage's marks final), then holds
    only its id's partition: (source, job id, its ips)."""
    from kafka.structs import TopicPartition

    from prism.serve.jobtopic import job_partition

    topo, settings, f = analysed
    src = _replica(topo, settings, range(PARTS), "a0")
    m = src.monitor
    m.ingest(f)
    end = int(f["start_ns"].max()) + 1
    for p in range(PARTS):
        m.mark({"inputs": 1, "partitions": {"0": end}, "final": True, "end": end}, p)
    assert m.tick(final=True) is not None
    (job,) = set(m.jobs_["job_id"])
    src.consumer.tps = {TopicPartition("jobs", job_partition(job, PARTS))}
    src._note_assignment(m)
    return src, job, sorted(m.jobs_[m.jobs_["job_id"] == job]["ip"])


def test_a_hand_over_of_several_messages_reaches_the_new_owner_whole(analysed, monkeypatch):
    """The old owner applies a retire into an id another replica holds: its hand-over, encoded in several messages
    (a few pairs each), decoded by the new owner's source and applied after its rekey, gives the new owner every pair
    the old one forgot (keys, first and last seen) and the job's state as it was, with nothing left waiting."""
    from prism.serve.jobtopic import JobTopicSource, job_partition

    monkeypatch.setattr(JobTopicSource, "HANDOVER_PAIRS", 7)
    a, old, ips = _old_owner(analysed)
    new = _id_on_another_partition(old)
    state = a.monitor.state_of(old)
    assert state is not None and state["steps"] > 10
    pairs = a.monitor._pair_keys.copy(), a.monitor._pair_first.copy(), a.monitor._pair_last.copy()
    at = int(a.monitor.analysed_to)
    topo, settings, _ = analysed
    b = _replica(topo, settings, [job_partition(new, PARTS)], "a1")
    _read(b, [_control("rekey", {"job": new, "from": [old], "replica": "i0", "at": at}, job_partition(new, PARTS))])
    assert b.monitor.awaiting[new][0] == {old}

    _read(a, [_control("retire", {"job": old, "into": new, "ips": ips, "replica": "i0", "at": at}, job_partition(old, PARTS))])
    sent = a.producer.msgs
    assert len(a.monitor._pair_keys) < len(pairs[0]) and a.handovers_sent == 1
    gone = np.isin(pairs[0], a.monitor._pair_keys, invert=True)
    assert gone.sum() > 3 * 7 and len(sent) == -(-gone.sum() // 7), "several messages, 7 pairs each"
    assert {(t, k, p, h["prism-control"]) for t, k, _, p, h in sent} == {("jobs", new.encode(), job_partition(new, PARTS), b"handover")}

    _read(b, sent)
    assert not b.monitor.awaiting and not b.monitor._handover_chunks
    assert b.monitor.handed == {new: {old: json.loads(json.dumps(state))}}
    b.monitor._add_handed_pairs(at)
    assert (b.monitor._pair_keys == pairs[0][gone]).all()
    assert (b.monitor._pair_first == pairs[1][gone]).all() and (b.monitor._pair_last == pairs[2][gone]).all()
    print("hand-over:", int(gone.sum()), "pairs in", len(sent), "messages, state of", state["steps"], "steps")
