"""``prism whatif``: build the graph, replay it unchanged, simulate the scenarios, write the results.

Outputs in ``--out``:

* ``summary.json``: ``{"jobs": {job_id: {"observed_step_s", "replayed_step_s",
  "baseline_step_s", "predicted_step_s", "predicted_speedup", "attribution",
  ...}}, "skipped": {job_id: reason}, "warnings": [...]}``; step times are
  means over the complete steps modelled (observed in the input, simulated
  unchanged, simulated as the scenarios' starting point (op traces: without
  launch delays; network and Kineto: the replay itself), simulated under the
  scenarios); ``predicted_speedup`` is baseline over predicted, and the
  attribution uses the same means, as StragglerAnalysis does;
* ``steps.csv``: per job and step, those step times;
* ``attribution.csv`` (``--attribute``): per job, level and group, the step
  time and slowdown with only that group as observed (:mod:`.attribution`);
* ``timeline.json``: the predicted timeline (Chrome trace; ui.perfetto.dev).
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pandas as pd

from prism.whatif.graph import SimResult, simulate
from prism.whatif.scenarios import Scenario

if TYPE_CHECKING:
    from prism.whatif.netreplay import ReplayGraph
    from prism.whatif.optrace import OpGraph

__all__ = ["WhatIfResult", "whatif_ops", "whatif_replay", "whatif_kineto", "write_outputs"]


@dataclass
class WhatIfResult:
    """What ``prism whatif`` writes: per job a summary, per step the step times, the predicted timeline's
    events, and (with ``--attribute``) the slowdown attribution per group."""

    jobs: dict
    steps: pd.DataFrame
    events: list[dict]
    attribution: pd.DataFrame | None = None
    skipped: dict = field(default_factory=dict)  # job -> why it could not be modelled
    warnings: list = field(default_factory=list)  # about the whole run
    search: dict | None = None  # --search: the summary (.search)
    search_table: pd.DataFrame | None = None  # --search: every configuration (search.csv)
    #: --chakra: the simulated graph (after the scenarios) and its tasks per rank (:mod:`.chakra`), made when asked
    et_tasks: Callable[[], tuple[SimResult, pd.DataFrame]] | None = None


def _natural_key(name: str):
    """'rank 2' before 'rank 10'."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(name))]


def _trace_events(job: str, rows: pd.DataFrame, pid: int = 1) -> list[dict]:
    """Chrome trace events of one job: a process (integer ``pid``) with one named thread per rank or track.

    Integer pid/tid with ``process_name``/``thread_name`` metadata, as in
    the replay's trace: Perfetto and chrome://tracing then show the names
    and keep the tracks in order (string ids are not in the format).
    """
    tracks = sorted(pd.unique(rows["track"].astype(str)), key=_natural_key)
    tid_of = {t: i for i, t in enumerate(tracks, start=1)}
    ev = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"job {job} (predicted)"}},
          {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}}]
    for t, tid in tid_of.items():
        ev.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": t or "other"}})
        ev.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    tids = rows["track"].astype(str).map(tid_of).to_numpy()
    r: Any  # a row: the stubs type its fields as any scalar
    for r, tid in zip(rows.itertuples(index=False), tids):
        ev.append({"name": r.name, "ph": "X", "pid": pid, "tid": int(tid), "ts": round(r.start * 1e6, 3),
                   "dur": round(max(r.dur, 0.0) * 1e6, 3), "args": {"step": int(r.step)}})
    return ev


#: op types reported together in the attribution (a pipeline transfer is one thing, seen from both ends)
_PP_COMM = {"forward-send": "forward-pp-comm", "forward-recv": "forward-pp-comm",
            "backward-send": "backward-pp-comm", "backward-recv": "backward-pp-comm"}


