"""KafkaSource's read-ahead bookkeeping, with a stand-in consumer.

The broker tests (tests/test_daemon.py) run read-ahead through a real
rebalance, where kafka-python's eager protocol re-seeks every re-assigned
partition anyway; these check the bookkeeping itself: what is dropped is
read again from its first offset by this consumer if it still owns the
partition, and by nobody here if it does not.
"""
import pandas as pd
from kafka.structs import TopicPartition

from prism.serve.sources import KafkaSource


class Consumer:
    """The three calls the read-ahead bookkeeping makes."""

    def __init__(self, owned):
        self.owned, self.seeks = set(owned), []

    def assignment(self):
        return set(self.owned)

    def seek(self, tp, offset):
        self.seeks.append((tp, offset))


def _source(owned, prefetched):
    src = KafkaSource.__new__(KafkaSource)  # no broker: only the read-ahead state is used
    src.consumer = Consumer(owned)
    src._prefetched = prefetched
    src._prefetched_records = sum(len(f) for d in prefetched for f in d[1])
    src.read_ahead_dropped = 0
    return src


T0, T1, T2 = (TopicPartition("flows", p) for p in range(3))


def _decoded(tp, first, n_messages, records):
    # (partition, frames, reject counts, first offset, next offset, messages), as KafkaSource._decode gives
    return (tp, [pd.DataFrame({"start_ns": range(records)})], {}, first, first + n_messages, n_messages)


def test_rewind_seeks_each_owned_partition_back_to_its_first_read_ahead_offset():
    src = _source({T0, T1}, [_decoded(T0, 100, 5, 40), _decoded(T2, 7, 2, 10), _decoded(T0, 105, 3, 20), _decoded(T1, 0, 1, 5)])
    src._rewind_prefetched()
    assert sorted(src.consumer.seeks) == [(T0, 100), (T1, 0)]  # T2 went to another consumer: it reads it from the committed offset
    assert src.read_ahead_dropped == 75
    assert src._prefetched == [] and src._prefetched_records == 0


def test_taking_read_ahead_keeps_only_the_partitions_still_owned():
    src = _source({T0}, [_decoded(T0, 100, 5, 40), _decoded(T1, 3, 2, 10)])
    taken = src._take_prefetched()
    assert [d[0] for d in taken] == [T0]
    assert src.read_ahead_dropped == 10 and src.consumer.seeks == []
    assert src._prefetched == [] and src._prefetched_records == 0


class Polls:
    """A consumer whose polls return the given batches in turn, and note their timeouts; ``revoke`` is taken away in the second."""

    def __init__(self, *batches, revoke=()):
        self.batches, self.timeouts = list(batches), []
        self.owned, self.revoke = {T0, T1, T2}, set(revoke)

    def poll(self, timeout_ms=0):
        self.timeouts.append(timeout_ms)
        if len(self.timeouts) == 2:
            self.owned -= self.revoke
        return self.batches.pop(0) if self.batches else {}

    def assignment(self):
        return set(self.owned)


def test_a_fetched_batch_sends_the_next_fetch_before_it_is_decoded():
    """kafka-python sends the next fetch only from a poll that finds nothing buffered: a second poll, not waiting, sends it.

    Its records (arrived in between) follow the first poll's, partition by partition.
    """
    src = KafkaSource.__new__(KafkaSource)
    src.consumer = Polls({T0: [1, 2], T1: [7]}, {T0: [3], T2: [9]})
    assert src._fetch(200) == {T0: [1, 2, 3], T1: [7], T2: [9]}
    assert src.consumer.timeouts == [200, 0]
    src.consumer = Polls({})
    assert src._fetch(200) == {} and src.consumer.timeouts == [200]  # nothing came: nothing to overlap


def test_records_of_a_partition_revoked_by_the_second_poll_are_left_to_its_next_owner():
    """The next owner reads on from the offset published on revocation: ingesting them here too would count them twice."""
    src = KafkaSource.__new__(KafkaSource)
    src.consumer = Polls({T0: [1, 2], T1: [7]}, {T2: [9]}, revoke={T1})
    assert src._fetch(200) == {T0: [1, 2], T2: [9]}


def test_both_sources_implement_every_member_of_the_source_protocol(tmp_path):
    """Each built-in source defines every protocol member itself (none falls back to the protocol's empty
    stub), with the protocol's parameters, and a DirectorySource is a Source at run time."""
    import inspect

    from prism.serve.sources import DirectorySource, Source

    members = [m for m in ("poll", "lag", "publish", "commit", "close") if callable(getattr(Source, m))]
    assert members == ["poll", "lag", "publish", "commit", "close"]
    for cls in (KafkaSource, DirectorySource):
        assert Source in cls.__mro__  # explicitly (issubclass() does not take a protocol with an attribute)
        for m in members:
            assert getattr(cls, m) is not getattr(Source, m), f"{cls.__name__}.{m} is the protocol's stub"
            assert list(inspect.signature(getattr(cls, m)).parameters) == list(inspect.signature(getattr(Source, m)).parameters), (cls, m)
    src = DirectorySource(tmp_path)
    assert isinstance(src, Source) and src.ready


def test_a_source_is_any_class_with_the_protocol_members():
    """The extension point: a class need not name Source to be one; one missing a member is not."""
    from prism.serve.sources import Source

    class Replay:
        ready = True

        def poll(self, monitor, timeout_ms=500):
            return 0

        def lag(self):
            return None

        def publish(self, only=None):
            pass

        def commit(self, only=None):
            pass

        def close(self):
            pass

    class NoCommit:
        ready = True

        def poll(self, monitor, timeout_ms=500):
            return 0

        def lag(self):
            return None

        def publish(self, only=None):
            pass

        def close(self):
            pass

    assert isinstance(Replay(), Source) and not isinstance(NoCommit(), Source)


class Watermarks(Consumer):
    """A consumer with high watermarks (None: no fetch answered since the partition was assigned)."""

    def __init__(self, highwater):
        super().__init__(highwater)
        self.hw = dict(highwater)

    def highwater(self, tp):
        return self.hw[tp]


def test_caught_up_only_holding_partitions_read_to_their_high_watermarks_outside_a_rebalance():
    """What the daemon's idle flush asks of a Kafka source: quiet input only when nothing is known to be unread."""
    src = _source({T0, T1}, [])
    src.consumer = Watermarks({T0: 10, T1: 5})
    src.positions, src._rebalanced, src._revoked = {T0: 10, T1: 5}, False, set()
    assert src.caught_up()
    src.positions[T1] = 4
    assert not src.caught_up(), "a partition behind its high watermark"
    src.positions[T1] = 5
    src.consumer.hw[T1] = None
    assert not src.caught_up(), "a partition with no fetch answered yet"
    src.consumer.hw[T1] = 5
    src._revoked = {T0, T1}
    assert not src.caught_up(), "revoked, not yet assigned and settled (the group's churn)"
    src._revoked, src._rebalanced = set(), True
    assert not src.caught_up(), "assigned, not yet settled"
    src._rebalanced = False
    src.consumer = Watermarks({})
    assert not src.caught_up(), "no partition held (membership lost, or none left to this replica)"
