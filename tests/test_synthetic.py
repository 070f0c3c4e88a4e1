"""The SYNTHETIC generator: determinism, twin, ground truth consistency, faults."""
import json

import numpy as np
import pandas as pd
import pytest

from synthetic import Fabric, JobSpec, preset
from synthetic.generator import EPOCH_NS


def test_same_seed_same_cluster():
    a = preset("tiny", seed=7).generate()
    b = preset("tiny", seed=7).generate()
    pd.testing.assert_frame_equal(a.flows, b.flows)
    pd.testing.assert_frame_equal(a.steps, b.steps)


def test_different_seeds_place_jobs_differently():
    a = preset("tiny", seed=1).generate().meta["jobs"]
    b = preset("tiny", seed=2).generate().meta["jobs"]
    assert any(a[j]["servers"] != b[j]["servers"] for j in a)


def test_truth_pairs_are_the_flows_gpu_pairs(tiny_cluster):
    f = tiny_cluster.flows
    src, dst = f["src"].astype(str).to_numpy(), f["dst"].astype(str).to_numpy()
    gpu = ~(pd.Series(src).str.startswith("10.200.") | pd.Series(dst).str.startswith("10.200.")).to_numpy()
    lo = np.where(src < dst, src, dst)[gpu]
    hi = np.where(src < dst, dst, src)[gpu]
    seen = set(zip(lo, hi))
    truth = set(zip(tiny_cluster.pairs["src"], tiny_cluster.pairs["dst"]))
    assert seen == truth
    assert set(tiny_cluster.pairs["type"]) == {"DP", "PP"}


def test_pp_pairs_see_one_size_and_dp_pairs_several(tiny_cluster):
    f = tiny_cluster.flows
    key = pd.Series(np.minimum(f["src"].astype(str), f["dst"].astype(str)) + "-" + np.maximum(f["src"].astype(str), f["dst"].astype(str)))
    sizes = f.groupby(key.to_numpy())["size"].nunique()
    p = tiny_cluster.pairs
    pk = p["src"] + "-" + p["dst"]
    by_type = sizes.reindex(pk.to_numpy()).groupby(p["type"].to_numpy()).median()
    assert by_type["PP"] <= 3  # one size, plus the occasional split message
    assert by_type["DP"] >= 2


def test_steps_are_whole_and_inside_the_window(tiny_cluster):
    s = tiny_cluster.steps
    w0, w1 = tiny_cluster.meta["window_start_ns"], tiny_cluster.meta["window_end_ns"]
    assert (s["start_ns"] >= w0).all() and (s["end_ns"] <= w1).all()
    assert (s["end_ns"] > s["start_ns"]).all()
    for _, g in s.groupby("job_id"):
        assert g["step"].tolist() == list(range(len(g)))
        # consecutive: each step starts where the previous ended
        assert (g["start_ns"].to_numpy()[1:] == g["end_ns"].to_numpy()[:-1]).all()


def test_no_faults_twin_is_the_counterfactual():
    faulty = preset("tiny", seed=3).generate()
    twin = preset("tiny", seed=3, with_faults=False).generate()
    assert twin.faults.empty and len(faulty.faults) == 3
    pd.testing.assert_frame_equal(faulty.pairs, twin.pairs)
    dur = lambda c: c.steps.assign(d=c.steps.end_ns - c.steps.start_ns).set_index(["job_id", "step"])["d"]  # noqa: E731
    f, t = dur(faulty), dur(twin)
    # before any fault the two runs are identical, step for step
    first_fault = faulty.faults["start_ns"].min()
    early = faulty.steps.set_index(["job_id", "step"])["end_ns"] < first_fault
    idx = early[early].index
    assert (f[idx] == t[idx]).all()
    # the slow step is slower than its twin by about its factor
    ss = faulty.faults[faulty.faults.kind == "slow_step"].iloc[0]
    ratio = f[(ss.job_id, ss.step)] / t[(ss.job_id, ss.step)]
    assert 1.3 < ratio < ss.factor + 0.1
    # the slow server slows its job from its step on
    sg = faulty.faults[faulty.faults.kind == "slow_group"].iloc[0]
    after = f[sg.job_id].iloc[sg.step + 1 :].median() / t[sg.job_id].iloc[sg.step + 1 :].median()
    assert after > 1.1