def attribute_ops(g: OpGraph) -> tuple[pd.DataFrame, dict]:
    """An :class:`~.optrace.OpGraph`'s slowdown by worker (rank), DP rank, stage and op type, and M_W, M_S."""
    from prism.whatif.attribution import attribute, worker_and_stage_metrics
    from prism.whatif.scenarios import ideal_op_work

    observed, ideal = g.work(), ideal_op_work(g)

    def mean_step(values):
        return float(g.step_seconds(simulate(g.graph(values, launch_delay=False))).mean())

    o = g.ops
    groups = pd.DataFrame({"worker": o["rank"].to_numpy(), "dp_rank": o["dp_rank"].to_numpy(), "stage": o["stage"].to_numpy(),
                           "optype": o["optype"].map(lambda t: _PP_COMM.get(t, t)).to_numpy()})
    t_base, t_ideal = mean_step(observed), mean_step(ideal)
    table = attribute(mean_step, observed, ideal, groups, t_base, t_ideal)
    summary = {"baseline_step_mean_s": t_base, "ideal_step_mean_s": t_ideal, "slowdown": t_base / t_ideal}
    summary.update(worker_and_stage_metrics(mean_step, observed, ideal, groups["worker"].to_numpy(),
                                            groups["dp_rank"].to_numpy(), groups["stage"].to_numpy(), table,
                                            t_base, t_ideal))
    return table, summary


def _checked_meta(meta: dict) -> dict:
    """``--meta``: dp_size and pp_size, when given, are whole numbers >= 1."""
    out = dict(meta)
    for key in ("dp_size", "pp_size"):
        v = out.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float, str)) or not str(v).isdigit() or int(v) < 1:
            raise ValueError(f"--meta: {key} must be a whole number >= 1, got {v!r}")
        out[key] = int(v)
    return out


def restructure(g: OpGraph, scenarios: list[Scenario], meta: dict) -> tuple[OpGraph, np.ndarray | float, dict, list[str]]:
    """The scenarios that change the graph itself or re-cost it (``microbatches``, ``scale-pp``, ``layers``,
    ``hidden``): the graph the others apply to, a factor on its ops' work, notes for the summary and warnings."""
    from prism.whatif.optrace import OpGraph

    last = {sc.kind: sc for sc in scenarios}
    pp, layers, mb, hidden = last.get("scale-pp"), last.get("layers"), last.get("microbatches"), last.get("hidden")
    from prism.whatif.repartition import fit_layer_models, layer_factors, observed_partition, repartition

    if pp is None and layers is None and hidden is None:
        if mb is None:
            return g, 1.0, {}, []
        # the observed partition rebuilt for M micro-batches: each op's work from its own observation
        part = observed_partition(g.ops, meta)
        try:
            gp = OpGraph(repartition(g, part, part, int(mb.value)))
        except ValueError as e:
            raise ValueError(f"--scenario {mb}: {e}") from None
        observed_m = int(g.ops[g.ops["optype"] == "forward-compute"].groupby(["step", "rank"]).size().max())
        return gp, 1.0, {str(mb): {"observed_microbatches": observed_m, "microbatches": int(mb.value)}}, []

    old = observed_partition(g.ops, meta)
    warnings = []
    if layers is not None and not old.known:
        raise ValueError(f"--scenario {layers}: needs the job's layer count: --meta num_layers (or layers_per_stage)")
    from prism.whatif.hidden import architecture, checked_hidden, hidden_costs, hidden_factors

    arch, h = None, 0.0
    if hidden is not None:
        arch = architecture(meta, str(hidden))
        h = float(checked_hidden(arch, int(hidden.value), str(hidden)))
    if not old.known and (pp is not None or (hidden is not None and old.stages > 1)):
        warnings.append(f"{pp or hidden}: the trace gives no layer counts: the observed {old.stages} stages are assumed to "
                        "hold equal layers (--meta num_layers or layers_per_stage to say otherwise)")
    models = fit_layer_models(g, old)
    costs = models
    if arch is not None:
        costs = hidden_costs(models, arch, h)
    total = float(layers.value) if layers is not None else None
    if pp is not None:
        new = old.even(int(pp.value), total, str(pp))
        try:
            gp = OpGraph(repartition(g, old, new, int(mb.value) if mb else None, models, costs))
        except ValueError as e:
            raise ValueError(f"--scenario {pp}: {e}") from None
        factor: np.ndarray | float = 1.0
    else:
        new = old.scaled(total, str(layers)) if total is not None else old
        gp = g if mb is None else OpGraph(repartition(g, old, old, int(mb.value), models))
        factor = layer_factors(gp.ops, models, old, new, costs)
    notes: dict[str, Any] = {}
    if pp is not None or layers is not None:
        note: dict[str, Any] = {"observed_stages": old.stages, "stages": new.stages,
                "observed_layers_per_stage": list(old.layers) if old.known else None,
                "layers_per_stage": list(new.layers) if old.known else [round(x, 6) for x in new.layers],
                "layers_known": old.known, "layer_model": {k: m.as_dict() for k, m in models.items()}}
        if not old.known:
            note["layers_per_stage_unit"] = "one observed stage's layers"
        notes[str(pp if pp is not None else layers)] = note
    if arch is not None:
        # the op types outside the layer model (pipeline transfers, embedding and layernorm all-reduces)
        factor = factor * hidden_factors(gp.ops, arch, h)
        f = arch.factors(h)
        notes[str(hidden)] = {"observed_hidden_size": arch.hidden, "hidden_size": int(h),
                              "seq_length": arch.seq_length, "ffn_hidden_size_ratio": arch.ffn_ratio, "swiglu": arch.swiglu,
                              "layer_flops_factor": round(f["flops"], 6), "layer_params_factor": round(f["params"], 6),
                              "activation_factor": round(f["linear"], 6),
                              "layer_model": {k: m.as_dict() for k, m in models.items()}}
    return gp, factor, notes, warnings


