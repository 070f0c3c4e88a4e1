"""Hangs, clean ends and restarts (SYNTHETIC), in the replay and through the daemon's monitor.

Truth from :mod:`synthetic`: a ``Hang`` (one server never joins a step's
collective, the rest wait: no more traffic), a ``Restart`` (the job stops
mid-step, is silent, and runs on with one server replaced by a spare) and a
clean end (a job's flows cut after a whole step). Stream time only: the
monitor is fed event-time slices, no wall-clock waits.
"""
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry

from prism.analysis.diagnosis import ANOMALY_COLUMNS
from prism.analysis.evaluation import job_name_map, score_anomalies, score_steps
from prism.ingest.records import RejectCounter, validate_flows
from prism.ingest.topology import Topology
from prism.offline.replay import replay
from prism.serve.metrics import PrismCollector
from prism.serve.monitor import Monitor, MonitorSettings
from synthetic import ClusterGenerator, Fabric, Hang, JobSpec, Restart

MiB = 1 << 20
JOBS = [
    JobSpec("hangs", tp=8, pp=2, dp=2, microbatches=4, fwd_ms=8, grad_bytes=96 * MiB, bucket_bytes=40 * MiB),
    JobSpec("restarts", tp=8, pp=1, dp=4, microbatches=4, fwd_ms=6, grad_bytes=64 * MiB, bucket_bytes=24 * MiB),
    JobSpec("runs", tp=8, pp=2, dp=2, microbatches=4, fwd_ms=8, grad_bytes=96 * MiB, bucket_bytes=40 * MiB),
]
FAULTS = [Hang("hangs", step=100, member=1), Restart("restarts", step=40, outage_s=25, replaced_server=2)]
DURATION_S = 40.0


def generate(with_faults: bool):
    fabric = Fabric(servers=16, servers_per_group=4, spines=4)
    return ClusterGenerator(fabric, JOBS, duration_s=DURATION_S, faults=FAULTS, seed=0, with_faults=with_faults, storage_flows_per_s=40).generate()


@pytest.fixture(scope="module")
def faulty():
    return generate(True)


@pytest.fixture(scope="module")
def twin():
    return generate(False)


@pytest.fixture(scope="module")
def clean_end(twin):
    """The fault-free twin with job ``runs`` ending after a whole step (its flows from the next step on cut)."""
    c = twin
    end = int(c.steps.loc[(c.steps["job_id"] == "runs") & (c.steps["step"] == 60), "end_ns"].iloc[0])
    ips = set(c.jobs.loc[c.jobs["job_id"] == "runs", "ip"])
    later = c.flows["src"].astype(str).isin(ips) & c.flows["dst"].astype(str).isin(ips) & (c.flows["start_ns"] > end)
    steps = c.steps[(c.steps["job_id"] != "runs") | (c.steps["end_ns"] <= end)]
    return type(c)(c.flows[~later].reset_index(drop=True), c.topology, c.jobs, c.pairs, steps, c.faults, c.meta)


def run_replay(cluster, tmp_path):
    cluster.write(tmp_path)
    return replay([str(tmp_path / "flows.parquet")], Topology.from_csv(tmp_path / "topology.csv"), progress=False)


def run_stream(cluster, settings: MonitorSettings, slice_s: float = 0.25):
    """The flows fed to a monitor in event-time slices, a window whenever one is due; each anomaly with the event time it was reported at."""
    m = Monitor(Topology.from_frame(cluster.topology), settings)
    flows = cluster.flows.sort_values("start_ns", kind="stable")
    t = flows["start_ns"].to_numpy()
    cuts = np.searchsorted(t, np.arange(t[0], t[-1] + 1, int(slice_s * 1e9)))[1:]
    found, ids, states = [], [], []
    for part in np.split(np.arange(len(flows)), cuts):
        if not len(part):
            continue
        m.ingest(validate_flows(pa.Table.from_pandas(flows.iloc[part], preserve_index=False), RejectCounter(), "test"))
        if m.due():
            m.tick()
            ids.append(set(m.view.jobs))
            states.append({j: v.state for j, v in m.view.jobs.items()})
            while m.events:
                kind, e = m.events.popleft()
                if kind == "anomaly":
                    found.append(dict(e, detected_ns=m.analysed_to))
    m.tick(final=True)
    found += [dict(e, detected_ns=m.analysed_to) for kind, e in m.events if kind == "anomaly"]
    anomalies = pd.DataFrame(found, columns=ANOMALY_COLUMNS + ["detected_ns"])
    return m, anomalies, ids, states


