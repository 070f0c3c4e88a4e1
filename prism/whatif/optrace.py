"""Execution graphs from op-level traces (the StragglerAnalysis schema).

One row per operation: ``dp_rank, stage, rank, step, optype, start_ts,
duration, seq_id, ...`` (Megatron: forward/backward compute, pipeline
send/receive, DP reduce-scatter/all-gather, embedding and grad-norm
all-reduces, optimizer). The graph:

* every rank runs its operations of a step in their observed order; the
  gap between one operation's end and the next one's start is kept as local
  overhead;
* synchronising operations become one node that all their members join:
  a pipeline send and its receive (``forward-send`` at stage s with
  ``forward-recv`` at s+1, same DP rank and micro-batch; ``backward-send``
  at s with ``backward-recv`` at s-1), operations one rank issued together
  (a send and a receive batched in one call: same start), and collectives
  over their group (:data:`COLLECTIVE_GROUPS`);
* a synchronisation's own duration is the shortest of its members'
  observed durations: the last member to arrive waited for nobody, so its
  time is the transfer itself; the others' longer times were waiting, which
  the simulation recreates;
* for scenarios, :meth:`OpGraph.work` gives each op what it costs without
  waiting (a communication op's *transfer*: from its synchronisation's last
  arrival to its end), and :meth:`OpGraph.graph` with ``launch_delay=False``
  drops the gaps, as StragglerAnalysis' what-if does.

Steps are independent: each rank's first operation is released at its
observed start in the step.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from prism.common.components import connected_components
from prism.whatif.graph import ExecutionGraph, SimResult

__all__ = ["COLLECTIVE_GROUPS", "COMMUNICATION", "OpGraph", "read_op_trace", "observed_step_times"]

REQUIRED = ("dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id")

#: collective op type -> the columns (besides step and seq_id) that name one instance's group
COLLECTIVE_GROUPS = {
    "grads-reduce-scatter": ("stage",),  # the DP group of a stage
    "params-all-gather": ("stage",),
    "embedding-grads-all-reduce": ("dp_rank",),  # first and last stage of one pipeline
    "optimizer-clip-main-grad": (),  # grad-norm all-reduce over every rank
}
COMPUTE = ("forward-compute", "backward-compute")
P2P = ("forward-send", "forward-recv", "backward-send", "backward-recv")
#: communication op types (the rest is local work: compute, optimizer, gc); a communication op's
#: duration includes waiting for its peers, its *transfer* time starts when the last member arrives
COMMUNICATION = P2P + tuple(COLLECTIVE_GROUPS) + ("layernorm-grads-all-reduce", "separate-grads-all-reduce")


def read_op_trace(path: str | Path) -> pd.DataFrame:
    """Read a trace (Parquet or CSV) and check its columns; the message names the file and what is missing."""
    path = str(path)
    try:
        df = pd.read_parquet(path) if path.endswith(".parquet") else pd.read_csv(path)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read the op trace: {e}") from e
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)} (expected {', '.join(REQUIRED)})")
    df = df[list(REQUIRED) + [c for c in df.columns if c not in REQUIRED]].copy()
    if df.empty:
        raise ValueError(f"{path}: no ops")
    df["optype"] = df["optype"].astype(str)
    known = set(COMMUNICATION) | set(COMPUTE)
    if not df["optype"].isin(known).any():
        raise ValueError(f"{path}: none of its op types ({', '.join(sorted(df['optype'].unique())[:5])}) is one the "
                         f"model knows ({', '.join(sorted(known))})")
    for c, whole in (("dp_rank", True), ("stage", True), ("rank", True), ("step", True), ("seq_id", True),
                     ("start_ts", False), ("duration", False)):
        x = pd.to_numeric(df[c], errors="coerce").to_numpy(np.float64)
        bad = ~np.isfinite(x) | ((x < 0) if c != "start_ts" else False) | ((x != np.round(x)) if whole else False)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise ValueError(f"{path}: {int(bad.sum())} row(s) with a bad {c} (expected a finite, non-negative "
                             f"{'whole number' if whole else 'number'}), first at row {i}: {df[c].iat[i]!r}")
        df[c] = x.astype(np.int64) if whole else x
    return df.reset_index(drop=True)


def observed_step_times(ops: pd.DataFrame) -> pd.Series:
    """Per step: last end - first start, as observed."""
    end = ops["start_ts"].astype(np.float64) + ops["duration"].astype(np.float64)
    g = pd.DataFrame({"step": ops["step"], "s": ops["start_ts"].astype(np.float64), "e": end}).groupby("step")
    return (g["e"].max() - g["s"].min()).rename("observed_s")


class OpGraph:
    """An op trace as an :class:`ExecutionGraph`, keeping the map from ops to nodes for scenarios."""

    def __init__(self, ops: pd.DataFrame):
        self.ops = ops.sort_values(["step", "rank", "start_ts", "optype"], kind="stable").reset_index(drop=True)
        o = self.ops
        n = len(o)
        start = o["start_ts"].to_numpy(np.float64)
        dur = o["duration"].to_numpy(np.float64)
        end = start + dur
        idx = pd.Series(np.arange(n))
        pairs = []
        # pipeline send -> receive of the same micro-batch on the neighbouring stage
        for send, recv, delta in (("forward-send", "forward-recv", 1), ("backward-send", "backward-recv", -1)):
            s = o[o["optype"] == send][["step", "dp_rank", "stage", "seq_id"]].assign(i=idx[o["optype"] == send].to_numpy())
            r = o[o["optype"] == recv][["step", "dp_rank", "stage", "seq_id"]].assign(j=idx[o["optype"] == recv].to_numpy())
            s = s.assign(stage=s["stage"] + delta)
            m = s.merge(r, on=["step", "dp_rank", "stage", "seq_id"])
            pairs.append(m[["i", "j"]].to_numpy())
        # operations one rank issued together (a batched send and receive)
        p2p = o[o["optype"].isin(P2P)]
        key = p2p[["step", "rank", "start_ts"]]
        lead = pd.Series(p2p.index, index=p2p.index).groupby([key["step"], key["rank"], key["start_ts"]]).transform("min")
        pairs.append(np.stack([lead.to_numpy(), p2p.index.to_numpy()], axis=1))
        # collectives over their group
        for optype, cols in COLLECTIVE_GROUPS.items():
            c = o[o["optype"] == optype]
            if len(c):
                keys = [c["step"], c["seq_id"]] + [c[k] for k in cols]
                lead = pd.Series(c.index, index=c.index).groupby(keys).transform("min")
                pairs.append(np.stack([lead.to_numpy(), c.index.to_numpy()], axis=1))
        e = np.concatenate([p for p in pairs if len(p)]) if pairs else np.zeros((0, 2), np.int64)
        node = connected_components(e[:, 0], e[:, 1], n)
        self.node = node.astype(np.int64)
        self.n_nodes = int(node.max()) + 1 if n else 0
        self.members = np.bincount(self.node, minlength=self.n_nodes)
        # per rank and step, consecutive operations; a node repeated (batched ops) is one task
        rank, step = o["rank"].to_numpy(), o["step"].to_numpy()
        same_run = np.r_[False, (rank[1:] == rank[:-1]) & (step[1:] == step[:-1])]
        new_task = ~same_run | np.r_[True, self.node[1:] != self.node[:-1]]
        task_first = np.flatnonzero(new_task)
        chained = same_run[task_first]  # the task follows another of the same rank and step
        task_end = np.maximum.reduceat(end, task_first)  # a batched task ends with its latest op on this rank
        t = np.flatnonzero(chained)
        self.src, self.dst = self.node[task_first[t - 1]], self.node[task_first[t]]
        self.gap = np.maximum(start[task_first[t]] - task_end[t - 1], 0.0)
        # release: each rank's first task of a step at its observed start; a shared one at the latest member
        first_ops = task_first[~chained]
        release = np.zeros(self.n_nodes)
        np.maximum.at(release, self.node[first_ops], start[first_ops])
        self.release = release
        self.step = np.zeros(self.n_nodes, np.int64)
        self.step[self.node] = step
        self.step_start = pd.Series(start).groupby(step).min()
        labels = o["optype"].to_numpy(object)
        self.label = np.empty(self.n_nodes, object)
        self.label[self.node] = labels
        self.proc = np.full(self.n_nodes, -1, np.int64)
        single = self.members[self.node] == 1
        self.proc[self.node[single]] = rank[single]
        self.is_sync = self.members > 1
        self.is_comm = o["optype"].isin(COMMUNICATION).to_numpy()
        # a member's transfer: from the last member's arrival to its own end (its wait for the others removed)
        last_arrival = np.full(self.n_nodes, -np.inf)
        np.maximum.at(last_arrival, self.node, start)
        self.transfer = np.where(self.is_sync[self.node], np.maximum(end - last_arrival[self.node], 0.0), dur)
        self.first_task = np.zeros(self.n_nodes, bool)
        self.first_task[self.node[first_ops]] = True

    def durations(self, op_duration: np.ndarray | None = None) -> np.ndarray:
        """Node durations from op durations: a task's own, a synchronisation's shortest member."""
        d = self.ops["duration"].to_numpy(np.float64) if op_duration is None else np.asarray(op_duration, np.float64)
        out = np.full(self.n_nodes, np.inf)
        np.minimum.at(out, self.node, d)
        return out

    def graph(self, op_duration: np.ndarray | None = None, launch_delay: bool = True) -> ExecutionGraph:
        """The graph with node durations from ``op_duration`` (default: observed).

        ``launch_delay=False`` drops the gaps between a rank's operations and starts every rank at its
        step's first observed start, as StragglerAnalysis' what-if does: a gap can hide a wait on a
        dependency the trace does not show (a collective with ranks outside it), and kept as local
        overhead it would replay that wait in every scenario.
        """
        if launch_delay:
            return ExecutionGraph(self.durations(op_duration), self.step, self.src, self.dst, self.gap, self.release,
                                  self.label, self.proc)
        release = np.where(self.first_task, self.step_start.reindex(self.step).to_numpy(), 0.0)
        return ExecutionGraph(self.durations(op_duration), self.step, self.src, self.dst, np.zeros_like(self.gap),
                              release, self.label, self.proc)

    def work(self) -> np.ndarray:
        """Per op, what it costs without waiting: a compute op's duration, a communication op's transfer.

        A rebuilt trace (:mod:`.repartition`) gives it in a ``work_s`` column: its start times only order
        each rank's calls.
        """
        w = np.where(self.is_comm, self.transfer, self.ops["duration"].to_numpy(np.float64))
        if "work_s" in self.ops.columns:
            given = pd.to_numeric(self.ops["work_s"], errors="coerce").to_numpy(np.float64)
            w = np.where(np.isfinite(given), given, w)
        return w

    def step_seconds(self, result: SimResult) -> pd.Series:
        """Simulated step times, by step: last finish - the step's observed first start."""
        return result.step_times().set_index("step")["finish"] - self.step_start
