"""``prism daemon --role ingest|analyse``: the daemon in two stages joined by a job-keyed topic, on a real broker (Tansu).

The ingest replicas split the input topic (GPU-pair keys) and forward each
job's flows to the job topic under its job id, with watermarks; the analyse
replicas split the job topic. Whatever the replica counts, the jobs, their
steps (count and boundaries) and their anomalies are those of one plain
daemon on the same stream, each job's series from exactly one replica.
"""
import uuid

import pytest
from support import DAEMON_SETTINGS as SETTINGS
from support import wait_for

from prism.ingest.topology import Topology
from prism.serve.build import build_daemon
from prism.serve.live import stream_flows
from prism.serve.monitor import MonitorSettings
from prism.serve.produce import FlowProducer
from prism.serve.settings import DaemonSettings, KafkaSettings
from prism.serve.sources import ensure_topic


class Running:
    """A daemon of one role on a thread, wired by the builder ``prism daemon`` uses."""

    def __init__(self, broker, cluster, role, topic, group, replica, job_topic):
        self.events = []
        self.service = build_daemon(
            DaemonSettings(monitor=MonitorSettings(**SETTINGS), web_listen_address="127.0.0.1:0", max_poll_interval_s=3.0, role=role,
                           kafka=KafkaSettings(broker.bootstrap, topic, group, f"sum-{topic}", replica_id=replica, session_timeout_s=3.0,
                                               job_topic=job_topic, job_topic_partitions=4)),
            Topology.from_frame(cluster.topology), on_event=lambda kind, e: self.events.append((kind, e)), warm=False,
        )
        self.monitor, self.source, self.registry = self.service.monitor, self.service.source, self.service.registry
        self.service.start()

    def series(self, name):
        return {s.labels["job_id"]: s.value for f in self.registry.collect() for s in f.samples if s.name == name}

    def job_anomalies(self):
        return sorted((e["kind"], e["job_id"], str(e["subject"]), int(e["step"]) if e.get("step") is not None else -1)
                      for k, e in self.events if k == "anomaly" and isinstance(e.get("job_id"), str) and e["job_id"])

    def fabric_anomalies(self):
        return sorted((e["kind"], str(e["subject"])) for k, e in self.events if k == "anomaly" and not (isinstance(e.get("job_id"), str) and e["job_id"]))

    def steps(self):
        return {j: list(zip(g["start_ns"], g["end_ns"])) for j, g in self.monitor.steps_frame().groupby("job_id")}

    def stop(self):
        self.service.close(timeout_s=20)