def hangs(anomalies: pd.DataFrame) -> pd.DataFrame:
    return anomalies[anomalies["kind"] == "hang"]


def test_hang_and_restart_are_in_the_ground_truth(faulty, twin):
    f = faulty.faults.set_index("kind")
    assert f.loc["hang", "job_id"] == "hangs" and f.loc["hang", "step"] == 100
    hung_server = f.loc["hang", "subject"]
    assert hung_server in faulty.meta["jobs"]["hangs"]["servers"]
    # the hung step is not whole: the job's steps stop before it
    hs = faulty.steps[faulty.steps["job_id"] == "hangs"]
    assert hs["step"].max() == 99 and hs["end_ns"].max() <= f.loc["hang", "start_ns"]
    # the restart: one server out, a spare in, the same job; the broken step and the first after the restart are not whole
    old, new = f.loc["restart", "subject"].split(">")
    assert old in faulty.meta["jobs"]["restarts"]["servers"] and new not in faulty.meta["jobs"]["restarts"]["servers"]
    rs = faulty.steps[faulty.steps["job_id"] == "restarts"]
    assert (np.diff(rs["step"]) == 1).all() and rs["step"].iloc[0] == 0
    across = rs[(rs["end_ns"] > f.loc["restart", "start_ns"]) & (rs["start_ns"] < f.loc["restart", "end_ns"])]
    assert across.empty  # no truth step spans the outage
    assert (rs["start_ns"] > f.loc["restart", "end_ns"]).sum() > 50
    assert twin.faults.empty


def test_replay_reports_the_hang_at_the_capture_end(faulty, tmp_path):
    r = run_replay(faulty, tmp_path)
    an = r.analysis
    names = job_name_map(r.jobs, faulty.jobs)
    truth = faulty.faults.set_index("kind").loc["hang"]
    h = hangs(an.anomalies)
    assert len(h) == 1
    assert names[h["job_id"].iloc[0]] == "hangs"
    assert h["subject"].iloc[0] == truth["subject"]  # the member that never joined
    assert h["step"].iloc[0] == 100
    assert abs(int(h["start_ns"].iloc[0]) - int(truth["start_ns"])) < 1_000_000
    faults, scored = score_anomalies(an.anomalies, faulty.faults, names, an.steps)
    assert faults["matched"].all() and scored["matched"].all(), scored  # no slow_step at the restart, nothing unexplained
    # every true step found, none spurious: the hung step is not reported as whole, the outage is no step
    sc = score_steps(an.steps, faulty.steps, names, capture_end=faulty.meta["window_end_ns"]).set_index("job")
    assert (sc["found"] == sc["true_steps"]).all() and (sc["spurious"] == 0).all(), sc
    hung_id = h["job_id"].iloc[0]
    assert an.steps.loc[an.steps["job_id"] == hung_id, "end_ns"].max() < int(truth["start_ns"])
    states = an.job_states.set_index("job_id")["state"]
    assert states[hung_id] == "hung"
    assert (states.drop(hung_id) == "running").all()


def test_replay_keeps_a_restarted_job_whole(faulty, tmp_path):
    r = run_replay(faulty, tmp_path)
    names = job_name_map(r.jobs, faulty.jobs)
    ids = [j for j, n in names.items() if n == "restarts"]
    assert len(ids) == 1  # one job: its old servers, and the spare that replaced one
    old, new = faulty.faults.set_index("kind").loc["restart", "subject"].split(">")
    servers = set(r.jobs.loc[r.jobs["job_id"] == ids[0], "server"]) if "server" in r.jobs else None
    if servers is not None:
        assert {old, new} <= servers
    steps = r.analysis.steps[r.analysis.steps["job_id"] == ids[0]]
    restart_end = int(faulty.faults.set_index("kind").loc["restart", "end_ns"])
    assert (steps["start_ns"] > restart_end).sum() >= 50  # a new run of steps after the restart
    assert (np.diff(steps["step"]) == 1).all()  # numbered on
    assert steps["duration_ns"].max() < 2 * steps["duration_ns"].median()  # the outage is no step


