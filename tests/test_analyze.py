"""Analysing whole jobs in batches gives what one run over every flow gives."""
import pandas as pd
import pytest

import prism.analyze
from prism.replay import replay
from prism.topology import Topology
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
    for name, budget in (("one run", 10**12), ("each job alone", 1), ("a few jobs a batch", int(job_flows.max()) + 1)):
        monkeypatch.setattr(prism.analyze, "JOB_BATCH_FLOWS", budget)
        runs[name] = replay([str(tmp_path / "flows.parquet")], topo, progress=False).analysis
    one = runs.pop("one run")
    assert len(one.steps) and len(one.anomalies)  # something to compare
    for name, got in runs.items():
        for frame in FRAMES:
            pd.testing.assert_frame_equal(getattr(got, frame), getattr(one, frame), obj=f"{name}: {frame}")
