"""Step timelines and diagnosis against the SYNTHETIC generator's ground truth."""
import os

import numpy as np
import pandas as pd
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from prism.analysis.evaluation import job_name_map, score_anomalies, score_steps
from prism.analysis.timeline import StepTimeline, busy_gaps, natural_break
from prism.ingest.topology import Topology
from prism.offline.replay import replay
from synthetic import preset

SEEDS = (0, 1, 2)


def _run(name, seed, tmp_path_factory, with_faults=True, duration=None):
    c = preset(name, seed=seed, with_faults=with_faults, duration_s=duration).generate()
    d = tmp_path_factory.mktemp(f"{name}-{seed}-{with_faults}")
    c.write(d)
    r = replay([str(d / "flows.parquet")], Topology.from_csv(d / "topology.csv"), progress=False)
    return c, r, job_name_map(r.jobs, c.jobs)


@pytest.fixture(scope="module", params=SEEDS)
def faulty(request, tmp_path_factory):
    return _run("tiny", request.param, tmp_path_factory, duration=8.0)


@pytest.fixture(scope="module", params=SEEDS)
def fault_free(request, tmp_path_factory):
    return _run("tiny", request.param, tmp_path_factory, with_faults=False, duration=8.0)


def test_steps_match_truth(faulty):
    c, r, names = faulty
    sc = score_steps(r.analysis.steps, c.steps, names)
    assert set(sc["job"]) == set(c.steps["job_id"])  # every job, DP-only and PP-only included
    assert sc["spurious"].sum() == 0
    assert sc["found"].sum() >= 0.98 * sc["true_steps"].sum()  # only a step at the capture's edge may be lost
    assert (sc["found_share"] >= 0.95).all()
    assert (sc["mean_err"] <= 1e-3).all()  # the target: <= 0.1%


def test_no_partial_steps(faulty):
    c, r, _ = faulty
    s = r.analysis.steps
    lo, hi = c.meta["window_start_ns"], c.meta["window_end_ns"]
    assert (s["start_ns"] > lo).all() and (s["end_ns"] <= hi).all()
    assert (s["duration_ns"] > 0).all()
    # steps of a job tile time: each starts where the previous ended
    for _, g in s.groupby("job_id"):
        assert (g["start_ns"].to_numpy()[1:] == g["end_ns"].to_numpy()[:-1]).all()


def test_every_injected_fault_found_and_nothing_else(faulty):
    c, r, names = faulty
    faults, anomalies = score_anomalies(r.analysis.anomalies, c.faults, names, r.analysis.steps)
    assert len(faults) == 3
    assert faults["matched"].all(), faults
    assert anomalies["matched"].all(), anomalies[~anomalies["matched"]]


def test_slow_group_names_the_slow_server(faulty):
    c, r, names = faulty
    truth = c.faults[c.faults["kind"] == "slow_group"].iloc[0]
    a = r.analysis.anomalies
    got = a[(a["kind"] == "slow_group")]
    assert set(got["subject"]) == {truth["subject"]}
    assert got["job_id"].map(names).eq(truth["job_id"]).all()


def test_fault_free_twin_has_no_anomalies(fault_free):
    c, r, _ = fault_free
    assert c.faults.empty
    assert r.analysis.anomalies.empty, r.analysis.anomalies


def test_ten_minute_fault_free_run(tmp_path_factory):
    """The issue's target: zero anomalies on a >= 10-minute fault-free run."""
    c, r, names = _run("accuracy", 0, tmp_path_factory, with_faults=False)
    assert c.meta["window_end_ns"] - c.meta["window_start_ns"] >= 600e9
    assert r.analysis.anomalies.empty, r.analysis.anomalies
    sc = score_steps(r.analysis.steps, c.steps, names)
    assert sc["spurious"].sum() == 0 and sc["found"].sum() >= 0.99 * sc["true_steps"].sum()


def test_phases_cover_groups(faulty):
    c, r, _ = faulty
    ph, steps = r.analysis.phases, r.analysis.steps
    m = ph.merge(steps[["job_id", "step", "start_ns", "end_ns"]], on=["job_id", "step"], suffixes=("", "_step"))
    # a group's traffic lies within its step
    assert (m["start_ns"] >= m["start_ns_step"]).all() and (m["end_ns"] <= m["end_ns_step"]).all()
    # the DP collective of the step ends the step
    dp = m[m["kind"] == "dp_collective"].groupby(["job_id", "step"])["end_ns"].max()
    ends = steps.set_index(["job_id", "step"])["end_ns"].reindex(dp.index)
    assert (dp == ends).all()


def test_natural_break_prefers_step_period_over_stage_gaps():
    rng = np.random.default_rng(0)
    period, n = 100_000_000, 40
    t0 = np.arange(n) * period
    # per step: two collectives (stage 1, then stage 0) 20 ms apart, each 200 flows of 10 us back to back
    starts = np.concatenate([(t0[:, None] + off + np.arange(200) * 10_000).ravel() for off in (60_000_000, 82_000_000)])
    starts = np.sort(starts + rng.integers(0, 100, len(starts)))
    gap, busy_end = busy_gaps(starts, starts + 10_000)
    tau = natural_break(gap, busy_end)
    assert 20_000_000 < tau < 78_000_000
    tl = StepTimeline().fit(np.zeros(len(starts), int), starts, starts + 10_000, np.ones(len(starts), bool), capture_end=int(starts.max()) + period)
    assert len(tl.steps_) == n - 1
    assert np.allclose(tl.steps_["duration_ns"], period, rtol=1e-5)


def _collective(t0, chunks=100, chunk_gap=50_000):
    """One DP collective at ``t0``: chunks of 8 back-to-back flows of 10 us, ``chunk_gap`` apart (a ring's rounds)."""
    return np.concatenate([t0 + c * (80_000 + chunk_gap) + np.arange(8) * 10_000 for c in range(chunks)])


@pytest.mark.parametrize("bursts", [1, 2])
def test_a_window_shorter_than_a_few_steps_gives_no_steps(bursts):
    """The rounds inside one collective are regular too: with one or two of a job's 9 s steps in view
    (a daemon window of 10 s), no cut is a step structure, and the timeline says so rather than report
    sub-millisecond steps (on real-timing flows this raised hundreds of false slow steps)."""
    step = 9_000_000_000
    dp = np.concatenate([_collective(k * step + 8_000_000_000) for k in range(bursts)])
    pp = np.arange(0, bursts * step + 1_500_000_000, 20_000_000)  # pipeline traffic all along
    start = np.concatenate([dp, pp])
    is_dp = np.concatenate([np.ones(len(dp), bool), np.zeros(len(pp), bool)])
    tl = StepTimeline().fit(np.zeros(len(start), int), start, start + 10_000, is_dp, capture_end=int(start.max()))
    assert tl.steps_.empty
    assert tl.breaks_[0] == np.inf
    # the same traffic with enough steps in view is cut at the steps, one per period
    many = 8
    dp = np.concatenate([_collective(k * step + 8_000_000_000) for k in range(many)])
    pp = np.arange(0, many * step + 1_500_000_000, 20_000_000)
    start = np.concatenate([dp, pp])
    is_dp = np.concatenate([np.ones(len(dp), bool), np.zeros(len(pp), bool)])
    tl = StepTimeline().fit(np.zeros(len(start), int), start, start + 10_000, is_dp, capture_end=int(start.max()))
    assert len(tl.steps_) == many - 1
    assert np.allclose(tl.steps_["duration_ns"], step, rtol=1e-6)


