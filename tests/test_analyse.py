"""Analysing whole jobs in batches gives what one run over every flow gives; job shapes."""
import numpy as np
import pandas as pd
import pytest

import prism.analysis.analyse
import prism.analysis.batches
import prism.offline.spill
from prism.analysis.timeline import parallel_groups
from prism.ingest.topology import Topology
from prism.offline.replay import replay
from synthetic import preset
from synthetic.scenarios import scenario_cluster

FRAMES = ("pairs", "shapes", "steps", "phases", "group_lag", "anomalies", "switch_bandwidth")


@pytest.mark.parametrize("cluster", ["tiny", "all"])
def test_job_batches_equal_one_run(cluster, tmp_path, monkeypatch):
    """Every job alone, jobs in pairs, and all at once: the same frames, in the same order.

    SYNTHETIC: the tiny preset (four jobs, three faults) and the scenario
    matrix's ``all`` cluster (every confounder, collector noise, seven jobs
    of mixed layouts, faults).
    """
    c = preset("tiny", seed=0).generate() if cluster == "tiny" else scenario_cluster("all", seed=1, duration_s=20.0)
    c.write(tmp_path)
    topo = Topology.from_csv(tmp_path / "topology.csv")
    runs = {}
    job_flows = c.flows.groupby(c.jobs.set_index("ip")["job_id"].reindex(c.flows["src"].astype(str)).to_numpy()).size()
    few = int(job_flows.max()) + 1
    monkeypatch.setattr(prism.offline.spill, "SLICE_ROWS", len(c.flows) // 5)  # the spilled file is scattered in several slices
    spill = tmp_path / "spill"
    spill.mkdir()
    for name, budget, spill_above in (
        ("one run", 10**12, None), ("each job alone", 1, None), ("a few jobs a batch", few, None),
        # spilled to disk from the first chunk, or from the third (chunks held so far are written then)
        ("one run, spilled", 10**12, 0), ("each job alone, spilled", 1, 0), ("a few jobs a batch, spilled", few, len(c.flows) // 3),
    ):
        monkeypatch.setattr(prism.analysis.batches, "JOB_BATCH_FLOWS", budget)
        res = replay([str(tmp_path / "flows.parquet")], topo, progress=False, chunk_rows=max(len(c.flows) // 8, 1),
                     spill_above=spill_above, spill_dir=spill)
        assert res.flows_spilled == (0 if spill_above is None else res.flows_gpu)
        # scattered and read back by batch: its own stage (progress and time); one batch is read whole
        assert ("spill" in res.stage_seconds) == (spill_above is not None and budget < 10**12)
        assert not any(spill.iterdir())  # the spilled files are removed
        runs[name] = res.analysis
    one = runs.pop("one run")
    assert len(one.steps) and len(one.anomalies)  # something to compare
    for name, got in runs.items():
        for frame in FRAMES:
            pd.testing.assert_frame_equal(getattr(got, frame), getattr(one, frame), obj=f"{name}: {frame}")


def _reference_shapes(p, labels, comps, names, jobs):
    """The shapes with pandas, one groupby per statistic (what the numpy version must give)."""
    gpus = jobs.groupby("job_id").size()
    out = pd.DataFrame(index=gpus.index).assign(dp=1, pp=1, dp_exact=True)
    dp_mask = p["dp"].to_numpy()
    for kind, m in (("dp", dp_mask), ("pp", ~dp_mask)):
        a, b = p["a"].to_numpy()[m], p["b"].to_numpy()[m]
        if len(a) == 0:
            continue
        comp = comps[kind]
        nodes = np.unique(np.concatenate([a, b]))
        c = pd.DataFrame({"comp": comp[nodes], "job": labels[nodes]}).groupby("comp").agg(job=("job", "first"), size=("job", "size"))
        e = pd.DataFrame({"comp": comp[a], "one_way": p["one_way"].to_numpy()[m]}).groupby("comp").agg(edges=("one_way", "size"), one_way=("one_way", "all"))
        c = c.join(e)
        c["job_id"] = c["job"].map(names)
        if kind == "pp":
            out.loc[:, "pp"] = c.groupby("job_id")["size"].agg(lambda x: int(x.mode().iloc[0])).reindex(out.index).fillna(1).astype(int)
        else:
            ring = ((c["edges"] == c["size"]) & (c["size"] >= 3)) | ((c["size"] == 2) & ~c["one_way"])
            out.loc[:, "dp"] = c.groupby("job_id")["size"].max().reindex(out.index).fillna(1).astype(int)
            out.loc[:, "dp_exact"] = ring.groupby(c["job_id"]).all().reindex(out.index).fillna(True).astype(bool)
    out["gpus"] = gpus
    out["nics_per_stage"] = (out["gpus"] // (out["dp"] * out["pp"])).clip(lower=1)
    return out.rename_axis("job_id").reset_index()


def _pairs(edges, dp, one_way=False):
    a, b = np.array([e[0] for e in edges]), np.array([e[1] for e in edges])
    return pd.DataFrame({"a": a, "b": b, "dp": np.full(len(a), dp), "one_way": np.full(len(a), one_way)})


def test_shapes_count_rings_and_pipelines():
    # job 0 on NICs 0-11: a closed DP ring 0-1-2, an open one 3-4-5 (one-way edges: NVLink inside),
    # pipelines 0-6-7-8, 1-9-10-11 (4 stages) and 2-3 (2): PP is the usual length, 4
    p = pd.concat([_pairs([(0, 1), (1, 2), (2, 0)], True), _pairs([(3, 4), (4, 5)], True, one_way=True),
                   _pairs([(0, 6), (6, 7), (7, 8), (1, 9), (9, 10), (10, 11), (2, 3)], False)], ignore_index=True)
    dp = p["dp"].to_numpy()
    comps = {k: parallel_groups(p["a"].to_numpy()[m], p["b"].to_numpy()[m], 12) for k, m in (("dp", dp), ("pp", ~dp))}
    jobs = pd.DataFrame({"job_id": "job-a", "ip": [f"10.0.0.{i}" for i in range(24)]})  # 24 GPUs seen
    got = prism.analysis.analyse._shapes(p, np.zeros(12, dtype=np.int64), comps, {0: "job-a"}, jobs).iloc[0]
    assert (got["dp"], got["pp"], got["gpus"], got["nics_per_stage"], bool(got["dp_exact"])) == (3, 4, 24, 2, False)


@pytest.mark.parametrize("seed", range(4))
def test_shapes_equal_the_pandas_reference(seed):
    """Random pair graphs, labels without a job, jobs without pairs, ties between pipeline lengths."""
    rng = np.random.default_rng(seed)
    for _ in range(250):
        n, k = int(rng.integers(4, 60)), int(rng.integers(1, 80))
        a, b = rng.integers(0, n, k), rng.integers(0, n, k)
        a, b = a[a != b], b[a != b]
        dp = rng.random(len(a)) < 0.5
        p = pd.DataFrame({"a": a, "b": b, "dp": dp, "one_way": rng.random(len(a)) < 0.5})
        comps = {"dp": parallel_groups(a[dp], b[dp], n), "pp": parallel_groups(a[~dp], b[~dp], n)}
        labels = rng.integers(-1, 4, n)
        names = {x: f"job-{x}" for x in range(4) if rng.random() < 0.9}
        ids = [names[x] for x in labels if x in names] + (["job-9"] if rng.random() < 0.3 else [])
        jobs = pd.DataFrame({"job_id": ids, "ip": range(len(ids))})
        pd.testing.assert_frame_equal(prism.analysis.analyse._shapes(p, labels, comps, names, jobs), _reference_shapes(p, labels, comps, names, jobs))


def _phase_reference(fs, a, is_dp, start, end, size, comp, min_pause):
    """Per (step row, DP, group): first start, last end, flows, bytes, last member's arrival in the last burst; by loops."""
    out = {}
    for key in sorted({(int(f), bool(d), int(c)) for f, d, c in zip(fs, is_dp, comp) if f >= 0}):
        idx = [i for i in np.lexsort((start,)) if (fs[i], bool(is_dp[i]), comp[i]) == key]  # by start, ties in input order
        busy, best, opener = end[idx[0]], min_pause, 0
        for j in range(1, len(idx)):
            pause = start[idx[j]] - busy
            if pause > min_pause and pause >= best:
                best, opener = pause, j
            busy = max(busy, end[idx[j]])
        firsts = {}
        for j in idx[opener:]:
            firsts.setdefault(a[j], start[j])
        out[key] = (start[idx[0]], busy, len(idx), int(size[idx].sum()), max(firsts.values()))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_phases_are_each_groups_span_and_last_arrival_in_any_flow_order(seed):
    """The phase table per (step, DP or PP, group), checked against loops; flows given out of start order (a group's
    flows not sorted) give the same table."""
    from prism.analysis.analyse import MIN_PAUSE_NS, _phases

    rng = np.random.default_rng(seed)
    n, nics = 600, 12
    topo = Topology.from_frame(pd.DataFrame({"ip": [f"10.0.0.{i + 1}" for i in range(nics)], "server": [f"s{i // 4}" for i in range(nics)]}))
    steps = pd.DataFrame({"job_id": ["job-a"] * 3 + ["job-b"] * 2, "step": [0, 1, 2, 0, 1]})
    dp_comp, pp_comp = np.arange(nics) // 4, np.arange(nics) % 3
    fs = rng.integers(-1, len(steps), n)
    a, is_dp = rng.integers(0, nics, n), rng.random(n) < 0.5
    start = np.sort(rng.integers(0, 40, n) * 10_000)  # pauses around MIN_PAUSE_NS, and ties
    end = start + rng.integers(1, 15_000, n)
    size = rng.integers(1, 1 << 20, n)
    comp = np.where(is_dp, dp_comp[a], pp_comp[a])
    want = _phase_reference(fs, a, is_dp, start, end, size, comp, MIN_PAUSE_NS)
    shuffled = rng.permutation(n)
    for o in (np.arange(n), shuffled):
        got = _phases(steps, fs[o], a[o], is_dp[o], start[o], end[o], size[o], dp_comp, pp_comp, topo)
        assert len(got) == len(want)
        for (row, dp, c), r in zip(want, got.itertuples(index=False)):
            assert (r.job_id, r.step, r.kind) == (steps["job_id"][row], steps["step"][row], "dp_collective" if dp else "pp_traffic")
            assert (r.start_ns, r.end_ns, r.flows, r.bytes, r.arrival_ns) == want[(row, dp, c)]


@pytest.mark.parametrize("seed", range(4))
def test_first_flows_are_the_earliest_of_each_directed_pair_and_step(seed):
    """Per (step, src, dst), in that order: the flow that started first (the first given on a tie), as a sort by
    (step, src, dst, start) finds it; flows out of start order too."""
    from prism.analysis.analyse import _first_flows

    rng = np.random.default_rng(seed)
    n = 500
    steps = pd.DataFrame({"job_id": ["j"] * 6, "step": np.arange(6)})
    fs, a, b = rng.integers(0, 6, n), rng.integers(0, 30, n) * 7, rng.integers(0, 30, n) * 7  # sparse NIC numbers
    start = rng.integers(0, 50, n)  # ties
    if seed % 2 == 0:
        start = np.sort(start)
    end = start + rng.integers(1, 9, n)
    o = np.lexsort((start, b, a, fs))
    new = np.r_[True, (np.diff(fs[o]) != 0) | (np.diff(a[o]) != 0) | (np.diff(b[o]) != 0)]
    want = o[new]
    got = _first_flows(fs, a, b, start, end, steps)
    assert got["src"].tolist() == a[want].tolist() and got["dst"].tolist() == b[want].tolist()
    assert got["step"].tolist() == fs[want].tolist()
    assert got["start_ns"].tolist() == start[want].tolist() and got["end_ns"].tolist() == end[want].tolist()
