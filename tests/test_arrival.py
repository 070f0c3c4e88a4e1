"""The arrival-order diagnosis (:mod:`prism.analysis.diagnosis.arrival`): a pure-DP job's straggler sends last.

Two kinds of flows. The SYNTHETIC generator's (:mod:`synthetic.dpshapes`)
runs each collective as a rendezvous: a ring edge moves once both its ends
are in, so the slow server and its ring predecessor tie on their first send,
the slow server and its successor on their first receive, and the slow
server is the one late in both. :func:`with_arrivals` re-times a cluster's
flows the other way, as eager sends: each collective's opening sends (ring
step 0) of the ranks that arrive early start earlier by their wait, and last
that much longer (they wait inside the collective); their ends, and every
later flow, stay put: the slow server is the one last to send.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from prism.analysis.diagnosis import ArrivalDiagnoser
from prism.analysis.diagnosis.arrival import _hand_on, last_arrival
from prism.ingest.topology import Topology
from prism.offline.replay import replay
from synthetic.dpshapes import STEP_LENGTHS, dp_cluster

SLOW = "srv0005"  # the job's second server (dp_cluster's SlowServer(server=1))


def with_arrivals(cluster, wait_ns, seed: int = 0):
    """``cluster`` with each collective's opening sends moved earlier by ``wait_ns(servers, rng, t) -> (S,) ns`` per server.

    Openers: the GPU flows that start a burst of their pair of servers (after
    a pause of more than 20 us plus the largest wait on that pair, so the
    moved flows stay in their collective).
    """
    rng = np.random.default_rng(seed)
    f = cluster.flows.sort_values("start_ns", kind="stable").reset_index(drop=True)
    topo = cluster.topology.set_index("ip")["server"]
    src_srv, dst_srv = f["src"].map(topo), f["dst"].map(topo)
    gpu = src_srv.notna() & dst_srv.notna()
    servers = sorted(src_srv[gpu].unique())
    g = f[gpu]
    edge = np.minimum(src_srv[gpu], dst_srv[gpu]) + ">" + np.maximum(src_srv[gpu], dst_srv[gpu])
    busy = (g["start_ns"] + g["duration_ns"]).groupby(edge).cummax().groupby(edge).shift().fillna(0).to_numpy()
    waits = [wait_ns(servers, rng, t) for t in (0, np.inf)]
    max_wait = max(float(np.max(w)) for w in waits) * 1.5
    opens = g["start_ns"].to_numpy()[(g["start_ns"].to_numpy() - busy) > 20_000 + max_wait]
    opener = gpu & f["start_ns"].isin(opens)
    t = f.loc[opener, "start_ns"].to_numpy()
    uniq, inv = np.unique(t, return_inverse=True)
    w = np.stack([wait_ns(servers, rng, t) for t in uniq])  # (collectives, servers)
    col = pd.Index(servers).get_indexer(src_srv[opener])
    shift = w[inv, col].astype(np.int64)
    f.loc[opener, "start_ns"] = t - shift
    f.loc[opener, "duration_ns"] = f.loc[opener, "duration_ns"].to_numpy() + shift
    cluster.flows = f.sort_values("start_ns", kind="stable").reset_index(drop=True)
    return cluster


def straggler(servers, rng, t):
    """Waits of a job with a straggler: everyone but the slow server waits 1.5-2.5 ms for it (and 0-0.2 ms for each other)."""
    w = rng.uniform(0, 200_000, len(servers)) + rng.uniform(1_500_000, 2_500_000)
    w[servers.index(SLOW)] = 0.0
    return w


def jitter(servers, rng, t):
    """No straggler: every server issues within the same 2 ms, in a random order."""
    return rng.uniform(0, 2_000_000, len(servers))


def straggler_from(cluster):
    """Jitter until the cluster's slow server turns slow (its fault's start), then a straggler."""
    t0 = int(cluster.faults["start_ns"].iloc[0])
    return lambda servers, rng, t: straggler(servers, rng, t) if t >= t0 else jitter(servers, rng, t)


def run(cluster, tmp_path):
    cluster.write(tmp_path)
    r = replay([str(tmp_path / "flows.parquet")], Topology.from_csv(tmp_path / "topology.csv"), progress=False)
    return r.analysis


def arrival_anomalies(an):
    a = an.anomalies
    return a[(a["kind"] == "slow_group") & a["explanation"].str.contains("sent last")]


@pytest.mark.parametrize("shape", ["ddp", "fsdp"])
def test_straggler_named(shape, tmp_path):
    c = dp_cluster(shape, "0.3s", duration_s=12, with_faults=True)
    c = with_arrivals(c, straggler_from(c))
    an = run(c, tmp_path)
    found = arrival_anomalies(an)
    assert list(found["subject"]) == [SLOW], an.anomalies.to_string()
    assert "sent last at" in found["explanation"].iloc[0] and "chance 25%" in found["explanation"].iloc[0]
    # from about when it turned slow (within two steps)
    fault = c.faults.iloc[0]
    assert abs(int(found["start_ns"].iloc[0]) - int(fault["start_ns"])) < 0.6e9


@pytest.mark.parametrize("shape", ["ddp", "fsdp"])
def test_generated_straggler_named(shape, tmp_path):
    """The generator's own flows (a rendezvous, no re-timing): the slow server is named, from about when it turned slow."""
    c = dp_cluster(shape, "0.3s", duration_s=12, with_faults=True)
    an = run(c, tmp_path)
    found = arrival_anomalies(an)
    assert list(found["subject"]) == [SLOW], an.anomalies.to_string()
    assert abs(int(found["start_ns"].iloc[0]) - int(c.faults.iloc[0]["start_ns"])) < 1.6e9  # within five steps