def whatif_ops(trace_path: str | Path, meta: dict | None, scenarios: list[Scenario], attribution: bool = False) -> WhatIfResult:
    """Op-level trace -> its :class:`WhatIfResult`.

    ``replayed``: the graph with observed durations and launch delays (fidelity); ``baseline``: observed
    work without launch delays; ``predicted``: the scenarios' work without launch delays. Compare
    predicted with baseline. With ``attribution``, the summary holds the slowdown attribution (S, M_W,
    M_S) and the result its per-group table.
    """
    from prism.whatif.optrace import OpGraph, observed_step_times, read_op_trace
    from prism.whatif.scenarios import apply_op_scenarios

    meta = _checked_meta(meta or {})
    ops = read_op_trace(trace_path)
    job = str(meta.get("trial_name") or Path(trace_path).stem)
    t0 = time.perf_counter()
    g = OpGraph(ops)
    replay = simulate(g.graph())
    baseline = simulate(g.graph(g.work(), launch_delay=False))
    gp, factor, notes, warnings = restructure(g, scenarios, meta)
    pred = simulate(gp.graph(apply_op_scenarios(gp, scenarios, meta.get("dp_size")) * factor, launch_delay=False)) if scenarios else replay
    sim_s = time.perf_counter() - t0
    observed = observed_step_times(ops)
    steps = pd.DataFrame({
        "job_id": job,
        "step": observed.index,
        "observed_s": observed.to_numpy(),
        "replayed_s": g.step_seconds(replay).reindex(observed.index).to_numpy(),
        "baseline_s": g.step_seconds(baseline).reindex(observed.index).to_numpy(),
        "predicted_s": gp.step_seconds(pred).reindex(observed.index).to_numpy(),
    })
    err = (steps["replayed_s"] / steps["observed_s"] - 1).abs()
    summary = {
        "source": "ops", "steps": len(steps), "ops": len(ops), "tasks": int(g.n_nodes),
        "observed_step_s": float(steps["observed_s"].mean()),
        "replayed_step_s": float(steps["replayed_s"].mean()),
        "baseline_step_s": float(steps["baseline_s"].mean()),
        "predicted_step_s": float(steps["predicted_s"].mean()),
        "predicted_speedup": float(steps["baseline_s"].mean() / steps["predicted_s"].mean()) if scenarios else 1.0,
        "replay_error_mean_pct": round(float(err.mean() * 100), 4),
        "replay_error_max_pct": round(float(err.max() * 100), 4),
        "scenarios": [str(s) for s in scenarios],
        "simulation_seconds": round(sim_s, 3),
    }
    if notes:
        from prism.whatif.repartition import bubble_fraction

        summary["scenario_notes"] = notes
        summary["baseline_bubble_fraction"] = round(bubble_fraction(g, baseline), 6)
        summary["predicted_bubble_fraction"] = round(bubble_fraction(gp, pred), 6)
    if warnings:
        summary["warnings"] = warnings
    table = None
    if attribution:
        table, summary["attribution"] = attribute_ops(g)
        table.insert(0, "job_id", job)
    # predicted timeline: each op at its node's simulated time, on its rank
    node = gp.node
    # steps were traced separately (each from 0): lay them out one after another
    finish = pred.step_times().set_index("step")["finish"]
    offset = (finish.cumsum() - finish).reindex(gp.ops["step"]).to_numpy()
    start = pred.start[node] + offset
    rows = pd.DataFrame({"name": gp.ops["optype"].to_numpy(), "track": "rank " + gp.ops["rank"].astype(str),
                         "start": start, "dur": pred.graph.duration[node], "step": gp.ops["step"].to_numpy()})
    def et_tasks() -> tuple[SimResult, pd.DataFrame]:
        from prism.whatif.chakra import op_tasks

        tasks = op_tasks(gp)
        if np.ndim(factor):
            # layers:L and hidden:H re-cost a communication op in proportion to the bytes it moves: its size follows
            size = tasks["comm_size"].to_numpy(np.float64)
            tasks["comm_size"] = np.where(size >= 0, np.round(size * factor), -1).astype(np.int64)
        return pred, tasks

    return WhatIfResult({job: summary}, steps, _trace_events(job, rows), table, et_tasks=et_tasks)


