"""A re-keyed job's hand-over between analyse replicas (``prism daemon --role analyse``), without a broker.

The old id's owner, applying the ``retire``, sends the job's pairs and state
(``handover`` messages on the new id's partition); the new id's owner, told by
``rekey`` which old ids to wait for, takes them. These tests drive the real
encode (:meth:`JobTopicSource._hand_over`) and decode (``_decode``, ``_apply``)
through a producer that keeps what is sent; the broker test is
``tests/test_roles.py::test_a_job_re_keyed_to_another_replica_keeps_its_history``.
"""
import json

import numpy as np
import pytest
from stage_fakes import PARTS, KeptSends, analyse_stage, as_read
from support import DAEMON_SETTINGS as SETTINGS

from prism.ingest.topology import Topology
from prism.serve.monitor import MonitorSettings


def _replica(topo, settings, parts, name):
    """A JobTopicSource over an AnalyseMonitor holding the job topic's partitions ``parts``, fed by hand."""
    src = analyse_stage(topo, settings, parts, name)
    src._note_assignment(src.monitor)
    return src


def _read(src, msgs):
    """Give ``src`` the job-topic messages ``msgs`` (as a :class:`KeptSends` producer kept them) in one poll, each on its
    partition in the order sent."""
    batch: dict = {}
    for tp, r in as_read(msgs):
        batch.setdefault(tp, []).append(r)
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


def _handover_of(src):
    """The hand-over messages ``src`` sent, forgotten there (read once)."""
    out = [m for m in src.producer.msgs if m[4].get("prism-control") == b"handover"]
    src.producer.msgs = [m for m in src.producer.msgs if m not in out]
    return out


@pytest.mark.parametrize("order", ["handed-then-retired", "retired-then-handed", "one-replica"])
def test_a_job_re_keyed_twice_hands_on_what_it_was_handed(analysed, order):
    """A job re-keyed A -> B (B's owner told to wait for A's state), then B -> C, before B's owner has analysed a
    window with B: B's owner hands C's owner the state and pairs A's owner handed it (one daemon's chain: C takes what
    B took from A), whether A's hand-over is read before B's retire or after it (the retire waits for it, within the
    bound), and, B and C on one replica, C is given it there. Before, B's owner handed over no state (B had none of
    its own yet) and C's steps started from 0."""
    from prism.serve.jobtopic import job_partition

    topo, settings, _ = analysed
    a, old, ips = _old_owner(analysed)
    state = json.loads(json.dumps(a.monitor.state_of(old)))
    pairs = a.monitor._pair_keys.copy()
    mid = _id_on_another_partition(old, "mid")
    new = next(f"new-{i}" for i in range(100) if job_partition(f"new-{i}", PARTS) not in {job_partition(j, PARTS) for j in (old, mid)})
    at = int(a.monitor.analysed_to)
    b = _replica(topo, settings, [job_partition(mid, PARTS)] + ([job_partition(new, PARTS)] if order == "one-replica" else []), "a1")
    c = b if order == "one-replica" else _replica(topo, settings, [job_partition(new, PARTS)], "a2")
    _read(b, [_control("rekey", {"job": mid, "from": [old], "replica": "i0", "at": at}, job_partition(mid, PARTS))])
    if c is not b:
        _read(c, [_control("rekey", {"job": new, "from": [mid], "replica": "i0", "at": at + 1}, job_partition(new, PARTS))])
    retire_mid = _control("retire", {"job": mid, "into": new, "ips": ips, "replica": "i0", "at": at + 1}, job_partition(mid, PARTS))
    _read(a, [_control("retire", {"job": old, "into": mid, "ips": ips, "replica": "i0", "at": at}, job_partition(old, PARTS))])
    if order == "handed-then-retired":
        _read(b, _handover_of(a))
        _read(b, [retire_mid])
    else:
        _read(b, [retire_mid])
        assert not _handover_of(b) and b._held, "the retire waits for the state B's owner still waits for"
        _read(b, _handover_of(a))
        _read(b, [])  # the next poll
    assert not b._held and b.handovers_sent == (c is not b)
    assert mid not in b.monitor.awaiting and mid not in b.monitor.handed, "B is gone here"
    if c is not b:
        assert not b.monitor._handed_pairs
        _read(c, _handover_of(b))
    assert c.monitor.handed == {new: {mid: state}} and not c.monitor.awaiting
    c.monitor._add_handed_pairs(None)
    assert set(c.monitor._pair_keys) == set(pairs)