@pytest.mark.parametrize("shape", ["ddp", "fsdp"])
def test_fault_free_twin_names_no_one(shape, tmp_path):
    c = dp_cluster(shape, "0.3s", duration_s=12, with_faults=False)
    an = run(c, tmp_path)
    assert arrival_anomalies(an).empty, an.anomalies.to_string()
    assert len(an.arrivals) > 50  # collectives were found and judged: the compute jitter orders the members
    assert (an.arrivals["last"] != "").mean() > 0.75  # the rest: members within 20 us of one another (a tie)
    assert an.arrivals["last"].value_counts().max() < 0.5 * len(an.arrivals)  # and no one is last most of the time


def test_two_server_ring_needs_clear_to_send(tmp_path, monkeypatch):
    """A 2-server ring ties in both send and receive (both edges move as the later server enters): nobody is named.
    The receivers' clear-to-send, sent as each enters, is the order the wire then shows: the slow server is named,
    by the steps (the clear-to-sends leave the steps as they are)."""
    import synthetic.dpshapes as dps

    monkeypatch.setattr(dps, "CTS_BYTES", 0)
    c = dp_cluster("finetune", "0.3s", duration_s=12, with_faults=True)
    an = run(c, tmp_path / "plain")
    assert arrival_anomalies(an).empty and len(an.arrivals) > 50 and (an.arrivals["last"] == "").all()
    monkeypatch.setattr(dps, "CTS_BYTES", 256)
    c = dp_cluster("finetune", "0.3s", duration_s=12, with_faults=True)
    assert (c.flows["size"] == 256).sum() > 0
    found = arrival_anomalies(run(c, tmp_path / "cts"))
    assert list(found["subject"]) == [SLOW] and "chance 50%" in found["explanation"].iloc[0]
    assert " steps (chance" in found["explanation"].iloc[0]


def scored(cluster, tmp_path):
    from prism.analysis.evaluation import score_cluster

    cluster.write(tmp_path)
    r = replay([str(tmp_path / "flows.parquet")], Topology.from_csv(tmp_path / "topology.csv"), progress=False)
    return r.analysis, score_cluster(r, cluster)


