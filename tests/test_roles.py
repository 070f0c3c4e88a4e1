"""``prism daemon --role ingest|analyse``: the daemon in two stages joined by a job-keyed topic, on a real broker (Tansu).

The ingest replicas split the input topic (GPU-pair keys) and forward each
job's flows to the job topic under its job id, with watermarks; the analyse
replicas split the job topic. Whatever the replica counts, the jobs, their
steps (count and boundaries) and their anomalies are those of one plain
daemon on the same stream, each job's series from exactly one replica.
"""
import json
import logging
import signal
import subprocess
import sys
import time
import urllib.request
import uuid

import pandas as pd
import pytest
from stage_fakes import HeldPartitions, KeptSends, analyse_stage, as_read
from support import DAEMON_SETTINGS as SETTINGS
from support import pair_by_pair, produce_as_ordered, scrape_total, stop_process, wait_for

from prism.analysis.diagnosis import ANOMALY_COLUMNS
from prism.analysis.evaluation import job_name_map, score_anomalies, score_steps
from prism.ingest.topology import Topology
from prism.serve.broker import free_port
from prism.serve.build import build_daemon
from prism.serve.live import stream_flows
from prism.serve.monitor import MonitorSettings
from prism.serve.produce import FlowProducer
from prism.serve.settings import DaemonSettings, KafkaSettings
from prism.serve.sources import ensure_topic


class Running:
    """A daemon of one role on a thread, wired by the builder ``prism daemon`` uses."""

    def __init__(self, broker, cluster, role, topic, group, replica, job_topic, job_parts=4, poll_s=3.0, session_s=3.0, **settings):
        self.events = []
        self.from_incomplete = []  # per event: was it raised by a window the replica knew incomplete (late input)?
        self.service = build_daemon(
            DaemonSettings(monitor=MonitorSettings(**{**SETTINGS, **settings}), web_listen_address="127.0.0.1:0", max_poll_interval_s=poll_s,
                           role=role, kafka=KafkaSettings(broker.bootstrap, topic, group, f"sum-{topic}", replica_id=replica,
                                                          session_timeout_s=session_s, job_topic=job_topic, job_topic_partitions=job_parts)),
            Topology.from_frame(cluster.topology), on_event=self._on_event, warm=False,
        )
        self.monitor, self.source, self.registry = self.service.monitor, self.service.source, self.service.registry
        self.service.start()
        self.service.thread.name = f"prism-{replica}"

    def _on_event(self, kind, e):  # on the daemon's loop, right after the window that raised it
        self.events.append((kind, e))
        self.from_incomplete.append(self.monitor.view.incomplete)

    def series(self, name):
        return {s.labels["job_id"]: s.value for f in self.registry.collect() for s in f.samples if s.name == name}

    def total(self, name, **labels):
        """Sum of a metric's samples over the labels not given."""
        return sum(s.value for f in self.registry.collect() for s in f.samples
                   if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))

    def readyz(self):
        with urllib.request.urlopen(f"http://{self.service.server.address}/readyz", timeout=5) as r:
            return r.status, r.read().decode()

    def job_anomalies(self):
        return sorted((e["kind"], e["job_id"], str(e["subject"]), int(e["step"]) if e.get("step") is not None else -1)
                      for k, e in self.events if k == "anomaly" and isinstance(e.get("job_id"), str) and e["job_id"])

    def fabric_anomalies(self):
        return sorted((e["kind"], str(e["subject"])) for k, e in self.events if k == "anomaly" and not (isinstance(e.get("job_id"), str) and e["job_id"]))

    def steps(self):
        return {j: list(zip(g["start_ns"], g["end_ns"])) for j, g in self.monitor.steps_frame().groupby("job_id")}

    def stop(self):
        self.service.close(timeout_s=20)


def _same_steps(got, want):
    """``got == want`` for two ``Running.steps()`` dicts; on a difference, a message naming per job the counts, the
    first step that differs (in ms from the job's first) and where each side's steps end, which a bare dict diff
    truncates away."""
    if got == want:
        return True, ""
    lines = []
    for job_id in sorted(set(got) | set(want)):
        g, w = got.get(job_id, []), want.get(job_id, [])
        if g == w:
            continue
        t0 = (w or g)[0][0]
        i = next((k for k, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))

        def ms(steps, k, t0=t0):
            return [((a - t0) / 1e6, (b - t0) / 1e6) for a, b in steps[max(0, k - 1):k + 2]]

        lines.append(f"{job_id}: {len(g)} steps vs {len(w)}, first difference at step {i}: {ms(g, i)} vs {ms(w, i)}; "
                     f"last {ms(g, len(g) - 1)} vs {ms(w, len(w) - 1)}")
    return False, "\n".join(lines)


