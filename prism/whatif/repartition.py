"""Graph manipulation on op traces (Lumos, MLSys 2025, section 3.4): ``scale-pp:N`` and ``layers:L``.

``scale-pp:N`` re-partitions the job's layers over N pipeline stages and
rebuilds the step; ``layers:L`` re-costs the job for L layers (over the
observed stages, or over N with ``scale-pp``). Both rest on one **layer
model** per op type that depends on how many layers a stage holds (forward
and backward compute, the DP parameter all-gather and gradient
reduce-scatter, the optimizer):

    value(stage) = per_layer * layers(stage) + first * [first stage] + last * [last stage]

fitted by least squares on the trace's own per-stage means. ``last`` is
what the last stage does besides its layers (the output layer and the loss;
its gradients), ``first`` the same for the first stage (the input
embedding). A term the trace cannot tell apart is left out: with two
stages holding equal layers ``first`` is 0 (the input embedding is a
lookup), with one stage both are. The fit error (per-stage means against
the model) is reported in the summary's ``scenario_notes``.

Each observed op keeps its *ratio* to its stage's model value (its
micro-batch's sequence length, its rank's speed). A layer of the new
partition costs, per micro-batch, ``per_layer`` times the ratio of the
observed op of the stage that held it, and a stage sums its layers; with
the observed partition this gives back every op's observed work exactly.

Layer counts: ``--meta`` may give ``num_layers`` (the job's total) and
``layers_per_stage`` (the observed partition). Without them the observed
stages are assumed to hold equal shares of the layers, and the shares are
continuous (no divisibility check); ``layers:L`` needs ``num_layers``.

The rebuilt step (``scale-pp``), per new stage k of N, DP rank d and step:

* before the pipeline, the ops the observed stage in the same place ran
  before its first pipeline op (the parameter all-gather); after it, the
  ops it ran after (gradient reduce-scatter, grad-norm and layernorm
  all-reduces, optimizer); the embedding all-reduce on the first and last
  stage only. Op types the layer model covers are re-costed for the
  stage's layers, the others keep the observed stage's work;
* the pipeline core as Megatron's non-interleaved 1F1B
  (:func:`~prism.whatif.schedule.one_f_one_b_calls`) for the observed
  micro-batch count (or ``microbatches:M``); micro-batch j takes the
  observed micro-batch ``j mod M_observed``'s costs;
* sends and receives between adjacent stages at the observed transfer of
  the observed stage boundary nearest in layers (activations are the same
  size at every boundary).

The rebuilt trace carries each op's work in a ``work_s`` column, which
:meth:`~prism.whatif.optrace.OpGraph.work` uses: the synthetic start times
only order a rank's calls.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from prism.whatif.optrace import COMPUTE, P2P, OpGraph
from prism.whatif.schedule import one_f_one_b_calls

__all__ = ["LAYER_SCALED", "LayerModel", "Partition", "bubble_fraction", "fit_layer_models", "layer_factors", "observed_partition",
           "repartition"]

#: op types whose cost follows the layers a stage holds (compute; the bytes of its parameters and gradients)
LAYER_SCALED = COMPUTE + ("params-all-gather", "grads-reduce-scatter", "optimizer")
_CORE = set(COMPUTE) | set(P2P)
#: a rebuilt trace's size limit (about 2 GB for the graph, the simulation and the timeline)
MAX_REBUILT_OPS = 3_000_000


@dataclass(frozen=True)
class Partition:
    """Layers per stage (``layers``; fractional when the job's layer count is unknown) and whether counts are known."""

    layers: tuple[float, ...]
    known: bool  # False: the observed stages were assumed to hold equal shares (units of one stage)

    @property
    def stages(self) -> int:
        return len(self.layers)

    @property
    def total(self) -> float:
        return float(sum(self.layers))

    @property
    def bounds(self) -> np.ndarray:
        """Cumulative layer positions: stage k holds [bounds[k], bounds[k+1])."""
        return np.r_[0.0, np.cumsum(self.layers)]

    def even(self, stages: int, total: float | None, what: str) -> "Partition":
        """``total`` layers (default: this job's) over ``stages`` stages, evenly; ``what`` names the scenario in errors."""
        total = self.total if total is None else float(total)
        if self.known:
            if total < stages:
                raise ValueError(f"--scenario {what}: {int(total)} layers cannot fill {stages} stages")
            if total % stages:
                raise ValueError(f"--scenario {what}: {int(total)} layers do not split evenly over {stages} stages "
                                 f"({int(total) / stages:.2f} per stage)")
        return Partition(tuple([total / stages] * stages), self.known)

    def scaled(self, total: float, what: str) -> "Partition":
        """The same stages holding ``total`` layers in the observed proportions (``layers:L``)."""
        new = [x * total / self.total for x in self.layers]
        if self.known and any(abs(x - round(x)) > 1e-9 for x in new):
            raise ValueError(f"--scenario {what}: {int(total)} layers do not split over the {self.stages} stages in the "
                             f"observed proportions ({', '.join(f'{x:g}' for x in self.layers)} of {self.total:g})")
        if self.known and min(new) < 1:
            raise ValueError(f"--scenario {what}: {int(total)} layers cannot fill {self.stages} stages")
        return Partition(tuple(float(round(x)) if self.known else x for x in new), self.known)


def observed_partition(ops: pd.DataFrame, meta: dict) -> Partition:
    """The trace's partition: ``--meta`` ``layers_per_stage`` or ``num_layers`` (split evenly), else equal unit shares."""
    stages = int(meta.get("pp_size") or int(ops["stage"].max()) + 1)
    per = meta.get("layers_per_stage")
    if per is not None:
        if (not isinstance(per, list) or len(per) != stages
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in per)):
            raise ValueError(f"--meta: layers_per_stage must list {stages} whole numbers >= 1 (one per stage), got {per!r}")
        if meta.get("num_layers") is not None and int(meta["num_layers"]) != sum(per):
            raise ValueError(f"--meta: layers_per_stage sums to {sum(per)}, num_layers is {meta['num_layers']}")
        return Partition(tuple(float(x) for x in per), True)
    n = meta.get("num_layers")
    if n is not None:
        if isinstance(n, bool) or not str(n).isdigit() or int(n) < 1:
            raise ValueError(f"--meta: num_layers must be a whole number >= 1, got {n!r}")
        if int(n) % stages:
            raise ValueError(f"--meta: num_layers {n} does not split evenly over the {stages} stages: give "
                             "layers_per_stage (the observed partition)")
        return Partition(tuple([int(n) / stages] * stages), True)
    return Partition(tuple([1.0] * stages), False)