@pytest.mark.parametrize("shape", ["finetune", "hsdp", "ddp", "fsdp"])
def test_clear_to_send_is_the_receivers_entry(shape, tmp_path, monkeypatch):
    """With the receivers' clear-to-sends (256 bytes, each at its sender's own entry into a collective), a server's
    entry is its first clear-to-send: the late member of a 2-server ring (the fine-tuning job; HSDP's shard and
    replica rings) is named, and so is a 4-server ring's, each from about when it turned slow, by the steps, every
    step found. Before, their early members' clear-to-sends filled the pauses (the fine-tuning job and HSDP got no
    step) and handed on with the data they cleared made an early member last (DDP was not named)."""
    import synthetic.dpshapes as dps

    monkeypatch.setattr(dps, "CTS_BYTES", 256)
    c = dp_cluster(shape, "0.3s", duration_s=12, with_faults=True)
    an, score = scored(c, tmp_path)
    assert score["steps_found"] == score["true_steps"] and score["steps_spurious"] == 0 and score["anomalies_unexplained"] == 0
    found = arrival_anomalies(an)
    assert list(found["subject"]) == [SLOW], an.anomalies.to_string()
    assert " steps (chance" in found["explanation"].iloc[0]
    assert abs(int(found["start_ns"].iloc[0]) - int(c.faults.iloc[0]["start_ns"])) < 1.6e9  # within five steps


@pytest.mark.parametrize("shape", ["finetune", "hsdp", "ddp", "fsdp"])
def test_clear_to_send_twin_names_no_one(shape, tmp_path, monkeypatch):
    """The fault-free twins with clear-to-sends: the order they show is the compute jitter's, and no one is named."""
    import synthetic.dpshapes as dps

    monkeypatch.setattr(dps, "CTS_BYTES", 256)
    an, score = scored(dp_cluster(shape, "0.3s", duration_s=12, with_faults=False), tmp_path)
    assert score["steps_found"] == score["true_steps"] and score["steps_spurious"] == 0 and score["anomalies"] == 0
    # the order was there to judge, in a 2-server ring too (without clear-to-sends every burst of one is a tie); the
    # rest are members that entered together, both waiting for the collective before
    assert (an.arrivals["last"] != "").mean() > 0.75


def test_clear_to_sends_go_with_the_data_they_clear():
    """A clear-to-send goes from receiver to sender: it goes with the first data on the opposite edge at or after it
    (the receiver was done with the edge's data before), in that data's burst, as its sender's entry; one whose edge
    carries no later data, or another clear-to-send before its data (the data it cleared was not recorded), is left
    out."""
    from prism.analysis.diagnosis.arrival import _entries

    # servers 0 and 1, one NIC each; data 0 -> 1 at 100 (burst 0) and 500 (burst 1), 1 -> 0 at 100 and 500;
    # clear-to-sends: 1 -> 0 at 30 and 0 -> 1 at 100 (burst 0: server 1 entered at 30, server 0 at 100), 1 -> 0 at
    # 300 (burst 1), 0 -> 1 at 200 (the data it cleared lost: taken with burst 1's, server 0 would have entered it at
    # 200), 0 -> 1 at 450 (burst 1's), 0 -> 1 at 900 (nothing after it)
    a = np.array([0, 1, 0, 1, 1, 0, 1, 0, 0, 0])
    b = 1 - a
    st = np.array([100, 100, 500, 500, 30, 100, 300, 200, 450, 900])
    key, t = _entries(np.arange(4, 10), np.arange(4), np.array([0, 0, 1, 1]), a, b, st, np.array([0, 1]), 2)
    assert key.tolist() == [0, 1, 2, 3] and t.tolist() == [100, 30, 450, 300]  # burst * 2 + server
@pytest.mark.parametrize("shape", ["ddp", "fsdp"])
def test_jitter_only_names_no_one(shape, tmp_path):
    c = with_arrivals(dp_cluster(shape, "0.3s", duration_s=12, with_faults=False), jitter)
    an = run(c, tmp_path)
    assert arrival_anomalies(an).empty, an.anomalies.to_string()
    assert (an.arrivals["last"] != "").mean() > 0.9  # the order was there to judge


