"""A job analysed in time slices gives what one analysis of the whole job gives."""
import json
import logging

import numpy as np
import pandas as pd
import pytest

from prism.analysis.analyse import Settings
from prism.analysis.batches import plan_analysis
from prism.analysis.slices import _vote_pairs
from prism.ingest.topology import Topology
from prism.offline.replay import replay

#: GPU flows a slice holds: the tiny preset's three biggest jobs (19k-50k flows, 600-1,000 flows a step) in 2-5 slices of 12+ steps
SLICE = 12_000


@pytest.fixture(scope="module")
def whole_and_sliced(tiny_dir):
    topo = Topology.from_csv(tiny_dir / "topology.csv")
    flows = [str(tiny_dir / "flows.parquet")]
    return replay(flows, topo, progress=False).analysis, replay(flows, topo, progress=False, settings=Settings(slice_flows=SLICE))


def _sorted(df, by):
    return df.sort_values(by, kind="stable").reset_index(drop=True)


def test_jobs_past_the_slice_size_are_analysed_in_slices(tiny_dir, caplog):
    topo = Topology.from_csv(tiny_dir / "topology.csv")
    with caplog.at_level(logging.DEBUG, logger="prism.slices"):
        replay([str(tiny_dir / "flows.parquet")], topo, progress=False, settings=Settings(slice_flows=SLICE))
    slices = sorted(int(r.args[0]) for r in caplog.records if r.msg.startswith("analysed a job in"))
    assert len(slices) == 3 and min(slices) >= 2 and max(slices) >= 4, slices


def test_sliced_steps_phases_and_lag_are_the_whole_analysis(whole_and_sliced):
    whole, sliced = whole_and_sliced
    sliced = sliced.analysis
    pd.testing.assert_frame_equal(_sorted(whole.steps, ["job_id", "step"]), _sorted(sliced.steps, ["job_id", "step"]), check_dtype=False)
    pd.testing.assert_frame_equal(_sorted(whole.phases, ["job_id", "step", "group", "kind"]),
                                  _sorted(sliced.phases, ["job_id", "step", "group", "kind"]), check_dtype=False)
    pd.testing.assert_frame_equal(_sorted(whole.group_lag, ["job_id", "server", "step"]),
                                  _sorted(sliced.group_lag, ["job_id", "server", "step"]), check_dtype=False)


def test_sliced_pairs_shapes_and_anomalies_are_the_whole_analysis(whole_and_sliced, tiny_cluster):
    whole, sliced = whole_and_sliced
    sliced = sliced.analysis
    pd.testing.assert_frame_equal(whole.pairs[["job_id", "src", "dst", "type"]], sliced.pairs[["job_id", "src", "dst", "type"]])
    pd.testing.assert_frame_equal(whole.shapes, sliced.shapes)
    pd.testing.assert_frame_equal(whole.anomalies, sliced.anomalies)
    # the tiny preset's slow step and slow server are among them: the comparison is not of two empty tables
    assert {"slow_step", "slow_group"} <= set(sliced.anomalies["kind"])


def test_spilled_job_is_read_back_a_chunk_at_a_time_with_the_same_result(whole_and_sliced, tiny_dir, tmp_path):
    topo = Topology.from_csv(tiny_dir / "topology.csv")
    spilled = replay([str(tiny_dir / "flows.parquet")], topo, progress=False, settings=Settings(slice_flows=SLICE),
                     spill_above=0, spill_dir=tmp_path).analysis
    sliced = whole_and_sliced[1].analysis
    for name in ("steps", "phases", "pairs", "anomalies"):
        pd.testing.assert_frame_equal(getattr(sliced, name), getattr(spilled, name), check_dtype=False)
    assert not list(tmp_path.iterdir())  # the spill's files are gone


def test_a_slice_of_too_few_steps_is_warned_about(tiny_dir, caplog):
    topo = Topology.from_csv(tiny_dir / "topology.csv")
    with caplog.at_level(logging.WARNING, logger="prism.slices"):
        replay([str(tiny_dir / "flows.parquet")], topo, progress=False, stop_after="steps", settings=Settings(slice_flows=4_000))
    assert any("raise --slice-flows" in r.getMessage() for r in caplog.records)


def test_pairs_typed_two_ways_are_less_certain_and_say_so():
    one = pd.DataFrame({"job_id": ["j", "j"], "src": ["a", "a"], "dst": ["b", "c"], "type": ["DP", "PP"], "confidence": [0.9, 0.8], "evidence": ["ring", "one-way"]})
    two = one.assign(type=["DP", "DP"], confidence=[0.7, 0.3], evidence=["ring", "ring?"])
    voted = _vote_pairs([one, two]).set_index("dst")
    assert voted.loc["b", "type"] == "DP" and voted.loc["b", "confidence"] == pytest.approx(0.8)
    assert voted.loc["b", "evidence"] == "ring"  # the slices agreed: no note
    # a:c was PP at 0.8 in one slice, DP at 0.3 in the other: PP wins, at half the confidence
    assert voted.loc["c", "type"] == "PP" and voted.loc["c", "confidence"] == pytest.approx(0.4)
    assert voted.loc["c", "evidence"] == "one-way; typed PP in 1 of 2 slices"