@dataclass(frozen=True)
class LayerModel:
    """``value = per_layer * layers + first * [first stage] + last * [last stage]`` for one op type (seconds)."""

    optype: str
    per_layer: float
    first: float
    last: float
    fit_error: float  # RMS over the stages of (stage mean - model) / stage mean
    op_spread: float  # median over the ops of |op / its stage's model - 1| (micro-batch, rank and step variation)

    def value(self, part: Partition, stage: int) -> float:
        return (self.per_layer * part.layers[stage] + self.first * (stage == 0)
                + self.last * (stage == part.stages - 1))

    def as_dict(self) -> dict:
        return {"per_layer_s": self.per_layer, "first_stage_extra_s": self.first, "last_stage_extra_s": self.last,
                "fit_error_pct": round(self.fit_error * 100, 3), "op_spread_pct": round(self.op_spread * 100, 3)}


def fit_layer_models(g: OpGraph, part: Partition) -> dict[str, LayerModel]:
    """One :class:`LayerModel` per :data:`LAYER_SCALED` op type the trace has, from each op's work."""
    o = g.ops
    work = pd.Series(g.work(), index=o.index)
    p = part.stages
    out = {}
    for optype in LAYER_SCALED:
        sel = (o["optype"] == optype).to_numpy()
        if not sel.any():
            continue
        stage = o.loc[sel, "stage"].to_numpy()
        means = work[sel].groupby(stage).mean()
        s = means.index.to_numpy(np.int64)
        y = means.to_numpy(np.float64)
        lay = np.asarray(part.layers)[s]
        cols = [lay]
        names = ["per_layer"]
        for name, ind in (("last", s == p - 1), ("first", s == 0)):
            trial = np.column_stack(cols + [ind.astype(float)])
            # a term only where the stages observed tell it apart from the others
            if ind.any() and np.linalg.matrix_rank(trial) == trial.shape[1]:
                cols.append(ind.astype(float))
                names.append(name)
        x = np.column_stack(cols)
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        c = dict(zip(names, coef))
        per_layer, first, last = float(c["per_layer"]), float(c.get("first", 0.0)), float(c.get("last", 0.0))
        model = LayerModel(optype, per_layer, first, last, 0.0, 0.0)
        if per_layer <= 0 or any(model.value(part, k) <= 0 for k in range(p)):
            # no layer term the data supports: proportional to layers
            per_layer, first, last = float(np.sum(y) / np.sum(lay)), 0.0, 0.0
            model = LayerModel(optype, per_layer, 0.0, 0.0, 0.0, 0.0)
        fitted = np.array([model.value(part, int(k)) for k in s])
        fit_error = float(np.sqrt(np.mean(((y - fitted) / np.where(y > 0, y, 1.0)) ** 2)))
        v = np.array([model.value(part, int(k)) for k in range(p)])[stage]
        per_op = np.divide(work[sel].to_numpy(), v, out=np.ones(len(v)), where=v > 0)
        out[optype] = LayerModel(optype, per_layer, first, last, fit_error, float(np.median(np.abs(per_op - 1))))
    return out


