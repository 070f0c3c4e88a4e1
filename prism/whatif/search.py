"""``prism whatif --search``: pipeline stages x DP size x micro-batches under a GPU budget, from one op trace.

Every configuration (TP fixed at ``--meta`` ``tp_size``; PP x DP x TP GPUs
within ``--gpus``) is predicted with the graph scenarios
``scale-pp:PP``, ``microbatches:M``, ``scale-dp:DP`` (:mod:`.repartition`)
and ranked by throughput per GPU: samples per second per GPU relative to
the observed job (a sample: one micro-batch's worth of a pipeline, the
micro-batch size fixed), ``M / (PP x step)`` over the observed one. By
default the global batch stays the observed one (``DP x M`` micro-batches),
so M follows from DP; ``microbatches`` searches given counts instead.

Pruning, before simulating:

* **cannot fit**: a GPU would hold more than the observed job's (times
  ``headroom``) of either model state, assumed Megatron's distributed
  optimizer (bf16 parameters and fp32 gradients per GPU, 6 bytes a
  parameter, fp32 Adam state over the DP group, 12 / DP), or 1F1B
  activations (the first stage keeps ``min(PP, M)`` micro-batches of its
  layers);
* **cannot win**: its best possible throughput (the longest stage's
  compute for M micro-batches, less 5%, no bubble and no communication) is
  below the ``top``-th best found so far (candidates are simulated best
  bound first);
* the layers do not split over PP stages, or the global batch over DP;
* **cannot simulate**: the rebuilt trace would be too large.

Each simulated configuration uses the first ``steps`` steps of the trace.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from prism.whatif.graph import simulate
from prism.whatif.scenarios import Scenario

__all__ = ["search_configs", "candidates"]


def _powers_of_two_and(limit: int, extra: int) -> list[int]:
    out = {1 << i for i in range(int(math.log2(limit)) + 1) if (1 << i) <= limit}
    if extra <= limit:
        out.add(extra)
    return sorted(out)


def _plain(d: dict) -> dict:
    """numpy scalars as Python's (for JSON)."""
    return {str(k): v.item() if isinstance(v, np.generic) else v for k, v in d.items()}


