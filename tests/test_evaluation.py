"""Scoring what the daemon reports against the SYNTHETIC tiny cluster's truth."""
from prism.analysis.diagnosis import empty_anomalies
from prism.analysis.evaluation import score_stream


def test_score_stream_counts_found_missing_and_spurious_steps(tiny_cluster):
    truth = tiny_cluster.steps
    jobs = tiny_cluster.jobs.assign(job_id="pred-" + tiny_cluster.jobs["job_id"])  # the daemon's own ids
    steps = truth.assign(job_id="pred-" + truth["job_id"])
    row = score_stream(jobs, steps, empty_anomalies(), tiny_cluster)
    assert row["jobs_ari"] == 1.0 and "pair_acc" not in row
    assert row["steps_found"] == row["true_steps"] > 0 and row["steps_spurious"] == 0
    assert row["anomalies"] == 0 and row["faults"] == len(tiny_cluster.faults) and row["faults_found"] == 0
    # one step missed, one reported half as long again (its end matches no true end): two fewer found, one spurious
    half = steps.iloc[1:].copy()
    half.loc[half.index[0], "end_ns"] += int(half["end_ns"].iloc[0] - half["start_ns"].iloc[0]) // 2
    row2 = score_stream(jobs, half, empty_anomalies(), tiny_cluster)
    assert row2["steps_found"] == row["steps_found"] - 2 and row2["steps_spurious"] == 1
    # every GPU in one job: the job map is wrong
    assert score_stream(jobs.assign(job_id="one"), steps, empty_anomalies(), tiny_cluster)["jobs_ari"] < 0.5
