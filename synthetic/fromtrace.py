"""Flow records DERIVED FROM REAL op-level traces, with exact ground truth.

The StragglerAnalysis traces (``../shared/data/straggler-analysis``) record
every operation of every rank of two production Megatron jobs: compute,
pipeline send/receive, the DP reduce-scatter and all-gather, the embedding
and grad-norm all-reduces. Their *timing* is real (real step times, real
stage imbalance, real sequence-length imbalance); what they lack is bytes
and placement. This module lays the traces onto a rail-optimised fabric and
turns each communication operation into the RDMA messages NCCL would send:

* a pipeline transfer (a ``forward-send`` at stage s and the ``forward-recv``
  of the same micro-batch at s+1; backward the other way) is one message per
  rail, starting when both ends are there;
* a DP reduce-scatter or all-gather over the ranks of one stage is a ring:
  ``D - 1`` ring steps spread over the operation's span (the last member's
  arrival to the first member's end), each member sending ``1/D`` of its
  gradient shard to the next, cut into messages of at most
  ``message_bytes``;
* the embedding all-reduce (first and last stage of a replica) is a
  two-member ring; the grad-norm clip all-reduce is a ring over the stages
  of each replica carrying a few bytes: both ride the pipeline's own pairs,
  which is exactly what confuses a size-counting DP/PP rule.

Each trace rank is placed as ``tp`` GPUs (tensor parallelism, one NIC per
GPU, rail ``i`` of a rank talking to rail ``i`` of its peers), ranks in
Megatron's tp-dp-pp order on consecutive servers. ``tp=8`` puts every DP
and PP edge on the network; ``tp=1`` (the traces' own TP size) puts eight
ranks on a server, hides DP ring edges on NVLink and sends the ring across
rails at server boundaries.

The traces sample steps (23, 25, 33, ...); their steps are laid end to end,
each starting where the previous one's last operation ended.

Truth (``GeneratedCluster``): the job, every pair's type (the embedding
pair between the first and last stage is pipeline traffic: PP), and steps
cut at the end of each step's last flow, the same definition as the
synthetic generator's.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .fabric import Fabric
from .generator import EPOCH_NS, FlowColumns, GeneratedCluster, storage_noise, truth_frames

__all__ = ["shared_data_dir", "TraceJob", "Straggler", "with_straggler", "trace_cluster", "read_trace_job", "collector_view", "CollectorNoise",
           "with_slow_transfers"]

MiB = 1 << 20

#: environment variable naming the real-data directory (``shared/data``)
SHARED_DATA_ENV = "PRISM_SHARED_DATA"


def shared_data_dir() -> Path:
    """The real captures and traces: ``$PRISM_SHARED_DATA``, else ``../shared/data`` beside the checkout.

    The tests and benchmarks that use real data skip or leave it out when
    the directory is missing; the variable lets a checkout anywhere (a CI
    workspace, a temporary clone) find it.
    """
    env = os.environ.get(SHARED_DATA_ENV)
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "data"


@dataclass
class TraceJob:
    """One op trace and how to turn it into traffic.

    Parameters
    ----------
    name : str
        Ground-truth job name.
    ops : DataFrame
        The StragglerAnalysis schema (``dp_rank, stage, step, optype,
        start_ts, duration, seq_id``; seconds).
    dp, pp : int
        Parallel sizes (the trace's ``meta-*.yaml``).
    tp : int
        GPUs (NICs) per trace rank.
    activation_bytes, grad_bytes, embedding_bytes : int
        Per trace rank: one pipeline message, the gradient buffer reduced
        every step, the embedding gradients; split evenly over the ``tp``
        rails.
    clip_bytes : int
        Bytes per message of the grad-norm all-reduce.
    message_bytes : int
        Largest RDMA message (NCCL chunk).
    steps : int, optional
        Use only the first this many steps.
    straggler : Straggler, optional
        Make one worker compute slower and re-time the whole trace through
        the dependency-driven simulator (:mod:`prism.whatif`): the faulty
        twin of a real job, with its truth.
    """

    name: str
    ops: pd.DataFrame
    dp: int
    pp: int
    tp: int = 8
    activation_bytes: int = 16 * MiB
    grad_bytes: int = 512 * MiB
    embedding_bytes: int = 128 * MiB
    clip_bytes: int = 16
    message_bytes: int = 4 * MiB
    steps: int | None = None
    straggler: "Straggler | None" = None

    @property
    def ranks(self) -> int:
        return self.dp * self.pp

    @property
    def gpus(self) -> int:
        return self.ranks * self.tp


@dataclass(frozen=True)
class Straggler:
    """One worker (``dp``, ``stage``) whose compute takes ``factor`` times as long from the ``from_step``-th step on."""

    dp: int
    stage: int
    factor: float = 2.0
    from_step: int = 5


def with_straggler(ops: pd.DataFrame, s: Straggler) -> pd.DataFrame:
    """The trace re-timed with a straggling worker.

    The worker's forward and backward compute is scaled; every other
    operation keeps its own (intrinsic) time, and when each starts follows
    from the dependencies (pipeline sends wait for their receivers,
    collectives for their last member): :class:`prism.whatif.optrace.OpGraph`
    and :func:`prism.whatif.graph.simulate`. Each op gets the start and end
    of its node, as a synchronising op lasts from its last member's arrival.
    """
    from prism.whatif.graph import simulate
    from prism.whatif.optrace import COMPUTE, OpGraph

    g = OpGraph(ops)
    o = g.ops
    steps = np.sort(o["step"].unique())
    hit = (o["dp_rank"] == s.dp) & (o["stage"] == s.stage) & o["optype"].isin(COMPUTE) & o["step"].isin(steps[s.from_step:])
    dur = o["duration"].to_numpy(np.float64) * np.where(hit, s.factor, 1.0)
    res = simulate(g.graph().with_durations(g.durations(dur)))
    start = res.start[g.node]
    finish = res.finish[g.node]
    single = g.members[g.node] == 1
    # a rank's own work starts when it is ready: keep its scaled duration
    finish = np.where(single, start + np.where(single, dur, 0.0), finish)
    return o.assign(start_ts=start, duration=finish - start)


def read_trace_job(directory, trial: str, **kw) -> TraceJob:
    """A :class:`TraceJob` from ``trace-<trial>.parquet`` and ``meta-<trial>.yaml``."""
    import yaml

    directory = Path(directory)
    meta = yaml.safe_load((directory / f"meta-{trial}.yaml").read_text())
    ops = pd.read_parquet(directory / f"trace-{trial}.parquet")
    return TraceJob(name=kw.pop("name", trial), ops=ops, dp=int(meta["dp_size"]), pp=int(meta["pp_size"]), **kw)


@dataclass(frozen=True)
class CollectorNoise:
    """What a real collector does to flow records.

    Parameters
    ----------
    resolution_ns : int
        Timestamp granularity (1000: microseconds).
    jitter_ns : float
        Standard deviation of per-record timestamp noise.
    clock_offset_ns : float
        Standard deviation of each capture point's (first switch's) clock
        offset, fixed over the capture.
    loss : float
        Share of flow records lost (mirror drops, collector overload).
    """

    resolution_ns: int = 1000
    jitter_ns: float = 2000.0
    clock_offset_ns: float = 5000.0
    loss: float = 0.002


def collector_view(flows: pd.DataFrame, noise: CollectorNoise, seed: int = 0) -> pd.DataFrame:
    """The flow records a collector with ``noise`` would report (truth unchanged).

    >>> f = pd.DataFrame({"start_ns": np.arange(0, 10_000_000, 1000), "duration_ns": 5000,
    ...                   "src": "a", "dst": "b", "size": 1, "switches": pd.Categorical(["leaf"] * 10_000)})
    >>> v = collector_view(f, CollectorNoise(loss=0.01), seed=1)
    >>> 9_800 < len(v) < 10_000, bool((v["start_ns"] % 1000 == 0).all())
    (True, True)
    """
    rng = np.random.default_rng(seed)
    n = len(flows)
    keep = rng.random(n) >= noise.loss
    sw = pd.Categorical(flows["switches"])
    first = pd.Series(sw.categories.astype(str)).str.split("|").str[0]
    point, _ = pd.factorize(first)
    offset = rng.normal(0.0, noise.clock_offset_ns, len(point) + 1)
    codes = np.where(sw.codes >= 0, point[np.maximum(sw.codes, 0)] if len(point) else 0, len(point))
    start = flows["start_ns"].to_numpy(np.float64) + offset[codes] + rng.normal(0.0, noise.jitter_ns, n)
    end = start + flows["duration_ns"].to_numpy(np.float64) + rng.normal(0.0, noise.jitter_ns, n)
    res = max(int(noise.resolution_ns), 1)
    s = np.floor(start / res).astype(np.int64) * res
    e = np.maximum(np.ceil(end / res).astype(np.int64) * res, s + res)
    out = flows.assign(start_ns=s, duration_ns=e - s)[keep]
    return out.sort_values("start_ns", kind="stable").reset_index(drop=True)


def with_slow_transfers(cluster: GeneratedCluster, server: str, factor: float = 2.0) -> GeneratedCluster:
    """The cluster with every flow ``server``'s NICs send or receive ``factor`` times as long: a slow NIC (SYNTHETIC fault).

    Each such flow keeps its end (the steps, cut at their last flow's end,
    stay the truth's) and starts earlier. Adds a ``slow_nic`` fault naming
    the server, over the whole capture, to the truth.
    """
    ips = set(cluster.topology.loc[cluster.topology["server"] == server, "ip"])
    if not ips:
        raise ValueError(f"no server {server!r} in the topology")
    f = cluster.flows
    hit = (f["src"].astype(str).isin(ips) | f["dst"].astype(str).isin(ips)).to_numpy()
    dur = f["duration_ns"].to_numpy()
    longer = np.where(hit, np.round(dur * float(factor)).astype(np.int64), dur)
    flows = f.assign(start_ns=f["start_ns"].to_numpy() + dur - longer, duration_ns=longer)
    flows = flows.sort_values("start_ns", kind="stable").reset_index(drop=True)
    fault = pd.DataFrame([("slow_nic", "", -1, cluster.meta["window_start_ns"], cluster.meta["window_end_ns"], server, float(factor))],
                         columns=cluster.faults.columns)
    faults = pd.concat([cluster.faults, fault], ignore_index=True) if len(cluster.faults) else fault
    return GeneratedCluster(flows, cluster.topology, cluster.jobs, cluster.pairs, cluster.steps, faults, dict(cluster.meta, with_faults=True))


# ----------------------------------------------------------------------------
def _step_offsets(ops: pd.DataFrame) -> pd.Series:
    """Start (s) of each step when the trace's steps are laid end to end."""
    end = (ops["start_ts"] + ops["duration"]).groupby(ops["step"]).max().sort_index()
    return pd.Series(np.concatenate([[0.0], np.cumsum(end.to_numpy())[:-1]]), index=end.index)


def _messages(nbytes: int, message_bytes: int) -> np.ndarray:
    full, rem = divmod(int(nbytes), int(message_bytes))
    return np.array([message_bytes] * full + ([rem] if rem else []), dtype=np.int64)


class _Emitter:
    """Flows of one job onto the fabric, per rail, with their kind and step."""

    def __init__(self, fab: Fabric, job: TraceJob, gpu0: int):
        self.fab, self.job, self.gpu0 = fab, job, gpu0
        self.bw = fab.bytes_per_ns
        self.parts: list[tuple] = []

    def node(self, dp, stage) -> np.ndarray:
        """First GPU of each (dp, stage) rank (Megatron order: tp, then dp, then pp)."""
        return self.gpu0 + (np.asarray(dp, np.int64) + self.job.dp * np.asarray(stage, np.int64)) * self.job.tp  # traces store int8

    def send(self, t0_ns, a_rank, b_rank, sizes: np.ndarray, step):
        """Messages ``sizes`` from rank a to rank b on every rail, back to back from ``t0_ns``.

        All arguments but ``sizes`` are arrays over transfers.
        """
        tp = self.job.tp
        t0 = np.asarray(t0_ns, np.float64)
        n = len(t0)
        if n == 0 or len(sizes) == 0:
            return
        wire = self.fab.latency_ns + sizes / self.bw  # (m,)
        offs = np.concatenate([[0.0], np.cumsum(sizes / self.bw)[:-1]])
        st = t0[:, None, None] + offs[None, None, :] + np.zeros((1, tp, 1))  # (n, tp, m)
        shape = st.shape
        rail = np.arange(tp)[None, :, None]
        a = np.broadcast_to(np.asarray(a_rank)[:, None, None] + rail, shape)
        b = np.broadcast_to(np.asarray(b_rank)[:, None, None] + rail, shape)
        self.parts.append((st.ravel(), np.broadcast_to(wire[None, None, :], shape).ravel(), a.ravel(), b.ravel(),
                           np.broadcast_to(sizes[None, None, :], shape).ravel(), np.broadcast_to(np.asarray(step)[:, None, None], shape).ravel()))

    def ring(self, t0_ns, t1_ns, members: np.ndarray, ring_steps: int, chunk_bytes: int, step):
        """A ring collective per instance: ``members`` (instances, n) in ring order."""
        k = members.shape[1]
        if k < 2 or ring_steps < 1:
            return
        sizes = _messages(chunk_bytes, self.job.message_bytes)
        span = np.maximum(np.asarray(t1_ns, np.float64) - t0_ns, 0.0)
        wire = float(sizes.sum() / self.bw + self.fab.latency_ns)
        per = np.maximum(span / ring_steps, wire)
        nxt = np.roll(members, -1, axis=1)
        for j in range(ring_steps):
            t = np.asarray(t0_ns, np.float64) + j * per
            self.send(np.repeat(t, k), members.ravel(), nxt.ravel(), sizes, np.repeat(step, k))

    def columns(self):
        if not self.parts:
            return None
        return [np.concatenate(x) for x in zip(*self.parts)]


def _ns(x) -> np.ndarray:
    return np.asarray(x, np.float64) * 1e9


def _emit_job(em: _Emitter, job: TraceJob) -> None:
    ops = job.ops
    steps = np.sort(ops["step"].unique())
    if job.steps is not None:
        ops = ops[ops["step"].isin(steps[: job.steps])]
    if job.straggler is not None:
        ops = with_straggler(ops, job.straggler)
    off = _step_offsets(ops)
    t = ops["step"].map(off).to_numpy() + ops["start_ts"].to_numpy(np.float64)
    o = ops.assign(t0=_ns(t), t1=_ns(t + ops["duration"].to_numpy(np.float64)))
    D, P, tp = job.dp, job.pp, job.tp
    # pipeline transfers: a send and the matching receive on the next (previous) stage
    act = _messages(job.activation_bytes // tp, job.message_bytes)
    for send, recv, delta in (("forward-send", "forward-recv", 1), ("backward-send", "backward-recv", -1)):
        s = o[o["optype"] == send]
        r = o.loc[o["optype"] == recv, ["step", "dp_rank", "stage", "seq_id", "t0"]].rename(columns={"stage": "peer", "t0": "t0_r"})
        m = s.assign(peer=s["stage"] + delta).merge(r, on=["step", "dp_rank", "peer", "seq_id"])
        start = np.maximum(m["t0"].to_numpy(), m["t0_r"].to_numpy())
        em.send(start, em.node(m["dp_rank"], m["stage"]), em.node(m["dp_rank"], m["peer"]), act, m["step"].to_numpy())
    # collectives: (t0, t1) = last member's arrival, first member's end
    def spans(optype, by):
        c = o[o["optype"] == optype]
        g = c.groupby(["step"] + by)
        return pd.DataFrame({"t0": g["t0"].max(), "t1": g["t1"].min()}).reset_index()

    if D > 1:
        dp_ring = np.arange(D)
        for optype in ("params-all-gather", "grads-reduce-scatter"):
            sp = spans(optype, ["stage"])
            members = em.node(dp_ring[None, :], sp["stage"].to_numpy()[:, None])
            em.ring(sp["t0"].to_numpy(), sp["t1"].to_numpy(), members, D - 1, job.grad_bytes // tp // D, sp["step"].to_numpy())
    if P > 1:
        sp = spans("embedding-grads-all-reduce", ["dp_rank"])
        members = np.stack([em.node(sp["dp_rank"], 0), em.node(sp["dp_rank"], P - 1)], axis=1)
        em.ring(sp["t0"].to_numpy(), sp["t1"].to_numpy(), members, 2, job.embedding_bytes // tp // 2, sp["step"].to_numpy())
        # the grad-norm all-reduce: a ring over the stages of every replica
        sp = spans("optimizer-clip-main-grad", ["dp_rank"])
        members = em.node(sp["dp_rank"].to_numpy()[:, None], np.arange(P)[None, :])
        em.ring(sp["t0"].to_numpy(), sp["t1"].to_numpy(), members, 2 * (P - 1), job.clip_bytes, sp["step"].to_numpy())


def _truth_pairs(job: TraceJob, em: _Emitter) -> pd.DataFrame:
    D, P, tp = job.dp, job.pp, job.tp
    rail = np.arange(tp)
    rows = []
    d, s = np.meshgrid(np.arange(D), np.arange(P), indexing="ij")
    if P > 1:
        a = em.node(d[:, :-1], s[:, :-1])[..., None] + rail
        b = em.node(d[:, 1:], s[:, 1:])[..., None] + rail
        rows.append(("PP", a.ravel(), b.ravel()))
        a = em.node(np.arange(D), 0)[:, None] + rail
        b = em.node(np.arange(D), P - 1)[:, None] + rail
        rows.append(("PP", a.ravel(), b.ravel()))  # the embedding group: first and last stage of a pipeline
    if D > 1:
        a = em.node(d, s)[..., None] + rail
        b = em.node((d + 1) % D, s)[..., None] + rail
        rows.append(("DP", a.ravel(), b.ravel()))
    if not rows:
        return pd.DataFrame(columns=["job_id", "a", "b", "type"])
    return pd.concat([pd.DataFrame({"job_id": job.name, "a": np.minimum(a, b), "b": np.maximum(a, b), "type": t}) for t, a, b in rows])


def trace_cluster(jobs: list[TraceJob], servers_per_group: int = 8, spines: int = 8, noise: CollectorNoise | None = None,
                  seed: int = 0, storage_flows_per_s: float = 20.0) -> GeneratedCluster:
    """Place the traced jobs on one fabric and derive their flows and truth.

    Parameters
    ----------
    jobs : list of TraceJob
        Placed on consecutive servers, one idle server between jobs.
    servers_per_group, spines : int
        Fabric shape (:class:`synthetic.fabric.Fabric`).
    noise : CollectorNoise, optional
        Apply a collector's granularity, jitter, clock offsets and loss.
    seed : int
        For the storage noise and the collector.
    storage_flows_per_s : float
        Background storage traffic (not training).
    """
    gps = 8
    need = [-(-j.gpus // gps) for j in jobs]
    fab = Fabric(servers=sum(need) + len(jobs), servers_per_group=servers_per_group, spines=spines)
    cols = FlowColumns()
    truth_pairs, truth_steps, placement, placement_gpu = [], [], {}, {}
    gpu0 = 0
    switch_names = fab.switch_names()
    for job, n_srv in zip(jobs, need):
        em = _Emitter(fab, job, gpu0)
        _emit_job(em, job)
        c = em.columns()
        if c is not None:
            st, du, a, b, sz, step = c
            paths = fab.paths(a, b)
            net = paths[:, 0] >= 0
            cols.add(st[net], du[net], a[net], b[net], sz[net], paths[net])
            # steps: each ends with its last flow on the network
            end = pd.Series(st[net] + du[net]).groupby(step[net]).max().sort_index()
            for k in range(1, len(end)):
                truth_steps.append((job.name, k - 1, float(end.iloc[k - 1]), float(end.iloc[k])))
        truth_pairs.append(_truth_pairs(job, em))
        placement[job.name] = [fab.server_name(s) for s in range(gpu0 // gps, gpu0 // gps + n_srv)]
        placement_gpu[job.name] = gpu0
        gpu0 += (n_srv + 1) * gps
    rng = np.random.default_rng(seed)
    last = max((max(cols.start[i].max() + cols.dur[i].max() for i in range(len(cols.start)))), 1.0) if cols.start else 1.0
    # the capture goes on (storage traffic) for a longest step after the jobs' last flow
    longest = max((j.ops["start_ts"] + j.ops["duration"]).groupby(j.ops["step"]).max().max() for j in jobs) * 1e9
    duration = last + longest
    storage_noise(cols, fab, rng, duration, storage_flows_per_s)
    flows = cols.frame(fab, switch_names, duration)
    if noise is not None:
        flows = collector_view(flows, noise, seed)
    topo = pd.DataFrame(fab.topology_rows())
    ips = np.array(topo["ip"])
    pairs = pd.concat(truth_pairs, ignore_index=True)
    pairs = pairs[fab.paths(pairs["a"].to_numpy(), pairs["b"].to_numpy())[:, 0] >= 0]  # pairs inside a server are not on the network
    pairs_df, jobs_df = truth_frames(pairs, ips)
    steps_df = pd.DataFrame(truth_steps, columns=["job_id", "step", "start_ns", "end_ns"])
    for c in ("start_ns", "end_ns"):
        steps_df[c] = EPOCH_NS + steps_df[c].round().astype(np.int64)
    faults = []
    for j in jobs:
        if j.straggler is None:
            continue
        st = steps_df[steps_df["job_id"] == j.name]
        k = max(j.straggler.from_step - 1, 0)  # truth step k ends with trace step k + 1
        first_gpu = placement_gpu[j.name] + (j.straggler.dp + j.dp * j.straggler.stage) * j.tp
        servers = sorted({fab.server_name(g // gps) for g in range(first_gpu, first_gpu + j.tp)})
        if len(st) > k:
            faults.append(("slow_group", j.name, k, int(st["start_ns"].iloc[k]), int(st["end_ns"].iloc[-1]), "|".join(servers), j.straggler.factor))
    faults_df = pd.DataFrame(faults, columns=["kind", "job_id", "step", "start_ns", "end_ns", "subject", "factor"])
    meta = {
        "synthetic": False,
        "generator": "prism synthetic.fromtrace: flows DERIVED FROM REAL op traces (real timing; sizes and placement modelled)",
        "seed": seed,
        "with_faults": any(j.straggler is not None for j in jobs),
        "window_start_ns": EPOCH_NS,
        "window_end_ns": EPOCH_NS + int(duration),
        "jobs": {j.name: {"dp": j.dp, "pp": j.pp, "tp": j.tp, "servers": placement[j.name]} for j in jobs},
        "collector_noise": None if noise is None else noise.__dict__,
    }
    return GeneratedCluster(flows, topo, jobs_df, pairs_df, steps_df, faults_df, meta)