def test_natural_break_no_period():
    gap = np.array([5, 5, 5, 5])
    assert natural_break(gap, np.arange(5) * 10) == np.inf


def test_last_burst_cut_by_capture_is_not_a_step():
    s = np.concatenate([k * 1000 + np.arange(10) for k in range(6)])
    e = s + 1
    dp = np.ones(len(s), bool)
    whole = StepTimeline().fit(np.zeros(len(s), int), s, e, dp, capture_end=int(s.max()) + 5000).steps_
    cut = StepTimeline().fit(np.zeros(len(s), int), s, e, dp, capture_end=int(s.max())).steps_
    assert len(whole) == 5 and len(cut) == 4
    assert list(cut["end_ns"]) == list(whole["end_ns"][:4])


@pytest.mark.parametrize("scenario", ["dist-opt", "overlap", "clip", "all"])
def test_steps_and_silence_on_confounded_scenarios(scenario, tmp_path):
    """Distributed optimizer, overlapped buckets, the grad-norm ring, all at once (SYNTHETIC, fault-free 8 s)."""
    from prism.analysis.evaluation import score_cluster
    from synthetic.scenarios import scenario_cluster

    c = scenario_cluster(scenario, seed=5, duration_s=8, with_faults=False)
    c.write(tmp_path)
    r = replay([str(tmp_path / "flows.parquet")], Topology.from_csv(tmp_path / "topology.csv"), progress=False)
    row = score_cluster(r, c)
    assert row["jobs_ari"] == 1.0 and row["pair_acc"] == 1.0
    assert row["steps_found"] >= 0.99 * row["true_steps"] and row["steps_spurious"] == 0, row
    assert row["step_err_mean"] < 1e-3
    assert row["anomalies"] == 0, r.analysis.anomalies[["kind", "subject", "explanation"]].to_string()


def test_optimizer_split_needs_balanced_edges():
    """A pause inside one collective is no step boundary: its edges are unbalanced around it."""
    from prism.analysis.timeline import optimizer_gaps

    # one burst: pair 0 sends 5 messages, pause, 2 more (a reduce-scatter paused mid-way), then the compute gap (4
    # then 2 would be ZeRO-1's all-reduce then all-gather of the same buffer, edge by edge)
    st = np.array([0, 10, 20, 30, 40, 500, 510, 5000])
    gap, be = busy_gaps(st, st + 5)
    split, _ = optimizer_gaps(st, be, gap, np.array([6]), np.ones(8), np.zeros(8, int), np.zeros(0), np.zeros(0), np.zeros(0), min_gap_ns=100)
    assert split.tolist() == [-1, -1]


def _bucket_bursts(n_steps, buckets, pause=0, allgather=0):
    """SYNTHETIC DP bursts, 1 s apart: ``buckets`` gradient buckets 8 ms apart (4 flows of 1 on pairs 0-3 each);
    then, after ``pause``, ``allgather`` buckets back to back (each flow half a bucket's bytes when ``pause``:
    ZeRO-1's all-gather of what the all-reduce reduced)."""
    st, sz, ends = [], [], []
    for k in range(n_steps):
        t0 = k * 1_000_000_000
        for b in range(buckets):
            st.append(t0 + b * 8_000_000 + np.arange(4) * 1000)
            sz.append(np.full(4, 2.0))
        ends.append(t0 + (buckets - 1) * 8_000_000 + 3000 + 5)
        for b in range(allgather):
            st.append(t0 + (buckets - 1) * 8_000_000 + pause + b * 4000 + np.arange(4) * 1000)
            sz.append(np.full(4, 1.0))
    return np.concatenate(st), np.concatenate(sz), np.array(ends)


def test_optimizer_split_not_between_overlapped_buckets():
    """DDP's buckets (an even number, equal sizes) split into two equal halves at the middle bucket's pause, edge by
    edge: the optimizer's pause looked like that, and every step boundary moved half a backward early. The
    pauses after it are as long, where an all-gather after the optimizer runs at once: no split."""
    from prism.analysis.timeline import optimizer_gaps

    st, sz, _ = _bucket_bursts(6, 10)
    gap, be = busy_gaps(st, st + 5)
    cut = np.flatnonzero(gap > 100_000_000)
    split, _ = optimizer_gaps(st, be, gap, cut, sz, np.arange(len(st)) % 4, np.zeros(0), np.zeros(0), np.zeros(0))
    assert (split == -1).all()


def test_optimizer_split_zero1_allreduce_then_allgather():
    """ZeRO-1: the gradients' all-reduce (buckets as the backward releases them), the CPU optimizer's 60 ms, then
    the parameters' all-gather at once, each edge half of what it moved in the all-reduce: the step ends at the
    all-reduce's end."""
    from prism.analysis.timeline import optimizer_gaps

    st, sz, ends = _bucket_bursts(6, 10, pause=60_000_000, allgather=10)
    gap, be = busy_gaps(st, st + 5)
    cut = np.flatnonzero(gap > 100_000_000)
    split, split_end = optimizer_gaps(st, be, gap, cut, sz, np.arange(len(st)) % 4, np.zeros(0), np.zeros(0), np.zeros(0))
    assert (split >= 0).all() and np.array_equal(split_end, ends)


def test_step_table_phase_bounds_are_na_where_a_step_has_no_such_traffic():
    """Per step, the PP and DP spans are the min start and max end of its flows of that kind; NA without any."""
    rng = np.random.default_rng(3)
    ends = np.array([0, 100, 200, 300, 400])
    k = rng.integers(0, 4, 200)
    start = ends[k] + rng.integers(0, 90, 200)
    end = start + rng.integers(1, 10, 200)
    dp = rng.random(200) < 0.5
    dp[k == 2] = False  # step 2: pipeline traffic only
    dp[k == 3] = True  # step 3: the collective only
    size = rng.integers(1, 100, 200)
    t = StepTimeline._step_table(5, "job-x", ends, np.argsort(start, kind="stable"), start, end, dp, size)
    assert t["job_id"].tolist() == ["job-x"] * 4 and t["duration_ns"].tolist() == [100] * 4
    for kind, m in (("pp", ~dp), ("dp", dp)):
        for step in range(4):
            sel = m & (k == step)
            got_start, got_end = t.at[step, f"{kind}_start_ns"], t.at[step, f"{kind}_end_ns"]
            if sel.any():
                assert (got_start, got_end) == (start[sel].min(), end[sel].max())
            else:
                assert pd.isna(got_start) and pd.isna(got_end)
    assert t["flows"].tolist() == np.bincount(k, minlength=4).tolist()
    assert t["bytes"].tolist() == np.bincount(k, weights=size, minlength=4).astype(int).tolist()


