"""The daemon against a real Kafka-protocol broker (Tansu), not a fake.

Every test streams the SYNTHETIC tiny cluster (8 s, with faults) or pieces
of it, and checks the daemon's metrics against the generator's truth or the
exact counts produced.
"""
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

import numpy as np
import pandas as pd
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import DAEMON_SETTINGS as SETTINGS
from support import pair_by_pair, produce_as_ordered, stop_process, wait_for
from support import scrape_total as _scrape_total

from prism.analysis.diagnosis import ANOMALY_COLUMNS
from prism.analysis.evaluation import job_name_map, score_anomalies, score_steps
from prism.ingest.messages import JSONL_CONTENT_TYPE, encode_arrow
from prism.ingest.topology import Topology
from prism.serve.broker import LocalBroker, free_port
from prism.serve.build import build_daemon
from prism.serve.daemon import Daemon
from prism.serve.live import stream_flows
from prism.serve.metrics import ANOMALY_EXPLANATION_CHARS, Health, printable
from prism.serve.monitor import Monitor, MonitorSettings
from prism.serve.produce import FlowProducer
from prism.serve.settings import DaemonSettings, KafkaSettings
from prism.serve.sources import ensure_topic


@pytest.fixture
def topic(broker):
    name = f"flows-{uuid.uuid4().hex[:8]}"
    ensure_topic(broker.bootstrap, name, 4)
    return name


class RunningDaemon:
    """A daemon on a thread with its metrics server, wired by the builder `prism daemon` uses."""

    def __init__(self, broker, topic, cluster, group=None, replica="r0", summary=None, max_message_bytes=1 << 20, max_poll_interval_s=3.0,
                 session_timeout_s=3.0, **settings):
        self.events = []
        self.from_incomplete = []  # per event: was it raised by a window the daemon knew incomplete (late input)?
        self.service = build_daemon(
            DaemonSettings(monitor=MonitorSettings(**{**SETTINGS, **settings}), web_listen_address="127.0.0.1:0",
                           max_poll_interval_s=max_poll_interval_s,
                           kafka=KafkaSettings(broker.bootstrap, topic, group or f"g-{topic}", summary or f"sum-{topic}", replica_id=replica,
                                               session_timeout_s=session_timeout_s, max_message_bytes=max_message_bytes)),
            Topology.from_frame(cluster.topology), on_event=self._on_event,
            warm=False,  # many daemons in one process: the kernels load in the first one's first window
        )
        s = self.service
        self.monitor, self.health, self.registry, self.server, self.source, self.daemon = s.monitor, s.health, s.registry, s.server, s.source, s.daemon
        self.thread = s.start()

    def _on_event(self, kind, event):  # on the daemon's loop, right after the window that raised it
        self.events.append((kind, event))
        self.from_incomplete.append(self.monitor.view.incomplete)

    def value(self, name, **labels):
        return self.registry.get_sample_value(name, labels) or 0.0

    def total(self, name, **labels):
        """Sum of a metric's samples over the labels not given."""
        out = 0.0
        for fam in self.registry.collect():
            for s in fam.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    out += s.value
        return out

    def scrape(self, path="/metrics"):
        with urllib.request.urlopen(f"http://{self.server.address}{path}", timeout=5) as r:
            return r.status, r.read().decode()

    def progress(self):
        """What moves while the daemon works: records ingested, analysis done."""
        return (self.total("prism_flows_ingested_total"), self.monitor.analysed_to)

    def settled(self, n):
        m = self.monitor
        return self.total("prism_flows_ingested_total") + self.total("prism_flows_duplicate_total") >= n and m.analysed_to is not None and m.analysed_to >= (m.max_start or 0)

    def stop(self):
        self.service.close(timeout_s=20)


def produce(broker, topic, flows, fmt="jsonl"):
    p = FlowProducer(broker.bootstrap, topic, fmt=fmt)
    stream_flows(p, flows, speed=0)
    p.flush()
    p.close()
    return len(flows)


def non_gpu_count(cluster):
    ips = set(cluster.topology["ip"])
    return int((~cluster.flows["src"].astype(str).isin(ips) | ~cluster.flows["dst"].astype(str).isin(ips)).sum())