def attribute_replay(g: ReplayGraph, anomalies: pd.DataFrame | None = None) -> tuple[pd.DataFrame, dict]:
    """A :class:`~.netreplay.ReplayGraph`'s slowdown by DP ring, stage (the servers a ring spans), pipeline,
    server and task kind.

    Units: per step, each ring's *base* work (its work less the step's pipeline lag), each ring's
    collective, and each pipeline's *lag* (how much later than the job's other pipelines its traffic
    ended, :meth:`~.netreplay.ReplayGraph.pipeline_lag`); a ring's work is its base plus the step's largest
    lag. Ideal: a ring's base at its median over the steps (a pipeline's stages differ by design), every
    collective at the job's median, no lag. A server gets the rings it is in and the lag of its pipelines;
    in the steps of a ``slow_group`` anomaly, the lag of the pipeline holding the named server is that
    server's alone (the network places a lag on a stage only through that diagnosis)."""
    from prism.whatif.attribution import attribute

    nw, n_s = len(g.work), g.n_s
    lag = g.pipeline_lag()  # (steps, pipelines)
    n_p = lag.shape[1]
    big = lag.max(axis=1) if n_p else np.zeros(n_s)
    base = g.work - big[g.step_i]
    observed = np.concatenate([base, g.coll, lag.ravel()])
    ring_median = pd.Series(base).groupby(g.ring_of).transform("median").to_numpy()
    ideal = np.concatenate([ring_median, np.full(nw, np.median(g.coll)), np.zeros(lag.size)])

    def mean_step(values):
        b, c = values[:nw], values[nw:2 * nw]
        top = values[2 * nw:].reshape(n_s, n_p).max(axis=1) if n_p else np.zeros(n_s)
        return float(g.simulated_steps(simulate(g.graph(np.maximum(b + top[g.step_i], 0.0), c))).mean())

    ring = np.tile(np.asarray(g.rings, object)[g.ring_of], 2)
    servers = g.phases.drop_duplicates("group").set_index("group")["servers"].astype(str)
    units = pd.DataFrame({"unit": np.arange(2 * nw), "ring": ring})
    lag_units = pd.DataFrame({"unit": 2 * nw + np.arange(lag.size), "pipeline": np.tile(np.asarray(g.pipelines, object), n_s),
                              "step": np.repeat(g.steps["step"].to_numpy(), n_p)})
    long = [units.assign(level="ring", key=ring)[["level", "key", "unit"]],
            units.assign(level="stage", key=units["ring"].map(servers))[["level", "key", "unit"]]]
    if n_p:
        long.append(lag_units.assign(level="pipeline", key=lag_units["pipeline"])[["level", "key", "unit"]])
    per_server = units.assign(key=units["ring"].map(servers).str.split("|")).explode("key")
    pipe_server = lag_units.assign(key=lag_units["pipeline"].str.split("|"))
    for named, lo, hi, _ in g.slow_groups(anomalies):
        holds = np.array([bool(named & set(p.split("|"))) for p in lag_units["pipeline"]], bool)
        hit = ((lag_units["step"] >= lo) & (lag_units["step"] <= hi)).to_numpy() & holds
        pipe_server.loc[hit, "key"] = pd.Series([[k for k in ks if k in named] for ks in pipe_server.loc[hit, "key"]],
                                                index=pipe_server.index[hit], dtype=object)
    per_server = pd.concat([per_server[["key", "unit"]], pipe_server.explode("key")[["key", "unit"]]], ignore_index=True)
    long.append(per_server.assign(level="server")[["level", "key", "unit"]])
    kind = np.r_[np.full(nw, "work"), np.full(nw, "DP collective"), np.full(lag.size, "pipeline lag")]
    long.append(pd.DataFrame({"level": "kind", "key": kind, "unit": np.arange(len(observed))}))
    t_base, t_ideal = mean_step(observed), mean_step(ideal)
    table = attribute(mean_step, observed, ideal, pd.concat(long, ignore_index=True), t_base, t_ideal)
    return table, {"baseline_step_mean_s": t_base, "ideal_step_mean_s": t_ideal, "slowdown": t_base / t_ideal}


