"""``hidden:H`` on op traces: against a SYNTHETIC job generated at H, the real traces at their own hidden size, the
known direction (compute grows about as H^2) and the errors for values it cannot take."""
from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from prism.cli import main
from prism.whatif.graph import simulate
from prism.whatif.hidden import Architecture, architecture
from prism.whatif.optrace import COMPUTE, OpGraph, read_op_trace
from prism.whatif.run import restructure
from prism.whatif.scenarios import parse_scenario
from synthetic.fromtrace import shared_data_dir
from synthetic.pipeline import PipelineJob

SA = shared_data_dir() / "straggler-analysis"
needs_sa = pytest.mark.skipif(not SA.is_dir(), reason=f"{SA} not present (PRISM_SHARED_DATA names the real-data directory)")
#: the real traces' meta does not say which model they trained: an assumed one (the scenario only uses ratios)
MODEL = {"hidden_size": 4096, "seq_length": 4096, "num_attention_heads": 32}


def _predict(g: OpGraph, meta: dict, *scenarios: str):
    """(per-step predicted seconds, the graph simulated, its per-op work), as ``prism whatif`` runs the scenarios."""
    gp, factor, _, _ = restructure(g, [parse_scenario(s) for s in scenarios], meta)
    work = gp.work() * factor
    return gp.step_seconds(simulate(gp.graph(work, launch_delay=False))), gp, work


def _baseline(g: OpGraph):
    return g.step_seconds(simulate(g.graph(g.work(), launch_delay=False)))


def test_the_flop_and_parameter_counts_are_megatrons():
    """24h^2 + 4sh FLOPs per token and 12h^2 + 13h parameters per layer for a 4h MLP (Narayanan et al., SC 2021); a
    SwiGLU MLP of 8h/3 has the same GEMM FLOPs and weights."""
    a = Architecture(hidden=1024, seq_length=2048, ffn_ratio=4.0)
    assert a.layer_flops(1024) == 24 * 1024**2 + 4 * 2048 * 1024
    assert a.layer_params(1024) == 12 * 1024**2 + 13 * 1024
    g = Architecture(hidden=1536, seq_length=2048, ffn_ratio=8 / 3, swiglu=True)
    assert g.layer_flops(1536) == pytest.approx(24 * 1536**2 + 4 * 2048 * 1536)
    assert architecture({"hidden_size": 1536, "seq_length": 2048, "ffn_hidden_size": 4096, "swiglu": True}, "x") == g


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("hidden", [1024, 2048, 4096, 6144])
@pytest.mark.parametrize("more", [(), ("scale-pp:6",), ("layers:48",), ("microbatches:8",)])
def test_hidden_matches_the_job_generated_at_that_size(stages, hidden, more):
    """A SYNTHETIC job at h = 2048 re-costed for H against the job generated with every cost moved as the model says
    (per layer: compute by FLOPs, DP collectives and optimizer by parameters; the last stage's output layer, pipeline
    transfers and the embedding all-reduce by H / h): exact, alone and with scale-pp, layers and microbatches."""
    arch = Architecture(hidden=2048, seq_length=4096, ffn_ratio=4.0)
    f = arch.factors(hidden)
    kw = dict(dp=2, microbatches=4, fwd_last=0.015, bwd_last=0.02, steps=2)
    job = PipelineJob(stages=stages, layers=24, **kw)
    meta = {"num_layers": 24, "pp_size": stages, "hidden_size": 2048, "seq_length": 4096}
    pred, _, _ = _predict(OpGraph(job.trace()), meta, *more, f"hidden:{hidden}")
    shape = {"stages": 6} if more == ("scale-pp:6",) else {"layers": 48} if more == ("layers:48",) else {}
    if more == ("microbatches:8",):
        kw["microbatches"] = 8
    truth = PipelineJob(**{"stages": stages, "layers": 24, **shape, **kw, "fwd": job.fwd * f["flops"],
                           "bwd": job.bwd * f["flops"], "fwd_last": 0.015 * f["linear"], "bwd_last": 0.02 * f["linear"],
                           "ag": job.ag * f["params"], "rs": job.rs * f["params"], "opt": job.opt * f["params"],
                           "p2p": job.p2p * f["linear"], "emb": job.emb * f["linear"]})
    assert np.allclose(pred.to_numpy(), _baseline(OpGraph(truth.trace())).to_numpy(), rtol=1e-9)


@needs_sa
@pytest.mark.parametrize("trial", ["ST", "SE"])
def test_hidden_at_the_observed_size_reproduces_the_replay(trial):
    """hidden:<observed h> gives the baseline back within 1% in every step (exactly: every factor is 1), alone and
    with scale-pp:<observed P>."""
    meta = {**yaml.safe_load((SA / f"meta-{trial}.yaml").read_text()), **MODEL}
    g = OpGraph(read_op_trace(SA / f"trace-{trial}.parquet"))
    base = _baseline(g)
    for more in ((), (f"scale-pp:{meta['pp_size']}",)):
        pred = _predict(g, meta, *more, "hidden:4096")[0]
        assert (pred / base - 1).abs().max() < 0.01


