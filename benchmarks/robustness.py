"""Robustness of the inference on traffic with real-world confounders: the scenario matrix.

Runs the whole pipeline (jobs, pair types, steps, diagnosis) over every
scenario of :mod:`synthetic.scenarios` (each confounder alone and all
combined, SYNTHETIC) and a hang-and-restart cluster, several seeds, capture windows of 1, 3 and 10
minutes, faulty and fault-free twins, and over flows DERIVED FROM the real
StragglerAnalysis op traces (real timing). Prints one Markdown table:
jobs ARI, pair-type accuracy, steps recall / spurious / mean duration
error, injected faults found and anomalies no fault explains.

``--stream`` scores the daemon's path instead of the replay's: the same
clusters fed to the monitor in event-time slices, a window at every
window step (the daemon's default window unless ``--window`` and
``--window-step`` say otherwise), scored on the jobs, steps and anomalies
it reports (no pair types: it keeps counts only). ``--slice-flows N``
scores the replay with every job of more than N GPU flows analysed in
time slices of N flows (the path of a job too long for memory).

``--matrix dp`` scores the data-parallel-only shapes instead
(:mod:`synthetic.dpshapes`: DDP with and without ``no_sync``, ZeRO-1,
ZeRO-2, FSDP, HSDP, a 2-server fine-tuning job) at steps of about 0.3 s,
5 s, 45 s and 3 min, each with one slow server and as its fault-free twin
(``--runs faulty,early,fault-free``: and with the slow server from the capture's third step):
jobs ARI, pair types (and the share at or above the uncertain bar), steps
found, spurious, the median step duration error, faults found, anomalies
no fault explains.

    python benchmarks/robustness.py [--scenarios clip,all] [--seeds 0,1,2] [--windows 60,180,600] [--no-traces]
    python benchmarks/robustness.py --scenarios moe,moe-flat,cp --seeds 0 --windows 60 --no-traces  (the modern shapes, by name only)
    python benchmarks/robustness.py --scenarios moe-all,cp-all --no-traces  (beside 3D jobs, with confounders; by name only)
                                    [--stream [--window 120] [--window-step 15]] [--slice-flows N]
    python benchmarks/robustness.py --matrix dp [--shapes ddp,fsdp] [--lengths 0.3s,5s] [--windows 60,180] [--runs faulty,early,fault-free] [--stream] [--cts BYTES]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from prism.analysis.analyse import Settings
from prism.analysis.evaluation import score_cluster, score_stream
from prism.ingest.topology import Topology
from prism.offline.replay import replay
from prism.serve.monitor import MonitorSettings
from synthetic.fromtrace import shared_data_dir

SA = shared_data_dir() / "straggler-analysis"


def run_one(cluster, tmp, name, **replay_kw) -> dict:
    d = Path(tmp) / name
    cluster.write(d)
    r = replay([str(d / "flows.parquet")], Topology.from_csv(d / "topology.csv"), progress=False, **replay_kw)
    return score_cluster(r, cluster)


def run_stream(cluster, name, settings: MonitorSettings, slice_s: float = 0.25, backlog: bool = False, found: dict | None = None) -> dict:
    """The daemon's path: the flows fed to a :class:`Monitor` in event-time slices, a window at every step.

    As at 1x real time (every ``step_s`` of event time gets its window); no
    Kafka (the daemon tests cover it). ``backlog``: as a daemon catching up
    on a full topic (the source has unread records until the last slice),
    whose windows stride a whole window (:meth:`Monitor.catching_up`).
    Scored like a replay, from what the monitor reports: its job map, the
    steps it counted and the anomalies it raised. No pair types (the
    monitor keeps counts only).
    """
    import pyarrow as pa

    from prism.analysis.diagnosis import ANOMALY_COLUMNS
    from prism.ingest.records import RejectCounter, validate_flows
    from prism.serve.monitor import Monitor

    # The monitor keeps its last step_history steps per job, and a young job's steps come all at
    # once (a capture shorter than the window: at the last tick): keep enough of them to score all.
    keep = max(settings.step_history, 4096)
    m = Monitor(Topology.from_frame(cluster.topology), dataclasses.replace(settings, step_history=keep))
    flows = cluster.flows.sort_values("start_ns", kind="stable")
    t = flows["start_ns"].to_numpy()
    cuts = np.searchsorted(t, np.arange(t[0], t[-1] + 1, int(slice_s * 1e9)))[1:]
    for part in np.split(np.arange(len(flows)), cuts):
        if len(part):
            m.ingest(validate_flows(pa.Table.from_pandas(flows.iloc[part], preserve_index=False), RejectCounter(), name))
            m.backlogged = {"0"} if backlog and part[-1] < len(flows) - 1 else set()
            if m.due():
                m.tick()
    m.backlogged = set()
    m.tick(final=True)
    steps = m.steps_frame()
    counted = sum(v.steps for v in m.view.jobs.values())
    if counted > len(steps):
        raise RuntimeError(f"{name}: the monitor counted {counted:,} steps and kept {len(steps):,} ({keep:,} a job): "
                           "a capture this long needs a larger step_history to be scored")
    anomalies = pd.DataFrame([[e.get(c) for c in ANOMALY_COLUMNS] for kind, e in m.events if kind == "anomaly"], columns=ANOMALY_COLUMNS)
    if found is not None:  # what was scored, for scores of the caller's own
        found.update(jobs=m.jobs_, steps=steps)
    return score_stream(m.jobs_, steps, anomalies, cluster)


#: the rows of a hang and a restart, beside the scenarios: the baseline cluster and its faults, plus one job that hangs (one
#: server never joins a collective, at 55% of the capture) and one that restarts from a checkpoint (at 25%, silent for a
#: quarter of the capture, 15 s to 45 s, with one server replaced by a spare); the twin has no fault
HANG_RESTART = "hang-restart"


def hang_restart_cluster(seed: int, duration_s: float, with_faults: bool):
    """The baseline scenario's cluster with a hang and a restart added (their steps placed from the fault-free twin's truth)."""
    from synthetic import Hang, Restart
    from synthetic.scenarios import scenario_generator

    gen, _ = scenario_generator("baseline", seed=seed, duration_s=duration_s, with_faults=with_faults)
    if not with_faults:
        return gen.generate()
    twin = scenario_generator("baseline", seed=seed, duration_s=duration_s, with_faults=False)[0].generate().steps
    t0 = twin["start_ns"].min()

    def step_at(job, frac):
        s = twin[(twin["job_id"] == job) & (twin["end_ns"] >= t0 + frac * duration_s * 1e9)]
        return int(s["step"].iloc[0])

    outage = min(30.0, max(15.0, duration_s / 4))
    gen.faults += [Hang("tp8-dp2", step=step_at("tp8-dp2", 0.55), member=1),
                   Restart("tp8-dp8", step=step_at("tp8-dp8", 0.25), outage_s=outage, replaced_server=3)]
    c = gen.generate()
    c.meta["scenario"] = HANG_RESTART
    return c


#: the row of a slow NIC, beside the scenarios: the baseline cluster and its faults (a degraded switch among them), plus
#: one server whose transfers run 3x slower on every link it uses; the twin has no fault
SLOW_NIC = "slow-nic"


def slow_nic_cluster(seed: int, duration_s: float, with_faults: bool):
    """The baseline scenario's cluster with a slow NIC added (a server of a 3D job, for the whole capture)."""
    from synthetic import SlowNic
    from synthetic.scenarios import scenario_generator

    gen, _ = scenario_generator("baseline", seed=seed, duration_s=duration_s, with_faults=with_faults)
    if with_faults:
        gen.faults += [SlowNic("tp4-pp2-dp4", server=1, factor=3.0)]
    c = gen.generate()
    c.meta["scenario"] = SLOW_NIC
    return c