def _split(ds, parts=4):
    """Do the replicas ``ds`` of one group hold ``parts`` partitions between them, each one, each a share (uneven when
    their count does not divide ``parts``: 4 over 3 replicas is 2, 1 and 1), none without one?"""
    held = [d.source.consumer.assignment() for d in ds]
    sizes = sorted((len(h) for h in held), reverse=True)
    shares = [parts // len(ds) + (k < parts % len(ds)) for k in range(len(ds))]
    return sizes == shares and len(set().union(*held)) == parts


# (3, 3): the input topic's 4 partitions split 2/1/1; the job topic has 5 (split 2/2/1), over which the tiny
# cluster's 4 jobs fall 2/1/1 (on 4 they fall 2/2/0: one analyse replica would hold none)
@pytest.mark.parametrize("ingest,analyse,job_parts", [pytest.param(i, a, p, id=f"{i}-{a}") for i, a, p in
                                                      [(1, 1, 4), (2, 2, 4), (2, 1, 4), (1, 2, 4), (3, 3, 5)]])
def test_stages_give_one_daemons_answers(broker, cluster, ingest, analyse, job_parts):
    topic = f"flows-{uuid.uuid4().hex[:8]}"
    ensure_topic(broker.bootstrap, topic, 4)
    jobs_topic = f"jobs-{topic}"
    # no replica fails here: the group timeouts of the demo (prism.serve.live), not the 3 s of the takeover tests, so
    # that a loaded host's stalls (up to 8 replicas' threads in this one process) do not move partitions mid-stream
    timeouts = dict(poll_s=10.0, session_s=6.0)
    one = Running(broker, cluster, "all", topic, f"one-{topic}", "one", jobs_topic, **timeouts)
    ins = [Running(broker, cluster, "ingest", topic, f"g-{topic}", f"i{k}", jobs_topic, job_parts, **timeouts) for k in range(ingest)]
    ans = [Running(broker, cluster, "analyse", topic, f"g-{topic}", f"a{k}", jobs_topic, job_parts, **timeouts) for k in range(analyse)]
    everyone = [one, *ins, *ans]
    try:
        # every replica holds its partitions before the traffic, as in a deployment
        _settle(one, ins, ans, job_parts)
        p = FlowProducer(broker.bootstrap, topic, fmt="arrow")
        stream_flows(p, cluster.flows, speed=0)
        p.flush()
        p.close()
        n = len(cluster.flows)

        def progress():  # windows, records read and flows forwarded: a loaded host is slow, not stuck
            return ([d.monitor.analysed_to for d in everyone] + [d.monitor.flows_received for d in ans]
                    + [sum(c.get("ingested", 0) for c in d.monitor.counters_snapshot().values()) for d in (one, *ins)]
                    + [d.monitor.flows_forwarded for d in ins])

        def done(d):
            m = d.monitor
            return m.max_start is not None and m.analysed_to is not None and m.analysed_to >= m.max_start

        wait_for(lambda: done(one) and one.source.lag() == 0, 180, "the single daemon", progress=progress)
        try:
            wait_for(lambda: sum(sum(c.get("ingested", 0) for c in d.monitor.counters_snapshot().values()) for d in ins) == n
                     and all(done(d) and d.monitor.final for d in ins), 180, "the ingest replicas", progress=progress)
        except AssertionError:
            for d in ins:
                m = d.monitor
                print("STUCK", d.source.replica_id, sum(c.get("ingested", 0) for c in m.counters_snapshot().values()), "of", n,
                      "final", m.final, m.analysed_to, m.max_start, sorted(tp.partition for tp in d.source.consumer.assignment()))
            raise

        def analysed(d):  # every window analysed (a replica no job hashed to has none: it fails the check below, not this wait)
            m = d.monitor
            return m.all_final() and (m.analysed_to >= m.complete_to() if m.analysed_to is not None else m.max_start is None)

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
        assert {id(d) for d in owners.values()} == {id(d) for d in ans}, "every analyse replica holds jobs (see job_parts)"
        gpus = {s.labels["job_id"]: s.labels["gpus"] for f in one.registry.collect() for s in f.samples if s.name == "prism_job_info"}
        for job_id, d in owners.items():
            got = {s.labels["job_id"]: s.labels["gpus"] for f in d.registry.collect() for s in f.samples if s.name == "prism_job_info"}
            assert got[job_id] == gpus[job_id]
        # the same steps, to the nanosecond, and the same anomalies (on a difference: which replicas had windows with
        # late input, as a loaded host's rebalances make)
        late = "; ".join(f"{d.source.replica_id}: {d.monitor.windows_incomplete} of {len(d.monitor.windows)} windows incomplete, "
                         f"{d.monitor.late_flows} late flows" for d in everyone)
        for job_id, d in owners.items():
            same, why = _same_steps({job_id: d.steps()[job_id]}, {job_id: one.steps()[job_id]})
            assert same, f"{d.source.replica_id} {why}\n{late}"
            assert d.series("prism_steps_total")[job_id] == one.series("prism_steps_total")[job_id]
        assert sorted(a for d in ans for a in d.job_anomalies()) == one.job_anomalies()
        assert one.job_anomalies(), "the tiny cluster's slow step and slow server"
        # the input counted once, by the ingest stage; the analyse stage exports no flow counters
        assert all(not d.monitor.counters_snapshot() for d in ans)
        # the fabric (switches and links) diagnosed by one analyse replica over every ingest replica's switch sums:
        # one daemon's anomalies and, over the same sums, its last switch window's bandwidths to the bit
        def switch_bw(d):
            return {s.labels["switch"]: s.value for f in d.registry.collect() for s in f.samples
                    if s.name == "prism_switch_bandwidth_bytes_per_second"}

        fabric = [d for d in ans if d.fabric_anomalies() or switch_bw(d)]
        assert len(fabric) == 1 and fabric[0].monitor.owns_fabric(), "the fabric from exactly one analyse replica"
        assert not any(d.fabric_anomalies() or switch_bw(d) for d in ins), "no fabric diagnosis at ingest"
        (owner,) = fabric
        assert owner.fabric_anomalies() == one.fabric_anomalies()
        assert {k for k, _ in one.fabric_anomalies()} >= {"slow_switch"}, "the tiny cluster's degraded switch"
        assert switch_bw(owner) == switch_bw(one) and switch_bw(one)
        assert owner.total("prism_anomalies_total", job_id="") == one.total("prism_anomalies_total", job_id="")
    finally:
        for d in everyone:
            d.stop()


def _tp8_dp4_in_halves(cluster, in_time_order=False):
    """The tiny cluster's ``tp8-dp4`` flows, which of them stay inside one half of its servers (read alone, those make
    two pieces of the job), and its NICs."""
    servers = dict(zip(cluster.topology["ip"], cluster.topology["server"]))
    ips = set(cluster.jobs[cluster.jobs["job_id"] == "tp8-dp4"]["ip"])
    half = set(sorted({servers[ip] for ip in ips})[:2])
    f = cluster.flows[cluster.flows["src"].astype(str).isin(ips) & cluster.flows["dst"].astype(str).isin(ips)]
    if in_time_order:
        f = f.sort_values("start_ns", kind="stable").reset_index(drop=True)
    side = f["src"].astype(str).map(servers).isin(half).to_numpy()
    return f, side == f["dst"].astype(str).map(servers).isin(half).to_numpy(), ips


def test_a_forced_rerun_of_the_final_window_keeps_it_final(cluster):
    """The input gone quiet, an ingest replica's last window is final (the analyse stage's tail waits for every input
    partition's final mark). Another replica's job membership changing then re-runs that window (``force``): it is
    still the tail of a quiet input, and stays final; a forced window past it (new input) is not."""
    from prism.serve.jobtopic import IngestMonitor

    m = IngestMonitor(Topology.from_frame(cluster.topology), MonitorSettings(**SETTINGS))
    f = cluster.flows.sort_values("start_ns", kind="stable").reset_index(drop=True)
    t0 = int(f["start_ns"].min())
    m.ingest(f[f["start_ns"] < t0 + 6_000_000_000])
    while m.due():
        m.tick()
    assert m.tick(final=True) is not None and m.final and m.analysed_to == m.max_start
    to = m.analysed_to
    assert m.tick(force=True) is not None  # Daemon.run on components_changed
    assert m.final and m.analysed_to == to and not m.pending(), "re-run as a window that is not the tail: no idle flush marks it final again"
    m.ingest(f[f["start_ns"] >= t0 + 6_000_000_000])
    assert m.tick(force=True) is not None and m.analysed_to > to and not m.final


def test_a_job_whose_id_changes_is_sent_again_under_the_new_one(cluster):
    """A job first seen in two pieces (two ids), then whole: its window goes to the new id's owner, the old ids are retired."""
    from prism.serve.jobtopic import AnalyseMonitor, IngestMonitor
    from prism.serve.monitor import MonitorSettings

    topo = Topology.from_frame(cluster.topology)
    f, same_side, ips = _tp8_dp4_in_halves(cluster)
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


def test_a_retired_jobs_hand_over_is_taken_whole_and_waited_for_within_a_bound(cluster):
    """The old id's owner gives up the job's pairs as it retires it; the new id's owner, told to wait for that id's
    state from the re-key's window on, holds only those windows, takes the state once every message of the hand-over
    is in (in any order) and the pairs at the re-key's window (not at an earlier one, however early they are read);
    several namings of old ids add up, a state handed over again as None keeps the first, and the wait is given up
    (counted, with a warning) after its bound of wall time."""
    import pyarrow as pa

    from prism.serve.jobtopic import AnalyseMonitor

    topo = Topology.from_frame(cluster.topology)
    f, same_side, ips = _tp8_dp4_in_halves(cluster)
    settings = MonitorSettings(window_s=8, step_s=1, lateness_s=0)
    a = AnalyseMonitor(topo, settings)
    a.ingest(f[same_side].reset_index(drop=True))
    before = a._pair_keys.copy(), a._pair_first.copy(), a._pair_last.copy()
    keys, first, last = a.retire_job("old", sorted(ips))
    assert len(keys) == len(before[0]) > 2 and len(a._pair_keys) == 0
    assert (keys == before[0]).all() and (first == before[1]).all() and (last == before[2]).all()

    b = AnalyseMonitor(topo, settings)
    now = [0.0]
    b.clock = lambda: now[0]
    at = 5_000
    b.expect_states("new", ["old"], wait_s=30, at=at)
    assert b._awaits_states(at) and b._awaits_states(None) and not b._awaits_states(at - 1), "the windows before the re-key's go on"
    half = len(keys) // 2
    state = {"steps": 7}
    parts = [(k, slice(lo, hi)) for k, (lo, hi) in enumerate([(0, half), (half, len(keys))])]
    for k, cut in reversed(parts):  # the second message read first
        meta = {"job": "new", "from": "old", "replica": "a0", "chunk": k, "chunks": 2, "nics": b.pair_base(), "at": at,
                **({"state": state} if k == 0 else {})}
        b.take_handover(meta, pa.table({"key": keys[cut], "first": first[cut], "last": last[cut]}))
        assert b._awaits_states(at) == (k == 1)
    assert b.handed == {"new": {"old": state}} and b.handovers_missed == 0
    b._add_handed_pairs(at - 1)
    assert len(b._pair_keys) == 0, "not in a window before the re-key's"
    b._add_handed_pairs(at)
    assert (b._pair_keys == keys).all() and (b._pair_first == first).all() and (b._pair_last == last).all() and not b._handed_pairs
    b.note_handed_state("new", "old", None)  # the retire sent again, the job gone at its old owner by then
    assert b.handed == {"new": {"old": state}}
    # two ingest replicas each name one of the old ids: both are waited for
    b.expect_states("merged", ["p1"], wait_s=30, at=at)
    b.expect_states("merged", ["p2"], wait_s=30, at=at + 1)
    b.note_handed_state("merged", "p2", {"steps": 3})
    assert b._awaits_states(at) and b.awaiting["merged"][0] == {"p1"}
    b.note_handed_state("merged", "p1", None)
    assert not b._awaits_states(None)
    # a state that never comes: the window goes on after the bound
    b.expect_states("other", ["gone"], wait_s=30)
    now[0] += 29
    assert b._awaits_states(None)
    now[0] += 2
    assert not b._awaits_states(None) and b.handovers_missed == 1
    # nothing to wait for when the job is here already (a successor holding the job's own published state)
    b.restored["mine"] = {"steps": 3}
    b.expect_states("mine", ["old"], wait_s=30)
    assert not b._awaits_states(None)


def _ingest_stage(topo, settings, tps):
    """A ForwardingSource over an IngestMonitor, wired to :class:`KeptSends` and :class:`HeldPartitions` instead of a broker."""
    from prism.serve.jobtopic import ForwardingSource, IngestMonitor

    src = ForwardingSource.__new__(ForwardingSource)
    src.monitor = IngestMonitor(topo, settings)
    src.producer, src.consumer = KeptSends(), HeldPartitions(tps)
    src.topic, src.job_topic, src.summary_topic, src.group_id, src.replica_id = "flows", "jobs", "sum", "g", "i0"
    src._job_parts, src._inputs, src._unsent, src.positions, src._revoked, src._topic_id, src._stash = [0, 1, 2, 3], 4, {}, {}, set(), None, {}
    return src


def test_each_analyse_window_sees_what_one_daemons_saw_however_much_a_poll_returns(cluster, monkeypatch):
    """Flows that come after the ingest stage's window but started by its end are sent apart, naming that window; an
    analyse replica reading the whole job topic in one poll holds them back until that window is analysed, and says
    what one reading it message by message (as one daemon saw the stream) says. Without the hold it does not."""
    from kafka.structs import TopicPartition

    from prism.ingest.messages import pair_keys
    from prism.serve.jobtopic import LATE_HEADER, AnalyseMonitor

    topo = Topology.from_frame(cluster.topology)
    settings = MonitorSettings(**SETTINGS)  # 3 s windows: the next one reaches back over half of the first only
    f = cluster.flows.sort_values("start_ns", kind="stable").reset_index(drop=True)
    start = f["start_ns"].to_numpy()
    t0 = int(start.min())
    first = start < t0 + 3_200_000_000
    keys = pd.Series(pair_keys(f["src"].astype(str), f["dst"].astype(str)))
    behind = first & keys.isin(keys.drop_duplicates().sort_values().iloc[::4]).to_numpy()
    ing = _ingest_stage(topo, settings, {TopicPartition("flows", p) for p in range(4)})
    m = ing.monitor
    m.ingest(f[first & ~behind].reset_index(drop=True), "flows/0")  # the first 3.2 s but a quarter of the pairs: read behind
    m.backlogged = {"flows/0"}  # behind: the first window strides a whole window (3 s: its jobs' steps are cut)
    m.tick(force=True)
    m.backlogged = set()
    ing.publish()
    end = m.forwarded_to
    m.ingest(f[behind].reset_index(drop=True), "flows/0")
    m.ingest(f[~first & (start < t0 + 6_000_000_000)].reset_index(drop=True), "flows/0")
    m.tick(final=True)
    ing.publish()
    read = as_read(ing.producer.msgs)
    late = [r for _, r in read if dict(r.headers).get(LATE_HEADER)]
    assert late and {int(dict(r.headers)[LATE_HEADER]) for r in late} == {end} and m.late_flows > 0

    ref, got = _read_one_by_one(topo, settings, read), _read_in_one_poll(topo, settings, read)
    assert sum(map(len, _steps(ref).values())) >= 20
    assert got.held_back > 0 and not got._held
    assert _steps(got) == _steps(ref)
    monkeypatch.setattr(AnalyseMonitor, "holds_back", lambda self, after: False)
    assert _steps(_read_in_one_poll(topo, settings, read)) != _steps(ref), "without the hold, the late flows join the window one daemon analysed without them"


def _read_one_by_one(topo, settings, read):
    """An analyse stage given the job topic message by message, analysing every window as soon as it is due: the
    order one daemon saw."""
    src = analyse_stage(topo, settings)
    for tp, r in read:
        src._ingest(src.monitor, src._decode({tp: [r]}))
        while src.monitor.due():
            src.monitor.tick()
    src.monitor.tick(final=True)
    assert src.held_back == 0
    return src


def _read_in_one_poll(topo, settings, read, reverse=False):
    """An analyse stage given the whole job topic in one poll (partition by partition, in the order first read or,
    with ``reverse``, the other way round), then its windows."""
    src = analyse_stage(topo, settings)
    batch: dict = {}
    for tp, r in read:
        batch.setdefault(tp, []).append(r)
    if reverse:
        batch = dict(reversed(batch.items()))
    src._ingest(src.monitor, src._decode(batch))
    while src.monitor.due():
        src.monitor.tick()
        src._ingest(src.monitor, [])
    src.monitor.tick(final=True)
    return src


def _steps(src):
    return {j: list(zip(g["start_ns"], g["end_ns"])) for j, g in src.monitor.steps_frame().groupby("job_id")}


def test_a_job_re_keyed_after_a_window_keeps_that_windows_steps_however_much_a_poll_returns(cluster, monkeypatch):
    """A job seen in pieces in the ingest stage's first window, whole in the next: the whole job's window is sent again
    under its new id and the pieces' ids retired, after the first window's watermark. An analyse replica holding every
    partition that reads it all in one poll analyses the first window with the pieces' flows, as one daemon did and as
    one reading message by message does: the retire and the flows sent again wait for that window, and a retire whose
    new id comes to this replica too wipes nothing. Without the hold, the retire wipes the first window's flows."""
    from kafka.structs import TopicPartition

    from prism.serve.jobtopic import AnalyseMonitor, job_partition

    topo = Topology.from_frame(cluster.topology)
    settings = MonitorSettings(**SETTINGS)
    f, same_side, _ = _tp8_dp4_in_halves(cluster, in_time_order=True)
    start = f["start_ns"].to_numpy()
    first = start < int(start.min()) + 3_200_000_000
    ing = _ingest_stage(topo, settings, {TopicPartition("flows", p) for p in range(4)})
    m = ing.monitor
    m.ingest(f[first & same_side].reset_index(drop=True), "flows/0")  # each half's own pairs first: two pieces
    m.backlogged = {"flows/0"}  # behind: the first window strides a whole window (3 s: its jobs' steps are cut)
    m.tick(force=True)
    m.backlogged = set()
    ing.publish()
    pieces = set(m.jobs_["job_id"])
    m.ingest(f[~same_side | ~first].reset_index(drop=True), "flows/0")
    m.tick(final=True)
    ing.publish()
    (whole,) = set(m.jobs_["job_id"])
    assert len(pieces) == 2 and m.rekeyed == 1
    read = as_read(ing.producer.msgs)
    retires = [r for _, r in read if dict(r.headers).get("prism-control") == b"retire"]
    assert retires and any(job_partition(p, 4) != job_partition(whole, 4) for p in pieces), "an old id on another partition: retired there"
    ref = _read_one_by_one(topo, settings, read)
    first_end = int(ref.monitor.windows[0].end)
    assert any(s <= first_end for steps in _steps(ref).values() for s, _ in steps), "steps of the first window"
    for reverse in (False, True):  # the retire read before the flows sent again, and after them
        got = _read_in_one_poll(topo, settings, read, reverse)
        assert _steps(got) == _steps(ref)
        assert got.held_back > 0 and not got._held
    monkeypatch.setattr(AnalyseMonitor, "holds_back", lambda self, after: False)
    assert _steps(_read_in_one_poll(topo, settings, read)) != _steps(ref), "without the hold, the retire wipes the first window's flows"


def test_a_taken_over_partitions_flows_read_again_are_not_sent_as_late(cluster):
    """A partition taken over is read again from its resume point: its flows up to the next window are not late (the
    analyse stage's event time waited for them), so they are sent unattributed to a window, not held back there."""
    from prism.serve.jobtopic import IngestMonitor

    topo = Topology.from_frame(cluster.topology)
    f = cluster.flows.sort_values("start_ns", kind="stable").reset_index(drop=True)
    start = f["start_ns"].to_numpy()
    t0 = int(start.min())
    first = start < t0 + 3_000_000_000
    m = IngestMonitor(topo, MonitorSettings(**SETTINGS))
    m.ingest(f[first].iloc[::2].reset_index(drop=True), "flows/0")
    m.tick(force=True)
    m.take_forward()
    m.resuming = {"flows/1"}
    m.ingest(f[first].iloc[1::2].reset_index(drop=True), "flows/1")  # read again after a take-over
    m.ingest(f[~first & (start < t0 + 4_000_000_000)].reset_index(drop=True), "flows/0")
    m.tick(final=True)
    assert not m.take_late() and m.late_flows == 0
    again = sum(len(c[0]) for c in m.take_resumed().values())  # sent unattributed to a window: not held back there
    assert again > 0 and again + sum(len(c[0]) for c in m.take_forward()[0].values()) >= first.sum() // 2
    # the same flows from a partition read on (not taken over): late, sent apart
    m = IngestMonitor(topo, MonitorSettings(**SETTINGS))
    m.ingest(f[first].iloc[::2].reset_index(drop=True), "flows/0")
    m.tick(force=True)
    m.ingest(f[first].iloc[1::2].reset_index(drop=True), "flows/1")
    m.ingest(f[~first & (start < t0 + 4_000_000_000)].reset_index(drop=True), "flows/0")
    m.tick(final=True)
    assert sum(len(c[0]) for c in m.take_late().values()) == m.late_flows > 0


def test_a_rejoin_ahead_of_a_window_loses_no_flow_of_a_job_not_yet_seen_whole(cluster):
    """The group drops an ingest replica and takes it back (a poll timeout under load) before a job is seen whole: the
    revocation forwards what was taken into a window past its end, but the flows read are still held for their window
    (the partition's published resume point is before them), so none goes under the id of a piece of the job; the
    next window sees the job whole. Every flow of the job reaches the whole job's owner: those past that window's end
    too (when the revocation sent them under the pieces' ids, and only there, they were lost to the analyse stage: its
    steps then differed from one daemon's)."""
    from kafka.structs import TopicPartition

    from prism.serve.jobtopic import CONTROL_HEADER, job_partition

    topo = Topology.from_frame(cluster.topology)
    f, same_side, _ = _tp8_dp4_in_halves(cluster, in_time_order=True)
    t0 = int(f["start_ns"].min())
    early = (f["start_ns"] < t0 + 3_000_000_000).to_numpy()
    tps = {TopicPartition("flows", p) for p in range(2)}
    src = _ingest_stage(topo, MonitorSettings(**SETTINGS), tps)
    m = src.monitor
    m.ingest(f[early & same_side].reset_index(drop=True), "flows/0")  # one partition read 3 s in: the job in two pieces
    src._on_revoked(tps)  # the listener (on the consumer's IO thread), then the same partitions back
    src._revoked.clear()
    sent_early = {k.decode() for t, k, v, p, h in src.producer.msgs if t == "jobs" and k and CONTROL_HEADER not in h}
    assert not sent_early and m.pending(), "held for their window: nothing under a piece's id"
    m.ingest(f[early & ~same_side].reset_index(drop=True), "flows/1")  # the other partition: the job whole
    assert m.tick() is not None and m.forwarded_to < t0 + 3_000_000_000, "a window, ending before the flows read"
    src.publish()
    m.ingest(f[~early].reset_index(drop=True), "flows/0")
    m.tick(final=True)
    src.publish()
    # what reaches the whole job's owner: the flow messages on its partition (a piece's id on that partition is not
    # retired: its flows are there already); a piece's id on another partition is retired
    (whole,) = set(m.jobs_["job_id"])
    p = job_partition(whole, 4)
    got, retired = set(), set()
    for topic, key, value, part, h in src.producer.msgs:
        if topic == "jobs" and h.get(CONTROL_HEADER) == b"retire":
            retired.add(key.decode())
        elif topic == "jobs" and part == p and CONTROL_HEADER not in h:
            t = pa_ipc_table(value)
            got.update(zip(t["start_ns"].tolist(), t["src"].tolist(), t["dst"].tolist()))
    assert not retired, "no piece's id was sent: none to retire"
    want = set(zip(f["start_ns"].tolist(), f["src"].astype(str).tolist(), f["dst"].astype(str).tolist()))
    assert len(got) == len(want) and got == want


def pa_ipc_table(value):
    import pyarrow as pa

    return pa.ipc.open_stream(value).read_all().to_pandas()


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
        want, got = one.steps(), successor.steps()
        same, why = _same_steps({j: got.get(j, []) for j in want}, want)
        assert same, why
        for job_id in one.steps():
            assert successor.series("prism_steps_total")[job_id] == one.series("prism_steps_total")[job_id]
        # each anomaly reported once, by one of the two; the fabric's too (its state goes with the jobs')
        assert sorted(first.job_anomalies() + successor.job_anomalies()) == one.job_anomalies()
        assert sorted(first.fabric_anomalies() + successor.fabric_anomalies()) == one.fabric_anomalies()
        assert successor.total("prism_anomalies_total", job_id="") == one.total("prism_anomalies_total", job_id="")
        # the successor replayed from the committed offsets (a window back), not from the start; it took the published states
        assert 0 < m.flows_received < ing.monitor.flows_forwarded
        # (so the steps before its first flow, equal above, are the published history)
        assert not m.restored and all(s[0][0] < m.min_start for s in successor.steps().values())
    finally:
        for d in everyone:
            d.stop()


def _one_ingest_two_analyse(broker, cluster, tap):
    """One daemon, one ingest and two analyse replicas (4 job-topic partitions, 4,096 steps of history) run over the
    cluster's flows, produced in time order once every group has settled; ``tap(key, value, headers)`` sees each message
    the ingest replica sends to the job topic. Returns the daemons (stop them)."""
    topic = f"flows-{uuid.uuid4().hex[:8]}"
    ensure_topic(broker.bootstrap, topic, 4)
    jobs_topic = f"jobs-{topic}"
    settings = dict(step_history=4096)
    one = Running(broker, cluster, "all", topic, f"one-{topic}", "one", jobs_topic, **settings)
    ins = [Running(broker, cluster, "ingest", topic, f"g-{topic}", "i0", jobs_topic, **settings)]
    ans = [Running(broker, cluster, "analyse", topic, f"g-{topic}", f"a{k}", jobs_topic, **settings) for k in range(2)]
    send = ins[0].source.producer.send

    def tapped(topic, key=None, value=None, partition=None, headers=None):
        if topic == jobs_topic:
            tap(key, value, dict(headers or ()))
        return send(topic, key=key, value=value, partition=partition, headers=headers)

    ins[0].source.producer.send = tapped
    try:
        _settle(one, ins, ans)
        n = produce_as_ordered(broker, topic, cluster.flows.sort_values("start_ns", kind="stable").reset_index(drop=True))
        _wait_done(one, ins, ans, n)
    except BaseException:
        for d in (one, *ins, *ans):
            d.stop()
        raise
    return one, ins, ans


@pytest.fixture(scope="module")
def restart_cluster():
    """24 s of two DP 2 jobs (TP 8, two servers each) on eight servers: job ``r`` stops mid-step 5 s in, is silent for
    14 s and restarts with its first server replaced by a spare (srv0001 > srv0000), then runs a slow step (2x, step
    200); job ``s`` runs throughout (128,640 flows). With four job-topic partitions and two analyse replicas, ``r``'s
    ids before and after the restart (its old servers; with the spare) are different replicas' (partitions 1 and 3),
    and ``s`` is on the second."""
    from synthetic import ClusterGenerator, Fabric, JobSpec, Restart, SlowStep

    mib = 1 << 20
    jobs = [JobSpec(name, tp=8, pp=1, dp=2, microbatches=2, fwd_ms=5, grad_bytes=32 * mib, bucket_bytes=16 * mib) for name in ("r", "s")]
    return ClusterGenerator(Fabric(servers=8, servers_per_group=8, spines=2), jobs, duration_s=24.0, seed=4, storage_flows_per_s=0,
                            faults=[Restart("r", after_s=5.0, outage_s=14.0, replaced_server=0), SlowStep("r", step=200, factor=2.0)]).generate()


def test_a_job_restarted_on_a_spare_keeps_its_key_and_its_history(broker, restart_cluster):
    """A job restarted with a spare server in place of a broken one is the same job: one daemon keeps it under its old
    id, and the ingest stage keys the job topic by that id too (the one rule of Monitor._stable_ids), so its flows stay
    on one partition, with one analyse replica, its step history and its anomaly state. The stages' steps (to the
    nanosecond, numbered on through the restart) and anomalies (the slow step after the restart, by its number in the
    whole run) are one daemon's. Before, the ingest stage re-keyed the job to the id of its old servers and the spare
    (a retire of the old id): another replica's, where its steps were numbered from 0 again."""
    from prism.analysis.jobs import job_id_for
    from prism.serve.jobtopic import CONTROL_HEADER, job_partition

    cluster = restart_cluster
    f = cluster.faults.set_index("kind")
    old_server, spare = f.loc["restart", "subject"].split(">")
    servers = dict(zip(cluster.topology["ip"], cluster.topology["server"]))
    before = set(cluster.meta["jobs"]["r"]["servers"])
    was, grown = job_id_for(before), job_id_for(before | {spare})
    # the case: the two ids on job-topic partitions of different analyse replicas (two replicas, range assignment)
    assert job_partition(was, 4) // 2 != job_partition(grown, 4) // 2
    sent = []  # the job topic's messages of the restarted job: (key, control kind or None, the servers of its flows)

    def keep(key, value, headers):
        if key not in (None, b""):
            kind = headers.get(CONTROL_HEADER)
            flows = pa_ipc_table(value) if kind is None else None
            srv = set() if flows is None else {servers[ip] for ip in flows["src"].tolist()}
            if kind == b"retire" or srv & (before | {spare}):
                sent.append((key.decode(), kind, srv))

    one, ins, ans = _one_ingest_two_analyse(broker, cluster, keep)
    everyone = [one, *ins, *ans]
    try:
        # one daemon keeps the job under the id of its old servers, its steps numbered on through the restart
        assert was in one.series("prism_job_info") and grown not in one.series("prism_job_info")
        restart_end = int(f.loc["restart", "end_ns"])
        steps = one.monitor.steps_frame().query("job_id == @was")
        assert (steps["start_ns"] < restart_end).sum() > 100 and (steps["start_ns"] > restart_end).sum() > 100
        assert (steps["step"].diff().dropna() == 1).all()
        assert ("slow_step", was) in {(k, j) for k, j, _, _ in one.job_anomalies()}, "the slow step after the restart"
        # the ingest stage sent the job's flows, the spare's among them, under that id only, and retired nothing
        assert sent and {k for k, kind, _ in sent} == {was} and not any(kind for _, kind, _ in sent), sorted({(k, str(kind)) for k, kind, _ in sent})
        assert any(spare in srv for _, _, srv in sent) and any(old_server in srv for _, _, srv in sent)
        # one analyse replica holds it, the one of its partition, and has its whole history: one daemon's steps and anomalies
        (owner,) = [d for d in ans if was in d.series("prism_job_info")]
        assert job_partition(was, 4) in owner.monitor.owned
        assert set().union(*(d.series("prism_job_info") for d in ans)) == set(one.series("prism_job_info"))
        for job_id, s in one.steps().items():
            (d,) = [d for d in ans if job_id in d.series("prism_job_info")]
            assert d.steps()[job_id] == s, job_id
            assert d.series("prism_steps_total")[job_id] == one.series("prism_steps_total")[job_id]
        assert sorted(a for d in ans for a in d.job_anomalies()) == one.job_anomalies()
        print("restarted job", was, "steps", len(steps), "anomalies", one.job_anomalies(), "messages under its key", len(sent))
    finally:
        for d in everyone:
            d.stop()


@pytest.fixture(scope="module")
def regrown_cluster():
    """The restart cluster's jobs with a 1 s outage: shorter than the hang diagnosis's least silence (8 s), so the
    restarted job is one that grew (its old servers and the spare): one daemon renames it ~6 s in, its steps numbered
    on. The two ids are on job-topic partitions 1 and 3: different analyse replicas' of two."""
    from synthetic import ClusterGenerator, Fabric, JobSpec, Restart, SlowStep

    mib = 1 << 20
    jobs = [JobSpec(name, tp=8, pp=1, dp=2, microbatches=2, fwd_ms=5, grad_bytes=32 * mib, bucket_bytes=16 * mib) for name in ("r", "s")]
    return ClusterGenerator(Fabric(servers=8, servers_per_group=8, spines=2), jobs, duration_s=24.0, seed=4, storage_flows_per_s=0,
                            faults=[Restart("r", after_s=5.0, outage_s=1.0, replaced_server=0), SlowStep("r", step=200, factor=2.0)]).generate()


def test_a_job_re_keyed_to_another_replica_keeps_its_history(broker, regrown_cluster):
    """A job that grew long after its first window (restarted on a spare after a short outage: one daemon renames it
    and gives the new id the old one's state) is re-keyed on the job topic to an id another analyse replica owns. The
    ingest stage tells the new owner which old ids to wait for, the old owner hands the job's state over when it
    retires the old id, and the new owner takes it before its next window: one daemon's steps (to the nanosecond,
    numbered on through the re-key, none reported twice) and anomalies. Before, the new owner numbered the job's
    steps from 0 again, over the 3 s its window held, and lost the rest."""
    from prism.analysis.jobs import job_id_for
    from prism.serve.jobtopic import CONTROL_HEADER, job_partition

    cluster = regrown_cluster
    f = cluster.faults.set_index("kind")
    _, spare = f.loc["restart", "subject"].split(">")
    before = set(cluster.meta["jobs"]["r"]["servers"])
    was, grown = job_id_for(before), job_id_for(before | {spare})
    assert job_partition(was, 4) // 2 != job_partition(grown, 4) // 2, "the two ids on different analyse replicas"
    controls = []

    def keep(key, value, headers):
        kind = headers.get(CONTROL_HEADER)
        if kind in (b"retire", b"rekey"):
            controls.append((kind.decode(), key.decode(), json.loads(value)))

    one, ins, ans = _one_ingest_two_analyse(broker, cluster, keep)
    everyone = [one, *ins, *ans]
    try:
        # one daemon renames the job once the spare is seen, its steps numbered on from the first
        assert grown in one.series("prism_job_info") and was not in one.series("prism_job_info")
        steps = one.monitor.steps_frame().query("job_id == @grown")
        t0 = int(cluster.flows["start_ns"].min())
        assert steps["step"].tolist() == list(range(len(steps))) and int(steps["start_ns"].min()) - t0 < 1_000_000_000
        # the ingest stage re-keyed it: the new owner told to wait for the old id, the old id retired
        rekeys = [v for k, key, v in controls if k == "rekey" and key == grown]
        assert rekeys and all(v["from"] == [was] and v["replica"] == "i0" for v in rekeys)
        (retire,) = [v for k, _, v in controls if k == "retire" and v["job"] == was]
        assert {v["at"] for v in rekeys} == {retire["at"]} and retire["at"] is not None, "the window the new id starts at"
        assert any(k == "retire" and v["job"] == was and v["into"] == grown for k, _, v in controls)
        # every job from one replica, with one daemon's steps, step counts and anomalies
        assert set().union(*(d.series("prism_job_info") for d in ans)) == set(one.series("prism_job_info"))
        for job_id, s in one.steps().items():
            (d,) = [d for d in ans if job_id in d.series("prism_job_info")]
            same, why = _same_steps({job_id: d.steps()[job_id]}, {job_id: s})
            assert same, why
            assert d.series("prism_steps_total")[job_id] == one.series("prism_steps_total")[job_id]
        assert sorted(a for d in ans for a in d.job_anomalies()) == one.job_anomalies()
        assert ("slow_step", grown) in {(k, j) for k, j, _, _ in one.job_anomalies()}, "the slow step after the re-key"
        # by the old owner's state, handed over
        (old_owner,) = [d for d in ans if job_partition(was, 4) in d.monitor.owned]
        (owner,) = [d for d in ans if grown in d.series("prism_job_info")]
        assert owner is not old_owner and old_owner.source.handovers_sent == 1 and owner.monitor.handovers_taken == 1
        assert owner.monitor.handovers_missed == 0 and not owner.monitor.awaiting
        assert owner.total("prism_job_handovers_total", outcome="taken") == 1 and owner.total("prism_job_handovers_total", outcome="missed") == 0
        assert old_owner.total("prism_job_handovers_out_total", outcome="sent") == 1
        assert old_owner.total("prism_job_handovers_out_total", outcome="failed") == 0
        assert not one.total("prism_job_handovers_total") and not one.total("prism_job_handovers_out_total"), "the analyse stage's alone"
        print("re-keyed job", was, ">", grown, "steps", len(steps), "anomalies", one.job_anomalies())
    finally:
        for d in everyone:
            d.stop()


def test_a_rejoin_after_a_restart_on_a_spare_labels_the_job_with_its_old_id(restart_cluster):
    """The group drops the ingest replica and takes it back (a poll timeout under load) once the restarted job's first
    flows, the spare's among them, have been read but no window has reached them: they are still held for their window
    (the revocation sends none of them, under no id), the next window labels them with the job's old id (the silence
    ends at the first flows read past the last window), and one daemon fed alike keeps that id. (When a revocation
    sent what was read past the last window, it labelled them with the id of the old servers and the spare, a label of
    its own as the silence had not ended by the last window, and the next window re-keyed them back.)"""
    from kafka.structs import TopicPartition

    from prism.analysis.jobs import job_id_for
    from prism.serve.jobtopic import CONTROL_HEADER
    from prism.serve.monitor import Monitor

    cluster = restart_cluster
    topo = Topology.from_frame(cluster.topology)
    f = cluster.faults.set_index("kind")
    _, spare = f.loc["restart", "subject"].split(">")
    was = job_id_for(set(cluster.meta["jobs"]["r"]["servers"]))
    flows = cluster.flows.sort_values("start_ns", kind="stable").reset_index(drop=True)
    back = int(f.loc["restart", "end_ns"])
    tps = {TopicPartition("flows", p) for p in range(4)}
    src = _ingest_stage(topo, MonitorSettings(**SETTINGS), tps)
    m, one = src.monitor, Monitor(topo, MonitorSettings(**SETTINGS))
    t0 = int(flows["start_ns"].min())
    for lo in range(t0, back, 500_000_000):  # every half second up to the restart: windows through the silence
        part = flows[(flows["start_ns"] >= lo) & (flows["start_ns"] < min(lo + 500_000_000, back))].reset_index(drop=True)
        for d in (m, one):
            d.ingest(part, "flows/0")
            while d.tick() is not None:
                pass
        src.publish()
    assert m.forwarded_to < back
    first = flows[(flows["start_ns"] >= back) & (flows["start_ns"] < back + 200_000_000)].reset_index(drop=True)
    m.ingest(first, "flows/0")  # the restart's first flows, read past the last window
    src.producer.msgs.clear()
    src._on_revoked(tps)
    src._revoked.clear()
    servers = dict(zip(cluster.topology["ip"], cluster.topology["server"]))
    sent = {(k.decode(), h.get(CONTROL_HEADER)) for t, k, v, p, h in src.producer.msgs if t == "jobs" and k
            and (h.get(CONTROL_HEADER) == b"retire" or CONTROL_HEADER not in h and spare in {servers[ip] for ip in pa_ipc_table(v)["src"]})}
    assert not sent and m.pending(), sent
    rest = flows[flows["start_ns"] >= back].reset_index(drop=True)
    for d in (m, one):
        d.ingest(rest, "flows/0")
        d.tick(final=True)
    src.publish()
    assert not [k for t, k, v, p, h in src.producer.msgs if h.get(CONTROL_HEADER) == b"retire"], "no re-key"
    assert was in set(m.jobs_["job_id"]) and was in one.view.jobs and m.rekeyed == 0


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


def _settle(one, ins, ans, job_parts=4):
    """Every replica holds its share of the partitions: the input topic's 4 (the single daemon and the ingest stage),
    the job topic's ``job_parts`` (the analyse stage)."""
    wait_for(lambda: _split([one]) and _split(ins) and _split(ans, job_parts), 180, "the groups to settle")


def _wait_done(one, ins, ans, n):
    """Every record in and every window out: the single daemon, the ingest replicas (final), the analyse replicas (final)."""
    everyone = [one, *ins, *ans]

    def progress():
        return [d.monitor.analysed_to for d in everyone]

    def done(d):
        m = d.monitor
        return m.max_start is not None and m.analysed_to is not None and m.analysed_to >= m.max_start

    def ingested(ds):
        return sum(sum(c.get("ingested", 0) for c in d.monitor.counters_snapshot().values()) for d in ds)

    wait_for(lambda: done(one) and ingested([one]) == n, 180, "the single daemon", progress=progress)
    wait_for(lambda: ingested(ins) == n and all(done(d) and d.monitor.final for d in ins), 180, "the ingest replicas", progress=progress)
    last = min(d.monitor.analysed_to for d in ins)
    wait_for(lambda: all(d.monitor.all_final() and d.monitor.analysed_to is not None and d.monitor.analysed_to >= d.monitor.complete_to() >= last
                         for d in ans), 180, "the analyse replicas", progress=progress)
    # the loop hands the incomplete windows to /readyz after each window, and its events (the fabric's anomalies among
    # them) after publishing it: the last window's too
    wait_for(lambda: all(d.service.health.incomplete_windows == d.monitor.recent_incomplete() for d in everyone), 60, "/readyz")
    wait_for(lambda: all(len(d.fabric_anomalies()) >= sum(d.monitor.fabric_anomalies.values()) for d in (one, *ans)), 60, "the last events")


class Recorder:
    """What a monitor was given, in order: each batch (with the partitions the source said were behind) and each
    window asked for (with the end it reached), to give one plain daemon's monitor exactly the same input."""

    def __init__(self, m):
        self.calls = []
        ingest, tick = m.ingest, m.tick

        # the wall clock of the idle rules (Monitor.watermark) is an input too: each call sees one instant, recorded
        def frozen(call, *args):
            now = time.monotonic()
            m.clock = lambda: now
            try:
                return now, call(*args)
            finally:
                m.clock = time.monotonic

        def on_ingest(flows, partition="0"):
            backlogged = set(m.backlogged)
            now, out = frozen(ingest, flows, partition)
            self.calls.append(("ingest", flows, partition, backlogged, now))
            return out

        def on_tick(final=False, force=False):
            backlogged = set(m.backlogged)  # whether the source is behind sets a window's stride (Monitor.catching_up)
            now, view = frozen(tick, final, force)
            self.calls.append(("tick", final, force, None if view is None else m.analysed_to, backlogged, now))
            return view

        m.ingest, m.tick = on_ingest, on_tick

    def replay(self, cluster):
        """A plain daemon's monitor (``--role all``) given the same batches and windows: it, and its events."""
        from prism.serve.monitor import Monitor

        ref = Monitor(Topology.from_frame(cluster.topology), MonitorSettings(**SETTINGS))
        events = []
        for call in self.calls:
            ref.clock = (lambda now: lambda: now)(call[-1])
            if call[0] == "ingest":
                ref.backlogged = call[3]
                ref.ingest(call[1], call[2])
            else:
                ref.backlogged = call[4]
                view = ref.tick(final=call[1], force=call[2])
                assert (None if view is None else ref.analysed_to) == call[3], "the same window"
                events.extend(ref.events)
                ref.events.clear()
        return ref, events


def test_incomplete_windows_are_flagged_to_the_analyse_stage(broker, cluster, caplog):
    """A backlog sent pair by pair (each partition out of time order by the whole 8 s; the lateness cap 1.5 s): the ingest
    stage flags the windows it cannot fill to the analyse stage with its watermarks, and the analyse replicas analyse none
    of them, log and count them and say degraded, as one daemon does. One daemon given the stream as the ingest replica
    read it says exactly what the stages say: the same late counts, windows incomplete, (no) anomalies and steps. (Two
    processes reading the same topic do not read it alike: which records come late depends on how far the other
    partitions had been read, so the live single daemon beside them is held to the truth, not to their counts.)"""
    topic = f"flows-{uuid.uuid4().hex[:8]}"
    ensure_topic(broker.bootstrap, topic, 4)
    jobs_topic = f"jobs-{topic}"
    one = Running(broker, cluster, "all", topic, f"one-{topic}", "one", jobs_topic)
    ins = [Running(broker, cluster, "ingest", topic, f"g-{topic}", "i0", jobs_topic)]
    ans = [Running(broker, cluster, "analyse", topic, f"g-{topic}", f"a{k}", jobs_topic) for k in range(2)]
    everyone = [one, *ins, *ans]
    rec = Recorder(ins[0].monitor)
    try:
        _settle(one, ins, ans)
        with caplog.at_level(logging.WARNING, logger="prism.monitor"):
            n = produce_as_ordered(broker, topic, pair_by_pair(cluster.flows))
            _wait_done(one, ins, ans, n)
        # the single daemon found windows it could not fill; so did the ingest stage. Which ones, and how many late
        # flows were dropped rather than kept, depends on how far the other partitions had been read when each record
        # came (for one daemon as for the ingest stage): each counts every record once
        assert one.monitor.windows_incomplete >= 1 and sum(d.monitor.windows_incomplete for d in ins) >= 1
        for d in (one, *ins):
            ingested, windowed = d.total("prism_flows_ingested_total"), d.total("prism_flows_windowed_total")
            assert ingested == n and windowed + d.total("prism_flows_ignored_total") == ingested
            assert d.total("prism_flows_ignored_total", reason="late") <= d.total("prism_window_late_flows_total") == d.monitor.late_flows > 0
        (ing,) = ins
        print("late flows: one", one.total("prism_window_late_flows_total"), "ingest", ing.total("prism_window_late_flows_total"),
              "dropped: one", one.total("prism_flows_ignored_total", reason="late"), "ingest", ing.total("prism_flows_ignored_total", reason="late"),
              "windows incomplete/analysed: one", (one.monitor.windows_incomplete, one.monitor.view.ticks),
              "ingest", (ing.monitor.windows_incomplete, ing.monitor.view.ticks),
              "analyse", [(d.monitor.windows_incomplete, d.monitor.view.ticks) for d in ans])
        # the analyse replicas cut their windows at the ingest stage's window ends and take its word on each: a window
        # ending where an ingest window ended is incomplete exactly when that one is (before or after it was analysed),
        # with its late flows (those known when it turned incomplete); the first window of a replica also answers for
        # the ingest windows before it
        theirs = {w.end: w for w in ing.monitor.windows}
        for d in ans:
            m = d.monitor
            mine = list(m.windows)
            assert mine and all(w.end in theirs for w in mine[:-1]), "windows at the ingest stage's ends"
            for w in mine[1:]:
                if w.end in theirs:
                    assert w.incomplete == theirs[w.end].incomplete and w.late <= theirs[w.end].late, (w, theirs[w.end])
            assert m.windows_incomplete == sum(w.incomplete for w in mine) >= 1
            assert d.total("prism_windows_incomplete_total") == m.windows_incomplete
            assert d.total("prism_window_late_flows_total") == 0  # late flows are the ingest stage's count
            status, body = d.readyz()
            assert status == 200 and "incomplete (late input)" in body, body
            assert not any(d.from_incomplete), "an event from a window known incomplete"
        # logged as one daemon logs them: before the window (naming the ingest replica's reason), or after it
        warned = [r for r in caplog.records if r.name == "prism.jobtopic" and (
            r.getMessage().startswith("window incomplete (late input)") and "ingest replica i0" in r.getMessage()
            or r.getMessage().startswith("window analysed before GPU flows of its time came"))]
        assert warned and all(set(r.fields) >= {"from", "to", "late_flows"} for r in warned)  # type: ignore[attr-defined]
        # one plain daemon given the stream as the ingest replica read it (the same batches, the same windows): the same
        # late counts, the same windows incomplete, the same anomalies and steps as the two stages
        ref, events = rec.replay(cluster)
        assert (ref.late_flows, ref.windows_incomplete) == (ing.monitor.late_flows, ing.monitor.windows_incomplete)
        assert sum(c.get("ignored:late", 0) for c in ref.counters_snapshot().values()) == ing.total("prism_flows_ignored_total", reason="late")
        assert [(w.end, w.incomplete) for w in ref.windows] == [(w.end, w.incomplete) for w in ing.monitor.windows]
        ref_anomalies = sorted((e["kind"], e["job_id"], str(e["subject"]), int(e["step"])) for k, e in events
                               if k == "anomaly" and isinstance(e.get("job_id"), str) and e["job_id"])
        assert sorted(a for d in ans for a in d.job_anomalies()) == ref_anomalies
        ref_steps = {j: list(zip(g["start_ns"], g["end_ns"])) for j, g in ref.steps_frame().groupby("job_id")}
        assert {j: s for d in ans for j, s in d.steps().items()} == ref_steps
        print("one daemon on the ingest replica's reads: windows incomplete", [(w.end, w.incomplete) for w in ref.windows],
              "anomalies", ref_anomalies, "steps", sum(map(len, ref_steps.values())))
        # and every anomaly, of the live single daemon and of the stages, true; every step reported a true one
        for d in (one, *ans):
            names = job_name_map(d.monitor.jobs_, cluster.jobs)
            anomalies = pd.DataFrame([e for k, e in d.events if k == "anomaly"], columns=ANOMALY_COLUMNS)
            _, judged = score_anomalies(anomalies, cluster.faults, names, cluster.steps)
            assert judged["matched"].all(), judged
            steps = d.monitor.steps_frame()
            if len(steps):
                assert score_steps(steps, cluster.steps, names)["spurious"].sum() == 0
    finally:
        for d in everyone:
            d.stop()


def _summary_records(broker, topic):
    """Every record of the summaries topic, in order: (key, value or None for a tombstone)."""
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, auto_offset_reset="earliest", group_id=None)
    try:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        c.seek_to_beginning(tp)
        end = c.end_offsets([tp])[tp]
        out = []
        wait_for(lambda: out.extend((r.key.decode(), r.value) for recs in c.poll(timeout_ms=200).values() for r in recs) or c.position(tp) >= end,
                 60, "the summaries topic read")
        return out
    finally:
        c.close()


