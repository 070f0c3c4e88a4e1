"""Modern training traffic (SYNTHETIC): mixture-of-experts all-to-all and context-parallel ring attention.

Two job shapes beside the Megatron-style 3D job of :mod:`synthetic.generator`
and the data-parallel shapes of :mod:`synthetic.dpshapes`. Both reuse the 3D
job's step loop (1F1B pipeline, DP ring after the last backward, faults,
truth steps ending at the DP collective) and add their own traffic inside
each forward and backward:

``MoEJob`` (DeepSeek-V3-like)
    ``pp`` stages; each stage holds ``domains`` expert-parallel domains of
    ``ep`` servers. The GPUs of one rail across a domain's servers form an
    EP group (one GPU per server, over the rail's leaf, as in rail-optimised
    fabrics), so the all-to-all is on the network. Per micro-batch and MoE
    layer (``moe_layers`` per stage): a dispatch and a combine in the
    forward, and again in the backward; each an all-to-all in which every
    rank of the group sends to every other, sizes skewed by hot experts
    (per step, layer and group a log-normal popularity of each expert rank,
    ``hot_skew``). The dense gradients are all-reduced after the last
    backward by a ring over all the stage's servers per rail (``dp`` =
    ``ep * domains`` ranks): its edges inside a domain ride EP pairs, the
    edges between domains are DP only.

``CPJob`` (ring attention)
    ``tp`` inside servers, ``cp`` context-parallel ranks on ``cp`` servers,
    ``dp`` replicas, ``pp`` stages (Megatron order tp-cp-dp-pp). Per
    micro-batch and attention layer (``attn_layers`` per stage), each rank
    passes its K/V block to its ring neighbour ``cp - 1`` times in the
    forward; in the backward ``cp - 1`` rounds carry the K/V block and its
    gradient (two flows). The DP all-reduce runs over the ``dp`` replicas
    per (rail, CP rank, stage).

Ground-truth pair types: ``EP`` (a pair of one EP group: it carries the
all-to-all, and for MoE jobs maybe a dense ring edge too), ``CP`` (a ring
attention edge), ``DP``, ``PP``. Steps end at the DP collective, as for the
3D jobs. :func:`modern_cluster` builds one job of either kind on a small
fabric, with a slow server as its fault, or its fault-free twin.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd

from .fabric import Fabric
from .faults import SlowServer
from .generator import ClusterGenerator, FlowColumns, GeneratedCluster, JobSimulation
from .workload import JobSpec

__all__ = ["MoEJob", "CPJob", "MoESimulation", "CPSimulation", "MODERN_KINDS", "modern_job", "modern_cluster"]

MiB = 1 << 20


@dataclass(frozen=True)
class MoEJob(JobSpec):
    """A mixture-of-experts job (see the module docstring).

    ``tp`` is the GPUs of a server (each GPU its own rank; the rails), ``dp``
    the servers of a stage (``ep * domains``: the dense DP ring), ``pp``
    the stages. ``a2a_bytes``: the mean bytes one rank sends one other rank
    in one all-to-all.
    """

    shape: str = "moe"
    ep: int = 8
    moe_layers: int = 2
    a2a_bytes: int = 2 * MiB
    hot_skew: float = 0.6

    def check(self, gpus_per_server: int = 8) -> None:
        super().check(gpus_per_server)
        if self.tp != gpus_per_server or self.ep < 2 or self.dp % self.ep or self.moe_layers < 1:
            raise ValueError(f"{self.name}: an MoE job has tp = the {gpus_per_server} GPUs of a server, dp a multiple of ep >= 2, moe_layers >= 1")

    @property
    def domains(self) -> int:
        return self.dp // self.ep


@dataclass(frozen=True)
class CPJob(JobSpec):
    """A context-parallel job (ring attention; see the module docstring).

    ``kv_bytes``: one K/V block (one rank's share of a layer's keys and
    values for one micro-batch, per rail).
    """

    shape: str = "cp"
    cp: int = 4
    attn_layers: int = 4
    kv_bytes: int = 8 * MiB

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def check(self, gpus_per_server: int = 8) -> None:
        super().check(gpus_per_server)
        if self.tp != gpus_per_server or self.cp < 2 or self.attn_layers < 1:
            raise ValueError(f"{self.name}: a CP job has tp = the {gpus_per_server} GPUs of a server, cp >= 2, attn_layers >= 1")

    def rank(self, t, d, p):
        """``d`` runs over CP rank and DP replica (``c + cp * d``): Megatron's tp-cp-dp-pp order, or tp-cp-pp-dp
        (``rank_order="tp-pp-dp"``: the CP ring stays inside a replica's stage, the replicas of a stage far apart).

        >>> j = CPJob("j", tp=8, cp=2, dp=2, pp=2)
        >>> int(j.rank(0, 1, 0)), int(j.rank(0, 2, 0)), int(j.rank(0, 0, 1))
        (8, 16, 32)
        >>> j = dataclasses.replace(j, rank_order="tp-pp-dp")
        >>> int(j.rank(0, 1, 0)), int(j.rank(0, 2, 0)), int(j.rank(0, 0, 1))
        (8, 32, 16)
        """
        if self.rank_order == "tp-pp-dp":
            return t + self.tp * (d % self.cp + self.cp * (p + self.pp * (d // self.cp)))
        return t + self.tp * (d + self.cp * self.dp * p)


def _pairs_frame(job: str, a: np.ndarray, b: np.ndarray, kind: str) -> pd.DataFrame:
    return pd.DataFrame({"job_id": job, "a": np.minimum(a, b).ravel(), "b": np.maximum(a, b).ravel(), "type": kind})


class MoESimulation(JobSimulation):
    """An :class:`MoEJob`: the 3D job's steps with the EP all-to-alls inside every forward and backward."""

    spec: MoEJob

    def __init__(self, gen, spec: MoEJob, servers, rng, degraded):
        super().__init__(gen, spec, servers, rng, degraded)
        # a separate stream for the all-to-all draws: the 3D job's draws stay as they are
        self.a2a_rng = np.random.default_rng(rng.integers(1 << 62))
        self._groups()

    def _groups(self) -> None:
        spec = self.spec
        T, E, P, G = spec.tp, spec.ep, spec.pp, spec.domains
        # (T, G, P, E): EP group (rail, domain, stage), its ranks one per server of the domain
        self.groups = self.gpu.reshape(T, G, E, P).transpose(0, 1, 3, 2)
        i, j = np.nonzero(~np.eye(E, dtype=bool))
        self.a2a_i, self.a2a_j = i, j  # ordered (sender, receiver) positions in a group
        a, b = self.groups[..., i], self.groups[..., j]  # (T, G, P, E*(E-1))
        self.a2a_paths, self.a2a_net = self._pair_info(a, b)
        self.a2a_a, self.a2a_b = a, b

    def _record_pairs(self, truth_pairs, pp_net, dp_net) -> None:
        frames: list[pd.DataFrame] = []
        super()._record_pairs(frames, pp_net, dp_net)
        a, b = self.a2a_a[self.a2a_net], self.a2a_b[self.a2a_net]
        # first: a dense ring edge inside a domain rides an EP pair, and the pair is EP
        truth_pairs.append(_pairs_frame(self.spec.name, a, b, "EP"))
        truth_pairs.extend(frames)

    def _replace_server(self, position: int) -> str:
        out = super()._replace_server(position)
        self._groups()
        return out

    def _emit_pp(self, cols, eF, eB, xf_rail, xb_rail, pp_paths, pp_back_paths, pp_net, split_draw, split_frac, size_f=None) -> float:
        last = super()._emit_pp(cols, eF, eB, xf_rail, xb_rail, pp_paths, pp_back_paths, pp_net, split_draw, split_frac, size_f)
        return max(last, self._emit_a2a(cols, eF, eB))

    def _emit_a2a(self, cols: FlowColumns, eF: np.ndarray, eB: np.ndarray) -> float:
        """Dispatch and combine per micro-batch and MoE layer, forward and backward (eF, eB: (M, D, P))."""
        spec, fab = self.spec, self.fab
        M, P, G, E, L = spec.microbatches, spec.pp, spec.domains, spec.ep, spec.moe_layers
        F = spec.fwd_ms * 1e6
        Bd = F * spec.bwd_ratio
        # hot experts: popularity of each receiving rank, per layer, stage and domain (fixed shapes a step)
        pop = self.a2a_rng.lognormal(0.0, spec.hot_skew, size=(L, G, P, E))
        pop /= pop.mean(axis=-1, keepdims=True)
        noise = self.a2a_rng.lognormal(0.0, 0.05, size=(2, M, L, G, P, E * (E - 1)))
        # a group's all-to-all starts when its last member gets there: (M, G, P)
        f0 = (eF.reshape(M, G, E, P) - F).max(axis=2)
        b0 = (eB.reshape(M, G, E, P) - Bd).max(axis=2)
        bw = fab.bytes_per_ns * self._bw_factor(self.a2a_paths, float(np.min(eF)), (self.a2a_a, self.a2a_b))  # (T, G, P, n)
        end = -np.inf
        T = spec.tp
        n = E * (E - 1)
        for phase, (t0, span) in enumerate(((f0, F), (b0, Bd))):
            for layer in range(L):
                for k, frac in enumerate((0.3, 0.7)):  # dispatch, combine
                    # dispatch i -> j carries tokens for j's experts; combine j -> i brings them back
                    hot = pop[layer][..., self.a2a_j] if k == 0 else pop[layer][..., self.a2a_i]  # (G, P, n)
                    size = spec.a2a_bytes * hot[None] * noise[phase][:, layer][:, None]  # (M, 1, G, P, n)
                    size = np.maximum(4096, (size // 4096) * 4096).astype(np.int64)
                    size = np.broadcast_to(size, (M, T, G, P, n))
                    st = np.broadcast_to((t0 + span * (layer + frac) / L)[:, None, :, :, None], size.shape)
                    # the sender's NIC is shared by its E - 1 transfers
                    du = fab.latency_ns + size * (E - 1) / bw[None]
                    net = np.broadcast_to(self.a2a_net[None], size.shape)
                    shape = size.shape
                    cols.add(st[net], du[net], np.broadcast_to(self.a2a_a[None], shape)[net], np.broadcast_to(self.a2a_b[None], shape)[net],
                             size[net], np.broadcast_to(self.a2a_paths[None], shape + (3,))[net])
                    if net.any():
                        end = max(end, float((st + du)[net].max()))
        return end


class CPSimulation(JobSimulation):
    """A :class:`CPJob`: the 3D job's steps with ring attention inside every forward and backward.

    Simulated as a 3D job whose "replicas" are the (CP rank, DP replica)
    cells (``dp * cp`` of them); the DP ring runs over the replicas only.
    """

    spec: JobSpec

    def __init__(self, gen, spec: CPJob, servers, rng, degraded):
        self.cp_spec = spec
        super().__init__(gen, dataclasses.replace(spec, dp=spec.dp * spec.cp, cp=1), servers, rng, degraded)
        # the ranks by the CP job's own order (the simulated spec's cp = 1 loses it; the same for tp-cp-dp-pp)
        T, D, P = self.spec.tp, self.spec.dp, self.spec.pp
        t, d, p = np.meshgrid(np.arange(T), np.arange(D), np.arange(P), indexing="ij")
        self.gpu = self.base + spec.rank(t, d, p)
        self.pp_a, self.pp_b = self.gpu[:, :, :-1], self.gpu[:, :, 1:]
        self.kv_rng = np.random.default_rng(rng.integers(1 << 62))
        self._rings()

    def _rings(self) -> None:
        cs = self.cp_spec
        T, C, D, P = cs.tp, cs.cp, cs.dp, cs.pp
        g = self.gpu.reshape(T, D, C, P)  # d_sim = c + cp * d
        self.cp_a = g
        self.cp_b = np.roll(g, -1, axis=2)
        self.cp_paths, self.cp_net = self._pair_info(self.cp_a, self.cp_b)
        # the DP ring: over the replicas of a (rail, CP rank, stage), in the (T, D_sim, P) layout
        self.dp_a = self.gpu
        self.dp_b = np.roll(g, -1, axis=1).reshape(self.gpu.shape)
        # no "uniform" DP edges: their sizes assume a ring over all D_sim
        self.uniform_edge = np.zeros(self.gpu.shape, dtype=bool)

    def _record_pairs(self, truth_pairs, pp_net, dp_net) -> None:
        frames: list[pd.DataFrame] = []
        super()._record_pairs(frames, pp_net, dp_net)
        truth_pairs.extend(frames)
        truth_pairs.append(_pairs_frame(self.spec.name, self.cp_a[self.cp_net], self.cp_b[self.cp_net], "CP"))

    def _replace_server(self, position: int) -> str:
        out = super()._replace_server(position)
        self._rings()
        return out

    def _emit_pp(self, cols, eF, eB, xf_rail, xb_rail, pp_paths, pp_back_paths, pp_net, split_draw, split_frac, size_f=None) -> float:
        last = super()._emit_pp(cols, eF, eB, xf_rail, xb_rail, pp_paths, pp_back_paths, pp_net, split_draw, split_frac, size_f)
        return max(last, self._emit_ring_attention(cols, eF, eB))

    def _emit_ring_attention(self, cols: FlowColumns, eF: np.ndarray, eB: np.ndarray) -> float:
        cs, fab = self.cp_spec, self.fab
        M, C, D, P, L, T = cs.microbatches, cs.cp, cs.dp, cs.pp, cs.attn_layers, cs.tp
        F = cs.fwd_ms * 1e6
        Bd = F * cs.bwd_ratio
        noise = self.kv_rng.lognormal(0.0, 0.02, size=(2, M, L, D, C, P))
        # a ring's round waits for its slowest member: (M, D, P)
        f0 = (eF.reshape(M, D, C, P) - F).max(axis=2)
        b0 = (eB.reshape(M, D, C, P) - Bd).max(axis=2)
        bw = fab.bytes_per_ns * self._bw_factor(self.cp_paths, float(np.min(eF)), (self.cp_a, self.cp_b))  # (T, D, C, P)
        end = -np.inf
        R = C - 1
        for phase, (t0, span, parts) in enumerate(((f0, F, (1.0,)), (b0, Bd, (1.0, 1.0)))):
            layer_ns = span / L
            for layer in range(L):
                for r in range(R):
                    # round r of the layer: its share of the layer's attention compute, then the next block
                    base = t0 + layer * layer_ns + r * layer_ns / C  # (M, D, P)
                    off = 0.0
                    for part in parts:
                        size = (cs.kv_bytes * part * noise[phase][:, layer] // 4096 * 4096).astype(np.int64)  # (M, D, C, P)
                        size = np.broadcast_to(size[:, None], (M, T, D, C, P))
                        st = np.broadcast_to(base[:, None, :, None, :], size.shape) + off
                        du = fab.latency_ns + size / bw[None]
                        net = np.broadcast_to(self.cp_net[None], size.shape)
                        shape = size.shape
                        cols.add(st[net], du[net], np.broadcast_to(self.cp_a[None], shape)[net], np.broadcast_to(self.cp_b[None], shape)[net],
                                 size[net], np.broadcast_to(self.cp_paths[None], shape + (3,))[net])
                        if net.any():
                            end = max(end, float((st + du)[net].max()))
                        off = off + du
        return end

    def _emit_dp(self, cols, eB, dp_paths, dp_net, flow_noise, t_step, ready=None, phases: int = 2, bucket_ready=None) -> float:
        """The DP all-reduce over the ``dp`` replicas of each (rail, CP rank, stage): a ring of ``dp`` members."""
        cs, fab = self.cp_spec, self.fab
        D, P = cs.dp, cs.pp
        if D == 1:
            return -np.inf
        a, b = self.dp_a, self.dp_b
        end = -np.inf
        for p in range(P):
            t0 = float(eB[-1, :, p].max()) if ready is None else float(ready[p])
            for i, bucket in enumerate(self.buckets):
                if bucket_ready is not None:  # overlap: a bucket waits for its own readiness
                    t0 = max(t0, float(bucket_ready[p, i]))
                chunk = -(-int(bucket) // D)
                full, rem = divmod(chunk, cs.message_bytes)
                sizes = np.array([cs.message_bytes] * full + ([rem] if rem else []), dtype=np.int64)
                step_ns = fab.latency_ns + chunk / fab.bytes_per_ns * float(flow_noise.max())
                e = self._emit_ring_messages(cols, t0, a[:, :, p], b[:, :, p], dp_paths[:, :, p], dp_net[:, :, p], sizes, phases * (D - 1), step_ns)
                t0 = t0 + phases * (D - 1) * step_ns
                end = max(end, e, t0)
        return end


# ----------------------------------------------------------------------
# the modern shapes' clusters

#: kinds of :func:`modern_cluster`
MODERN_KINDS = ("moe", "moe-flat", "cp")


def modern_job(kind: str, name: str | None = None, **changes) -> JobSpec:
    """The job of ``kind``: a DeepSeek-V3-like MoE job (EP=8 over 8 servers, 2 domains, PP=2; 256 GPUs), the same with one
    domain a stage (``moe-flat``: 128 GPUs, its dense DP ring wholly on EP pairs) or ring attention (CP=4, TP=8, DP=2, PP=2; 128 GPUs).

    Steps of about 1.2 s (MoE) and 0.9 s (CP).

    >>> j = modern_job("cp"); (j.world, j.cp, j.dp, j.pp)
    (128, 4, 2, 2)
    """
    if kind in ("moe", "moe-flat"):
        # moe-flat: one EP domain a stage (128 GPUs), so every edge of the dense DP ring rides an EP pair
        kw: dict = dict(tp=8, dp=16 if kind == "moe" else 8, pp=2, ep=8, microbatches=4, fwd_ms=80.0, moe_layers=2, a2a_bytes=2 * MiB, activation_bytes=8 * MiB,
                        grad_bytes=64 * MiB, bucket_bytes=64 * MiB, message_bytes=16 * MiB, optimizer_ms=20.0, jitter=0.01)
        kw.update(changes)
        return MoEJob(name or ("moe-ep8" if kind == "moe" else "moe-flat-ep8"), **kw)
    if kind == "cp":
        kw = dict(tp=8, dp=2, pp=2, cp=4, microbatches=4, fwd_ms=60.0, attn_layers=4, kv_bytes=8 * MiB, activation_bytes=16 * MiB,
                  grad_bytes=256 * MiB, bucket_bytes=128 * MiB, message_bytes=16 * MiB, optimizer_ms=10.0, jitter=0.01)
        kw.update(changes)
        return CPJob(name or "ring-cp4", **kw)
    raise ValueError(f"kind must be one of {', '.join(MODERN_KINDS)}, not {kind!r}")


def modern_generator(kind: str, seed: int = 0, duration_s: float = 60.0, with_faults: bool = True, slow_factor: float = 1.4) -> ClusterGenerator:
    """The job of ``kind`` alone on a fabric of groups of 8 servers, with storage noise; the fault: a slow server from a third of the window on."""
    job = modern_job(kind)
    n = job.n_servers()
    step_s = 0.9 if kind == "cp" else 1.2
    faults = [SlowServer(job.name, server=1, from_step=max(2, int(duration_s / step_s) // 3), factor=slow_factor)]
    fabric = Fabric(servers=n + 4, servers_per_group=8, spines=8)
    return ClusterGenerator(fabric, [job], duration_s=duration_s, faults=faults, seed=seed, with_faults=with_faults,
                            uniform_dp_share=0.0, storage_flows_per_s=50)


def modern_cluster(kind: str, seed: int = 0, duration_s: float = 60.0, with_faults: bool = True) -> GeneratedCluster:
    """Generate one modern-shape cluster (``meta["modern"]`` says which kind)."""
    c = modern_generator(kind, seed, duration_s, with_faults).generate()
    c.meta.update(modern=kind)
    return c