def test_stream_gives_jobs_steps_and_anomalies(broker, topic, cluster):
    n = produce(broker, topic, cluster.flows, fmt="jsonl")
    d = RunningDaemon(broker, topic, cluster)
    try:
        wait_for(lambda: d.settled(n), 120, "every record ingested and analysed", progress=d.progress)
        status, text = d.scrape()
        assert status == 200
        fams = {f.name: f for f in text_string_to_metric_families(text)}
        ingested = sum(s.value for s in fams["prism_flows_ingested"].samples if s.name.endswith("_total"))
        assert ingested == n
        ignored = {}
        for s in fams["prism_flows_ignored"].samples:
            if s.name.endswith("_total") and s.value:
                ignored[s.labels["reason"]] = ignored.get(s.labels["reason"], 0) + s.value
        assert ignored == {"non_gpu_address": non_gpu_count(cluster)}
        assert d.value("prism_jobs") == cluster.jobs["job_id"].nunique()

        jobs = d.monitor.jobs_
        names = job_name_map(jobs, cluster.jobs)
        truth_gpus = cluster.jobs.groupby("job_id").size()
        info = [s for s in fams["prism_job_info"].samples]
        assert sorted(names[s.labels["job_id"]] for s in info) == sorted(truth_gpus.index)
        for s in info:
            assert int(s.labels["gpus"]) == truth_gpus[names[s.labels["job_id"]]]
        # pair types per job: as many DP and PP pairs as the truth has, all certain on this cluster
        truth_types = cluster.pairs.groupby(["job_id", "type"]).size()
        pairs = {(s.labels["job_id"], s.labels["type"], s.labels["certainty"]): s.value for s in fams["prism_job_pairs"].samples}
        assert pairs and all(c == "certain" for _, _, c in pairs)
        assert sum(pairs.values()) == len(cluster.pairs)
        for (job_id, kind, _), n in pairs.items():
            assert n == truth_types[(names[job_id], kind)]
        # steps: every job's reconstructed steps are (nearly all) the true ones
        true_steps = cluster.steps.groupby("job_id").size()
        for job_id, name in names.items():
            got = d.value("prism_steps_total", job_id=job_id)
            assert 0.9 * true_steps[name] <= got <= true_steps[name] + 1, (name, got, true_steps[name])
            assert d.value("prism_step_duration_seconds", job_id=job_id) > 0
            assert d.value("prism_step_duration_histogram_seconds_count", job_id=job_id) == got
        # each injected fault shows up as its anomaly, on the right job / subject
        by_name = {v: k for k, v in names.items()}
        for f in cluster.faults.itertuples(index=False):
            if f.kind == "slow_switch":
                assert d.value("prism_anomalies_total", kind="slow_switch", job_id="") >= 1
                assert any(e["kind"] == "slow_switch" and e["subject"].endswith(f.subject) for k, e in d.events if k == "anomaly")
                assert d.value("prism_switch_bandwidth_bytes_per_second", switch=f.subject) > 0
                assert d.value("prism_switch_bandwidth_ratio", switch=f.subject) < 0.7
            else:
                assert d.value("prism_anomalies_total", kind=f.kind, job_id=by_name[f.job_id]) == 1, f
        slow_group = [e for k, e in d.events if k == "anomaly" and e["kind"] == "slow_group"]
        assert [e["subject"] for e in slow_group] == [cluster.faults.query("kind == 'slow_group'")["subject"].iloc[0]]
        lag = d.value("prism_group_lag_ratio", job_id=slow_group[0]["job_id"], group=slow_group[0]["subject"])
        assert lag > 1.2
        # the current anomalies on /metrics, with their explanations: those the daemon logged (the tiny cluster has fewer
        # than the bounds, so all of them; a long explanation cut as the label is)
        info = {(s.labels["kind"], s.labels["job_id"], s.labels["subject"], s.labels["explanation"]) for s in fams["prism_anomaly_info"].samples}
        logged = {(e["kind"], e["job_id"] if isinstance(e["job_id"], str) else "", str(e["subject"]), printable(e["explanation"], ANOMALY_EXPLANATION_CHARS))
                  for k, e in d.events if k == "anomaly"}
        assert info == logged and len(info) == len(fams["prism_anomaly_info"].samples)
        assert d.scrape("/healthz")[0] == 200 and d.scrape("/readyz")[0] == 200
        # windows follow how the backlog arrives (a loaded machine reads it in fewer,
        # bigger polls): more than the final one, and the steps above are the check
        assert d.value("prism_windows_total") >= 2
        assert d.value("prism_consumer_lag_records") == 0
    finally:
        d.stop()


def late_input_counts_add_up(d, n, cluster):
    """Every record counted once: produced = ingested (valid, no re-delivery); ingested = windowed + ignored by reason;
    the late GPU flows = those dropped + those kept after their window, each counted against one window."""
    ingested, windowed = d.total("prism_flows_ingested_total"), d.total("prism_flows_windowed_total")
    ignored = {r: d.total("prism_flows_ignored_total", reason=r) for r in ("late", "non_gpu_address", "self_flow")}
    assert ingested == n and d.total("prism_flows_duplicate_total") == 0 and d.total("prism_flows_rejected_total") == 0
    assert windowed + sum(ignored.values()) == ingested, (windowed, ignored, ingested)
    late = d.total("prism_window_late_flows_total")
    m = d.monitor
    assert late == m.late_flows == sum(w.late for w in m.windows)
    gpu = n - non_gpu_count(cluster)  # the SYNTHETIC flows have no self flows
    dropped = gpu - windowed
    assert dropped <= ignored["late"] and dropped <= late <= gpu
    return late, dropped


def test_input_more_out_of_order_than_the_window_waits_raises_nothing(broker, topic, cluster, caplog):
    """A backlog sent pair by pair (each partition out of time order by the whole 8 s, the lateness cap 1.5 s): the
    windows it cannot fill report no step and no anomaly; the daemon says it is degraded; the late counts add up."""
    import logging

    flows = pair_by_pair(cluster.flows)
    n = produce_as_ordered(broker, topic, flows)
    with caplog.at_level(logging.WARNING, logger="prism.monitor"):
        d = RunningDaemon(broker, topic, cluster)
        try:
            wait_for(lambda: d.settled(n), 120, "every record ingested and analysed", progress=d.progress)
            # the loop hands the count to /readyz after the last window
            wait_for(lambda: d.health.incomplete_windows == d.monitor.recent_incomplete() >= 1, 60, "/readyz to say degraded")
            status, body = d.scrape("/readyz")
            incomplete = d.value("prism_windows_incomplete")
            assert status == 200 and f"{int(incomplete)} window" in body and "incomplete (late input)" in body, body
            assert d.value("prism_windows_incomplete_total") >= incomplete >= 1
            # nothing from the windows it could not fill; what the last (complete) window may find is true
            assert not any(d.from_incomplete)
            names = job_name_map(d.monitor.jobs_, cluster.jobs)
            anomalies = pd.DataFrame([e for k, e in d.events if k == "anomaly"], columns=ANOMALY_COLUMNS)
            _, judged = score_anomalies(anomalies, cluster.faults, names, cluster.steps)
            assert judged["matched"].all(), judged
            steps = d.monitor.steps_frame()
            if len(steps):  # from complete windows only: each a true step
                scores = score_steps(steps, cluster.steps, names)
                assert scores["spurious"].sum() == 0, scores
            late, dropped = late_input_counts_add_up(d, n, cluster)
            assert dropped > 0 and late > dropped  # some dropped, some kept but after their window
        finally:
            d.stop()
    warned = [r for r in caplog.records if r.getMessage().startswith("window incomplete (late input)")]
    assert warned and all(set(r.fields) >= {"from", "to", "late_flows"} for r in warned)  # type: ignore[attr-defined]