@needs_sa
def test_a_larger_hidden_size_lengthens_the_step_with_compute_growing_about_quadratically():
    """ST at H from 1024 to 16384: the step grows with H; the compute (forward and backward) grows by its FLOPs per
    token, 24H^2 + 4sH: between linear and quadratic in H, nearer quadratic the larger H is against s; so its share of
    the step grows."""
    meta = {**yaml.safe_load((SA / "meta-ST.yaml").read_text()), **MODEL}
    g = OpGraph(read_op_trace(SA / "trace-ST.parquet"))
    sizes = [1024, 2048, 4096, 8192, 16384]
    arch = architecture(meta, "hidden")
    steps, compute, middle = [], [], []
    for h in sizes:
        pred, gp, work = _predict(g, meta, f"hidden:{h}")
        steps.append(float(pred.mean()))
        comp = gp.ops["optype"].isin(COMPUTE).to_numpy()
        compute.append(float(work[comp].sum()))
        middle.append(float(work[comp & gp.ops["stage"].isin([1, 2]).to_numpy()].sum()))
    assert steps == sorted(steps) and steps[-1] > 10 * steps[2]
    # the stages with layers only: exactly the FLOPs per token
    assert np.allclose(np.array(middle) / middle[2], [arch.factors(h)["flops"] for h in sizes], rtol=1e-9)
    # the whole compute (with the last stage's output layer, linear in H): the exponent of H between neighbouring
    # sizes rises towards 2
    slope = np.diff(np.log(compute)) / np.log(2)
    assert np.all((slope > 1.45) & (slope < 2.0)) and np.all(np.diff(slope) > 0) and slope[-1] > 1.85, slope
    share = np.array(compute) / np.array(steps)
    assert np.all(np.diff(share) > 0)


@needs_sa
def test_whatif_cli_hidden(tmp_path, capsys):
    meta = tmp_path / "meta.yaml"
    meta.write_text("trial_name: ST\ndp_size: 2\npp_size: 4\nnum_layers: 32\nhidden_size: 4096\nseq_length: 4096\n")
    out = tmp_path / "o"
    assert main(["whatif", "--ops", str(SA / "trace-ST.parquet"), "--meta", str(meta), "--scenario", "hidden:8192",
                 "--out", str(out), "--quiet"]) == 0
    job = json.loads((out / "summary.json").read_text())["jobs"]["ST"]
    note = job["scenario_notes"]["hidden:8192"]
    assert note["observed_hidden_size"] == 4096 and note["layer_flops_factor"] == pytest.approx(104 / 28, rel=1e-6)
    assert note["activation_factor"] == 2.0 and "forward-compute" in note["layer_model"]
    assert job["predicted_step_s"] > 3 * job["baseline_step_s"]
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["whatif", "--help"])
    assert "hidden:H" in capsys.readouterr().out


def test_exported_sizes_follow_the_re_costed_transfers(tmp_path):
    """--chakra after hidden:H: a communication op's comm_size moves with its work (pipeline transfers by H / h, the
    DP collectives of a stage holding only layers by a layer's parameters), as the model says their bytes do."""
    pytest.importorskip("google.protobuf")
    from prism.whatif import et_def_pb2 as et
    from prism.whatif.chakra import read_et

    ops = PipelineJob(stages=3, layers=24, fwd_last=0.015).trace()
    sizes = {"forward-send": 1 << 20, "forward-recv": 1 << 20, "backward-send": 1 << 20, "backward-recv": 1 << 20,
             "grads-reduce-scatter": 1 << 30, "params-all-gather": 1 << 29}
    ops.assign(bytes=ops["optype"].map(sizes)).to_csv(tmp_path / "job.csv", index=False)
    (tmp_path / "meta.yaml").write_text("dp_size: 2\npp_size: 3\nnum_layers: 24\nhidden_size: 2048\nseq_length: 4096\n")
    assert main(["whatif", "--ops", str(tmp_path / "job.csv"), "--meta", str(tmp_path / "meta.yaml"), "--scenario",
                 "hidden:4096", "--chakra", str(tmp_path / "et"), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    f = Architecture(hidden=2048, seq_length=4096, ffn_ratio=4.0).factors(4096)
    _, nodes = read_et(tmp_path / "et" / "workload.2.et")  # stage 1 of DP rank 0: layers only
    got = {(n.name, {x.name: x for x in n.attr}["comm_size"].int64_val) for n in nodes
           if n.type in (et.COMM_COLL_NODE, et.COMM_SEND_NODE, et.COMM_RECV_NODE)}
    assert got == {(t, round(b * (f["params"] if t.startswith(("grads", "params")) else f["linear"]))) for t, b in sizes.items()}
