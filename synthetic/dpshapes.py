"""Data-parallel-only job shapes (SYNTHETIC): DDP, ZeRO-1/2, ZeRO-3/FSDP, HSDP, small fine-tuning jobs.

A :class:`DPJob` is a :class:`~synthetic.workload.JobSpec` whose every GPU
is its own data-parallel rank (no tensor or pipeline parallelism): ``dp``
servers of ``tp`` (= the server's GPUs) ranks each. A collective over the
job's ranks runs as the NCCL rings of a rail-optimised fabric do: the
server's GPUs reduce over NVLink (off the network) and each rail's NICs run
one ring across the servers, carrying ``1/tp`` of the bytes. Every rank
holds ``grad_bytes`` of parameters (and as many of gradients).

========= ==================================================================
shape     one optimizer step (``microbatches`` micro-batches of gradient
          accumulation; the step of ``steps.csv`` is the optimizer step)
========= ==================================================================
ddp       bucketed ring all-reduce overlapping each backward it follows:
          the last micro-batch's only with ``no_sync`` (the default), every
          micro-batch's without; the backward waits for its buckets, then
          the optimizer (no traffic)
zero1     DeepSpeed ZeRO-1: bucketed all-reduce of the gradients with the
          last micro-batch's backward, the optimizer (``optimizer_ms``: a
          CPU optimizer's long gap, no traffic), then a bucketed all-gather
          of the updated parameters
zero2     ZeRO-2: a bucketed reduce-scatter with every micro-batch's
          backward, then the optimizer gap and the all-gather
fsdp      ZeRO-3 / FSDP: per layer (``layers`` FSDP units of
          ``grad_bytes / layers``) an all-gather before its forward and
          again before its backward (one layer prefetched), and a
          reduce-scatter after its backward, every micro-batch; the step
          ends with the last reduce-scatter, then the optimizer
hsdp      FSDP sharded within groups of ``shard_servers`` servers,
          replicated across them: after each reduce-scatter, an all-reduce
          of the shard (``1 / shard_servers`` of the layer) over the ranks
          holding the same shard in the other groups
========= ==================================================================

A step's truth is the optimizer step, cut where the existing 3D jobs cut
it: at the end of its gradient collective (DDP's last bucket, ZeRO-1's
all-reduce, ZeRO-2's last reduce-scatter, FSDP/HSDP's last reduce-scatter
or all-reduce). ZeRO's all-gather of the updated parameters (after the
optimizer's gap) thus opens the next step, as the distributed optimizer's
all-gather does in the 3D jobs: on the wire a CPU optimizer's gap before
the all-gather and a GPU optimizer's are the same pattern, so they get
one truth. The next step's traffic starts after the optimizer (ZeRO: the
all-gather) and any checkpoint (``checkpoint_every``). Ground-truth pairs are all ``DP``; the
shape is in the manifest's jobs (``meta["jobs"][name]["shape"]``) and
:data:`FAMILY` names its family (ring, sharded, hybrid) for a scorer.

Collective timing: every server runs its own compute clock (per-server
jitter, and a fault's factor), so the members issue a collective at
different times, and a member enters it once it has issued it and its
communication stream is free. The rings run as NCCL's network transport
does, a rendezvous: ring edge ``i -> i+1`` moves data once both its ends
are in (the receiver has posted its buffer), and ring step ``r`` of edge
``i`` once the edge has sent step ``r - 1`` and received edge ``i - 1``'s
(the predecessor's chunk), so a late member's lateness spreads one hop a
ring step, and each member is done with its last send and receive. Every
record is one message, none spans a wait: the early members' first
messages go between early members, and the slow server and its ring
predecessor first send when it enters, it and its successor first
receive then (the arrival diagnosis names the server late in both,
:mod:`prism.analysis.diagnosis.arrival`). In a 2-server ring both edges
start as the later member enters, a tie; the receiver's clear-to-send
(``cts_bytes``, a record from receiver to sender as the receiver enters,
one an edge and collective) is then the only order on the wire, and
:data:`CTS_BYTES` says whether the matrix jobs record it. A model where
each member's first message started at its own entry and was recorded as
lasting until the ring moved (a record that spans the wait) named the
slow servers too, but made the early ranks' flows look slow to the switch
and host diagnosis (false ``slow_host`` on 3-minute steps), and was
withdrawn; the flows re-timed that way remain a test of the diagnosis
(``tests/test_arrival.py``).

A :class:`~synthetic.faults.SlowServer` makes the ranks of one server
compute slower: at every collective it arrives last and the others wait
(a collective starts when all its members are ready).

:func:`dp_cluster` builds one cluster of the DP-shapes matrix: one shape at
one step length (:data:`DP_SHAPES`, :data:`STEP_LENGTHS`), faulty or its
fault-free twin.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .fabric import Fabric
from .faults import SlowServer, SlowStep
from .generator import ClusterGenerator, GeneratedCluster, JobSimulation
from .workload import JobSpec

__all__ = ["DPJob", "SHAPES", "FAMILY", "DP_SHAPES", "STEP_LENGTHS", "EARLY_FAULT_STEP", "dp_job", "dp_generator", "dp_cluster", "DPShapeSimulation"]

MiB = 1 << 20
GiB = 1 << 30

#: shapes a :class:`DPJob` may have
SHAPES = ("ddp", "zero1", "zero2", "fsdp", "hsdp")
#: the family of each shape, for a scorer: one ring all-reduce, sharded collectives, or both
FAMILY = {"3d": "3d", "ddp": "ring", "zero1": "sharded", "zero2": "sharded", "fsdp": "sharded", "hsdp": "hybrid"}


@dataclass(frozen=True)
class DPJob(JobSpec):
    """A data-parallel-only job (see the module docstring).

    Parameters (beyond :class:`~synthetic.workload.JobSpec`'s)
    ------------------------------------------------------------
    shape : {"ddp", "zero1", "zero2", "fsdp", "hsdp"}
    no_sync : bool
        DDP under gradient accumulation: all-reduce only with the last
        micro-batch (``model.no_sync()`` on the others). False: with every
        micro-batch. Only DDP reads it.
    layers : int
        FSDP units (FSDP and HSDP): each all-gathers and reduce-scatters
        ``grad_bytes / layers``; forward and backward compute split evenly.
    shard_servers : int
        HSDP: servers per sharding group (must divide ``dp``, 2 or more).
    cts_bytes : int
        The clear-to-send each ring edge's receiver sends its sender as it
        enters a collective (one record an edge and collective); 0: none.

    ``tp`` is the GPUs (rails) of a server, ``dp`` the servers, ``pp`` 1;
    ``bucket_bytes`` the DDP bucket (and ZeRO's reduce and all-gather
    bucket); ``optimizer_ms`` the optimizer (ZeRO: the CPU optimizer's gap
    between the gradient collective and the all-gather).
    """

    shape: str = "ddp"
    no_sync: bool = True
    layers: int = 16
    shard_servers: int = 0
    cts_bytes: int = 0

    def check(self, gpus_per_server: int = 8) -> None:
        super().check(gpus_per_server)
        if self.shape not in SHAPES:
            raise ValueError(f"{self.name}: shape must be one of {', '.join(SHAPES)}, not {self.shape!r}")
        if self.tp != gpus_per_server or self.pp != 1:
            raise ValueError(f"{self.name}: a DP-only job has tp = the {gpus_per_server} GPUs of a server (its rails) and pp = 1")
        if self.shape in ("fsdp", "hsdp") and (self.layers < 1 or self.grad_bytes < self.layers * self.tp):
            raise ValueError(f"{self.name}: layers must be >= 1 and grad_bytes hold a byte per layer and rail")
        if self.shape == "hsdp" and (self.shard_servers < 2 or self.dp % self.shard_servers or self.dp == self.shard_servers):
            raise ValueError(f"{self.name}: hsdp needs shard_servers >= 2 dividing dp={self.dp} into 2 or more groups")

    @property
    def family(self) -> str:
        return FAMILY[self.shape]

    def collectives_per_step(self) -> dict[str, int]:
        """Collectives of one optimizer step, by kind (what the flows of a truth step hold).

        >>> DPJob("j", dp=2, shape="fsdp", microbatches=4, layers=8).collectives_per_step()
        {'all-gather': 64, 'reduce-scatter': 32}
        >>> DPJob("j", dp=2, shape="ddp", microbatches=4, grad_bytes=250, bucket_bytes=100).collectives_per_step()
        {'all-reduce': 3}
        """
        nb, M, L = len(self.bucket_sizes()), self.microbatches, self.layers
        if self.shape == "ddp":
            return {"all-reduce": nb * (1 if self.no_sync else M)}
        if self.shape == "zero1":
            return {"all-reduce": nb, "all-gather": nb}
        if self.shape == "zero2":
            return {"reduce-scatter": nb * M, "all-gather": nb}
        out = {"all-gather": 2 * L * M, "reduce-scatter": L * M}
        if self.shape == "hsdp":
            out["all-reduce"] = L * M
        return out


class DPShapeSimulation(JobSimulation):
    """One DP-only job, step by step (:class:`DPJob`).

    Per-server clocks: compute advances each server's clock; a member
    enters a collective when it has issued it and its communication stream
    is free (one stream per rank: collectives run in issue order); each
    ring edge moves once both its ends are in, ``phases * (k - 1)`` ring
    steps, each once the edge's previous step is sent and its
    predecessor's received (:meth:`_coll`); a member is done with its last
    send and receive.
    """

    spec: DPJob

    def __init__(self, gen, spec: DPJob, servers, rng, degraded):
        super().__init__(gen, spec, servers, rng, degraded)
        S = spec.dp
        srv = np.arange(S)
        rings = {"all": srv[None, :]}
        if spec.shape == "hsdp":
            g = spec.shard_servers
            rings["shard"] = srv.reshape(S // g, g)
            rings["replica"] = srv.reshape(S // g, g).T.copy()
        self.rings = {}
        self.rings_back: dict[str, np.ndarray] = {}  # the reverse paths (b -> a), for the clear-to-send
        for name, mem in rings.items():
            a = self.gpu[:, mem, 0]  # (T, rings, k)
            b = np.roll(a, -1, axis=-1)
            paths, net = self._pair_info(a, b)
            self.rings[name] = (mem, a, b, paths, net)
            if spec.cts_bytes > 0:
                self.rings_back[name] = self._pair_info(b, a)[0]
        self.comm_free = np.zeros(S)
        self.bw: dict[str, np.ndarray] = {}

    # ------------------------------------------------------------------
    def _used_rings(self) -> list[str]:
        return ["shard", "replica"] if self.spec.shape == "hsdp" else ["all"]

    def _record_dp_pairs(self, truth_pairs) -> None:
        import pandas as pd

        for name in self._used_rings():
            _, a, b, _, net = self.rings[name]
            if net.any() and a.shape[-1] > 1:
                a, b = a[net], b[net]
                truth_pairs.append(pd.DataFrame({"job_id": self.spec.name, "a": np.minimum(a, b), "b": np.maximum(a, b), "type": "DP"}))

    def _set_bw(self, t: float, noise: np.ndarray) -> None:
        """Per-edge bandwidth of every ring for this step (degraded switches at ``t``, per-server noise)."""
        for name, (mem, _, _, paths, _) in self.rings.items():
            self.bw[name] = self.fab.bytes_per_ns * self._bw_factor(paths, t) / noise[:, mem]

    def _coll(self, cols, ring: str, issue: np.ndarray, nbytes: int, phases: int) -> np.ndarray:
        """A ring collective of ``nbytes`` per rank over each ring of kind ``ring``; end time per server (S,).

        A rendezvous, as NCCL's network transport runs: ring edge ``i -> i+1``
        moves data once both its ends are in (the receiver has posted its
        buffer), and ring step ``r`` of edge ``i`` once it has sent its step
        ``r - 1`` and received edge ``i - 1``'s (its predecessor's chunk): a
        late member's lateness spreads one hop a ring step. Each member ends
        with its last send and receive. With ``cts_bytes`` each edge's
        receiver also sends its sender a clear-to-send of that size when it
        enters (one record, per edge and collective).
        """
        fab, T = self.fab, self.spec.tp
        mem, a, b, paths, net = self.rings[ring]
        nr, k = mem.shape
        ready = np.maximum(issue, self.comm_free)  # (S,) each server enters the collective
        rm = ready[mem]  # (nr, k)
        chunk = max(1, -(-int(nbytes) // (T * k)))
        n_full, rem = divmod(chunk, self.spec.message_bytes)
        sizes = np.array([self.spec.message_bytes] * n_full + ([rem] if rem else []), dtype=np.int64)
        bw = self.bw[ring]  # (T, nr, k)
        edge_t = np.where(net, fab.latency_ns + chunk / bw, chunk / fab.nvlink_bytes_per_ns)
        R = phases * (k - 1)
        st = np.empty((max(R, 1), T, nr, k))  # each ring step's start per edge
        st[0] = np.maximum(rm, np.roll(rm, -1, axis=1))[None]  # both ends in
        for r in range(1, R):
            done = st[r - 1] + edge_t
            st[r] = np.maximum(done, np.roll(done, 1, axis=-1))  # its previous chunk sent, its predecessor's received
        if net.any():
            ti, ri, ki = np.nonzero(net)
            offs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
            bwe = bw[ti, ri, ki][:, None, None]
            t0 = st[:R, ti, ri, ki].T[:, :, None] + offs[None, None, :] / bwe  # (edges, R, messages)
            du = np.broadcast_to(fab.latency_ns + sizes[None, None, :] / bwe, t0.shape)
            shape = t0.shape
            cols.add(t0.ravel(), du.ravel(), np.broadcast_to(a[ti, ri, ki][:, None, None], shape).ravel(),
                     np.broadcast_to(b[ti, ri, ki][:, None, None], shape).ravel(), np.broadcast_to(sizes[None, None, :], shape).ravel(),
                     np.broadcast_to(paths[ti, ri, ki][:, None, None, :], shape + (3,)).reshape(-1, 3))
            cts = self.spec.cts_bytes
            if cts > 0 and R > 0:  # the receiver's clear-to-send, when it enters
                rpaths = self.rings_back[ring]
                cols.add(np.roll(rm, -1, axis=1)[ri, ki], fab.latency_ns + cts / bw[ti, ri, ki], b[ti, ri, ki], a[ti, ri, ki],
                         np.full(len(ti), cts, dtype=np.int64), rpaths[ti, ri, ki])
        if R == 0:
            end = np.broadcast_to(rm, (T, nr, k))
        else:
            sent = st[R - 1] + edge_t  # (T, nr, k) each edge's last chunk delivered
            end = np.maximum(sent, np.roll(sent, 1, axis=-1))  # member i: its last send and its last receive
        out = np.empty(self.spec.dp)
        out[mem] = end.max(axis=0)
        self.comm_free[mem] = out[mem]
        return out

    def _buckets(self, cols, ready: np.ndarray, span: np.ndarray, phases: int) -> np.ndarray:
        """The gradient buckets, each issued as its share of the backward (``ready`` + ``span``) is done."""
        nb = len(self.buckets)
        end = ready
        for i, size in enumerate(self.buckets):
            end = self._coll(cols, "all", ready + span * (i + 1) / nb, int(size), phases)
        return end

    def _step_buckets(self, cols, t: float, F, B) -> tuple[float, float]:
        """DDP, ZeRO-1 and ZeRO-2: (end of the step's last collective, when the next step may start)."""
        spec = self.spec
        M = F.shape[0]
        c = np.full(spec.dp, t)
        end = np.full(spec.dp, -np.inf)
        for m in range(M):
            c = c + F[m].sum(axis=0)
            b = B[m].sum(axis=0)
            last = m == M - 1
            if spec.shape == "zero2" or (spec.shape == "ddp" and not spec.no_sync) or last:
                end = self._buckets(cols, c, b, 1 if spec.shape == "zero2" else 2)
                c = np.maximum(c + b, end)  # the backward's end waits for its buckets
            else:
                c = c + b
        if spec.shape == "ddp":
            return float(end.max()), float(c.max()) + spec.optimizer_ms * 1e6
        # ZeRO: the (CPU) optimizer, then the updated parameters all-gathered, bucket by bucket; the
        # step ends with its gradient collective (the all-gather opens the next one, as the
        # distributed optimizer's does: on the wire the two are the same)
        grad_end = float(end.max())
        c = c + spec.optimizer_ms * 1e6
        for size in self.buckets:
            end = self._coll(cols, "all", c, int(size), 1)
        return grad_end, float(end.max())

    def _step_sharded(self, cols, t: float, F, B) -> tuple[float, float]:
        """FSDP and HSDP: (end of the step's last collective, when the next step may start)."""
        spec = self.spec
        M, L = F.shape[:2]
        lb = spec.grad_bytes // L
        hsdp = spec.shape == "hsdp"
        ring = "shard" if hsdp else "all"
        c = np.full(spec.dp, t)
        done = c
        for m in range(M):
            ag = self._coll(cols, ring, c, lb, 1)
            for layer in range(L):  # forward: a layer waits for its parameters; the next layer's are prefetched
                start = np.maximum(c, ag)
                if layer + 1 < L:
                    ag = self._coll(cols, ring, start, lb, 1)
                c = start + F[m, layer]
            ag = self._coll(cols, ring, c, lb, 1)
            for layer in reversed(range(L)):  # backward: all-gather again, reduce-scatter after
                start = np.maximum(c, ag)
                if layer > 0:
                    ag = self._coll(cols, ring, start, lb, 1)
                c = start + B[m, layer]
                done = self._coll(cols, ring, c, lb, 1)
                if hsdp:
                    done = self._coll(cols, "replica", done, lb // spec.shard_servers, 2)
            c = np.maximum(c, done)  # the backward's end waits for its reductions
        return float(done.max()), float(c.max()) + spec.optimizer_ms * 1e6

    # ------------------------------------------------------------------
    def run(self, cols, truth_pairs, truth_steps, truth_faults) -> None:
        gen, spec, fab, rng = self.gen, self.spec, self.fab, self.rng
        T, S, M = spec.tp, spec.dp, spec.microbatches
        sharded = spec.shape in ("fsdp", "hsdp")
        L = spec.layers if sharded else 1
        window = gen.duration_ns
        t = -rng.uniform(0.2, 0.8) * spec.lower_bound_step_ns()
        self._record_dp_pairs(truth_pairs)
        faults = [f for f in gen.faults if getattr(f, "job", None) == spec.name] if gen.with_faults else []
        step_fn = self._step_sharded if sharded else self._step_buckets
        sim_step, whole, prev_end = 0, -1, t
        while t < window:
            # fixed-shape draws (identical with and without faults)
            jit = rng.lognormal(0.0, spec.jitter, size=(2, M, L, S))
            noise = rng.lognormal(0.0, 0.02, size=(T, S))
            k = whole + 1 if sim_step > 0 else -1
            factor = np.ones(S)
            for f in faults:
                if isinstance(f, SlowStep) and f.step == k:
                    factor = factor * f.factor
                if isinstance(f, SlowServer) and k >= f.from_step:
                    factor[f.server] *= f.factor
            F = spec.fwd_ms * 1e6 / L * factor * jit[0]  # (M, L, S)
            B = spec.fwd_ms * spec.bwd_ratio * 1e6 / L * factor * jit[1]
            self._set_bw(t, noise)
            self.comm_free = np.full(S, t)
            step_end, next_t = step_fn(cols, t, F, B)
            if sim_step > 0 and prev_end >= 0 and step_end <= window:
                whole += 1
                self._record_step(truth_steps, truth_faults, faults, whole, prev_end, step_end,
                                  lambda f: fab.server_name(int(self.servers[f.server])))
            elif sim_step > 0 and prev_end >= 0:
                break  # ends past the window
            prev_end = step_end
            t = next_t + spec.checkpoint_ns(sim_step)
            sim_step += 1


# ----------------------------------------------------------------------
# the DP-shapes matrix

#: matrix shapes: (DPJob shape, servers, keyword changes)
DP_SHAPES: dict[str, tuple[str, int, dict]] = {
    "ddp": ("ddp", 4, {}),
    "ddp-sync": ("ddp", 4, {"no_sync": False}),
    "zero1": ("zero1", 4, {}),
    "zero2": ("zero2", 4, {}),
    "fsdp": ("fsdp", 4, {}),
    "hsdp": ("hsdp", 4, {"shard_servers": 2}),
    "finetune": ("fsdp", 2, {}),
}

#: the slow server's first step in the matrix's variant with the fault from the start (the capture's first two
#: steps run at the job's own pace): every collective in view but those waits for it
EARLY_FAULT_STEP = 2

#: the matrix jobs' clear-to-send (:attr:`DPJob.cts_bytes`)
CTS_BYTES = 0

#: step lengths: name -> (seconds, micro-batches, layers, parameter bytes, bucket bytes)
STEP_LENGTHS: dict[str, tuple[float, int, int, int, int]] = {
    "0.3s": (0.3, 2, 8, 256 * MiB, 25 * MiB),
    "5s": (5.0, 4, 16, 4 * GiB, 100 * MiB),
    "45s": (45.0, 8, 32, 14 * GiB, 200 * MiB),
    "3min": (180.0, 16, 32, 28 * GiB, 400 * MiB),
}


def dp_job(shape: str, length: str, name: str | None = None, **changes) -> DPJob:
    """The matrix's job of ``shape`` (a :data:`DP_SHAPES` key) taking about ``length`` (a :data:`STEP_LENGTHS` key) a step.

    About 96% of the step is compute (forward + 2x backward over the
    micro-batches; ZeRO: 85%), the rest the optimizer (ZeRO: a CPU
    optimizer, 10% of the step) and exposed communication.

    >>> j = dp_job("hsdp", "5s"); (j.shape, j.dp, j.shard_servers, j.microbatches)
    ('hsdp', 4, 2, 4)
    """
    kind, servers, kw = DP_SHAPES[shape]
    secs, M, L, params, bucket = STEP_LENGTHS[length]
    zero = kind in ("zero1", "zero2")
    compute = secs * (0.85 if zero else 0.96)
    spec: dict[str, Any] = dict(tp=8, pp=1, dp=servers, microbatches=M, fwd_ms=compute * 1e3 / (3 * M), bwd_ratio=2.0,
                optimizer_ms=secs * 1e3 * (0.10 if zero else 0.01), grad_bytes=params, bucket_bytes=bucket,
                message_bytes=16 * MiB, jitter=0.01, shape=kind, layers=L, cts_bytes=CTS_BYTES)
    if shape == "finetune":  # a 7B-class model, fewer layers' worth of FSDP units
        spec.update(layers=max(4, L // 2))
    spec.update(kw)
    spec.update(changes)
    return DPJob(name or f"{shape}-{length}", **spec)


def dp_generator(shape: str, length: str, seed: int = 0, duration_s: float = 60.0, with_faults: bool = True,
                 slow_factor: float = 1.4, from_step: int | None = None) -> ClusterGenerator:
    """One cluster of the DP-shapes matrix: the job alone on a small fabric with storage noise.

    The faulty run has one slow server (the job's second) from about a
    third of the window's steps on (``from_step``: from that step instead;
    :data:`EARLY_FAULT_STEP`, the matrix's variant with the fault from the
    start); ``with_faults=False`` is its twin.
    """
    job = dp_job(shape, length)
    secs = STEP_LENGTHS[length][0]
    if from_step is None:
        from_step = max(EARLY_FAULT_STEP, int(duration_s / secs) // 3)
    faults = [SlowServer(job.name, server=1, from_step=from_step, factor=slow_factor)]
    fabric = Fabric(servers=job.dp + 4, servers_per_group=4, spines=4)
    return ClusterGenerator(fabric, [job], duration_s=duration_s, faults=faults, seed=seed, with_faults=with_faults,
                            uniform_dp_share=0.0, storage_flows_per_s=50)


def dp_cluster(shape: str, length: str, seed: int = 0, duration_s: float = 60.0, with_faults: bool = True,
               from_step: int | None = None) -> GeneratedCluster:
    """Generate a cluster of the DP-shapes matrix (``meta["dp_shape"]``, ``meta["step_length"]`` say which).

    ``from_step``: the slow server's first step (default: a third of the
    window's steps; see :func:`dp_generator`).
    """
    c = dp_generator(shape, length, seed, duration_s, with_faults, from_step=from_step).generate()
    c.meta.update(dp_shape=shape, step_length=length)
    return c