def test_the_same_flows_in_time_order_are_whole(broker, topic, cluster):
    """The twin of the test above: the same flows in time order give the true steps, and no window is incomplete."""
    n = produce_as_ordered(broker, topic, cluster.flows.sort_values("start_ns", kind="stable").reset_index(drop=True))
    d = RunningDaemon(broker, topic, cluster)
    try:
        wait_for(lambda: d.settled(n), 120, "every record ingested and analysed", progress=d.progress)
        scores = score_steps(d.monitor.steps_frame(), cluster.steps, job_name_map(d.monitor.jobs_, cluster.jobs))
        assert len(scores) == cluster.jobs["job_id"].nunique() and scores["spurious"].sum() == 0, scores
        assert (scores["found_share"] >= 0.9).all(), scores
        assert d.value("prism_windows_incomplete_total") == 0 and d.value("prism_windows_incomplete") == 0
        assert d.scrape("/readyz") == (200, "ready\n")
        assert late_input_counts_add_up(d, n, cluster) == (0, 0)
    finally:
        d.stop()


def test_malformed_messages_are_counted_and_neighbours_kept(broker, topic, cluster):
    good = cluster.flows[cluster.flows["src"].astype(str).isin(set(cluster.topology["ip"]))].head(6).copy()
    for c in ("src", "dst", "switches"):
        good[c] = good[c].astype(str)
    lines = good.to_json(orient="records", lines=True).strip().split("\n")
    bad_type = lines[1].replace(f'"size":{good["size"].iloc[1]}', '"size":"lots"')
    storage = lines[2].replace(good["dst"].iloc[2], "192.168.200.1")
    p = FlowProducer(broker.bootstrap, topic, fmt="jsonl")
    ct = [("content-type", JSONL_CONTENT_TYPE.encode())]
    p.send_raw("\n".join([lines[0], "{not json", bad_type, storage, lines[3]]).encode(), headers=ct)  # 2 good, 1 bad JSON, 1 wrong type, 1 non-GPU
    p.send_raw(bytes(np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8)).replace(b"\n", b" "))  # binary garbage: one malformed line
    p.send_raw(b"\xff\xff\xff\xff" + b"corrupt arrow")  # looks like Arrow, is not
    p.send_raw(b"\n".join([lines[4].encode()] * 200) + b"\n" + b" " * 4096)  # oversized (> 4 KiB limit): one message, not decoded
    p.send_raw(encode_arrow(good.iloc[4:6]))  # 2 good, Arrow, no header
    p.flush()
    p.close()
    d = RunningDaemon(broker, topic, cluster, max_message_bytes=4096)
    try:
        wait_for(lambda: d.total("prism_flows_ingested_total") >= 5 and d.total("prism_flows_rejected_total") >= 5, 60, "the messages")
        time.sleep(1.0)  # nothing more should arrive
        rejected = {r: d.total("prism_flows_rejected_total", reason=r) for r in ("malformed_row", "bad_number", "malformed_message", "oversized_message")}
        assert rejected == {"malformed_row": 2, "bad_number": 1, "malformed_message": 1, "oversized_message": 1}
        # the neighbours: 3 valid JSON records (one of them non-GPU, ingested then ignored) and 2 Arrow ones
        assert d.total("prism_flows_ingested_total") == 5
        assert d.total("prism_flows_ignored_total", reason="non_gpu_address") == 1
        assert d.thread.is_alive() and d.scrape("/healthz")[0] == 200
    finally:
        d.stop()


def test_poison_messages_cost_only_themselves(broker, topic, cluster):
    """Each poison among 30 good messages of 100 records: its neighbours all ingested, it counted exactly."""
    from test_messages import encode_jsonl as jsonl
    from test_messages import good, poisons

    p = FlowProducer(broker.bootstrap, topic, fmt="jsonl")
    want_valid, want_rejected = 0, {}
    for k, (_name, poison, valid, reasons) in enumerate(poisons()):
        for i in range(30):
            g = good(100, offset=(k * 31 + i) * 100)
            p.send_raw(encode_arrow(g) if i % 2 else jsonl(g), key=b"pair")
            if i == 13:
                p.send_raw(poison, key=b"pair")
        want_valid += 3000 + valid
        for r, n in reasons.items():
            want_rejected[r] = want_rejected.get(r, 0) + n
    p.flush()
    p.close()
    d = RunningDaemon(broker, topic, cluster)
    try:
        wait_for(lambda: d.total("prism_flows_ingested_total") + d.total("prism_flows_rejected_total") >= want_valid + sum(want_rejected.values()),
                 60, "every message", progress=d.progress)
        assert d.total("prism_flows_ingested_total") == want_valid
        assert d.total("prism_flows_duplicate_total") == 0
        got = {}
        for fam in d.registry.collect():
            for s in fam.samples:
                if s.name == "prism_flows_rejected_total" and s.value:
                    got[s.labels["reason"]] = got.get(s.labels["reason"], 0) + s.value
        assert got == want_rejected
        assert d.thread.is_alive() and d.daemon.error is None
    finally:
        d.stop()


