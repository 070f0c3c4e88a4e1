"""Job recognition (LLMPrism Algorithm 1) against the generator's ground truth."""
import numpy as np
import pandas as pd
import pytest

from prism.analysis.evaluation import adjusted_rand_index
from prism.analysis.jobs import JobRecogniser, gpu_clusters, merge_identical_server_sets
from prism.ingest.topology import Topology
from prism.offline.replay import replay
from synthetic import preset


def _score(found: pd.DataFrame, truth: pd.DataFrame) -> tuple[float, int, int]:
    f = found.set_index("ip")["job_id"].reindex(truth["ip"])
    missing = int(f.isna().sum())
    extra = len(set(found["ip"]) - set(truth["ip"]))
    return adjusted_rand_index(truth["job_id"], f.fillna("<none>")), missing, extra


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
def test_exact_job_recognition_on_generator_seeds(seed, tmp_path):
    cluster = preset("tiny", seed=seed).generate()
    path = cluster.write(tmp_path)
    res = replay([str(path)], Topology.from_csv(tmp_path / "topology.csv"), progress=False)
    ari, missing, extra = _score(res.jobs, cluster.jobs)
    assert (ari, missing, extra) == (1.0, 0, 0)
    assert res.jobs["job_id"].nunique() == cluster.jobs["job_id"].nunique() == 4


def test_rail_split_jobs_need_the_server_set_merge(tiny_cluster):
    """TP=8 jobs never cross rails: union-find alone splits them per rail."""
    topo = Topology.from_frame(tiny_cluster.topology)
    flows = tiny_cluster.flows
    a = topo.nic_index(flows["src"])
    b = topo.nic_index(flows["dst"])
    gpu = (a >= 0) & (b >= 0)
    raw = JobRecogniser(topo, merge_rails=False).partial_fit_pairs(a[gpu], b[gpu])
    labels = raw.labels()
    truth = tiny_cluster.jobs.assign(nic=topo.ips.get_indexer(tiny_cluster.jobs["ip"]))
    clusters_per_job = truth.assign(c=labels[truth["nic"]]).groupby("job_id")["c"].nunique()
    # the TP=8 jobs are 8 rail clusters each; the TP=4 job's DP rings hop
    # between rails r and r+4 across servers (NVLink joins them inside one),
    # which on the network is 8 clusters too, each spanning two rails
    assert clusters_per_job.to_dict() == {"tp4-pp2-dp4": 8, "tp8-dp4": 8, "tp8-pp2-dp2": 8, "tp8-pp3": 8}
    rails = tiny_cluster.topology["rail"].to_numpy()
    tp4 = truth[truth.job_id == "tp4-pp2-dp4"]
    assert (pd.Series(rails[tp4["nic"]]).groupby(labels[tp4["nic"]]).nunique() == 2).all()
    merged = JobRecogniser(topo).partial_fit_pairs(a[gpu], b[gpu]).predict()
    assert _score(merged, tiny_cluster.jobs)[0] == 1.0


def test_storage_traffic_is_kept_out_of_jobs(tiny_dir, tiny_cluster):
    res = replay([str(tiny_dir / "flows.parquet")], Topology.from_csv(tiny_dir / "topology.csv"), progress=False)
    storage = tiny_cluster.flows["src"].astype(str).str.startswith("10.200.") | tiny_cluster.flows["dst"].astype(str).str.startswith("10.200.")
    assert storage.sum() > 50
    assert res.ignored["non_gpu_address"] == int(storage.sum())
    assert res.flows_gpu == len(tiny_cluster.flows) - int(storage.sum())
    assert not res.jobs["ip"].str.startswith("10.200.").any()
    # a GPU that only talks to storage would have joined a job if storage counted
    assert set(res.jobs["ip"]) == set(tiny_cluster.jobs["ip"])


def test_storage_host_bridging_two_jobs_does_not_merge_them():
    """One storage host serving two jobs must not glue them into one."""
    topo = Topology.from_frame(pd.DataFrame({"ip": [f"10.0.{s}.{g}" for s in range(4) for g in (1, 2)], "server": [f"s{s}" for s in range(4) for _ in (1, 2)]}))
    flows = pd.DataFrame(
        {
            "src": ["10.0.0.1", "10.0.2.1", "10.0.0.2", "10.9.9.9", "10.9.9.9"],
            "dst": ["10.0.1.1", "10.0.3.1", "10.0.1.2", "10.0.0.1", "10.0.2.1"],
        }
    )
    a, b = topo.nic_index(flows["src"]), topo.nic_index(flows["dst"])
    gpu = (a >= 0) & (b >= 0)
    jobs = JobRecogniser(topo).partial_fit_pairs(a[gpu], b[gpu]).predict()
    assert jobs.groupby("job_id")["server"].agg(lambda s: tuple(sorted(set(s)))).sort_values().tolist() == [("s0", "s1"), ("s2", "s3")]