def test_sliced_replay_of_a_restarted_job_finds_the_same_steps(faulty, tmp_path):
    """A slice holding the restart's outage and no whole step on either side of it for the timeline alone: the
    silences still split it into runs (they did only where another job of the same analysis had steps, which a
    slice, one job's flows, never has: every step of such slices was lost)."""
    from prism.analysis.analyse import Settings

    faulty.write(tmp_path)
    topo = Topology.from_csv(tmp_path / "topology.csv")
    whole = replay([str(tmp_path / "flows.parquet")], topo, progress=False)
    ids = [j for j, n in job_name_map(whole.jobs, faulty.jobs).items() if n == "restarts"]
    flows = len(faulty.flows[faulty.flows["src"].isin(set(whole.jobs.loc[whole.jobs["job_id"] == ids[0], "ip"]))])
    sliced = replay([str(tmp_path / "flows.parquet")], topo, progress=False, settings=Settings(slice_flows=flows // 3))
    assert sliced.analysis.slices.get(ids[0], 1) >= 3
    a, b = (r.analysis.steps[r.analysis.steps["job_id"] == ids[0]] for r in (whole, sliced))
    assert len(a) >= 100 and len(b) == len(a)
    assert (b["end_ns"].to_numpy() == a["end_ns"].to_numpy()).all()


def test_nothing_on_the_fault_free_twin_or_a_clean_end(twin, clean_end, tmp_path):
    for name, c in (("twin", twin), ("clean", clean_end)):
        r = run_replay(c, tmp_path / name)
        an = r.analysis
        assert hangs(an.anomalies).empty, (name, an.anomalies)
        assert an.anomalies.empty, (name, an.anomalies)
        states = an.job_states.set_index("job_id")["state"]
        names = job_name_map(r.jobs, c.jobs)
        for job_id, state in states.items():
            assert state == ("ended" if name == "clean" and names[job_id] == "runs" else "running"), (name, job_id, state)
        sc = score_steps(an.steps, c.steps, names, capture_end=c.meta["window_end_ns"])
        assert (sc["found"] == sc["true_steps"]).all() and (sc["spurious"] == 0).all(), (name, sc)


def test_daemon_reports_the_hang_within_30_s_of_stream_time(faulty):
    # the daemon's windows (120 s, a window every 15 s of event time), pairs forgotten after 30 s (to see the restarted job's id
    # outlive its replaced server's pairs)
    settings = MonitorSettings(pair_ttl_s=30.0, step_history=4096)
    m, anomalies, ids, states = run_stream(faulty, settings)
    names = job_name_map(m.jobs_, faulty.jobs)
    truth = faulty.faults.set_index("kind").loc["hang"]
    h = hangs(anomalies)
    assert len(h) == 1, anomalies
    assert h["subject"].iloc[0] == truth["subject"] and h["step"].iloc[0] == 100
    delay_s = (h["detected_ns"].iloc[0] - truth["start_ns"]) / 1e9
    assert 0 < delay_s <= 30, delay_s
    hung_id = h["job_id"].iloc[0]
    assert names[hung_id] == "hangs"
    assert m.view.jobs[hung_id].state == "hung"
    reg = CollectorRegistry()
    reg.register(PrismCollector(m))
    assert reg.get_sample_value("prism_job_state", {"job_id": hung_id, "state": "hung"}) == 1.0
    assert reg.get_sample_value("prism_job_state", {"job_id": hung_id, "state": "running"}) == 0.0
    # nothing else: no slow step at the restart, every anomaly explained
    faults, scored = score_anomalies(anomalies, faulty.faults, names, m.steps_frame())
    assert faults["matched"].all() and scored["matched"].all(), scored
    sc = score_steps(m.steps_frame(), faulty.steps, names, capture_end=faulty.meta["window_end_ns"])
    assert (sc["found"] == sc["true_steps"]).all() and (sc["spurious"] == 0).all(), sc
    # the restarted job keeps the id it had before the outage: through the restart (one more server) and after its
    # replaced server's pairs expire (one server out, one in)
    restarted = [j for j, n in names.items() if n == "restarts"]
    assert len(restarted) == 1
    assert all(restarted[0] in s for s in ids), ids
    assert states[0][restarted[0]] == "ended"  # silent in the outage, stopped mid-step: not hung
    assert m.view.jobs[restarted[0]].state == "running"
    old, new = faulty.faults.set_index("kind").loc["restart", "subject"].split(">")
    servers = set(m.jobs_.loc[m.jobs_["job_id"] == restarted[0], "server"])
    assert new in servers and old not in servers  # the TTL ran out for the replaced server


def test_a_job_with_long_steps_is_reported_hung_within_30_s():
    """A job of about 7 s steps (SYNTHETIC) hangs at step 6: its collective lacks a member from then on. A silence
    after a whole step waits five steps (36 s here) before the job counts as ended, as a checkpoint's pause may last
    that long; inside an incomplete collective it waits one step (8 s at least): the daemon reports the hang within
    30 s of stream time (21 s; when every silence waited five steps, not within the 47 s of capture after it), and
    nothing else."""
    job = JobSpec("slow-steps", tp=8, pp=1, dp=4, microbatches=2, fwd_ms=1200, grad_bytes=64 * MiB, bucket_bytes=32 * MiB)
    fabric = Fabric(servers=8, servers_per_group=4, spines=2)
    c = ClusterGenerator(fabric, [job], duration_s=90.0, faults=[Hang("slow-steps", step=6, member=2)], seed=1,
                         storage_flows_per_s=20).generate()
    m, anomalies, _, _ = run_stream(c, MonitorSettings(step_history=4096))
    truth = c.faults.set_index("kind").loc["hang"]
    h = hangs(anomalies)
    assert len(h) == 1 and h["subject"].iloc[0] == truth["subject"], anomalies
    delay_s = (h["detected_ns"].iloc[0] - truth["start_ns"]) / 1e9
    assert 0 < delay_s <= 30, delay_s
    assert len(anomalies) == 1, anomalies


def test_daemon_raises_nothing_for_a_clean_end(clean_end):
    m, anomalies, _, states = run_stream(clean_end, MonitorSettings(step_history=4096))
    assert anomalies.empty, anomalies
    names = job_name_map(m.jobs_, clean_end.jobs)
    for job_id, v in m.view.jobs.items():
        assert v.state == ("ended" if names[job_id] == "runs" else "running"), (job_id, v.state)
    assert not any(s == "hung" for st in states for s in st.values())


def test_a_restart_can_be_placed_in_time():
    jobs = [JobSpec("r", tp=8, pp=1, dp=2, microbatches=2, fwd_ms=5, grad_bytes=32 * MiB, bucket_bytes=16 * MiB)]
    c = ClusterGenerator(Fabric(servers=4, servers_per_group=4, spines=2), jobs, duration_s=12.0, faults=[Restart("r", after_s=4.0, outage_s=5.0)],
                         seed=1, storage_flows_per_s=0).generate()
    (r,) = c.faults.itertuples(index=False)
    t0 = c.meta["window_start_ns"]
    assert r.kind == "restart" and 4e9 <= r.start_ns - t0 < 4.2e9 and r.end_ns - r.start_ns == pytest.approx(5e9, abs=1)
    gpu = c.flows["src"].astype(str).isin(set(c.jobs["ip"]))
    assert not ((c.flows["start_ns"] >= r.start_ns) & (c.flows["start_ns"] < r.end_ns) & gpu).any()  # silent in the outage
    steps = c.steps
    assert not ((steps["end_ns"] > r.start_ns) & (steps["start_ns"] < r.end_ns)).any()
    assert (steps["start_ns"] > r.end_ns).sum() > 10


def test_a_short_outage_with_a_replaced_server_is_a_restart_not_a_slow_step(tmp_path):
    # a pure-DP job sends nothing but its collective: stopped mid-compute, it leaves no trace of the broken step, and
    # the outage (a quarter of the capture) is short enough for the timeline to find steps across it; what tells it
    # from a checkpoint pause is the spare server sending after it
    jobs = [JobSpec("dp", tp=8, pp=1, dp=4, microbatches=4, fwd_ms=6, grad_bytes=64 * MiB, bucket_bytes=24 * MiB)]
    c = ClusterGenerator(Fabric(servers=8, servers_per_group=4, spines=2), jobs, duration_s=40.0, seed=2, storage_flows_per_s=10,
                         faults=[Restart("dp", after_s=12.0, outage_s=10.0, replaced_server=1)]).generate()
    r = run_replay(c, tmp_path)
    an = r.analysis
    names = job_name_map(r.jobs, c.jobs)
    assert an.anomalies.empty, an.anomalies
    sc = score_steps(an.steps, c.steps, names, capture_end=c.meta["window_end_ns"])
    assert (sc["found"] == sc["true_steps"]).all() and (sc["spurious"] == 0).all(), sc
    assert an.steps["duration_ns"].max() < 2 * an.steps["duration_ns"].median()


def test_a_window_holding_a_short_outage_keeps_the_steps_on_both_sides():
    """A job restarted on a spare after a 4 s outage (under the hang diagnosis's least silence: no run boundary) in the
    daemon's 10 s windows: the outage is a step that dominates the window, and the timeline took the cut for bursts
    inside one collective and found no step at all, so the steps of every window holding it were lost (415 or 444 of
    588, by how much a poll returned). The steps on both sides are the same steps: every true step is found, however
    the stream is read, as in a replay of the whole capture (the outage counted as one long step, as there)."""
    from prism.analysis.jobs import job_id_for

    jobs = [JobSpec(name, tp=8, pp=1, dp=2, microbatches=2, fwd_ms=5, grad_bytes=32 * MiB, bucket_bytes=16 * MiB) for name in ("r", "s")]
    c = ClusterGenerator(Fabric(servers=8, servers_per_group=8, spines=2), jobs, duration_s=24.0, seed=4, storage_flows_per_s=0,
                         faults=[Restart("r", after_s=5.0, outage_s=4.0, replaced_server=0)]).generate()
    flows = c.flows.sort_values("start_ns", kind="stable").reset_index(drop=True)
    t0, t1 = int(flows["start_ns"].min()), int(flows["start_ns"].max())
    _, spare = c.faults.set_index("kind").loc["restart", "subject"].split(">")
    grown = job_id_for(set(c.meta["jobs"]["r"]["servers"]) | {spare})
    truth = c.steps[c.steps["job_id"] == "r"]
    got = {}
    for read_s in (0.5, 5.0, 10.0):
        m = Monitor(Topology.from_frame(c.topology), MonitorSettings(window_s=10, step_s=2, lateness_s=0.1, idle_flush_s=3, step_history=4096))
        for lo in range(t0, t1 + 1, int(read_s * 1e9)):
            m.ingest(flows[(flows["start_ns"] >= lo) & (flows["start_ns"] < lo + int(read_s * 1e9))].reset_index(drop=True), "0")
            while m.tick() is not None:
                pass
        m.tick(final=True)
        steps = m.steps_frame().query("job_id == @grown")
        sc = score_steps(steps, truth, {grown: "r"}, capture_end=t1).iloc[0]
        assert sc["found"] == sc["true_steps"] >= 500, (read_s, sc.to_dict())
        assert sc["spurious"] <= 1 and (steps["step"].diff().dropna() == 1).all(), (read_s, sc.to_dict())
        got[read_s] = steps[["step", "start_ns", "end_ns"]].to_numpy().tolist()
    assert got[0.5] == got[5.0] == got[10.0]