def test_a_straggler_from_halfway_does_not_split_the_slower_steps(tmp_path):
    """SYNTHETIC tp8-pp4-dp4 (seed 1) whose server starts computing 1.4x slower at step 10, captured for 10.25 s.

    Half the steps are then slower, each with a pause inside its collective
    (the straggler's rings start late). Cut at that pause, the steps look
    more regular by median and MAD (the short pieces are outliers to it)
    than cut right (two lengths, before and after); found by analysing a
    window of a daemon that had fallen behind. The pieces give the wrong
    cut away: each is short and makes a typical step with its neighbour.
    """
    from synthetic.scenarios import scenario_cluster

    c = scenario_cluster("tp-pp-dp", seed=1, duration_s=60, with_faults=True)
    fault = c.faults.query("kind == 'slow_group'").iloc[0]
    t0 = int(c.flows["start_ns"].min())
    head = c.flows[c.flows["start_ns"] < t0 + 10_250_000_000]
    c.flows = head.reset_index(drop=True)
    c.write(tmp_path)
    r = replay([str(tmp_path / "flows.parquet")], Topology.from_csv(tmp_path / "topology.csv"), progress=False)
    names = job_name_map(r.jobs, c.jobs)
    got = r.analysis.steps[r.analysis.steps["job_id"].map(names) == fault["job_id"]]
    truth = c.steps[(c.steps["job_id"] == fault["job_id"]) & (c.steps["end_ns"] <= t0 + 10_250_000_000)]
    slower = truth[truth["step"] >= fault["step"]]
    assert 0.3 * len(truth) <= len(slower) <= 0.7 * len(truth)  # the case: about half the steps slower
    assert len(got) == len(truth)  # every whole step, none split in two
    assert (got["duration_ns"] > 0.5 * got["duration_ns"].median()).all()


def _bursts(period_ns, n, every, pause_ns, seed=0):
    """DP bursts (8 flows, 10 us apart: one per ring edge, ``pair`` 0..7) every ``period_ns`` with 0.5% jitter, a ``pause_ns``
    more after every ``every``-th."""
    rng = np.random.default_rng(seed)
    step = period_ns * rng.lognormal(0.0, 0.005, n) + np.where(np.arange(n) % every == every - 1, pause_ns, 0)
    t0 = np.concatenate([[0.0], np.cumsum(step)[:-1]]).astype(np.int64)
    s = (t0[:, None] + np.arange(8) * 10_000).ravel()
    return s, s + 5_000


@pytest.mark.parametrize("checkpoints", [4, 6, 12])
def test_natural_break_periodic_slow_steps_are_steps_not_the_period(checkpoints):
    """A checkpoint every 20 steps (70% of a step more): once four pauses are in view, the threshold above the step
    gap cuts perfectly regular 20-step "steps"; the old tie-break to the coarsest cut took them for the period (a
    held-out job reported as three 6-hour steps). The step is the shortest period: every step is cut."""
    period, every = 100_000_000, 20
    s, e = _bursts(period, every * checkpoints + 5, every, int(0.7 * period))
    gap, busy_end = busy_gaps(s, e)
    tau = natural_break(gap, busy_end, pair=np.arange(len(s)) % 8)
    assert 100_000 < tau < 0.9 * period
    assert (gap >= tau).sum() == every * checkpoints + 4


def test_natural_break_periodic_slow_steps_prefix_agrees():
    """What a capture's first part says does not change when the capture goes on (3 checkpoints, then 8)."""
    period, every = 100_000_000, 20
    s, e = _bursts(period, every * 8 + 5, every, int(0.7 * period))
    short = s < 3.5 * every * period
    cuts = [busy_gaps(s[m], e[m]) for m in (short, np.ones(len(s), bool))]
    taus = [natural_break(g, b, pair=np.arange(len(b)) % 8) for g, b in cuts]
    ends = [b[:-1][g >= t] for (g, b), t in zip(cuts, taus)]
    assert np.array_equal(ends[0], ends[1][: len(ends[0])])


def _ring_steps(every, n, pause, seed):
    """:func:`_bursts` of a 100 ms step as a job's flows, with each step's true end (its burst's last flow's end)."""
    s, e = _bursts(100_000_000, n, every, int(pause * 100_000_000), seed)
    return s, e, e.reshape(-1, 8).max(axis=1)


@settings(max_examples=int(os.environ.get("PRISM_HYPOTHESIS_EXAMPLES", 40)), deadline=None, derandomize=True)
@given(shape=st.sampled_from(["ring", "layered"]), every=st.integers(10, 1000), checkpoints=st.integers(1, 20),
       pause=st.floats(0.3, 2.0), prefix=st.floats(0.05, 0.95), seed=st.integers(0, 1000))
def test_a_prefix_of_a_capture_says_what_the_whole_says(shape, every, checkpoints, pause, prefix, seed):
    """Property (SYNTHETIC arrays): a job with a checkpoint every N steps (N from 10 to 1,000; the checkpoint adds
    30% to 200% of a step), captures holding 1 to 20 checkpoints. The whole capture finds every step (all but the
    first, which has no boundary before it, and the last); any prefix of it finds the same steps, each where the
    whole capture puts it, up to the prefix's last step or two (cut by its end). Two shapes: one collective a step
    (DDP, ZeRO) and a collective per layer in both passes (FSDP: the optimizer's pause shorter than a layer's)."""
    if shape == "layered":
        every = min(every, 60)  # 24 collectives a step: a capture of at most ~1,200 steps
        s, e, truth = _layered(every * checkpoints + 5, every=every, pause=pause * 340.0, seed=seed)
        period = 345e6
    else:
        s, e, truth = _ring_steps(every, every * checkpoints + 5, pause, seed)
        period = 100e6
    pair = np.arange(len(s)) % 8

    def ends(m):
        tl = StepTimeline().fit(np.zeros(int(m.sum()), int), s[m], e[m], np.ones(int(m.sum()), bool), size=np.ones(int(m.sum()), int),
                                capture_end=int(s[m].max()), pair=pair[m])
        return tl.steps_["end_ns"].to_numpy()

    whole = ends(np.ones(len(s), bool))
    assert np.array_equal(whole, truth[1:-1])
    cut = s[0] + prefix * (s[-1] - s[0])
    part = s < cut
    assume(truth[truth < cut].size >= 8)  # a few steps in view, as the timeline needs
    found = ends(part)
    assert np.array_equal(found, whole[: len(found)])
    assert found[-1] >= cut - 2 * period * (1 + pause)  # at most the steps around the prefix's end missing


