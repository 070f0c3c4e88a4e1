"""Graph manipulation on op traces (``scale-pp:N``, ``layers:L``): against real traces, a SYNTHETIC twin and the 1F1B
bubble formula."""
from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prism.cli import main
from prism.whatif.graph import simulate
from prism.whatif.optrace import OpGraph, read_op_trace
from prism.whatif.repartition import bubble_fraction, fit_layer_models, layer_factors, observed_partition, repartition
from synthetic.fromtrace import shared_data_dir
from synthetic.pipeline import PipelineJob

SA = shared_data_dir() / "straggler-analysis"
needs_sa = pytest.mark.skipif(not SA.is_dir(), reason=f"{SA} not present (PRISM_SHARED_DATA names the real-data directory)")


def _predict(g: OpGraph, meta: dict, stages: int | None = None, layers: int | None = None, microbatches: int | None = None):
    """(per-step predicted seconds, the graph simulated, its result), as ``prism whatif`` runs a scenario."""
    old = observed_partition(g.ops, meta)
    models = fit_layer_models(g, old)
    if stages is None:
        new = old.scaled(layers, "layers") if layers else old
        work = g.work() * layer_factors(g.ops, models, old, new)
        r = simulate(g.graph(work, launch_delay=False))
        return g.step_seconds(r), g, r
    gp = OpGraph(repartition(g, old, old.even(stages, layers, f"scale-pp:{stages}"), microbatches, models))
    r = simulate(gp.graph(gp.work(), launch_delay=False))
    return gp.step_seconds(r), gp, r


def _baseline(g: OpGraph):
    return g.step_seconds(simulate(g.graph(g.work(), launch_delay=False)))


# ------------------------------------------------------------------ SYNTHETIC ground truth


@pytest.mark.parametrize("stages, microbatches", [(2, 1), (2, 4), (4, 4), (4, 8), (3, 16)])
@pytest.mark.parametrize("new_stages", [1, 2, 3, 4, 6, 8, 12])
def test_rebuilt_1f1b_bubble_is_the_formula_for_uniform_stages(stages, microbatches, new_stages):
    """Uniform stages, no communication cost: a rebuilt 1F1B step is (M + N - 1) (f + b) and its bubble fraction
    (N - 1) / (M + N - 1), whatever pipeline depth the trace was taken at."""
    job = PipelineJob(stages=stages, microbatches=microbatches, layers=24, p2p=0.0, ag=0.0, rs=0.0, opt=0.0, emb=0.0, steps=1)
    g = OpGraph(job.trace())
    steps, gp, r = _predict(g, {"num_layers": 24, "pp_size": stages}, stages=new_stages)
    per_stage = (job.fwd + job.bwd) * 24 / new_stages
    assert steps.iloc[0] == pytest.approx((microbatches + new_stages - 1) * per_stage, rel=1e-9)
    assert bubble_fraction(gp, r) == pytest.approx((new_stages - 1) / (microbatches + new_stages - 1), abs=1e-9)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stages=st.integers(2, 5), new_stages=st.integers(1, 10), microbatches=st.integers(1, 12), dp=st.integers(1, 3),
       fwd=st.floats(0.001, 0.1), bwd=st.floats(0.001, 0.2))
def test_bubble_property_for_any_uniform_pipeline(stages, new_stages, microbatches, dp, fwd, bwd):
    """The same property for random depths, micro-batches, DP and costs, with the layers unknown (continuous shares:
    any N)."""
    job = PipelineJob(stages=stages, dp=dp, microbatches=microbatches, layers=stages, fwd=fwd, bwd=bwd, p2p=0.0, ag=0.0,
                      rs=0.0, opt=0.0, emb=0.0, steps=1)
    g = OpGraph(job.trace())
    steps, gp, r = _predict(g, {"pp_size": stages}, stages=new_stages)
    per_stage = (fwd + bwd) * stages / new_stages
    assert steps.iloc[0] == pytest.approx((microbatches + new_stages - 1) * per_stage, rel=1e-9)
    assert bubble_fraction(gp, r) == pytest.approx((new_stages - 1) / (microbatches + new_stages - 1), abs=1e-9)


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("new_stages, layers", [(1, None), (2, None), (3, None), (4, None), (8, None), (12, None),
                                                 (4, 48), (6, 12), (2, 36)])