def test_a_job_past_the_slice_size_is_a_batch_of_its_own():
    plan, sliced = plan_analysis(np.array([0, 3, 2, 9, 1]), slice_flows=4, max_flows=100)
    assert [b.tolist() for b in plan] == [[0, 1], [2], [3]] and sliced == [False, True, False]
    plan, sliced = plan_analysis(np.array([50, 0, 9]), slice_flows=4)  # flows of no job (index 0) are never a sliced job
    assert [b.tolist() for b in plan] == [[-1], [1]] and sliced == [False, True]
    assert plan_analysis(np.array([], dtype=np.int64), slice_flows=4) == ([], [])  # no flows at all


def test_replay_cli_slices_with_byte_identical_outputs_and_refuses_tiny_slices(tiny_dir, tmp_path, capsys):
    from prism.cli import main

    base = ["replay", str(tiny_dir / "flows.parquet"), "--topology", str(tiny_dir / "topology.csv"), "--no-progress"]
    assert main(base + ["--out", str(tmp_path / "whole")]) == 0
    assert main(base + ["--out", str(tmp_path / "sliced"), "--slice-flows", str(SLICE)]) == 0
    for name in ("steps.csv", "phases.csv", "pairs.csv", "anomalies.csv", "timeline.json"):
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "sliced" / name).read_bytes(), name
    sliced = {j["job_id"]: j.get("slices") for j in json.loads((tmp_path / "sliced" / "summary.json").read_text())["jobs"]}
    assert sorted(n for n in sliced.values() if n) == [3, 4, 8] and list(sliced.values()).count(None) == 1  # the small job at once
    assert not any("slices" in j for j in json.loads((tmp_path / "whole" / "summary.json").read_text())["jobs"])
    assert "analysed in 8 time slices" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(base + ["--out", str(tmp_path / "x"), "--slice-flows", "100"])
    assert "--slice-flows: must be >= 10000" in capsys.readouterr().err


@pytest.mark.parametrize("spill", [False, True])
def test_files_that_each_cover_the_capture_are_sliced_in_time_order(tiny_cluster, tmp_path, spill, monkeypatch):
    """Two collectors' dumps, each of the whole capture, given one after the other: the slices still see time in order."""
    import prism.analysis.batches
    import prism.offline.spill

    # chunks far smaller than a job, as a long capture's are (else a job's flows come in one chunk, sorted whole)
    monkeypatch.setattr(prism.analysis.batches, "_CHUNK_ROWS", 3_000)
    monkeypatch.setattr(prism.offline.spill, "SLICE_ROWS", 3_000)
    tiny_cluster.write(tmp_path / "c")
    topo = Topology.from_csv(tmp_path / "c" / "topology.csv")
    flows = pd.read_parquet(tmp_path / "c" / "flows.parquet")
    half = (flows["src"].astype(str) < flows["dst"].astype(str)).to_numpy()  # by direction: both files span the capture
    files = []
    for name, part in (("a", flows[half]), ("b", flows[~half])):
        part.to_parquet(tmp_path / f"{name}.parquet", index=False)
        files.append(str(tmp_path / f"{name}.parquet"))
    kw = dict(spill_above=0, spill_dir=tmp_path) if spill else {}
    whole = replay(files, topo, progress=False, **kw).analysis
    sliced = replay(files, topo, progress=False, settings=Settings(slice_flows=SLICE), **kw).analysis
    for name in ("steps", "phases", "anomalies"):
        pd.testing.assert_frame_equal(getattr(whole, name), getattr(sliced, name), check_dtype=False)
    assert len(sliced.slices) == 3


def test_flows_given_out_of_time_order_are_warned_about(tiny_dir, caplog):
    from prism.analysis.jobs import JobRecogniser
    from prism.analysis.slices import analyse_sliced

    topo = Topology.from_csv(tiny_dir / "topology.csv")
    flows = pd.read_parquet(tiny_dir / "flows.parquet")
    a, b = topo.nic_index(flows["src"]), topo.nic_index(flows["dst"])
    gpu = (a >= 0) & (b >= 0) & (a != b)
    rec = JobRecogniser(topo)
    rec.partial_fit_pairs(a[gpu], b[gpu])
    labels, jobs = rec.labels(), rec.predict()
    job = np.where(gpu, labels[np.maximum(a, 0)], -1)
    big = int(np.argmax(np.bincount(job[job >= 0])))  # the job with the most flows (50k)
    mine = job == big
    cols = [a[mine], b[mine], flows["start_ns"].to_numpy()[mine], flows["duration_ns"].to_numpy()[mine], flows["size"].to_numpy()[mine]]
    half = len(cols[0]) // 2
    backwards = [[c[half:] for c in cols], [c[:half] for c in cols]]  # the second half of the capture first
    big_jobs = jobs[labels[topo.ips.get_indexer(jobs["ip"])] == big]
    with caplog.at_level(logging.WARNING, logger="prism.slices"):
        analyse_sliced(backwards, labels, big_jobs, topo, int(cols[2].max()), Settings(slice_flows=SLICE), stop_after="steps")
    assert any("not in time order" in r.getMessage() for r in caplog.records)