def test_a_state_named_for_a_later_window_is_not_taken_at_an_earlier_one(analysed):
    """Two re-keys into one id read before its new owner's first window: A at that window, B at a later one (a piece
    merged in after the job grew). One daemon's job, new at the first window, takes A's state there and keeps it
    when B joins it later (a job already here absorbs no history); so does the new owner, whose first window does
    not wait for B's state. Before, the first window waited for B's state too and took the bigger of the two."""
    topo, settings, f = analysed
    a, job, _ = _old_owner(analysed)
    state = json.loads(json.dumps(a.monitor.state_of(job)))
    bigger = {**state, "steps": 10_000, "next_step": 10_000}
    m = _replica(topo, settings, range(PARTS), "a2").monitor  # the fabric's partition too: no typed pairs to wait for
    m.clock = lambda: 0.0
    t0 = int(f["start_ns"].min())
    w1, w2 = t0 + 3_000_000_000, t0 + 4_000_000_000
    m.expect_states(job, ["A"], 30, at=w1)
    m.expect_states(job, ["B"], 30, at=w2)
    m.note_handed_state(job, "A", state)
    m.ingest(f[f["start_ns"] < w1].reset_index(drop=True))
    for p in range(PARTS):
        m.mark({"inputs": 1, "partitions": {"0": w1}, "final": False, "end": w1}, p)
    assert m.due(), "the first window waits for A's state only"
    assert m.tick() is not None and m.analysed_to == w1
    steps = m._jobs[job].view.steps
    assert state["steps"] <= steps < bigger["steps"] and m.handovers_taken == 1, "A's state, not B's"
    assert not m.awaiting, "the job is here: B's state is not waited for"
    m.note_handed_state(job, "B", bigger)
    m.ingest(f[(f["start_ns"] >= w1) & (f["start_ns"] < w2)].reset_index(drop=True))
    for p in range(PARTS):
        m.mark({"inputs": 1, "partitions": {"0": w2}, "final": False, "end": w2}, p)
    assert m.due() and m.tick() is not None and m.analysed_to == w2
    assert steps <= m._jobs[job].view.steps < bigger["steps"] and m.handovers_taken == 1 and not m.handed


class _Bounded(KeptSends):
    """A producer refusing, as kafka-python's does at ``send``, a record past its ``max_request_size``; and whose sends
    to the topic ``fail`` fail later (a broker's refusal: the future's error)."""

    def __init__(self, max_request_size, fail=None):
        super().__init__()
        self.config = {"max_request_size": max_request_size}
        self.fail = fail

    def send(self, topic, key=None, value=None, partition=None, headers=None):
        from kafka.errors import KafkaTimeoutError, MessageSizeTooLargeError
        from kafka.future import Future

        if len(value or b"") + len(key or b"") > self.config["max_request_size"]:
            raise MessageSizeTooLargeError(f"The message is {len(value)} bytes when serialized")
        super().send(topic, key, value, partition, headers)
        return Future().failure(KafkaTimeoutError("no broker")) if topic == self.fail else Future().success(None)


