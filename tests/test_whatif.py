"""What-if replay: the simulator, real op traces (StragglerAnalysis), and counterfactuals on a SYNTHETIC twin."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from prism.cli import main
from prism.whatif.graph import ExecutionGraph, GraphCycleError, simulate
from prism.whatif.optrace import OpGraph, observed_step_times, read_op_trace
from prism.whatif.scenarios import apply_op_scenarios, parse_scenario
from synthetic.fromtrace import shared_data_dir

SA = shared_data_dir() / "straggler-analysis"
needs_sa = pytest.mark.skipif(not SA.is_dir(), reason=f"{SA} not present (PRISM_SHARED_DATA names the real-data directory)")


def test_a_synchronisation_waits_for_its_last_member_and_gaps_add():
    # two ranks: rank 0 computes 1 s, rank 1 computes 3 s, then a collective (node 2) of 0.5 s, then each
    # computes 1 s more (rank 0 after a 0.25 s launch gap)
    g = ExecutionGraph(duration=[1, 3, 0.5, 1, 1], step=[0] * 5, src=[0, 1, 2, 2], dst=[2, 2, 3, 4], gap=[0, 0, 0.25, 0])
    r = simulate(g)
    assert r.start.tolist() == [0, 0, 3, 3.75, 3.5]
    assert r.step_times()["step_s"].tolist() == [4.75]


def test_a_cycle_is_a_clear_error():
    g = ExecutionGraph(duration=[1, 1], step=[0, 0], src=[0, 1], dst=[1, 0], gap=[0, 0])
    with pytest.raises(GraphCycleError, match="deadlock"):
        simulate(g)
    with pytest.raises(ValueError, match="does not exist"):
        ExecutionGraph(duration=[1], step=[0], src=[0], dst=[3], gap=[0])


def test_scenario_parsing_rejects_nonsense():
    for bad in ["faster", "scale-comm", "scale-comm:-1", "scale-compute", "scale-compute:0", "scale-dp:two", "remove-stragglers:1", "heal-switch", "heal-link",
                "heal-link:spine-00", "move-job", "move-job:spine-00", "move-job:@spine-00", "move-job:job-1@", "move-job:job-1@a>b>c"]:
        with pytest.raises(ValueError):
            parse_scenario(bad)
    assert str(parse_scenario("heal-switch:spine-00")) == "heal-switch:spine-00"
    assert str(parse_scenario("heal-link:leaf-g00-r0>spine-00")) == "heal-link:leaf-g00-r0>spine-00"
    assert parse_scenario("move-job:job-1@spine-00").value == "job-1@spine-00"


@needs_sa
@pytest.mark.parametrize("trial", ["ST", "SE"])
def test_replay_fidelity_on_real_traces(trial):
    ops = read_op_trace(SA / f"trace-{trial}.parquet")
    g = OpGraph(ops)
    r = simulate(g.graph())
    replayed = g.step_seconds(r)
    observed = observed_step_times(ops)
    err = (replayed / observed - 1).abs()
    assert err.mean() < 0.01 and err.max() < 0.02  # Lumos reports 3.3%; the target is 1%
    # the authors' own per-step base times are the observed ones
    base = pd.Series(json.loads((SA / f"result-{trial}.json").read_text())["step_t_base"]).rename(int)
    assert np.allclose(observed.reindex(base.index), base, rtol=1e-5)


@needs_sa
def test_scenarios_on_real_traces_move_the_right_way():
    ops = read_op_trace(SA / "trace-SE.parquet")
    meta = yaml.safe_load((SA / "meta-SE.yaml").read_text())
    g = OpGraph(ops)

    def median_step(scenarios):
        d = apply_op_scenarios(g, [parse_scenario(s) for s in scenarios], meta["dp_size"])
        r = simulate(g.graph(d, launch_delay=False))
        return float(g.step_seconds(r).median())

    base = median_step([])
    no_stragglers = median_step(["remove-stragglers"])
    ideal = median_step(["ideal"])
    assert ideal < no_stragglers < base
    assert median_step(["scale-comm:0.5"]) < base < median_step(["scale-comm:2"])
    assert median_step(["scale-compute:0.5"]) < base < median_step(["scale-compute:2"])
    assert median_step(["scale-dp:64"]) > base > median_step(["scale-dp:8"])  # bigger rings, longer collectives
    # the baseline of the scenarios (observed work, no launch delays) is the observed step within 1%
    assert abs(base / float(observed_step_times(ops).median()) - 1) < 0.01


@needs_sa
@pytest.mark.parametrize("trial", ["ST", "SE"])
def test_ideal_and_attribution_match_the_straggler_analysis_authors(trial):
    """Against the authors' own results on their traces: T_ideal, and the slowdown each DP rank and each
    stage explains alone (``blocking_decompose_by_*``), within 2%."""
    from prism.whatif.run import attribute_ops

    ops = read_op_trace(SA / f"trace-{trial}.parquet")
    g = OpGraph(ops)
    ms = json.loads((SA / f"ms-{trial}.json").read_text())
    result = json.loads((SA / f"result-{trial}.json").read_text())
    d = apply_op_scenarios(g, [parse_scenario("ideal")])
    ideal = float(g.step_seconds(simulate(g.graph(d, launch_delay=False))).mean())
    assert abs(ideal / ms["tideal"] - 1) < 0.02
    table, summary = attribute_ops(g)
    assert abs(summary["ideal_step_mean_s"] / ms["tideal"] - 1) < 0.02
    assert abs(summary["slowdown"] / result["blocking_slowdown"] - 1) < 0.02
    for level in ("dp_rank", "stage"):
        ours = table[table["level"] == level].set_index("key")["slowdown"]
        theirs = pd.Series(result[f"blocking_decompose_by_{level}"]).rename(int)
        assert set(ours.index) == set(theirs.index)
        assert ((ours.reindex(theirs.index) / theirs - 1).abs() < 0.02).all(), (level, ours, theirs)
    # which op types matter, in the authors' order for the two that do
    opt = table[table["level"] == "optype"].set_index("key")["slowdown"]
    top = list(pd.Series(result["blocking_decompose_by_optype"]).sort_values(ascending=False).index[:2])
    assert list(opt.index[:2]) == top
    if trial == "SE":  # the stage issue (M_S) and the worker issue (M_W) the authors report
        assert abs(summary["m_s"] - ms["Ms"]) < 0.02
        assert abs(summary["m_w"] - json.loads((SA / "mw-SE.json").read_text())["Mw"]) < 0.01


@needs_sa
def test_remove_stragglers_takes_out_an_injected_straggler():
    """A worker made 2x slower than its DP peers (re-timed through the simulator, exact truth): removing
    stragglers gives back the job without it, and the attribution names that worker first."""
    from prism.whatif.run import attribute_ops
    from synthetic.fromtrace import Straggler, with_straggler

    clean = read_op_trace(SA / "trace-ST.parquet")
    slow = with_straggler(clean, Straggler(dp=1, stage=2, factor=2.0, from_step=0))

    def mean_step(ops, scenarios):
        g = OpGraph(ops)
        d = apply_op_scenarios(g, [parse_scenario(s) for s in scenarios])
        return float(g.step_seconds(simulate(g.graph(d, launch_delay=False))).mean())

    before, after = mean_step(slow, []), mean_step(slow, ["remove-stragglers"])
    truth = mean_step(clean, ["remove-stragglers"])
    assert before > 1.1 * truth  # the straggler costs the job more than 10%
    assert abs(after / truth - 1) < 0.02
    table, _ = attribute_ops(OpGraph(slow))
    worker = table[table["level"] == "worker"].iloc[0]["key"]
    o = slow
    assert set(o.loc[o["rank"] == worker, ["dp_rank", "stage"]].drop_duplicates().itertuples(index=False, name=None)) == {(1, 2)}


@needs_sa
@pytest.mark.parametrize("trial", ["ST", "SE"])
def test_microbatches_rebuilds_the_pipeline(trial, tmp_path):
    """microbatches:M rebuilds each rank's 1F1B for M micro-batches, every op's work from its own observation
    (micro-batch j from the observed j mod M): at the observed M it is the baseline in every step (SE's
    micro-batches differ in sequence length, which the rebuild keeps)."""
    from prism.whatif.run import restructure
    from prism.whatif.scenarios import Scenario

    ops = read_op_trace(SA / f"trace-{trial}.parquet")
    meta = yaml.safe_load((SA / f"meta-{trial}.yaml").read_text())
    m = int(ops[ops["optype"] == "forward-compute"].groupby(["step", "rank"]).size().iloc[0])
    g = OpGraph(ops)

    def steps(k):
        gp = restructure(g, [Scenario("microbatches", str(k))], meta)[0]
        return gp, gp.step_seconds(simulate(gp.graph(gp.work(), launch_delay=False)))

    base = g.step_seconds(simulate(g.graph(g.work(), launch_delay=False)))
    same_graph, same = steps(m)
    assert len(same_graph.ops) == len(ops)
    assert same_graph.ops["optype"].value_counts().to_dict() == ops["optype"].value_counts()[lambda c: c > 0].to_dict()
    assert ((same / base - 1).abs() < 0.01).all()
    double, half = float(steps(2 * m)[1].mean()), float(steps(max(m // 2, 1))[1].mean())
    assert half < float(base.mean()) < double
    rc = main(["whatif", "--ops", str(SA / f"trace-{trial}.parquet"), "--meta", str(SA / f"meta-{trial}.yaml"),
               "--scenario", f"microbatches:{2 * m}", "--out", str(tmp_path / "o"), "--quiet"])
    assert rc == 0
    job = json.loads((tmp_path / "o" / "summary.json").read_text())["jobs"][trial]
    assert job["predicted_step_s"] == pytest.approx(double, rel=1e-9)
    assert job["predicted_step_s"] > job["baseline_step_s"]
    assert job["predicted_bubble_fraction"] < job["baseline_bubble_fraction"]  # more micro-batches, less bubble


@needs_sa
def test_whatif_cli_on_an_op_trace(tmp_path):
    out = tmp_path / "wi"
    rc = main(["whatif", "--ops", str(SA / "trace-ST.parquet"), "--meta", str(SA / "meta-ST.yaml"), "--scenario", "ideal",
               "--out", str(out), "--quiet"])
    assert rc == 0
    job = json.loads((out / "summary.json").read_text())["jobs"]["ST"]
    assert {"observed_step_s", "replayed_step_s", "predicted_step_s"} <= set(job)
    assert abs(job["replayed_step_s"] / job["observed_step_s"] - 1) < 0.01
    tideal = json.loads((SA / "ms-ST.json").read_text())["tideal"]
    assert abs(job["predicted_step_s"] / tideal - 1) < 0.05  # the StragglerAnalysis straggler-free step time
    steps = pd.read_csv(out / "steps.csv")
    assert len(steps) == job["steps"] and set(steps.columns) == {"job_id", "step", "observed_s", "replayed_s", "baseline_s", "predicted_s"}
    trace = json.loads((out / "timeline.json").read_text())["traceEvents"]
    assert sum(e["ph"] == "X" for e in trace) == len(read_op_trace(SA / "trace-ST.parquet"))
    assert_named_integer_tracks(trace)
    names = [e["args"]["name"] for e in trace if e["name"] == "thread_name"]
    assert names[:3] == ["rank 0", "rank 1", "rank 2"] and len(names) == read_op_trace(SA / "trace-ST.parquet")["rank"].nunique()


def assert_named_integer_tracks(trace):
    """Integer pid/tid (the Chrome trace format), and every track named, as in the replay's trace."""
    slices = [e for e in trace if e["ph"] == "X"]
    assert slices and all(type(e["pid"]) is int and type(e["tid"]) is int for e in slices)
    named_threads = {(e["pid"], e["tid"]) for e in trace if e["name"] == "thread_name"}
    named_processes = {e["pid"] for e in trace if e["name"] == "process_name"}
    assert {(e["pid"], e["tid"]) for e in slices} <= named_threads and {e["pid"] for e in slices} <= named_processes


