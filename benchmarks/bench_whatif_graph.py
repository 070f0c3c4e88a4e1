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

    python benchmarks/bench_whatif_graph.py
"""
from __future__ import annotations

import time

import numpy as np
import yaml

from prism.whatif.graph import simulate
from prism.whatif.optrace import OpGraph, observed_step_times, read_op_trace
from prism.whatif.repartition import bubble_fraction, fit_layer_models, layer_factors, observed_partition, repartition
from synthetic.fromtrace import shared_data_dir
from synthetic.pipeline import PipelineJob

SA = shared_data_dir() / "straggler-analysis"


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


if __name__ == "__main__":
    main()