def test_last_arrival_send_and_receive():
    """The rule: the last sender; where senders tie, the one of them that is also last to receive."""
    nan = np.full(4, np.nan)
    # eager sends (each rank sends as it enters): the last sender, by its lead over the runner-up
    assert last_arrival(np.array([5.0, 9.0, 2.0, 4.0]), nan) == (1, 4.0)
    # a rendezvous in a ring 0 -> 1 -> 2 -> 3 -> 0, server 1 entering at 9, the others at 2, 4, 6: edge i moves at
    # max(ready i, ready i+1), so servers 0 and 1 first send at 9, servers 1 and 2 first receive at 9
    ready = np.array([6.0, 9.0, 2.0, 4.0])
    send = np.maximum(ready, np.roll(ready, -1))
    recv = np.roll(send, 1)
    assert list(send) == [9, 9, 4, 6] and list(recv) == [6, 9, 9, 4]
    assert last_arrival(send, recv) == (1, 3.0)  # server 1, by 9 - 6 (server 0's entry)
    # without the receives, the tie stands
    assert last_arrival(send, nan) == (-1, 0.0)
    # a 2-server ring: both edges move as the later enters, a tie in both
    assert last_arrival(np.array([9.0, 9.0]), np.array([9.0, 9.0])) == (-1, 0.0)
    # a tie in both that two servers share: nobody
    assert last_arrival(np.array([9.0, 9.0, 1.0]), np.array([9.0, 9.0, 1.0])) == (-1, 0.0)
    # within the tie tolerance is a tie: a sender a few microseconds behind the late server (its send waited for it)
    assert last_arrival(np.array([9_005.0, 9_000.0, 4_000.0, 6_000.0]), np.array([6_000.0, 9_000.0, 9_004.0, 4_000.0]), tie_ns=20) == (1, 3_000.0)


def test_tail_handed_on():
    """Back-to-back collectives: the early ranks' sends of the next one follow this one's without a pause; they go
    to the next burst (whose first sends they are), so that the late server's sends do not open it alone."""
    # a ring 0 -> 1 -> 2, every flow 5 ns: collective A at 0 and 10; then B's edge 1 -> 2 at once, at 30 and 40
    # (servers 1 and 2 are in, done with A at 15), server 0 late (in at 5,000: 0 -> 1 and 2 -> 0 then); C at 9,000
    src = np.array([0, 1, 2, 0, 1, 2, 1, 1, 0, 2, 0, 1, 2, 0])
    start = np.array([0, 0, 0, 10, 10, 10, 30, 40, 5_000, 5_000, 5_010, 5_010, 5_010, 9_000], dtype=np.int64)
    burst = np.array([0] * 8 + [1] * 5 + [2])  # as the pauses cut them: B's early sends close A's burst
    out = _hand_on(burst, np.zeros(len(src), dtype=np.int64), src, (src + 1) % 3, start, start + 5, np.array([3]))
    assert list(out) == [0] * 6 + [1] * 7 + [2]
    # a slow edge's messages that run on past the others' last (a slow NIC, a 3D job's ring that starts together):
    # this collective's, they stay (its sender is still sending them)
    src = np.array([0, 1, 2, 2, 2, 0, 1, 2])
    start = np.array([0, 0, 0, 10, 20, 1_000, 1_000, 1_000], dtype=np.int64)
    end = start + np.array([5, 5, 12, 12, 12, 5, 5, 5])
    burst = np.array([0] * 5 + [1] * 3)
    assert list(_hand_on(burst, np.zeros(8, dtype=np.int64), src, (src + 1) % 3, start, end, np.array([3]))) == list(burst)


def burst_table(last, lead_ns=2_000_000, servers=("srv0004", "srv0005", "srv0006", "srv0007"), period_ns=10_000_000):
    n = len(last)
    return pd.DataFrame({"job_id": "j", "group": "|".join(servers), "start_ns": np.arange(n, dtype=np.int64) * period_ns,
                         "servers": len(servers), "last": list(last), "lead_ns": np.full(n, lead_ns, dtype=np.int64)})


def test_named_from_where_it_began():
    rng = np.random.default_rng(0)
    servers = ["srv0004", "srv0005", "srv0006", "srv0007"]
    last = list(rng.choice(servers, 200)) + ["srv0005"] * 100  # a straggler from burst 200 on
    found = ArrivalDiagnoser().diagnose(burst_table(last)).predict()
    assert list(found["subject"]) == ["srv0005"]
    assert 150 * 10_000_000 <= found["start_ns"].iloc[0] <= 200 * 10_000_000
    assert "of 1" in found["explanation"].iloc[0] and "chance 25%" in found["explanation"].iloc[0]