@pytest.fixture(scope="module")
def short_cluster():
    """The tiny cluster over 3 s (SYNTHETIC; 77 thousand flows, 38% of the 8-s stream's): the broker-restart tests
    test the log, the offsets and the daemon's place in them, which a shorter stream tests as well at a third of the
    daemon's analysis time, the most of these tests' time."""
    from synthetic import preset

    return preset("tiny", seed=0, duration_s=3.0).generate()


@pytest.mark.parametrize("down_s", [0.0, 4.0], ids=["restart-at-once", "restart-after-the-session-timeout"])
def test_broker_restart_loses_nothing(short_cluster, down_s):
    """Memory storage: the restarted broker is empty and the topic re-created (a new topic ID).

    The daemon must notice from the topic ID, whatever the timing: restarted at
    once (the group may not even rebalance) or after the session timeout.
    """
    b = LocalBroker().start()
    topic = "flows"
    ensure_topic(b.bootstrap, topic, 4)
    flows = short_cluster.flows.sort_values("start_ns").reset_index(drop=True)
    half = len(flows) // 2
    n1 = produce(b, topic, flows.iloc[:half])
    d = RunningDaemon(b, topic, short_cluster)
    try:
        wait_for(lambda: d.total("prism_flows_ingested_total") == n1, 60, "the first half", progress=d.progress)
        b.stop(kill=True)
        time.sleep(down_s)
        b.start()
        ensure_topic(b.bootstrap, topic, 4)
        n2 = produce(b, topic, flows.iloc[half:])  # the new log already reaches past the daemon's old offsets
        wait_for(lambda: d.total("prism_flows_ingested_total") >= n1 + n2, 120, "the second half after the broker restart", progress=d.progress)
        wait_for(lambda: d.settled(n1 + n2), 60, "the analysis", progress=d.progress)
        assert d.total("prism_flows_ingested_total") == n1 + n2 == len(flows)
        assert d.total("prism_source_resets_total") == 1
        # records fetched at the old offsets before the reset was noticed are
        # read again from the start: recognised as re-deliveries, not counted twice
        assert d.total("prism_flows_duplicate_total") < n2
        assert d.thread.is_alive()
    finally:
        d.stop()
        b.stop()


@pytest.fixture(scope="module")
def s3():
    """A local S3 endpoint (moto's server) for Tansu's durable storage engine."""
    exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
    if not os.path.exists(exe):
        pytest.skip("moto_server is not installed (pip install 'moto[server]'; part of the test extra)")
    port = free_port()
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _http_ok(endpoint), 60, "moto_server")
        yield {"AWS_ENDPOINT": endpoint, "AWS_ALLOW_HTTP": "true", "AWS_ACCESS_KEY_ID": "prism", "AWS_SECRET_ACCESS_KEY": "prism",
               "AWS_DEFAULT_REGION": "us-east-1"}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _http_ok(url):
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True  # it answers
    except (urllib.error.URLError, ConnectionError, OSError):
        return False


#: the durable-storage tests are about the broker, not rebalances: on a machine loaded enough that a window's
#: analysis outlasts a 3 s poll interval, each analysis would cost the member its place (and its commits), and
#: the group would churn where the test waits for the offsets to settle
DURABLE_GROUP = dict(max_poll_interval_s=30.0, session_timeout_s=6.0)


def test_durable_broker_killed_mid_stream_loses_nothing(short_cluster, s3):
    """Tansu on S3 storage, as a deployment keeps it: killed (-9) and restarted while records stream in."""
    bucket = f"tansu-{uuid.uuid4().hex[:8]}"
    urllib.request.urlopen(urllib.request.Request(f"{s3['AWS_ENDPOINT']}/{bucket}", method="PUT"), timeout=10).close()
    b = LocalBroker(storage=f"s3://{bucket}/", env=s3).start()
    topic = "flows"
    ensure_topic(b.bootstrap, topic, 4)
    flows = short_cluster.flows.sort_values("start_ns").reset_index(drop=True)
    third = len(flows) // 3
    n1 = produce(b, topic, flows.iloc[:third])
    d = RunningDaemon(b, topic, short_cluster, **DURABLE_GROUP)
    try:
        wait_for(lambda: d.total("prism_flows_ingested_total") > 0, 60, "the first records", progress=d.progress)
        b.stop(kill=True)  # mid-stream: part of the first third not yet read
        b.start()
        n2 = produce(b, topic, flows.iloc[third:2 * third])
        b.stop(kill=True)
        time.sleep(DURABLE_GROUP["session_timeout_s"] + 1.0)  # past the session timeout: the group rebalances
        b.start()
        n3 = produce(b, topic, flows.iloc[2 * third:])
        wait_for(lambda: d.total("prism_flows_ingested_total") >= n1 + n2 + n3, 120, "every record", progress=d.progress)
        wait_for(lambda: d.settled(n1 + n2 + n3), 60, "the analysis", progress=d.progress)
        assert d.total("prism_flows_ingested_total") == n1 + n2 + n3 == len(flows)
        assert d.total("prism_source_resets_total") == 0  # the log survived: no re-read from the start
        assert d.thread.is_alive()
    finally:
        d.stop()
        b.stop()