def test_gpu_clusters_union_find():
    labels = gpu_clusters(np.array([0, 1, 5]), np.array([1, 2, 6]), 8)
    assert labels.tolist() == [0, 0, 0, -1, -1, 1, 1, -1]


def test_merge_keeps_different_server_sets_apart():
    # clusters 0,1 on servers {0,1}; cluster 2 on {0,1,2}: not identical, not merged
    clusters = np.array([0, 1, 0, 1, 2, 2, 2])
    servers = np.array([0, 0, 1, 1, 0, 1, 2])
    assert merge_identical_server_sets(clusters, servers).tolist() == [0, 0, 0, 0, 1, 1, 1]


def test_job_ids_are_stable_across_runs(tiny_cluster):
    topo = Topology.from_frame(tiny_cluster.topology)
    flows = tiny_cluster.flows
    a, b = topo.nic_index(flows["src"]), topo.nic_index(flows["dst"])
    g = (a >= 0) & (b >= 0)
    first = JobRecogniser(topo).partial_fit_pairs(a[g], b[g]).predict()
    half = len(a) // 2
    r = JobRecogniser(topo).partial_fit_pairs(a[g][half:], b[g][half:]).partial_fit_pairs(a[g][:half], b[g][:half])
    pd.testing.assert_frame_equal(first, r.predict())


def test_adjusted_rand_index_detects_a_wrong_partition():
    assert adjusted_rand_index([0, 0, 1, 1], ["x", "x", "y", "y"]) == 1.0
    assert adjusted_rand_index([0, 0, 1, 1], [0, 1, 0, 1]) < 0
    assert 0 < adjusted_rand_index([0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 1, 1]) < 1


def test_tp4_job_whose_rails_cover_overlapping_servers_is_one_job():
    """TP=4: two DP replicas per server, ring edges on NVLink there; the paper's identical-set rule splits it."""
    from prism.analysis.evaluation import adjusted_rand_index
    from synthetic import ClusterGenerator, Fabric, JobSpec

    c = ClusterGenerator(Fabric(servers=8, servers_per_group=4, spines=2), [JobSpec("tp2-pp2-dp8", tp=2, pp=2, dp=8, microbatches=4, fwd_ms=3)],
                         duration_s=0.5, seed=1, storage_flows_per_s=0).generate()
    topo = Topology.from_frame(c.topology)
    a, b = topo.nic_index(c.flows["src"]), topo.nic_index(c.flows["dst"])
    ips = topo.nics["ip"].to_numpy()
    for merge, jobs in (("shared", 1), ("identical", None)):
        labels = JobRecogniser(topo, merge=merge).partial_fit_pairs(a, b).labels()
        active = labels >= 0
        n = len(np.unique(labels[active]))
        if jobs is not None:
            assert n == jobs
            truth = c.jobs.set_index("ip")["job_id"].reindex(ips[active]).to_numpy()
            assert adjusted_rand_index(truth, labels[active]) == 1.0
        else:
            assert n > 1, "the identical-set rule alone splits this job (why 'shared' is the default)"


@pytest.mark.parametrize("dense_after", [1, 150, 10**9])
def test_pairs_marked_in_a_table_are_the_sorted_distinct_pairs(dense_after, monkeypatch):
    """A replay's chunks mark pairs in a table (no sort per chunk); from the first chunk, from a later one (the pairs
    kept so far move into it), or never: the same distinct pairs, the same jobs."""
    import prism.analysis.jobs

    monkeypatch.setattr(prism.analysis.jobs, "DENSE_AFTER_ROWS", dense_after)
    rng = np.random.default_rng(5)
    n = 40
    topo = Topology.from_frame(pd.DataFrame({"ip": [f"10.0.{i // 8}.{i % 8 + 1}" for i in range(n)], "server": [f"s{i // 8}" for i in range(n)]}))
    rec = JobRecogniser(topo)
    want = set()
    for size in (100, 200, 50):  # chunks below and above the threshold
        a, b = rng.integers(0, n, size), rng.integers(0, n, size)
        keep = a != b
        rec.partial_fit_pairs(a[keep], b[keep])
        want |= {(min(x, y), max(x, y)) for x, y in zip(a[keep], b[keep])}
    got_a, got_b = rec.pairs
    assert list(zip(got_a.tolist(), got_b.tolist())) == sorted(want)
    assert (rec._seen is not None) == (dense_after <= 200)