def test_scale_pp_and_layers_match_the_job_generated_that_way(stages, new_stages, layers):
    """A SYNTHETIC job (last stage with the loss, DP collectives and optimizer by layers, p2p transfers, jitter)
    re-partitioned to N stages (and L layers) against the same job generated at N stages with L layers: the exact
    truth, as the costs follow the layer model the scenario fits."""
    kw = dict(dp=2, microbatches=4, fwd_last=0.015, bwd_last=0.02, steps=2)
    job = PipelineJob(stages=stages, layers=24, **kw)
    g = OpGraph(job.trace())
    pred, _, _ = _predict(g, {"num_layers": 24, "pp_size": stages}, stages=new_stages, layers=layers)
    truth = _baseline(OpGraph(PipelineJob(stages=new_stages, layers=layers or 24, **kw).trace()))
    assert np.allclose(pred.to_numpy(), truth.to_numpy(), rtol=1e-9)


def test_the_layer_model_recovers_the_costs_of_an_uneven_partition():
    """Observed stages with 4, 8, 8, 4 layers (``layers_per_stage``): the fit gives back the per-layer and last-stage
    costs exactly, and ``layers:L`` scales every stage in proportion."""
    job = PipelineJob(stages=4, layers=24, layers_per_stage=(4, 8, 8, 4), fwd_last=0.03, bwd_last=0.05)
    g = OpGraph(job.trace())
    meta = {"num_layers": 24, "layers_per_stage": [4, 8, 8, 4], "pp_size": 4}
    models = fit_layer_models(g, observed_partition(g.ops, meta))
    assert models["forward-compute"].per_layer == pytest.approx(job.fwd)
    assert models["forward-compute"].last == pytest.approx(job.fwd_last)
    assert models["backward-compute"].last == pytest.approx(job.bwd_last)
    assert models["grads-reduce-scatter"].per_layer == pytest.approx(job.rs)
    assert all(m.fit_error < 1e-9 for m in models.values())
    pred, _, _ = _predict(g, meta, layers=48)
    truth = _baseline(OpGraph(PipelineJob(stages=4, layers=48, layers_per_stage=(8, 16, 16, 8), fwd_last=0.03,
                                          bwd_last=0.05).trace()))
    assert np.allclose(pred.to_numpy(), truth.to_numpy(), rtol=1e-9)
    # re-partitioned evenly: the job generated with 12 layers a stage
    pred, _, _ = _predict(g, meta, stages=2)
    truth = _baseline(OpGraph(PipelineJob(stages=2, layers=24, fwd_last=0.03, bwd_last=0.05).trace()))
    assert np.allclose(pred.to_numpy(), truth.to_numpy(), rtol=1e-9)
    with pytest.raises(ValueError, match="layers:28: 28 layers do not split"):
        observed_partition(g.ops, meta).scaled(28, "layers:28")


# ------------------------------------------------------------------ real traces


@needs_sa
@pytest.mark.parametrize("trial", ["ST", "SE"])
def test_scale_pp_and_layers_at_the_observed_values_reproduce_the_replay(trial):
    """scale-pp:<observed P> rebuilds the observed step (every op's work from its own observation, the schedule as
    1F1B): its prediction is the baseline (the same replay without launch delays) within 1% in every step; so is
    layers:<observed>."""
    ops = read_op_trace(SA / f"trace-{trial}.parquet")
    meta = yaml.safe_load((SA / f"meta-{trial}.yaml").read_text())
    g = OpGraph(ops)
    base = _baseline(g)
    p = int(meta["pp_size"])
    pred, gp, _ = _predict(g, meta, stages=p)
    assert len(gp.ops) == len(ops)
    assert gp.ops["optype"].value_counts().to_dict() == ops["optype"].value_counts()[lambda c: c > 0].to_dict()
    err = (pred / base - 1).abs()
    assert err.max() < 0.01, err.describe()
    # with the job's layers given (32 is a guess: any count that splits over the stages)
    meta = {**meta, "num_layers": 8 * p}
    assert ((_predict(g, meta, layers=8 * p)[0] / base - 1).abs().max()) < 0.01
    assert ((_predict(g, meta, stages=p, layers=8 * p)[0] / base - 1).abs().max()) < 0.01