def _read_log(bootstrap, topic, timeout=60.0):
    """Every record of ``topic`` as {partition: [(offset, value digest), ...]}, read to each partition's fetch high watermark.

    (Tansu's ListOffsets answers a wrong end offset; the high watermark of a
    fetch response is right.)
    """
    import hashlib

    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        wait_for(lambda: c.partitions_for_topic(topic), timeout, f"the partitions of {topic}")
        tps = [TopicPartition(topic, p) for p in sorted(c.partitions_for_topic(topic))]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        out: dict = {tp.partition: [] for tp in tps}

        def read_all():
            for tp, recs in c.poll(timeout_ms=200).items():
                out[tp.partition] += [(r.offset, hashlib.sha256(r.value).hexdigest()) for r in recs]
            return all(c.highwater(tp) is not None and c.position(tp) >= c.highwater(tp) for tp in tps)

        wait_for(read_all, timeout, f"every record of {topic}", progress=lambda: sum(map(len, out.values())))
        return out
    finally:
        c.close(autocommit=False)


def _committed(bootstrap, group, topic):
    """The group's committed offsets, {partition: offset}, read without joining the group."""
    from kafka import KafkaConsumer
    from kafka.structs import TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)  # never subscribes: not a member
    try:
        wait_for(lambda: c.partitions_for_topic(topic), 60, f"the partitions of {topic}")
        got = {p: c.committed(TopicPartition(topic, p)) for p in sorted(c.partitions_for_topic(topic))}
        return {p: off for p, off in got.items() if off is not None}
    finally:
        c.close(autocommit=False)


def _log_ends(log):
    return {p: recs[-1][0] + 1 for p, recs in log.items() if recs}


def test_durable_broker_restart_keeps_records_and_committed_offsets(short_cluster, s3):
    """Tansu on S3 storage stopped and started again: the log, the committed offsets and the daemon's place all survive.

    A daemon consumes the first half and commits; it and the broker stop; the
    broker starts on the same bucket. Every record is still in the log at its
    offset, the group's committed offsets are the same, and a new daemon in
    the same group resumes there: it reads only the second half, with the
    first half's counts restored (nothing lost, nothing counted twice).
    """
    bucket = f"tansu-{uuid.uuid4().hex[:8]}"
    urllib.request.urlopen(urllib.request.Request(f"{s3['AWS_ENDPOINT']}/{bucket}", method="PUT"), timeout=10).close()
    b = LocalBroker(storage=f"s3://{bucket}/", env=s3).start()
    topic, group = "flows", "g-durable"
    flows = short_cluster.flows.sort_values("start_ns").reset_index(drop=True)
    half = len(flows) // 2
    try:
        ensure_topic(b.bootstrap, topic, 4)
        n1 = produce(b, topic, flows.iloc[:half])
        a = RunningDaemon(b, topic, short_cluster, group=group, **DURABLE_GROUP)
        try:
            wait_for(lambda: a.settled(n1), 120, "daemon A to ingest and analyse the first half", progress=a.progress)
            log1 = _read_log(b.bootstrap, topic)
            assert sum(map(len, log1.values())) > 0
            # A commits after it publishes each window: wait until its offsets reach every partition's end
            wait_for(lambda: _committed(b.bootstrap, group, topic) == _log_ends(log1), 60, "daemon A's offsets at the log's end",
                     progress=lambda: _committed(b.bootstrap, group, topic))
            assert a.total("prism_flows_ingested_total") == n1
        finally:
            a.stop()
        committed1 = _committed(b.bootstrap, group, topic)

        b.stop(kill=True)  # no clean shutdown: what is in the bucket is all there is
        b.start()

        # the log and the group's offsets are as they were: nothing lost, nothing reset
        assert _read_log(b.bootstrap, topic) == log1
        assert _committed(b.bootstrap, group, topic) == committed1

        n2 = produce(b, topic, flows.iloc[half:])
        d = RunningDaemon(b, topic, short_cluster, group=group, **DURABLE_GROUP)
        try:
            wait_for(lambda: d.settled(n1 + n2), 120, "daemon B to ingest the second half", progress=d.progress)
            # B resumed at A's committed offsets: it read the second half only, and its counts
            # (the first half's, restored from the summaries topic, plus its own) are exact
            assert d.total("prism_flows_ingested_total") == n1 + n2 == len(flows)
            assert d.total("prism_flows_duplicate_total") == 0
            assert d.total("prism_source_resets_total") == 0  # same topic ID: the log survived
            log2 = _read_log(b.bootstrap, topic)
            assert all(log2[p][: len(recs)] == recs for p, recs in log1.items())  # the first half still there, at the same offsets
            wait_for(lambda: _committed(b.bootstrap, group, topic) == _log_ends(log2), 60, "daemon B's offsets at the log's end",
                     progress=lambda: _committed(b.bootstrap, group, topic))
        finally:
            d.stop()
    finally:
        b.stop()


