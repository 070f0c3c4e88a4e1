"""``prism whatif``: build the graph, replay it unchanged, simulate the scenarios, write the results.

Outputs in ``--out``:

* ``summary.json``: ``{"jobs": {job_id: {"observed_step_s", "replayed_step_s",
  "predicted_step_s", ...}}}``, medians over complete steps (observed in the
  input, simulated unchanged, simulated under the scenarios);
* ``steps.csv``: per job and step, the three step times;
* ``timeline.json``: the predicted timeline (Chrome trace; ui.perfetto.dev).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from .graph import simulate
from .scenarios import Scenario

__all__ = ["whatif_ops", "whatif_replay", "write_outputs"]


def _trace_events(job: str, rows: pd.DataFrame) -> list[dict]:
    """Chrome trace complete events: one per (op or task) on its rank/track."""
    ev = [{"name": "process_name", "ph": "M", "pid": job, "args": {"name": f"job {job} (predicted)"}}]
    for r in rows.itertuples(index=False):
        ev.append({"name": r.name, "ph": "X", "pid": job, "tid": str(r.track), "ts": round(r.start * 1e6, 3),
                   "dur": round(max(r.dur, 0.0) * 1e6, 3), "args": {"step": int(r.step)}})
    return ev


def whatif_ops(trace_path, meta: dict | None, scenarios: list[Scenario]) -> tuple[dict, pd.DataFrame, list[dict]]:
    """Op-level trace -> (summary of the job, per-step table, trace events)."""
    from .optrace import OpGraph, observed_step_times, read_op_trace
    from .scenarios import apply_op_scenarios

    meta = meta or {}
    ops = read_op_trace(trace_path)
    job = str(meta.get("trial_name") or Path(trace_path).stem)
    t0 = time.perf_counter()
    g = OpGraph(ops)
    base = simulate(g.graph())
    gp = g
    for sc in scenarios:
        if sc.kind == "microbatches":
            from .schedule import rebuild_microbatches

            gp = OpGraph(rebuild_microbatches(gp.ops, int(sc.arg), meta.get("pp_size")))
    pred = simulate(gp.graph().with_durations(apply_op_scenarios(gp, scenarios, meta.get("dp_size")))) if scenarios else base
    sim_s = time.perf_counter() - t0
    observed = observed_step_times(ops)
    steps = pd.DataFrame({
        "job_id": job,
        "step": observed.index,
        "observed_s": observed.to_numpy(),
        "replayed_s": g.step_seconds(base).reindex(observed.index).to_numpy(),
        "predicted_s": gp.step_seconds(pred).reindex(observed.index).to_numpy(),
    })
    err = (steps["replayed_s"] / steps["observed_s"] - 1).abs()
    summary = {
        "source": "ops", "steps": len(steps), "ops": len(ops), "tasks": int(g.n_nodes),
        "observed_step_s": float(steps["observed_s"].median()),
        "replayed_step_s": float(steps["replayed_s"].median()),
        "predicted_step_s": float(steps["predicted_s"].median()),
        "replay_error_mean_pct": round(float(err.mean() * 100), 4),
        "replay_error_max_pct": round(float(err.max() * 100), 4),
        "scenarios": [str(s) for s in scenarios],
        "simulation_seconds": round(sim_s, 3),
    }
    # predicted timeline: each op at its node's simulated time, on its rank
    node = gp.node
    # steps were traced separately (each from 0): lay them out one after another
    finish = pred.step_times().set_index("step")["finish"]
    offset = (finish.cumsum() - finish).reindex(gp.ops["step"]).to_numpy()
    start = pred.start[node] + offset
    rows = pd.DataFrame({"name": gp.ops["optype"].to_numpy(), "track": "rank " + gp.ops["rank"].astype(str),
                         "start": start, "dur": pred.graph.duration[node], "step": gp.ops["step"].to_numpy()})
    return {job: summary}, steps, _trace_events(job, rows)


def whatif_replay(replay_dir, scenarios: list[Scenario], topology=None) -> tuple[dict, pd.DataFrame, list[dict]]:
    """``prism replay`` output -> (summary per job, per-step table, trace events)."""
    from .netreplay import ReplayGraph, read_replay

    rep = read_replay(replay_dir, topology)
    jobs, tables, events = {}, [], []
    for sc in scenarios:
        if sc.kind not in ("remove-stragglers", "heal-switch", "scale-comm"):
            raise ValueError(f"--scenario {sc}: not available for network replays (use remove-stragglers, heal-switch:NAME, scale-comm:X)")
    for job in sorted(rep["steps"]["job_id"].unique()):
        t0 = time.perf_counter()
        try:
            g = ReplayGraph(job, rep["steps"], rep["phases"])
        except ValueError:
            continue  # a job whose rings were never all seen in one step has no graph
        base = simulate(g.graph())
        work, coll = g.work, g.coll
        for sc in scenarios:
            if sc.kind == "remove-stragglers":
                work = g.remove_stragglers(rep["anomalies"], work)
            elif sc.kind == "heal-switch":
                coll, work = g.heal_switch(sc.arg, rep["switches"], rep["topology"], coll, work)
            elif sc.kind == "scale-comm":
                coll = coll * float(sc.arg)
        pred = simulate(g.graph(work, coll))
        t = pd.DataFrame({"job_id": job, "step": g.steps["step"].to_numpy(), "observed_s": g.observed(),
                          "replayed_s": g.simulated_steps(base), "predicted_s": g.simulated_steps(pred)})
        tables.append(t)
        err = (t["replayed_s"] / t["observed_s"] - 1).abs()
        jobs[job] = {
            "source": "network", "steps": len(t), "dp_rings": g.n_r,
            "observed_step_s": float(t["observed_s"].median()), "replayed_step_s": float(t["replayed_s"].median()),
            "predicted_step_s": float(t["predicted_s"].median()),
            "replay_error_mean_pct": round(float(err.mean() * 100), 4), "replay_error_max_pct": round(float(err.max() * 100), 4),
            "scenarios": [str(s) for s in scenarios], "simulation_seconds": round(time.perf_counter() - t0, 3),
        }
        gr = pred.graph
        rows = pd.DataFrame({"name": gr.label, "track": np.where(gr.proc >= 0, pd.Series(gr.proc).map(dict(enumerate(g.rings))).fillna("").to_numpy(), "steps"),
                             "start": pred.start, "dur": gr.duration, "step": gr.step})
        events += _trace_events(job, rows[rows["dur"] > 0])
    if not jobs:
        raise ValueError(f"{replay_dir}: no job with a complete step timeline (steps.csv and DP phases)")
    return jobs, pd.concat(tables, ignore_index=True), events


def write_outputs(out, jobs: dict, steps: pd.DataFrame, events: list[dict]) -> None:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps({"jobs": jobs}, indent=2) + "\n")
    steps.to_csv(out / "steps.csv", index=False)
    (out / "timeline.json").write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