def whatif_replay(replay_dir: str | Path, scenarios: list[Scenario], topology: str | Path | None = None, attribution: bool = False) -> WhatIfResult:
    """``prism replay`` output -> its :class:`WhatIfResult`.

    A job the network cannot model (no DP collective seen, or never every ring in one step) is not
    dropped: ``WhatIfResult.skipped`` names it with the reason. A job modelled from fewer than half of
    its steps, or a ``heal-switch`` without a topology, carries a warning.
    """
    from prism.whatif.netreplay import ReplayGraph, contention, element_kind, read_replay

    rep = read_replay(replay_dir, topology)
    jobs, tables, events, skipped, attributions, run_warnings = {}, [], [], dict(rep["invalid"]), [], []
    for sc in scenarios:
        if sc.kind not in ("remove-stragglers", "heal-switch", "heal-link", "move-job", "scale-comm", "scale-dp"):
            raise ValueError(f"--scenario {sc}: not available for network replays (use remove-stragglers, heal-switch:NAME, "
                             "heal-link:A>B, move-job:JOB@NAME, scale-comm:X, scale-dp:N)")
        if sc.kind in ("heal-switch", "heal-link", "move-job") and rep["topology"] is None:
            run_warnings.append(f"{sc} without --topology assumes every DP ring crosses the {element_kind(sc.value)}")
    graphs, built = {}, {}
    for job in sorted(rep["steps"]["job_id"].unique()):
        t0 = time.perf_counter()
        try:
            graphs[job] = ReplayGraph(job, rep["steps"], rep["phases"])
        except ValueError as e:
            skipped[job] = str(e)
        built[job] = time.perf_counter() - t0
    # jobs sharing a switch: moving one off it changes the others' share, so it is measured over every job first
    moves = {}
    for sc in scenarios:
        if sc.kind == "move-job":
            moved, _, name = sc.value.rpartition("@")
            try:
                moves[str(sc)] = (name, *contention(graphs, moved, name, rep))
            except ValueError as e:
                raise ValueError(f"--scenario {sc}: {e}") from None
    for job, g in graphs.items():
        t0 = time.perf_counter() - built[job]
        warnings = []
        if g.steps_seen and len(g.steps) < 0.5 * g.steps_seen:
            warnings.append(f"only {len(g.steps)} of {g.steps_seen} steps have every DP ring's collective: the step "
                            "cut may be wrong (e.g. per micro-batch), so the prediction is uncertain")
        if g.dp_span > 0.5:
            warnings.append(f"its DP traffic spans {g.dp_span:.0%} of the step (parameters all-gathered at the start, or "
                            "buckets overlapping the backward): the network cannot tell its work from its collectives, "
                            "so remove-stragglers and the attribution are uncertain")
        base = simulate(g.graph())
        work, coll = g.work, g.coll
        notes: dict = {}
        for sc in scenarios:
            if sc.kind == "remove-stragglers":
                work = g.remove_stragglers(rep["anomalies"], work)
            elif sc.kind in ("heal-switch", "heal-link"):
                coll, work, how = g.heal_switch(sc.value, rep["switches"], rep["topology"], coll, work, kind=sc.kind[5:],
                                                pairs=rep["pairs"])
                how.pop("share")  # the share a job had of the switch matters to move-job only
                notes[str(sc)] = how
            elif sc.kind == "move-job":
                name, gains, shared = moves[str(sc)]
                coll, work, how = g.heal_switch(name, rep["switches"], rep["topology"], coll, work, kind=element_kind(name),
                                                pairs=rep["pairs"], gain=gains[job])
                notes[str(sc)] = dict(how, **shared, gain="healed" if np.isinf(gains[job]) else round(gains[job], 4))
            elif sc.kind == "scale-comm":
                coll = coll * float(sc.value)
            elif sc.kind == "scale-dp":
                dp, exact = g.dp_size(rep["shapes"], rep["pairs"])
                if dp is None:
                    raise ValueError(f"--scenario {sc}: job {job}: its DP size is unknown (no summary.json with dp, nor DP "
                                     "pairs in pairs.csv)")
                if not exact:
                    warnings.append(f"{sc}: DP {dp} is a lower bound (a ring runs partly on NVLink, or the replay did not say): "
                                    "the collectives may be re-costed from the wrong size")
                coll, notes[str(sc)] = g.scale_dp(int(sc.value), dp, coll, rep["switches"], rep["topology"], rep["pairs"])
        pred = simulate(g.graph(work, coll))
        t = pd.DataFrame({"job_id": job, "step": g.steps["step"].to_numpy(), "observed_s": g.observed(),
                          "replayed_s": g.simulated_steps(base), "predicted_s": g.simulated_steps(pred)})
        tables.append(t)
        err = (t["replayed_s"] / t["observed_s"] - 1).abs()
        jobs[job] = {
            "source": "network", "steps": len(t), "steps_seen": g.steps_seen, "dp_rings": g.n_r,
            "observed_step_s": float(t["observed_s"].mean()), "replayed_step_s": float(t["replayed_s"].mean()),
            # on the network the scenarios start from the observed work as replayed: the baseline is the replay
            "baseline_step_s": float(t["replayed_s"].mean()), "predicted_step_s": float(t["predicted_s"].mean()),
            "predicted_speedup": float(t["replayed_s"].mean() / t["predicted_s"].mean()) if scenarios else 1.0,
            "replay_error_mean_pct": round(float(err.mean() * 100), 4), "replay_error_max_pct": round(float(err.max() * 100), 4),
            "scenarios": [str(s) for s in scenarios], "scenario_notes": notes, "warnings": warnings,
        }
        if attribution:
            table, jobs[job]["attribution"] = attribute_replay(g, rep["anomalies"])
            table.insert(0, "job_id", job)
            attributions.append(table)
        jobs[job]["simulation_seconds"] = round(time.perf_counter() - t0, 3)
        gr = pred.graph
        assert gr.proc is not None  # ReplayGraph.graph sets every node's processor
        rows = pd.DataFrame({"name": gr.label, "track": np.where(gr.proc >= 0, pd.Series(gr.proc).map(dict(enumerate(g.rings))).fillna("").to_numpy(), "steps"),
                             "start": pred.start, "dur": gr.duration, "step": gr.step})
        events += _trace_events(job, rows[rows["dur"] > 0], pid=len(jobs))
    if not jobs:
        reasons = "; ".join(f"{j}: {r}" for j, r in skipped.items()) or "steps.csv has no job"
        raise ValueError(f"{replay_dir}: no job can be modelled ({reasons})")
    return WhatIfResult(jobs, pd.concat(tables, ignore_index=True), events,
                        pd.concat(attributions, ignore_index=True) if attributions else None, skipped, run_warnings)