@needs_sa
def test_more_stages_at_fixed_microbatches_cost_more_bubble_on_a_real_trace():
    """ST (DP 2 x PP 4, 4 micro-batches): with more stages the bubble grows and each GPU does less per second (stages
    x step time grows), although the step is shorter; with fewer micro-batches the bubble grows too; more layers
    take longer."""
    ops = read_op_trace(SA / "trace-ST.parquet")
    meta = yaml.safe_load((SA / "meta-ST.yaml").read_text())
    g = OpGraph(ops)
    runs = {}
    for n in (1, 2, 4, 8, 16):
        steps, gp, r = _predict(g, meta, stages=n)
        runs[n] = (float(steps.mean()), bubble_fraction(gp, r))
    bubbles = [runs[n][1] for n in sorted(runs)]
    gpu_seconds = [n * runs[n][0] for n in sorted(runs)]
    assert bubbles == sorted(bubbles) and bubbles[-1] > bubbles[0] + 0.3
    assert gpu_seconds == sorted(gpu_seconds)
    assert runs[1][0] > runs[2][0] > runs[4][0] > runs[8][0]
    few, gp, r = _predict(g, meta, stages=8, microbatches=2)
    assert bubble_fraction(gp, r) > runs[8][1] and float(few.mean()) < runs[8][0]
    meta = {**meta, "num_layers": 32}
    base = float(_baseline(g).mean())
    assert float(_predict(g, meta, layers=16)[0].mean()) < base < float(_predict(g, meta, layers=64)[0].mean())


@needs_sa
def test_the_layer_model_fits_the_real_stages():
    """ST: stages 0-2 cost the same per layer and the last stage adds its output layer and loss; the model explains
    the per-stage means within 1% (the figures the docs give)."""
    ops = read_op_trace(SA / "trace-ST.parquet")
    g = OpGraph(ops)
    models = fit_layer_models(g, observed_partition(ops, {"pp_size": 4}))
    for t in ("forward-compute", "backward-compute", "params-all-gather", "grads-reduce-scatter", "optimizer"):
        assert models[t].fit_error < 0.01, models[t]
    assert models["forward-compute"].last > 0.8 * models["forward-compute"].per_layer  # the last stage's loss: ~2x


@needs_sa
def test_whatif_cli_scale_pp_and_layers(tmp_path, capsys):
    ops = SA / "trace-ST.parquet"
    meta = tmp_path / "meta.yaml"
    meta.write_text("trial_name: ST\ndp_size: 2\npp_size: 4\nnum_layers: 32\n")
    out = tmp_path / "o"
    assert main(["whatif", "--ops", str(ops), "--meta", str(SA / "meta-ST.yaml"), "--scenario", "scale-pp:8",
                 "--out", str(out)]) == 0
    assert "assumed to hold equal layers" in capsys.readouterr().err
    job = json.loads((out / "summary.json").read_text())["jobs"]["ST"]
    note = job["scenario_notes"]["scale-pp:8"]
    assert note["stages"] == 8 and not note["layers_known"] and job["predicted_step_s"] < job["baseline_step_s"]
    assert job["predicted_bubble_fraction"] > job["baseline_bubble_fraction"]
    assert main(["whatif", "--ops", str(ops), "--meta", str(meta), "--scenario", "scale-pp:8", "--scenario", "layers:64",
                 "--scenario", "scale-dp:4", "--out", str(out), "--quiet"]) == 0
    job = json.loads((out / "summary.json").read_text())["jobs"]["ST"]
    assert job["scenario_notes"]["scale-pp:8"]["layers_per_stage"] == [8.0] * 8


