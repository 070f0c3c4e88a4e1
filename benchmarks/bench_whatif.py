"""Benchmark: what-if replay fidelity, counterfactual accuracy and simulator speed.

Prints Markdown tables:

1. **Real op traces** (``../shared/data/straggler-analysis``): replayed vs
   observed step time; the baseline (no launch delays) vs the authors'
   ``tori``, ``ideal`` vs their ``tideal``, ``remove-stragglers``; the
   attribution (S, per DP rank and stage, M_S, M_W) vs their results.
2. **SYNTHETIC counterfactuals**: a cluster with faults and, per fault, its
   twin without that fault alone (same seed), all through ``prism replay``;
   ``heal-switch:<the slow switch>`` on the faulty one vs the twin without
   the switch fault, ``remove-stragglers`` vs the twin without the slow
   server: mean step time per job.
3. **Simulator speed**: a 1,024-GPU job (DP 128 x PP 8), 100 steps, 8
   micro-batches, built as an execution graph and simulated.

   ``heal-link:<the slow link>`` likewise on ``one-slow-link``.
4. **Jobs contending** for a shared spine (``shared-spine``): ``heal-switch``
   and ``move-job`` of either job against the generator's truth.
5. **DP size** (``dp-sizes``): ``scale-dp:N`` on the replay of a job
   generated at DP D against the same job generated at DP N.

    python benchmarks/bench_whatif.py [--clusters tiny,demo,baseline,every-ring-crosses,one-slow-link,shared-spine,dp-sizes]
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


def _every_ring_crosses(with_faults: bool):
    """A pure-DP job (TP 8 x DP 8, one server a leaf group) whose every DP ring crosses spine-00, at 0.41x for the
    whole capture: no ring of the job is faster than another."""
    from synthetic.fabric import Fabric
    from synthetic.faults import DegradedSwitch
    from synthetic.generator import ClusterGenerator
    from synthetic.workload import JobSpec

    job = JobSpec("dp8", tp=8, pp=1, dp=8, microbatches=4, fwd_ms=20, grad_bytes=256 << 20, bucket_bytes=64 << 20)
    return ClusterGenerator(Fabric(servers=10, servers_per_group=1, spines=4), [job], duration_s=5.0,
                            faults=[DegradedSwitch("spine-00", 0.0, 1.0, 0.41)], seed=0, with_faults=with_faults, storage_flows_per_s=20)


def _one_slow_link():
    """A pure-DP job (TP 8 x DP 16) over four leaf groups, the leaf uplink most of its DP transfers take at 0.2x
    in the second half (as ``tests/test_whatif.py`` builds it): the replay names the link, not its leaf."""
    from synthetic.fabric import Fabric
    from synthetic.faults import DegradedLink
    from synthetic.generator import ClusterGenerator
    from synthetic.workload import JobSpec

    def gen(faults):
        job = JobSpec("dp16", tp=8, pp=1, dp=16, microbatches=4, fwd_ms=20, grad_bytes=256 << 20, bucket_bytes=64 << 20)
        return ClusterGenerator(Fabric(servers=16, servers_per_group=4, spines=4), [job], duration_s=4.0, faults=faults, seed=0,
                                storage_flows_per_s=20)

    twin = gen([]).generate()
    f, ips = twin.flows, set(twin.topology["ip"].astype(str))
    gpus = f["src"].astype(str).isin(ips) & f["dst"].astype(str).isin(ips)
    dp = f[gpus & f["switches"].astype(str).str.contains("spine")]
    link = dp["switches"].astype(str).str.split("|").map(lambda h: f"{h[0]}>{h[1]}").value_counts().index[0]
    return gen([DegradedLink(link, 0.5, 1.0, 0.2)])


def _generator(name: str, duration_s: float | None):
    from synthetic import preset
    from synthetic.scenarios import SCENARIOS, scenario_generator

    if name == "every-ring-crosses":
        return _every_ring_crosses(True)
    if name == "one-slow-link":
        return _one_slow_link()
    if name in SCENARIOS:
        return scenario_generator(name, seed=0, duration_s=duration_s or 30.0)[0]
    return preset(name, seed=0, duration_s=duration_s)


def counterfactuals(clusters: list[str], duration_s: float | None = None) -> None:
    """Each network scenario against the fault-free twin of its own fault alone (the same seed and random
    draws, that one fault dropped): heal-switch against the twin without the slow switch, remove-stragglers
    against the twin without the slow server. Mean step per job."""
    from synthetic.faults import DegradedLink, DegradedSwitch, SlowServer
    from synthetic.fromtrace import CollectorNoise, collector_view
    from synthetic.scenarios import SCENARIOS

    print("### SYNTHETIC counterfactuals vs the twin of each fault alone (mean step)\n")
    print("| cluster | job | observed (faulty) | heal-switch (heal-link): twin without the switch (link) fault, predicted, error | "
          "remove-stragglers: twin without the slow server, predicted, error | unchanged replay error |")
    print("|---|---|---:|---:|---:|---:|")
    for name in clusters:
        with tempfile.TemporaryDirectory() as d:
            d = Path(d)
            noisy = name in SCENARIOS and SCENARIOS[name][2]
            for tag, drop in (("faulty", None), ("no-switch", (DegradedSwitch, DegradedLink)), ("no-straggler", SlowServer)):
                gen = _generator(name, duration_s)
                if drop is not None and not any(isinstance(f, drop) for f in gen.faults):
                    continue  # the cluster has no such fault
                gen.faults = [f for f in gen.faults if drop is None or not isinstance(f, drop)]
                cl = gen.generate()
                if noisy:
                    cl.flows = collector_view(cl.flows, CollectorNoise(), 0)
                cl.write(d / tag)
                prism(["replay", str(d / tag / "flows.parquet"), "--topology", str(d / tag / "topology.csv"), "--out", str(d / f"r-{tag}"), "--quiet"])
                prism(["whatif", str(d / f"r-{tag}"), "--out", str(d / f"w-{tag}"), "--quiet"])
            faults = pd.read_csv(d / "faulty" / "truth" / "faults.csv")
            topo = ["--topology", str(d / "faulty" / "topology.csv")]
            runs = {"no-switch": [f"heal-switch:{sw}" for sw in faults.loc[faults["kind"] == "slow_switch", "subject"]]
                    + [f"heal-link:{ln}" for ln in faults.loc[faults["kind"] == "slow_link", "subject"]],
                    "no-straggler": ["remove-stragglers"]}
            pred = {}
            for twin, sc in runs.items():
                if (d / f"w-{twin}").is_dir():
                    prism(["whatif", str(d / "r-faulty"), *topo, *[a for x in sc for a in ("--scenario", x)], "--out", str(d / f"p-{twin}"), "--quiet"])
                    pred[twin] = json.loads((d / f"p-{twin}" / "summary.json").read_text())["jobs"]
            base = json.loads((d / "w-faulty" / "summary.json").read_text())["jobs"]
            for job in sorted(base):
                cells = []
                for twin in runs:
                    twin_jobs = json.loads((d / f"w-{twin}" / "summary.json").read_text())["jobs"] if twin in pred else {}
                    if job not in twin_jobs:
                        cells.append("-")
                        continue
                    t, p = twin_jobs[job]["observed_step_s"], pred[twin][job]["predicted_step_s"]
                    cells.append(f"{t * 1e3:.1f} ms, {p * 1e3:.1f} ms, {p / t - 1:+.2%}")
                print(f"| {name} | {job} | {base[job]['observed_step_s'] * 1e3:.1f} ms | {cells[0]} | {cells[1]} | "
                      f"{base[job]['replay_error_mean_pct']:.3f}% |")
    print()


def contention() -> None:
    """Two jobs sharing a degraded spine (:func:`synthetic.presets.shared_spine`): ``heal-switch`` against the
    fault-free twin, ``move-job`` of either job against the cluster generated with it routed around the spine
    (at capacity 1 that is the twin too). Mean step per job."""
    from synthetic.presets import shared_spine

    print("### SYNTHETIC jobs contending for a shared spine (mean step)\n")
    print("| capacity | scenario | job | observed (faulty) | truth | predicted | error |")
    print("|---:|---|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)

        def replayed(tag: str, gen) -> dict:
            """Generator name -> (replay's job id, mean observed step) of the cluster ``gen`` makes."""
            cl = gen.generate()
            cl.write(d / tag)
            prism(["replay", str(d / tag / "flows.parquet"), "--topology", str(d / tag / "topology.csv"), "--out", str(d / f"r-{tag}"), "--quiet"])
            prism(["whatif", str(d / f"r-{tag}"), "--out", str(d / f"w-{tag}"), "--quiet"])
            name = {tuple(v["servers"]): k for k, v in cl.meta["jobs"].items()}
            steps = json.loads((d / f"w-{tag}" / "summary.json").read_text())["jobs"]
            return {name[tuple(j["servers"])]: (j["job_id"], steps[j["job_id"]]["observed_step_s"])
                    for j in json.loads((d / f"r-{tag}" / "summary.json").read_text())["jobs"]}

        twin = replayed("twin", shared_spine(with_faults=False))
        for capacity in (1.0, 0.6):
            faulty = replayed(f"faulty-{capacity}", shared_spine(capacity))
            runs = [("heal-switch:spine-00", "heal-switch:spine-00", twin)]
            for moved in ("dp-a", "dp-b"):
                truth = twin if capacity >= 1 else replayed(f"moved-{moved}-{capacity}", shared_spine(capacity, (moved,)))
                runs.append((f"move-job:{moved}", f"move-job:{faulty[moved][0]}@spine-00", truth))
            for i, (label, sc, truth) in enumerate(runs):
                out = d / f"p-{capacity}-{i}"
                prism(["whatif", str(d / f"r-faulty-{capacity}"), "--topology", str(d / f"faulty-{capacity}" / "topology.csv"),
                       "--scenario", sc, "--out", str(out), "--quiet"])
                pred = json.loads((out / "summary.json").read_text())["jobs"]
                for job, (jid, observed) in sorted(faulty.items()):
                    t, p = truth[job][1], pred[jid]["predicted_step_s"]
                    print(f"| {capacity:g} | `{label}` | {job} | {observed * 1e3:.1f} ms | {t * 1e3:.1f} ms | {p * 1e3:.1f} ms | {p / t - 1:+.2%} |")
    print()


def dp_sizes() -> None:
    """``scale-dp:N`` on the replay of a job generated at DP D, against the same job (same seed) generated at DP N:
    pure DP (TP 8, 2 micro-batches of 5 ms, 512 MiB of gradients a GPU) and TP 8 x PP 2, on 8 servers in one leaf
    group, and the pure-DP job on two groups of 4 (at DP 8 its rings cross the spines). Mean step."""
    from synthetic.fabric import Fabric
    from synthetic.generator import ClusterGenerator
    from synthetic.workload import JobSpec

    print("### SYNTHETIC DP size (mean step)\n")
    print("| job | leaf groups | D -> N | baseline | predicted | truth (the job at N) | error | unchanged step's error | same D |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)

        def replayed(dp: int, pp: int, per_group: int) -> Path:
            out = d / f"dp{dp}-pp{pp}-g{per_group}"
            if not out.is_dir():
                job = JobSpec("j", tp=8, pp=pp, dp=dp, microbatches=2, fwd_ms=5, grad_bytes=512 << 20, bucket_bytes=128 << 20)
                ClusterGenerator(Fabric(servers=8, servers_per_group=per_group, spines=4), [job], duration_s=3.0, seed=0,
                                 storage_flows_per_s=20).generate().write(out)
                prism(["replay", str(out / "flows.parquet"), "--topology", str(out / "topology.csv"), "--out", str(out / "r"), "--quiet"])
            return out

        def whatif(c: Path, sc: str) -> dict:
            out = c / sc.replace(":", "-")
            prism(["whatif", str(c / "r"), "--topology", str(c / "topology.csv"), "--scenario", sc, "--out", str(out), "--quiet"])
            return next(iter(json.loads((out / "summary.json").read_text())["jobs"].values()))

        for label, pp, per_group, d0, n in (("pure DP", 1, 8, 4, 8), ("pure DP", 1, 8, 8, 4), ("pure DP", 1, 8, 2, 8),
                                            ("PP 2", 2, 8, 2, 4), ("PP 2", 2, 8, 4, 2), ("pure DP", 1, 4, 4, 8), ("pure DP", 1, 4, 8, 4)):
            a, b = replayed(d0, pp, per_group), replayed(n, pp, per_group)
            truth = whatif(b, f"scale-dp:{n}")["observed_step_s"]
            pred, same = whatif(a, f"scale-dp:{n}"), whatif(a, f"scale-dp:{d0}")
            base, p = pred["baseline_step_s"], pred["predicted_step_s"]
            print(f"| {label} | {8 // per_group} | {d0} -> {n} | {base * 1e3:.2f} ms | {p * 1e3:.2f} ms | {truth * 1e3:.2f} ms | "
                  f"{p / truth - 1:+.2%} | {base / truth - 1:+.2%} | {same['predicted_step_s'] / same['baseline_step_s'] - 1:+.4%} |")
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
    ap.add_argument("--clusters", default="tiny,demo,baseline,every-ring-crosses,one-slow-link,shared-spine,dp-sizes",
                    help="presets, scenarios of the matrix (30 s), every-ring-crosses, one-slow-link, shared-spine "
                         "(two jobs contending for a spine) and dp-sizes (scale-dp against the job generated at N)")
    args = ap.parse_args()
    clusters = args.clusters.split(",")
    real_traces()
    if SA.is_dir():
        trace_counterfactuals()
    speed()
    counterfactuals([c for c in clusters if c not in ("shared-spine", "dp-sizes")])
    if "shared-spine" in clusters:
        contention()
    if "dp-sizes" in clusters:
        dp_sizes()