def bubble_fraction(g: OpGraph, result) -> float:
    """Mean over ranks and steps of the share of the step a rank does not compute (forward or backward)."""
    o = g.ops
    comp = o["optype"].isin(COMPUTE).to_numpy()
    steps = result.step_times().set_index("step")["finish"] - g.step_start
    busy = pd.Series(result.graph.duration[g.node[comp]]).groupby([o["step"].to_numpy()[comp], o["rank"].to_numpy()[comp]]).sum()
    t = steps.reindex(busy.index.get_level_values(0)).to_numpy()
    return float(np.mean(1 - busy.to_numpy() / t))


def layer_factors(ops: pd.DataFrame, models: dict[str, LayerModel], old: Partition, new: Partition,
                  costs: dict[str, LayerModel] | None = None) -> np.ndarray:
    """Per op of ``ops`` (same stages as ``old``), its work's factor under the ``new`` partition (``layers:L``), costed
    by ``costs`` (default: ``models``, the fit; :func:`.hidden.hidden_costs` for another hidden size)."""
    f = np.ones(len(ops))
    stage = ops["stage"].to_numpy(np.int64)
    costs = models if costs is None else costs
    for optype, m in models.items():
        c = costs[optype]
        ratio = np.array([max(c.value(new, k), 0.0) / m.value(old, k) for k in range(old.stages)])
        sel = (ops["optype"] == optype).to_numpy()
        f[sel] = ratio[stage[sel]]
    return f


def _overlap(new: Partition, old: Partition) -> np.ndarray:
    """(new stages x old stages): the layers of new stage k that sit where old stage s's were (in proportion: with
    another layer count, the layers in old stage s's share of the model)."""
    a, b = new.bounds, old.bounds * (new.total / old.total)
    lo = np.maximum(a[:-1, None], b[None, :-1])
    hi = np.minimum(a[1:, None], b[None, 1:])
    return np.maximum(hi - lo, 0.0)