@needs_sa
@pytest.mark.parametrize("scenario, meta_text, match", [
    ("scale-pp:0", "", "'scale-pp:0': scale-pp takes a positive whole number"),
    ("layers:-1", "", "'layers:-1': layers takes a positive whole number"),
    ("scale-pp:1000", "", "at most 256 pipeline stages"),
    ("scale-pp:3", "num_layers: 32\n", "scale-pp:3: 32 layers do not split evenly over 3 stages"),
    ("scale-pp:64", "num_layers: 32\n", "scale-pp:64: 32 layers cannot fill 64 stages"),
    ("layers:30", "num_layers: 32\n", "layers:30: 30 layers do not split over the 4 stages"),
    ("layers:32", "", "layers:32: needs the job's layer count"),
    ("scale-pp:2", "num_layers: 30\n", "num_layers 30 does not split evenly over the 4 stages"),
    ("scale-pp:2", "layers_per_stage: [8, 8]\n", "layers_per_stage must list 4 whole numbers"),
    ("scale-dp:4", "dp_size: 1\n", "scale-dp:4: the trace's DP size is 1: it has no DP collective to re-cost"),
    # hidden:H (tests/test_whatif_hidden.py has its model's own tests)
    ("hidden:0", "", "'hidden:0': hidden takes a positive whole number"),
    ("hidden:-4096", "", "'hidden:-4096': hidden takes a positive whole number"),
    ("hidden:4k", "", "'hidden:4k': hidden takes a positive whole number"),
    ("hidden", "", "'hidden': hidden needs a value, e.g. hidden:8192"),
    ("hidden:9999999", "", "at most a hidden size of 262,144"),
    ("hidden:8192", "", "hidden:8192: needs the traced model's hidden size and sequence length: --meta hidden_size"),
    ("hidden:8192", "hidden_size: 4096\n", "needs the traced model's hidden size and sequence length"),
    ("hidden:8192", "hidden_size: big\nseq_length: 4096\n", "--meta: hidden_size must be a whole number >= 1, got 'big'"),
    ("hidden:8192", "hidden_size: 4096\nseq_length: 4096\nswiglu: maybe\n", "--meta: swiglu must be true or false"),
    ("hidden:5000", "hidden_size: 4096\nseq_length: 4096\nnum_attention_heads: 32\n",
     "hidden:5000: 5000 does not split over the 32 attention heads"),
])
def test_bad_graph_scenarios_exit_2_naming_the_scenario(tmp_path, capsys, scenario, meta_text, match):
    meta = tmp_path / "meta.yaml"
    meta.write_text("dp_size: 2\npp_size: 4\n" + meta_text)
    assert main(["whatif", "--ops", str(SA / "trace-ST.parquet"), "--meta", str(meta), "--scenario", scenario,
                 "--out", str(tmp_path / "o")]) == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "o" / "summary.json").exists()


@needs_sa
def test_scale_pp_needs_a_pipeline(tmp_path, capsys):
    ops = read_op_trace(SA / "trace-ST.parquet")
    ops[(ops["stage"] == 0) & ~ops["optype"].str.contains("send|recv|embedding")].to_parquet(tmp_path / "pp1.parquet")
    assert main(["whatif", "--ops", str(tmp_path / "pp1.parquet"), "--scenario", "scale-pp:2", "--out", str(tmp_path / "o")]) == 2
    assert "scale-pp:2: the trace has no pipeline" in capsys.readouterr().err


# ------------------------------------------------------------------ --search


def _ring(n: int) -> float:
    return (n - 1) / n if n > 1 else 0.0


def test_search_ranks_configurations_as_the_jobs_generated_that_way(tmp_path):
    """A SYNTHETIC job (PP 2, DP 4, 8 micro-batches) searched within 16 GPUs at its global batch: each configuration's
    predicted step is the step of the job generated with that PP, DP and M (DP collectives by the ring's (N-1)/N),
    and the ranking by throughput per GPU is theirs."""
    from prism.whatif.search import search_configs

    kw = dict(layers=24, fwd_last=0.015, bwd_last=0.02, steps=2)
    PipelineJob(stages=2, dp=4, microbatches=8, **kw).trace().to_parquet(tmp_path / "ops.parquet")
    table, summary = search_configs(tmp_path / "ops.parquet", {"dp_size": 4, "pp_size": 2, "num_layers": 24}, 16,
                                    headroom=100.0, top=1000)
    sim = table[table["status"] == "simulated"]
    assert len(sim) >= 8 and summary["simulated"] == len(sim)
    truth = {}
    for pp, dp, m in sim[["pp", "dp", "microbatches"]].itertuples(index=False):
        f = _ring(dp) / _ring(4)
        t = OpGraph(PipelineJob(stages=pp, dp=dp, microbatches=m, rs=0.004 * f, ag=0.002 * f, **kw).trace())
        truth[(pp, dp, m)] = float(_baseline(t).mean())
    for r in sim.itertuples(index=False):
        assert r.step_s == pytest.approx(truth[(r.pp, r.dp, r.microbatches)], rel=1e-9), r
        assert r.throughput_per_gpu <= r.throughput_bound  # the pruning bound is a bound
        assert r.dp * r.microbatches == 32  # the global batch kept
    base = truth[(2, 4, 8)]
    true_tput = {k: (k[2] / (k[0] * t)) / (8 / (2 * base)) for k, t in truth.items()}
    assert list(sim[["pp", "dp", "microbatches"]].itertuples(index=False, name=None)) == sorted(true_tput, key=lambda k: -true_tput[k])
    assert (table["gpus"] <= 16).all()