def test_degraded_switch_slows_the_flows_and_collectives_crossing_it():
    faulty = preset("tiny", seed=3).generate()
    twin = preset("tiny", seed=3, with_faults=False).generate()
    sw = faulty.faults[faulty.faults.kind == "slow_switch"].iloc[0]

    def rate(c):
        f = c.flows[(c.flows.start_ns >= sw.start_ns) & c.flows["switches"].astype(str).str.contains(sw.subject)]
        return (f["size"] / f["duration_ns"]).median()

    assert rate(faulty) < 0.5 * rate(twin)
    # and the jobs whose rings cross it have slower steps after it degrades
    late = lambda c: c.steps[c.steps.start_ns > sw.start_ns].assign(d=lambda s: s.end_ns - s.start_ns).groupby("job_id")["d"].median()  # noqa: E731
    assert (late(faulty) / late(twin)).max() > 1.05


def test_write_labels_output_synthetic(tiny_cluster, tmp_path):
    tiny_cluster.write(tmp_path, fmt="csv.gz")
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["synthetic"] is True and manifest["flows_file"] == "flows.csv.gz"
    for name in ("jobs", "pairs", "steps", "faults"):
        assert (tmp_path / "truth" / f"{name}.csv").exists()
    topo = pd.read_csv(tmp_path / "topology.csv")
    assert list(topo.columns) == ["ip", "server", "rail", "leaf"]


def test_job_spec_checks():
    with pytest.raises(ValueError, match="divide"):
        JobSpec("x", tp=3, dp=8).check()
    with pytest.raises(ValueError, match="one-server"):
        JobSpec("x", tp=8, dp=1, pp=1).check()
    with pytest.raises(ValueError, match="checkpoint"):
        JobSpec("x", tp=8, dp=2, checkpoint_every=-1).check()


def test_checkpoint_every_n_steps_slows_those_steps_only():
    """A checkpoint every 7 steps: the truth step after each is longer by the pause (no traffic in it), the others
    are the same steps as without checkpoints (no random draw added: the same jitter, step by step)."""
    from synthetic.generator import ClusterGenerator

    fab = Fabric(servers=2, gpus_per_server=1, servers_per_group=2, spines=1, storage_hosts=0)
    kw = dict(tp=1, dp=2, microbatches=2, fwd_ms=2, grad_bytes=8 << 20, bucket_bytes=8 << 20)
    plain, ckpt = (ClusterGenerator(fab, [JobSpec("j", **kw, checkpoint_every=every)], duration_s=1.0, seed=3, storage_flows_per_s=0).generate()
                   for every in (0, 7))
    pause = 0.7 * JobSpec("j", **kw).lower_bound_step_ns()
    a = (plain.steps["end_ns"] - plain.steps["start_ns"]).to_numpy()
    b = (ckpt.steps["end_ns"] - ckpt.steps["start_ns"]).to_numpy()
    n = len(b)
    # the pause after simulated step 6, 13, ... is in the next one: whole step 6, 13, ... (the window opens in step 0)
    slow = (np.arange(n) + 1) % 7 == 0
    assert slow.sum() >= 5 and np.allclose(b[slow] - a[:n][slow], pause, rtol=1e-6, atol=2)
    assert np.allclose(b[~slow], a[:n][~slow], atol=2)
    assert ckpt.meta["jobs"]["j"]["checkpoint_every"] == 7


def test_fabric_paths_follow_the_rails():
    fab = Fabric(servers=8, servers_per_group=4, spines=2)
    # same rail, same group: one leaf; other group: leaf-spine-leaf; same server: none
    p = fab.paths(np.array([0, 0, 0]), np.array([8, 40, 1]))
    names = fab.switch_names()
    assert [names[x] for x in p[0] if x >= 0] == ["leaf-g00-r0"]
    assert [names[x] for x in p[1] if x >= 0][0::2] == ["leaf-g00-r0", "leaf-g01-r0"]
    assert (p[2] == -1).all()


def test_epoch_start_is_exact_integer(tiny_cluster):
    assert tiny_cluster.flows["start_ns"].min() >= EPOCH_NS
    assert tiny_cluster.flows["start_ns"].dtype == np.int64
