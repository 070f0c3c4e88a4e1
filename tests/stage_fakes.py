"""Stand-ins for Kafka clients, to drive one stage's source by hand in a unit test of it (imported as ``stage_fakes``:
pytest puts tests/ on sys.path). The stages' integration is tested on a real broker (tests/test_roles.py)."""
from __future__ import annotations

from collections import deque
from types import SimpleNamespace

__all__ = ["PARTS", "KeptSends", "HeldPartitions", "analyse_stage", "as_read"]

#: the job topic's partitions
PARTS = 4


class KeptSends:
    """A producer that keeps what is sent (topic, key, value, partition, headers)."""

    def __init__(self):
        self.msgs = []

    def send(self, topic, key=None, value=None, partition=None, headers=None):
        self.msgs.append((topic, key, value, partition, dict(headers or ())))

    def flush(self, timeout=None):
        pass

    def partitions_for(self, topic):
        return set(range(PARTS))


class HeldPartitions:
    """A consumer that holds ``tps`` (no broker)."""

    def __init__(self, tps):
        self.tps = set(tps)
        self.config = {"max_poll_interval_ms": 20_000}

    def assignment(self):
        return set(self.tps)

    def highwater(self, tp):
        return None

    def partitions_for_topic(self, topic):
        return set(range(PARTS))


def analyse_stage(topo, settings, parts=range(PARTS), name="a0"):
    """A JobTopicSource over an AnalyseMonitor holding the job topic's partitions ``parts``, fed by hand."""
    from kafka.structs import TopicPartition

    from prism.serve.jobtopic import AnalyseMonitor, JobTopicSource

    src = JobTopicSource.__new__(JobTopicSource)
    src.monitor = AnalyseMonitor(topo, settings)
    src.consumer = HeldPartitions({TopicPartition("jobs", p) for p in parts})
    src.topic, src.positions, src._revoked, src._held, src._after, src.held_back = "jobs", {}, set(), [], {}, 0
    src._last_msg, src._kinds_at, src._replay, src.max_message_bytes, src._rebalanced = {}, deque(), {}, 8 << 20, False
    src.replica_id, src.producer, src.handovers_sent, src.handovers_failed, src.handover_wait_s = name, KeptSends(), 0, 0, 60.0
    return src


def as_read(msgs):
    """The job-topic messages a :class:`KeptSends` producer kept, as a consumer reads them: [(partition, record)] in the
    order sent, each partition's offsets from 0."""
    from kafka.structs import TopicPartition

    out, offsets = [], {}
    for topic, key, value, part, headers in msgs:
        if topic == "jobs":
            tp = TopicPartition("jobs", part)
            offsets[tp] = offsets.get(tp, -1) + 1
            out.append((tp, SimpleNamespace(key=key, value=value, headers=list(headers.items()), offset=offsets[tp])))
    return out