def test_whatif_cli_bad_input(tmp_path):
    bad = tmp_path / "ops.csv"
    pd.DataFrame({"rank": [0], "step": [0]}).to_csv(bad, index=False)
    assert main(["whatif", "--ops", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert main(["whatif", str(tmp_path), "--out", str(tmp_path / "o")]) == 2  # not a replay directory
    assert main(["whatif", str(bad), "--out", str(tmp_path / "o")]) == 2  # a trace given where a directory belongs
    assert main(["whatif", "--ops", str(bad), "--scenario", "quicker", "--out", str(tmp_path / "o")]) == 2


def _small_trace(tmp_path) -> pd.DataFrame:
    ops = read_op_trace(SA / "trace-ST.parquet")
    return ops[ops["step"] == ops["step"].min()]


@needs_sa
@pytest.mark.parametrize("case, match", [
    ("string stage", "bad stage"), ("infinite duration", "bad duration"), ("no ops", "no ops"),
    ("unknown op types", "none of its op types"), ("fractional rank", "bad rank"),
])
def test_whatif_bad_op_traces_are_clear_errors(tmp_path, capsys, case, match):
    ops = _small_trace(tmp_path)
    if case == "string stage":
        ops = ops.astype({"stage": str})
        ops.loc[ops.index[3], "stage"] = "two"
    elif case == "infinite duration":
        ops.loc[ops.index[5], "duration"] = np.inf
    elif case == "no ops":
        ops = ops.head(0)
    elif case == "unknown op types":
        ops = ops.assign(optype="matmul")
    elif case == "fractional rank":
        ops = ops.astype({"rank": float})
        ops.loc[ops.index[1], "rank"] = 1.5
    ops.to_parquet(tmp_path / "ops.parquet")
    assert main(["whatif", "--ops", str(tmp_path / "ops.parquet"), "--out", str(tmp_path / "o")]) == 2
    assert match in capsys.readouterr().err


@needs_sa
@pytest.mark.parametrize("args, match", [
    (["--meta", "META"], "dp_size must be a whole number"),
    (["--scenario", "scale-comm:nan"], "positive, finite factor"),
    (["--scenario", "scale-comm:inf"], "positive, finite factor"),
    (["--scenario", "microbatches:100000"], "at most 1024 micro-batches"),
])
def test_whatif_bad_settings_are_refused(tmp_path, capsys, args, match):
    _small_trace(tmp_path).to_parquet(tmp_path / "ops.parquet")
    (tmp_path / "meta.yaml").write_text("dp_size: -2\n")
    args = [str(tmp_path / "meta.yaml") if a == "META" else a for a in args]
    assert main(["whatif", "--ops", str(tmp_path / "ops.parquet"), *args, "--out", str(tmp_path / "o")]) == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "o" / "summary.json").exists()


# ------------------------------------------------------- network replays


@pytest.fixture(scope="module")
def replays(tiny_dir, tmp_path_factory):
    """The SYNTHETIC tiny cluster with its faults and its fault-free twin (same seed), both replayed."""
    from synthetic import preset

    d = tmp_path_factory.mktemp("whatif")
    twin = d / "twin"
    preset("tiny", seed=0, with_faults=False).generate().write(twin)
    out = {}
    for name, src in (("faulty", Path(tiny_dir)), ("twin", twin)):
        assert main(["replay", str(src / "flows.parquet"), "--topology", str(src / "topology.csv"), "--out", str(d / f"r-{name}"), "--quiet"]) == 0
        out[name] = d / f"r-{name}"
    out["topology"] = Path(tiny_dir) / "topology.csv"
    out["faults"] = pd.read_csv(Path(tiny_dir) / "truth" / "faults.csv")
    out["dir"] = d
    return out


def _jobs(path) -> dict:
    return json.loads((path / "summary.json").read_text())["jobs"]


def test_network_replay_is_faithful_and_counterfactuals_match_the_twin(replays):
    d = replays["dir"]
    sw = replays["faults"].query("kind == 'slow_switch'")["subject"].iloc[0]
    assert main(["whatif", str(replays["faulty"]), "--out", str(d / "w0"), "--quiet"]) == 0
    assert main(["whatif", str(replays["twin"]), "--out", str(d / "wt"), "--quiet"]) == 0
    assert main(["whatif", str(replays["faulty"]), "--topology", str(replays["topology"]), "--scenario", "remove-stragglers",
                 "--scenario", f"heal-switch:{sw}", "--out", str(d / "w1"), "--quiet"]) == 0
    base, twin, fixed = _jobs(d / "w0"), _jobs(d / "wt"), _jobs(d / "w1")
    assert set(base) == set(twin) == set(fixed) and len(base) >= 3
    # the twin has no slow step either, which neither scenario removes: compare medians over the steps
    twin_median = pd.read_csv(d / "wt" / "steps.csv").groupby("job_id")["observed_s"].median()
    fixed_median = pd.read_csv(d / "w1" / "steps.csv").groupby("job_id")["predicted_s"].median()
    base_median = pd.read_csv(d / "w0" / "steps.csv").groupby("job_id")["observed_s"].median()
    moved = 0
    for job in base:
        assert base[job]["replay_error_mean_pct"] < 1.0
        truth = twin_median[job]
        assert abs(fixed_median[job] / truth - 1) < 0.02, (job, fixed[job], truth)
        moved += abs(base_median[job] / truth - 1) > 0.05  # the faults cost this job more than 5%
    assert moved >= 2  # the check above is not vacuous: the faults did slow jobs down
    trace = json.loads((d / "w1" / "timeline.json").read_text())["traceEvents"]
    assert_named_integer_tracks(trace)
    assert len({e["pid"] for e in trace if e["ph"] == "X"}) == len(fixed)  # one process per job


def test_heal_switch_names_a_real_switch(replays, tmp_path):
    assert main(["whatif", str(replays["faulty"]), "--scenario", "heal-switch:no-such-switch", "--out", str(tmp_path / "o")]) == 2
    assert main(["whatif", str(replays["faulty"]), "--scenario", "ideal", "--out", str(tmp_path / "o")]) == 2


def test_network_whatif_reports_what_it_cannot_model_and_attributes(replays, tmp_path, capsys):
    """A pipeline-only job is named with why it is not modelled (never dropped); heal-switch without a topology
    warns; the attribution puts the injected slow server's stage first in its job."""
    out = tmp_path / "o"
    sw = replays["faults"].query("kind == 'slow_switch'")["subject"].iloc[0]
    assert main(["whatif", str(replays["faulty"]), "--scenario", f"heal-switch:{sw}", "--attribute", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    jobs = json.loads((replays["faulty"] / "summary.json").read_text())["jobs"]
    pp_only = [j["job_id"] for j in jobs if j["dp"] == 1]
    assert pp_only and set(pp_only) <= set(summary["skipped"]) and not set(pp_only) & set(summary["jobs"])
    assert all("no DP collective" in summary["skipped"][j] for j in pp_only)
    assert "without --topology" in err and any("without --topology" in w for w in summary["warnings"])
    # every job replay knows is either modelled or skipped with a reason
    assert set(summary["jobs"]) | set(summary["skipped"]) == {j["job_id"] for j in jobs}
    table = pd.read_csv(out / "attribution.csv")
    slow = replays["faults"].query("kind == 'slow_group'")["subject"].iloc[0]
    job = next(j["job_id"] for j in jobs if slow in j["servers"])
    t = table[table["job_id"] == job]
    # the slow server's pipeline carries the lag (its stage's rings wait for it as every stage's do)
    assert slow in t[t["level"] == "pipeline"].iloc[0]["key"].split("|")
    servers = t[t["level"] == "server"]
    assert servers.iloc[0]["slowdown"] > 1.05 and slow in set(servers[servers["slowdown"] == servers["slowdown"].max()]["key"])


def test_a_corrupt_replay_dir_names_what_it_skips(replays, tmp_path, capsys):
    """Wrong columns are an error naming the file; a job with a non-numeric or impossible time is skipped by
    name with the file and line, and the other jobs are modelled exactly as from the clean directory."""
    import shutil

    clean = tmp_path / "clean"
    assert main(["whatif", str(replays["twin"]), "--out", str(clean), "--quiet"]) == 0
    want = json.loads((clean / "summary.json").read_text())["jobs"]
    steps = pd.read_csv(replays["twin"] / "steps.csv")
    for name, change, match in [
        ("steps.csv", lambda d: d.drop(columns="end_ns"), "steps.csv: missing column(s) end_ns"),
        ("phases.csv", lambda d: d.rename(columns={"kind": "type"}), "phases.csv: missing column(s) kind"),
    ]:
        bad = tmp_path / f"cols-{name}"
        shutil.copytree(replays["twin"], bad)
        change(pd.read_csv(bad / name)).to_csv(bad / name, index=False)
        assert main(["whatif", str(bad), "--out", str(tmp_path / "o")]) == 2
        assert match in capsys.readouterr().err
    modelled = sorted(want)
    for k, (col, value) in enumerate([("start_ns", "12x"), ("end_ns", float("nan")), ("end_ns", 9e18)]):
        bad = tmp_path / f"rows-{k}"
        shutil.copytree(replays["twin"], bad)
        job = modelled[k % len(modelled)]
        s = steps.astype({col: object})
        row = int(np.flatnonzero(s["job_id"] == job)[2])
        s.loc[row, col] = value
        s.to_csv(bad / "steps.csv", index=False)
        assert main(["whatif", str(bad), "--out", str(tmp_path / f"o{k}"), "--quiet"]) == 0
        summary = json.loads((tmp_path / f"o{k}" / "summary.json").read_text())
        assert f"steps.csv line {row + 2}: {col}=" in summary["skipped"][job]
        assert f"job {job} not modelled" in capsys.readouterr().err
        assert job not in summary["jobs"] and set(summary["jobs"]) == set(want) - {job}
        for j in summary["jobs"]:
            for key in ("observed_step_s", "replayed_step_s", "predicted_step_s", "steps"):
                assert summary["jobs"][j][key] == want[j][key], (j, key)


# ------------------------------------- each scenario against the twin of its fault alone


def _replayed(cluster, d: Path) -> Path:
    cluster.write(d)
    assert main(["replay", str(d / "flows.parquet"), "--topology", str(d / "topology.csv"), "--out", str(d / "r"), "--quiet"]) == 0
    return d / "r"


@pytest.fixture(scope="module")
def one_fault_twins(tmp_path_factory):
    """The tiny cluster (a slow step, a slow server, a spine at 0.2x in the second half) and, for each of the
    slow server and the spine, its twin without that fault alone (same seed, same random draws)."""
    from synthetic import preset
    from synthetic.faults import DegradedSwitch, SlowServer

    d = tmp_path_factory.mktemp("one-fault")
    out = {}
    for tag, drop in (("faulty", None), ("no-switch", DegradedSwitch), ("no-straggler", SlowServer)):
        gen = preset("tiny", seed=0)
        gen.faults = [f for f in gen.faults if drop is None or not isinstance(f, drop)]
        c = gen.generate()
        if tag == "faulty":
            out["faults"], out["topology"], out["meta"] = c.faults, d / tag / "topology.csv", c.meta
        out[tag] = _replayed(c, d / tag)
    out["dir"] = d
    return out


def _mean_steps(out: Path) -> dict:
    s = pd.read_csv(out / "steps.csv")
    return s.groupby("job_id")[["observed_s", "replayed_s", "predicted_s"]].mean().to_dict("index")


def test_each_scenario_matches_the_twin_without_its_fault(one_fault_twins):
    """heal-switch against the twin without the slow spine, for every job; remove-stragglers against the twin
    without the slow server, for its job (each fault alone: the other faults stay in both)."""
    t, d = one_fault_twins, one_fault_twins["dir"]
    sw = t["faults"].query("kind == 'slow_switch'")["subject"].iloc[0]
    runs = {"heal": [f"heal-switch:{sw}"], "rs": ["remove-stragglers"], "none": []}
    for tag, sc in runs.items():
        args = [a for s in sc for a in ("--scenario", s)]
        assert main(["whatif", str(t["faulty"]), "--topology", str(t["topology"]), *args, "--out", str(d / f"w-{tag}"), "--quiet"]) == 0
    for twin in ("no-switch", "no-straggler"):
        assert main(["whatif", str(t[twin]), "--out", str(d / f"w-{twin}"), "--quiet"]) == 0
    heal, rs = _mean_steps(d / "w-heal"), _mean_steps(d / "w-rs")
    no_switch, no_straggler = _mean_steps(d / "w-no-switch"), _mean_steps(d / "w-no-straggler")
    assert set(heal) == set(no_switch) and len(heal) >= 3
    slowed = 0
    for job in heal:
        truth = no_switch[job]["observed_s"]
        assert abs(heal[job]["predicted_s"] / truth - 1) < 0.02, (job, heal[job], truth)
        slowed += heal[job]["observed_s"] / truth - 1 > 0.01
    assert slowed >= 1  # the spine slowed some job: the check is not vacuous
    # the straggler's job: found by its servers in the replay's jobs
    jobs = json.loads((t["faulty"] / "summary.json").read_text())["jobs"]
    slow_server = t["faults"].query("kind == 'slow_group'")["subject"].iloc[0]
    job = next(j["job_id"] for j in jobs if slow_server in j["servers"])
    truth = no_straggler[job]["observed_s"]
    assert rs[job]["observed_s"] / truth - 1 > 0.03  # the straggler costs its job
    assert abs(rs[job]["predicted_s"] / truth - 1) < 0.02, (rs[job], truth)
    # the other scenario leaves the other fault alone: heal-switch does not remove the straggler
    assert abs(heal[job]["predicted_s"] / no_switch[job]["observed_s"] - 1) < 0.02
    # the summary, the steps and the printed statistic are one: means over the modelled steps
    summary = json.loads((d / "w-rs" / "summary.json").read_text())["jobs"][job]
    assert summary["baseline_step_s"] == pytest.approx(rs[job]["replayed_s"], rel=1e-9)
    assert summary["predicted_step_s"] == pytest.approx(rs[job]["predicted_s"], rel=1e-9)
    assert summary["observed_step_s"] == pytest.approx(rs[job]["observed_s"], rel=1e-9)
    assert summary["predicted_speedup"] == pytest.approx(summary["baseline_step_s"] / summary["predicted_step_s"], rel=1e-9)


def test_attribution_names_the_straggler_server_and_the_rings_the_spine_slowed(one_fault_twins, tmp_path, capsys):
    t = one_fault_twins
    sw = t["faults"].query("kind == 'slow_switch'")["subject"].iloc[0]
    assert main(["whatif", str(t["faulty"]), "--topology", str(t["topology"]), "--attribute", "--scenario", f"heal-switch:{sw}",
                 "--out", str(tmp_path / "o")]) == 0
    printed = capsys.readouterr().out
    assert "mean step" in printed and "median" not in printed
    table = pd.read_csv(tmp_path / "o" / "attribution.csv")
    jobs = json.loads((t["faulty"] / "summary.json").read_text())["jobs"]
    slow_server = t["faults"].query("kind == 'slow_group'")["subject"].iloc[0]
    job = next(j["job_id"] for j in jobs if slow_server in j["servers"])
    servers = table[(table["job_id"] == job) & (table["level"] == "server")]
    assert servers.iloc[0]["key"] == slow_server and servers.iloc[0]["slowdown"] > servers.iloc[1]["slowdown"] + 0.01
    # the job the switch slowed most: its ring ranked first is one that crosses the switch
    summary = _jobs(tmp_path / "o")
    hit = max(summary, key=lambda j: summary[j]["predicted_speedup"])
    assert summary[hit]["predicted_speedup"] > 1.01
    top = table[(table["job_id"] == hit) & (table["level"] == "ring")].iloc[0]["key"]
    topo = pd.read_csv(t["topology"]).set_index("ip")
    assert sw.startswith("leaf")  # the tiny fabric's slowed switch: a ring crosses it where a member sits on it
    assert topo.loc[top.split("@", 1)[1], "leaf"] == sw, (top, sw)


@pytest.fixture(scope="module")
def every_ring_crosses(tmp_path_factory):
    """A pure-DP job whose every DP ring crosses spine-00, at 0.41x for the whole capture, and its twin."""
    from synthetic.fabric import Fabric
    from synthetic.faults import DegradedSwitch
    from synthetic.generator import ClusterGenerator
    from synthetic.workload import JobSpec

    d = tmp_path_factory.mktemp("all-cross")
    out = {}
    for tag, faults in (("faulty", True), ("twin", False)):
        fab = Fabric(servers=10, servers_per_group=1, spines=4)
        job = JobSpec("dp8", tp=8, pp=1, dp=8, microbatches=4, fwd_ms=20, grad_bytes=256 << 20, bucket_bytes=64 << 20)
        c = ClusterGenerator(fab, [job], duration_s=5.0, faults=[DegradedSwitch("spine-00", 0.0, 1.0, 0.41)], seed=0,
                             with_faults=faults, storage_flows_per_s=20).generate()
        if faults:
            # the premise: every rail's ring has an edge through spine-00
            f = c.flows
            gpu = f["src"].astype(str).isin(c.topology["ip"]) & f["dst"].astype(str).isin(c.topology["ip"])
            through = f[gpu & f["switches"].astype(str).str.contains("spine-00")]
            rails = through["src"].astype(str).map(c.topology.set_index("ip")["rail"]).nunique()
            assert rails == 8
        out[tag] = _replayed(c, d / tag)
    out["topology"], out["dir"] = d / "faulty" / "topology.csv", d
    return out


def _healed_against_twin(t: dict, scenario: str) -> dict:
    """The one job's what-if summary under ``scenario`` on the faulty replay, checked against its fault-free twin:
    the fault costs the job over 3%, the prediction lands within 2% of the twin's observed step."""
    d = t["dir"]
    assert main(["whatif", str(t["faulty"]), "--topology", str(t["topology"]), "--scenario", scenario,
                 "--out", str(d / "w"), "--quiet"]) == 0
    assert main(["whatif", str(t["twin"]), "--out", str(d / "wt"), "--quiet"]) == 0
    pred, twin = _jobs(d / "w"), _jobs(d / "wt")
    assert set(pred) == set(twin) and len(pred) == 1
    job = next(iter(pred))
    truth = twin[job]["observed_step_s"]
    assert pred[job]["observed_step_s"] / truth - 1 > 0.03  # the fault costs the job
    assert abs(pred[job]["predicted_step_s"] / truth - 1) < 0.02, (pred[job], truth)
    return pred[job]


def test_heal_switch_when_every_ring_crosses_it(every_ring_crosses):
    healed = _healed_against_twin(every_ring_crosses, "heal-switch:spine-00")
    assert healed["scenario_notes"]["heal-switch:spine-00"]["crossing_rings"] == 8


def _one_link_twins(d: Path):
    """A pure-DP job (TP 8 x DP 16) over four leaf groups whose ring edges leave each leaf on one uplink, and the
    fault-free twin (same seed): the faulty one with the uplink most DP transfers take at 0.2x in the second half.
    That leaf's other links stay healthy, so the replay names the link, not the leaf."""
    from synthetic.fabric import Fabric
    from synthetic.faults import DegradedLink
    from synthetic.generator import ClusterGenerator
    from synthetic.workload import JobSpec

    def gen(faults):
        job = JobSpec("dp16", tp=8, pp=1, dp=16, microbatches=4, fwd_ms=20, grad_bytes=256 << 20, bucket_bytes=64 << 20)
        return ClusterGenerator(Fabric(servers=16, servers_per_group=4, spines=4), [job], duration_s=4.0, faults=faults, seed=0,
                                with_faults=bool(faults), storage_flows_per_s=20).generate()

    twin = gen([])
    f = twin.flows
    gpus = set(twin.topology["ip"].astype(str))
    dp = f[f["src"].astype(str).isin(gpus) & f["dst"].astype(str).isin(gpus) & f["switches"].astype(str).str.contains("spine")]
    link = dp["switches"].astype(str).str.split("|").map(lambda h: f"{h[0]}>{h[1]}").value_counts().index[0]
    out = {"link": link, "twin": _replayed(twin, d / "twin"), "dir": d}
    faulty = gen([DegradedLink(link, 0.5, 1.0, 0.2)])
    assert faulty.faults.query("kind == 'slow_link'")["subject"].tolist() == [link]
    out["faulty"], out["topology"] = _replayed(faulty, d / "faulty"), d / "faulty" / "topology.csv"
    return out


def test_heal_link_matches_the_twin_without_the_slow_link(tmp_path):
    t = _one_link_twins(tmp_path)
    link, d = t["link"], t["dir"]
    sw = pd.read_csv(t["faulty"] / "switches.csv")
    assert (sw.query("kind == 'link' and name == @link")["ratio"] < 0.7).all()  # the premise: the link is seen slow
    healed = _healed_against_twin(t, f"heal-link:{link}")
    notes = healed["scenario_notes"][f"heal-link:{link}"]
    assert notes["crossing_rings"] == 1 and notes["healed"] >= 1 and notes["reference"] == "rings not crossing it"
    # a healthy link of the same leaf, the other way: nothing to heal, the step stays the replay's
    down = sw.query("kind == 'link' and tier == 'spine>leaf' and ratio > 0.9")
    down = down[down["name"].str.endswith(">" + link.split(">")[0])]["name"].iloc[0]
    assert main(["whatif", str(t["faulty"]), "--topology", str(t["topology"]), "--scenario", f"heal-link:{down}",
                 "--out", str(d / "w2"), "--quiet"]) == 0
    same = next(iter(_jobs(d / "w2").values()))
    assert same["predicted_step_s"] == pytest.approx(same["baseline_step_s"], rel=1e-3)


# ------------------------------------- jobs contending for a shared switch


@pytest.fixture(scope="module")
def two_jobs_contending(tmp_path_factory):
    """Two pure-DP jobs whose rings cross spine-00 and their fault-free twin (same seed). In the faulty clusters
    spine-00 is shared (SYNTHETIC: its capacity split equally between the jobs crossing it) from the middle of the
    capture: ``faulty`` at the capacity of one job at full speed (each job at half speed), ``faulty-0.6`` at 0.6
    of it (each at 0.3), and ``moved-JOB-0.6`` the same with JOB routed around it (the other at 0.6)."""
    from synthetic.presets import shared_spine

    d = tmp_path_factory.mktemp("contend")
    out: dict = {"dir": d, "steps": {}}
    runs = {"twin": shared_spine(with_faults=False), "faulty": shared_spine(1.0), "faulty-0.6": shared_spine(0.6),
            "moved-dp-a-0.6": shared_spine(0.6, ("dp-a",)), "moved-dp-b-0.6": shared_spine(0.6, ("dp-b",))}
    for tag, gen in runs.items():
        c = gen.generate()
        # the premise: a job shares the spine with the other unless moved off it
        want = {"twin": [], "faulty": [0.5], "faulty-0.6": [0.3]}.get(tag, [0.6])
        assert c.faults.query("kind == 'slow_switch'")["factor"].tolist() == pytest.approx(want)
        out[tag] = _replayed(c, d / tag)
        assert main(["whatif", str(out[tag]), "--out", str(d / f"w-{tag}"), "--quiet"]) == 0
        # the replay names jobs by their GPUs: back to the generator's names through their servers
        name = {tuple(v["servers"]): k for k, v in c.meta["jobs"].items()}
        ids = {j["job_id"]: name[tuple(j["servers"])] for j in json.loads((out[tag] / "summary.json").read_text())["jobs"]}
        out["steps"][tag] = {ids[j]: v["observed_step_s"] for j, v in _jobs(d / f"w-{tag}").items()}
        out["ids"] = {v: k for k, v in ids.items()}
    out["topology"] = d / "faulty" / "topology.csv"
    return out


def _contended(t: dict, faulty: str, scenario: str, truth: str) -> dict:
    """Both jobs' what-if summaries (by the generator's names) under ``scenario`` on the ``faulty`` replay, each
    checked against the observed step in ``truth``: the shared spine costs each job over 3%, the prediction lands
    within 2% of the truth."""
    out = t["dir"] / scenario.replace(":", "-").replace("@", "-")
    assert main(["whatif", str(t[faulty]), "--topology", str(t["topology"]), "--scenario", scenario, "--out", str(out), "--quiet"]) == 0
    pred = {name: _jobs(out)[job] for name, job in t["ids"].items()}
    assert len(pred) == 2
    for job, step in t["steps"][truth].items():
        assert pred[job]["observed_step_s"] / step - 1 > 0.03, (job, pred[job], step)
        assert abs(pred[job]["predicted_step_s"] / step - 1) < 0.02, (scenario, job, pred[job], step)
    return pred


def test_heal_switch_predicts_every_job_sharing_it(two_jobs_contending):
    for faulty in ("faulty", "faulty-0.6"):
        _contended(two_jobs_contending, faulty, "heal-switch:spine-00", "twin")


@pytest.mark.parametrize("moved", ["dp-a", "dp-b"])
def test_moving_a_job_off_a_shared_switch_gives_the_other_its_share(two_jobs_contending, moved):
    """The spine carries one job at full speed: moved off it, a job runs healthy, and the other gets the whole
    spine, so both reach their fault-free steps. Without contention the job left on the spine would keep its
    slowed step (over 3% above the twin)."""
    t = two_jobs_contending
    scenario = f"move-job:{t['ids'][moved]}@spine-00"
    pred = _contended(t, "faulty", scenario, "twin")
    for job, p in pred.items():
        n = p["scenario_notes"][scenario]
        assert n["shares"][t["ids"][job]] == pytest.approx(0.5, abs=0.05) and n["capacity"] == pytest.approx(1.0, abs=0.1)
        assert n["gain"] == "healed" if job == moved else n["gain"] == pytest.approx(2.0, rel=0.1)
    assert main(["whatif", str(t["faulty"]), "--scenario", "move-job:no-such-job@spine-00", "--out", str(t["dir"] / "x")]) == 2


@pytest.mark.parametrize("moved", ["dp-a", "dp-b"])
def test_the_job_left_on_a_shared_switch_gets_the_share_the_moved_one_leaves(two_jobs_contending, moved):
    """The spine carries 0.6 of one job: each ran at 0.3, the job left on it runs at 0.6 once the other is moved
    off (the generator routes the moved job around it). Predicted within 2% of that for both; the job left is off
    by more if it keeps its step (contention ignored) or is healed (its share taken for the switch's)."""
    t = two_jobs_contending
    scenario = f"move-job:{t['ids'][moved]}@spine-00"
    pred = _contended(t, "faulty-0.6", scenario, f"moved-{moved}-0.6")
    left = next(j for j in pred if j != moved)
    truth = t["steps"][f"moved-{moved}-0.6"][left]
    assert truth / t["steps"]["twin"][left] - 1 > 0.03  # still slowed, but less: neither the observed nor the healed step


# ------------------------------------- scale-dp: the same job generated with another DP size


@pytest.fixture(scope="module")
def dp_sizes(tmp_path_factory):
    """A pure-DP job (TP 8, 2 micro-batches of 5 ms, 512 MiB of gradients a GPU: its all-reduce about a third of
    the step) generated at DP 4 and at DP 8, same seed, on 8 servers in two leaf groups of 4: at DP 4 each ring
    sits on one rail leaf, at DP 8 it spans both groups and crosses the spines."""
    from synthetic.fabric import Fabric
    from synthetic.generator import ClusterGenerator
    from synthetic.workload import JobSpec

    d = tmp_path_factory.mktemp("dp-sizes")
    out: dict = {"dir": d}
    for dp in (4, 8):
        job = JobSpec("dp", tp=8, pp=1, dp=dp, microbatches=2, fwd_ms=5, grad_bytes=512 << 20, bucket_bytes=128 << 20)
        c = ClusterGenerator(Fabric(servers=8, servers_per_group=4, spines=4), [job], duration_s=3.0, seed=0,
                             storage_flows_per_s=20).generate()
        out[dp] = _replayed(c, d / f"dp{dp}")
        out[f"topology{dp}"] = d / f"dp{dp}" / "topology.csv"
        assert main(["whatif", str(out[dp]), "--out", str(d / f"w{dp}"), "--quiet"]) == 0
        out[f"step{dp}"] = next(iter(_jobs(d / f"w{dp}").values()))["observed_step_s"]
    return out


@pytest.mark.parametrize("observed,n", [(4, 8), (8, 4)])
def test_scale_dp_matches_the_job_generated_with_that_dp(dp_sizes, observed, n):
    """scale-dp:N on the replay of the DP-D job lands within 2% of the DP-N job's observed step, both ways (the
    unchanged step is off by over 3%); scale-dp:<D> gives the baseline back."""
    t, d = dp_sizes, dp_sizes["dir"]
    topo = str(t[f"topology{observed}"])
    for k in (n, observed):
        assert main(["whatif", str(t[observed]), "--topology", topo, "--scenario", f"scale-dp:{k}", "--out",
                     str(d / f"s{observed}-{k}"), "--quiet"]) == 0
    pred = next(iter(_jobs(d / f"s{observed}-{n}").values()))
    same = next(iter(_jobs(d / f"s{observed}-{observed}").values()))
    truth = t[f"step{n}"]
    assert abs(pred["baseline_step_s"] / truth - 1) > 0.03  # DP moves the step: the check is not vacuous
    assert abs(pred["predicted_step_s"] / truth - 1) < 0.02, (pred, truth)
    assert same["predicted_step_s"] == pytest.approx(same["baseline_step_s"], rel=0.01)
    notes = pred["scenario_notes"][f"scale-dp:{n}"]
    assert (notes["observed_dp"], notes["dp"]) == (observed, n)
    # growing, each DP-4 ring leaves its leaf for the spines; the capture saw no GPU traffic on a spine, so the
    # rings keep their own rate (the generator's spines run at the leaves' speed: the truth agrees)
    assert notes["rings_onto_spines"] == (8 if n > observed else 0)


def test_scale_dp_needs_the_dp_size(dp_sizes, tmp_path, capsys):
    """Without the replay's summary.json, the DP size comes from the rings in pairs.csv (a warning: the replay did not
    say it is exact); without either, exit 2 naming the job."""
    import shutil

    r = tmp_path / "r"
    shutil.copytree(dp_sizes[4], r)
    (r / "summary.json").unlink()
    assert main(["whatif", str(r), "--scenario", "scale-dp:8", "--out", str(tmp_path / "o")]) == 0
    assert "DP 4 is a lower bound" in capsys.readouterr().err
    (r / "pairs.csv").unlink()
    assert main(["whatif", str(r), "--scenario", "scale-dp:8", "--out", str(tmp_path / "o2")]) == 2
    assert "its DP size is unknown" in capsys.readouterr().err


def test_scale_dp_caps_a_ring_growing_onto_slower_spines():
    """A ring on one leaf that outgrows it crosses the spines: its rate per DP pair is capped by the spine tier's
    median where that is clearly lower; no cap when the spines are as fast, nor without a topology."""
    from prism.whatif.netreplay import ReplayGraph

    steps, phases = _replay_tables(4, np.full(4, 1.0), rings=2)  # 1 MiB in 0.1 s a ring, one DP pair each
    g = ReplayGraph("j", steps, phases)
    topo = pd.DataFrame({"ip": [f"10.0.{s}.{r}" for s in (0, 1) for r in (0, 1)], "server": [f"srv000{s}" for s in (0, 0, 1, 1)],
                         "rail": [0, 1, 0, 1], "leaf": ["leaf-g00-r0", "leaf-g00-r1"] * 2})
    pairs = pd.DataFrame({"job_id": "j", "src": ["10.0.0.0", "10.0.0.1"], "dst": ["10.0.1.0", "10.0.1.1"], "type": "DP"})
    rate = (1 << 20) / 0.1 / 1e9  # GB/s per pair
    shapes = {"j": {"dp": 2, "dp_exact": True}}
    assert g.dp_size(shapes, pairs) == (2, True) and g.dp_size({}, pairs) == (2, False)
    for spine, want in ((rate / 2, 1.5 * 2), (rate, 1.5)):
        sw = pd.DataFrame({"kind": "switch", "name": ["spine-00"], "tier": "spine", "tier_median_gbps": [spine]})
        coll, info = g.scale_dp(4, 2, g.coll, sw, topo, pairs)
        assert coll == pytest.approx(g.coll * want) and info["rings_onto_spines"] == 2
    assert g.scale_dp(4, 2, g.coll, sw, None, pairs)[0] == pytest.approx(g.coll * 1.5)
    assert g.scale_dp(2, 2, g.coll, sw, topo, pairs)[0] == pytest.approx(g.coll)


def _replay_tables(n_steps: int, work: np.ndarray, rings: int = 2):
    """steps.csv and phases.csv of a pure-DP job: per step, each ring's work (s) then a 0.1 s collective."""
    start = np.r_[0, np.cumsum(work + 0.1)[:-1]] * 1e9
    steps = pd.DataFrame({"job_id": "j", "step": np.arange(n_steps), "start_ns": start.astype(np.int64),
                          "end_ns": (start + (work + 0.1) * 1e9).astype(np.int64)})
    phases = pd.concat([pd.DataFrame({
        "job_id": "j", "step": np.arange(n_steps), "group": f"dp@10.0.0.{r}", "kind": "dp_collective", "start_ns": steps["start_ns"],
        "arrival_ns": (start + work * 1e9).astype(np.int64), "end_ns": steps["end_ns"], "bytes": 1 << 20,
        "servers": "srv0000|srv0001"}) for r in range(rings)], ignore_index=True)
    return steps, phases


def test_remove_stragglers_without_peers_keeps_what_else_slows_the_job():
    """No pipeline to compare with (pure DP, or a clip all-reduce ending every pipeline together): the straggler's
    cost is the jump in the work where it begins. A second slowdown later in its steps (a switch) stays."""
    from prism.whatif.netreplay import ReplayGraph

    n = 40
    healthy = 1.0 + 0.1 * (np.arange(n) >= 25)  # something else slows every step from step 25, straggler or not
    straggler = 0.3 * (np.arange(n) >= 10)
    steps, phases = _replay_tables(n, healthy + straggler)
    anomalies = pd.DataFrame([{"kind": "slow_group", "job_id": "j", "step": 10, "subject": "srv0001", "score": 1.3,
                               "explanation": "srv0001: computes 1.30x its peers' time, steps 10-39 (30 steps)"}])
    g = ReplayGraph("j", steps, phases)
    work = g.remove_stragglers(anomalies, g.work).reshape(n, 2)
    assert work[:, 0] == pytest.approx(healthy, abs=1e-6) and work[:, 1] == pytest.approx(healthy, abs=1e-6)
    # the anomaly ends before the capture does: the jump is measured on both sides
    straggler = 0.3 * ((np.arange(n) >= 10) & (np.arange(n) < 20))
    steps, phases = _replay_tables(n, healthy + straggler)
    anomalies.loc[0, "explanation"] = "srv0001: computes 1.30x its peers' time, steps 10-19 (10 steps)"
    g = ReplayGraph("j", steps, phases)
    assert g.remove_stragglers(anomalies, g.work).reshape(n, 2)[:, 0] == pytest.approx(healthy, abs=1e-6)
    # no healthy step at all: the anomaly's ratio
    steps, phases = _replay_tables(n, np.full(n, 1.3))
    anomalies.loc[0, "explanation"] = "srv0001: computes 1.30x its peers' time, steps 0-39 (40 steps)"
    g = ReplayGraph("j", steps, phases)
    assert g.remove_stragglers(anomalies, g.work) == pytest.approx(np.full(2 * n, 1.0), abs=1e-6)


# ------------------------------------------------------- Kineto (PyTorch profiler) traces

KINETO = shared_data_dir() / "kineto"
needs_kineto = pytest.mark.skipif(not (KINETO / "param" / "dlrm_kineto.tar.gz").is_file(),
                                  reason=f"{KINETO} not present (PRISM_SHARED_DATA names the real-data directory)")


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory) -> Path:
    """The 8 ranks of PARAM's DLRM Kineto traces, extracted (the archive is left as it is)."""
    import tarfile

    if not (KINETO / "param" / "dlrm_kineto.tar.gz").is_file():
        pytest.skip(f"{KINETO} not present (PRISM_SHARED_DATA names the real-data directory)")
    d = tmp_path_factory.mktemp("kineto")
    with tarfile.open(KINETO / "param" / "dlrm_kineto.tar.gz") as t:
        t.extractall(d, filter="data")
    return d / "dlrm_kineto"


def _kineto_rank(rank: int, world: int, compute_us: float, slowest_us: float = 100.0, ts0: float = 1000.0) -> dict:
    """A hand-made trace of one rank: a compute kernel on stream 7, then an NCCL all-reduce on stream 20 that waits for
    it (cudaStreamWaitEvent) and for every rank, the host waiting for it (cudaStreamSynchronize). Every kernel starts
    5 us after its launch returns; the all-reduce moves its data in 50 us once the last rank arrived."""
    arrive = ts0 + 20 + slowest_us  # the last rank's arrival: the slowest rank's compute end
    k_end = ts0 + 20 + compute_us
    ar_end = arrive + 50
    sync_end = ar_end + 5

    def call(name, ts, dur, corr):
        return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 100, "tid": 101, "ts": ts, "dur": dur,
                "args": {"correlation": corr}}

    def kernel(name, ts, end, stream, corr):
        return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": end - ts,
                "args": {"stream": stream, "correlation": corr, "device": rank}}

    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 100, "tid": 100, "ts": ts0, "dur": sync_end + 10 - ts0},
        call("cudaLaunchKernel", ts0 + 10, 5, 1),
        kernel("volta_sgemm_128x64_nn", ts0 + 20, k_end, 7, 1),
        call("cudaStreamWaitEvent", ts0 + 16, 1, 2),
        call("cudaLaunchKernel", ts0 + 20, 5, 3),
        kernel("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", max(ts0 + 30, k_end), ar_end, 20, 3),
        call("cudaStreamSynchronize", ts0 + 30, sync_end - ts0 - 30, 4),
    ]
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world}, "traceEvents": ev}


