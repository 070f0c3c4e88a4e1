"""The modern shapes of the SYNTHETIC generator (synthetic/modern.py): MoE all-to-all and ring attention, their truth self-consistent."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from prism.analysis.evaluation import pair_type_truth
from prism.ingest.topology import Topology
from synthetic.generator import EPOCH_NS, _simulation
from synthetic.modern import CPJob, CPSimulation, MoEJob, MoESimulation, modern_cluster, modern_job


@pytest.fixture(scope="module")
def moe():
    return modern_cluster("moe", seed=1, duration_s=5.0, with_faults=False)


@pytest.fixture(scope="module")
def cp():
    return modern_cluster("cp", seed=1, duration_s=4.0, with_faults=False)


def _codes(c):
    """Flows as (src, dst) GPU ip strings, start and size arrays (GPU pairs only)."""
    f = c.flows
    gpu = set(c.topology["ip"])
    m = f["src"].astype(str).isin(gpu).to_numpy() & f["dst"].astype(str).isin(gpu).to_numpy()
    f = f[m]
    return f["src"].astype(str).to_numpy(), f["dst"].astype(str).to_numpy(), f["start_ns"].to_numpy(), f["size"].to_numpy()


def test_the_generator_dispatches_the_modern_shapes():
    assert _simulation(modern_job("moe")) is MoESimulation
    assert _simulation(modern_job("cp")) is CPSimulation
    with pytest.raises(ValueError):
        modern_job("dense")
    with pytest.raises(ValueError):
        MoEJob("bad", tp=8, dp=12, pp=2, ep=8).check()
    with pytest.raises(ValueError):
        CPJob("bad", tp=4, dp=2, pp=2, cp=4).check()


def test_truth_pair_types_count_the_groups(moe, cp):
    # MoE: 2 stages x 2 domains x 8 rails EP groups of 8 (28 pairs each); PP per GPU of stage 0; DP: the ring edges between domains
    assert moe.pairs["type"].value_counts().to_dict() == {"EP": 2 * 2 * 8 * 28, "PP": 128, "DP": 2 * 8 * 2}
    # CP: a 4-ring per rail, replica and stage; DP: two-member rings per rail, CP rank and stage; PP per GPU of stage 0
    assert cp.pairs["type"].value_counts().to_dict() == {"CP": 8 * 2 * 2 * 4, "PP": 64, "DP": 8 * 4 * 2}
    # the scorer reads the new types like the old ones
    topo = Topology.from_frame(cp.topology)
    row = cp.pairs.iloc[[0, -1]]
    got = pair_type_truth(topo.nic_index(row["src"]), topo.nic_index(row["dst"]), topo, cp.pairs)
    assert list(got) == list(row["type"])


def test_moe_all_to_all_is_a_clique_at_one_instant_with_hot_experts(moe):
    src, dst, start, size = _codes(moe)
    ep = moe.pairs[moe.pairs["type"] == "EP"]
    one = ep.iloc[0]
    # the EP group of that pair: the pair's rail, the servers sharing EP pairs with its src
    members = sorted(set(ep.loc[(ep["src"] == one["src"]) | (ep["dst"] == one["src"]), ["src", "dst"]].to_numpy().ravel()))
    assert len(members) == 8
    inside = np.isin(src, members) & np.isin(dst, members)
    t = np.sort(np.unique(start[inside]))
    instant = t[len(t) // 2]
    at = inside & (start == instant)
    if at.sum() < 56:  # a dense ring flow may start at that instant too; take the all-to-all's
        instant = pd.Series(start[inside]).value_counts().idxmax()
        at = inside & (start == instant)
    pairs = set(zip(src[at], dst[at]))
    assert len(pairs) == 56  # every member sends to each of the other 7 at once
    # hot experts: per receiver (dispatch) or sender (combine) the bytes differ by more than the noise
    ratio = max(pd.Series(size[at]).groupby(x).mean().pipe(lambda s: s.max() / s.min()) for x in (src[at], dst[at]))
    assert ratio > 1.3
    assert size[at].max() / size[at].min() > 2
    # many all-to-alls a step: 2 micro-batches' worth at least per second on a pair, forward and backward
    steps = moe.steps
    pair = (src == members[0]) & (dst == members[1])
    assert pair.sum() >= 2 * 2 * 2 * 4 * (len(steps) - 1)


def test_cp_ring_is_one_way_with_rounds_per_layer(cp):
    src, dst, start, size = _codes(cp)
    cpp = cp.pairs[cp.pairs["type"] == "CP"]
    fwd = pd.Series(1, index=pd.MultiIndex.from_arrays([src, dst])).groupby(level=[0, 1]).size()
    for r in cpp.itertuples(index=False):
        ab, ba = fwd.get((r.src, r.dst), 0), fwd.get((r.dst, r.src), 0)
        assert min(ab, ba) == 0 and max(ab, ba) > 0  # a ring edge carries one way
    # each ring member sends to exactly one other CP member (its neighbour)
    cp_ips = set(cpp["src"]) | set(cpp["dst"])
    m = np.isin(src, list(cp_ips)) & np.isin(dst, list(cp_ips))
    outs = pd.Series(dst[m & (size >= 1 << 20)]).groupby(src[m & (size >= 1 << 20)]).nunique()
    assert (outs >= 1).all()
    # per step: 4 micro-batches x 4 layers x (3 forward rounds + 3 backward rounds of 2 flows) on an edge
    job = modern_job("cp")
    r0 = cpp.iloc[0]
    a, b = (r0.src, r0.dst) if fwd.get((r0.src, r0.dst), 0) else (r0.dst, r0.src)
    e = (src == a) & (dst == b)
    steps = cp.steps
    s0, s1 = steps["start_ns"].iloc[1], steps["end_ns"].iloc[1]
    per_step = int(((start >= s0) & (start < s1) & e).sum())
    assert per_step == job.microbatches * job.attn_layers * 3 * (job.cp - 1)


@pytest.mark.parametrize("kind", ["moe", "cp"])
def test_step_truth_is_contiguous_and_regular(kind, moe, cp):
    c = moe if kind == "moe" else cp
    s = c.steps
    assert len(s) >= 2
    assert (s["start_ns"].iloc[1:].to_numpy() == s["end_ns"].iloc[:-1].to_numpy()).all()
    assert s["start_ns"].min() >= EPOCH_NS and s["end_ns"].max() <= c.meta["window_end_ns"]
    d = (s["end_ns"] - s["start_ns"]).to_numpy()
    assert d.max() / d.min() < 1.1
    # the step ends at the DP collective: the last DP flow of the step ends at the step's end
    dp = c.pairs[c.pairs["type"] == "DP"]
    src, dst, start, size = _codes(c)
    f = c.flows
    gpu = set(c.topology["ip"])
    f = f[f["src"].astype(str).isin(gpu).to_numpy() & f["dst"].astype(str).isin(gpu).to_numpy()]
    key = set(zip(dp["src"], dp["dst"])) | set(zip(dp["dst"], dp["src"]))
    on_dp = np.fromiter(((x, y) in key for x, y in zip(src, dst)), bool, len(src))
    end = (f["start_ns"] + f["duration_ns"]).to_numpy()[on_dp]
    e0 = s["end_ns"].iloc[0]
    assert np.abs(end - e0).min() < 200_000  # within a ring step


def test_faulty_and_fault_free_twins_share_their_draws():
    a = modern_cluster("cp", seed=3, duration_s=2.0, with_faults=False)
    b = modern_cluster("cp", seed=3, duration_s=2.0, with_faults=False)
    pd.testing.assert_frame_equal(a.flows, b.flows)
    f = modern_cluster("cp", seed=3, duration_s=12.0, with_faults=True)
    assert (f.faults["kind"] == "slow_group").sum() == 1


@pytest.mark.parametrize("kind", ["moe", "cp"])
def test_the_classifier_types_ep_and_cp_pairs(kind, moe, cp):
    from prism.analysis.evaluation import gpu_flow_arrays, gpu_flow_ends
    from prism.analysis.parallelism import ParallelismClassifier

    c = moe if kind == "moe" else cp
    topo = Topology.from_frame(c.topology)
    a, b, s, z = gpu_flow_arrays(c.flows, topo)
    job_of = np.zeros(len(topo), dtype=np.int64)
    p = ParallelismClassifier().fit(a, b, s, z, job_of, end=gpu_flow_ends(c.flows, topo), server_of=topo.server_codes).pairs_
    truth = pair_type_truth(p["a"].to_numpy(), p["b"].to_numpy(), topo, c.pairs)
    assert (p["type"].to_numpy() == truth).all()
    modern = p["type"].isin(["EP", "CP"]).to_numpy()
    assert modern.sum() == (c.pairs["type"] == ("EP" if kind == "moe" else "CP")).sum()
    assert (p.loc[modern, "confidence"] >= 0.7).all() and not p.loc[modern, "dp"].any()
    # without the signals they rest on, no pair is called EP or CP
    q = ParallelismClassifier(without=("structure", "timing")).fit(a, b, s, z, job_of, end=gpu_flow_ends(c.flows, topo)).pairs_
    assert not q["type"].isin(["EP", "CP"]).any()


def test_ring_bursts_on_all_to_all_pairs_are_one_way_runs():
    from prism.analysis.analyse import ring_bursts_on

    # pair 0 (nodes 0-1): an all-to-all both ways at t=0, then a 3-chunk ring burst 0 -> 1 at t=1 ms; pair 1 (2-3): 2 one-way flows
    a = np.array([0, 1, 0, 0, 0, 2, 2])
    b = np.array([1, 0, 1, 1, 1, 3, 3])
    start = np.array([0, 0, 1_000_000, 1_010_000, 1_020_000, 0, 10_000], dtype=np.int64)
    end = start + 9_000
    pair = np.array([0, 0, 0, 0, 0, 1, 1])
    got = ring_bursts_on(np.ones(7, dtype=bool), pair, a, b, start, end)
    assert got.tolist() == [False, False, True, True, True, False, False]
    assert not ring_bursts_on(np.zeros(7, dtype=bool), pair, a, b, start, end).any()


def test_flat_moe_steps_end_at_the_dense_ring_on_ep_pairs(tmp_path):
    from prism.analysis.evaluation import score_cluster
    from prism.offline.replay import replay

    c = modern_cluster("moe-flat", seed=0, duration_s=8.0, with_faults=False)
    assert c.pairs["type"].value_counts().to_dict() == {"EP": 448, "PP": 64}  # no pair is DP only
    c.write(tmp_path)
    r = replay([str(tmp_path / "flows.parquet")], Topology.from_csv(tmp_path / "topology.csv"), progress=False)
    row = score_cluster(r, c)
    assert row["pair_acc"] == 1.0
    assert row["steps_found"] == row["true_steps"] >= 4 and row["steps_spurious"] == 0
    assert row["anomalies"] == 0


def test_the_replay_summary_counts_ep_and_cp_pairs(tmp_path, cp):
    """The summary's per-job pair counts name the expert and context parallel pairs (keys only where a job has them)."""
    from prism.offline.replay import format_summary, replay

    cp.write(tmp_path)
    r = replay([str(tmp_path / "flows.parquet")], Topology.from_csv(tmp_path / "topology.csv"), progress=False)
    job = r.summary()["jobs"][0]
    truth = cp.pairs["type"].value_counts()
    assert job["cp_pairs"] == truth["CP"] and job["dp_pairs"] == truth["DP"] and "ep_pairs" not in job
    assert f"/ {truth['CP']} CP pairs" in format_summary(r)
    ring = modern_job("cp").cp
    assert job["cp"] == ring and "ep" not in job  # GPUs per attention ring, from the CP pairs' components
    assert f"context-parallel rings of {ring}" in format_summary(r)