def candidates(gpus: int, tp: int, pp0: int, dp0: int, m0: int, microbatches: list[int] | None,
               layers: int | None) -> list[tuple[int, int, int, str]]:
    """(PP, DP, M, why not) for each configuration within the budget; ``why not`` is empty for a runnable one."""
    out = []
    budget = gpus // tp
    for pp in _powers_of_two_and(budget, pp0):
        for dp in _powers_of_two_and(budget // pp, dp0):
            for m in (microbatches or [dp0 * m0 // dp if dp0 * m0 % dp == 0 else 0]):
                why = ""
                if m < 1:
                    why = f"does not split: the global batch ({dp0 * m0} micro-batches) over DP {dp}"
                elif layers is not None and layers % pp:
                    why = f"does not split: {layers} layers over {pp} stages"
                out.append((pp, dp, m, why))
    return out


def search_configs(trace_path: str | Path, meta: dict, gpus: int, microbatches: list[int] | None = None,
                   steps: int = 4, headroom: float = 1.0, top: int = 10,
                   progress: Callable[[str], None] | None = None) -> tuple[pd.DataFrame, dict]:
    """Every configuration: its prediction or why it was pruned (a table, best first) and a summary."""
    from prism.whatif.optrace import OpGraph, read_op_trace
    from prism.whatif.repartition import fit_layer_models, observed_partition
    from prism.whatif.run import restructure
    from prism.whatif.scenarios import apply_op_scenarios

    meta = dict(meta)
    for key in ("dp_size", "pp_size", "tp_size"):
        v = meta.get(key)
        if v is not None and (isinstance(v, bool) or not str(v).isdigit() or int(v) < 1):
            raise ValueError(f"--meta: {key} must be a whole number >= 1, got {v!r}")
        if v is not None:
            meta[key] = int(v)
    t_start = time.perf_counter()
    ops = read_op_trace(trace_path)
    keep = np.sort(ops["step"].unique())[:steps]
    ops = ops[ops["step"].isin(keep)].reset_index(drop=True)
    g = OpGraph(ops)
    old = observed_partition(ops, meta)
    models = fit_layer_models(g, old)
    pp0 = old.stages
    dp0 = int(meta.get("dp_size") or ops["dp_rank"].nunique())
    tp = int(meta.get("tp_size") or 1)
    m0 = int(ops[ops["optype"] == "forward-compute"].groupby(["step", "rank"]).size().max())
    if gpus < tp:
        raise ValueError(f"--gpus {gpus}: fewer than the job's tensor-parallel size ({tp})")
    base = float(g.step_seconds(simulate(g.graph(g.work(), launch_delay=False))).mean())
    restructure(g, [Scenario("scale-pp", str(pp0))], {**meta, "pp_size": pp0})  # a trace that cannot be rebuilt: say so once
    base_tput = m0 / (pp0 * base)
    layers = int(old.total) if old.known else None

    def state(pp: int, dp: int) -> float:
        return (1.0 / pp) * (6 + 12 / dp)

    def activations(pp: int, m: int) -> float:
        return min(pp, m) / pp

    rows = []
    todo = []
    for pp, dp, m, why in candidates(gpus, tp, pp0, dp0, m0, microbatches, layers):
        row: dict[str, Any] = {"pp": pp, "dp": dp, "tp": tp, "microbatches": m, "gpus": pp * dp * tp, "observed": (pp, dp, m) == (pp0, dp0, m0)}
        if not why and (state(pp, dp) > headroom * state(pp0, dp0) * (1 + 1e-9)
                        or activations(pp, m) > headroom * activations(pp0, m0) * (1 + 1e-9)):
            why = "cannot fit: more model state or activations per GPU than the observed job"
        if why:
            rows.append({**row, "status": "pruned", "reason": why})
            continue
        part = old.even(pp, None, f"scale-pp:{pp}")
        stage = max(sum(models[t].value(part, k) for t in ("forward-compute", "backward-compute") if t in models)
                    for k in range(pp))
        bound = 0.95 * m * stage
        ub = m / (pp * bound) / base_tput if bound > 0 else math.inf
        todo.append((ub, {**row, "throughput_bound": ub}))
    todo.sort(key=lambda x: -x[0])
    best: list[float] = []
    for i, (ub, row) in enumerate(todo):
        if len(best) >= top and ub < best[top - 1]:
            rows.append({**row, "status": "pruned", "reason": f"cannot win: at most {ub:.3f}x the observed throughput per GPU"})
            continue
        t0 = time.perf_counter()
        scenarios = [Scenario("scale-pp", str(row["pp"])), Scenario("microbatches", str(row["microbatches"])),
                     Scenario("scale-dp", str(row["dp"]))]
        try:
            gp, factor, _, _ = restructure(g, scenarios, {**meta, "pp_size": pp0})
        except ValueError as e:  # e.g. too large a rebuilt trace
            rows.append({**row, "status": "pruned", "reason": f"cannot simulate: {e}"})
            continue
        pred = simulate(gp.graph(apply_op_scenarios(gp, scenarios, dp0) * factor, launch_delay=False))
        step = float(gp.step_seconds(pred).mean())
        tput = row["microbatches"] / (row["pp"] * step) / base_tput
        best = sorted(best + [tput], reverse=True)
        rows.append({**row, "status": "simulated", "reason": "", "step_s": step, "step_vs_observed": step / base,
                     "throughput_per_gpu": tput, "samples_per_step": row["dp"] * row["microbatches"],
                     "seconds": round(time.perf_counter() - t0, 3)})
        if progress:
            progress(f"[{i + 1}/{len(todo)}] PP {row['pp']} DP {row['dp']} M {row['microbatches']} ({row['gpus']} GPUs): "
                     f"step {step:.4f} s, {tput:.3f}x throughput per GPU")
    table = pd.DataFrame(rows)
    for c in ("step_s", "step_vs_observed", "throughput_per_gpu", "throughput_bound", "samples_per_step", "seconds"):
        if c not in table:
            table[c] = np.nan
    table = table.sort_values(["throughput_per_gpu", "step_s"], ascending=[False, True], na_position="last").reset_index(drop=True)
    sim = table[table["status"] == "simulated"]
    cols = ["pp", "dp", "tp", "microbatches", "gpus", "step_s", "throughput_per_gpu"]
    summary = {
        "gpus": gpus, "tp": tp, "observed": {"pp": pp0, "dp": dp0, "microbatches": m0, "step_s": base},
        "steps": int(len(keep)), "layers_known": old.known,
        "global_batch": "fixed" if microbatches is None else "searched",
        "candidates": int(len(table)), "simulated": int(len(sim)),
        "pruned": {k: int(v) for k, v in table.loc[table["status"] == "pruned", "reason"].str.split(":").str[0].value_counts().items()},
        "best_throughput": _plain(sim.iloc[0][cols].to_dict()) if len(sim) else None,
        "fastest_step": _plain(sim.sort_values("step_s").iloc[0][cols].to_dict()) if len(sim) else None,
        "top": [_plain(r) for r in sim.head(top)[cols].to_dict("records")],
        "seconds": round(time.perf_counter() - t_start, 3),
    }
    return table, summary
