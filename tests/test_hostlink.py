"""Host or link: a slow NIC makes its flows slow on every link it uses, a slow switch every host's flows through it.

The switch diagnosis tests the hosts first (``slow_host``) and leaves their
flows out of the switch and link evidence; these tests fail if a slow
host's links are blamed, if a degraded switch is taken for its hosts, or if
the straggler naming on real timing is lost.
"""
import numpy as np
import pandas as pd
import pytest

from prism.analysis.diagnosis import ANOMALY_KINDS, SwitchBandwidth, SwitchDiagnoser
from prism.analysis.evaluation import score_cluster
from prism.ingest.topology import Topology
from prism.offline.replay import replay
from synthetic import SlowNic, preset
from synthetic.fromtrace import CollectorNoise, Straggler, read_trace_job, shared_data_dir, trace_cluster, with_slow_transfers

SA = shared_data_dir() / "straggler-analysis"
needs_sa = pytest.mark.skipif(not SA.is_dir(), reason=f"{SA} not present (PRISM_SHARED_DATA names the real-data directory)")
FABRIC = {"slow_switch", "slow_link"}


def _replay(cluster, tmp_path):
    cluster.write(tmp_path)
    r = replay([str(tmp_path / "flows.parquet")], Topology.from_csv(tmp_path / "topology.csv"), progress=False)
    return r, score_cluster(r, cluster)


def _show(r) -> str:
    return r.analysis.anomalies[["kind", "subject", "explanation"]].to_string()


def test_slow_host_is_one_anomaly_kind():
    assert "slow_host" in ANOMALY_KINDS and ANOMALY_KINDS.index("slow_host") < ANOMALY_KINDS.index("slow_switch")


def test_slow_nic_is_the_host_not_its_links(tmp_path):
    """A SYNTHETIC SlowNic (a server's transfers 2x slower wherever they go): named as the host, no link or switch."""
    gen = preset("demo", seed=0)
    gen.faults = [SlowNic("gpt-13b", server=2, factor=2.0)]
    c = gen.generate()
    nic = c.faults[c.faults["kind"] == "slow_nic"]
    assert len(nic) == 1
    r, row = _replay(c, tmp_path)
    an = r.analysis.anomalies
    assert not (set(an["kind"]) & FABRIC), _show(r)
    hosts = an[an["kind"] == "slow_host"]
    assert hosts["subject"].tolist() == [nic["subject"].iloc[0]], _show(r)
    assert "slow through" in hosts["explanation"].iloc[0] and "not the network" in hosts["explanation"].iloc[0]
    assert row["faults_found"] == row["faults"] == 1 and row["anomalies_unexplained"] == 0, _show(r)


def test_slow_nic_whose_peers_look_slow_is_the_host(tmp_path):
    """A SYNTHETIC SlowNic 3x in a 3D job of the scenario cluster, beside a degraded spine: the slow host's ring and
    pipeline peers look slow through their flows with it, and must not take its flows out of its own evidence (they
    did: the host went unnamed and four of its links were blamed); the degraded spine is still the switch."""
    from synthetic.scenarios import scenario_generator

    gen, _ = scenario_generator("baseline", seed=0, duration_s=40.0)
    gen.faults = [f for f in gen.faults if type(f).__name__ == "DegradedSwitch"] + [SlowNic("tp4-pp2-dp4", server=1, factor=3.0)]
    c = gen.generate()
    r, row = _replay(c, tmp_path)
    an = r.analysis.anomalies
    nic = c.faults[c.faults["kind"] == "slow_nic"]["subject"].tolist()
    assert an[an["kind"] == "slow_host"]["subject"].tolist() == nic, _show(r)
    assert (an["kind"] == "slow_link").sum() == 0, _show(r)
    assert an[an["kind"] == "slow_switch"]["subject"].tolist() == c.faults[c.faults["kind"] == "slow_switch"]["subject"].tolist(), _show(r)


def test_slow_nic_fault_free_twin_is_quiet():
    gen = preset("tiny", seed=0, with_faults=False)
    gen.faults = [SlowNic("tp8-pp2-dp2", server=1)]
    assert gen.generate().faults.empty


def test_degraded_switch_is_still_the_switch(tmp_path):
    """The existing DegradedSwitch fault: every host's flows through it are slow, so no host is blamed."""
    c = preset("demo", seed=0).generate()
    sw = c.faults.loc[c.faults["kind"] == "slow_switch", "subject"].iloc[0]
    r, row = _replay(c, tmp_path)
    an = r.analysis.anomalies
    assert sw in set(an.loc[an["kind"] == "slow_switch", "subject"]), _show(r)
    assert (an["kind"] != "slow_host").all(), _show(r)
    assert row["faults_found"] == row["faults"] and row["anomalies_unexplained"] == 0, _show(r)