def test_the_replay_summary_names_the_expert_group_size(tmp_path, moe):
    """The MoE job's all-to-all groups: their size (the generator's ``ep``) in the summary, beside DP x PP."""
    from prism.offline.replay import format_summary, replay

    moe.write(tmp_path)
    r = replay([str(tmp_path / "flows.parquet")], Topology.from_csv(tmp_path / "topology.csv"), progress=False)
    job = r.summary()["jobs"][0]
    assert job["ep"] == modern_job("moe").ep and "cp" not in job
    assert f"expert all-to-all groups of {job['ep']}" in format_summary(r)


def test_modern_scenarios_put_the_jobs_beside_3d_jobs_with_the_confounders():
    from synthetic.scenarios import MODERN_SCENARIOS, SCENARIOS, modern_scenario_generator, scenario_generator

    assert {"moe-all", "cp-all", "moe-baseline", "cp-collector"} <= set(MODERN_SCENARIOS)
    assert len(MODERN_SCENARIOS) == 2 * len(SCENARIOS)
    g, noisy = scenario_generator("moe-all")  # the matrix's entry point knows them too
    names = [j.name for j in g.jobs]
    assert names[:2] == ["moe-ep8", "moe-flat-ep8"] and "tp8-pp2-dp2" in names and noisy
    assert all(j.clip_allreduce and j.dp_overlap and j.distributed_optimizer and j.rank_order == "tp-pp-dp" for j in g.jobs)
    assert {f.job for f in g.faults if hasattr(f, "job")} == {"moe-ep8", "moe-flat-ep8"}
    g, noisy = modern_scenario_generator("cp-clip")
    assert g.jobs[0].name == "ring-cp4" and g.jobs[0].clip_allreduce and not g.jobs[0].dp_overlap and not noisy
    with pytest.raises(ValueError):
        modern_scenario_generator("moe-flat")


def test_cp_job_in_the_other_rank_order_keeps_each_ring_in_a_stage():
    from synthetic.fabric import Fabric
    from synthetic.generator import ClusterGenerator

    job = modern_job("cp", rank_order="tp-pp-dp")
    c = ClusterGenerator(Fabric(servers=20, servers_per_group=8), [job], duration_s=2.0, seed=0, with_faults=False,
                         uniform_dp_share=0.0, storage_flows_per_s=0).generate()
    assert c.pairs["type"].value_counts().to_dict() == {"CP": 128, "PP": 64, "DP": 64}
    server = Topology.from_frame(c.topology).nics.set_index("ip")["server"]
    first = min(server[c.jobs["ip"]])
    pos = lambda ips: np.array([int(s[3:]) for s in server[ips]]) - int(first[3:])  # noqa: E731
    for kind, apart in (("CP", {1, 3}), ("PP", {4}), ("DP", {8})):  # tp-cp-pp-dp: CP ranks next to each other, then stages, then replicas
        p = c.pairs[c.pairs["type"] == kind]
        assert set(np.abs(pos(p["dst"]) - pos(p["src"])).tolist()) == apart, kind
