"""KafkaSource.publish on stand-ins for the monitor and the producer (a unit test of one method; the
rebalances themselves run on a real broker in test_daemon.py)."""
from __future__ import annotations

import json

from kafka.structs import TopicPartition

from prism.serve.sources import KafkaSource


class _Monitor:
    def counters_snapshot(self) -> dict:
        return {"flows/0": {"ingested": 5}, "flows/1": {"ingested": 7}}

    def local_components(self) -> list:
        return []


class _Producer:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict]] = []

    def send(self, topic: str, key: bytes, value: bytes) -> None:
        self.sent.append((key.decode(), json.loads(value)))

    def flush(self, timeout: float) -> None:
        pass


def _source() -> KafkaSource:
    src = KafkaSource.__new__(KafkaSource)  # no broker: only the state publish reads
    src.monitor = _Monitor()  # type: ignore[assignment]
    src.producer = _Producer()  # type: ignore[assignment]
    src.group_id, src.replica_id, src.summary_topic, src._topic_id = "g", "r1", "summaries", None
    kept, revoked = TopicPartition("flows", 0), TopicPartition("flows", 1)
    src.positions = {kept: 10, revoked: 20}
    src._revoked = {revoked}
    return src


def test_a_window_publishes_no_state_of_a_partition_revoked_meanwhile():
    src = _source()
    src.publish()
    keys = [k for k, _ in src.producer.sent]  # type: ignore[attr-defined]
    assert "partition/g/flows/0" in keys and "partition/g/flows/1" not in keys


def test_the_revocation_itself_publishes_the_revoked_partition():
    src = _source()
    src.publish(only={TopicPartition("flows", 1)})
    sent = dict(src.producer.sent)  # type: ignore[attr-defined]
    assert sent["partition/g/flows/1"]["offset"] == 20 and "partition/g/flows/0" not in sent
