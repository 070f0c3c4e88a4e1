"""SYNTHETIC op traces of a Megatron job with known costs (the StragglerAnalysis schema), for what-if ground truth.

:class:`PipelineJob` lays out each rank's step as Megatron runs it: the
parameter all-gather, the non-interleaved 1F1B pipeline
(:func:`prism.whatif.schedule.one_f_one_b_calls`), the embedding all-reduce
(first and last stage), the gradient reduce-scatter and the optimizer. Each
op's cost follows a layer model: a stage's compute and the bytes of its
parameters are ``per-layer cost x its layers``, plus the output layer and
loss on the last stage. The trace is timed through the dependency-driven
simulator (:mod:`prism.whatif`): an op starts when its rank's previous op
ends, and a synchronising op ends with its synchronisation, so its
duration includes its wait for the peers, as in a real trace.

The same job generated at another pipeline depth is the exact truth for
``scale-pp`` and ``layers``.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

__all__ = ["PipelineJob"]


@dataclass
class PipelineJob:
    """A job of ``layers`` layers on ``stages`` stages (evenly, unless ``layers_per_stage``) and ``dp`` pipelines.

    Costs in seconds: per layer (``fwd``, ``bwd``, ``ag``, ``rs``, ``opt``: forward, backward, parameter
    all-gather, gradient reduce-scatter, optimizer), the last stage's extra forward and backward
    (``fwd_last``, ``bwd_last``), one pipeline transfer (``p2p``), the embedding all-reduce (``emb``).
    ``jitter`` makes each compute op's cost vary by up to that fraction (seeded).
    """

    stages: int
    dp: int = 2
    microbatches: int = 4
    layers: int = 24
    layers_per_stage: tuple[int, ...] | None = None
    fwd: float = 0.010
    bwd: float = 0.020
    fwd_last: float = 0.0
    bwd_last: float = 0.0
    p2p: float = 0.001
    ag: float = 0.002
    rs: float = 0.004
    opt: float = 0.001
    emb: float = 0.003
    steps: int = 2
    jitter: float = 0.0
    seed: int = 0

    def partition(self) -> list[int]:
        if self.layers_per_stage is not None:
            assert len(self.layers_per_stage) == self.stages and sum(self.layers_per_stage) == self.layers
            return list(self.layers_per_stage)
        assert self.layers % self.stages == 0, "layers must split evenly over the stages"
        return [self.layers // self.stages] * self.stages

    def calls(self, stage: int) -> list[list[tuple[str, int, float]]]:
        """One rank's calls in a step: (op type, micro-batch, cost) issued together."""
        from prism.whatif.schedule import one_f_one_b_calls

        n = self.partition()[stage]
        last = stage == self.stages - 1
        cost = {"forward-compute": self.fwd * n + self.fwd_last * last, "backward-compute": self.bwd * n + self.bwd_last * last,
                "forward-send": self.p2p, "forward-recv": self.p2p, "backward-send": self.p2p, "backward-recv": self.p2p}
        out = [[("params-all-gather", 0, self.ag * n)]]
        out += [[(t, j, cost[t]) for t, j in call] for call in one_f_one_b_calls(stage, self.stages, self.microbatches)]
        if self.stages > 1 and (stage == 0 or last):
            out.append([("embedding-grads-all-reduce", 0, self.emb)])
        out += [[("grads-reduce-scatter", 0, self.rs * n)], [("optimizer", 0, self.opt * n)]]
        return out

    def trace(self) -> pd.DataFrame:
        """The op trace (``dp_rank, stage, rank, step, optype, start_ts, duration, seq_id``), steps 10 s apart."""
        from prism.whatif.graph import simulate
        from prism.whatif.optrace import COMPUTE, OpGraph

        rng = np.random.default_rng(self.seed)
        rows = []
        for step in range(self.steps):
            for stage in range(self.stages):
                for d in range(self.dp):
                    t = 10.0 * step
                    for call in self.calls(stage):
                        for optype, j, c in call:
                            if optype in COMPUTE and self.jitter:
                                c *= 1 + self.jitter * rng.uniform(-1, 1)
                            rows.append((d, stage, stage * self.dp + d, step, optype, t, c, j))
                        t += max(c for _, _, c in call) + 1e-9
        ops = pd.DataFrame(rows, columns=["dp_rank", "stage", "rank", "step", "optype", "start_ts", "duration", "seq_id"])
        ops = ops.assign(work_s=ops["duration"])
        g = OpGraph(ops)
        r = simulate(g.graph(g.work(), launch_delay=False))
        o = g.ops.drop(columns="work_s")
        end = r.finish[g.node]
        # an op starts when its rank's previous call (one node) ended, the first at its node's start; it ends with its node
        key = o["step"].to_numpy() * (1 << 20) + o["rank"].to_numpy()
        first = np.r_[True, key[1:] != key[:-1]]
        node = g.node
        new_call = first | np.r_[True, node[1:] != node[:-1]]
        start = np.empty(len(o))
        for i in range(len(o)):
            start[i] = r.start[node[i]] if first[i] else end[i - 1] if new_call[i] else start[i - 1]
        return o.assign(start_ts=start, duration=end - start).reset_index(drop=True)
