"""Scenarios: parsed from ``--scenario`` text, applied to the work of an op-trace graph's ops.

=========================  ===================================================
``remove-stragglers``      no compute op (anything but communication) slower
                           than the lower median of its DP peers (same step,
                           stage, op type and micro-batch; of two peers, the
                           faster): what a worker adds over its peers
``ideal``                  StragglerAnalysis' T_ideal: every compute op at the
                           mean of its op type over all ranks, micro-batches
                           and steps, every communication op at the median
                           transfer of its type (no straggler, no stage or
                           sequence-length imbalance)
``scale-comm:X``           every communication op's transfer X times as long
``scale-compute:X``        every compute op (op traces: anything but
                           communication; Kineto: every GPU operation but
                           NCCL kernels) X times as long
``scale-dp:N``             DP group size N: each DP collective re-costed for a
                           ring of N by (N-1)/N (op traces: reduce-scatter and
                           all-gather; network replays: each ring's collective
                           at the rate it was measured at, or at the spine
                           tier's where a ring grows beyond its leaf;
                           :meth:`.netreplay.ReplayGraph.scale_dp`); per-replica
                           work unchanged
``heal-switch:NAME``       transfers through the switch re-costed at the
                           healthy bandwidth measured in the capture (network
                           replays only; :mod:`.netreplay`)
``heal-link:A>B``          the same for one link (``switches.csv`` names it)
``move-job:JOB@NAME``      JOB's traffic taken off the switch (or link A>B)
                           NAME: JOB healed, every other job whose
                           transfers through it were slowed gets the share
                           JOB leaves (network replays;
                           :func:`.netreplay.contention`)
``microbatches:M``         the pipeline rebuilt for M micro-batches per step
                           (op traces; :mod:`.repartition`)
``scale-pp:N``             the layers re-partitioned over N pipeline stages,
                           the 1F1B step rebuilt (op traces;
                           :mod:`.repartition`)
``layers:L``               the job re-costed for L layers (op traces; with
                           ``--meta`` ``num_layers``; :mod:`.repartition`)
``hidden:H``               the job re-costed for hidden size H: each layer's
                           compute by its FLOPs, its DP collectives and
                           optimizer by its parameters, activations and the
                           embedding by H (op traces; with ``--meta``
                           ``hidden_size`` and ``seq_length``; :mod:`.hidden`)
=========================  ===================================================

Several scenarios combine, applied in the order given; ``microbatches``,
``scale-pp``, ``layers`` and ``hidden`` change the graph or re-cost it, so
they are applied first. On op traces every
scenario is simulated without launch delays and compared with the baseline
simulated the same way (see :meth:`~prism.whatif.optrace.OpGraph.graph`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from prism.whatif.kineto import KinetoGraph
    from prism.whatif.optrace import OpGraph

__all__ = ["Scenario", "parse_scenario", "dp_ring_factor", "apply_op_scenarios", "apply_kineto_scenarios", "ideal_op_work", "SCENARIO_HELP"]

SCENARIO_HELP = ("remove-stragglers, ideal, scale-comm:X, scale-compute:X, scale-dp:N (op traces and network replays: DP "
                 "collectives re-costed for N replicas, a ring's bytes per GPU 2(N-1)/N at the bandwidth measured in the capture), microbatches:M, scale-pp:N, "
                 "layers:L, hidden:H (op traces, --meta hidden_size and seq_length: each layer's compute re-costed by its FLOPs, its "
                 "DP collectives and optimizer by its parameters, pipeline transfers by H), heal-switch:NAME, heal-link:A>B, move-job:JOB@NAME (network replays: JOB's traffic off the switch "
                 "or link NAME, the other jobs that shared it with JOB re-costed at the share it leaves) "
                 "(repeatable; applied in order)")
#: a real pipeline runs tens to hundreds of micro-batches a step
MAX_MICROBATCHES = 1024
#: guards against a typo building an enormous graph (a rebuilt trace grows with stages x micro-batches)
MAX_STAGES = 256
MAX_LAYERS = 4096
#: today's largest models have hidden sizes of 16-32k
MAX_HIDDEN = 262_144
_KINDS = ("remove-stragglers", "ideal", "scale-comm", "scale-compute", "scale-dp", "heal-switch", "heal-link", "move-job",
          "microbatches", "scale-pp", "layers", "hidden")
#: scenarios that rebuild or re-cost the graph itself (applied before the others)
STRUCTURAL = ("microbatches", "scale-pp", "layers", "hidden")


@dataclass(frozen=True)
class Scenario:
    kind: str
    arg: str | None = None

    def __str__(self) -> str:
        return self.kind + (f":{self.arg}" if self.arg is not None else "")

    @property
    def value(self) -> str:
        """``arg`` of a kind that takes one (:func:`parse_scenario` checks that it is there)."""
        if self.arg is None:
            raise ValueError(f"scenario {self.kind} has no value")
        return self.arg


def parse_scenario(text: str) -> Scenario:
    """``"scale-comm:0.5"`` -> ``Scenario("scale-comm", "0.5")``, checked.

    >>> parse_scenario("scale-comm:0.5"), parse_scenario("remove-stragglers")
    (Scenario(kind='scale-comm', arg='0.5'), Scenario(kind='remove-stragglers', arg=None))
    """
    kind, sep, arg = text.strip().partition(":")
    if kind not in _KINDS:
        raise ValueError(f"--scenario {text!r}: unknown; use {SCENARIO_HELP}")
    if kind in ("remove-stragglers", "ideal") and sep:
        raise ValueError(f"--scenario {text!r}: {kind} takes no argument")
    if kind in ("scale-comm", "scale-compute", "scale-dp", "microbatches", "scale-pp", "layers", "hidden", "heal-switch",
                "heal-link", "move-job") and not arg:
        example = {"heal-switch": "spine-00", "heal-link": "leaf-g00-r0>spine-00", "move-job": "job-1234abcd@spine-00",
                   "hidden": "8192"}.get(kind, "2")
        raise ValueError(f"--scenario {text!r}: {kind} needs a value, e.g. {kind}:{example}")
    if kind == "heal-link" and arg.count(">") != 1:
        raise ValueError(f"--scenario {text!r}: heal-link takes a link as switches.csv names it, FROM>TO")
    if kind == "move-job" and (not arg.rpartition("@")[0] or arg.rpartition("@")[2].count(">") > 1
                               or not all(arg.rpartition("@")[2].split(">"))):
        raise ValueError(f"--scenario {text!r}: move-job takes a job and a switch or link, JOB@NAME (e.g. job-1234abcd@spine-00)")
    if kind in ("scale-comm", "scale-compute"):
        try:
            if not 0 < float(arg) < math.inf:
                raise ValueError
        except ValueError:
            raise ValueError(f"--scenario {text!r}: {kind} takes a positive, finite factor") from None
    if kind in ("scale-dp", "microbatches", "scale-pp", "layers", "hidden"):
        if not arg.isdigit() or int(arg) < 1:
            raise ValueError(f"--scenario {text!r}: {kind} takes a positive whole number")
        if kind == "microbatches" and int(arg) > MAX_MICROBATCHES:
            # the rebuilt trace grows with M (4 ops per micro-batch per rank and step): refuse, not run out of memory
            raise ValueError(f"--scenario {text!r}: at most {MAX_MICROBATCHES} micro-batches")
        if kind == "scale-pp" and int(arg) > MAX_STAGES:
            raise ValueError(f"--scenario {text!r}: at most {MAX_STAGES} pipeline stages")
        if kind == "layers" and int(arg) > MAX_LAYERS:
            raise ValueError(f"--scenario {text!r}: at most {MAX_LAYERS} layers")
        if kind == "hidden" and int(arg) > MAX_HIDDEN:
            raise ValueError(f"--scenario {text!r}: at most a hidden size of {MAX_HIDDEN:,}")
    return Scenario(kind, arg or None)


def dp_ring_factor(n: int, d: int) -> float:
    """How many times as long a DP ring's collective takes with ``n`` replicas as with the observed ``d``.

    In a ring of k members each sends (k-1)/k of the per-GPU bytes per pass (an all-reduce is two passes, a
    reduce-scatter or an all-gather one: the passes cancel in the ratio). The per-GPU bytes (same model, same
    per-replica batch) and the ring's bottleneck bandwidth stay; one replica has no DP collective.

    >>> dp_ring_factor(8, 4), dp_ring_factor(4, 8), dp_ring_factor(1, 4), dp_ring_factor(4, 1)
    (1.1666666666666667, 0.8571428571428571, 0.0, 1.0)
    """
    def share(k: int) -> float:
        return (k - 1) / k if k > 1 else 0.0

    return share(n) / share(d) if d > 1 else 1.0


def ideal_op_work(graph_builder: OpGraph) -> np.ndarray:
    """Per op, StragglerAnalysis' ideal value: its op type's mean work (compute) or median transfer (communication)
    over every rank, micro-batch and step of the job."""
    ops = graph_builder.ops
    w = pd.Series(graph_builder.work())
    by = ops["optype"].to_numpy()
    return np.where(graph_builder.is_comm, w.groupby(by).transform("median").to_numpy(),
                    w.groupby(by).transform("mean").to_numpy())


def _lower_median(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Per element, the lower median of its group (``group``: codes 0..G-1): one sort, no per-group Python.

    >>> _lower_median(np.array([3., 1., 2., 9., 8.]), np.array([0, 0, 1, 0, 1])).tolist()
    [3.0, 3.0, 2.0, 3.0, 2.0]
    """
    order = np.lexsort((values, group))
    counts = np.bincount(group)
    first = np.r_[0, np.cumsum(counts)[:-1]]
    return values[order][first + (counts - 1) // 2][group]


def apply_op_scenarios(graph_builder: OpGraph, scenarios: list[Scenario], dp_size: int | None = None) -> np.ndarray:
    """Per op, its value under the scenarios (for :meth:`~prism.whatif.optrace.OpGraph.graph`).

    Starts from each op's work (:meth:`~prism.whatif.optrace.OpGraph.work`: a communication op's
    transfer, without its wait for peers), so the waiting is what the simulation recreates.
    """
    ops = graph_builder.ops
    d = graph_builder.work()
    comm = graph_builder.is_comm
    comm_scale = np.ones(len(ops))
    for sc in scenarios:
        if sc.kind == "remove-stragglers":
            # no op slower than its DP peers' lower median (of two peers: the faster one); faster ops keep theirs
            peers = ops.groupby(["step", "stage", "optype", "seq_id"], observed=True, sort=False).ngroup().to_numpy()
            d = np.where(comm, d, np.minimum(d, _lower_median(d, peers)))
        elif sc.kind == "ideal":
            d = ideal_op_work(graph_builder)
        elif sc.kind == "scale-comm":
            comm_scale *= np.where(comm, float(sc.value), 1.0)
        elif sc.kind == "scale-compute":
            comm_scale *= np.where(comm, 1.0, float(sc.value))
        elif sc.kind == "scale-dp":
            if not dp_size:
                raise ValueError("scale-dp needs the trace's DP size (--meta with dp_size)")
            if dp_size == 1:  # dp_ring_factor would leave it unchanged: say so rather than predict nothing changed
                raise ValueError(f"--scenario {sc}: the trace's DP size is 1: it has no DP collective to re-cost")
            f = dp_ring_factor(int(sc.value), dp_size)
            dp_coll = ops["optype"].isin(["grads-reduce-scatter", "params-all-gather"]).to_numpy()
            comm_scale *= np.where(dp_coll, f, 1.0)
        elif sc.kind in STRUCTURAL:
            continue  # applied to the trace or its work before (repartition)
        else:
            raise ValueError(f"--scenario {sc}: not available for op traces (heal-switch, heal-link and move-job need a network replay)")
    return d * comm_scale


def apply_kineto_scenarios(graph_builder: KinetoGraph, scenarios: list[Scenario]) -> np.ndarray:
    """Per item of a :class:`~prism.whatif.kineto.KinetoGraph`, its work (µs) under the scenarios.

    Starts from the work (an NCCL kernel's transfer, a host call's time after its wait); the compute operations are
    the GPU operations that are not NCCL kernels, and their peers the same kernel (name and occurrence in the step) on
    the other ranks. ``remove-stragglers``: no compute operation slower than its peers' lower median; ``ideal``: every
    compute operation at its peers' mean over ranks and steps, every NCCL transfer at the median of its collective's
    instances over the steps; ``scale-comm:X``/``scale-compute:X``: NCCL transfers / compute X times as long.
    """
    g = graph_builder
    it = g.items
    d = g.work()
    comm, compute = g.is_comm, g.is_gpu & ~g.is_comm
    occurrence = it.groupby(["rank", "step", "name"], sort=False).cumcount().to_numpy()
    for sc in scenarios:
        if sc.kind == "remove-stragglers":
            peers = pd.DataFrame({"step": it["step"], "name": it["name"], "k": occurrence}).groupby(
                ["step", "name", "k"], sort=False).ngroup().to_numpy()
            d = np.where(compute, np.minimum(d, _lower_median(d, peers)), d)
        elif sc.kind == "ideal":
            key = [it["name"].to_numpy(), occurrence]
            w = pd.Series(d)
            d = np.where(compute, w.groupby(key).transform("mean").to_numpy(),
                         np.where(comm, w.groupby(key).transform("median").to_numpy(), d))
        elif sc.kind == "scale-comm":
            d = np.where(comm, d * float(sc.value), d)
        elif sc.kind == "scale-compute":
            d = np.where(compute, d * float(sc.value), d)
        else:
            raise ValueError(f"--scenario {sc}: not available for Kineto traces (use remove-stragglers, ideal, scale-comm:X, "
                             "scale-compute:X)")
    return d