def test_a_retired_jobs_state_is_deleted(broker, cluster):
    """A job that ends (its pairs unseen for --jobs.ttl) has its state record deleted (a tombstone), once no successor
    could replay its flows; a successor recovering the partitions' states takes the others' and not it."""
    from prism.analysis.jobs import job_id_for
    from prism.serve.jobtopic import FABRIC_KEY

    topic = f"flows-{uuid.uuid4().hex[:8]}"
    ensure_topic(broker.bootstrap, topic, 4)
    jobs_topic = f"jobs-{topic}"
    ttl = dict(pair_ttl_s=1.0)
    ing = Running(broker, cluster, "ingest", topic, f"g-{topic}", "i0", jobs_topic, **ttl)
    first = Running(broker, cluster, "analyse", topic, f"g-{topic}", "a0", jobs_topic, **ttl)
    everyone = [ing, first]
    try:
        wait_for(lambda: all(len(d.source.consumer.assignment()) == 4 for d in everyone), 180, "the groups to settle")
        flows = cluster.flows
        t0 = int(flows["start_ns"].min())
        servers = dict(zip(cluster.topology["ip"], cluster.topology["server"]))
        job = cluster.jobs[cluster.jobs["job_id"] == "tp8-dp4"]
        ended = job_id_for({servers[ip] for ip in job["ip"]})
        ips = set(job["ip"])
        of_job = flows["src"].astype(str).isin(ips) & flows["dst"].astype(str).isin(ips)
        flows = flows[~(of_job & (flows["start_ns"] >= t0 + 3_000_000_000))]  # the job stops after 3 s of the 8
        p = FlowProducer(broker.bootstrap, topic, fmt="arrow")
        for k in range(8):  # a second at a time, each once the ingest replica has forwarded up to the one before: a window a
            # second (a backlog's one window over all 8 s would find the stopped job's pairs expired, and forward none of it)
            lo, hi = t0 + k * 1_000_000_000, t0 + (k + 1) * 1_000_000_000
            wait_for(lambda hi=hi: (ing.monitor.forwarded_to or t0) >= hi - 2_000_000_000, 120, "the ingest replica's windows",
                     progress=lambda: ing.monitor.forwarded_to)
            stream_flows(p, flows[(flows["start_ns"] >= lo) & (flows["start_ns"] < hi)], speed=0)
            p.flush()
        p.close()
        m = first.monitor
        # the whole stream in and out (the input goes quiet between the seconds above: a final window then is not the last)
        wait_for(lambda: sum(c.get("ingested", 0) for c in ing.monitor.counters_snapshot().values()) == len(flows) and ing.monitor.final
                 and ing.monitor.analysed_to >= ing.monitor.max_start, 180, "the ingest replica", progress=lambda: ing.monitor.analysed_to)
        wait_for(lambda: m.all_final() and m.analysed_to is not None and m.analysed_to >= m.complete_to() >= ing.monitor.analysed_to, 180,
                 "the analyse replica", progress=lambda: (ing.monitor.analysed_to, m.analysed_to))
        wait_for(lambda: m.tombstones >= 1, 60, "the ended job's tombstone")
        first.stop()
        last = {}
        had_state = set()
        for key, value in _summary_records(broker, f"sum-{topic}"):
            if key.startswith(f"jobstate/g-{topic}-analyse/"):
                last[key.rsplit("/", 1)[1]] = value
                if value is not None:
                    had_state.add(key.rsplit("/", 1)[1])
        assert ended in had_state and last[ended] is None, "the ended job's state, then its tombstone"
        live = {j for j, v in last.items() if v is not None and j != FABRIC_KEY}  # the fabric's state beside the jobs'
        assert last.get(FABRIC_KEY) is not None
        assert len(live) == cluster.jobs["job_id"].nunique() - 1 and m.tombstones == 1
        steps = {j: first.series("prism_steps_total").get(j) for j in live}
        # a successor takes the live jobs' states and not the ended one's
        successor = Running(broker, cluster, "analyse", topic, f"g-{topic}", "a1", jobs_topic, **ttl)
        everyone.append(successor)
        s = successor.monitor
        wait_for(lambda: s.all_final() and s.analysed_to is not None and s.analysed_to >= s.complete_to(), 180, "the successor",
                 progress=lambda: s.analysed_to)
        assert ended not in s.restored and ended not in successor.series("prism_job_info")
        assert {j: successor.series("prism_steps_total").get(j) for j in live} == steps
    finally:
        for d in everyone:
            d.stop()


