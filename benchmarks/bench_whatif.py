"""Benchmark: what-if replay fidelity, counterfactual accuracy and simulator speed.

Prints Markdown tables:

1. **Real op traces** (``../shared/data/straggler-analysis``): replayed vs
   observed step time; the baseline (no launch delays) vs the authors'
   ``tori``, ``ideal`` vs their ``tideal``, ``remove-stragglers``; the
   attribution (S, per DP rank and stage, M_S, M_W) vs their results.
2. **SYNTHETIC counterfactuals**: a cluster with faults and its
   ``--no-faults`` twin (same seed), both through ``prism replay``;
   ``remove-stragglers`` + ``heal-switch:<the slow switch>`` on the faulty
   one vs the twin's observed median step time, per job.
3. **Simulator speed**: a 1,024-GPU job (DP 128 x PP 8), 100 steps, 8
   micro-batches, built as an execution graph and simulated.

    python benchmarks/bench_whatif.py [--presets tiny,demo]
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from prism.cli import main as prism
from prism.whatif.graph import ExecutionGraph, simulate
from prism.whatif.optrace import OpGraph, observed_step_times, read_op_trace
from prism.whatif.scenarios import apply_op_scenarios, parse_scenario
from synthetic.fromtrace import shared_data_dir

SA = shared_data_dir() / "straggler-analysis"


def real_traces() -> None:
    from prism.whatif.run import attribute_ops

    print("### Real op traces (StragglerAnalysis)\n")
    print("| trace | ops | tasks | steps | replay error mean / max | baseline vs tori | ideal vs tideal | remove-stragglers | S vs theirs | per-DP-rank / per-stage attribution, max error | M_S ours / theirs | M_W ours / theirs | attribution time |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for trial in ("SE", "ST"):
        ops = read_op_trace(SA / f"trace-{trial}.parquet")
        meta = yaml.safe_load((SA / f"meta-{trial}.yaml").read_text())
        g = OpGraph(ops)

        def steps(sc, g=g, meta=meta):  # bound now: called within this iteration only
            d = apply_op_scenarios(g, [parse_scenario(s) for s in sc], meta["dp_size"])
            return g.step_seconds(simulate(g.graph(d, launch_delay=False)))

        rep = g.step_seconds(simulate(g.graph()))
        obs = observed_step_times(ops)
        err = (rep / obs - 1).abs()
        ms = json.loads((SA / f"ms-{trial}.json").read_text())
        mw = json.loads((SA / f"mw-{trial}.json").read_text())
        res = json.loads((SA / f"result-{trial}.json").read_text())
        base, ideal, rs = steps([]).mean(), steps(["ideal"]).mean(), steps(["remove-stragglers"]).mean()
        t0 = time.perf_counter()
        table, a = attribute_ops(g)
        t_attr = time.perf_counter() - t0
        worst = []
        for level in ("dp_rank", "stage"):
            ours = table[table["level"] == level].set_index("key")["slowdown"]
            theirs = pd.Series(res[f"blocking_decompose_by_{level}"]).rename(int)
            worst.append((ours.reindex(theirs.index) / theirs - 1).abs().max())
        print(f"| {trial} (DP {meta['dp_size']} x PP {meta['pp_size']}) | {len(ops):,} | {g.n_nodes:,} | {len(obs)} | "
              f"{err.mean():.3%} / {err.max():.3%} | {base:.3f} s vs {ms['tori']:.3f} s ({base / ms['tori'] - 1:+.2%}) | "
              f"{ideal:.3f} s vs {ms['tideal']:.3f} s ({ideal / ms['tideal'] - 1:+.2%}) | {rs:.3f} s ({base / rs:.3f}x faster) | "
              f"{a['slowdown']:.3f} / {res['blocking_slowdown']:.3f} | {worst[0]:.2%} / {worst[1]:.2%} | "
              f"{a['m_s']:.1%} / {ms['Ms']:.1%} | {a['m_w']:.1%} / {mw['Mw']:.1%} | {t_attr:.1f} s |")
    print()


def trace_counterfactuals() -> None:
    """Flows derived from the real traces, one worker per job 2x slow from its fifth step: the network-level
    remove-stragglers against the op-level one on the same trace and against the job without the straggler."""
    from synthetic.fromtrace import CollectorNoise, Straggler, read_trace_job, trace_cluster, with_straggler

    print("### Network vs op level, flows derived from the real traces\n")
    print("| job | straggler | observed (network) | no straggler (truth) | network remove-stragglers | error | op-level: observed, remove-stragglers | network warnings |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    stragglers = {"ST": Straggler(dp=1, stage=2), "SE": Straggler(dp=3, stage=0)}
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        out = {}
        for tag, st in (("slow", stragglers), ("clean", {})):
            c = trace_cluster([read_trace_job(SA, t, tp=8, straggler=st.get(t)) for t in ("ST", "SE")], noise=CollectorNoise())
            c.write(d / tag)
            prism(["replay", str(d / tag / "flows.parquet"), "--topology", str(d / tag / "topology.csv"), "--out", str(d / f"r-{tag}"), "--quiet"])
            prism(["whatif", str(d / f"r-{tag}"), "--scenario", "remove-stragglers", "--out", str(d / f"w-{tag}"), "--quiet"])
            names = pd.read_csv(d / tag / "truth" / "jobs.csv").merge(pd.read_csv(d / f"r-{tag}" / "jobs.csv"), on="ip")
            jobs = json.loads((d / f"w-{tag}" / "summary.json").read_text())["jobs"]
            out[tag] = {t: jobs[j] for t, j in names.groupby("job_id_x")["job_id_y"].agg(lambda x: x.mode()[0]).items()}
        for t, s in stragglers.items():
            slow, clean = out["slow"][t], out["clean"][t]
            g = OpGraph(with_straggler(read_op_trace(SA / f"trace-{t}.parquet"), s))
            op = [float(g.step_seconds(simulate(g.graph(apply_op_scenarios(g, [parse_scenario(x) for x in sc]), launch_delay=False))).median())
                  for sc in ([], ["remove-stragglers"])]
            pred, truth = slow["predicted_step_s"], clean["observed_step_s"]
            print(f"| {t} | dp {s.dp}, stage {s.stage}, {s.factor:g}x | {slow['observed_step_s']:.3f} s | {truth:.3f} s | {pred:.3f} s | "
                  f"{pred / truth - 1:+.1%} | {op[0]:.3f} s, {op[1]:.3f} s | {len(slow['warnings'])} |")
    print()


def counterfactuals(presets: list[str]) -> None:
    from synthetic import preset

    print("### SYNTHETIC counterfactuals vs the fault-free twin\n")
    print("| preset | job | observed (faulty) | twin (truth) | predicted | error | unchanged replay error |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name in presets:
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            for tag, faults in (("faulty", True), ("twin", False)):
                cl = preset(name, seed=0, with_faults=faults).generate()
                cl.write(d / tag)
                prism(["replay", str(d / tag / "flows.parquet"), "--topology", str(d / tag / "topology.csv"), "--out", str(d / f"r-{tag}"), "--quiet"])
                prism(["whatif", str(d / f"r-{tag}"), "--out", str(d / f"w-{tag}"), "--quiet"])
            faults = pd.read_csv(d / "faulty" / "truth" / "faults.csv")
            sc = ["--scenario", "remove-stragglers"]
            for sw in faults.loc[faults["kind"] == "slow_switch", "subject"]:
                sc += ["--scenario", f"heal-switch:{sw}"]
            prism(["whatif", str(d / "r-faulty"), "--topology", str(d / "faulty" / "topology.csv"), *sc, "--out", str(d / "w-fix"), "--quiet"])
            base = json.loads((d / "w-faulty" / "summary.json").read_text())["jobs"]
            twin = json.loads((d / "w-twin" / "summary.json").read_text())["jobs"]
            fix = json.loads((d / "w-fix" / "summary.json").read_text())["jobs"]
            for job in sorted(fix):
                if job not in twin:
                    continue
                t = twin[job]["observed_step_s"]
                print(f"| {name} | {job} | {base[job]['observed_step_s'] * 1e3:.1f} ms | {t * 1e3:.1f} ms | "
                      f"{fix[job]['predicted_step_s'] * 1e3:.1f} ms | {fix[job]['predicted_step_s'] / t - 1:+.2%} | {base[job]['replay_error_mean_pct']:.3f}% |")
    print()


def speed() -> None:
    dp, pp, mb, steps = 128, 8, 8, 100
    ranks = dp * pp
    t0 = time.perf_counter()
    # tasks: each rank's compute chain; p2p and DP collectives as shared nodes
    n_local = steps * ranks * 2 * mb
    n_coll = steps * pp * 2
    n = n_local + n_coll
    dur = np.r_[np.full(n_local, 0.01), np.full(n_coll, 0.05)]
    step = np.r_[np.repeat(np.arange(steps), ranks * 2 * mb), np.repeat(np.arange(steps), pp * 2)]
    local = np.arange(n_local).reshape(steps, ranks, 2 * mb)
    coll = n_local + np.arange(n_coll).reshape(steps, pp, 2)
    stage = np.arange(ranks) % pp
    src, dst = [local[:, :, :-1].ravel()], [local[:, :, 1:].ravel()]
    # pipeline: micro-batch k's forward on stage s+1 after stage s (same DP rank)
    nxt = stage < pp - 1
    src.append(local[:, nxt, :mb].ravel())
    dst.append(local[:, np.flatnonzero(nxt) + 1, :mb].ravel())
    # DP collectives: every rank of a stage joins reduce-scatter, then all-gather; the next step after
    src.append(local[:, :, -1].ravel())
    dst.append(coll[:, stage, 0].ravel())
    src.append(coll[:, :, 0].ravel())
    dst.append(coll[:, :, 1].ravel())
    src.append(coll[:-1, stage, 1].ravel())
    dst.append(local[1:, :, 0].ravel())
    g = ExecutionGraph(dur, step, np.concatenate(src), np.concatenate(dst), np.zeros(sum(len(x) for x in src)))
    build = time.perf_counter() - t0
    simulate(g)  # compile
    t1 = time.perf_counter()
    simulate(g)
    sim = time.perf_counter() - t1
    print("### Simulator speed\n")
    print("| job | steps | tasks | edges | build | simulate | tasks/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    print(f"| {ranks:,} GPUs (DP {dp} x PP {pp}), {mb} micro-batches | {steps} | {n:,} | {len(g.src):,} | {build:.2f} s | {sim:.2f} s | {n / sim:,.0f} |")
    print()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="tiny,demo")
    args = ap.parse_args()
    real_traces()
    if SA.is_dir():
        trace_counterfactuals()
    speed()
    counterfactuals(args.presets.split(","))