@pytest.mark.parametrize("ingest,analyse", [(1, 1), (2, 2), (2, 1), (1, 2)])
def test_stages_give_one_daemons_answers(broker, cluster, ingest, analyse):
    topic = f"flows-{uuid.uuid4().hex[:8]}"
    ensure_topic(broker.bootstrap, topic, 4)
    jobs_topic = f"jobs-{topic}"
    one = Running(broker, cluster, "all", topic, f"one-{topic}", "one", jobs_topic)
    ins = [Running(broker, cluster, "ingest", topic, f"g-{topic}", f"i{k}", jobs_topic) for k in range(ingest)]
    ans = [Running(broker, cluster, "analyse", topic, f"g-{topic}", f"a{k}", jobs_topic) for k in range(analyse)]
    everyone = [one, *ins, *ans]
    try:
        # every replica holds its partitions before the traffic, as in a deployment
        wait_for(lambda: len(one.source.consumer.assignment()) == 4
                 and all(len(d.source.consumer.assignment()) == 4 // ingest for d in ins)
                 and all(len(d.source.consumer.assignment()) == 4 // analyse for d in ans), 180, "the groups to settle")
        p = FlowProducer(broker.bootstrap, topic, fmt="arrow")
        stream_flows(p, cluster.flows, speed=0)
        p.flush()
        p.close()
        n = len(cluster.flows)

        def progress():
            return [d.monitor.analysed_to for d in everyone] + [d.monitor.flows_received for d in ans]

        def done(d):
            m = d.monitor
            return m.max_start is not None and m.analysed_to is not None and m.analysed_to >= m.max_start

        wait_for(lambda: done(one) and one.source.lag() == 0, 180, "the single daemon", progress=progress)
        wait_for(lambda: sum(sum(c.get("ingested", 0) for c in d.monitor.counters_snapshot().values()) for d in ins) == n
                 and all(done(d) and d.monitor.final for d in ins), 180, "the ingest replicas", progress=progress)
        def analysed(d):
            m = d.monitor
            return m.all_final() and m.analysed_to is not None and m.analysed_to >= m.complete_to()

        try:
            wait_for(lambda: all(analysed(d) for d in ans), 180, "the analyse replicas", progress=progress)
        except AssertionError:
            for d in ans:
                m = d.monitor
                print("STUCK", d.source.replica_id, m.owned, m.inputs, m.marks, m.analysed_to, m.max_start, m.complete_to(), m.all_final())
            raise

        # every job from exactly one analyse replica, the single daemon's jobs with their GPU counts
        single = one.series("prism_job_info")
        owners = {}
        for d in ans:
            for job_id in d.series("prism_job_info"):
                assert job_id not in owners, f"{job_id} exported by two analyse replicas"
                owners[job_id] = d
        assert set(owners) == set(single) and len(single) == cluster.jobs["job_id"].nunique()
        gpus = {s.labels["job_id"]: s.labels["gpus"] for f in one.registry.collect() for s in f.samples if s.name == "prism_job_info"}
        for job_id, d in owners.items():
            got = {s.labels["job_id"]: s.labels["gpus"] for f in d.registry.collect() for s in f.samples if s.name == "prism_job_info"}
            assert got[job_id] == gpus[job_id]
        # the same steps, to the nanosecond, and the same anomalies
        for job_id, d in owners.items():
            assert d.steps()[job_id] == one.steps()[job_id], job_id
            assert d.series("prism_steps_total")[job_id] == one.series("prism_steps_total")[job_id]
        assert sorted(a for d in ans for a in d.job_anomalies()) == one.job_anomalies()
        assert one.job_anomalies(), "the tiny cluster's slow step and slow server"
        # the input counted once, by the ingest stage; the analyse stage exports no flow counters
        assert all(not d.monitor.counters_snapshot() for d in ans)
        if ingest == 1:  # the fabric diagnosis stays with the ingest stage: one replica sees all of it
            assert ins[0].fabric_anomalies() == one.fabric_anomalies()
    finally:
        for d in everyone:
            d.stop()


def test_a_job_whose_id_changes_is_sent_again_under_the_new_one(cluster):
    """A job first seen in two pieces (two ids), then whole: its window goes to the new id's owner, the old ids are retired."""
    from prism.serve.jobtopic import AnalyseMonitor, IngestMonitor
    from prism.serve.monitor import MonitorSettings

    topo = Topology.from_frame(cluster.topology)
    servers = dict(zip(cluster.topology["ip"], cluster.topology["server"]))
    job = cluster.jobs[cluster.jobs["job_id"] == "tp8-dp4"]
    ips = set(job["ip"])
    half = set(sorted({servers[ip] for ip in ips})[:2])
    f = cluster.flows[cluster.flows["src"].astype(str).isin(ips) & cluster.flows["dst"].astype(str).isin(ips)]
    side = f["src"].astype(str).map(servers).isin(half).to_numpy()
    same_side = side == f["dst"].astype(str).map(servers).isin(half).to_numpy()
    t0 = int(f["start_ns"].min())
    early = (f["start_ns"] < t0 + 2_000_000_000).to_numpy()
    m = IngestMonitor(topo, MonitorSettings(window_s=8, step_s=1, lateness_s=0))
    m.ingest(f[early & same_side].reset_index(drop=True))
    m.tick(final=True)
    first, _ = m.take_forward()
    assert len(first) == 2, "each half of the job its own id"
    m.ingest(f[~early].reset_index(drop=True))
    m.tick(final=True)
    sent, retired = m.take_forward()
    (new,) = set(sent) - set(first)
    assert set(retired) == set(first) and set(retired.values()) == {new}
    # the new id carries the whole window: the early flows again, and the late ones
    assert len(sent[new][0]) == len(f[early & same_side]) + len(f[~early])
    assert m.rekeyed == 1
    # the owner of an old id forgets the job's flows and pairs
    a = AnalyseMonitor(topo, MonitorSettings(window_s=8, step_s=1, lateness_s=0))
    a.ingest(f[early & same_side].reset_index(drop=True))
    a.retire_job(next(iter(first)), sorted(ips))
    assert len(a.window) == 0 and len(a._pair_keys) == 0 and a.retired == [next(iter(first))]


def test_an_analyse_replica_lost_mid_stream_is_succeeded_exactly(broker, cluster):
    """An analyse replica stops dead after a window (nothing published or committed after it, no hand-over); its
    successor replays the job topic from the offset it committed and takes the jobs' published states: together they
    report the single daemon's steps and anomalies, none twice, none missed."""
    topic = f"flows-{uuid.uuid4().hex[:8]}"
    ensure_topic(broker.bootstrap, topic, 4)
    jobs_topic = f"jobs-{topic}"
    one = Running(broker, cluster, "all", topic, f"one-{topic}", "one", jobs_topic)
    ing = Running(broker, cluster, "ingest", topic, f"g-{topic}", "i0", jobs_topic)
    first = Running(broker, cluster, "analyse", topic, f"g-{topic}", "a0", jobs_topic)
    everyone = [one, ing, first]
    try:
        wait_for(lambda: all(len(d.source.consumer.assignment()) == 4 for d in everyone), 180, "the groups to settle")
        flows = cluster.flows
        cut = int(flows["start_ns"].min()) + 5_500_000_000
        p = FlowProducer(broker.bootstrap, topic, fmt="arrow")
        t0 = int(flows["start_ns"].min())
        for k in range(6):  # a second at a time, each once the ingest replica has forwarded up to the one before: a window a second
            lo, hi = t0 + k * 1_000_000_000, min(t0 + (k + 1) * 1_000_000_000, cut)
            wait_for(lambda hi=hi: (ing.monitor.forwarded_to or t0) >= hi - 2_000_000_000, 120, "the ingest replica's windows",
                     progress=lambda: ing.monitor.forwarded_to)
            stream_flows(p, flows[(flows["start_ns"] >= lo) & (flows["start_ns"] < hi)], speed=0)
            p.flush()
        dead = {"at": None}
        commit = first.source.commit

        def commit_then_die(*a, **k):  # the window's state is out; then the process is gone
            commit(*a, **k)
            if first.monitor.analysed_to is not None and first.monitor.analysed_to >= cut - 1_000_000_000 and dead["at"] is None:
                dead["at"] = first.monitor.analysed_to
                first.source.publish = first.source.commit = lambda *a, **k: None
                first.service.daemon.stop()

        first.source.commit = commit_then_die
        wait_for(lambda: dead["at"] is not None, 180, "the first analyse replica's windows", progress=lambda: first.monitor.analysed_to)
        first.service.thread.join(60)
        first.stop()  # leaves the group, publishing nothing (as a killed process's partitions move after its session)
        assert first.steps(), "the first replica reported steps before it went"
        successor = Running(broker, cluster, "analyse", topic, f"g-{topic}", "a1", jobs_topic)
        everyone.append(successor)
        stream_flows(p, flows[flows["start_ns"] >= cut], speed=0)
        p.flush()
        p.close()

        def progress():
            return [d.monitor.analysed_to for d in everyone]

        wait_for(lambda: one.monitor.analysed_to is not None and one.monitor.analysed_to >= one.monitor.max_start
                 and sum(c.get("ingested", 0) for c in one.monitor.counters_snapshot().values()) == len(flows), 180, "the single daemon",
                 progress=progress)
        wait_for(lambda: ing.monitor.final and ing.monitor.analysed_to >= ing.monitor.max_start
                 and sum(c.get("ingested", 0) for c in ing.monitor.counters_snapshot().values()) == len(flows), 180, "the ingest replica",
                 progress=progress)
        m = successor.monitor
        wait_for(lambda: m.all_final() and m.analysed_to is not None and m.analysed_to >= m.complete_to() >= ing.monitor.analysed_to, 180,
                 "the successor", progress=progress)
        assert set(successor.series("prism_job_info")) == set(one.series("prism_job_info"))
        for job_id, steps in one.steps().items():
            assert successor.steps()[job_id] == steps, job_id
            assert successor.series("prism_steps_total")[job_id] == one.series("prism_steps_total")[job_id]
        # each anomaly reported once, by one of the two
        assert sorted(first.job_anomalies() + successor.job_anomalies()) == one.job_anomalies()
        # the successor replayed from the committed offsets (a window back), not from the start; it took the published states
        assert 0 < m.flows_received < ing.monitor.flows_forwarded
        # (so the steps before its first flow, equal above, are the published history)
        assert not m.restored and all(s[0][0] < m.min_start for s in successor.steps().values())
    finally:
        for d in everyone:
            d.stop()


def test_role_settings_are_checked():
    from prism.serve.settings import resolve_settings

    s = resolve_settings({"topology": "t.csv", "kafka_bootstrap_servers": "k:9092", "role": "Analyse", "kafka_job_topic": "jobs"})
    assert s.role == "analyse" and s.kafka.job_topic == "jobs" and s.kafka.job_topic_partitions == 12
    assert resolve_settings({"topology": "t.csv", "source": "in"}).role == "all"  # the default: one process, as before
    with pytest.raises(ValueError, match="--role: expected one of all, ingest, analyse"):
        resolve_settings({"topology": "t.csv", "kafka_bootstrap_servers": "k:9092", "role": "both"})
    with pytest.raises(ValueError, match="--role ingest: the stages meet on a Kafka topic"):
        resolve_settings({"topology": "t.csv", "source": "in", "role": "ingest"})
    with pytest.raises(ValueError, match="--kafka.job-topic-partitions"):
        resolve_settings({"topology": "t.csv", "kafka_bootstrap_servers": "k:9092", "kafka_job_topic_partitions": 0})
