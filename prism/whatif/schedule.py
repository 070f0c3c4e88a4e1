"""Rebuild an op trace's pipeline for another number of micro-batches (``microbatches:M``).

Each rank's step is split into what comes before its first pipeline op
(e.g. the parameter all-gather), the pipeline core (forward/backward
compute and sends/receives) and what follows (gradient reduce-scatter,
embedding and grad-norm all-reduces, optimizer). The core is regenerated
with Megatron's non-interleaved 1F1B schedule for M micro-batches: stage k
of P warms up with ``min(P - k - 1, M)`` forwards, alternates one forward
and one backward, and cools down with the remaining backwards; in the steady
phase a send and the next receive are one batched call (as Megatron's
``send_forward_recv_backward`` / ``send_backward_recv_forward``).

Durations come from the rank's own observations in that step: compute at
its median over the observed micro-batches, a send or receive at the
shortest observed one of its kind (the transfer without waiting). The
rebuilt trace goes through the same graph builder as an observed one.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from prism.whatif.optrace import COMPUTE, P2P

__all__ = ["rebuild_microbatches", "one_f_one_b_calls"]

CORE = set(COMPUTE) | set(P2P)


def one_f_one_b_calls(stage: int, stages: int, m: int) -> list[list[tuple[str, int]]]:
    """The calls of one stage, in order; each call is a list of (optype, micro-batch) issued together.

    >>> one_f_one_b_calls(1, 2, 2)
    [[('forward-recv', 0)], [('forward-compute', 0)], [('backward-compute', 0)], [('backward-send', 0), ('forward-recv', 1)], [('forward-compute', 1)], [('backward-compute', 1)], [('backward-send', 1)]]
    """
    first, last = stage == 0, stage == stages - 1
    warm = min(stages - stage - 1, m)
    calls: list[list[tuple[str, int]]] = []
    for i in range(warm):
        if not first:
            calls.append([("forward-recv", i)])
        calls.append([("forward-compute", i)])
        if not last:
            calls.append([("forward-send", i)])
    steady = m - warm
    if steady > 0 and not first:
        calls.append([("forward-recv", warm)])
    for j in range(steady):
        f = warm + j
        calls.append([("forward-compute", f)])
        if not last:
            calls.append([("forward-send", f), ("backward-recv", j)])
        calls.append([("backward-compute", j)])
        if not first:
            if j == steady - 1:
                calls.append([("backward-send", j)])
            else:
                calls.append([("backward-send", j), ("forward-recv", f + 1)])
    for i in range(steady, m):
        if not last:
            calls.append([("backward-recv", i)])
        calls.append([("backward-compute", i)])
        if not first:
            calls.append([("backward-send", i)])
    return calls


def rebuild_microbatches(ops: pd.DataFrame, m: int, stages: int | None = None) -> pd.DataFrame:
    """The trace with every rank's pipeline core regenerated for ``m`` micro-batches."""
    if m < 1:
        raise ValueError("microbatches must be at least 1")
    cols = ["dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id"]
    stages = int(stages or ops["stage"].max() + 1)
    o = ops.sort_values(["step", "rank", "start_ts"], kind="stable")[cols].reset_index(drop=True)
    o["start_ts"] = o["start_ts"].astype(np.float64)
    o["duration"] = o["duration"].astype(np.float64)
    n = len(o)
    core = o["optype"].isin(CORE).to_numpy()
    key = o["step"].to_numpy(np.int64) * (1 << 20) + o["rank"].to_numpy(np.int64)
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    group = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, n]))
    pos = np.arange(n)
    first_core = np.minimum.reduceat(np.where(core, pos, n), starts)
    has_core = first_core[group] < n
    end = o["start_ts"].to_numpy() + o["duration"].to_numpy()
    core_end = np.maximum.reduceat(np.where(core, end, -np.inf), starts)
    pre = ~core & (pos < first_core[group])
    post = ~core & ~pre & has_core
    # per (step, rank, optype): compute at its median, transfers at their shortest
    stats = o[core].groupby(["step", "rank", "optype"])["duration"].agg(["median", "min"]).reset_index()
    sizes: dict = {}
    for st_, rk, optype, md, mn in stats.itertuples(index=False):
        sizes.setdefault((st_, rk), {})[optype] = md if optype in COMPUTE else mn
    calls_of = {k: one_f_one_b_calls(k, stages, m) for k in range(stages)}
    new, new_end = [], np.full(len(starts), np.nan)
    first_rows = o.iloc[starts]
    for gi, (d, stage, rank, step) in enumerate(first_rows[["dp_rank", "stage", "rank", "step"]].itertuples(index=False)):
        if first_core[gi] >= n:
            continue
        t = float(o["start_ts"].iat[first_core[gi]])
        size = sizes[(step, rank)]
        for call in calls_of[int(stage)]:
            longest = 0.0
            for optype, mb in call:
                if optype not in size:
                    raise ValueError(f"step {step} rank {rank}: no observed {optype} to size the rebuilt pipeline from")
                x = size[optype]
                new.append((d, stage, rank, step, optype, t, x, mb))
                longest = max(longest, x)
            t += longest
        new_end[gi] = t
    # what followed the pipeline follows the new one, moved by the change in the pipeline's end
    moved = o[post].copy()
    moved["start_ts"] += (new_end - core_end)[group[post]]
    out = pd.concat([o[pre | ~has_core], pd.DataFrame(new, columns=cols), moved], ignore_index=True)
    out["start_ts"] = out["start_ts"].astype(np.float64)
    out["duration"] = out["duration"].astype(np.float64)
    return out