def test_natural_break_keeps_the_flush_of_a_pipeline():
    """Pipeline-only traffic (SYNTHETIC arrays): per step 3 warm-up forwards 10 apart, 5 steady microbatches 30 apart,
    3 cool-down backwards 20 apart, then the flush. The microbatch cuts are regular in the steady part but the
    warm-up and cool-down pieces are not: the step is the flush-to-flush period, whatever the number of steps."""
    step = np.concatenate([np.arange(3) * 10.0, 30 + np.arange(5) * 30.0, 180 + np.arange(3) * 20.0])  # ends at 220
    for n in (6, 40):
        s = (np.arange(n)[:, None] * 300.0 + step[None, :]).ravel().astype(np.int64) * 1000
        gap, busy_end = busy_gaps(s, s + 1000)
        tau = natural_break(gap, busy_end)
        assert 30_000 < tau < 80_000 and (gap >= tau).sum() == n - 1
        # told by what each piece carries: the micro-batches of one step run over different stage boundaries
        stage_pair = np.tile(np.r_[0, 1, 2, np.arange(5) % 3, 2, 1, 0], n)
        tau = natural_break(gap, busy_end, pair=stage_pair)
        assert 30_000 < tau < 80_000 and (gap >= tau).sum() == n - 1


def test_natural_break_content_tells_checkpoints_from_micro_batches():
    """The same gaps, two readings (SYNTHETIC arrays): 12 pieces 100 apart, a 60 longer pause after every 4th. If every
    piece moves the same bytes over the same pairs (a step's collective), the pause is a checkpoint and the pieces are
    steps; if the pieces of a group run over different pairs (a pipeline's micro-batches), the group is the step."""
    s, e = _bursts(100_000_000, 4 * 12 + 3, 4, 60_000_000)
    gap, busy_end = busy_gaps(s, e)
    n_bursts = len(s) // 8
    alike = np.arange(len(s)) % 8
    unlike = alike + 8 * (np.repeat(np.arange(n_bursts), 8) % 4)  # each of the 4 pieces of a group on its own pairs
    fine = natural_break(gap, busy_end, pair=alike)
    coarse = natural_break(gap, busy_end, pair=unlike)
    assert (gap >= fine).sum() == n_bursts - 1
    assert (gap >= coarse).sum() == 12
    assert natural_break(gap, busy_end) == coarse  # without content, never the finer cut


def _checkpointed_job(every: int, checkpoints: int, distributed_optimizer: bool, phase: int, pause: float = 0.7):
    """A SYNTHETIC two-GPU data-parallel job (one flow per ring edge and phase: fast) with a checkpoint every ``every``
    steps (adding ``pause`` of a step), the capture holding ``checkpoints`` of them."""
    from synthetic import Fabric, JobSpec
    from synthetic.generator import ClusterGenerator

    spec = JobSpec("ckpt", tp=1, pp=1, dp=2, microbatches=1, fwd_ms=2, grad_bytes=8 << 20, bucket_bytes=8 << 20, message_bytes=4 << 20,
                   checkpoint_every=every, checkpoint_phase=phase, distributed_optimizer=distributed_optimizer, checkpoint_pause=pause)
    step_s = (spec.lower_bound_step_ns() + spec.optimizer_ms * 1e6) / 1e9 * 1.05
    period_s = every * step_s + spec.checkpoint_pause * spec.lower_bound_step_ns() / 1e9
    fab = Fabric(servers=2, gpus_per_server=1, servers_per_group=2, spines=1, storage_hosts=0)
    return ClusterGenerator(fab, [spec], duration_s=checkpoints * period_s + 4 * step_s, seed=every, storage_flows_per_s=0).generate()


def _steps_of(flows: pd.DataFrame) -> list[tuple[int, int]]:
    s = flows["start_ns"].to_numpy()
    pair = flows["src"].cat.codes.to_numpy() * 2 + flows["dst"].cat.codes.to_numpy()
    tl = StepTimeline().fit(np.zeros(len(s), int), s, s + flows["duration_ns"].to_numpy(), np.ones(len(s), bool), flows["size"].to_numpy(),
                            capture_end=int(s.max()), pair=pair)
    return list(zip(tl.steps_["start_ns"].tolist(), tl.steps_["end_ns"].tolist()))


def _check_checkpointed(every: int, checkpoints: int, dist_opt: bool, phase: int, frac: float) -> None:
    """The whole capture finds every real step (its first and last may be cut), and a prefix of it (at least 8 steps,
    cut anywhere) finds the steps the whole capture finds in the same span."""
    c = _checkpointed_job(every, checkpoints, dist_opt, phase % every)
    whole = _steps_of(c.flows)
    truth = list(zip(c.steps["start_ns"].tolist(), c.steps["end_ns"].tolist()))
    found = np.array(whole)
    # every real step, at its boundaries (flow times are whole ns: within 1 us)
    near = np.abs(np.array(truth)[:, None, :] - found[None, :, :]).max(axis=2).min(axis=1) <= 1_000
    assert near[1:-1].all() and len(whole) <= len(truth)
    t = c.flows["start_ns"].to_numpy()
    cut = truth[7][1] + frac * (t[-1] - truth[7][1])
    prefix = _steps_of(c.flows[t < cut])
    assert prefix == [x for x in whole if x[1] <= prefix[-1][1]]
    assert len([x for x in whole if x[1] < cut]) - len(prefix) <= 1  # the last burst may be cut short


