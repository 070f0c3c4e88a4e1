"""DP/PP identification against the generator's ground truth."""
import numpy as np
import pandas as pd
import pytest

from prism.analysis.changepoint import BOCD
from prism.analysis.evaluation import gpu_flow_arrays, gpu_flow_ends, pair_type_truth
from prism.analysis.jobs import JobRecogniser
from prism.analysis.parallelism import ParallelismClassifier, SizeRuleClassifier, pair_steps, refine_by_dp_components
from prism.ingest.topology import Topology
from synthetic import preset


def classify(cluster, clf):
    topo = Topology.from_frame(cluster.topology)
    a, b, start, size = gpu_flow_arrays(cluster.flows, topo)
    end = gpu_flow_ends(cluster.flows, topo)
    labels = JobRecogniser(topo).partial_fit_pairs(a, b).labels()
    p = clf.fit(a, b, start, size, labels, end=end).pairs_
    truth = pair_type_truth(p["a"], p["b"], topo, cluster.pairs)
    assert not pd.isna(truth).any(), "every classified pair is a true GPU pair"
    assert len(p) == len(cluster.pairs), "every true pair is classified"
    return truth, np.where(p["dp"], "DP", "PP")


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_ours_is_exact_on_tiny_clusters(seed):
    truth, pred = classify(preset("tiny", seed=seed).generate(), ParallelismClassifier())
    assert (truth == pred).all(), f"{(truth != pred).sum()} wrong"


@pytest.fixture(scope="module")
def accuracy_minute():
    """One minute of the 'accuracy' preset: realistic steps and noise."""
    return preset("accuracy", seed=1, duration_s=60).generate()


def test_ours_is_exact_on_one_minute_with_realistic_noise(accuracy_minute):
    truth, pred = classify(accuracy_minute, ParallelismClassifier())
    assert (truth == pred).all(), f"{(truth != pred).sum()} wrong of {len(truth)}"


def test_the_noise_really_defeats_the_paper_rule(accuracy_minute):
    """The synthetic noise is not a toy: the published rule misses pairs here."""
    truth, pred = classify(accuracy_minute, SizeRuleClassifier.paper(refine=False))
    assert 0.5 < (truth == pred).mean() < 0.99


def test_pair_steps_recovers_burst_steps():
    """A DP-like pair: bursts of 20 flows 100 us apart, steps 500 ms apart."""
    rng = np.random.default_rng(0)
    n_steps, burst = 30, 20
    step_start = np.cumsum(rng.uniform(480e6, 520e6, n_steps)).astype(np.int64)
    start = (step_start[:, None] + np.arange(burst)[None, :] * 100_000 + rng.integers(0, 5_000, (n_steps, burst))).ravel()
    start.sort()
    key = np.zeros(len(start), dtype=np.int64)
    steps = pair_steps(key, start, BOCD())
    assert steps.tolist() == np.repeat(np.arange(n_steps), burst).tolist()


def test_refinement_leaves_pp_chains_alone():
    # ring 0-1-2-0 is DP; 0-3 and 3-4 are PP (a pipeline hanging off it)
    a = np.array([0, 1, 2, 0, 3])
    b = np.array([1, 2, 0, 3, 4])
    dp = np.array([True, True, False, False, False])
    assert refine_by_dp_components(a, b, dp).tolist() == [True, True, True, False, False]


def test_replay_writes_pairs_matching_truth(tiny_dir, tiny_cluster, tmp_path):
    from prism.cli import main

    assert main(["replay", str(tiny_dir / "flows.parquet"), "--topology", str(tiny_dir / "topology.csv"), "--out", str(tmp_path), "--quiet"]) == 0
    got = pd.read_csv(tmp_path / "pairs.csv")
    assert (got["src"] < got["dst"]).all()
    merged = got.merge(tiny_cluster.pairs, on=["src", "dst"], suffixes=("", "_truth"))
    assert len(merged) == len(got) == len(tiny_cluster.pairs)
    assert (merged["type"] == merged["type_truth"]).all()
    # each true job maps to exactly one recognised job
    assert merged.groupby("job_id_truth")["job_id"].nunique().eq(1).all()


