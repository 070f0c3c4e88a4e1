"""A successor's catch-up of the summaries topic, on a real broker (Tansu).

A replica assigned partitions takes its predecessor's partition and job
states from the summaries topic: it must read that topic to its end, however
long that takes, or it starts from stale states (counts that go back, steps
reported again). The catch-up's clock is a stand-in that runs seconds per
call, so "a slow read of a large topic" costs no wall-clock time here.
"""
from __future__ import annotations

import json
import logging
import time
import uuid

import pytest
from kafka import KafkaProducer

from prism.serve import sources
from prism.serve.sources import KafkaSource, ensure_topic

JOBS = 300
RECORDS = 3_000  # ten states a job, the last one wins; six polls of 500 records


class _SlowClock:
    """``time`` for prism.serve.sources alone: every monotonic() is ``step`` seconds after the one before."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def monotonic(self) -> float:
        self.now += self.step
        return self.now

    def __getattr__(self, name):
        return getattr(time, name)


@pytest.fixture
def summaries(broker):
    """A summaries topic holding RECORDS job states (JOBS jobs, each written RECORDS // JOBS times) and a source on it."""
    name = f"sum-{uuid.uuid4().hex[:8]}"
    ensure_topic(broker.bootstrap, name, 1, compact=True)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
    for i in range(RECORDS):
        producer.send(name, key=f"jobstate/g/job-{i % JOBS}".encode(), value=json.dumps({"version": i}).encode())
    producer.flush()
    src = KafkaSource(broker.bootstrap, topic=f"in-{name}", group_id=f"g-{name}", summary_topic=name, replica_id="r1")
    yield src, producer, name
    producer.close()
    src.close()


def _latest() -> dict[str, dict]:
    return {f"jobstate/g/job-{j}": {"version": RECORDS - JOBS + j} for j in range(JOBS)}


def test_a_catch_up_reads_to_the_end_however_long_it_takes(summaries, monkeypatch, caplog):
    """Seven seconds a clock reading: a catch-up bounded by time (5 s) stops after the first poll; this one reads
    every record up to the end offsets taken at its start, saying how far it has got."""
    src, _, _ = summaries
    monkeypatch.setattr(sources, "time", _SlowClock(7.0))
    caplog.set_level(logging.INFO, logger="prism.sources")
    src.read_summaries(catch_up=True)
    assert src.summaries == _latest()
    messages = [r.getMessage() for r in caplog.records if r.name == "prism.sources"]
    assert any(m.startswith("summaries: catching up") for m in messages), messages
    assert any(m.startswith("summaries: caught up, 3000 records read") for m in messages), messages
    assert not any(r.levelno >= logging.WARNING for r in caplog.records), messages


def test_a_topic_written_meanwhile_does_not_keep_the_catch_up_going(summaries, monkeypatch, caplog):
    """Records written after the catch-up starts are not waited for: another replica writing faster than this one
    reads would otherwise keep it reading until the safety limit."""
    src, producer, name = summaries
    poll = src.summary_consumer.poll
    polls = []

    def poll_while_written(*a, **k):  # before each poll, more than a poll returns (500) is written (for 40 polls at most)
        polls.append(1)
        if len(polls) <= 40:
            for _ in range(600):
                producer.send(name, key=b"jobstate/g/other", value=json.dumps({"version": len(polls)}).encode())
            producer.flush()
        return poll(*a, **k)

    src.summary_consumer.poll = poll_while_written
    monkeypatch.setattr(sources, "time", _SlowClock(1.0))
    caplog.set_level(logging.INFO, logger="prism.sources")
    src.read_summaries(catch_up=True)
    assert _latest().items() <= src.summaries.items()
    assert not any(r.levelno >= logging.WARNING for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert len(polls) < 30, f"{len(polls)} polls: the catch-up chased the records written after it started (6 polls hold the rest)"

def test_the_safety_limit_stops_a_catch_up_with_a_warning(summaries, monkeypatch, caplog):
    src, _, _ = summaries
    monkeypatch.setattr(sources, "time", _SlowClock(7.0))
    monkeypatch.setattr(KafkaSource, "SUMMARY_CATCH_UP_LIMIT_S", 10.0)
    src.read_summaries(catch_up=True)
    assert src.summaries != _latest()
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "catch-up stopped" in warning.getMessage() and "stale" in warning.getMessage()
    assert warning.fields["offsets_to_go"] > 0 and warning.fields["records"] < RECORDS
    # the next catch-up goes on from there
    monkeypatch.setattr(KafkaSource, "SUMMARY_CATCH_UP_LIMIT_S", 600.0)
    src.read_summaries(catch_up=True)
    assert src.summaries == _latest()


def test_the_summaries_topic_is_created_compacted_with_segments_that_roll(broker, monkeypatch):
    """Created compacted, its segments rolled hourly (Kafka cleans only closed segments); an existing topic is left as it is."""
    from kafka.admin import KafkaAdminClient

    sent = []
    create = KafkaAdminClient.create_topics
    monkeypatch.setattr(KafkaAdminClient, "create_topics", lambda self, topics, **kw: sent.extend(topics) or create(self, topics, **kw))
    name = f"sum-{uuid.uuid4().hex[:8]}"
    assert ensure_topic(broker.bootstrap, name, 1, compact=True)
    assert not ensure_topic(broker.bootstrap, name, 1, compact=True)
    assert len(sent) == 1 and sent[0].name == name
    cfg = sent[0].topic_configs
    assert cfg["cleanup.policy"] == "compact" and 0 < int(cfg["segment.ms"]) <= 24 * 3_600_000


def test_a_catch_up_that_reads_nothing_stops_with_a_warning(summaries, monkeypatch, caplog):
    """A consumer whose fetches bring nothing while offsets remain (a broker that lost and re-created the topic) ends
    the catch-up after SUMMARY_CATCH_UP_STALL_POLLS polls, not at the safety limit: the daemon's loop and its group
    membership wait on it."""
    src, _, _ = summaries
    polls = []
    src.summary_consumer.poll = lambda *a, **k: polls.append(1) or {}
    src.read_summaries(catch_up=True)
    assert len(polls) == KafkaSource.SUMMARY_CATCH_UP_STALL_POLLS
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "polls that read nothing" in warning.getMessage() and warning.fields["offsets_to_go"] > 0 and warning.fields["records"] == 0