def _fabric(slow_host=None, slow_spine=None, factor=3.0, n=100, sender_only=False):
    """Leaf-spine-leaf flows between 6 hosts of 4 NICs (a rail leaf per NIC, four spines by a hash of the pair); one host's
    flows (sent and received, or ``sender_only``) or a spine's slowed."""
    rng = np.random.default_rng(11)
    rows = []
    for a in range(24):
        for b in range(24):
            if a // 4 == b // 4 or a % 4 != b % 4:  # rail-optimised: NIC r talks to NIC r of the other hosts
                continue
            leaf_a, leaf_b = f"leaf-{a // 12}-r{a % 4}", f"leaf-{b // 12}-r{b % 4}"
            path = leaf_a if leaf_a == leaf_b else f"{leaf_a}|spine-{(3 * (a // 4) + 5 * (b // 4) + a % 4) % 4}|{leaf_b}"
            rows += [(a, b, path)] * n
    src, dst = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    path = np.array([r[2] for r in rows], dtype=object)
    size = np.full(len(rows), 4 << 20)
    dur = (size / 50.0 * rng.lognormal(0, 0.02, len(rows))).astype(np.int64)
    slow = np.zeros(len(rows), dtype=bool)
    if slow_host is not None:
        slow |= (src // 4 == slow_host) | ((dst // 4 == slow_host) & (not sender_only))
    if slow_spine is not None:
        slow |= np.array([f"|{slow_spine}|" in p for p in path])
    dur = np.where(slow, (dur * factor).astype(np.int64), dur)
    bw = SwitchBandwidth(window_s=60, hosts=[f"srv{i // 4}" for i in range(24)])
    bw.partial_fit(np.sort(rng.integers(0, 50_000_000_000, len(rows))), dur, size, pd.Categorical(path), src=src, dst=dst)
    return bw


def test_host_or_link_on_a_small_fabric():
    """A host pacing its own sends: without the host test the links it sends over are blamed (each carries its flows
    and too few other senders to vote); with it, the host is, and nothing else. A host slow both ways is named once,
    with both sides' evidence; a slow spine stays the spine; a healthy fabric is quiet."""
    without = SwitchDiagnoser(min_host_breadth=1.1).fit(_fabric(slow_host=2, sender_only=True)).predict()
    assert set(without["kind"]) == {"slow_link"}, "the host's links look slow when the host is not tested"
    got = SwitchDiagnoser().fit(_fabric(slow_host=2, sender_only=True)).predict()
    assert got["kind"].tolist() == ["slow_host"] and got["subject"].tolist() == ["srv2"], got["explanation"].tolist()
    assert "as sender" in got["explanation"].iloc[0] and "as receiver" not in got["explanation"].iloc[0]
    assert 0.3 < got["score"].iloc[0] < 0.4  # 3x slower
    both = SwitchDiagnoser().fit(_fabric(slow_host=4)).predict()
    assert both["kind"].tolist() == ["slow_host"] and both["subject"].tolist() == ["srv4"], both["explanation"].tolist()
    assert "as sender" in both["explanation"].iloc[0] and "as receiver" in both["explanation"].iloc[0]
    spine = SwitchDiagnoser().fit(_fabric(slow_spine="spine-1")).predict()
    assert spine[["kind", "subject"]].values.tolist() == [["slow_switch", "spine-1"]], spine["explanation"].tolist()
    assert SwitchDiagnoser().fit(_fabric()).predict().empty


@needs_sa
def test_real_timing_straggler_with_slow_transfers_is_the_host(tmp_path):
    """Flows derived from the real ST and SE traces, a 2x straggler per job whose transfers are 2x slower too: the
    straggler is still named (slow_group), its server is the slow host, and not one link or switch is blamed."""
    jobs = [read_trace_job(SA, "ST", tp=8, steps=14, straggler=Straggler(dp=1, stage=2, from_step=4)),
            read_trace_job(SA, "SE", tp=8, steps=12, straggler=Straggler(dp=3, stage=0, from_step=4))]
    c = trace_cluster(jobs, noise=CollectorNoise())
    stragglers = sorted(s.split("|")[0] for s in c.faults["subject"])
    for s in stragglers:
        c = with_slow_transfers(c, s, 2.0)
    r, row = _replay(c, tmp_path)
    an = r.analysis.anomalies
    assert not (set(an["kind"]) & FABRIC), _show(r)
    assert sorted(an.loc[an["kind"] == "slow_host", "subject"].unique()) == stragglers, _show(r)
    named = {s for x in an.loc[an["kind"] == "slow_group", "subject"] for s in str(x).split("|")}
    assert set(stragglers) <= named, _show(r)
    assert row["faults_found"] == row["faults"] == 4 and row["anomalies_unexplained"] == 0, _show(r)


@needs_sa
def test_real_timing_no_fabric_alarm():
    """The fault-free real-trace flows: no host, switch or link is slow."""
    c = trace_cluster([read_trace_job(SA, "ST", tp=8, steps=12), read_trace_job(SA, "SE", tp=8, steps=10)], noise=CollectorNoise())
    topo = Topology.from_frame(c.topology)
    a, b = topo.nic_index(c.flows["src"]), topo.nic_index(c.flows["dst"])
    g = (a >= 0) & (b >= 0)
    f = c.flows[g]
    bw = SwitchBandwidth(60, hosts=topo.servers[topo.server_codes])
    bw.partial_fit(f["start_ns"].to_numpy(), f["duration_ns"].to_numpy(), f["size"].to_numpy(), f["switches"], src=a[g], dst=b[g])
    assert SwitchDiagnoser().fit(bw).predict().empty