def test_a_state_too_big_to_hand_over_fails_soft(analysed, monkeypatch, caplog):
    """A state past the producer's request size: the old owner retires the job all the same (no error out of the
    loop), sends its pairs, and says (a warning naming the job and the size, counted) that the state did not go; the
    new owner, told so in the hand-over, waits no longer and counts it missed. A state that fits with the pairs of the
    first message alone goes alone in it. A send the broker refuses later is warned of and counted, once."""
    from prism.serve.jobtopic import JobTopicSource, job_partition

    monkeypatch.setattr(JobTopicSource, "HANDOVER_PAIRS", 7)
    topo, settings, _ = analysed
    a, old, ips = _old_owner(analysed)
    new = _id_on_another_partition(old)
    state = a.monitor.state_of(old)
    size = len(json.dumps(state))
    pairs = a.monitor._pair_keys.copy()
    at = int(a.monitor.analysed_to)
    a.producer = _Bounded(size // 2)
    b = _replica(topo, settings, [job_partition(new, PARTS)], "a1")
    b.monitor.clock = lambda: 0.0
    _read(b, [_control("rekey", {"job": new, "from": [old], "replica": "i0", "at": at}, job_partition(new, PARTS))])
    with caplog.at_level("WARNING", logger="prism.jobtopic"):
        _read(a, [_control("retire", {"job": old, "into": new, "ips": ips, "replica": "i0", "at": at}, job_partition(old, PARTS))])
    assert a.monitor.retired == [old] and a.handovers_sent == 0 and a.handovers_failed == 1
    (warning,) = [r for r in caplog.records if r.levelname == "WARNING"]
    assert warning.fields["was"] == old and warning.fields["job"] == new and warning.fields["state_bytes"] > size // 2
    caplog.clear()
    with caplog.at_level("WARNING", logger="prism.jobtopic"):
        _read(b, _handover_of(a))
    assert not b.monitor.awaiting and b.monitor.handed == {new: {old: None}} and b.monitor.handovers_missed == 1
    assert [r.fields["job"] for r in caplog.records if r.levelname == "WARNING"] == [new]
    b.monitor._add_handed_pairs(None)
    assert set(b.monitor._pair_keys) == set(pairs), "the pairs went"

    # a state too big to go with the first message's pairs, not alone: it goes alone, the pairs after it
    a, old, ips = _old_owner(analysed)
    monkeypatch.setattr(JobTopicSource, "HANDOVER_PAIRS", 1_000)
    a.producer = _Bounded(size + JobTopicSource.RECORD_OVERHEAD + 600)  # the state and its ids fit; with 32 pairs (1 kB) not
    _read(a, [_control("retire", {"job": old, "into": new, "ips": ips, "replica": "i0", "at": at}, job_partition(old, PARTS))])
    sent = _handover_of(a)
    assert a.handovers_sent == 1 and a.handovers_failed == 0 and len(sent) == 2
    b = _replica(topo, settings, [job_partition(new, PARTS)], "a1")
    _read(b, sent)
    assert b.monitor.handed == {new: {old: json.loads(json.dumps(state))}}
    b.monitor._add_handed_pairs(None)
    assert set(b.monitor._pair_keys) == set(pairs)
    # the broker refuses the messages: warned of and counted once
    a, old, ips = _old_owner(analysed)
    a.producer = _Bounded(1 << 20, fail="jobs")
    caplog.clear()
    with caplog.at_level("WARNING", logger="prism.jobtopic"):
        _read(a, [_control("retire", {"job": old, "into": new, "ips": ips, "replica": "i0", "at": at}, job_partition(old, PARTS))])
    assert a.handovers_failed == 1 and len([r for r in caplog.records if r.levelname == "WARNING"]) == 1


def test_hand_overs_never_completed_or_never_taken_are_forgotten(analysed, monkeypatch):
    """What a replica keeps of hand-overs is forgotten once it will not be used: the messages of a hand-over not all
    in after the wait's bound (its sender failed part way), a state whose job did not come by the windows it was for
    (once older than the bound), and both at once when the new id's partition is revoked (its new holder's)."""
    from kafka.structs import TopicPartition

    from prism.serve.jobtopic import JobTopicSource, job_partition

    monkeypatch.setattr(JobTopicSource, "HANDOVER_PAIRS", 2)
    topo, settings, _ = analysed
    keys = np.arange(5, dtype=np.int64)
    sender = _replica(topo, settings, [0], "a0")
    now = [0.0]

    def receiver():
        src = _replica(topo, settings, range(PARTS), "a1")
        src.monitor.clock = lambda: now[0]
        return src

    def partial(src, new):  # the first two of three messages
        sender._hand_over(sender.monitor, "old", new, {"steps": 3}, (keys, keys, keys), at=1_000)
        _read(src, _handover_of(sender)[:2])
        assert list(src.monitor._handover_chunks) == [(new, "old", "a0")]

    # a hand-over's messages not all in: kept within the bound, then forgotten
    b = receiver()
    partial(b, "new")
    now[0] = 59.0
    _read(b, [])
    assert b.monitor._handover_chunks
    now[0] = 61.0
    _read(b, [])
    assert not b.monitor._handover_chunks
    # a state whose job did not come: kept while a window it is for is still to come, then forgotten
    now[0] = 0.0
    b.monitor.expect_states("new", ["old"], 60, at=1_000)
    b.monitor.note_handed_state("new", "old", {"steps": 3})
    now[0] = 100.0
    _read(b, [])
    assert b.monitor.handed == {"new": {"old": {"steps": 3}}} and b.monitor.rekeyed_at, "its window not analysed yet"
    b.monitor.analysed_to = 1_000
    _read(b, [])
    assert not b.monitor.handed and not b.monitor.rekeyed_at
    # the new id's partition revoked: both forgotten at once
    now[0] = 0.0
    b = receiver()
    partial(b, "new")
    b.monitor.note_handed_state("new", "other", {"steps": 3})
    b.consumer.tps = {TopicPartition("jobs", p) for p in range(PARTS) if p != job_partition("new", PARTS)}
    _read(b, [])
    assert not b.monitor._handover_chunks and not b.monitor.handed
