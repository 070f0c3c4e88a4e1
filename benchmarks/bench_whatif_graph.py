"""Benchmark: graph manipulation on op traces (``scale-pp:N``, ``layers:L``).

Prints Markdown tables:

1. **Reproduction** on the real traces (``../shared/data/straggler-analysis``):
   ``scale-pp:<observed P>`` and ``layers:<observed>`` against the baseline
   (the replay without launch delays, what every op-trace scenario is
   compared with) and against the observed steps.
2. **The layer model** fitted on each trace: per op type, the per-layer
   cost, the first and last stage's extra, the fit error (per-stage means)
   and the spread of the ops around it.
3. **Directions**: ``scale-pp:N`` at the observed micro-batch count, the
   predicted step, its bubble (share of a rank's step without compute) and
   the GPU time per step relative to the observed job.
4. **SYNTHETIC twin**: a job generated at P stages, re-partitioned to N,
   against the same job generated at N stages.
5. **Hidden size** (``hidden:H``): ``hidden:<observed h>`` against the
   baseline, and the predicted step, compute and bubble for a few H. The
   real traces' meta does not name their model: h = 4096 and s = 4096 are
   assumed (the scenario uses only ratios of h, so the assumption sets the
   attention term's weight, 4s / (24h + 4s), 14% here).
6. **GEMM time against FLOPs** on the Kineto traces that record shapes
   (HTA's A100 tests): how far ``time = a + b x FLOPs`` is from measured
   GEMMs, which ``hidden:H`` assumes for a layer's compute.

    python benchmarks/bench_whatif_graph.py
"""
from __future__ import annotations

import gzip
import json
import time

import numpy as np
import pandas as pd
import yaml

from prism.whatif.graph import simulate
from prism.whatif.optrace import COMPUTE, OpGraph, observed_step_times, read_op_trace
from prism.whatif.repartition import bubble_fraction, fit_layer_models, layer_factors, observed_partition, repartition
from prism.whatif.run import restructure
from prism.whatif.scenarios import parse_scenario
from synthetic.fromtrace import shared_data_dir
from synthetic.pipeline import PipelineJob

SA = shared_data_dir() / "straggler-analysis"
HTA = shared_data_dir() / "kineto" / "hta"
#: assumed: the traces' meta does not name the model
MODEL = {"hidden_size": 4096, "seq_length": 4096}


def _run(g: OpGraph, meta: dict, stages: int | None = None, layers: int | None = None):
    old = observed_partition(g.ops, meta)
    models = fit_layer_models(g, old)
    if stages is None:
        new = old.scaled(layers, "layers") if layers else old
        r = simulate(g.graph(g.work() * layer_factors(g.ops, models, old, new), launch_delay=False))
        return g.step_seconds(r), g, r, models
    gp = OpGraph(repartition(g, old, old.even(stages, layers, "scale-pp"), None, models))
    r = simulate(gp.graph(gp.work(), launch_delay=False))
    return gp.step_seconds(r), gp, r, models