def test_stop_after_jobs_writes_no_pairs(tiny_dir, tmp_path):
    from prism.cli import main

    assert main(["replay", str(tiny_dir / "flows.parquet"), "--topology", str(tiny_dir / "topology.csv"), "--out", str(tmp_path), "--quiet", "--stop-after", "jobs"]) == 0
    assert pd.read_csv(tmp_path / "pairs.csv").empty
    assert not pd.read_csv(tmp_path / "jobs.csv").empty


@pytest.mark.parametrize("scenario", ["clip", "embedding", "pp-sizes", "dist-opt", "all"])
def test_confounders_break_the_size_rule_not_ours(scenario):
    """Collectives on pipeline pairs and varied sizes: the size rule's errors, ours exact (short SYNTHETIC windows)."""
    from synthetic.scenarios import scenario_cluster

    c = scenario_cluster(scenario, seed=3, duration_s=8)
    truth, pred = classify(c, ParallelismClassifier())
    assert (truth == pred).all(), f"{(truth != pred).sum()} wrong of {len(truth)}"
    if scenario in ("clip", "embedding", "all"):
        truth, pred = classify(c, SizeRuleClassifier())
        assert (truth != pred).sum() > 0, "the confounder is not a toy: the size rule errs on it"


def test_two_member_ring_and_pipeline_told_apart_by_symmetry():
    """A DP=2 x PP=2 job (a square of pairs) and a two-replica pure DP job: timing and symmetry decide."""
    from synthetic.scenarios import scenario_cluster

    c = scenario_cluster("baseline", seed=4, duration_s=8)
    topo = Topology.from_frame(c.topology)
    a, b, start, size = gpu_flow_arrays(c.flows, topo)
    end = gpu_flow_ends(c.flows, topo)
    labels = JobRecogniser(topo).partial_fit_pairs(a, b).labels()
    p = ParallelismClassifier().fit(a, b, start, size, labels, end=end).pairs_
    p["truth"] = pair_type_truth(p["a"], p["b"], topo, c.pairs)
    lo, hi = topo.pair_addresses(p["a"], p["b"])
    p["job_t"] = c.pairs.set_index(["src", "dst"])["job_id"].reindex(list(zip(lo, hi))).to_numpy()
    sq = p[p["job_t"] == "tp8-pp2-dp2"]
    assert set(sq["truth"]) == {"DP", "PP"}
    assert (np.where(sq["dp"], "DP", "PP") == sq["truth"]).all()
    assert (sq.loc[sq["truth"] == "DP", "both_ways"] >= 0.97).all() and (sq.loc[sq["truth"] == "PP", "both_ways"] <= 0.9).all()
    two = p[p["job_t"] == "tp8-dp2"]
    assert len(two) and two["dp"].all()


@pytest.mark.parametrize("shape, length, seconds", [("hsdp", "0.3s", 6), ("finetune", "5s", 30)])
def test_rings_of_two_members_in_a_job_without_pipeline_are_certain(shape, length, seconds):
    """SYNTHETIC HSDP (sharded within two servers, replicated twice) and a two-server FSDP fine-tuning job: every
    pair goes both ways at once, and the collectives per layer make the busiest pairs as busy as a pipeline's. With
    no pipeline-like pair in the job the pace is no vote: every pair is DP at or above the uncertain bar (0.6). A
    pace vote against symmetry had left HSDP's shard pairs at 0.5 (and the fine-tuning job's at 45 s steps)."""
    from synthetic.dpshapes import dp_cluster

    c = dp_cluster(shape, length, duration_s=seconds, with_faults=False)
    topo = Topology.from_frame(c.topology)
    a, b, start, size = gpu_flow_arrays(c.flows, topo)
    end = gpu_flow_ends(c.flows, topo)
    labels = JobRecogniser(topo).partial_fit_pairs(a, b).labels()
    p = ParallelismClassifier().fit(a, b, start, size, labels, end=end).pairs_
    assert len(p) == len(c.pairs) and p["dp"].all()
    assert (p["confidence"] >= 0.6).all(), p[["both_ways", "rel_rate", "confidence", "evidence"]].to_string()


