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


def test_compare_with_truth_scores_both_demos_alike(tiny_cluster):
    """One comparison for the replay demo and the live one: the same verdict on the same findings, each with its own lines."""
    from prism.analysis.evaluation import compare_with_truth

    jobs = tiny_cluster.jobs.assign(job_id="pred-" + tiny_cluster.jobs["job_id"])
    steps = tiny_cluster.steps.assign(job_id="pred-" + tiny_cluster.steps["job_id"])
    live = compare_with_truth(tiny_cluster, jobs, steps, empty_anomalies(), live=True)
    replay = compare_with_truth(tiny_cluster, jobs, steps, empty_anomalies(), pairs=tiny_cluster.pairs)
    for report in (live, replay):
        assert not report.ok  # every injected fault missed
        assert sum("MISSED" in line for line in report.lines) == len(tiny_cluster.faults) > 0
        assert report.lines[-1] == "anomalies: 0 reported, 0 explained by injected faults, 0 unexplained"
    n = len(tiny_cluster.steps)
    assert live.lines[0] == "jobs MATCH the ground truth (adjusted Rand index 1.0000)"
    assert f"steps: {n:,} of {n:,} true steps reported (100.0%), 0 spurious" in live.lines
    # the replay names the truth job of each job found, and has pair types
    assert f"pred-{tiny_cluster.jobs['job_id'].iloc[0]} = truth job {tiny_cluster.jobs['job_id'].iloc[0]}" in "\n".join(replay.lines)
    assert "jobs MATCH the ground truth: adjusted Rand index 1.0000, 0 GPUs missed, 0 extra" in replay.lines
    assert f"DP/PP pair types MATCH the ground truth: {len(tiny_cluster.pairs):,} of {len(tiny_cluster.pairs):,} pairs correct" in replay.lines
    # nothing found: the jobs differ, and a live run without a job table still reports
    nothing = compare_with_truth(tiny_cluster, None, steps.iloc[:0], empty_anomalies(), live=True)
    assert not nothing.ok and nothing.lines[0].startswith("jobs DIFFER FROM the ground truth")
