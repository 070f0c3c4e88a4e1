"""The cluster generator (SYNTHETIC): jobs + fabric + faults -> flows and truth.

Randomness comes from one ``numpy.random.SeedSequence`` per job, the storage
noise and the placement, and every step draws arrays of a fixed shape, so a
run with faults and its ``--no-faults`` twin see exactly the same random
numbers: the twin is the counterfactual "same cluster, nothing broken".
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import numpy.typing as npt
import pandas as pd

from prism.ingest.readers import write_flows

from .fabric import Fabric
from .faults import DegradedLink, DegradedSwitch, Hang, Restart, SlowNic, SlowServer, SlowStep
from .workload import JobSpec, one_f_one_b

__all__ = ["ClusterGenerator", "GeneratedCluster", "JobSimulation", "EPOCH_NS", "FlowColumns"]

#: Capture windows start at 2026-01-01T00:00:00Z.
EPOCH_NS = 1_767_225_600 * 1_000_000_000

#: an active switch or link fault: (its name, the switch index or the link's two, t0_ns, t1_ns, bandwidth factor)
_Degraded = tuple[str, "int | tuple[int, int]", float, float, float]
#: truth rows: steps (job_id, step, start_ns, end_ns) and faults (kind, job_id, step, start_ns, end_ns, subject, factor)
_StepRow = tuple[str, int, float, float]
_FaultRow = tuple[str, str, int, float, float, str, float]


@dataclass
class GeneratedCluster:
    """Output of :meth:`ClusterGenerator.generate`.

    ``flows`` has the flow-record columns (``src``/``dst``/``switches`` as
    categoricals); the truth frames use the same formats as
    ``prism replay``'s outputs so they compare directly.
    """

    flows: pd.DataFrame
    topology: pd.DataFrame
    jobs: pd.DataFrame  # job_id, ip
    pairs: pd.DataFrame  # job_id, src, dst, type
    steps: pd.DataFrame  # job_id, step, start_ns, end_ns
    faults: pd.DataFrame  # kind, job_id, step, start_ns, end_ns, subject, factor
    meta: dict = field(default_factory=dict)

    def write(self, out: str | os.PathLike, fmt: str = "parquet") -> Path:
        """Write ``flows.<fmt>``, ``topology.csv``, ``truth/*`` and ``manifest.json``.

        ``fmt`` is a suffix :func:`~prism.ingest.readers.write_flows` writes,
        without its dot: one of :func:`prism.ingest.formats.written_suffixes`
        (``parquet``, ``csv``, ``csv.gz``, ...).
        """
        out = Path(out)
        (out / "truth").mkdir(parents=True, exist_ok=True)
        flows_path = out / f"flows.{fmt}"
        write_flows(self.flows, flows_path)
        self.topology.to_csv(out / "topology.csv", index=False)
        self.jobs.to_csv(out / "truth" / "jobs.csv", index=False)
        self.pairs.to_csv(out / "truth" / "pairs.csv", index=False)
        self.steps.to_csv(out / "truth" / "steps.csv", index=False)
        self.faults.to_csv(out / "truth" / "faults.csv", index=False)
        meta = dict(self.meta, flows_file=flows_path.name, flows=len(self.flows))
        (out / "manifest.json").write_text(json.dumps(meta, indent=2, default=_json_default) + "\n")
        return flows_path


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    raise TypeError(type(o))


class ClusterGenerator:
    """Simulate a cluster of training jobs and emit its network flows.

    Parameters
    ----------
    fabric : Fabric
    jobs : list of JobSpec
        Placed on consecutive servers, in a seeded random order, with a
        seeded number of idle servers between them.
    duration_s : float
        Capture window length.
    faults : list
        :class:`SlowStep`, :class:`SlowServer`, :class:`DegradedSwitch`, :class:`SlowNic`.
    seed : int
    with_faults : bool
        False gives the fault-free twin (same seed, same random draws).
    uniform_dp_share : float
        Share of DP ring edges whose messages all have one size (a DP pair
        that looks like PP by the size-count rule).
    split_pp_prob : float
        Probability that a PP message is sent as two flows of different sizes.
    storage_flows_per_s : float
        Rate of storage traffic between GPUs and storage hosts (not training).
    """

    def __init__(
        self,
        fabric: Fabric,
        jobs: list[JobSpec],
        duration_s: float = 60.0,
        faults: list | None = None,
        seed: int = 0,
        with_faults: bool = True,
        uniform_dp_share: float = 0.05,
        split_pp_prob: float = 0.002,
        storage_flows_per_s: float = 50.0,
    ):
        self.fabric = fabric
        self.jobs = list(jobs)
        self.duration_ns = float(duration_s) * 1e9
        self.faults = list(faults or [])
        self.seed = int(seed)
        self.with_faults = with_faults
        self.uniform_dp_share = uniform_dp_share
        self.split_pp_prob = split_pp_prob
        self.storage_flows_per_s = storage_flows_per_s
        self.spare_servers: list[int] = []  # idle servers (set by generate): a restarted job takes one
        self.reroute: dict[str, dict[int, int]] = {}  # job -> {spine: the spine its traffic takes instead} (set by generate)
        names = [j.name for j in self.jobs]
        if len(set(names)) != len(names):
            raise ValueError("job names must be unique")
        for j in self.jobs:
            j.check(fabric.gpus_per_server)
        need = sum(j.n_servers(fabric.gpus_per_server) for j in self.jobs)
        if need > fabric.servers:
            raise ValueError(f"jobs need {need} servers, the fabric has {fabric.servers}")
        for f in self.faults:
            if isinstance(f, (SlowStep, SlowServer, SlowNic, Hang, Restart)) and f.job not in names:
                raise ValueError(f"fault {f} names an unknown job")
            if isinstance(f, DegradedSwitch) and not set(f.moved) <= set(names):
                raise ValueError(f"fault {f} moves an unknown job")

    # ------------------------------------------------------------------
    def _place(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Server indices per job: random order, random gaps, consecutive servers."""
        gps = self.fabric.gpus_per_server
        order = rng.permutation(len(self.jobs))
        spare = self.fabric.servers - sum(j.n_servers(gps) for j in self.jobs)
        gaps = rng.multinomial(spare, np.ones(len(self.jobs) + 1) / (len(self.jobs) + 1)) if spare else np.zeros(len(self.jobs) + 1, int)
        placement, s = {}, int(gaps[0])
        for k, i in enumerate(order):
            j = self.jobs[i]
            n = j.n_servers(gps)
            placement[j.name] = np.arange(s, s + n)
            s += n + int(gaps[k + 1])
        return placement

    def generate(self) -> GeneratedCluster:
        fab = self.fabric
        root = np.random.SeedSequence(self.seed)
        place_seq, noise_seq, *job_seqs = root.spawn(2 + len(self.jobs))
        placement = self._place(np.random.default_rng(place_seq))
        used = set(np.concatenate(list(placement.values())).tolist()) if placement else set()
        #: idle servers, in order: a restarted job takes the first in place of a broken one
        self.spare_servers = [s for s in range(fab.servers) if s not in used]
        switch_names = fab.switch_names()
        degraded, shared = self._resolve_switch_faults(placement, switch_names)

        cols = FlowColumns()
        truth_pairs: list[pd.DataFrame] = []
        truth_steps: list[_StepRow] = []
        truth_faults: list[_FaultRow] = []
        # each job draws from its own stream, so building them all before running any changes no draw
        sims = [_simulation(spec)(self, spec, placement[spec.name], np.random.default_rng(seq), degraded)
                for spec, seq in zip(self.jobs, job_seqs)]
        degraded = self._share_switches(sims, degraded, shared)
        for sim in sims:
            sim.run(cols, truth_pairs, truth_steps, truth_faults)
        self._storage_noise(cols, np.random.default_rng(noise_seq))
        for name, sw_id, t0, t1, factor in degraded:
            truth_faults.append(("slow_link" if isinstance(sw_id, tuple) else "slow_switch", "", -1, t0, t1, name, factor))

        flows = cols.frame(fab, switch_names, self.duration_ns)
        topo = pd.DataFrame(fab.topology_rows())
        ips = np.array(topo["ip"])

        pairs = pd.concat(truth_pairs, ignore_index=True) if truth_pairs else pd.DataFrame(columns=["job_id", "a", "b", "type"])
        # only pairs that really carried flows inside the window are truth;
        # the flow frame's address codes are the node ids (GPUs first)
        a, b = flows["src"].cat.codes.to_numpy().astype(np.int64), flows["dst"].cat.codes.to_numpy().astype(np.int64)
        gpu = (a < fab.n_gpus) & (b < fab.n_gpus)
        seen = np.unique(np.minimum(a, b)[gpu] * fab.n_gpus + np.maximum(a, b)[gpu])
        pairs = pairs[np.isin(pairs["a"].to_numpy() * fab.n_gpus + pairs["b"].to_numpy(), seen)]
        pairs_df, jobs_df = truth_frames(pairs, ips)
        steps_df = pd.DataFrame(truth_steps, columns=["job_id", "step", "start_ns", "end_ns"])
        faults_df = pd.DataFrame(truth_faults, columns=["kind", "job_id", "step", "start_ns", "end_ns", "subject", "factor"])
        for df in (steps_df, faults_df):
            for c in ("start_ns", "end_ns"):
                df[c] = EPOCH_NS + df[c].astype(np.float64).round().astype(np.int64)
        faults_df["step"] = faults_df["step"].astype(np.int64)
        meta = {
            "synthetic": True,
            "generator": "prism synthetic",
            "seed": self.seed,
            "with_faults": self.with_faults,
            "window_start_ns": EPOCH_NS,
            "window_end_ns": EPOCH_NS + int(self.duration_ns),
            "fabric": asdict(fab),
            "jobs": {
                j.name: dict(asdict(j), servers=[fab.server_name(s) for s in placement[j.name]]) for j in self.jobs
            },
            "uniform_dp_share": self.uniform_dp_share,
            "split_pp_prob": self.split_pp_prob,
            "storage_flows_per_s": self.storage_flows_per_s,
        }
        return GeneratedCluster(flows, topo, jobs_df, pairs_df, steps_df, faults_df, meta)

    # ------------------------------------------------------------------
    def _resolve_switch_faults(self, placement: dict[str, np.ndarray], switch_names: list[str]) -> tuple[list[_Degraded], list[int]]:
        """(name, switch index, t0_ns, t1_ns, factor) for each active switch fault (a link's: its two switches'),
        and the positions of the ``shared`` ones."""
        out: list[_Degraded] = []
        shared: list[int] = []
        self.reroute = {}
        if not self.with_faults:
            return out, shared
        for f in self.faults:
            if isinstance(f, DegradedLink):
                ends = f.link.split(">")
                if len(ends) != 2 or not all(e in switch_names for e in ends):
                    raise ValueError(f"degraded link {f.link!r} is not two switches of the fabric as 'A>B'")
                ia, ib = (switch_names.index(e) for e in ends)
                out.append((f.link, (ia, ib), f.start_frac * self.duration_ns, f.end_frac * self.duration_ns, f.factor))
                continue
            if not isinstance(f, DegradedSwitch):
                continue
            if f.switch == "auto":
                idx = self._busiest_dp_switch(placement)
            elif f.switch in switch_names:
                idx = switch_names.index(f.switch)
            else:
                raise ValueError(f"degraded switch {f.switch!r} is not in the fabric")
            if f.shared:
                shared.append(len(out))
            if f.moved:
                first = self.fabric.groups * self.fabric.gpus_per_server  # the spines' indices follow the leaves'
                if not first <= idx < first + self.fabric.spines or self.fabric.spines < 2:
                    raise ValueError(f"degraded switch {switch_names[idx]}: only a spine of several can be moved off")
                for job in f.moved:
                    self.reroute.setdefault(job, {})[idx] = first + (idx - first + 1) % self.fabric.spines
            out.append((switch_names[idx], idx, f.start_frac * self.duration_ns, f.end_frac * self.duration_ns, f.factor))
        return out, shared

    def _share_switches(self, sims: list["JobSimulation"], degraded: list[_Degraded], shared: list[int]) -> list[_Degraded]:
        """Split each ``shared`` degraded switch's capacity equally between the jobs crossing it; the faults as recorded.

        A job crosses the switch when one of its DP ring or pipeline transfers goes through it (not when it is
        ``moved`` off it). Each such job's transfers there run at ``min(1, capacity / k)`` of the link's speed (k:
        how many jobs cross it), all the time it is degraded: a fluid share, as if the jobs' transfers always
        overlapped (SYNTHETIC; what the what-if's ``move-job`` scenario assumes). The other faults are left as
        they are.
        """
        if not shared:
            return degraded
        crossed = np.zeros((len(sims), len(degraded)), bool)
        for j, sim in enumerate(sims):
            hops = sim.switches_crossed()
            crossed[j] = [i in shared and idx in hops for i, (_, idx, *_) in enumerate(degraded)]
        k = crossed.sum(axis=0)
        share = [(n, idx, t0, t1, min(1.0, f / max(int(k[i]), 1)) if i in shared else f) for i, (n, idx, t0, t1, f) in enumerate(degraded)]
        for sim in sims:
            sim.degraded = share
        return share

    def _busiest_dp_switch(self, placement) -> int:
        """The spine (or else leaf) crossed by most DP ring edges of the first DP job."""
        fab = self.fabric
        for spec in self.jobs:
            if spec.dp < 2:
                continue
            base = placement[spec.name][0] * fab.gpus_per_server
            t, d, p = np.meshgrid(np.arange(spec.tp), np.arange(spec.dp), np.arange(spec.pp), indexing="ij")
            a = base + spec.rank(t, d, p).ravel()
            b = base + spec.rank(t, (d + 1) % spec.dp, p).ravel()
            paths = fab.paths(a, b)
            hops = paths[paths >= 0]
            if hops.size == 0:
                continue
            spines = hops[(hops >= fab.groups * fab.gpus_per_server) & (hops < fab.storage_leaf)]
            pool = spines if spines.size else hops
            vals, counts = np.unique(pool, return_counts=True)
            return int(vals[np.argmax(counts)])
        raise ValueError("degraded switch 'auto' needs a job with dp >= 2 whose ring crosses a switch")

    def _storage_noise(self, cols: "FlowColumns", rng: np.random.Generator) -> None:
        storage_noise(cols, self.fabric, rng, self.duration_ns, self.storage_flows_per_s)


def storage_noise(cols: "FlowColumns", fab: Fabric, rng: np.random.Generator, duration_ns: float, flows_per_s: float) -> None:
    """Storage traffic between GPUs and storage hosts (not training): Poisson arrivals, log-normal sizes."""
    n = rng.poisson(flows_per_s * duration_ns / 1e9)
    if n == 0 or fab.storage_hosts == 0:
        return
    start = np.sort(rng.uniform(0, duration_ns, n))
    gpu = rng.integers(0, fab.n_gpus, n)
    host = rng.integers(0, fab.storage_hosts, n)
    to_storage = rng.random(n) < 0.3  # mostly reads (GPU <- storage)
    size = np.minimum(rng.lognormal(np.log(1 << 20), 1.0, n), 256 << 20).astype(np.int64) + 4096
    dur = fab.latency_ns + size / fab.bytes_per_ns * rng.uniform(1.0, 1.5, n)
    # storage hosts get NIC indices after the GPUs
    s_node = np.where(to_storage, gpu, fab.n_gpus + host)
    d_node = np.where(to_storage, fab.n_gpus + host, gpu)
    cols.add(start, dur, s_node, d_node, size, fab.storage_paths(gpu, to_storage, host))


def truth_frames(pairs: pd.DataFrame, ips: np.ndarray) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(pairs, jobs)`` truth frames in the replay formats from ``job_id, a, b, type`` rows (NIC indices).

    Pairs become unordered address pairs (``src < dst``), one row each; a
    job's GPUs are the addresses its pairs touch.
    """
    s_ip, d_ip = ips[pairs["a"].to_numpy()], ips[pairs["b"].to_numpy()]
    lo = np.where(s_ip < d_ip, s_ip, d_ip)
    hi = np.where(s_ip < d_ip, d_ip, s_ip)
    pairs_df = pd.DataFrame({"job_id": pairs["job_id"].to_numpy(), "src": lo, "dst": hi, "type": pairs["type"].to_numpy()})
    pairs_df = pairs_df.drop_duplicates(["job_id", "src", "dst"]).sort_values(["job_id", "src", "dst"]).reset_index(drop=True)
    jobs_df = (
        pd.concat([pairs_df[["job_id", "src"]].rename(columns={"src": "ip"}), pairs_df[["job_id", "dst"]].rename(columns={"dst": "ip"})])
        .drop_duplicates()
        .sort_values(["job_id", "ip"])
        .reset_index(drop=True)
    )
    return pairs_df, jobs_df


class FlowColumns:
    """Flow columns accumulated as arrays; turned into a frame once at the end."""

    def __init__(self) -> None:
        self.start: list[np.ndarray] = []
        self.dur: list[np.ndarray] = []
        self.src: list[np.ndarray] = []
        self.dst: list[np.ndarray] = []
        self.size: list[np.ndarray] = []
        self.path: list[np.ndarray] = []

    def add(self, start: np.ndarray, dur: npt.ArrayLike, src: npt.ArrayLike, dst: npt.ArrayLike, size: npt.ArrayLike,
            paths: npt.ArrayLike) -> None:
        """Flows starting at ``start`` (ns from the window start); the other columns broadcast to it (``paths``: 3 switch indices a flow)."""
        n = len(start)
        if n == 0:
            return
        self.start.append(np.asarray(start, dtype=np.float64))
        self.dur.append(np.broadcast_to(np.asarray(dur, dtype=np.float64), (n,)))
        self.src.append(np.broadcast_to(np.asarray(src, dtype=np.int64), (n,)))
        self.dst.append(np.broadcast_to(np.asarray(dst, dtype=np.int64), (n,)))
        self.size.append(np.broadcast_to(np.asarray(size, dtype=np.int64), (n,)))
        self.path.append(np.broadcast_to(np.asarray(paths, dtype=np.int64), (n, 3)))

    def frame(self, fab: Fabric, switch_names: list[str], duration_ns: float) -> pd.DataFrame:
        start = np.concatenate(self.start)
        keep = (start >= 0) & (start < duration_ns)
        start = start[keep]
        order = np.argsort(start, kind="stable")
        take = lambda xs: np.concatenate(xs)[keep][order]  # noqa: E731
        start = start[order]
        dur = take(self.dur)
        src, dst, size = take(self.src), take(self.dst), take(self.size)
        paths = np.concatenate(self.path)[keep][order]
        # switches strings: one per distinct path, then a categorical
        uniq, inv = np.unique(paths, axis=0, return_inverse=True)
        names = np.array(switch_names + [""], dtype=object)
        path_str = ["|".join(names[x] for x in row if x >= 0) for row in uniq]
        n_gpu = fab.n_gpus
        addr = [fab.gpu_ip(g) for g in range(n_gpu)] + [fab.storage_ip(h) for h in range(fab.storage_hosts)]
        addr_cat = pd.Index(addr, dtype=object)
        return pd.DataFrame(
            {
                "start_ns": EPOCH_NS + np.round(start).astype(np.int64),
                "duration_ns": np.maximum(np.round(dur), 1).astype(np.int64),
                "src": pd.Categorical.from_codes(src, categories=addr_cat),
                "dst": pd.Categorical.from_codes(dst, categories=addr_cat),
                "size": size.astype(np.int64),
                "switches": pd.Categorical.from_codes(inv.ravel(), categories=pd.Index(path_str, dtype=object)),
            }
        )


def _simulation(spec: JobSpec) -> type:
    """The simulation of a job: a Megatron-style 3D job, a data-parallel-only shape (:mod:`synthetic.dpshapes`),
    or a mixture-of-experts or context-parallel job (:mod:`synthetic.modern`)."""
    shape = getattr(spec, "shape", "3d")
    if shape == "3d":
        return JobSimulation
    if shape in ("moe", "cp"):
        from .modern import CPSimulation, MoESimulation

        return MoESimulation if shape == "moe" else CPSimulation
    from .dpshapes import DPShapeSimulation

    return DPShapeSimulation


def _filter_chunks(cols: FlowColumns, first_chunk: int, keep: np.ndarray) -> None:
    """Keep the flows ``keep`` marks of the chunks of ``cols`` from ``first_chunk`` on (merged into one chunk)."""
    for name in ("start", "dur", "src", "dst", "size", "path"):
        chunks = getattr(cols, name)
        merged = np.concatenate(chunks[first_chunk:])[keep]
        del chunks[first_chunk:]
        chunks.append(merged)


def _keep_before(cols: FlowColumns, first_chunk: int, t: float) -> None:
    """Drop the flows starting at or after ``t`` from the chunks of ``cols`` from ``first_chunk`` on."""
    if len(cols.start) > first_chunk:
        _filter_chunks(cols, first_chunk, np.concatenate(cols.start[first_chunk:]) < t)


class JobSimulation:
    """One job, step by step, from before the window start to past its end."""

    def __init__(self, gen: ClusterGenerator, spec: JobSpec, servers: np.ndarray, rng: np.random.Generator, degraded: list[_Degraded]):
        self.gen, self.spec, self.rng = gen, spec, rng
        fab = gen.fabric
        self.fab = fab
        self.degraded = degraded
        self.base = int(servers[0]) * fab.gpus_per_server
        self.servers = servers
        T, D, P = spec.tp, spec.dp, spec.pp
        t, d, p = np.meshgrid(np.arange(T), np.arange(D), np.arange(P), indexing="ij")
        self.gpu = self.base + spec.rank(t, d, p)  # (T, D, P) global GPU index
        # PP pairs: (t, d, p) -> (t, d, p+1)
        self.pp_a = self.gpu[:, :, :-1]
        self.pp_b = self.gpu[:, :, 1:]
        # DP ring edges: (t, d, p) -> (t, d+1 mod D, p)
        self.dp_a = self.gpu
        self.dp_b = np.roll(self.gpu, -1, axis=1)
        # fixed per-edge properties
        self.uniform_edge = rng.random(self.dp_a.shape) < gen.uniform_dp_share
        self.buckets = spec.bucket_sizes()
        self.slow_nic: tuple[int, float] | None = None  # (server index, factor) of a SlowNic fault
        self.reroute = gen.reroute.get(spec.name, {})  # spines the job is moved off: the spine it takes instead

    # path helpers ---------------------------------------------------------
    def _pair_info(self, a, b):
        paths = self.fab.paths(a.ravel(), b.ravel()).reshape(a.shape + (3,))
        for spine, instead in self.reroute.items():
            paths = np.where(paths == spine, instead, paths)
        net = paths[..., 0] >= 0
        return paths, net

    def switches_crossed(self) -> np.ndarray:
        """The switches the job's DP ring and pipeline transfers go through (the jobs contending for a shared one)."""
        return np.unique(np.concatenate([self._pair_info(a, b)[0].ravel() for a, b in ((self.dp_a, self.dp_b), (self.pp_a, self.pp_b))]))

    def _bw_factor(self, paths, t_ns: float, ends=None):
        """Bandwidth multiplier per pair at time t (min over degraded switches and links; a slow NIC at either of
        ``ends`` divides it)."""
        f = np.ones(paths.shape[:-1])
        for _, idx, t0, t1, factor in self.degraded:
            if t0 <= t_ns < t1:
                if isinstance(idx, tuple):  # a link: the hop from one switch to the other, in that order
                    hit = ((paths[..., :-1] == idx[0]) & (paths[..., 1:] == idx[1])).any(axis=-1)
                else:
                    hit = (paths == idx).any(axis=-1)
                f = np.where(hit, np.minimum(f, factor), f)
        if self.slow_nic is not None and ends is not None:
            srv, factor = self.slow_nic
            gps = self.fab.gpus_per_server
            f = np.where((ends[0] // gps == srv) | (ends[1] // gps == srv), f / factor, f)
        return f

    def _xfer(self, size, net, factor):
        fab = self.fab
        return np.where(net, fab.latency_ns + size / (fab.bytes_per_ns * factor), size / fab.nvlink_bytes_per_ns)

    # ----------------------------------------------------------------------
    def run(self, cols: FlowColumns, truth_pairs: list[pd.DataFrame], truth_steps: list[_StepRow], truth_faults: list[_FaultRow]) -> None:
        """Emit the job's flows into ``cols`` and append its truth rows."""
        gen, spec, fab, rng = self.gen, self.spec, self.fab, self.rng
        T, D, P, M = spec.tp, spec.dp, spec.pp, spec.microbatches
        window = gen.duration_ns
        # the job started before the window: its first step is cut by the window start
        t = -rng.uniform(0.2, 0.8) * spec.lower_bound_step_ns()
        pp_paths, pp_net = self._pair_info(self.pp_a, self.pp_b)
        pp_back_paths, _ = self._pair_info(self.pp_b, self.pp_a)
        dp_paths, dp_net = self._pair_info(self.dp_a, self.dp_b)
        self._record_pairs(truth_pairs, pp_net, dp_net)

        faults = [f for f in gen.faults if getattr(f, "job", None) == spec.name] if gen.with_faults else []
        # faults only scale times; they add no random draws, so the
        # fault-free twin sees the same numbers
        slow_cells = np.zeros((D, P), dtype=bool)
        for f in faults:
            if isinstance(f, SlowServer):
                srv = self.servers[f.server]
                slow_cells = ((self.gpu // fab.gpus_per_server) == srv).any(axis=0)  # (D, P)
            if isinstance(f, SlowNic):  # its transfers, whatever their path, for the whole capture
                self.slow_nic = (int(self.servers[f.server]), float(f.factor))
                truth_faults.append(("slow_nic", spec.name, -1, 0.0, window, fab.server_name(self.servers[f.server]), f.factor))

        hang = next((f for f in faults if isinstance(f, Hang)), None)
        restart = next((f for f in faults if isinstance(f, Restart)), None)
        fresh = False  # the first step after a restart: its start sent nothing, it is not whole
        sim_step = 0
        whole = -1  # index among whole steps in the window
        prev_end = t
        while t < window:
            step_chunk = len(cols.start)
            # fixed-shape draws for this step (identical with and without faults)
            jit = rng.lognormal(0.0, spec.jitter, size=(2, M, D, P))
            split_draw = rng.random((2, M, T, D, max(P - 1, 1)))
            split_frac = rng.uniform(0.3, 0.7, size=(2, M, T, D, max(P - 1, 1)))
            flow_noise = rng.lognormal(0.0, 0.02, size=(T, D, P))
            k = whole + 1 if sim_step > 0 else -1  # the whole-step index this step would get
            factor = np.ones((D, P))
            for f in faults:
                if isinstance(f, SlowStep) and f.step == k:
                    factor *= f.factor
                if isinstance(f, SlowServer) and k >= f.from_step:
                    factor = np.where(slow_cells, factor * f.factor, factor)
            F = spec.fwd_ms * 1e6 * factor[None] * jit[0]
            B = spec.fwd_ms * spec.bwd_ratio * 1e6 * factor[None] * jit[1]
            # PP transfer times at this step's bandwidth, slowest TP rail gates the stage
            f_pp = self._bw_factor(pp_paths, t, (self.pp_a, self.pp_b))
            f_ppb = self._bw_factor(pp_back_paths, t, (self.pp_b, self.pp_a))
            xf_rail = self._xfer(spec.activation_bytes, pp_net, f_pp)  # (T, D, P-1)
            xb_rail = self._xfer(spec.activation_bytes, pp_net, f_ppb)
            xf = xf_rail.max(axis=0) if P > 1 else np.zeros((D, 0))
            xb = xb_rail.max(axis=0) if P > 1 else np.zeros((D, 0))
            # draws of the optional confounders come after the classic ones,
            # so presets without them keep their exact flows
            size_f = rng.uniform(1.0 - spec.pp_size_spread, 1.0, size=(M, D)) if spec.pp_size_spread > 0 else None
            t_fwd, ag_end = t, -np.inf
            if spec.distributed_optimizer and D > 1:
                # parameters all-gathered at the step start; the forward waits for them
                ag_end = self._emit_dp(cols, None, dp_paths, dp_net, flow_noise, t, ready=np.full(P, t), phases=1)
                t_fwd = max(t, ag_end)
            sF, eF, sB, eB = one_f_one_b(F, B, xf, xb, t_fwd)

            last_flow_end = self._emit_pp(cols, eF, eB, xf_rail, xb_rail, pp_paths, pp_back_paths, pp_net, split_draw, split_frac, size_f)
            ready = eB[-1].max(axis=0)  # (P,) every replica's last backward of the stage
            emb_end = -np.inf
            if spec.embedding_bytes and P > 1:
                emb_end_d = self._emit_embedding(cols, eB)
                emb_end = float(emb_end_d.max())
                ready = ready.copy()
                ready[0] = max(ready[0], emb_end)
                ready[P - 1] = max(ready[P - 1], emb_end)
            bucket_ready = None
            if spec.dp_overlap:
                # bucket i is ready i+1 nb-ths into the last micro-batch's backward
                frac = (np.arange(len(self.buckets)) + 1) / len(self.buckets)
                bucket_ready = (sB[-1][:, :, None] + B[-1][:, :, None] * frac[None, None, :]).max(axis=0)  # (P, nb)
                ready = bucket_ready[:, 0]
            dp_chunk = len(cols.start)
            dp_end = self._emit_dp(cols, eB, dp_paths, dp_net, flow_noise, t, ready=ready,
                                   phases=1 if spec.distributed_optimizer else 2, bucket_ready=bucket_ready)
            if hang is not None and k == hang.step:
                self._hang(cols, dp_chunk, hang, k, truth_faults)
                break  # the job sends nothing more
            step_end = max(last_flow_end, dp_end, emb_end, ag_end)
            if P == 1 and D == 1:
                step_end = float(eB.max())
            if spec.clip_allreduce and P > 1:
                step_end = self._emit_clip(cols, max(step_end, float(eB.max())))
            if restart is not None and k >= 0 and (k == restart.step if restart.after_s is None else t >= restart.after_s * 1e9):
                # it stops halfway through the step's compute, before its collective
                t_stop = t + 0.5 * (float(np.min(ready)) - t)
                _keep_before(cols, step_chunk, t_stop)
                t = t_stop + restart.outage_s * 1e9
                if t_stop < window:
                    truth_faults.append(("restart", spec.name, k, t_stop, t, self._replace_server(restart.replaced_server), restart.outage_s))
                pp_paths, pp_net = self._pair_info(self.pp_a, self.pp_b)
                pp_back_paths, _ = self._pair_info(self.pp_b, self.pp_a)
                dp_paths, dp_net = self._pair_info(self.dp_a, self.dp_b)
                self._record_pairs(truth_pairs, pp_net, dp_net)
                restart, fresh = None, True
                sim_step += 1
                continue
            if fresh:
                fresh = False
            elif sim_step > 0 and prev_end >= 0 and step_end <= window:
                whole += 1
                self._record_step(truth_steps, truth_faults, faults, whole, prev_end, step_end, lambda f: "|".join(
                    sorted({fab.server_name(s) for s in np.unique(self.gpu[:, slow_cells] // fab.gpus_per_server)})))
            elif sim_step > 0 and prev_end >= 0:
                break  # ends past the window
            prev_end = step_end
            # the optimizer waits for every stage's last backward (in a
            # pipeline-only job the last flow, into stage 0, comes earlier), then
            # the checkpoint if one is due
            t = max(step_end, float(eB.max())) + spec.optimizer_ms * 1e6 + spec.checkpoint_ns(sim_step)
            sim_step += 1

    def _record_step(self, truth_steps: list[_StepRow], truth_faults: list[_FaultRow], faults: list, step: int, start: float,
                     end: float, slow_group: Callable[[SlowServer], str]) -> None:
        """Truth of whole step ``step`` (``start`` to ``end``): its row, and those of the faults beginning with it.

        A :class:`SlowStep` of this step lasts the step; a :class:`SlowServer`
        from this step on lasts to the window's end, its subject (the slow
        group's servers) ``slow_group(fault)``.
        """
        name = self.spec.name
        truth_steps.append((name, step, start, end))
        for f in faults:
            if isinstance(f, SlowStep) and f.step == step:
                truth_faults.append(("slow_step", name, step, start, end, "", f.factor))
            if isinstance(f, SlowServer) and f.from_step == step:
                truth_faults.append(("slow_group", name, step, start, self.gen.duration_ns, slow_group(f), f.factor))

    def _hang(self, cols: FlowColumns, first_chunk: int, f: Hang, step: int, truth_faults: list[_FaultRow]) -> None:
        """Of the collective's flows (``cols`` from chunk ``first_chunk``), keep each ring edge's first message, but none from the hung server."""
        if len(cols.start) <= first_chunk:
            raise ValueError(f"hang of {self.spec.name}: the job has no collective on the network (it needs dp > 1 across servers)")
        gps = self.fab.gpus_per_server
        hung = int(self.servers[f.member])
        start = np.concatenate(cols.start[first_chunk:])
        edge = np.concatenate(cols.src[first_chunk:]) * self.fab.n_gpus + np.concatenate(cols.dst[first_chunk:])
        o = np.lexsort((start, edge))
        keep = np.zeros(len(start), dtype=bool)
        keep[o[np.r_[True, edge[o][1:] != edge[o][:-1]]]] = True
        keep &= np.concatenate(cols.src[first_chunk:]) // gps != hung
        _filter_chunks(cols, first_chunk, keep)
        if start.min() < self.gen.duration_ns:
            truth_faults.append(("hang", self.spec.name, step, float(start.min()), self.gen.duration_ns, self.fab.server_name(hung), 1.0))

    def _replace_server(self, position: int) -> str:
        """Move the job's server at ``position`` onto the first idle server; ``old>new`` names."""
        if not self.gen.spare_servers:
            raise ValueError(f"restart of {self.spec.name}: the fabric has no idle server to replace one with")
        gps = self.fab.gpus_per_server
        old, new = int(self.servers[position]), self.gen.spare_servers.pop(0)
        self.servers = self.servers.copy()
        self.servers[position] = new
        self.gpu = np.where(self.gpu // gps == old, new * gps + self.gpu % gps, self.gpu)
        self.pp_a, self.pp_b = self.gpu[:, :, :-1], self.gpu[:, :, 1:]
        self.dp_a, self.dp_b = self.gpu, np.roll(self.gpu, -1, axis=1)
        return f"{self.fab.server_name(old)}>{self.fab.server_name(new)}"

    def _record_pairs(self, truth_pairs, pp_net, dp_net):
        spec = self.spec
        frames = []
        if spec.pp > 1:
            a, b = self.pp_a[pp_net], self.pp_b[pp_net]
            frames.append(pd.DataFrame({"job_id": spec.name, "a": np.minimum(a, b), "b": np.maximum(a, b), "type": "PP"}))
            if (spec.embedding_bytes or spec.clip_allreduce) and spec.pp > 2:
                # the embedding group and the clip ring close each pipeline: first and last stage
                a, b = self.gpu[:, :, 0].ravel(), self.gpu[:, :, -1].ravel()
                net = self.fab.paths(a, b)[:, 0] >= 0
                frames.append(pd.DataFrame({"job_id": spec.name, "a": np.minimum(a, b)[net], "b": np.maximum(a, b)[net], "type": "PP"}))
        if spec.dp > 1:
            a, b = self.dp_a[dp_net], self.dp_b[dp_net]
            frames.append(pd.DataFrame({"job_id": spec.name, "a": np.minimum(a, b), "b": np.maximum(a, b), "type": "DP"}))
        truth_pairs.extend(frames)

    def _ring_pairs(self, members: np.ndarray):
        """Directed ring edges (a, b) over ``members`` (..., k), and their paths and network mask."""
        a, b = members, np.roll(members, -1, axis=-1)
        paths, net = self._pair_info(a, b)
        return a, b, paths, net

    def _emit_ring_messages(self, cols, t0, a, b, paths, net, sizes, ring_steps: int, step_ns: float) -> float:
        """``ring_steps`` rounds of ``sizes`` messages on every networked edge ``a -> b`` from ``t0`` (per edge)."""
        fab = self.fab
        if not net.any():
            return -np.inf
        t0 = np.broadcast_to(np.asarray(t0, np.float64), a.shape)[net]
        offs = np.concatenate([[0.0], np.cumsum(sizes / fab.bytes_per_ns)[:-1]])
        r = np.arange(ring_steps)
        st = t0[:, None, None] + r[None, :, None] * step_ns + offs[None, None, :]
        du = np.broadcast_to(fab.latency_ns + sizes[None, None, :] / fab.bytes_per_ns, st.shape)
        shape = st.shape
        cols.add(st.ravel(), du.ravel(), np.broadcast_to(a[net][:, None, None], shape).ravel(), np.broadcast_to(b[net][:, None, None], shape).ravel(),
                 np.broadcast_to(sizes[None, None, :], shape).ravel(), np.broadcast_to(paths[net][:, None, None, :], shape + (3,)).reshape(-1, 3))
        return float((st + du).max())

    def _emit_embedding(self, cols, eB) -> np.ndarray:
        """The embedding all-reduce of every replica: a two-member ring between its first and last stage, per rail."""
        spec, fab = self.spec, self.fab
        P = spec.pp
        members = np.stack([self.gpu[:, :, 0], self.gpu[:, :, P - 1]], axis=-1)  # (T, D, 2)
        a, b, paths, net = self._ring_pairs(members)
        chunk = spec.embedding_bytes // 2
        full, rem = divmod(chunk, spec.message_bytes)
        sizes = np.array([spec.message_bytes] * full + ([rem] if rem else []), dtype=np.int64)
        t0 = np.maximum(eB[-1, :, 0], eB[-1, :, P - 1])  # (D,)
        step_ns = fab.latency_ns + chunk / fab.bytes_per_ns
        self._emit_ring_messages(cols, np.broadcast_to(t0[None, :, None], a.shape), a, b, paths, net, sizes, 2, step_ns)
        return t0 + 2 * step_ns

    def _emit_clip(self, cols, t0: float) -> float:
        """The grad-norm clip: a ring over every replica's stages carrying a few bytes, after the DP collective."""
        fab = self.fab
        a, b, paths, net = self._ring_pairs(self.gpu)  # (T, D, P): stage p -> p+1, last -> first
        step_ns = 2.0 * fab.latency_ns
        rounds = 2 * (self.spec.pp - 1)
        end = self._emit_ring_messages(cols, t0, a, b, paths, net, np.array([16], dtype=np.int64), rounds, step_ns)
        return end if np.isfinite(end) else t0  # the step ends with its last flow

    def _emit_pp(self, cols, eF, eB, xf_rail, xb_rail, pp_paths, pp_back_paths, pp_net, split_draw, split_frac, size_f=None) -> float:
        spec = self.spec
        T, D, P, M = spec.tp, spec.dp, spec.pp, spec.microbatches
        if P == 1:
            return -np.inf
        last = -np.inf
        size: int | np.ndarray = spec.activation_bytes
        if size_f is not None:  # per micro-batch and replica, 4 KiB granules
            size = np.broadcast_to(((size * size_f).astype(np.int64) // 4096 * 4096)[:, None, :, None], (M, T, D, P - 1))
        for direction in (0, 1):
            if direction == 0:  # forward: stage p -> p+1 after F(p, m)
                t_send = eF[:, :, :-1]  # (M, D, P-1)
                dur = xf_rail  # (T, D, P-1)
                a, b, paths = self.pp_a, self.pp_b, pp_paths
            else:  # backward: stage p+1 -> p after B(p+1, m)
                t_send = eB[:, :, 1:]
                dur = xb_rail
                a, b, paths = self.pp_b, self.pp_a, pp_back_paths
            start = np.broadcast_to(t_send[:, None], (M, T, D, P - 1))
            d = np.broadcast_to(dur[None], (M, T, D, P - 1))
            net = np.broadcast_to(pp_net[None], (M, T, D, P - 1))
            split = (split_draw[direction][..., : P - 1] < self.gen.split_pp_prob) & net
            whole = net & ~split
            aa = np.broadcast_to(a[None], start.shape)
            bb = np.broadcast_to(b[None], start.shape)
            pth = np.broadcast_to(paths[None], start.shape + (3,))
            size_w = size[whole] if isinstance(size, np.ndarray) else size  # (an array has 4 dimensions here)
            cols.add(start[whole], d[whole], aa[whole], bb[whole], size_w, pth[whole])
            if split.any():
                size_s = size[split] if isinstance(size, np.ndarray) else size
                s1 = (size_s * split_frac[direction][..., : P - 1][split]).astype(np.int64) // 4096 * 4096
                s2 = size_s - s1
                frac1 = s1 / size_s
                cols.add(start[split], d[split] * frac1, aa[split], bb[split], s1, pth[split])
                cols.add(start[split] + d[split] * frac1, d[split] * (1 - frac1), aa[split], bb[split], s2, pth[split])
            if net.any():
                last = max(last, float((start + d)[net].max()))
        return last

    def _emit_dp(self, cols, eB, dp_paths, dp_net, flow_noise, t_step, ready=None, phases: int = 2, bucket_ready=None) -> float:
        """Ring collective per stage once every replica is ready.

        ``ready`` (P,): when the stage's collective may start (default: every
        replica's last backward); ``phases``: 2 for an all-reduce, 1 for a
        reduce-scatter or an all-gather; ``bucket_ready`` (P, buckets): a
        bucket waits for its own readiness (overlap with the backward).
        """
        spec, fab = self.spec, self.fab
        T, D, P = spec.tp, spec.dp, spec.pp
        if D == 1:
            return -np.inf
        bw = fab.bytes_per_ns * self._bw_factor(dp_paths, t_step, (self.dp_a, self.dp_b)) / flow_noise  # (T, D, P) per edge
        msg = spec.message_bytes
        end = -np.inf
        for p in range(P):
            t0 = float(eB[-1, :, p].max()) if ready is None else float(ready[p])  # the collective starts when all members are ready
            net = dp_net[:, :, p]  # (T, D)
            bw_p = bw[:, :, p]
            uni = self.uniform_edge[:, :, p]
            offset = np.zeros(T)  # per rail: rings on different rails run independently
            for i, bucket in enumerate(self.buckets):
                if bucket_ready is not None:
                    offset = np.maximum(offset, bucket_ready[p, i] - t0)
                chunk = -(-int(bucket) // D)
                n_full, rem = divmod(chunk, msg)
                sizes = np.array([msg] * n_full + ([rem] if rem else []), dtype=np.int64)
                n_uni = max(1, int(round(chunk / msg)))
                sizes_u = np.full(n_uni, min(msg, chunk) if chunk < msg else msg, dtype=np.int64)
                # ring step time per rail = slowest edge of that rail's ring
                edge_t = np.where(net, fab.latency_ns + chunk / bw_p, chunk / fab.nvlink_bytes_per_ns)
                step_t = edge_t.max(axis=1)  # (T,)
                R = phases * (D - 1)
                r = np.arange(R)
                for sz, mask in ((sizes, net & ~uni), (sizes_u, net & uni)):
                    if not mask.any():
                        continue
                    ti, di = np.nonzero(mask)
                    offs = np.concatenate([[0], np.cumsum(sz)[:-1]])
                    # flows: (edge, ring step, message)
                    base = t0 + offset[ti][:, None, None] + r[None, :, None] * step_t[ti][:, None, None]
                    st = base + offs[None, None, :] / bw_p[ti, di][:, None, None]
                    du = fab.latency_ns + sz[None, None, :] / bw_p[ti, di][:, None, None]
                    du = np.broadcast_to(du, st.shape)
                    shape = st.shape
                    a = np.broadcast_to(self.dp_a[ti, di, p][:, None, None], shape)
                    b = np.broadcast_to(self.dp_b[ti, di, p][:, None, None], shape)
                    s = np.broadcast_to(sz[None, None, :], shape)
                    pth = np.broadcast_to(dp_paths[ti, di, p][:, None, None, :], shape + (3,))
                    cols.add(st.ravel(), du.ravel(), a.ravel(), b.ravel(), s.ravel(), pth.reshape(-1, 3))
                    end = max(end, float((st + du).max()))
                offset = offset + R * step_t
        return end
