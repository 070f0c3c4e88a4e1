"""Who a job's slowdown belongs to: what-if attribution per worker, DP rank, stage and op type.

The method of the StragglerAnalysis what-if study (Lin et al., OSDI 2025):

* ``T_base``: the job simulated with its observed work (compute durations,
  communication transfer times) and no launch delays;
* ``T_ideal``: the same graph with every unit at its *ideal* value (one value
  per op type for the whole job: the mean for compute, the median for
  communication), so no worker, stage or step is slower than another;
* the job's slowdown ``S = T_base / T_ideal`` (mean step times);
* a group's slowdown ``S_g``: the ideal job with only the group's units back
  at their observed values, over ``T_ideal``. ``S_g`` close to ``S`` means
  the group alone explains the slowdown; close to 1, it plays no part;
* ``M_S`` (stage issue) and ``M_W`` (worker issue): the share of
  ``T_base - T_ideal`` removed by giving the last stage, or the top 3% of
  workers (scored ``min(S_dp, S_stage)``), their ideal values.

The functions take the simulator as a callable (unit values -> mean step
time), so one implementation serves op traces (units: operations) and
network replays (units: a DP ring's work and collective per step).

Examples
--------
>>> import numpy as np, pandas as pd
>>> # two workers in lockstep: the step is the slower one's work
>>> mean_step = lambda v: float(max(v[0], v[1]))
>>> groups = pd.DataFrame({"worker": ["a", "b"]})
>>> t = attribute(mean_step, np.array([2.0, 1.0]), np.array([1.0, 1.0]), groups)
>>> t[["level", "key", "slowdown"]].values.tolist()
[['worker', 'a', 2.0], ['worker', 'b', 1.0]]
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np
import pandas as pd

__all__ = ["attribute", "remove_share", "worker_and_stage_metrics", "WORKER_SHARE"]

#: the share of workers M_W gives their ideal values (the study's 3%)
WORKER_SHARE = 0.03


def attribute(mean_step: Callable[[np.ndarray], float], observed: np.ndarray, ideal: np.ndarray,
              groups: pd.DataFrame, t_base: float | None = None, t_ideal: float | None = None) -> pd.DataFrame:
    """Per level and key: the ideal job with that group's units observed.

    Parameters
    ----------
    mean_step : callable
        Unit values (length N) -> the job's mean step time, simulated.
    observed, ideal : ndarray of float, length N
        Each unit's observed and ideal value.
    groups : DataFrame
        Either one column per level (e.g. ``worker``, ``dp_rank``, ``stage``, ``optype``) and one row
        per unit, or the long form ``level, key, unit`` where a unit may be in several groups of a
        level (a server in several DP rings) or in none.
    t_base, t_ideal : float, optional
        ``mean_step(observed)`` and ``mean_step(ideal)``, when the caller has them (else simulated here).

    Returns
    -------
    DataFrame
        ``level, key, step_s, slowdown, share``: the mean step time with the group observed, its ratio
        to the ideal one, and ``(slowdown - 1) / (S - 1)`` (the share of the job's slowdown the group
        explains alone), by level in the order given, then slowdown descending.

    Complexity: one simulation per group: O(G (N + E)).
    """
    observed = np.asarray(observed, np.float64)
    ideal = np.asarray(ideal, np.float64)
    if list(groups.columns) != ["level", "key", "unit"]:
        groups = groups.rename_axis("unit").reset_index().melt(id_vars="unit", var_name="level", value_name="key")
    groups = groups.dropna(subset=["key"])
    t_base, t_ideal = _reference(mean_step, observed, ideal, t_base, t_ideal)
    s_all = t_base / t_ideal
    rows = []
    for (level, key), units in groups.groupby(["level", "key"], sort=False)["unit"]:
        v = ideal.copy()
        idx = units.to_numpy(np.int64)
        v[idx] = observed[idx]
        t = mean_step(v)
        rows.append((level, key, t, t / t_ideal))
    out = pd.DataFrame(rows, columns=["level", "key", "step_s", "slowdown"])
    out["share"] = (out["slowdown"] - 1) / (s_all - 1) if s_all > 1 else np.nan
    order = {lv: i for i, lv in enumerate(groups["level"].unique())}
    out = out.assign(_o=out["level"].map(order)).sort_values(["_o", "slowdown"], ascending=[True, False], kind="stable")
    return out.drop(columns="_o").reset_index(drop=True)


def remove_share(mean_step: Callable[[np.ndarray], float], observed: np.ndarray, ideal: np.ndarray,
                 selected: np.ndarray, t_base: float | None = None, t_ideal: float | None = None) -> dict:
    """How much of ``T_base - T_ideal`` goes away when the selected units take their ideal values.

    Returns ``{"t_base", "t_ideal", "t_removed", "share"}``; ``share`` is
    ``(t_base - t_removed) / (t_base - t_ideal)`` (NaN when the job has no slowdown).
    """
    t_base, t_ideal = _reference(mean_step, observed, ideal, t_base, t_ideal)
    v = np.where(selected, ideal, observed)
    t_rem = mean_step(v)
    share = (t_base - t_rem) / (t_base - t_ideal) if t_base > t_ideal else float("nan")
    return {"t_base": t_base, "t_ideal": t_ideal, "t_removed": t_rem, "share": share}


def worker_and_stage_metrics(mean_step: Callable[[np.ndarray], float], observed: np.ndarray, ideal: np.ndarray,
                             worker: np.ndarray, dp_rank: np.ndarray, stage: np.ndarray,
                             table: pd.DataFrame, t_base: float | None = None, t_ideal: float | None = None) -> dict:
    """``M_S`` (fix the last stage) and ``M_W`` (fix the top 3% of workers), from an :func:`attribute` table.

    A worker's score is ``min(S_dp, S_stage)`` of its DP rank and stage: high only where both its
    replica and its stage are slow, i.e. where one worker is. Ties go to the lower worker id.
    """
    s = {lv: table[table["level"] == lv].set_index("key")["slowdown"] for lv in ("dp_rank", "stage")}
    workers = pd.DataFrame({"worker": worker, "dp_rank": dp_rank, "stage": stage}).drop_duplicates("worker")
    workers["score"] = np.minimum(workers["dp_rank"].map(s["dp_rank"]), workers["stage"].map(s["stage"]))
    n = math.ceil(len(workers) * WORKER_SHARE)
    top = workers.sort_values(["score", "worker"], ascending=[False, True]).head(n)["worker"]
    t_base, t_ideal = _reference(mean_step, observed, ideal, t_base, t_ideal)
    m_w = remove_share(mean_step, observed, ideal, np.isin(worker, top.to_numpy()), t_base, t_ideal)
    m_s = remove_share(mean_step, observed, ideal, np.asarray(stage) == np.max(stage), t_base, t_ideal)
    return {"m_w": m_w["share"], "m_w_workers": [_plain(w) for w in top], "m_s": m_s["share"],
            "t_without_top_workers": m_w["t_removed"], "t_without_last_stage_slowdown": m_s["t_removed"]}


def _reference(mean_step, observed, ideal, t_base, t_ideal) -> tuple[float, float]:
    """The job's mean step with every unit observed and with every unit ideal: given, or simulated."""
    return (mean_step(observed) if t_base is None else t_base), (mean_step(ideal) if t_ideal is None else t_ideal)


def _plain(x):
    return x.item() if hasattr(x, "item") else x