def _daemon_proc(broker, topic, topo_csv, port, replica="r0"):
    cmd = [sys.executable, "-m", "prism", "daemon", "--topology", str(topo_csv), "--kafka.bootstrap-servers", broker.bootstrap,
           "--kafka.topic", topic, "--kafka.group-id", f"g-{topic}", "--kafka.summary-topic", f"sum-{topic}", "--kafka.replica-id", replica,
           "--kafka.max-poll-interval", "3s", "--kafka.session-timeout", "3s", "--web.listen-address", f"127.0.0.1:{port}",
           "--window", "3s", "--window.step", "1s", "--window.lateness", "100ms", "--switch.window", "2s", "--log.level", "warning"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_daemon_killed_and_restarted_resumes_exactly(broker, topic, cluster, tmp_path):
    topo_csv = tmp_path / "topology.csv"
    cluster.topology.to_csv(topo_csv, index=False)
    flows = cluster.flows.sort_values("start_ns").reset_index(drop=True)
    cut = len(flows) // 3
    n1 = produce(broker, topic, flows.iloc[:cut])
    port = free_port()
    a = _daemon_proc(broker, topic, topo_csv, port)
    try:
        wait_for(lambda: _scrape_total(port, "prism_flows_ingested_total") == n1 and (_scrape_total(port, "prism_windows_total") or 0) >= 1, 90, "daemon A to publish the first part")
        n2 = produce(broker, topic, flows.iloc[cut:])
        time.sleep(0.3)  # A is mid-way through the second part, unpublished
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=10)
    finally:
        if a.poll() is None:
            a.kill()
    port_b = free_port()
    b = _daemon_proc(broker, topic, topo_csv, port_b)
    try:
        wait_for(lambda: (_scrape_total(port_b, "prism_flows_ingested_total") or 0) >= n1 + n2, 120, "daemon B to catch up",
                 progress=lambda: _scrape_total(port_b, "prism_flows_ingested_total"))
        time.sleep(2.0)
        assert _scrape_total(port_b, "prism_flows_ingested_total") == n1 + n2 == len(flows)
        assert b.poll() is None
    finally:
        stop_process(b)
    assert b.returncode == 0, b.stderr.read()