def whatif_kineto(sources: list[str | Path], scenarios: list[Scenario], partial: bool = False) -> WhatIfResult:
    """PyTorch profiler (Kineto) traces, one per rank -> their :class:`WhatIfResult` (:mod:`.kineto`).

    ``replayed``: the graph with measured durations (fidelity: compare with ``observed``); the scenarios start from
    it (``baseline`` is the replay). Step times are the job's: from the earliest rank's ``ProfilerStep#N`` begin to
    the last end of a host call or GPU operation of step N on any rank.
    """
    from prism.whatif.graph import GraphCycleError
    from prism.whatif.kineto import KinetoGraph, read_kineto
    from prism.whatif.scenarios import apply_kineto_scenarios

    ranks = read_kineto(sources, partial=partial)
    names = sorted({Path(r.path).parent.name or Path(r.path).name for r in ranks})
    job = names[0] if len(names) == 1 else "kineto"
    t0 = time.perf_counter()
    warnings = []
    g = KinetoGraph(ranks, partial=partial)
    try:
        replay = simulate(g.graph())
    except GraphCycleError:
        # inferred cross-stream waits can close a cycle on timestamps that tie: model without them
        g = KinetoGraph(ranks, partial=partial, wait_event_edges=False, inferred_edges=False)
        try:
            replay = simulate(g.graph())
        except GraphCycleError as e:
            raise ValueError(f"{', '.join(r.path for r in ranks)}: the dependencies read from the traces form a cycle ({e})") from e
        warnings.append("the cross-stream waits inferred from the traces formed a cycle: modelled without them (stream order, "
                        "launches, host waits and collectives only)")
    pred = simulate(g.graph(apply_kineto_scenarios(g, scenarios))) if scenarios else replay
    sim_s = time.perf_counter() - t0
    obs, rep, prd = g.observed_steps(), g.simulated_steps(replay), g.simulated_steps(pred)
    job_steps = obs.groupby("step")["job_step_s"].first()
    steps = pd.DataFrame({"job_id": job, "step": job_steps.index, "observed_s": job_steps.to_numpy(),
                          "replayed_s": rep.groupby("step")["job_step_s"].first().reindex(job_steps.index).to_numpy()})
    steps["baseline_s"] = steps["replayed_s"]
    steps["predicted_s"] = prd.groupby("step")["job_step_s"].first().reindex(job_steps.index).to_numpy()
    err = (steps["replayed_s"] / steps["observed_s"] - 1).abs()
    rank_err = (rep["step_s"] / obs["step_s"] - 1).abs()
    if partial and ranks[0].world_size and len(ranks) < ranks[0].world_size:
        warnings.append(f"{len(ranks)} of {ranks[0].world_size} ranks: a collective's last arrival among the ranks given may "
                        "not be the last one, so part of its wait counts as its transfer")
    if g.clock_spread_us > 50:
        warnings.append(f"the members of a collective end {g.clock_spread_us:.0f} us apart (median): the ranks' clocks may not "
                        "agree, so the last arrival and the transfers are uncertain")
    kinds = g.collectives.groupby(["comm", "kind"])["instance"].nunique() if len(g.collectives) else pd.Series(dtype=int)
    summary = {
        "source": "kineto", "ranks": len(ranks), "steps": len(steps), "step_ids": [int(x) for x in g.step_ids],
        "gpu_ops": int(g.is_gpu.sum()), "host_calls": int((g.items["kind"] == "call").sum()), "tasks": int(g.n_nodes),
        "collectives": {f"{c}/{k}": int(n) for c, k, n in zip(kinds.index.get_level_values(0), kinds.index.get_level_values(1), kinds.to_numpy())}
        if len(kinds) else {},
        "clock_spread_us": round(g.clock_spread_us, 3),
        "launch_latency_us": {str(k): round(v, 3) for k, v in g.launch_latency_us.items()},
        "observed_step_s": float(steps["observed_s"].mean()), "replayed_step_s": float(steps["replayed_s"].mean()),
        "baseline_step_s": float(steps["baseline_s"].mean()), "predicted_step_s": float(steps["predicted_s"].mean()),
        "predicted_speedup": float(steps["baseline_s"].mean() / steps["predicted_s"].mean()) if scenarios else 1.0,
        "replay_error_mean_pct": round(float(err.mean() * 100), 4), "replay_error_max_pct": round(float(err.max() * 100), 4),
        "replay_error_rank_max_pct": round(float(rank_err.max() * 100), 4),
        "scenarios": [str(s) for s in scenarios], "warnings": warnings, "simulation_seconds": round(sim_s, 3),
    }
    it = g.items
    keep = (it["kind"] == "gpu").to_numpy() | (it["kind"] == "call").to_numpy()
    rows = pd.DataFrame({"name": it["name"].to_numpy(), "track": "rank " + it["rank"].astype(str) + " " + it["track"].astype(str),
                         "start": pred.start[g.node], "dur": pred.finish[g.node] - pred.start[g.node], "step": it["step"].to_numpy()})[keep]
    def et_tasks() -> tuple[SimResult, pd.DataFrame]:
        from prism.whatif.chakra import kineto_tasks

        return pred, kineto_tasks(g)

    return WhatIfResult({job: summary}, steps, _trace_events(job, rows), et_tasks=et_tasks)


def write_outputs(out: str | Path, result: WhatIfResult) -> None:
    """``summary.json`` (jobs, and the jobs not modelled with why), ``steps.csv``, ``timeline.json`` and, with
    an attribution, ``attribution.csv``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"jobs": result.jobs, "skipped": result.skipped, "warnings": result.warnings}
    if result.search is not None:
        summary["search"] = result.search
    if result.search_table is not None:
        result.search_table.to_csv(out / "search.csv", index=False)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    result.steps.to_csv(out / "steps.csv", index=False)
    if result.attribution is not None:
        result.attribution.to_csv(out / "attribution.csv", index=False)
    (out / "timeline.json").write_text(json.dumps({"traceEvents": result.events, "displayTimeUnit": "ms"}))