def _write_kineto(d: Path, computes: list[float]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    for r, c in enumerate(computes):
        (d / f"rank{r}.json").write_text(json.dumps(_kineto_rank(r, len(computes), c, max(computes))))
    return d


def test_kineto_a_straggling_rank_ends_the_collective_and_removing_it_shortens_the_step(tmp_path):
    from prism.whatif.kineto import KinetoGraph, read_kineto
    from prism.whatif.scenarios import apply_kineto_scenarios

    d = _write_kineto(tmp_path / "k", [100.0, 400.0])  # rank 1 computes 300 us longer
    g = KinetoGraph(read_kineto([d]))
    assert len(g.collectives) == 2 and g.collectives["instance"].nunique() == 1  # one all-reduce, both ranks in it
    assert g.launch_latency_us == {0: 5.0, 1: 5.0}
    r = simulate(g.graph())
    coll = g.node[g.collectives["item"].to_numpy()]
    assert len(set(coll)) == 1  # one node
    # it starts at the straggler's arrival (its compute end, 1420 us, less the first step start 1000) and takes 50 us
    assert r.start[coll[0]] * 1e6 == pytest.approx(420.0) and r.finish[coll[0]] * 1e6 == pytest.approx(470.0)
    obs, rep = g.observed_steps(), g.simulated_steps(r)
    assert rep["job_step_s"].iloc[0] == pytest.approx(obs["job_step_s"].iloc[0]) == pytest.approx(485e-6)
    pred = g.simulated_steps(simulate(g.graph(apply_kineto_scenarios(g, [parse_scenario("remove-stragglers")]))))
    assert (obs["job_step_s"].iloc[0] - pred["job_step_s"].iloc[0]) * 1e6 == pytest.approx(300.0)  # the straggler's excess
    # the command: exit 0, the same figures
    rc = main(["whatif", "--kineto", str(d), "--scenario", "remove-stragglers", "--out", str(tmp_path / "o"), "--quiet"])
    assert rc == 0
    job = json.loads((tmp_path / "o" / "summary.json").read_text())["jobs"]["k"]
    assert job["replay_error_max_pct"] < 1e-6 and job["collectives"] == {"world/AllReduce": 1}
    assert job["predicted_step_s"] == pytest.approx(185e-6) and job["predicted_speedup"] == pytest.approx(485 / 185)
    trace = json.loads((tmp_path / "o" / "timeline.json").read_text())["traceEvents"]
    assert_named_integer_tracks(trace)


def test_kineto_scale_scenarios_move_the_step_the_known_amount(tmp_path):
    from prism.whatif.kineto import KinetoGraph, read_kineto
    from prism.whatif.scenarios import apply_kineto_scenarios

    g = KinetoGraph(read_kineto([_write_kineto(tmp_path / "k", [100.0, 400.0])]))

    def step(sc):
        return g.simulated_steps(simulate(g.graph(apply_kineto_scenarios(g, [parse_scenario(sc)]))))["job_step_s"].iloc[0] * 1e6

    assert step("scale-comm:2") == pytest.approx(485 + 50)  # the transfer, not the 350 us rank 0 waited
    assert step("scale-compute:0.5") == pytest.approx(485 - 200)  # the straggler's 400 us compute halved
    with pytest.raises(ValueError, match="not available for Kineto"):
        apply_kineto_scenarios(g, [parse_scenario("scale-dp:4")])


@pytest.mark.parametrize("case, match", [
    ("not kineto", "not a PyTorch profiler (Kineto) trace"),
    ("not json", "cannot read it as JSON"),
    ("missing rank", "missing rank(s) 2 of world size 3"),
    ("mismatched", "NCCL AllReduce kernel(s) on communicator world"),
    ("no steps", "no ProfilerStep#N"),
    ("duplicate rank", "rank 0 again"),
])
def test_kineto_bad_input_is_a_clear_error_naming_the_file(tmp_path, capsys, case, match):
    d = _write_kineto(tmp_path / "k", [100.0, 120.0])
    bad = d / "rank1.json"
    if case == "not kineto":
        bad.write_text(json.dumps({"jobs": []}))
    elif case == "not json":
        bad.write_text("{not json")
    elif case == "missing rank":
        for r in (0, 1):
            t = _kineto_rank(r, 3, 100.0, 120.0)
            (d / f"rank{r}.json").write_text(json.dumps(t))
        bad = d / "rank0.json"
    elif case == "mismatched":
        t = _kineto_rank(1, 2, 120.0, 120.0)
        t["traceEvents"] = [e for e in t["traceEvents"] if not e["name"].startswith("nccl")]
        bad.write_text(json.dumps(t))
    elif case == "duplicate rank":
        bad.write_text(json.dumps(_kineto_rank(0, 2, 120.0, 120.0)))
    elif case == "no steps":
        t = _kineto_rank(1, 2, 120.0, 120.0)
        t["traceEvents"] = [e for e in t["traceEvents"] if not e["name"].startswith("ProfilerStep")]
        bad.write_text(json.dumps(t))
    assert main(["whatif", "--kineto", str(d), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert match in err and str(bad) in err
    assert not (tmp_path / "o" / "summary.json").exists()


@needs_kineto
def test_kineto_replay_of_the_real_dlrm_job(dlrm, tmp_path):
    from prism.whatif.kineto import KinetoGraph, read_kineto

    ranks = read_kineto([dlrm])
    assert [r.rank for r in ranks] == list(range(8))
    g = KinetoGraph(ranks)
    # every rank's NCCL kernels matched: per communicator and kind, the same count on every rank
    c = g.collectives.groupby(["comm", "kind", "rank"]).size().unstack("rank")
    assert (c.nunique(axis=1) == 1).all() and c.to_dict("index") == {("world", "AllReduce"): dict.fromkeys(range(8), 3),
                                                                     ("world", "SendRecv"): dict.fromkeys(range(8), 5)}
    assert g.clock_spread_us < 5  # one host: the members of a collective end together
    r = simulate(g.graph())
    obs, rep = g.observed_steps(), g.simulated_steps(r)
    job_err = abs(rep["job_step_s"].iloc[0] / obs["job_step_s"].iloc[0] - 1)
    rank_err = (rep["step_s"] / obs["step_s"] - 1).abs()
    # measured 0.11% (job) and 0.25% (worst rank): the graph misses only small launch latencies; Lumos reports 3.3%
    assert job_err < 0.005 and rank_err.max() < 0.005
    # each collective ends at its last member's arrival plus its transfer: measured up to 36 us early (the launch
    # latencies the arrivals lose on the way), never late
    end = r.finish[g.node[g.collectives["item"].to_numpy()]] * 1e6
    measured = g.items["end"].to_numpy()[g.collectives["item"].to_numpy()]
    assert (end - measured).min() > -50 and (end - measured).max() < 1
    rc = main(["whatif", "--kineto", *map(str, sorted(dlrm.iterdir())), "--scenario", "scale-comm:2", "--out", str(tmp_path / "o"), "--quiet"])
    assert rc == 0
    job = json.loads((tmp_path / "o" / "summary.json").read_text())["jobs"]["dlrm_kineto"]
    assert job["ranks"] == 8 and job["steps"] == 1 and job["replay_error_max_pct"] < 0.5
    assert job["predicted_step_s"] >= job["baseline_step_s"]


@pytest.mark.skipif(not (KINETO / "hta" / "trace_filter").is_dir(), reason=f"{KINETO} not present (PRISM_SHARED_DATA names the real-data directory)")
def test_kineto_a_sample_of_ranks_is_refused_unless_partial(tmp_path, capsys):
    pair = KINETO / "hta" / "trace_filter"  # ranks 0 and 1 of a 128-rank job
    assert main(["whatif", "--kineto", str(pair), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "missing rank(s) 2, 3" in err and "world size 128" in err and "sampled_rank-0.json.gz" in err
    assert main(["whatif", "--kineto", str(pair), "--partial", "--out", str(tmp_path / "o"), "--quiet"]) == 0
    job = json.loads((tmp_path / "o" / "summary.json").read_text())["jobs"]["trace_filter"]
    assert job["ranks"] == 2 and job["steps"] == 2 and job["collectives"] == {"world/SendRecv": 10}
    assert any("2 of 128 ranks" in w for w in job["warnings"])
    assert job["replay_error_max_pct"] < 0.1  # measured 0.004%