def test_flood_is_shed_and_counted_memory_bounded(broker, topic, cluster):
    base = cluster.flows.sort_values("start_ns").reset_index(drop=True).iloc[: len(cluster.flows) // 4]
    # a 10x flood: the same traffic ten times over (sizes differ, so none is a re-delivery)
    flood = pd.concat([base.assign(size=base["size"] + k) for k in range(10)], ignore_index=True)
    n = produce(broker, topic, flood, fmt="arrow")
    cap = 30_000
    d = RunningDaemon(broker, topic, cluster, max_window_flows=cap)
    try:
        wait_for(lambda: d.settled(n), 180, "the flood", progress=lambda: d.total("prism_flows_ingested_total"))
        assert d.total("prism_flows_ingested_total") == n
        assert d.value("prism_flows_shed_total") > 0
        assert len(d.monitor.window) <= cap
        assert len(d.monitor.dedupe) <= 2 * cap
        assert d.thread.is_alive()
    finally:
        d.stop()


def test_two_replicas_equal_one(broker, topic, cluster):
    one = RunningDaemon(broker, topic, cluster, group=f"one-{topic}", summary=f"sum1-{topic}")
    group, summary = f"two-{topic}", f"sum2-{topic}"
    r1 = RunningDaemon(broker, topic, cluster, group=group, summary=summary, replica="r1")
    r2 = RunningDaemon(broker, topic, cluster, group=group, summary=summary, replica="r2")
    try:
        # every daemon runs before the traffic, as in a deployment: the groups are settled (so each replica's
        # partitions are its own from the first record, and the counts below add up)
        wait_for(lambda: len(r1.source.consumer.assignment()) == 2 and len(r2.source.consumer.assignment()) == 2
                 and len(one.source.consumer.assignment()) == 4, 180, "the groups to settle")
        n = produce(broker, topic, cluster.flows, fmt="arrow")
        wait_for(lambda: one.settled(n), 120, "the single daemon", progress=lambda: one.total("prism_flows_ingested_total"))
        wait_for(lambda: r1.total("prism_flows_ingested_total") + r2.total("prism_flows_ingested_total") >= n, 120, "the replicas",
                 progress=lambda: r1.total("prism_flows_ingested_total") + r2.total("prism_flows_ingested_total"))
        # both replicas hold partitions, and their counts add up exactly
        assert r1.total("prism_flows_ingested_total") > 0 and r2.total("prism_flows_ingested_total") > 0
        assert r1.total("prism_flows_ingested_total") + r2.total("prism_flows_ingested_total") == one.total("prism_flows_ingested_total") == n
        # job membership merged through the summaries topic: the same jobs, with all their GPUs, on each replica

        def jobs(d):
            return {s.labels["job_id"]: s.labels["gpus"] for f in d.registry.collect() for s in f.samples if s.name == "prism_job_info"}

        wait_for(lambda: jobs(r1) == jobs(one) and jobs(r2) == jobs(one), 60, "replicas to agree on the jobs", progress=lambda: (r1.progress(), r2.progress()))
        assert len(jobs(one)) == cluster.jobs["job_id"].nunique()
        # each replica sees part of each job's traffic; its steps still line up with the single daemon's
        wait_for(lambda: r1.monitor.analysed_to is not None and r1.monitor.analysed_to >= r1.monitor.max_start
                 and r2.monitor.analysed_to is not None and r2.monitor.analysed_to >= r2.monitor.max_start, 60, "replicas' tails",
                 progress=lambda: (r1.progress(), r2.progress()))
        assert sum(d.total("prism_source_resets_total") for d in (one, r1, r2)) == 0  # no broker restart here
        for job_id in jobs(one):
            single = one.value("prism_steps_total", job_id=job_id)
            best = max(r1.value("prism_steps_total", job_id=job_id), r2.value("prism_steps_total", job_id=job_id))
            assert abs(best - single) <= 0.15 * single, (job_id, best, single)
    finally:
        for d in (one, r1, r2):
            d.stop()


def test_slow_analysis_keeps_the_group(broker, topic, cluster):
    """A window analysed for longer than max.poll.interval does not cost the consumer its group membership."""
    n = produce(broker, topic, cluster.flows, fmt="arrow")
    d = RunningDaemon(broker, topic, cluster)
    slow = threading.Event()
    tick = d.monitor.tick

    def slow_tick(*args, **kwargs):
        if not slow.is_set():
            slow.set()
            time.sleep(2 * 3.0)  # twice the consumer's max_poll_interval_ms (3 s)
        return tick(*args, **kwargs)

    d.monitor.tick = slow_tick
    try:
        wait_for(lambda: d.source.consumer.assignment(), 60, "the assignment")
        member = d.source.consumer._coordinator._generation.member_id
        wait_for(lambda: d.settled(n), 120, "every record ingested and analysed", progress=d.progress)
        assert slow.is_set()
        # still the same member: never dropped from the group, never rebalanced
        assert d.source.consumer._coordinator._generation.member_id == member
        assert len(d.source.consumer.assignment()) == 4
        assert d.total("prism_flows_ingested_total") == n
    finally:
        d.stop()


class GatedTick:
    """Holds the monitor's first analysis until released (no sleeps: the test decides when)."""

    def __init__(self, monitor):
        self.entered, self.gate = threading.Event(), threading.Event()
        self.tick = monitor.tick
        monitor.tick = self

    def __call__(self, *args, **kwargs):
        if not self.gate.is_set():
            self.entered.set()
            assert self.gate.wait(120), "never released"
        return self.tick(*args, **kwargs)


def test_records_read_during_an_analysis_are_ingested_after_it_once(broker, topic, cluster):
    """While a window is analysed the consumer reads and decodes ahead; the monitor and the offsets wait for the analysis."""
    n = produce(broker, topic, cluster.flows, fmt="arrow")
    d = RunningDaemon(broker, topic, cluster)
    gated = GatedTick(d.monitor)
    try:
        wait_for(gated.entered.is_set, 120, "the first analysis", progress=d.progress)
        ingested, positions = d.total("prism_flows_ingested_total"), dict(d.source.positions)
        wait_for(lambda: d.source._prefetched_records > 0, 60, "records decoded during the analysis")
        # nothing reached the monitor, and no offset moved: a commit now would not include them
        assert d.total("prism_flows_ingested_total") == ingested < n
        assert d.source.positions == positions
        gated.gate.set()
        wait_for(lambda: d.settled(n), 120, "every record ingested and analysed", progress=d.progress)
        assert d.total("prism_flows_ingested_total") == n
        assert d.total("prism_flows_duplicate_total") == 0
    finally:
        gated.gate.set()
        d.stop()


def test_a_rebalance_during_an_analysis_drops_what_was_read_ahead(broker, topic, cluster):
    """A replica joins while the first one analyses with records decoded ahead: they are read again, by whoever owns them now."""
    flows = cluster.flows.sort_values("start_ns", kind="stable")
    half = int(flows["start_ns"].iloc[0]) + int(4e9)
    first, second = flows[flows["start_ns"] < half], flows[flows["start_ns"] >= half]
    n = produce(broker, topic, first, fmt="arrow")
    group, summary = f"g2-{topic}", f"s2-{topic}"
    r1 = RunningDaemon(broker, topic, cluster, group=group, summary=summary, replica="r1")
    # a window at every step, as before catching up strode a whole window
    r1.monitor.catching_up = lambda: False
    gated = GatedTick(r1.monitor)
    r2 = None
    try:
        wait_for(gated.entered.is_set, 120, "r1's first analysis", progress=r1.progress)
        # the second half arrives during the analysis: every partition then holds
        # records r1 decodes ahead, whichever it had read to the end before, and
        # whichever the rebalance gives r2
        n += produce(broker, topic, second, fmt="arrow")
        partitions = {r1.source._tp(topic, p) for p in range(4)}
        wait_for(lambda: {d[0] for d in r1.source._prefetched} == partitions, 60, "records of every partition decoded ahead",
                 progress=lambda: r1.source._prefetched_records)
        ahead = r1.source._prefetched_records
        r2 = RunningDaemon(broker, topic, cluster, group=group, summary=summary, replica="r2")
        wait_for(lambda: len(r2.source.consumer.assignment()) == 2, 120, "r2 to take half the partitions")
        gated.gate.set()

        def both():
            return r1.total("prism_flows_ingested_total") + r2.total("prism_flows_ingested_total")

        wait_for(lambda: both() >= n and len(r1.source.consumer.assignment()) == 2, 120, "every record", progress=both)
        wait_for(lambda: r1.settled(0) and r2.settled(0), 60, "both replicas' analyses", progress=lambda: (r1.progress(), r2.progress()))
        # the rebalance came while r1 held them (r2 has half the partitions only once r1
        # was told its own were revoked): all dropped, none ingested by r1 as they were
        assert r1.source.read_ahead_dropped >= ahead > 0
        assert r2.total("prism_flows_ingested_total") > 0  # r2 read its partitions' share again
        assert both() == n  # none lost, none counted twice
        assert r1.total("prism_flows_duplicate_total") + r2.total("prism_flows_duplicate_total") == 0
    finally:
        gated.gate.set()
        for d in (r1, r2):
            if d is not None:
                d.stop()


def test_directory_source_without_kafka(cluster, tmp_path):
    from prism.serve.sources import DirectorySource

    flows = cluster.flows.sort_values("start_ns").reset_index(drop=True)
    half = len(flows) // 2
    from synthetic.generator import write_flows

    write_flows(flows.iloc[:half], tmp_path / "a.parquet")
    (tmp_path / "notes.txt").write_text("not a flow dump: skipped")
    monitor = Monitor(Topology.from_frame(cluster.topology), MonitorSettings(**SETTINGS))
    d = Daemon(DirectorySource(tmp_path), monitor, Health())
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    try:
        write_flows(flows.iloc[half:], tmp_path / "b.parquet")  # a dump that appears later
        wait_for(lambda: sum(c.get("ingested", 0) for c in monitor.counters_snapshot().values()) == len(flows), 60, "both dumps")
        wait_for(lambda: monitor.analysed_to is not None and monitor.analysed_to >= monitor.max_start, 30, "the tail", progress=lambda: monitor.analysed_to)
        assert monitor.jobs_["job_id"].nunique() == cluster.jobs["job_id"].nunique()
    finally:
        d.stop()
        t.join(timeout=20)


def test_a_topology_matching_no_flow_is_warned_once(cluster, tmp_path, caplog):
    """Another cluster's inventory: every record is ignored, and the daemon says so (once) instead of staying silent."""
    import logging

    from prism.serve.sources import DirectorySource
    from synthetic.generator import write_flows

    other = Topology.from_frame(pd.DataFrame({"ip": ["192.168.200.1", "192.168.200.2"], "server": ["x1", "x2"]}))
    monitor = Monitor(other, MonitorSettings(**SETTINGS))
    d = Daemon(DirectorySource(tmp_path), monitor, Health())
    write_flows(cluster.flows, tmp_path / "a.parquet")
    t = threading.Thread(target=d.run, daemon=True)
    with caplog.at_level(logging.WARNING, logger="prism.daemon"):
        t.start()
        try:
            wait_for(lambda: d.topology_warned, 60, "the topology warning",
                     progress=lambda: sum(c.get("ingested", 0) for c in monitor.counters_snapshot().values()))
        finally:
            d.stop()
            t.join(timeout=20)
    warned = [r for r in caplog.records if "between two GPU NICs of --topology" in r.getMessage()]
    assert len(warned) == 1


def test_directory_source_skips_bad_files_and_goes_on(cluster, tmp_path):
    """Each unreadable dump is counted once and named; the dumps after it are read in full."""
    import gzip
    import tempfile

    from prism.serve.sources import DirectorySource
    from synthetic.generator import write_flows

    flows = cluster.flows.sort_values("start_ns").reset_index(drop=True)
    parts = np.array_split(np.arange(len(flows)), 4)
    good_csv = tmp_path / "src.csv"
    write_flows(flows.iloc[:50], good_csv)
    text = good_csv.read_bytes()
    good_csv.unlink()
    bad = {
        "truncated.jsonl.gz": gzip.compress(flows.iloc[:50].astype({"src": str, "dst": str, "switches": str}).to_json(orient="records", lines=True).encode())[:-30],
        "truncated.parquet.gz": None,
        "twice.csv": text.replace(b"\n", b",size\n", 1),
        "garbage.csv.gz": gzip.compress(text) + b"garbage",
    }
    write_flows(flows.iloc[:50], tmp_path / "whole.parquet")
    bad["truncated.parquet.gz"] = gzip.compress((tmp_path / "whole.parquet").read_bytes())[:-30]
    (tmp_path / "whole.parquet").unlink()
    t0 = 1_000_000_000
    for i, (name, content) in enumerate(bad.items()):
        write_flows(flows.iloc[parts[i]], tmp_path / f"good{i}.parquet")
        os.utime(tmp_path / f"good{i}.parquet", (t0 + 2 * i, t0 + 2 * i))
        (tmp_path / name).write_bytes(content)
        os.utime(tmp_path / name, (t0 + 2 * i + 1, t0 + 2 * i + 1))  # each bad dump before the next good one
    leftovers = set(os.listdir(tempfile.gettempdir()))
    monitor = Monitor(Topology.from_frame(cluster.topology), MonitorSettings(**SETTINGS))
    src = DirectorySource(tmp_path)
    for _ in range(40):  # two polls a file (the first only notes its size)
        src.poll(monitor, timeout_ms=0)
    counts = monitor.counters_snapshot()["dir"]
    assert counts["ingested"] == len(flows)  # every good dump, in full
    assert counts["rejected:malformed_file"] == len(bad)
    assert {name for name, _ in src.bad_files} == set(bad)
    assert all(name in err or "twice" in name for name, err in src.bad_files)
    assert src.lag() == 0 and src.ready
    assert set(os.listdir(tempfile.gettempdir())) <= leftovers  # no decompressed copy left behind


def test_directory_source_gone_is_not_ready(cluster, tmp_path):
    from prism.serve.sources import DirectorySource

    d = tmp_path / "dumps"
    d.mkdir()
    monitor = Monitor(Topology.from_frame(cluster.topology), MonitorSettings(**SETTINGS))
    health = Health()
    daemon = Daemon(DirectorySource(d), monitor, health)
    d.rmdir()
    t = threading.Thread(target=daemon.run, kwargs={"max_seconds": 30}, daemon=True)
    t.start()
    try:
        wait_for(lambda: health.reason.startswith("source error"), 20, "the source error")
        assert not health.ready and "cannot list" in health.reason
        d.mkdir()
        wait_for(lambda: health.ready, 20, "readiness back")
    finally:
        daemon.stop()
        t.join(timeout=20)