def _ingest_process(broker, topic, jobs_topic, topology_csv, port, replica):
    """``prism daemon --role ingest`` as its own process, with the in-process replicas' settings."""
    cmd = [sys.executable, "-m", "prism", "daemon", "--role", "ingest", "--topology", str(topology_csv), "--kafka.bootstrap-servers",
           broker.bootstrap, "--kafka.topic", topic, "--kafka.group-id", f"g-{topic}", "--kafka.summary-topic", f"sum-{topic}",
           "--kafka.replica-id", replica, "--kafka.job-topic", jobs_topic, "--kafka.job-topic-partitions", "4",
           "--kafka.max-poll-interval", "3s", "--kafka.session-timeout", "3s", "--web.listen-address", f"127.0.0.1:{port}",
           "--window", "3s", "--window.step", "1s", "--window.lateness", "100ms", "--switch.window", "2s", "--log.level", "warning"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_an_ingest_replica_killed_mid_stream_loses_nothing(broker, cluster, tmp_path):
    """An ingest replica (a ``prism daemon --role ingest`` process) is killed with SIGKILL after a window, holding flows
    it read past that window's end (the lateness wait); the other ingest replica takes its partitions over, reads them
    again from where everything before had been forwarded, and counts them once. Every GPU flow reaches the analyse
    stage, the input is counted exactly once, and the steps and anomalies are one daemon's."""
    topic = f"flows-{uuid.uuid4().hex[:8]}"
    ensure_topic(broker.bootstrap, topic, 4)
    jobs_topic = f"jobs-{topic}"
    topology_csv = tmp_path / "topology.csv"
    cluster.topology.to_csv(topology_csv, index=False)
    one = Running(broker, cluster, "all", topic, f"one-{topic}", "one", jobs_topic)
    an = Running(broker, cluster, "analyse", topic, f"g-{topic}", "a0", jobs_topic)
    received = set()  # every flow the analyse stage was given, re-deliveries once
    ingest = an.monitor.ingest

    def on_ingest(flows, partition="0"):
        received.update(zip(flows["start_ns"].tolist(), flows["src"].astype(str).tolist(), flows["dst"].astype(str).tolist(),
                            flows["size"].tolist()))
        return ingest(flows, partition)

    an.monitor.ingest = on_ingest
    port = free_port()
    victim = _ingest_process(broker, topic, jobs_topic, topology_csv, port, "i1")
    survivor = Running(broker, cluster, "ingest", topic, f"g-{topic}", "i0", jobs_topic)
    everyone = [one, an, survivor]
    try:
        wait_for(lambda: len(one.source.consumer.assignment()) == 4 and len(an.source.consumer.assignment()) == 4
                 and len(survivor.source.consumer.assignment()) == 2 and scrape_total(port, "prism_ready") == 1, 180, "the groups to settle")
        flows = cluster.flows.sort_values("start_ns", kind="stable").reset_index(drop=True)
        t0 = int(flows["start_ns"].min())
        cut = t0 + 5_500_000_000
        first = flows[flows["start_ns"] < cut]
        p = FlowProducer(broker.bootstrap, topic, fmt="arrow")

        def victim_to():
            return (scrape_total(port, "prism_analysed_until_timestamp_seconds") or 0) * 1e9

        def windows():
            return scrape_total(port, "prism_windows_total") or 0

        # in two parts, the second once the victim has a window past 2.5 s; at its first window after the second
        # (a step past the last, short of the part's end by the lateness wait; the tail it sends only once the input
        # has been quiet for 3 s), it is killed: it has read flows it has not sent
        stream_flows(p, first[first["start_ns"] < t0 + 3_500_000_000], speed=0)
        p.flush()
        wait_for(lambda: victim_to() >= t0 + 2_500_000_000, 120, "the victim's windows", progress=victim_to)
        before = windows()
        stream_flows(p, first[first["start_ns"] >= t0 + 3_500_000_000], speed=0)
        p.flush()
        wait_for(lambda: windows() > before, 120, "the victim's window after the second part", progress=victim_to)
        read, at = scrape_total(port, "prism_flows_ingested_total"), victim_to()
        victim.send_signal(signal.SIGKILL)
        assert at < cut - 50_000_000, "killed after its tail was sent: the case is not exercised"
        victim.wait(timeout=10)
        wait_for(lambda: len(survivor.source.consumer.assignment()) == 4, 60, "the survivor to take the partitions over")
        stream_flows(p, flows[flows["start_ns"] >= cut], speed=0)
        p.flush()
        p.close()
        n = len(flows)

        def progress():
            return [d.monitor.analysed_to for d in everyone]

        def ingested(d):
            return sum(c.get("ingested", 0) for c in d.monitor.counters_snapshot().values())

        wait_for(lambda: one.monitor.analysed_to is not None and one.monitor.analysed_to >= one.monitor.max_start and ingested(one) == n, 180,
                 "the single daemon", progress=progress)
        wait_for(lambda: ingested(survivor) >= n and survivor.monitor.final and survivor.monitor.analysed_to >= survivor.monitor.max_start, 180,
                 "the survivor", progress=progress)
        m = an.monitor
        wait_for(lambda: m.all_final() and m.analysed_to is not None and m.analysed_to >= m.complete_to() >= survivor.monitor.analysed_to, 180,
                 "the analyse replica", progress=progress)
        # the input counted once: the survivor's counts (its partitions', and the victim's taken from what it published,
        # then read again from there) are the stream's, record for record
        c = survivor.monitor.counters_snapshot()
        assert ingested(survivor) == n, (ingested(survivor), n, read)
        assert sum(v.get("windowed", 0) for v in c.values()) + sum(x for v in c.values() for k, x in v.items() if k.startswith("ignored:")) == n
        assert sum(v.get("duplicate", 0) for v in c.values()) == 0
        # every GPU flow reached the analyse stage; some twice (sent by the victim, read again by the survivor), kept once
        ips = set(cluster.topology["ip"])
        gpu = flows[flows["src"].astype(str).isin(ips) & flows["dst"].astype(str).isin(ips) & (flows["src"] != flows["dst"])]
        want = set(zip(gpu["start_ns"].tolist(), gpu["src"].astype(str).tolist(), gpu["dst"].astype(str).tolist(), gpu["size"].tolist()))
        missing = want - received
        assert not missing, f"{len(missing)} GPU flows never reached the analyse stage"
        again = sum(v.get("duplicate", 0) for v in m.counters.values())
        # the victim had read records it had not forwarded: its last published counts are short of what it read
        # (the survivor resumed there, and counted the rest once, above)
        published = {}
        for key, value in _summary_records(broker, f"sum-{topic}"):
            if key.startswith(f"partition/g-{topic}/{topic}/") and value is not None and json.loads(value).get("replica") == "i1":
                published[key] = json.loads(value)["counters"].get("ingested", 0)
        assert len(published) == 2 and sum(published.values()) < read, (published, read)
        # one daemon's steps, to the nanosecond, and its anomalies
        same, why = _same_steps(an.steps(), one.steps())
        if not same:
            def spans(d):  # each side's windows (s from the stream's start), late flows and the incomplete ones marked
                return [f"{(w.begin - t0) / 1e9:.2f}-{(w.end - t0) / 1e9:.2f}{'!' if w.incomplete else ''}{f' late {w.late}' if w.late else ''}"
                        for w in list(d.monitor.windows)]

            why += f"\nvictim killed at {(at - t0) / 1e9:.3f} s, having read {read} records"
            for d in (one, survivor, an):
                why += f"\n{d.source.replica_id} windows: {spans(d)}"
        assert same, why
        assert an.series("prism_steps_total") == one.series("prism_steps_total")
        assert an.job_anomalies() == one.job_anomalies() and an.fabric_anomalies() == one.fabric_anomalies()
        print("victim read", read, "of", len(first), "records before it was killed, published", sum(published.values()),
              "; flows the analyse stage got twice", again)
    finally:
        if victim.poll() is None:
            stop_process(victim)
        for d in everyone:
            d.stop()


@pytest.fixture(scope="module")
def moe_cluster():
    """8 s of a one-domain MoE job (128 GPUs, EP all-to-all and its dense DP ring) beside a DP 2 x PP 2 job on 24 servers
    under 8 spines, spine-00 at half its bandwidth from 3.2 s (216,319 flows). The MoE job's flows run at a seventh of
    a ring's: judged by kind (EP, DP, PP apart) the spine is slow, pooled it is not (the MoE mix hides it)."""
    from synthetic.fabric import Fabric
    from synthetic.faults import DegradedSwitch
    from synthetic.generator import ClusterGenerator
    from synthetic.modern import modern_job
    from synthetic.scenarios import BASE_JOBS

    jobs = [modern_job("moe-flat"), next(j for j in BASE_JOBS if j.name == "tp8-pp2-dp2")]
    return ClusterGenerator(Fabric(servers=24, servers_per_group=8, spines=8), jobs, duration_s=8.0, seed=0,
                            faults=[DegradedSwitch("auto", start_frac=0.4, end_frac=1.0, factor=0.5)],
                            uniform_dp_share=0.05, split_pp_prob=0.002, storage_flows_per_s=100).generate()


def test_the_fabric_owner_judges_every_replicas_flows_by_kind(broker, moe_cluster):
    """Two analyse replicas, the MoE job's on the one that does not own the fabric: the fabric's owner judges the MoE
    job's flows by their pair types (EP, DP), which only the other replica knows and sends it with each window, and
    names the degraded spine as one daemon does (the MoE mix judged as one kind hides it)."""
    from prism.analysis.jobs import job_id_for
    from prism.serve.jobtopic import FABRIC_KEY, job_partition

    cluster = moe_cluster
    topic = f"flows-{uuid.uuid4().hex[:8]}"
    ensure_topic(broker.bootstrap, topic, 4)
    jobs_topic = f"jobs-{topic}"
    servers = dict(zip(cluster.topology["ip"], cluster.topology["server"]))
    ids = {j: job_id_for({servers[ip] for ip in g["ip"]}) for j, g in cluster.jobs.groupby("job_id")}
    # the case: the fabric and the 3D job on one job-topic partition pair, the MoE job on the other (range assignment)
    assert job_partition(FABRIC_KEY, 4) // 2 == job_partition(ids["tp8-pp2-dp2"], 4) // 2 != job_partition(ids["moe-flat-ep8"], 4) // 2
    one = Running(broker, cluster, "all", topic, f"one-{topic}", "one", jobs_topic)
    ins = [Running(broker, cluster, "ingest", topic, f"g-{topic}", "i0", jobs_topic)]
    ans = [Running(broker, cluster, "analyse", topic, f"g-{topic}", f"a{k}", jobs_topic) for k in range(2)]
    everyone = [one, *ins, *ans]
    try:
        _settle(one, ins, ans)
        p = FlowProducer(broker.bootstrap, topic, fmt="arrow")
        stream_flows(p, cluster.flows, speed=0)
        p.flush()
        p.close()
        _wait_done(one, ins, ans, len(cluster.flows))
        (owner,) = [d for d in ans if d.monitor.owns_fabric()]
        (other,) = [d for d in ans if d is not owner]
        assert ids["moe-flat-ep8"] in other.series("prism_job_info") and ids["moe-flat-ep8"] not in owner.series("prism_job_info")
        assert ids["tp8-pp2-dp2"] in owner.series("prism_job_info")
        assert ("slow_switch", "spine-00") in one.fabric_anomalies(), "one daemon names the degraded spine"
        assert sorted(a for d in ans for a in d.fabric_anomalies()) == one.fabric_anomalies()
        assert sum(d.total("prism_anomalies_total", job_id="") for d in ans) == one.total("prism_anomalies_total", job_id="")
        # the other replica's typed pairs came (the MoE job's 512), and were used: the union is one daemon's
        assert owner.monitor.kinds_rows >= 512
        print("fabric: one", one.fabric_anomalies(), "owner", owner.fabric_anomalies(), "typed pairs received", owner.monitor.kinds_rows)
    finally:
        for d in everyone:
            d.stop()


def test_the_fabric_owner_takes_each_partitions_typed_pairs_of_its_window(cluster):
    """The fabric's owner waits, for each job-topic partition it does not hold, for typed pairs of its window or a later
    one, and judges with those of its window (or the latest before it), whatever order they were read in."""
    import itertools

    import pyarrow as pa

    from prism.serve.jobtopic import AnalyseMonitor

    def msg(end, parts, pairs, final=False):
        a, b, t, q = zip(*pairs) if pairs else ((), (), (), ())
        return {"end": end, "final": final, "parts": parts}, pa.table({"a": pa.array(a, pa.int32()), "b": pa.array(b, pa.int32()),
                                                                        "type": pa.array(t, pa.string()), "part": pa.array(q, pa.int32())})

    sent = [msg(10, [2, 3], [(1, 2, "EP", 2)]), msg(20, [2, 3], [(1, 2, "DP", 2), (5, 6, "PP", 3)]), msg(30, [2, 3], [(1, 2, "EP", 2)]),
            msg(20, [1], [(7, 8, "CP", 1)])]
    for order in itertools.permutations(range(len(sent))):
        m = AnalyseMonitor(Topology.from_frame(cluster.topology), MonitorSettings(**SETTINGS))
        m.fabric_part, m.job_parts, m.owned, m.inputs, m.marks = 0, 4, {0}, 1, {0: {0: (40, False)}}
        read = []
        for i in order:
            m.take_kinds(*sent[i])
            read.append(i)
            # ready at 20 once partition 1 and partitions 2 and 3 each sent their window 20 or later
            assert m._kinds_ready(20, False) == (3 in read and (1 in read or 2 in read)), read
        got = m._switch_kinds(20, False)
        assert sorted(zip(got[0].tolist(), got[1].tolist(), got[2].tolist())) == [(1, 2, "DP"), (5, 6, "PP"), (7, 8, "CP")]
    # a window missing from a partition's messages: the latest before it
    m = AnalyseMonitor(Topology.from_frame(cluster.topology), MonitorSettings(**SETTINGS))
    m.fabric_part, m.job_parts, m.owned = 0, 2, {0}
    for x in (msg(10, [1], [(1, 2, "EP", 1)]), msg(30, [1], [(1, 2, "DP", 1)])):
        m.take_kinds(*x)
    assert m._kinds_ready(20, False) and m._switch_kinds(20, False)[2].tolist() == ["EP"]


def test_a_replica_with_no_flows_does_not_hold_the_fabric_owner_back(cluster):
    """A replica whose partitions have had no flows yet analyses no window, but as its event time advances it publishes
    their typed pairs (none), so the fabric's owner's windows go on."""
    import pyarrow as pa

    from prism.serve.jobtopic import AnalyseMonitor

    topo = Topology.from_frame(cluster.topology)
    quiet, owner = AnalyseMonitor(topo, MonitorSettings(**SETTINGS)), AnalyseMonitor(topo, MonitorSettings(**SETTINGS))
    for m, mine in ((quiet, {1}), (owner, {0})):
        m.fabric_part, m.job_parts, m.owned = 0, 2, mine
    for end in (1_000, 2_000):
        quiet.mark({"inputs": 1, "partitions": {"0": end}, "final": False, "end": end}, 1)
        owner.mark({"inputs": 1, "partitions": {"0": end}, "final": False, "end": end}, 0)
        assert not owner._kinds_ready(end, False), "the owner waits for partition 1's typed pairs"
        assert quiet.tick() is not None and quiet.analysed_to is None and quiet.tick() is None  # once for each advance
        ((at, final, parts, a, b, types, part),) = quiet.take_kinds_out()
        assert (at, final, parts, len(a)) == (end, False, [1], 0)
        owner.take_kinds({"end": at, "final": final, "parts": parts},
                         pa.table({"a": pa.array(a, pa.int32()), "b": pa.array(b, pa.int32()), "type": pa.array(list(types), pa.string()),
                                   "part": pa.array(part, pa.int32())}))
        assert owner._kinds_ready(end, False)