def _pair_sums_by_sorting(src, dst, start, end, size, merge_ns, every_flow):
    """The per-pair sums as numpy gave them before the compiled pass: one sort by (pair, start), bincounts over it."""
    from prism.analysis.parallelism import pair_episodes

    n_nodes = int(max(src.max(), dst.max())) + 1
    key = np.minimum(src, dst).astype(np.int64) * n_nodes + np.maximum(src, dst)
    o = np.lexsort((start, key))
    key, st, en, fwd, sz = key[o], start[o], end[o], (src <= dst)[o], size[o].astype(np.float64)
    new_pair = np.r_[True, key[1:] != key[:-1]]
    pid = np.cumsum(new_pair) - 1
    n = int(pid[-1]) + 1
    big = np.maximum.reduceat(sz, np.flatnonzero(new_pair))
    bulk = (sz >= 0.01 * big[pid]) | every_flow
    new_ep = np.zeros(len(pid), dtype=bool)
    new_ep[bulk] = pair_episodes(pid[bulk], st[bulk], en[bulk], merge_ns)
    ep_id = np.cumsum(new_ep[bulk]) - 1
    ep_fwd, ep_all = np.bincount(ep_id, weights=fwd[bulk]), np.bincount(ep_id)
    ep_both = (ep_fwd > 0) & (ep_fwd < ep_all)
    return (key[new_pair], np.bincount(pid, minlength=n), st[new_pair], np.maximum.reduceat(en, np.flatnonzero(new_pair)),
            np.bincount(pid, weights=sz, minlength=n), np.bincount(pid, weights=sz * fwd, minlength=n),
            np.bincount(pid, weights=new_ep, minlength=n), np.bincount(pid[bulk][new_ep[bulk]], weights=ep_both, minlength=n))


@pytest.mark.parametrize("seed", range(6))
def test_pair_sums_equal_the_sorted_bincounts(seed, monkeypatch):
    """The compiled per-pair pass gives exactly (floats too) what a sort by (pair, start) and numpy's bincounts give,
    on flows in start order (no sort) and out of it (ties in start included), light flows on or off."""
    from prism.analysis.parallelism import _pair_sums, pair_ids
    from prism.common import ordering

    rng = np.random.default_rng(seed)
    n, nics = 3_000, 40
    src = rng.integers(0, nics, n)
    dst = (src + rng.integers(1, nics, n)) % nics
    start = np.cumsum(rng.integers(0, 3, n) * 10_000)  # ties, and gaps around the merge slack
    if seed % 2:
        start = rng.permutation(start)
    end = start + rng.integers(1, 30_000, n)
    size = rng.choice([8, 100, 300, 4096, 10_000, 30_000], n)  # 100 and 300: a pair's floor, met exactly
    want_by_flags = {f: _pair_sums_by_sorting(src, dst, start, end, size, 20_000, f) for f in (False, True)}
    for every_flow, dense in ((False, True), (True, True), (False, False)):
        monkeypatch.setattr(ordering, "MAX_COUNTING_KEYS", 1 << 24 if dense else 1)  # numbered by a table, or by a sort
        in_time = np.argsort(start, kind="stable") if seed % 2 else np.zeros(0, np.int64)
        pair, n_pairs = pair_ids(src, dst, nics)
        lo, hi, *got = _pair_sums(src, dst, start, end, size.astype(np.float64), in_time, pair, n_pairs, np.int64(20_000), every_flow)
        key, *want = want_by_flags[every_flow]
        assert (lo * nics + hi).tolist() == key.tolist()
        for g, w in zip(got, want):
            assert g.tolist() == w.tolist()
