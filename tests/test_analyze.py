"""Analysing whole jobs in batches gives what one run over every flow gives."""
import pandas as pd
import pytest

import prism.analyze
import prism.spill
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
    few = int(job_flows.max()) + 1
    monkeypatch.setattr(prism.spill, "SLICE_ROWS", len(c.flows) // 5)  # the spilled file is scattered in several slices
    spill = tmp_path / "spill"
    spill.mkdir()
    for name, budget, spill_above in (
        ("one run", 10**12, None), ("each job alone", 1, None), ("a few jobs a batch", few, None),
        # spilled to disk from the first chunk, or from the third (chunks held so far are written then)
        ("one run, spilled", 10**12, 0), ("each job alone, spilled", 1, 0), ("a few jobs a batch, spilled", few, len(c.flows) // 3),
    ):
        monkeypatch.setattr(prism.analyze, "JOB_BATCH_FLOWS", budget)
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