def test_random_order_and_small_leads_name_no_one():
    rng = np.random.default_rng(1)
    servers = ["srv0004", "srv0005", "srv0006", "srv0007"]
    for seed in range(20):  # random last arrivals: nobody, whatever the draw
        last = np.random.default_rng(seed).choice(servers, 300)
        assert ArrivalDiagnoser().diagnose(burst_table(last)).predict().empty
    # always last, but by microseconds (a collector's clock offset), not a wait
    assert ArrivalDiagnoser().diagnose(burst_table(["srv0005"] * 300, lead_ns=5_000)).predict().empty
    # two servers share the last place (no clear lead): nobody
    two = rng.choice(["srv0005", "srv0006"], 300)
    assert ArrivalDiagnoser().diagnose(burst_table(two)).predict().empty


def test_a_steps_collectives_are_one_draw():
    """A fault-free job whose laggard changes from step to step, but within a step stays the same for all 20 of its
    collectives (a rank behind in a backward stays behind until the ranks next wait): the last two steps happen to
    share one. Counted per collective, 40 wins in a row look like a straggler (p < 1e-20); counted per step (the
    step's collectives are one draw), nobody. A real straggler, last in every step from step 30 on, is still named."""
    rng = np.random.default_rng(3)
    servers = ["srv0004", "srv0005", "srv0006", "srv0007"]
    laggard = list(rng.choice(servers, 58)) + ["srv0006", "srv0006"]
    last = [s for s in laggard for _ in range(20)]
    table = burst_table(last)
    steps = pd.DataFrame({"job_id": "j", "step": np.arange(60), "start_ns": np.arange(60) * 200_000_000,
                          "end_ns": np.arange(1, 61) * 200_000_000})
    assert list(ArrivalDiagnoser().diagnose(table).predict()["subject"]) == ["srv0006"]  # per collective: a false alarm
    assert ArrivalDiagnoser().diagnose(table, steps).predict().empty
    straggler = laggard[:30] + ["srv0005"] * 30
    found = ArrivalDiagnoser().diagnose(burst_table([s for s in straggler for _ in range(20)]), steps).predict()
    assert list(found["subject"]) == ["srv0005"] and "of 30 steps" in found["explanation"].iloc[0]
    assert found["step"].iloc[0] == 30


def test_sliced_job_counts_each_collective_once(tmp_path):
    from prism.analysis.analyse import Settings

    c = with_arrivals(dp_cluster("ddp", "0.3s", duration_s=12, with_faults=True), straggler)
    whole = run(c, tmp_path / "whole")
    r = replay([str(tmp_path / "whole" / "flows.parquet")], Topology.from_csv(tmp_path / "whole" / "topology.csv"), progress=False,
               settings=Settings(slice_flows=20_000))
    assert sum(r.analysis.slices.values()) > 1
    assert len(r.analysis.arrivals) == len(whole.arrivals)
    assert list(arrival_anomalies(r.analysis)["explanation"]) == list(arrival_anomalies(whole)["explanation"])


def test_rounds_are_one_draw_without_steps():
    """No steps in view (a daemon's young window): a DDP job's buckets come in rounds, one a backward, between long
    pauses; a round's collectives share their laggard, so they count as one draw, as a step's do. Evenly spaced
    collectives (FSDP's) still count one by one."""
    rng = np.random.default_rng(3)
    servers = ["srv0004", "srv0005", "srv0006", "srv0007"]
    laggard = list(rng.choice(servers, 8)) + ["srv0006", "srv0006"]
    table = burst_table([s for s in laggard for _ in range(40)])
    table["start_ns"] = np.array([r * 4_000_000_000 + i * 20_000_000 for r in range(10) for i in range(40)], dtype=np.int64)
    assert ArrivalDiagnoser().diagnose(table).predict().empty
    flat = table.assign(start_ns=np.arange(len(table), dtype=np.int64) * 20_000_000)  # the same, counted one by one
    assert list(ArrivalDiagnoser().diagnose(flat).predict()["subject"]) == ["srv0006"]
    even = burst_table(["srv0005"] * 40 + list(rng.choice(servers, 10)))
    found = ArrivalDiagnoser().diagnose(even).predict()
    assert list(found["subject"]) == ["srv0005"] and "of 50 collectives" in found["explanation"].iloc[0]