def repartition(g: OpGraph, old: Partition, new: Partition, microbatches: int | None = None,
                models: dict[str, LayerModel] | None = None, costs: dict[str, LayerModel] | None = None) -> pd.DataFrame:
    """The trace of ``g`` rebuilt for the ``new`` partition (stages and layers), with ``work_s`` per op.

    ``models`` is the layer model fitted on ``g`` (each op's ratio to it is kept); the new stages are costed by
    ``costs`` (default: ``models``; :func:`.hidden.hidden_costs` for another hidden size).

    Raises ``ValueError`` when the trace has no pipeline (one stage: no observed transfer between stages) or
    its ranks do not all run the same micro-batches.
    """
    o = g.ops
    p, n = old.stages, new.stages
    if new.stages > 1 and (p < 2 or not o["optype"].isin(P2P).any()):
        raise ValueError("the trace has no pipeline (one stage, no send/receive): nothing to take a transfer time from")
    models = fit_layer_models(g, old) if models is None else models
    costs = models if costs is None else costs
    work = g.work()
    steps = np.sort(o["step"].unique())
    dps = np.sort(o["dp_rank"].unique())
    t_of = pd.Series(np.arange(len(steps)), index=steps)
    d_of = pd.Series(np.arange(len(dps)), index=dps)
    ti = t_of.reindex(o["step"]).to_numpy()
    di = d_of.reindex(o["dp_rank"]).to_numpy()
    si = o["stage"].to_numpy(np.int64)
    seen = sorted(int(x) for x in np.unique(si))
    if seen != list(range(p)):
        raise ValueError(f"the trace has stages {', '.join(map(str, seen))} but pp_size is {p}: every stage must be there")
    fc = o[o["optype"] == "forward-compute"]
    per_rank = fc.groupby(["step", "dp_rank", "stage"]).size()
    m_obs = int(per_rank.max())
    if per_rank.min() != m_obs or len(per_rank) != len(steps) * len(dps) * p:
        raise ValueError("the trace's ranks do not all run the same micro-batches in every step: cannot rebuild its pipeline")
    m = int(microbatches or m_obs)
    size = len(steps) * len(dps) * n * (4 * m + 12)
    if size > MAX_REBUILT_OPS:
        raise ValueError(f"the rebuilt trace would hold about {size:,} ops ({n} stages x {m} micro-batches x DP "
                         f"{len(dps)} x {len(steps)} steps), more than {MAX_REBUILT_OPS:,}: fewer stages, micro-batches "
                         "or steps")
    seq = o["seq_id"].to_numpy(np.int64)
    shape = (p, len(dps), len(steps), m_obs)

    def dense(optype: str, values: np.ndarray) -> np.ndarray:
        """values of one op type as [stage, dp, step, micro-batch] (NaN where the trace has none)."""
        a = np.full(shape, np.nan)
        sel = (o["optype"] == optype).to_numpy() & (seq < m_obs)
        a[si[sel], di[sel], ti[sel], seq[sel]] = values[sel]
        return a

    # ratio of each layer-scaled op to its stage's model value
    ratio = {}
    for optype, mdl in models.items():
        stage_value = np.array([mdl.value(old, k) for k in range(p)])
        v = stage_value[si]
        ratio[optype] = dense(optype, np.divide(work, v, out=np.ones_like(work), where=v > 0))
    w = {optype: dense(optype, work) for optype in o["optype"].unique() if optype not in models}
    over = _overlap(new, old)

    def scaled(optype: str, k: int, j: int) -> np.ndarray:
        """[dp, step]: new stage k's value of a layer-scaled op for observed micro-batch j."""
        mdl, r = costs[optype], ratio[optype][:, :, :, j]
        v = mdl.per_layer * np.tensordot(over[k], r, axes=(0, 0))
        if k == 0:
            v = v + mdl.first * r[0]
        if k == n - 1:
            v = v + mdl.last * r[p - 1]
        return np.maximum(v, 0.0)  # a negative extra fitted on noise must not make a thin stage's op negative

    # the observed boundary (after old stage b) nearest each new boundary (after new stage k)
    ob, nb = old.bounds[1:-1] / old.total, new.bounds[1:-1] / new.total
    boundary = np.abs(nb[:, None] - ob[None, :]).argmin(axis=1) if n > 1 else np.zeros(0, np.int64)

    def p2p(optype: str, k: int, j: int) -> np.ndarray:
        """[dp, step]: the transfer of a send or receive by new stage k for micro-batch j."""
        # the boundary it crosses (sends forward and receives backward: after k; the others: before k)
        b = boundary[k] if optype in ("forward-send", "backward-recv") else boundary[k - 1]
        src = b if optype in ("forward-send", "backward-recv") else b + 1
        return w[optype][src, :, :, j % m_obs]

    # the ops around the pipeline, from the observed stage in the same place
    first_core = {}
    order = o.assign(_i=np.arange(len(o)), _core=o["optype"].isin(_CORE))
    templates: dict[int, tuple[list[str], list[str]]] = {}
    for s in range(p):
        r = order[(order["stage"] == s) & (order["dp_rank"] == dps[0]) & (order["step"] == steps[0])]
        core = r["_core"].to_numpy()
        first_core[s] = int(np.argmax(core)) if core.any() else len(r)
        kinds = r["optype"].astype(str).tolist()
        templates[s] = ([t for t, c in zip(kinds[:first_core[s]], core) if not c],
                        [t for t, c in zip(kinds[first_core[s]:], core[first_core[s]:]) if not c])

    def template_stage(k: int) -> int:
        if k == n - 1:
            return p - 1
        if k == 0:
            return 0
        mid = (new.bounds[k] + new.bounds[k + 1]) / 2 / new.total
        s = int(np.searchsorted(old.bounds / old.total, mid, side="right") - 1)
        return min(max(s, 1), p - 2) if p > 2 else 0

    def other(optype: str, k: int) -> np.ndarray:
        """[dp, step]: the value of a non-pipeline op on new stage k."""
        if optype in models:
            return scaled(optype, k, 0)
        if optype == "embedding-grads-all-reduce":
            return w[optype][0 if k == 0 else p - 1, :, :, 0]
        return w[optype][template_stage(k), :, :, 0]

    step_start = o.groupby("step")["start_ts"].min().reindex(steps).to_numpy(np.float64)
    cols: dict[str, list[np.ndarray]] = {c: [] for c in ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id", "work_s")}
    nd, nt = len(dps), len(steps)
    dp_grid = np.repeat(dps, nt)
    step_grid = np.tile(steps, nd)
    for k in range(n):
        ts = template_stage(k)
        pre, post = templates[ts]
        emb = "embedding-grads-all-reduce"
        if n == 1 or 0 < k < n - 1:  # the embedding all-reduce joins the first and the last stage
            post = [t for t in post if t != emb]
        calls: list[list[tuple[str, int, np.ndarray]]] = []
        for t in pre:
            calls.append([(t, 0, other(t, k))])
        for pipe_call in one_f_one_b_calls(k, n, m):
            calls.append([(t, j, scaled(t, k, j % m_obs) if t in models else p2p(t, k, j)) for t, j in pipe_call])
        for t in post:
            calls.append([(t, 0, other(t, k))])
        clock = np.broadcast_to(step_start, (nd, nt)).copy()
        for call in calls:
            longest = np.zeros((nd, nt))
            for t, j, v in call:
                v = np.nan_to_num(v, nan=0.0)
                cols["dp_rank"].append(dp_grid)
                cols["stage"].append(np.full(nd * nt, k))
                cols["rank"].append(k * nd + np.repeat(np.arange(nd), nt))
                cols["step"].append(step_grid)
                cols["optype"].append(np.full(nd * nt, t, object))
                cols["start_ts"].append(clock.ravel().copy())
                cols["duration"].append(v.ravel())
                cols["seq_id"].append(np.full(nd * nt, j))
                cols["work_s"].append(v.ravel())
                longest = np.maximum(longest, v)
            # strictly increasing within a rank: the order of its calls (the times are not used otherwise)
            clock = clock + np.maximum(longest, 1e-9)
    out = pd.DataFrame({c: np.concatenate(v) for c, v in cols.items()})
    for c in ("dp_rank", "stage", "rank", "step", "seq_id"):
        out[c] = out[c].astype(np.int64)
    return out
