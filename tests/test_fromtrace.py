"""Flows DERIVED FROM the real StragglerAnalysis op traces: the analyses on real timing."""

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from prism.analysis.evaluation import score_cluster
from prism.ingest.topology import Topology
from prism.offline.replay import replay
from synthetic.fromtrace import CollectorNoise, Straggler, collector_view, read_trace_job, shared_data_dir, trace_cluster, with_straggler

SA = shared_data_dir() / "straggler-analysis"
needs_sa = pytest.mark.skipif(not SA.is_dir(), reason=f"{SA} not present (PRISM_SHARED_DATA names the real-data directory)")


def _replay(cluster, tmp_path):
    cluster.write(tmp_path)
    r = replay([str(tmp_path / "flows.parquet")], Topology.from_csv(tmp_path / "topology.csv"), progress=False)
    return r, score_cluster(r, cluster)


@needs_sa
@pytest.mark.parametrize("tp,noise", [(8, False), (8, True), (1, True)])
def test_real_timing_fault_free(tp, noise, tmp_path):
    """ST (DP2 x PP4: stage imbalance) and SE (DP32 x PP2: sequence-length imbalance): exact, and no alarm."""
    jobs = [read_trace_job(SA, "ST", tp=tp, steps=12), read_trace_job(SA, "SE", tp=tp, steps=10)]
    c = trace_cluster(jobs, noise=CollectorNoise() if noise else None)
    assert not c.meta["synthetic"] and "DERIVED FROM REAL" in c.meta["generator"]
    r, row = _replay(c, tmp_path)
    assert row["jobs_ari"] == 1.0
    assert row["pair_acc"] == 1.0
    assert row["steps_found"] == row["true_steps"] > 0 and row["steps_spurious"] == 0
    assert row["step_err_mean"] < 1e-3
    assert row["anomalies"] == 0, r.analysis.anomalies[["kind", "explanation"]].to_string()


@needs_sa
def test_pipeline_closed_across_its_servers(tmp_path):
    """tp=2 puts ST's stages 0-1 and 2-3 on two servers: the embedding pair (0-3) has no pipeline partner on the
    network and times like a two-member DP ring; the pipeline pairs (1-2) link the same two servers."""
    c = trace_cluster([read_trace_job(SA, "ST", tp=2, steps=10)])
    r, row = _replay(c, tmp_path)
    got = r.pairs.merge(c.pairs, on=["src", "dst"], suffixes=("", "_truth"))
    assert (got["type"] == got["type_truth"]).all()
    assert (got["evidence"] == "closes a pipeline across its servers").sum() == 4
    assert row["steps_found"] == row["true_steps"] > 0 and row["steps_spurious"] == 0


@needs_sa
def test_straggler_twin_retimes_through_the_simulator():
    ops = read_trace_job(SA, "ST").ops
    ops = ops[ops["step"].isin(np.sort(ops["step"].unique())[:4])]
    slow = with_straggler(ops, Straggler(dp=1, stage=2, factor=2.0, from_step=2))
    base = with_straggler(ops, Straggler(dp=1, stage=2, factor=1.0, from_step=2))
    span = lambda o: (o["start_ts"] + o["duration"]).groupby(o["step"]).max() - o["start_ts"].groupby(o["step"]).min()  # noqa: E731
    ratio = (span(slow) / span(base)).to_numpy()
    assert np.allclose(ratio[:2], 1.0) and (ratio[2:] > 1.1).all()  # a 2x worker in one of four stages: the step 1.15x
    c = slow[(slow["dp_rank"] == 1) & (slow["stage"] == 2) & (slow["optype"] == "forward-compute")]
    b = base[(base["dp_rank"] == 1) & (base["stage"] == 2) & (base["optype"] == "forward-compute")]
    assert np.isclose(c["duration"].sum(), b.loc[b["step"].isin(np.sort(ops["step"].unique())[:2]), "duration"].sum()
                      + 2 * b.loc[~b["step"].isin(np.sort(ops["step"].unique())[:2]), "duration"].sum())


def test_collector_view_counts_loss_and_granularity():
    n = 50_000
    f = pd.DataFrame({"start_ns": np.arange(n) * 10_000, "duration_ns": 7_777, "src": "a", "dst": "b", "size": 1,
                      "switches": pd.Categorical(np.where(np.arange(n) % 2, "leaf-1|spine-0", "leaf-2"))})
    v = collector_view(f, CollectorNoise(loss=0.01, resolution_ns=1000), seed=3)
    assert 0.985 * n < len(v) < 0.995 * n
    assert (v["start_ns"] % 1000 == 0).all() and (v["duration_ns"] % 1000 == 0).all() and (v["duration_ns"] > 0).all()
    assert v["start_ns"].is_monotonic_increasing


@needs_sa
def test_straggler_in_real_timing_is_named(tmp_path):
    """The faulty twin: a 2x worker per job (re-timed through the simulator) is found on its server, nothing else."""
    jobs = [read_trace_job(SA, "ST", tp=8, steps=14, straggler=Straggler(dp=1, stage=2, from_step=4)),
            read_trace_job(SA, "SE", tp=8, steps=12, straggler=Straggler(dp=3, stage=0, from_step=4))]
    c = trace_cluster(jobs, noise=CollectorNoise())
    assert len(c.faults) == 2
    r, row = _replay(c, tmp_path)
    assert row["pair_acc"] == 1.0
    assert row["faults_found"] == 2, r.analysis.anomalies[["kind", "subject", "explanation"]].to_string()
    assert row["anomalies_unexplained"] == 0, r.analysis.anomalies[["kind", "subject", "explanation"]].to_string()


def test_the_real_data_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PRISM_SHARED_DATA", str(tmp_path))
    assert shared_data_dir() == tmp_path
    monkeypatch.delenv("PRISM_SHARED_DATA")
    # the default: beside the checkout, where the workspace keeps it
    assert shared_data_dir() == Path(__file__).resolve().parents[2] / "shared" / "data"