def main() -> None:
    traces = {}
    for trial in ("ST", "SE"):
        ops = read_op_trace(SA / f"trace-{trial}.parquet")
        meta = yaml.safe_load((SA / f"meta-{trial}.yaml").read_text())
        traces[trial] = (ops, meta, OpGraph(ops))

    print("### Reproduction at the observed configuration\n")
    print("| trace | scenario | vs baseline: mean / max per step | vs replayed (launch delays) | vs observed | rebuild + simulate |")
    print("|---|---|---:|---:|---:|---:|")
    for trial, (ops, meta, g) in traces.items():
        base = g.step_seconds(simulate(g.graph(g.work(), launch_delay=False)))
        rep = g.step_seconds(simulate(g.graph()))
        obs = observed_step_times(ops)
        p = int(meta["pp_size"])
        for label, kw, m in ((f"scale-pp:{p}", {"stages": p}, meta), (f"layers:{8 * p} (num_layers: {8 * p})", {"layers": 8 * p},
                             {**meta, "num_layers": 8 * p})):
            t0 = time.perf_counter()
            pred = _run(g, m, **kw)[0]
            dt = time.perf_counter() - t0
            e = (pred / base - 1).abs()
            print(f"| {trial} | `{label}` | {e.mean():.4%} / {e.max():.4%} | {pred.mean() / rep.mean() - 1:+.2%} | "
                  f"{pred.mean() / obs.mean() - 1:+.2%} | {dt:.1f} s |")

    print("\n### The layer model (observed stages assumed to hold equal layers)\n")
    print("| trace | op type | per layer (one stage's share), s | first stage extra, s | last stage extra, s | fit error (stage means) | op spread (median) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for trial, (ops, meta, g) in traces.items():
        for t, mdl in fit_layer_models(g, observed_partition(ops, meta)).items():
            print(f"| {trial} | {t} | {mdl.per_layer:.4f} | {mdl.first:+.4f} | {mdl.last:+.4f} | {mdl.fit_error:.2%} | {mdl.op_spread:.1%} |")

    print("\n### scale-pp:N at the observed micro-batches\n")
    print("| trace | N | predicted step, s | vs baseline | bubble | GPU time per step vs observed |")
    print("|---|---:|---:|---:|---:|---:|")
    for trial, (_ops, meta, g) in traces.items():
        p = int(meta["pp_size"])
        base = float(_run(g, meta, stages=p)[0].mean())
        for n in (1, 2, 4, 8, 16):
            steps, gp, r, _ = _run(g, meta, stages=n)
            t = float(steps.mean())
            print(f"| {trial} | {n}{' (observed)' if n == p else ''} | {t:.4f} | {t / base - 1:+.1%} | "
                  f"{bubble_fraction(gp, r):.1%} | {n * t / (p * base):.2f}x |")

    print("\n### SYNTHETIC twin (a job generated at P stages, re-partitioned to N, vs generated at N)\n")
    worst = 0.0
    kw = dict(dp=2, microbatches=4, fwd_last=0.015, bwd_last=0.02, steps=2, jitter=0.05)
    for p in (2, 3, 4):
        g = OpGraph(PipelineJob(stages=p, layers=24, **kw).trace())
        for n in (1, 2, 3, 4, 6, 8, 12):
            pred = _run(g, {"num_layers": 24, "pp_size": p}, stages=n)[0]
            truth = OpGraph(PipelineJob(stages=n, layers=24, **{**kw, "jitter": 0.0}).trace())
            tb = truth.step_seconds(simulate(truth.graph(truth.work(), launch_delay=False)))
            worst = max(worst, float(np.max(np.abs(pred.to_numpy() / tb.to_numpy() - 1))))
    print(f"with 5% compute jitter in the observed job (not in the truth): worst step error {worst:.2%} over P in 2-4, "
          "N in 1-12")

    print(f"\n### hidden:H (assumed h = {MODEL['hidden_size']}, s = {MODEL['seq_length']}, MLP 4h)\n")
    print("| trace | H | predicted step, s | vs baseline: mean / max per step | compute per step vs observed | bubble |")
    print("|---|---:|---:|---:|---:|---:|")
    for trial, (_ops, meta, g) in traces.items():
        base = g.step_seconds(simulate(g.graph(g.work(), launch_delay=False)))
        rows = {}
        for h in (2048, 4096, 6144, 8192, 16384):
            gp, factor, _, _ = restructure(g, [parse_scenario(f"hidden:{h}")], {**meta, **MODEL})
            work = gp.work() * factor
            r = simulate(gp.graph(work, launch_delay=False))
            rows[h] = (gp.step_seconds(r), float(work[gp.ops["optype"].isin(COMPUTE).to_numpy()].sum()), bubble_fraction(gp, r))
        for h, (pred, comp, bubble) in rows.items():
            e = pred / base - 1
            obs = h == MODEL["hidden_size"]
            print(f"| {trial} | {h}{' (assumed observed)' if obs else ''} | {pred.mean():.4f} | {e.mean():+.4%} / "
                  f"{e.abs().max():.4%} | {comp / rows[MODEL['hidden_size']][1]:.2f}x | {bubble:.1%} |")

    print("\n### GEMM time against FLOPs (Kineto traces with shapes)\n")
    print("| trace | GPU | GEMMs | FLOPs | a, us | b, TFLOP/s | median / p90 rel. error | same, proportional (a = 0) |")
    print("|---|---|---:|---|---:|---:|---:|---:|")
    for path in (HTA / "trace_diff" / "control" / "control.json.gz", HTA / "trace_filter" / "sampled_rank-0.json.gz"):
        if path.exists():
            _gemm_fit(path)


def _gemm_fit(path) -> None:
    """One row: GEMM kernels (the kernels launched inside ``aten::mm``/``addmm``/``bmm``, summed per call) against
    the call's FLOPs (2MKN from ``Input Dims``), ``time = a + b x FLOPs`` fitted by relative least squares."""
    trace = json.loads(gzip.open(path).read())
    ev = pd.DataFrame([e for e in trace["traceEvents"] if e.get("ph") == "X"])
    ev = pd.concat([ev.drop(columns="args"), pd.json_normalize(ev["args"].tolist())], axis=1)
    mm = ev[(ev["cat"] == "cpu_op") & ev["name"].isin(["aten::mm", "aten::addmm", "aten::bmm"])].sort_values("ts")
    mm = mm.reset_index(drop=True)
    rt = ev[ev["cat"] == "cuda_runtime"]
    # the call a launch belongs to: the GEMM op on its thread that encloses it (GEMM ops do not nest)
    own = np.full(len(rt), -1)
    for tid, grp in mm.groupby("tid"):
        sel = (rt["tid"] == tid).to_numpy()
        t = rt["ts"].to_numpy()[sel]
        i = np.maximum(np.searchsorted(grp["ts"].to_numpy(), t, side="right") - 1, 0)
        inside = (t >= grp["ts"].to_numpy()[i]) & (t <= (grp["ts"] + grp["dur"]).to_numpy()[i])
        own[np.flatnonzero(sel)] = np.where(inside, grp.index.to_numpy()[i], -1)
    launch = pd.Series(own, index=rt["correlation"].to_numpy())
    k = ev[ev["cat"] == "kernel"]
    k = k.assign(call=launch.reindex(k["correlation"].to_numpy()).to_numpy())
    t = k[k["call"] >= 0].groupby("call")["dur"].sum()
    dims = mm["Input Dims"].to_numpy()
    flops = np.array([2 * np.prod(d[1]) * d[2][1] if n == "aten::addmm" else 2 * np.prod(d[0]) * d[1][-1]
                      for n, d in zip(mm["name"], dims)], dtype=np.float64)
    sel = t.index.to_numpy(np.int64)
    x, y = flops[sel], t.to_numpy(np.float64)
    a = np.c_[np.ones_like(x), x]
    coef, *_ = np.linalg.lstsq(a / y[:, None], np.ones_like(y), rcond=None)
    rel = np.abs(a @ coef / y - 1)
    prop = np.abs(np.sum(x / y) / np.sum((x / y) ** 2) * x / y - 1)
    gpu = trace.get("deviceProperties", [{}])[0].get("name", "not recorded")
    print(f"| {path.parent.name}/{path.name} | {gpu} | {len(x)} | {x.min():.1e}-{x.max():.1e} | {coef[0]:.1f} | "
          f"{1e-6 / coef[1]:.0f} | {np.median(rel):.0%} / {np.quantile(rel, 0.9):.0%} | {np.median(prop):.0%} |")


if __name__ == "__main__":
    main()