def test_checkpoints_a_longer_capture_keeps_what_its_first_part_says():
    """Property (SYNTHETIC pure-DP jobs, hypothesis): a checkpoint every N steps (N 10 to 200, 1 to 20 checkpoints
    in the capture, at any phase), with and without a distributed optimizer. Before the fix, four checkpoints in view made the capture one of N-step "steps"."""
    from hypothesis import Phase, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=16, deadline=None, derandomize=True, phases=(Phase.explicit, Phase.generate))
    @given(st.integers(10, 200), st.integers(1, 20), st.integers(0, 199), st.floats(0.1, 0.9), st.booleans())
    def check(every, checkpoints, phase, frac, dist_opt):
        _check_checkpointed(every, max(1, min(checkpoints, 1200 // every)), dist_opt, phase, frac)  # the test's time: <= ~1,200 steps

    check()


@pytest.mark.parametrize("every, checkpoints", [(34, 6), (5, 10)])
def test_checkpoints_with_a_distributed_optimizer(every, checkpoints):
    _check_checkpointed(every, checkpoints, True, 3, 0.8)


def test_checkpoint_steps_are_slow_steps_that_recur():
    """End to end on a SYNTHETIC job with a checkpoint every 20 steps: every checkpoint's step, and only those, is
    a slow step, explained as recurring every 20 steps."""
    from prism.analysis.diagnosis import CrossStepDiagnoser

    c = _checkpointed_job(20, 8, False, 0)
    s = pd.DataFrame(_steps_of(c.flows), columns=["start_ns", "end_ns"])
    steps = s.assign(job_id="ckpt", step=np.arange(len(s)), duration_ns=s["end_ns"] - s["start_ns"])
    a = CrossStepDiagnoser().fit(steps).predict()
    assert (a["kind"] == "slow_step").all() and len(a) >= 6
    assert (np.diff(a["step"]) == 20).all()
    assert a["explanation"].str.contains("recur every 20 steps").all()


@pytest.mark.parametrize("shape", ["fsdp", "hsdp", "zero2"])
def test_sharded_steps_are_cut_at_the_optimizer_pause(tmp_path, shape):
    """SYNTHETIC FSDP, HSDP and ZeRO-2 at 0.3 s steps: their collectives run every micro-batch, and every layer's
    (or the forward's) gap is longer than the optimizer's, so no gap threshold isolates a step; the most regular
    threshold's pieces are layers, which carry unlike traffic. The optimizer's pause is a class of gaps of its own,
    once a step: cut there, every step is found at its true end, with no anomaly on the fault-free job."""
    from prism.analysis.evaluation import score_cluster
    from prism.ingest.topology import Topology
    from prism.offline.replay import replay
    from synthetic.dpshapes import dp_cluster

    c = dp_cluster(shape, "0.3s", duration_s=8, with_faults=False)
    c.write(tmp_path)
    r = replay([str(tmp_path / "flows.parquet")], Topology.from_csv(tmp_path / "topology.csv"), progress=False)
    score = score_cluster(r, c)
    assert score["jobs_ari"] == 1.0 and score["true_steps"] >= 20
    assert score["steps_found"] >= score["true_steps"] - 1 and score["steps_spurious"] == 0 and score["anomalies"] == 0
    found, truth = r.analysis.steps["end_ns"].to_numpy(), c.steps["end_ns"].to_numpy()
    off = np.abs(found[:, None] - truth[None, :]).min(axis=1)
    assert (off <= 1000).all()  # each step ends where the truth's does (within a microsecond)


@pytest.mark.parametrize("length, seconds", [("0.3s", 8), ("5s", 60)])
def test_micro_batches_that_each_all_reduce_are_grouped_into_steps(tmp_path, length, seconds):
    """SYNTHETIC DDP without ``no_sync``: every micro-batch all-reduces the whole gradient, so the regular, alike
    pieces between the longest gaps are micro-batches (2 a step at 0.3 s, 4 at 5 s). The optimizer makes every M-th
    gap a little longer: the steps are found at their true ends, none at a micro-batch's."""
    from prism.analysis.evaluation import score_cluster
    from prism.ingest.topology import Topology
    from prism.offline.replay import replay
    from synthetic.dpshapes import dp_cluster

    c = dp_cluster("ddp-sync", length, duration_s=seconds, with_faults=False)
    c.write(tmp_path)
    r = replay([str(tmp_path / "flows.parquet")], Topology.from_csv(tmp_path / "topology.csv"), progress=False)
    score = score_cluster(r, c)
    assert score["true_steps"] >= 10
    assert score["steps_found"] >= score["true_steps"] - 1 and score["steps_spurious"] == 0 and score["anomalies"] == 0
    found, truth = r.analysis.steps["end_ns"].to_numpy(), c.steps["end_ns"].to_numpy()
    assert (np.abs(found[:, None] - truth[None, :]).min(axis=1) <= 1000).all()


def test_accumulation_needs_a_recurring_longer_gap():
    """The grouping of pieces into steps: a longer gap at one phase of every period, smallest period first; not
    a period whose longer gap is a checkpoint's pause (over 1.5x), nor one that wins by chance, nor too few periods."""
    from prism.analysis.timeline import accumulation_period

    rng = np.random.default_rng(3)
    noise = rng.lognormal(0, 0.005, 64)
    assert accumulation_period(np.tile([100.0, 100.0, 106.0], 21) * noise[:63]) == (3, 2)
    assert accumulation_period(np.tile([103.0, 100.0], 32) * noise) == (2, 0)
    assert accumulation_period(np.tile([180.0, 100.0, 100.0, 100.0], 16) * noise) is None  # a checkpoint's pause
    assert accumulation_period(rng.lognormal(0, 0.02, 64)) is None
    assert accumulation_period(np.tile([103.0, 100.0], 4) * noise[:8]) is None  # 4 periods: could be chance


@pytest.mark.parametrize("shape", ["fsdp", "finetune"])
def test_the_pause_that_splits_a_micro_batch_boundary_ends_the_step(tmp_path, shape):
    """SYNTHETIC FSDP at 5 s steps: the optimizer's pause (50 ms) is as long as a layer's gap, so neither a
    threshold nor a class of gaps isolates the step. Between micro-batches the next all-gather follows the last
    reduce-scatter at once (one piece); the pause splits that piece once a step: the steps are found at their
    true ends, none at a micro-batch's or a layer's, with no anomaly on the fault-free job."""
    from prism.analysis.evaluation import score_cluster
    from prism.ingest.topology import Topology
    from prism.offline.replay import replay
    from synthetic.dpshapes import dp_cluster

    c = dp_cluster(shape, "5s", duration_s=40, with_faults=False)
    c.write(tmp_path)
    r = replay([str(tmp_path / "flows.parquet")], Topology.from_csv(tmp_path / "topology.csv"), progress=False)
    score = score_cluster(r, c)
    assert score["jobs_ari"] == 1.0 and score["true_steps"] >= 5
    assert score["steps_found"] >= score["true_steps"] - 2 and score["steps_spurious"] == 0 and score["anomalies"] == 0
    found, truth = r.analysis.steps["end_ns"].to_numpy(), c.steps["end_ns"].to_numpy()
    assert (np.abs(found[:, None] - truth[None, :]).min(axis=1) <= 1000).all()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=60), st.floats(0.0, 0.3), st.integers(0, 10**6))
def test_piece_period_is_the_first_period_numpys_way(template, noise, seed):
    """Property: :func:`piece_period`'s compiled loop gives the period the element-wise numpy search gave (the first
    ``q`` whose pieces are :func:`_alike` the piece ``q`` on, ``min_match`` of them), on noisy repeats of any template."""
    from prism.analysis.timeline import _alike, piece_period

    rng = np.random.default_rng(seed)
    b = np.tile(np.array(template, dtype=np.float64), 1 + int(rng.integers(0, 8)))
    b = b * rng.lognormal(0, noise, len(b))
    want = next((q for q in range(1, min(1024, len(b) // 3) + 1) if _alike(b[:-q], b[q:], 0.05).mean() >= 0.9), None)
    assert piece_period(b) == want


@given(st.lists(st.integers(1, 4), min_size=2, max_size=7), st.integers(2, 5), st.integers(4, 9), st.integers(0, 10**6))
def test_pause_splits_finds_every_inserted_split_and_nothing_else(template, micro, steps, seed):
    """Property: a sequence of pieces' bytes made of micro-batches of ``template`` (its first piece the previous
    micro-batch's last reduction plus its own start), ``micro`` a step, where once a step that first piece is split
    in two: the splits are found, exactly, and none in the same sequence without them."""
    from prism.analysis.timeline import pause_splits, piece_period

    rng = np.random.default_rng(seed)
    b0 = [float(x) for x in template]
    assume(len(set(b0)) > 1)
    head, last = b0[0] + 1.0, 1.0  # the merged piece: the last reduction (1.0) and the next micro-batch's start
    mb = [head] + b0[1:]
    seq, truth = [], []
    for _ in range(steps):
        truth.append(len(seq))
        seq += [last, head - last] + b0[1:]  # the step's first micro-batch: its merged piece split by the pause
        for _ in range(micro - 1):
            seq += mb
    b = np.array(seq) * rng.lognormal(0, 0.005, len(seq))
    q = piece_period(np.array(mb * 6))
    assert q is not None and len(mb) % q == 0
    q = len(mb)
    found = pause_splits(b, q).tolist()
    inner = [j for j in truth if q <= j < len(b) - q - 1]  # a split needs a micro-batch before it and one after
    assert found == inner
    plain = np.array(mb * (steps * micro)) * rng.lognormal(0, 0.005, steps * micro * len(mb))
    assert pause_splits(plain, q).tolist() == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=2, max_size=7), st.integers(2, 5), st.integers(5, 9), st.integers(0, 10**6),
       st.floats(0, 1), st.floats(0, 1))
def test_edge_splits_find_the_splits_the_capture_edges_hide(template, micro, steps, seed, head_at, tail_at):
    """Property: the sequences of the pause-splits property, the capture opening anywhere in the first step and
    closing anywhere in the last: every split with its next piece in view is found, by pause_splits inside and by
    edge_splits at the edges (a split in the first or last micro-batch, which pause_splits cannot test), and no
    other piece is taken."""
    from prism.analysis.timeline import edge_splits, pause_splits

    rng = np.random.default_rng(seed)
    b0 = [float(x) for x in template]
    assume(len(set(b0)) > 1)
    head, last = b0[0] + 1.0, 1.0
    mb = [head] + b0[1:]
    seq, truth = [], []
    for _ in range(steps):
        truth.append(len(seq))
        seq += [last, head - last] + b0[1:]
        for _ in range(micro - 1):
            seq += mb
    q, step = len(mb), micro * len(mb) + 1
    lo = int(head_at * step)  # the capture opens inside the first step, closes inside the last
    hi = len(seq) - int(tail_at * step)
    b = (np.array(seq) * rng.lognormal(0, 0.005, len(seq)))[lo:hi]
    truth = [j - lo for j in truth if lo <= j and j - lo + 1 < len(b)]  # a split is seen with its next piece
    d = pause_splits(b, q)
    assume(len(d) >= 2 and (np.diff(d) == step).all())
    first, tail = edge_splits(b, int(d[0]), int(d[-1]), step, q)
    found = ([first] if first >= 0 else []) + d.tolist() + ([tail] if tail >= 0 else [])
    assert found == truth


@pytest.mark.parametrize("faulty", [False, True])
def test_the_capture_edges_do_not_hide_a_fine_tuning_step(tmp_path, faulty):
    """SYNTHETIC 2-server fine-tuning at 5 s steps, a 60 s capture opening 1.07 s before a step's pause: the first
    step (1.07 s to 5.95 s) is whole in the capture, but its opening split has less than a micro-batch before it,
    so the pause-split test (a micro-batch before and one after) could not see it, and every step but it was found
    (10 of 11 fault-free, 7 of 8 with the slow server). The step beside it repeats the next one piece for piece:
    every step is found, none spurious, at its true end."""
    from prism.analysis.evaluation import score_cluster
    from synthetic.dpshapes import dp_cluster

    c = dp_cluster("finetune", "5s", duration_s=60, with_faults=faulty)
    c.write(tmp_path)
    r = replay([str(tmp_path / "flows.parquet")], Topology.from_csv(tmp_path / "topology.csv"), progress=False)
    score = score_cluster(r, c)
    assert score["steps_found"] == score["true_steps"] >= 8 and score["steps_spurious"] == 0
    found, truth = r.analysis.steps["end_ns"].to_numpy(), c.steps["end_ns"].to_numpy()
    assert (np.abs(found[:, None] - truth[None, :]).min(axis=1) <= 1000).all()
    assert found[0] == truth[0]  # the first step, whole in the capture
    if not faulty:
        assert score["anomalies"] == 0


def _layered(n_steps, layers=6, micro=2, opt=3.0, every=0, pause=0.0, seed=0):
    """SYNTHETIC arrays of an FSDP-like job: per micro-batch ``layers`` collectives 10 ms apart (forward), then
    ``layers`` 20 ms apart (backward, the last with no compute after it); ``opt`` ms after a step's last collective
    the next step starts, ``pause`` ms later after every ``every``-th step (a checkpoint). A collective is 8 flows
    of 1 us on pairs 0-7, 1 us apart. Returns start, end (ns) and each step's true end (its last flow's end)."""
    rng = np.random.default_rng(seed)
    starts, ends, t = [], [], 0.0
    for k in range(n_steps):
        gaps = np.tile([10.0] * layers + [20.0] * layers, micro) * rng.lognormal(0, 0.01, 2 * layers * micro)
        gaps[-1] = 0.0
        for gap in gaps:
            starts.append(t + np.arange(8) * 0.001)
            t += gap
        ends.append(t + 0.008)  # the last flow starts 7 us after the collective, and takes 1 us
        t = ends[-1] + opt + (pause if every and (k + 1) % every == 0 else 0.0)
    s = np.round(np.concatenate(starts) * 1e6).astype(np.int64)
    return s, s + 1000, np.round(np.array(ends) * 1e6).astype(np.int64)


def test_class_cut_finds_the_pause_between_layer_gaps():
    """Arrays (SYNTHETIC): the optimizer's 3 ms between steps, shorter than every layer's gap (10 and 20 ms), so
    every threshold that cuts at it cuts at every layer; the class of the 3 ms gaps alone gives the steps."""
    s, e, truth = _layered(30)
    gap, busy_end = busy_gaps(s, e)
    pair = np.arange(len(s)) % 8
    from prism.analysis.timeline import class_cut

    c = class_cut(gap, busy_end, pair, None, None, False)
    assert c is not None and np.array_equal(c.ends, truth[:-1]) and c.tau < 3e6  # a boundary after every step but the last


@pytest.mark.parametrize("checkpoints", [2, 6])
def test_class_cut_checkpoints_stay_slow_steps(checkpoints):
    """A checkpoint (40 ms) every 10 steps of the same job: the threshold above the layer gaps cuts 10-step groups,
    whose pieces are alike; the class cut of the optimizer's pause (and the checkpoints' gaps above) is the step,
    with 2 checkpoints in view as with 6: a longer capture says what its first part says."""
    from prism.analysis.timeline import StepTimeline

    s, e, truth = _layered(10 * checkpoints + 5, every=10, pause=40.0)
    tl = StepTimeline().fit(np.zeros(len(s), int), s, e, np.ones(len(s), bool), size=np.ones(len(s), int), capture_end=int(s.max()),
                            pair=np.arange(len(s)) % 8)
    ends = tl.steps_["end_ns"].to_numpy()
    # every step but the capture's first and last (no boundary before the first, none seen after the last)
    assert np.array_equal(ends, truth[1:-1])


def test_pair_keys_without_sizes_still_give_steps():
    """Pair keys with no byte counts (sizes not given, or all 0: ingest accepts 0-byte flows) compare the pieces by
    their flows; all-zero weights once made every piece "unlike" and the job lost every step."""
    s = (np.arange(12)[:, None] * 100_000_000 + np.arange(4)[None, :] * 10_000).ravel()
    pair = np.tile(np.arange(4), 12)
    for size in (None, np.zeros(len(s), int)):
        tl = StepTimeline().fit(np.zeros(len(s), int), s, s + 5000, np.ones(len(s), bool), size=size, capture_end=int(s.max()) + 10**9,
                                pair=pair)
        assert len(tl.steps_) == 11 and not tl.unlike_


def _replay_cluster(c, tmp_path):
    from prism.analysis.evaluation import score_cluster

    c.write(tmp_path)
    r = replay([str(tmp_path / "flows.parquet")], Topology.from_csv(tmp_path / "topology.csv"), progress=False)
    return r, score_cluster(r, c)


@pytest.mark.parametrize("shape, length, seconds", [("fsdp", "0.3s", 8), ("hsdp", "0.3s", 8), ("fsdp", "5s", 40), ("hsdp", "5s", 40)])
def test_a_slow_servers_pairs_show_the_steps_its_waits_hide(tmp_path, shape, length, seconds):
    """SYNTHETIC FSDP and HSDP with one server 1.4x slower from a third of the capture: every collective waits for
    it, and the early members' first messages split those waits, so the job's gaps are a continuum in which the
    optimizer's pause is one gap among many (no step was found; HSDP's at 5 s only in a long capture, its longest
    run of pause splits). The ring edges into and out of the slow server wait for nothing: cut on their flows, and
    each boundary moved to the job's idle gap it stands for, every step is found at its true end, none spurious,
    and nothing raised that the fault does not explain."""
    from synthetic.dpshapes import dp_cluster

    c = dp_cluster(shape, length, duration_s=seconds, with_faults=True)
    r, score = _replay_cluster(c, tmp_path)
    assert score["jobs_ari"] == 1.0 and score["true_steps"] >= 5
    assert score["steps_found"] >= score["true_steps"] - 1 and score["steps_spurious"] == 0
    assert score["anomalies_unexplained"] == 0
    found, truth = r.analysis.steps["end_ns"].to_numpy(), c.steps["end_ns"].to_numpy()
    assert (np.abs(found[:, None] - truth[None, :]).min(axis=1) <= 1000).all()


def _every_step_and_the_fault(c, tmp_path, min_steps):
    """Replayed, the one job of ``c`` is found whole, every step of its truth at its true end and none spurious (at
    least ``min_steps``), and its one fault found with nothing else."""
    r, score = _replay_cluster(c, tmp_path)
    assert score["jobs_ari"] == 1.0 and score["true_steps"] >= min_steps
    assert score["steps_found"] == score["true_steps"] and score["steps_spurious"] == 0
    assert score["faults_found"] == 1 and score["anomalies_unexplained"] == 0
    found, truth = r.analysis.steps["end_ns"].to_numpy(), c.steps["end_ns"].to_numpy()
    assert (np.abs(found[:, None] - truth[None, :]).min(axis=1) <= 1000).all()


def test_a_slow_server_from_the_start_the_most_regular_pairs_give_the_steps(tmp_path):
    """SYNTHETIC faulty FSDP at 0.3 s, 20 s, one server 1.4x slower from the capture's third step (the DP matrix's
    variant with the fault from the start). The edges into and out of the slow server cut at the optimizer's pause
    (50 ends, the job's 3.0 ms idle gaps, a score of 0.0015), but the edge two hops after it waits at every
    micro-batch's first collective, and its 8 rails, tried first, agreed on a cut at each micro-batch, 20 and 222 ms
    after each step's end (0.8-1.4 ms gaps, a score of 0.026): 0 of 48 steps, 92 spurious half steps. Every pair is
    now tried and the most regular cut its pairs agree on wins: every step at its true end, none spurious. (With the
    fault a third of the way in, or over 60 s, that edge's micro-batch gaps are no class of their own.)"""
    from synthetic.dpshapes import EARLY_FAULT_STEP, dp_cluster

    _every_step_and_the_fault(dp_cluster("fsdp", "0.3s", duration_s=20, with_faults=True, from_step=EARLY_FAULT_STEP), tmp_path, 40)


def test_sub_microsecond_gaps_are_no_class_of_pauses(tmp_path):
    """SYNTHETIC faulty FSDP at 0.3 s (60 s, one server 1.4x slower from 19.4 s): the capture's first 30 s, as a
    capture of its own (a daemon's window), gave 3 "steps" of 5.4-9.9 s, none at a true end, where the whole capture
    gives all its steps: the job's collectives run back to back, so of its 425,687 gaps 5,719 are positive and 14 under
    a microsecond, and four of those (156-190 ns, jumps of 1.3x and 2.2x to the next below and above) fell evenly
    enough to pass for a class of pauses. Under a microsecond a gap is no pause: the first half now says what the whole says of it (the
    daemon, 180 s, 120 s windows: 427 of 497 steps, its window of 60-180 s cut the same way)."""
    from dataclasses import replace

    from synthetic.dpshapes import dp_cluster

    c = dp_cluster("fsdp", "0.3s", duration_s=60, with_faults=True)
    half = int(c.meta["window_start_ns"]) + 30 * 10**9
    first = replace(c, flows=c.flows[c.flows["start_ns"] < half])
    first.write(tmp_path)
    r = replay([str(tmp_path / "flows.parquet")], Topology.from_csv(tmp_path / "topology.csv"), progress=False, stop_after="steps")
    found, truth = r.analysis.steps["end_ns"].to_numpy(), c.steps["end_ns"].to_numpy()
    assert len(found) and (np.abs(found[:, None] - truth[None, :]).min(axis=1) <= 1000).all()  # every one at a true end
    whole = truth[(truth > truth[0]) & (truth < half - 0.5e9)]  # the steps whole in the 30 s (less the capture's last)
    seen = np.abs(whole[:, None] - found[None, :]).min(axis=1) <= 1000
    assert seen.all(), f"{seen.sum()} of {len(whole)}"


def test_many_micro_batches_each_all_reducing_are_grouped_into_steps(tmp_path):
    """SYNTHETIC DDP without ``no_sync`` and 16 micro-batches a step (a 1% optimizer: each step's gap about half a
    forward's longer, as long as a short checkpoint's pause against a step's). Before, only 2 to 8 micro-batches
    were grouped: every micro-batch was a step and the optimizer's gap a slow step recurring every 16. Now the
    steps are found at their true ends, none at a micro-batch's, and no anomaly is raised."""
    from synthetic import ClusterGenerator, Fabric
    from synthetic.dpshapes import dp_job

    secs, M = 1.2, 16
    job = dp_job("ddp-sync", "0.3s", microbatches=M, fwd_ms=secs * 0.96e3 / (3 * M), optimizer_ms=secs * 10)
    fab = Fabric(servers=job.dp + 2, servers_per_group=4, spines=4)
    c = ClusterGenerator(fab, [job], duration_s=10 * secs, seed=0, uniform_dp_share=0.0, storage_flows_per_s=0).generate()
    r, score = _replay_cluster(c, tmp_path)
    assert score["true_steps"] >= 6
    assert score["steps_found"] >= score["true_steps"] - 1 and score["steps_spurious"] == 0 and score["anomalies"] == 0
    found, truth = r.analysis.steps["end_ns"].to_numpy(), c.steps["end_ns"].to_numpy()
    assert (np.abs(found[:, None] - truth[None, :]).min(axis=1) <= 1000).all()


def test_micro_batches_are_grouped_with_few_steps_in_view(tmp_path):
    """SYNTHETIC DDP without ``no_sync`` (4 micro-batches a step, 5 s), 60 s, one server 1.4x slower from the
    capture's third step: the slowed steps (6.8 s) leave 38 micro-batches in view, 9 periods of 4. The step's gap
    (the optimizer's, 466-477 ms) was the longest of its period in all 9, but 9 periods can show no more than 4^-9,
    1.3e-4 over the 35 periods and phases tried: every micro-batch was a step (8 of 8 steps, 25 spurious). Those 9
    gaps are the 9 longest of all 36 (the others 414-425 ms: one way in C(36, 9), 1e-8): now every step at its true
    end, none spurious, as the same run over 180 s (27 periods) and the run slowed from a third of the 60 s (10)."""
    from synthetic.dpshapes import EARLY_FAULT_STEP, dp_cluster

    _every_step_and_the_fault(dp_cluster("ddp-sync", "5s", duration_s=60, with_faults=True, from_step=EARLY_FAULT_STEP), tmp_path, 8)


def test_many_micro_batches_or_a_checkpoint_every_n_steps():
    """The same gaps on the wire, a longer one every N pieces (SYNTHETIC arrays): past 8 pieces a period is taken
    for accumulation only if the gap adds at most a fifth of a piece (an optimizer's 1% of a step of 16
    micro-batches adds 0.16 of one), never a checkpoint's 30% of a step every 12 steps, and only with the tests'
    margins over every period tried: 4 periods of 16 could be chance (their 4 gaps the 4 longest of 64: 1.7e-3 over
    the 527 tests), 5 could (the binomial's 1e-3) unless their gaps are the 5 longest of all 80 (4e-5), which a
    level shift from the third period on hides."""
    from prism.analysis.timeline import accumulation_period

    noise = np.random.default_rng(5).lognormal(0, 0.005, 256)
    micro = np.tile([148.0] + [100.0] * 15, 8) * noise[:128]  # the forward's gap, a third of a 300 micro-batch
    assert accumulation_period(micro) is None  # up to 8 pieces only, without the pieces' length
    assert accumulation_period(micro, piece_ns=300.0) == (16, 0)
    assert accumulation_period(micro[:64], piece_ns=300.0) is None  # 4 periods
    assert accumulation_period(micro[:80], piece_ns=300.0) == (16, 0)  # 5 periods, the step's gaps the longest of all
    shifted = micro[:80] * np.where(np.arange(80) >= 32, 1.6, 1.0)  # the others' gaps after the shift pass the 2 first
    assert accumulation_period(shifted, piece_ns=300.0) is None
    ckpt = np.tile([130.0] + [100.0] * 11, 10) * noise[:120]  # steps of 100 (their gap), a checkpoint of 30 every 12
    assert accumulation_period(ckpt, piece_ns=100.0) is None


def test_a_checkpoint_every_12_steps_stays_a_slow_step(tmp_path):
    """End to end (SYNTHETIC pure-DP job): a checkpoint every 12 steps that adds half a step's compute (a third of
    its time, half a gap more: a period of 12 would be taken for accumulation only under a fifth of a piece) is a
    slow step recurring every 12 steps, not the period, with many micro-batches now grouped into steps."""
    from prism.analysis.diagnosis import CrossStepDiagnoser

    c = _checkpointed_job(12, 8, False, 0, pause=0.5)
    s = pd.DataFrame(_steps_of(c.flows), columns=["start_ns", "end_ns"])
    truth = c.steps["end_ns"].to_numpy()
    assert len(s) >= len(truth) - 2 and (np.abs(s["end_ns"].to_numpy()[:, None] - truth[None, :]).min(axis=1) <= 1000).all()
    steps = s.assign(job_id="ckpt", step=np.arange(len(s)), duration_ns=s["end_ns"] - s["start_ns"])
    a = CrossStepDiagnoser().fit(steps).predict()
    assert (a["kind"] == "slow_step").all() and len(a) >= 6
    assert (np.diff(a["step"]) == 12).all()


def test_a_capture_opening_inside_the_gradient_all_reduce_keeps_the_first_step(tmp_path):
    """SYNTHETIC ZeRO-1 at 0.3 s steps: all-reduce, the CPU optimizer's 30 ms, the parameters' all-gather in one
    burst. The capture opens 3 ms into a step's all-reduce, so the first burst holds 90% of it, and its pause failed
    the before-equals-after byte test: the first step (whole in the capture) was lost. The pause is the others'
    (same length, the same all-gather after it pair by pair, a part of the all-reduce before): kept."""
    from prism.analysis.evaluation import score_cluster
    from synthetic.dpshapes import dp_cluster

    c = dp_cluster("zero1", "0.3s", duration_s=8, with_faults=False)
    c.write(tmp_path)
    r = replay([str(tmp_path / "flows.parquet")], Topology.from_csv(tmp_path / "topology.csv"), progress=False)
    score = score_cluster(r, c)
    assert score["steps_found"] == score["true_steps"] >= 20 and score["steps_spurious"] == 0 and score["anomalies"] == 0
    found, truth = r.analysis.steps["end_ns"].to_numpy(), c.steps["end_ns"].to_numpy()
    assert found[0] == truth[0]


@pytest.mark.parametrize("shape", ["finetune", "hsdp"])
def test_clear_to_sends_leave_the_steps_as_they_are(tmp_path, monkeypatch, shape):
    """SYNTHETIC 2-server rings (the fine-tuning job; HSDP's shard and replica rings) with one server 1.4x slower, and
    each ring edge's receiver clearing its sender to send (256 bytes, as NCCL's network transport does) as it enters
    a collective. The early members' clear-to-sends land in the waits and the optimizer's pause: counted as traffic,
    they filled the pause the steps are cut at (the fine-tuning job and HSDP got no step). They are no data: the
    steps, and the collective instances, are those of the same flows without them, every step at its true end."""
    import synthetic.dpshapes as dps

    got, coll = {}, {}
    for cts in (0, 256):
        monkeypatch.setattr(dps, "CTS_BYTES", cts)
        c = dps.dp_cluster(shape, "0.3s", duration_s=12, with_faults=True)
        assert ((c.flows["size"] == 256).sum() > 0) == (cts > 0)
        r, score = _replay_cluster(c, tmp_path / str(cts))
        assert score["steps_found"] == score["true_steps"] >= 30 and score["steps_spurious"] == 0
        got[cts] = r.analysis.steps[["start_ns", "end_ns"]].reset_index(drop=True)
        coll[cts] = r.analysis.collectives.reset_index(drop=True)
    pd.testing.assert_frame_equal(got[0], got[256])
    pd.testing.assert_frame_equal(coll[0], coll[256])  # no collective of their own, nor part of one's flows and bytes