def fmt(name, seed, window, faulty, row) -> str:
    steps = f"{row.get('steps_found', 0)}/{row.get('true_steps', 0)}"
    recall = row.get("steps_found", 0) / max(row.get("true_steps", 0), 1)
    false = ", ".join(f"{k[6:]} {v}" for k, v in row.items() if k.startswith("false_")) or "0"
    faults = f"{row.get('faults_found', 0)}/{row.get('faults', 0)}" if faulty else "-"
    return (f"| {name} | {seed} | {window} | {'faulty' if faulty else 'fault-free'} | {row['jobs_ari']:.3f} | {_pct(row.get('pair_acc'))} "
            f"| {steps} ({recall:.1%}) | {row.get('steps_spurious', 0)} | {row.get('step_err_mean', float('nan')):.2e} | {faults} | {false} |")


def _pct(share) -> str:
    return "-" if share is None else f"{share:.2%}"


def summary(results: list[tuple]) -> str:
    """One line per scenario and window over its seeds: the worst case, and totals."""
    lines = ["| scenario | window | seeds | jobs ARI (min) | pair types (min) | steps found | spurious | mean step error (max) | faults found | unexplained, faulty runs | anomalies, fault-free twins |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    groups: dict = {}
    for name, seed, window, faulty, row in results:
        groups.setdefault((name, window), []).append((seed, faulty, row))
    for (name, window), rs in groups.items():
        rows = [r for _, _, r in rs]
        found, true = sum(r.get("steps_found", 0) for r in rows), sum(r.get("true_steps", 0) for r in rows)
        ff = sum(r.get("faults_found", 0) for _, f, r in rs if f)
        ft = sum(r.get("faults", 0) for _, f, r in rs if f)
        unexp = [sum(r.get("anomalies_unexplained", 0) for _, f, r in rs if f == want) for want in (True, False)]
        lines.append(f"| {name} | {window} | {len({s for s, _, _ in rs})} | {min(r['jobs_ari'] for r in rows):.3f} | {_pct(min((r['pair_acc'] for r in rows if 'pair_acc' in r), default=None))} "
                     f"| {found:,}/{true:,} ({100 * found / max(true, 1):.2f}%) | {sum(r.get('steps_spurious', 0) for r in rows)} "
                     f"| {max(r.get('step_err_mean', 0) for r in rows):.1e} | {f'{ff}/{ft}' if ft else '-'} | {unexp[0]} | {unexp[1]} |")
    return "\n".join(lines)


def median_step_error(jobs: pd.DataFrame, steps: pd.DataFrame | None, cluster, tolerance: float = 0.01) -> float:
    """Median relative duration error of the found steps (matched as :func:`prism.analysis.evaluation.score_steps` does)."""
    from prism.analysis.evaluation import job_name_map

    if steps is None or not len(steps):
        return float("nan")
    names = job_name_map(jobs, cluster.jobs)
    pred = steps.assign(job=steps["job_id"].map(names))
    edge_at = cluster.meta.get("window_end_ns")
    errs = []
    for job, t in cluster.steps.groupby("job_id"):
        p = pred[pred["job"] == job]
        if edge_at is not None and len(t):
            edge = edge_at - float((t["end_ns"] - t["start_ns"]).median())
            t, p = t[t["end_ns"] <= edge], p[p["end_ns"] <= edge]
        te, tdur = t["end_ns"].to_numpy(), (t["end_ns"] - t["start_ns"]).to_numpy().astype(float)
        pe, pdur = p["end_ns"].to_numpy(), (p["end_ns"] - p["start_ns"]).to_numpy().astype(float)
        if not (len(te) and len(pe)):
            continue
        j = np.clip(np.searchsorted(te, pe), 1, len(te)) - 1
        j = np.where((j + 1 < len(te)) & (np.abs(te[np.minimum(j + 1, len(te) - 1)] - pe) < np.abs(te[j] - pe)), j + 1, j)
        ok = np.abs(te[j] - pe) < tolerance * tdur[j]
        errs.append(np.abs(pdur[ok] - tdur[j[ok]]) / tdur[j[ok]])
    e = np.concatenate(errs) if errs else np.zeros(0)
    return float(np.median(e)) if len(e) else float("nan")


def dp_windows(secs: float, windows: list[float]) -> list[float]:
    """The windows a step length runs in: those holding 6 or more steps, else its own of 8 steps."""
    fit = [w for w in windows if w >= 6 * secs]
    return fit or [8 * secs]


def run_dp(cluster, tmp, name, stream: MonitorSettings | None = None, backlog: bool = False) -> dict:
    """A DP-shapes run: the usual scores plus the share of pair types at or above the uncertain bar and the median step error."""
    from prism.analysis.parallelism import UNCERTAIN_BELOW

    if stream is not None:
        found: dict = {}
        # a shape cut at its layers or micro-batches yields thousands of steps a job: keep them all to score them
        row = run_stream(cluster, name, dataclasses.replace(stream, step_history=max(stream.step_history, 200_000)), backlog=backlog, found=found)
        row["step_err_median"] = median_step_error(found["jobs"], found["steps"], cluster)
        return row
    d = Path(tmp) / name
    cluster.write(d)
    r = replay([str(d / "flows.parquet")], Topology.from_csv(d / "topology.csv"), progress=False)
    row = score_cluster(r, cluster)
    pairs = r.pairs
    row["pair_certain"] = float((pairs["confidence"] >= UNCERTAIN_BELOW).mean()) if pairs is not None and len(pairs) and "confidence" in pairs else float("nan")
    row["step_err_median"] = median_step_error(r.jobs, r.analysis.steps if r.analysis is not None else None, cluster)
    return row


DP_HEADER = ("| shape | family | step | window | run | jobs ARI | pair types (certain) | steps found | spurious | median step error | faults found | unexplained anomalies | flows | seconds |\n"
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")


def fmt_dp(shape, family, length, window, faulty, row, run: str | None = None) -> str:
    true = row.get("true_steps", 0)
    recall = row.get("steps_found", 0) / max(true, 1)
    false = ", ".join(f"{k[6:]} {v}" for k, v in row.items() if k.startswith("false_")) or "0"
    faults = f"{row.get('faults_found', 0)}/{row.get('faults', 0)}" if faulty else "-"
    pairs = "-" if "pair_acc" not in row else f"{row['pair_acc']:.0%} ({row['pair_certain']:.0%})"
    run = run or ("faulty" if faulty else "fault-free")
    return (f"| {shape} | {family} | {length} | {window:g} s | {run} | {row['jobs_ari']:.3f} | {pairs} "
            f"| {row.get('steps_found', 0)}/{true} ({recall:.0%}) | {row.get('steps_spurious', 0)} | {row.get('step_err_median', float('nan')):.1e} "
            f"| {faults} | {false} |")


def main_dp(args) -> int:
    """The DP-shapes matrix (SYNTHETIC, :mod:`synthetic.dpshapes`): every shape x step length, faulty and fault-free."""
    import synthetic.dpshapes as dps
    from synthetic.dpshapes import DP_SHAPES, EARLY_FAULT_STEP, FAMILY, STEP_LENGTHS, dp_cluster

    if args.cts is not None:  # the receivers' clear-to-send (DPJob.cts_bytes); 0: none
        dps.CTS_BYTES = args.cts
    shapes = list(DP_SHAPES) if args.shapes is None else args.shapes.split(",")
    lengths = list(STEP_LENGTHS) if args.lengths is None else args.lengths.split(",")
    bad = (set(shapes) - set(DP_SHAPES)) | (set(lengths) - set(STEP_LENGTHS))
    if bad:
        raise SystemExit(f"unknown DP shape(s) or step length(s) {', '.join(sorted(bad))}; shapes: {', '.join(DP_SHAPES)}; lengths: {', '.join(STEP_LENGTHS)}")
    windows = [float(w) for w in (args.windows or "60,180").split(",")]
    stream = MonitorSettings(window_s=args.window, step_s=args.window_step) if args.stream else None
    # per run: its label, faulty or not, the slow server's first step (None: a third of the window's steps)
    kinds: dict[str, tuple[str, bool, int | None]] = {"faulty": ("faulty", True, None), "early": (f"faulty from step {EARLY_FAULT_STEP}", True, EARLY_FAULT_STEP),
                                                      "fault-free": ("fault-free", False, None)}
    names = args.runs.split(",")
    if set(names) - set(kinds):
        raise SystemExit(f"unknown run(s) {', '.join(sorted(set(names) - set(kinds)))}; runs: {', '.join(kinds)}")
    runs = [kinds[n] for n in names]
    print(DP_HEADER)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in map(int, args.seeds.split(",")):
            for length in lengths:
                for window in dp_windows(STEP_LENGTHS[length][0], windows):
                    for shape in shapes:
                        for label, faulty, from_step in runs:
                            t1 = time.perf_counter()
                            c = dp_cluster(shape, length, seed=seed, duration_s=window, with_faults=faulty, from_step=from_step)
                            row = run_dp(c, tmp, f"{shape}-{length}-{seed}-{window}-{faulty}-{from_step}", stream, args.backlog)
                            print(fmt_dp(shape, FAMILY[DP_SHAPES[shape][0]], length, window, faulty, row, label)
                                  + f" {len(c.flows):,} | {time.perf_counter() - t1:.0f} |", flush=True)
    print(f"\n{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


def main() -> int:
    from synthetic.scenarios import MODERN_SCENARIOS, SCENARIOS, scenario_cluster

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scenarios", default=None, help="comma-separated scenario names (default: every one; 'all' is the scenario with every confounder), "
                    "or 'none' for the real-trace rows only; also, by name only, the modern shapes moe, moe-flat and cp (synthetic.modern: "
                    "MoE all-to-all, ring attention, each alone) and moe-<scenario>, cp-<scenario> (those jobs beside 3D jobs, "
                    "with the scenario's confounders: moe-all, cp-clip, ...)")
    ap.add_argument("--seeds", default=None, help="comma-separated seeds (default 0,1,2; the DP matrix: 0)")
    ap.add_argument("--windows", default=None, help="capture windows in seconds (default 60,180,600; the DP matrix: 60,180, and a window of 8 steps for a step too long for them)")
    ap.add_argument("--matrix", choices=("scenarios", "dp"), default="scenarios",
                    help="scenarios: the confounders of synthetic.scenarios (and the real traces); dp: the data-parallel-only shapes of synthetic.dpshapes")
    ap.add_argument("--shapes", default=None, help="with --matrix dp: comma-separated shapes (default: every one)")
    ap.add_argument("--lengths", default=None, help="with --matrix dp: comma-separated step lengths (default: every one)")
    ap.add_argument("--runs", default="faulty,fault-free",
                    help="with --matrix dp: comma-separated runs of each cell (default %(default)s): faulty (the slow server from a third of the "
                         "window's steps), early (the slow server from the capture's third step), fault-free")
    ap.add_argument("--cts", type=int, default=None, metavar="BYTES",
                    help="with --matrix dp: the clear-to-send each ring edge's receiver sends as it enters a collective, bytes "
                    "(0: none; default: synthetic.dpshapes.CTS_BYTES)")
    ap.add_argument("--no-traces", action="store_true", help="skip the rows derived from the real op traces")
    ap.add_argument("--stream", action="store_true", help="score the daemon's windowed analysis instead of the replay")
    ap.add_argument("--slice-flows", type=int, default=None, metavar="N",
                    help="the replay with every job of more than N GPU flows analysed N flows at a time, in time slices (prism replay --slice-flows)")
    ap.add_argument("--backlog", action="store_true", help="with --stream: as a daemon catching up on a full topic (windows stride a whole window)")
    ap.add_argument("--window", type=float, default=MonitorSettings.window_s, help="with --stream: the daemon's --window, seconds (default %(default)g)")
    ap.add_argument("--window-step", type=float, default=MonitorSettings.step_s, help="with --stream: the daemon's --window.step, seconds (default %(default)g)")
    args = ap.parse_args()
    if args.matrix == "dp":
        args.seeds = args.seeds or "0"
        return main_dp(args)
    args.seeds = args.seeds or "0,1,2"
    args.windows = args.windows or "60,180,600"
    stream = MonitorSettings(window_s=args.window, step_s=args.window_step)
    from synthetic.modern import MODERN_KINDS, modern_cluster

    names = [*SCENARIOS, HANG_RESTART, SLOW_NIC] if args.scenarios is None else ([] if args.scenarios == "none" else args.scenarios.split(","))
    unknown = set(names) - set(SCENARIOS) - {HANG_RESTART, SLOW_NIC} - set(MODERN_KINDS) - set(MODERN_SCENARIOS)
    if unknown:
        ap.error(f"unknown scenario(s) {', '.join(sorted(unknown))}; choose from {', '.join([*SCENARIOS, HANG_RESTART, SLOW_NIC, *MODERN_KINDS, *MODERN_SCENARIOS])}")
    print("| scenario | seed | window | run | jobs ARI | pair types | steps found | spurious | mean step error | faults found | unexplained anomalies |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    t0 = time.perf_counter()
    results = []

    def run(cluster, tmp, name):
        if args.stream:
            return run_stream(cluster, name, stream, backlog=args.backlog)
        return run_one(cluster, tmp, name, **({"settings": Settings(slice_flows=args.slice_flows)} if args.slice_flows else {}))

    def report(label, seed, window, faulty, row):
        results.append((label, seed, window, faulty, row))
        print(fmt(label, seed, window, faulty, row), flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_traces and SA.is_dir():
            from synthetic.fromtrace import CollectorNoise, Straggler, read_trace_job, trace_cluster, with_slow_transfers

            for tp in (8, 2, 1):
                for noise in (None, CollectorNoise()):
                    c = trace_cluster([read_trace_job(SA, "ST", tp=tp), read_trace_job(SA, "SE", tp=tp)], noise=noise)
                    label = f"real traces ST+SE, tp={tp}" + (", collector noise" if noise else "")
                    report(label, 0, "all", False, run(c, tmp, f"trace-{tp}-{noise is not None}"))
            # the faulty twin: one worker per job computes 2x from the 5th step, re-timed by the simulator
            c = trace_cluster([read_trace_job(SA, "ST", tp=8, straggler=Straggler(dp=1, stage=2)),
                               read_trace_job(SA, "SE", tp=8, straggler=Straggler(dp=3, stage=0))], noise=CollectorNoise())
            report("real traces ST+SE, tp=8, collector noise, 2x straggler", 0, "all", True, run(c, tmp, "trace-straggler"))
            # and the straggler's transfers 2x slower too (a slow NIC, SYNTHETIC): the host, not the links it uses
            for server in c.faults["subject"]:
                c = with_slow_transfers(c, server.split("|")[0])
            report("real traces ST+SE, tp=8, collector noise, 2x straggler, its transfers 2x slower", 0, "all", True, run(c, tmp, "trace-slow-nic"))
        for name in names:
            for seed in map(int, args.seeds.split(",")):
                for window in map(float, args.windows.split(",")):
                    for faulty in (True, False):
                        c = (hang_restart_cluster(seed, window, faulty) if name == HANG_RESTART
                             else slow_nic_cluster(seed, window, faulty) if name == SLOW_NIC
                             else modern_cluster(name, seed=seed, duration_s=window, with_faults=faulty) if name in MODERN_KINDS
                             else scenario_cluster(name, seed=seed, duration_s=window, with_faults=faulty))
                        report(name, seed, f"{window:g} s", faulty, run(c, tmp, f"{name}-{seed}-{window}-{faulty}"))
    print("\nSummary (worst case over seeds, totals):\n")
    print(summary(results))
    print(f"\n{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