def micro_batch_table(laggards, rounds=8, per_round=40, lone=True):
    """A job of ``len(laggards)`` steps, each ``rounds`` micro-batches of ``per_round`` collectives 20 ms apart between
    long pauses (each backward's reductions), the step's first led by one collective alone (the tail of the step
    before); ``laggards[s][m]``: the server last in every collective of micro-batch m of step s."""
    rows, t = [], []
    for s, step in enumerate(laggards):
        t0 = s * 100_000_000_000
        if lone:
            rows.append(step[0])
            t.append(t0)
        for m, lag in enumerate(step):
            for i in range(per_round):
                rows.append(lag)
                t.append(t0 + 2_000_000_000 + m * 10_000_000_000 + i * 20_000_000)
    table = burst_table(rows)
    table["start_ns"] = np.array(t, dtype=np.int64)
    steps = pd.DataFrame({"job_id": "j", "step": np.arange(len(laggards)), "start_ns": np.arange(len(laggards)) * 100_000_000_000,
                          "end_ns": np.arange(1, len(laggards) + 1) * 100_000_000_000})
    return table, steps


def test_micro_batches_are_draws_in_a_few_long_steps():
    """Steps of 45 s or more: 8 in view, the server slow in the last 5. Per step, 5 of 5 at chance 1/4 (p = 1e-3) is
    not significant; but where the step's collectives come in alike rounds between long pauses (a job that reduces
    every micro-batch, each backward's end waiting for its reductions), every rank leaves a round together and each
    round is a draw: 40 of 40. The lone collective at each step's start goes with the round after it."""
    rng = np.random.default_rng(5)
    servers = ["srv0004", "srv0005", "srv0006", "srv0007"]
    lag = [list(rng.choice(servers, 8)) for _ in range(3)] + [["srv0005"] * 8 for _ in range(5)]
    table, steps = micro_batch_table(lag)
    found = ArrivalDiagnoser().diagnose(table, steps).predict()
    assert list(found["subject"]) == ["srv0005"], found
    assert "of 40 steps and micro-batches" in found["explanation"].iloc[0]
    assert found["step"].iloc[0] == 3


def test_a_step_of_one_round_stays_one_draw():
    """The same job reducing once a step (DDP with ``no_sync``): one round a step, plus the lone collective after a
    pause; the lone one is no micro-batch, the step stays one draw, and 5 slowed steps name no one. A fault-free job
    whose laggard changes from micro-batch to micro-batch names no one either."""
    rng = np.random.default_rng(6)
    servers = ["srv0004", "srv0005", "srv0006", "srv0007"]
    lag = [[s] for s in rng.choice(servers, 3)] + [["srv0005"]] * 5
    table, steps = micro_batch_table(lag, rounds=1)
    assert ArrivalDiagnoser().diagnose(table, steps).predict().empty
    for seed in range(10):
        r = np.random.default_rng(seed)
        table, steps = micro_batch_table([list(r.choice(servers, 8)) for _ in range(8)])
        assert ArrivalDiagnoser().diagnose(table, steps).predict().empty


def test_draws_split_only_alike_rounds():
    from prism.analysis.diagnosis.arrival import draws

    t = np.r_[np.arange(0, 40, 10), np.arange(1_000, 1_040, 10), 5_000, np.arange(6_000, 6_040, 10)]
    d0, d1, split = draws(t, np.array([0, 5_000]), np.array([5_000, 10_000]))
    assert (d0.tolist(), d1.tolist(), split) == ([0, 1_000, 5_000], [1_000, 5_000, 10_000], True)
    d0, d1, split = draws(t[t >= 5_000], np.array([0, 5_000]), np.array([5_000, 10_000]))
    assert (d0.tolist(), d1.tolist(), split) == ([0, 5_000], [5_000, 10_000], False)