@needs_sa
def test_search_on_a_real_trace_prunes_without_losing_the_best(tmp_path, capsys):
    """ST within 32 GPUs: pruning by the bound keeps the top configurations of the full search; the observed
    configuration is among them and predicted at the baseline; the CLI writes search.csv and the summary's search."""
    from prism.whatif.search import search_configs

    meta = yaml.safe_load((SA / "meta-ST.yaml").read_text())
    full, _ = search_configs(SA / "trace-ST.parquet", meta, 32, microbatches=[2, 4, 8], steps=2, top=1000)
    pruned, summary = search_configs(SA / "trace-ST.parquet", meta, 32, microbatches=[2, 4, 8], steps=2, top=3)
    sim = full[full["status"] == "simulated"]
    assert (sim["throughput_per_gpu"] <= sim["throughput_bound"]).all()  # the pruning bound holds on real costs
    key = ["pp", "dp", "microbatches"]
    top_full = full[full["status"] == "simulated"].head(3)[key].to_numpy().tolist()
    assert pruned[pruned["status"] == "simulated"].head(3)[key].to_numpy().tolist() == top_full
    assert summary["pruned"].get("cannot win", 0) > 0 and summary["simulated"] < len(full[full["status"] == "simulated"])
    obs = pruned[pruned["observed"]].iloc[0]
    assert obs["step_s"] == pytest.approx(summary["observed"]["step_s"], rel=1e-9) and obs["throughput_per_gpu"] == pytest.approx(1.0)
    out = tmp_path / "o"
    assert main(["whatif", "--ops", str(SA / "trace-ST.parquet"), "--meta", str(SA / "meta-ST.yaml"), "--search", "--gpus", "16",
                 "--search-steps", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr()
    assert "search [1/" in printed.err and "thr/GPU" in printed.out
    s = json.loads((out / "summary.json").read_text())["search"]
    assert s["gpus"] == 16 and s["best_throughput"]["gpus"] <= 16 and (out / "search.csv").exists()


@pytest.mark.parametrize("args, match", [
    (["--search"], "--search needs --gpus"),
    (["--search", "--gpus", "0"], "--search needs --gpus"),
    (["--search", "--gpus", "8", "--search-microbatches", "4,x"], "whole numbers, comma-separated"),
    (["--search", "--gpus", "8", "--search-steps", "0"], "--search-steps 0"),
])
def test_bad_search_settings_exit_2(tmp_path, capsys, args, match):
    PipelineJob(stages=2, steps=1).trace().to_parquet(tmp_path / "ops.parquet")
    assert main(["whatif", "--ops", str(tmp_path / "ops.parquet"), *args, "--out", str(tmp_path / "o")]) == 2
    assert match in capsys.readouterr().err
    assert main(["whatif", str(tmp_path), "--search", "--gpus", "8", "--out", str(tmp_path / "o")]) == 2


@pytest.mark.parametrize("inputs, args, match", [
    (["REPLAY"], ["--meta", "m.yaml"], "--meta goes with --ops"),
    (["--kineto", "k.json"], ["--meta", "m.yaml"], "--meta goes with --ops"),
    (["--ops", "OPS"], ["--topology", "t.csv"], "--topology goes with REPLAY_DIR"),
    (["--ops", "OPS"], ["--partial"], "--partial goes with --kineto"),
])
def test_a_flag_for_another_input_is_refused_not_ignored(tmp_path, capsys, inputs, args, match):
    PipelineJob(stages=2, steps=1).trace().to_parquet(tmp_path / "ops.parquet")
    inputs = [{"REPLAY": str(tmp_path), "OPS": str(tmp_path / "ops.parquet")}.get(a, a) for a in inputs]
    assert main(["whatif", *inputs, *args, "--out", str(tmp_path / "o")]) == 2
    assert match in capsys.readouterr().err


@needs_sa
def test_a_rebuilt_trace_too_large_is_refused(tmp_path, capsys):
    assert main(["whatif", "--ops", str(SA / "trace-SE.parquet"), "--meta", str(SA / "meta-SE.yaml"), "--scenario", "scale-pp:64",
                 "--out", str(tmp_path / "o")]) == 2
    assert "scale-pp:64: the rebuilt trace would hold about" in capsys.readouterr().err


@needs_sa
def test_a_trace_missing_a_stage_is_refused(tmp_path, capsys):
    ops = read_op_trace(SA / "trace-ST.parquet")
    ops[ops["stage"] != 2].to_parquet(tmp_path / "ops.parquet")
    assert main(["whatif", "--ops", str(tmp_path / "ops.parquet"), "--meta", str(SA / "meta-ST.yaml"), "--scenario", "scale-pp:2",
                 "--out", str(tmp_path / "o")]) == 2
    assert "the trace has stages 0, 1, 3 but pp_size is 4" in capsys.readouterr().err