def long_steps(laggards, leads_ns, per_step=40):
    """A job of one round of ``per_step`` collectives a step (DDP with ``no_sync``), 60 s steps: ``laggards[s]`` last in
    every collective of step s, by ``leads_ns[s]`` in its first (a backward's lateness) and by 1/50 of that after."""
    rows, t, lead = [], [], []
    for s, (lag, ld) in enumerate(zip(laggards, leads_ns)):
        for i in range(per_step):
            rows.append(lag)
            t.append(s * 60_000_000_000 + 40_000_000_000 + i * 100_000_000)
            lead.append(int(ld) if i == 0 else int(ld) // 50)
    table = burst_table(rows)
    table["start_ns"] = np.array(t, dtype=np.int64)
    table["lead_ns"] = np.array(lead, dtype=np.int64)
    n = len(laggards)
    steps = pd.DataFrame({"job_id": "j", "step": np.arange(n), "start_ns": np.arange(n) * 60_000_000_000,
                          "end_ns": np.arange(1, n + 1) * 60_000_000_000})
    return table, steps


def test_a_few_slowed_steps_are_named_by_how_late():
    """Steps of 45 s or more, one round of collectives each: 3 of 5 in view slowed. Who is last cannot be significant
    (4^-3); how late can: the slow server trails by seconds (a share of the compute), the jitter's laggard by tens of
    milliseconds. Named from the first slowed step; as late as the others, or late in too few steps: nobody."""
    lag = ["srv0004", "srv0006", "srv0005", "srv0005", "srv0005"]
    table, steps = long_steps(lag, [50e6, 70e6, 15.5e9, 15.8e9, 16e9])
    found = ArrivalDiagnoser().diagnose(table, steps).predict()
    assert list(found["subject"]) == ["srv0005"], found
    assert found["step"].iloc[0] == 2
    text = found["explanation"].iloc[0]
    assert "sent last at 3 of 3 steps" in text and "15.5 s or more behind at its latest" in text and "70 ms at most" in text
    # the same order, by the jitter's milliseconds: nobody (per step, 3 of 3 is no test at all)
    table, steps = long_steps(lag, [50e6, 70e6, 60e6, 45e6, 80e6])
    assert ArrivalDiagnoser().diagnose(table, steps).predict().empty
    # late, but in two steps only; or no other step to compare with
    table, steps = long_steps(lag[:4], [50e6, 70e6, 15.5e9, 15.8e9])
    assert ArrivalDiagnoser().diagnose(table, steps).predict().empty
    table, steps = long_steps(lag[1:], [70e6, 15.5e9, 15.8e9, 16e9])
    assert ArrivalDiagnoser().diagnose(table, steps).predict().empty


def test_jitter_of_any_spread_names_no_one_by_lateness():
    """Fault-free long steps: a random laggard a step, late by a log-normal jitter (a factor 2 to 3 at one sd): nobody,
    whatever the draw, though a chance run of one laggard with the largest jitter happens."""
    servers = ["srv0004", "srv0005", "srv0006", "srv0007"]
    for seed in range(200):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(4, 12))
        table, steps = long_steps(list(rng.choice(servers, n)), rng.lognormal(np.log(30e6), rng.uniform(0.7, 1.1), n))
        assert ArrivalDiagnoser().diagnose(table, steps).predict().empty, seed


@pytest.mark.parametrize("shape, length, window", [("ddp", "5s", 60), ("zero1", "45s", 360)])
def test_generated_few_slowed_steps_named(shape, length, window, tmp_path):
    """The generator's DDP at 5 s (60 s: 5 slowed steps) and ZeRO-1 at 45 s (360 s: 4): one round of collectives a step,
    named by how late the slow server is, from the step it turned slow; the fault-free twins name no one."""
    c = dp_cluster(shape, length, duration_s=window, with_faults=True)
    an = run(c, tmp_path / "faulty")
    found = arrival_anomalies(an)
    assert list(found["subject"]) == [SLOW], an.anomalies.to_string()
    assert "behind at its latest" in found["explanation"].iloc[0]
    # from the step it turned slow in (its start within a tenth of a step of the fault's)
    assert abs(int(found["start_ns"].iloc[0]) - int(c.faults.iloc[0]["start_ns"])) < STEP_LENGTHS[length][0] * 0.1e9
    twin = run(dp_cluster(shape, length, duration_s=window, with_faults=False), tmp_path / "twin")
    assert arrival_anomalies(twin).empty, twin.anomalies.to_string()
