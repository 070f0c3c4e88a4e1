"""The per-window analyses over GPU flows: pairs -> steps -> phases -> anomalies.

``prism replay`` runs them over a whole capture (in batches of whole jobs:
:mod:`prism.analysis.batches`); the daemon runs them on each window
(:mod:`prism.serve.monitor`). Input is column arrays (no per-flow objects); every step
here is vectorised, and the loops left run over jobs, pipelines or steps.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np
import pandas as pd

from prism.analysis.collectives import CP, DP, EP, PP, collective_instances
from prism.analysis.control import control_messages
from prism.analysis.diagnosis import (
    ArrivalDiagnoser,
    CrossStepDiagnoser,
    HangDiagnoser,
    StageLagDiagnoser,
    SwitchBandwidth,
    SwitchDiagnoser,
    empty_anomalies,
    in_time_order,
    not_named_by,
)
from prism.analysis.parallelism import ParallelismClassifier, pair_episodes, pair_ids
from prism.analysis.timeline import PHASE_COLUMNS, STEP_COLUMNS, StepTimeline, parallel_groups
from prism.common.ordering import rank_keys, stable_order
from prism.ingest.topology import Topology

__all__ = ["Analysis", "DEFAULT_SLICE_FLOWS", "Settings", "add_anomalies", "analyse", "label_names", "pair_kinds"]

#: GPU flows of one job analysed at once (about 1.5 GiB at the analyses' peak): a
#: longer job is analysed in time slices of this many (:mod:`prism.analysis.slices`), so
#: with the flows spilled, memory follows the slice, not the job's length
DEFAULT_SLICE_FLOWS = 6_000_000


@dataclass
class Settings:
    """Analysis settings (the CLI's flags map onto these)."""

    classifier: ParallelismClassifier = field(default_factory=ParallelismClassifier)
    timeline: StepTimeline = field(default_factory=StepTimeline)
    cross_step: CrossStepDiagnoser = field(default_factory=CrossStepDiagnoser)
    cross_group: StageLagDiagnoser = field(default_factory=StageLagDiagnoser)
    arrival: ArrivalDiagnoser = field(default_factory=ArrivalDiagnoser)
    switches: SwitchDiagnoser = field(default_factory=SwitchDiagnoser)
    hang: HangDiagnoser = field(default_factory=HangDiagnoser)
    #: a job with more GPU flows is analysed this many at a time, in overlapping time slices (:mod:`prism.analysis.slices`)
    slice_flows: int = DEFAULT_SLICE_FLOWS


@dataclass
class Analysis:
    """What the analyses found (frames in the output contract's formats)."""

    pairs: pd.DataFrame  # job_id, src, dst, type
    steps: pd.DataFrame | None = None  # STEP_COLUMNS
    phases: pd.DataFrame | None = None  # PHASE_COLUMNS
    anomalies: pd.DataFrame | None = None  # ANOMALY_COLUMNS
    switch_bandwidth: pd.DataFrame | None = None  # per window and switch/link
    shapes: pd.DataFrame | None = None  # job_id, dp, pp, tp
    group_lag: pd.DataFrame | None = None  # job_id, server, step, ratio, z, stage, lag (per pipeline-stage server and step)
    arrivals: pd.DataFrame | None = None  # ARRIVAL_COLUMNS: per DP collective burst, the server that sent last
    slices: dict = field(default_factory=dict)  # job_id -> time slices, for the jobs analysed in slices (prism.analysis.slices)
    job_states: pd.DataFrame | None = None  # job_id, state (running, hung, ended), since_ns (prism.analysis.diagnosis.hang)
    collectives: pd.DataFrame | None = None  # INSTANCE_COLUMNS: per collective instance (prism.analysis.collectives)


def _pair_key(a, b, n):
    return np.minimum(a, b).astype(np.int64) * n + np.maximum(a, b)


def analyse(
    a: np.ndarray,
    b: np.ndarray,
    start: np.ndarray,
    duration: np.ndarray,
    size: np.ndarray,
    labels: np.ndarray,
    jobs: pd.DataFrame,
    topology: Topology,
    capture_end: int,
    switch_bw: SwitchBandwidth | None = None,
    settings: Settings | None = None,
    stop_after: str = "diagnosis",
    on_stage: Callable[[str], object] | None = None,
    phases: bool = True,
) -> Analysis:
    """Run the analyses over one window of GPU flows.

    Parameters
    ----------
    a, b : int arrays
        Source and destination NIC indices.
    start, duration, size : int arrays
    labels : int array
        Job label per NIC (:meth:`prism.analysis.jobs.JobRecogniser.labels`).
    jobs : DataFrame
        ``job_id, ip`` (:meth:`prism.analysis.jobs.JobRecogniser.predict`).
    topology : Topology
    capture_end : int
        Start of the capture's last record (any traffic).
    switch_bw : SwitchBandwidth, optional
        Fabric bandwidth accumulated over the same flows.
    stop_after : {"pairs", "steps", "diagnosis"}
    on_stage : callable(str), optional
        Called as each stage begins (``"pairs"``, ``"steps"``, ``"phases"``,
        ``"diagnosis"``): progress and per-stage timing for the caller.
    phases : bool, default True
        Build the per-step phase table (:data:`PHASE_COLUMNS`). The daemon
        does not export it, and it costs a tenth of a window's analysis.
    """
    s = settings or Settings()
    stage = on_stage or (lambda name: None)
    if len(a) == 0:
        return Analysis(pairs=pd.DataFrame(columns=["job_id", "src", "dst", "type", "confidence", "evidence"]), steps=pd.DataFrame(columns=STEP_COLUMNS),
                        phases=pd.DataFrame(columns=PHASE_COLUMNS), anomalies=empty_anomalies())
    n = len(topology)
    stage("pairs")
    flow_pair, n_pairs = pair_ids(a, b, n)  # numbered once: the classifier's and the per-flow lookups below
    ours = isinstance(s.classifier, ParallelismClassifier)
    extra: dict[str, Any] = {"server_of": topology.server_codes, "pair_numbers": (flow_pair, n_pairs)} if ours else {}
    clf = s.classifier.fit(a, b, start, size, labels, end=start + duration, **extra)
    p = clf.pairs_
    src_ip, dst_ip = topology.pair_addresses(p["a"], p["b"])
    ip_job = jobs.set_index("ip")["job_id"]
    ptype = p["type"].to_numpy() if "type" in p else np.where(p["dp"], "DP", "PP")
    pairs = pd.DataFrame({"job_id": ip_job.reindex(src_ip).to_numpy(), "src": src_ip, "dst": dst_ip, "type": ptype})
    # the size-rule baseline has no confidence: it is sure of everything
    pairs["confidence"] = p["confidence"].to_numpy() if "confidence" in p else 1.0
    pairs["evidence"] = p["evidence"].to_numpy() if "evidence" in p else "size rule"
    pairs = pairs.sort_values(["job_id", "src", "dst"]).reset_index(drop=True)
    out = Analysis(pairs=pairs)
    # the DP rings and pipelines: components of the DP and of the PP pairs
    dp_mask = p["dp"].to_numpy()
    # expert (all-to-all) and context (ring attention) parallel pairs are neither a DP ring nor a pipeline
    pp_mask = ptype == "PP"
    pa, pb = p["a"].to_numpy(), p["b"].to_numpy()
    comps = {"dp": parallel_groups(pa[dp_mask], pb[dp_mask], n), "pp": parallel_groups(pa[pp_mask], pb[pp_mask], n)}
    label_name = label_names(labels, jobs, topology)
    out.shapes = _shapes(p, labels, comps, label_name, jobs, pp_mask)
    for kind in ("EP", "CP"):  # the size of the all-to-all groups and the attention rings, where a job has them
        m = ptype == kind
        if m.any():
            out.shapes[kind.lower()] = _largest_group(pa[m], pb[m], n, labels, label_name, out.shapes["job_id"])
    if stop_after == "pairs":
        return out

    # per-flow job and DP flag, through the pair table (sorted by key): the
    # flows' pairs numbered in key order are their rows of the sorted table
    pk = _pair_key(pa, pb, n)
    o = np.argsort(pk)
    pk, pdp, ppp = pk[o], dp_mask[o], pp_mask[o]
    if n_pairs != len(pk):  # a classifier that left pairs out (or added some): look each flow's pair up
        flow_pair = np.searchsorted(pk, _pair_key(a, b, n))
    is_dp = pdp[flow_pair]
    is_pp = ppp[flow_pair]
    collective = p["collective"].to_numpy()[o][flow_pair] if "collective" in p else None
    job = labels[a]
    end = start + duration
    if "type" in p:
        # a DP ring whose edges ride all-to-all pairs (an MoE job's dense ring inside its EP groups): its bursts
        # are the DP marker, the all-to-alls are not
        ring = ring_bursts_on(np.asarray(ptype[o] == "EP")[flow_pair], flow_pair, a, b, start, end, size=size)
        if ring.any():
            is_dp = is_dp | ring
            if collective is not None:
                collective = collective | ring
    stage("steps")
    tl = s.timeline.fit(job, start, end, is_dp, size=size, capture_end=capture_end, job_names=label_name, pair=flow_pair, collective=collective)
    server_of = topology.nics["server"].to_numpy()
    steps, fs, hangs = _runs_and_hangs(s, tl, job, a, start, end, is_dp, size, collective, capture_end, label_name, flow_pair, server_of)
    out.steps = steps[STEP_COLUMNS]
    out.job_states = hangs.states_
    inside = fs >= 0
    if phases:
        stage("phases")
        out.phases = _phases(steps, fs, a, is_dp, start, end, size, comps["dp"], comps["pp"], topology)
    stage("collectives")
    out.collectives = _collectives(is_dp, is_pp, ptype[o] if "type" in p else None, flow_pair, a, b, start, end, size, pa[o], pb[o], labels,
                                   topology, label_name)
    if stop_after == "steps":
        return out

    stage("diagnosis")
    # pipeline transfers, not the control messages that ride the same pairs
    # (the grad-norm all-reduce): they would pose as a stage's first output
    pair_max = np.zeros(len(pk), dtype=np.int64)
    np.maximum.at(pair_max, flow_pair, size)
    pp = inside & is_pp & (size >= 0.01 * pair_max[flow_pair])
    if collective is not None:  # and not the embedding/grad-norm pair that closes a pipeline into a ring
        pp &= ~collective
    first = _first_flows(fs[pp], a[pp], b[pp], start[pp], end[pp], steps)
    lag = s.cross_group.fit(first, out.steps, server_of)
    out.group_lag = lag.lag_
    # a pure-DP job's straggler: the server that sends last at its collectives (not one the stages already name)
    arr = s.arrival.fit(job, a, start, end, is_dp, comps["dp"], server_of, label_name, out.steps, b=b, size=size)
    out.arrivals = arr.arrivals_
    add_anomalies(out, [s.cross_step.fit(out.steps).predict(), lag.predict(), not_named_by(arr.predict(), lag.predict()), hangs.predict()], switch_bw, s, topology)
    return out


def _runs_and_hangs(s: Settings, tl: StepTimeline, job, a, start, end, is_dp, size, collective, capture_end, label_name, flow_pair,
                    server_of) -> tuple[pd.DataFrame, np.ndarray, HangDiagnoser]:
    """The steps around the jobs' silences: ``(steps, flow_step, hang diagnoser)``.

    A job that restarted (a silence after a hang, or after its traffic
    stopped mid-step) has its steps cut per run: the timeline is fitted
    again with each run as a job of its own (the outage is no step), and
    the steps are numbered on across the runs. A step that ends at a
    collective that never completed (a hang, or one still in progress at
    the end) is dropped: it is not whole (see
    :mod:`prism.analysis.diagnosis.hang`).
    """
    hd = s.hang.fit(job, a, start, end, size, is_dp, collective, tl.steps_, capture_end, label_name, server_of)
    steps, fs = tl.steps_, tl.flow_step_
    split = hd.runs_ is not None
    if hd.runs_ is not None:
        names = dict(label_name)
        names.update({r: label_name.get(j, j) for r, j in hd.run_job_.items()})
        tl = copy.copy(s.timeline).fit(hd.runs_, start, end, is_dp, size=size, capture_end=capture_end, job_names=names, pair=flow_pair,
                                        collective=collective)
        steps, fs = tl.steps_.copy(), tl.flow_step_
        lab = steps["job"].to_numpy()
        steps["job"] = np.array([hd.run_job_.get(int(x), int(x)) for x in lab], dtype=np.int64) if len(lab) else lab
        # judged again on the runs' steps: a job whose outage hid every step has a median step now
        hd = copy.copy(s.hang).fit(job, a, start, end, size, is_dp, collective, steps, capture_end, label_name, server_of)
    if len(hd.drop_) and len(steps):
        drop = np.zeros(len(steps), dtype=bool)
        sj, se = steps["job"].to_numpy(), steps["end_ns"].to_numpy()
        for j, after, until in hd.drop_.itertuples(index=False):
            drop |= (sj == j) & (se > after) & (se <= until)
        if drop.any():
            keep = ~drop
            new_row = np.cumsum(keep) - 1
            fs = np.where((fs >= 0) & keep[np.maximum(fs, 0)], new_row[np.maximum(fs, 0)], -1)
            steps = steps[keep].reset_index(drop=True)
    if split and len(steps):
        # the runs' steps numbered on, per job in time order (the rows stay where flow_step points)
        steps["step"] = steps.groupby("job")["start_ns"].rank(method="first").astype(np.int64) - 1
    return steps, fs, hd


def _collectives(is_dp, is_pp, pair_type, flow_pair, a, b, start, end, size, pair_a, pair_b, labels, topology, label_name) -> pd.DataFrame:
    """The collective instances (:mod:`prism.analysis.collectives`): each flow's kind from its pair's type and the DP marks."""
    kind = np.full(len(a), -1, np.int8)
    kind[is_pp] = PP
    for name, code in (("EP", EP), ("CP", CP)):  # per pair, then its flows (only where a job has such pairs)
        typed = np.asarray(pair_type == name) if pair_type is not None else None
        if typed is not None and typed.any():
            kind[typed[flow_pair]] = code
    kind[is_dp] = DP  # an MoE job's dense ring bursts on its expert pairs too
    dp = np.flatnonzero(is_dp)
    # the receivers' clear-to-sends are no collective of their own, nor part of one's bytes: left out
    kind[dp[control_messages(size[dp], pd.factorize(labels[a[dp]])[0])]] = -1
    return collective_instances(kind, a, b, start, end, size, flow_pair, pair_a, pair_b, labels, topology.server_codes, label_name)


def ring_bursts_on(mask: np.ndarray, flow_pair: np.ndarray, a: np.ndarray, b: np.ndarray, start: np.ndarray, end: np.ndarray,
                   merge_ns: int = 20_000, min_flows: int = 3, pace: float = 20.0, size: np.ndarray | None = None) -> np.ndarray:
    """Per flow: among the flows ``mask`` marks, those of one-way runs of ``min_flows`` or more (ring collective steps).

    An all-to-all goes every way at once (an episode of its pair carries
    both directions); a ring collective's steps go one way round the ring,
    several chunks back to back. A run is one one-way episode, or
    consecutive one-way episodes of a pair in the same direction with no
    two-way episode between them, each within ``pace`` times the previous
    one's length a flow of it and (``size`` given) with flows of its mean
    size within 5%: a ring paced by a slower edge (a degraded link
    elsewhere in the ring) sends each step's equal chunk alone and waits,
    so its steps show apart, one flow each; an all-to-all flow whose
    reverse was lost is a compute phase away from the ring, and of another
    size. Episodes as
    :func:`prism.analysis.parallelism.pair_episodes` cuts them; one sort of
    the marked flows.

    >>> a, b = np.array([0, 1, 0, 0, 0, 0]), np.array([1, 0, 1, 1, 1, 1])  # an all-to-all both ways, then 4 ring steps apart
    >>> t = np.array([0, 0, 10, 10.1, 10.2, 10.3]) * 1_000_000
    >>> ring_bursts_on(np.ones(6, dtype=bool), np.zeros(6, dtype=np.int64), a, b, t, t + 9_000).tolist()
    [False, False, True, True, True, True]
    >>> t[-1] = 20_000_000  # the last a compute phase later: a lost record's all-to-all flow, not a ring step
    >>> ring_bursts_on(np.ones(6, dtype=bool), np.zeros(6, dtype=np.int64), a, b, t, t + 9_000).tolist()
    [False, False, True, True, True, False]
    >>> t[-1] = 10_300_000  # near, but of another size
    >>> ring_bursts_on(np.ones(6, dtype=bool), np.zeros(6, dtype=np.int64), a, b, t, t + 9_000, size=np.array([9, 9, 4, 4, 4, 1])).tolist()
    [False, False, True, True, True, False]
    """
    out = np.zeros(len(a), dtype=bool)
    idx = np.flatnonzero(mask)
    if len(idx) == 0:
        return out
    o = idx[np.lexsort((start[idx], flow_pair[idx]))]
    ep = np.cumsum(pair_episodes(flow_pair[o], start[o], end[o], merge_ns)) - 1
    n = np.bincount(ep)
    fwd = np.bincount(ep, weights=(a[o] < b[o]).astype(np.float64))
    oneway = (fwd == 0) | (fwd == n)
    # runs: consecutive one-way episodes of one pair in one direction (episodes are numbered in (pair, start) order)
    first = np.r_[0, np.flatnonzero(np.diff(ep)) + 1]
    ep_pair, ep_fwd = flow_pair[o][first], fwd > 0
    ep_start = start[o][first]
    ep_end = np.maximum.reduceat(end[o], first)
    per_flow = np.maximum((ep_end - ep_start) / n, 1.0)  # an episode's length a flow (a burst's back-to-back chunks: one chunk's time)
    near = ep_start[1:] - ep_end[:-1] <= pace * per_flow[:-1]
    if size is not None:  # a ring's steps move equal chunks: alike flows (however many of them an episode merges)
        flow_bytes = np.bincount(ep, weights=np.asarray(size, dtype=np.float64)[o]) / n
        near &= np.abs(flow_bytes[1:] - flow_bytes[:-1]) <= 0.05 * np.maximum(flow_bytes[1:], flow_bytes[:-1])
    new_run = np.r_[True, (ep_pair[1:] != ep_pair[:-1]) | (ep_fwd[1:] != ep_fwd[:-1]) | ~oneway[1:] | ~oneway[:-1] | ~near]
    run = np.cumsum(new_run) - 1
    burst = oneway & (np.bincount(run, weights=n)[run] >= min_flows)
    out[o] = burst[ep]
    return out


def add_anomalies(out: Analysis, found: list[pd.DataFrame], switch_bw: SwitchBandwidth | None, s: Settings, topology: Topology | None = None) -> None:
    """The jobs' anomalies and the fabric's (one switch diagnosis over all flows, each pair's flows of its type: with
    ``topology``, ``out.pairs`` gives them) into ``out``."""
    if switch_bw is not None:
        sd = s.switches.fit(switch_bw, pair_kinds(out.pairs, topology) if topology is not None else None)
        found = found + [sd.predict()]
        out.switch_bandwidth = sd.bandwidth_
    out.anomalies = in_time_order(found)


def pair_kinds(pairs: pd.DataFrame | None, topology: Topology) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """``(a, b, type)`` of the typed GPU pairs (NIC indices) of a ``pairs`` frame: the flow kinds the switch diagnosis
    judges apart (:meth:`prism.analysis.diagnosis.SwitchDiagnoser.fit`); None without pairs."""
    if pairs is None or not len(pairs) or "type" not in pairs:
        return None
    a, b = topology.nic_index(pairs["src"]), topology.nic_index(pairs["dst"])
    ok = (a >= 0) & (b >= 0)
    return a[ok], b[ok], pairs["type"].to_numpy()[ok]


def label_names(labels: np.ndarray, jobs: pd.DataFrame, topology: Topology) -> dict:
    """``{job label: job id}`` from the recogniser's per-NIC labels and its jobs frame."""
    idx = topology.ips.get_indexer(jobs["ip"])  # type: ignore[arg-type]  # pandas takes any array-like; the stubs ask for an Index
    return dict(zip(labels[idx].tolist(), jobs["job_id"].tolist()))


def _shapes(p: pd.DataFrame, labels, comps: dict, names: dict, jobs, pp_mask: np.ndarray | None = None) -> pd.DataFrame:
    """``job_id, dp, pp, gpus, nics_per_stage, dp_exact`` per job.

    PP is the usual pipeline length (the most common; of equally common
    ones, the shortest). DP is the largest DP ring seen: a ring whose
    members partly share a server passes through NVLink there, and the
    network shows it in pieces (open paths of one-way ring edges instead of
    a cycle); ``dp_exact`` is False then, and DP is a lower bound.
    ``nics_per_stage`` is the job's NICs over DP x PP: the tensor-parallel
    size when every GPU has its own NIC, which the network cannot tell
    (GPUs that share a NIC look the same), so it is not called TP.

    Per component and per job in numpy (a pandas groupby per statistic cost
    the daemon 30 ms a window).
    """
    gpus = jobs.groupby("job_id").size()
    ids = gpus.index
    dp, pp = np.ones(len(ids), dtype=np.int64), np.ones(len(ids), dtype=np.int64)
    dp_exact = np.ones(len(ids), dtype=bool)
    dp_mask = p["dp"].to_numpy()
    for kind, m in (("dp", dp_mask), ("pp", ~dp_mask if pp_mask is None else pp_mask)):
        a, b = p["a"].to_numpy()[m], p["b"].to_numpy()[m]
        if len(a) == 0:
            continue
        comp = comps[kind]
        nodes = np.unique(np.concatenate([a, b]))
        comp_ids, node_comp, size = np.unique(comp[nodes], return_inverse=True, return_counts=True)
        first = np.full(len(comp_ids), len(nodes))
        np.minimum.at(first, node_comp, np.arange(len(nodes)))  # each component's lowest node names its job
        job = ids.get_indexer(pd.Series(labels[nodes[first]]).map(names))  # -1: a label no job of ``jobs`` has
        keep = job >= 0
        if kind == "pp":
            # per job, the most common pipeline length; ties: the shortest
            radix = int(size.max()) + 1
            key, count = np.unique(job[keep] * radix + size[keep], return_counts=True)
            jk, sk = key // radix, key % radix
            o = np.lexsort((sk, -count, jk))
            top = o[np.r_[True, jk[o][1:] != jk[o][:-1]]] if len(o) else o
            pp[jk[top]] = sk[top]
        else:
            pair_comp = np.searchsorted(comp_ids, comp[a])
            edges = np.bincount(pair_comp, minlength=len(comp_ids))
            two_way = np.bincount(pair_comp, weights=~p["one_way"].to_numpy()[m], minlength=len(comp_ids)) > 0
            ring = ((edges == size) & (size >= 3)) | ((size == 2) & two_way)
            np.maximum.at(dp, job[keep], size[keep])
            np.logical_and.at(dp_exact, job[keep], ring[keep])
    counts = gpus.to_numpy()
    return pd.DataFrame({"job_id": ids, "dp": dp, "pp": pp, "dp_exact": dp_exact, "gpus": counts,
                         "nics_per_stage": np.maximum(counts // (dp * pp), 1)})


def _largest_group(a: np.ndarray, b: np.ndarray, n: int, labels, names: dict, job_ids: pd.Series) -> np.ndarray:
    """Per job of ``job_ids``, the most GPUs in one connected group of the pairs ``a``-``b`` (0: none)."""
    comp = parallel_groups(a, b, n)
    nodes = np.unique(np.concatenate([a, b]))
    _, node_comp, size = np.unique(comp[nodes], return_inverse=True, return_counts=True)
    job = pd.Index(job_ids).get_indexer(pd.Series(labels[nodes]).map(names))
    out = np.zeros(len(job_ids), dtype=np.int64)
    keep = job >= 0
    np.maximum.at(out, job[keep], size[node_comp[keep]])
    return out


def _phases(steps, fs, a, is_dp, start, end, size, dp_comp, pp_comp, topology) -> pd.DataFrame:
    """Per step and parallel group (DP ring or pipeline): the span of its traffic.

    ``fs`` is each flow's step row, -1 outside every step (those flows are
    left out). The groups, by (step row, DP or PP, group), are numbered in
    that order; one stable counting sort of the flows by group, then one
    compiled pass over each group's flows through that order (no sorted
    copy of any column).
    """
    inside = fs >= 0
    if not inside.any():
        return pd.DataFrame(columns=PHASE_COLUMNS)
    comp = np.where(is_dp, dp_comp[a], pp_comp[a]).astype(np.int64)
    n_comp = int(max(len(dp_comp), len(pp_comp)))
    n_keys = (int(fs.max()) + 1) * 2 * n_comp
    gid, groups = rank_keys(np.where(inside, (fs.astype(np.int64) * 2 + is_dp) * n_comp + comp, -1), n_keys)
    n_groups = len(groups)
    gid[~inside] = n_groups  # the flows outside sort last, and are dropped
    counts = np.bincount(gid, minlength=n_groups + 1)
    o = stable_order(gid, n_groups + 1)[: int(inside.sum())]
    # the order must also be by start within each group (np.lexsort's): it is
    # when each job's flows come in start order, as a replay's and a window's do
    sums = _group_sums(o, counts[:n_groups], start, end, size, a, int(a.max()) + 1, MIN_PAUSE_NS)
    if sums is None:
        o = np.lexsort((start, gid))[: int(inside.sum())]
        sums = _group_sums(o, counts[:n_groups], start, end, size, a, int(a.max()) + 1, MIN_PAUSE_NS)
    first, last_end, flows, nbytes, arrival = sums
    g = pd.DataFrame({
        "row": groups // (2 * n_comp), "dp": (groups // n_comp) % 2 == 1, "comp": groups % n_comp,
        "start_ns": first,  # its first flow's: sorted by start within the group
        "end_ns": last_end, "flows": flows, "bytes": nbytes, "arrival_ns": arrival,
    })
    # group names and servers: one lookup per group, not per flow
    nics = topology.nics
    names = {}
    for kind, cmp in (("dp", dp_comp), ("pp", pp_comp)):
        used = np.unique(g.loc[g["dp"] == (kind == "dp"), "comp"])
        members = pd.DataFrame({"comp": cmp, "ip": nics["ip"].to_numpy(), "server": nics["server"].to_numpy()})
        members = members[members["comp"].isin(used)]
        for c, m in members.groupby("comp"):
            names[(kind == "dp", c)] = (f"{kind}@{m['ip'].min()}", "|".join(sorted(m["server"].unique())))
    info = [names[(d, c)] for d, c in zip(g["dp"], g["comp"])]
    st = steps.iloc[g["row"].to_numpy()]
    return pd.DataFrame({
        "job_id": st["job_id"].to_numpy(), "step": st["step"].to_numpy(),
        "group": [x[0] for x in info], "kind": np.where(g["dp"], "dp_collective", "pp_traffic"),
        "start_ns": g["start_ns"].to_numpy(), "arrival_ns": g["arrival_ns"].to_numpy(), "end_ns": g["end_ns"].to_numpy(),
        "flows": g["flows"].to_numpy(), "bytes": g["bytes"].to_numpy(),
        "servers": [x[1] for x in info],
    })[PHASE_COLUMNS]


#: shorter gaps in a group's traffic are not pauses between bursts (the transfers of one collective
#: leave gaps of nanoseconds; compute between bursts takes milliseconds)
MIN_PAUSE_NS = 20_000


@numba.njit(cache=True, nogil=True)
def _group_sums(order, counts, start, end, size, src, n_src, min_pause):  # pragma: no cover - compiled
    """Per group (its flows ``order[lo:lo + counts[g]]``, by start): its first start, last end, flows, bytes, and when
    its last member sent its first flow of the group's last burst.

    A group's traffic in a step can come in bursts (a DP ring's parameter all-gather at the step's
    start, gradient buckets during the backward, the reduce-scatter that ends the step). Its members
    arrive one by one; the burst runs once the last has. The burst opens at the flow after the longest
    pause over ``min_pause`` (start minus the end of every earlier flow; the last such flow on a tie);
    with no pause, at the group's first flow.
    """
    n = len(counts)
    first = np.empty(n, np.int64)
    last_end = np.empty(n, np.int64)
    nbytes = np.zeros(n, np.int64)
    arrival = np.empty(n, np.int64)
    seen = np.full(n_src, -1, np.int64)
    s = 0
    for g in range(n):
        e = s + counts[g]
        f = order[s]
        first[g] = start[f]
        busy = end[f]
        nbytes[g] = size[f]
        best = min_pause
        opener = s
        for i in range(s + 1, e):
            f = order[i]
            if start[f] < start[order[i - 1]]:
                return None  # not in start order: the caller sorts by start too
            pause = start[f] - busy
            if pause > min_pause and pause >= best:
                best = pause
                opener = i
            if end[f] > busy:
                busy = end[f]
            nbytes[g] += size[f]
        last_end[g] = busy
        # flows are in start order: the last member to appear did so last
        at = start[order[opener]]
        for i in range(opener, e):
            f = order[i]
            if seen[src[f]] != g:
                seen[src[f]] = g
                at = start[f]
        arrival[g] = at
        s = e
    return first, last_end, counts.astype(np.int64), nbytes, arrival


def _first_flows(fs, a, b, start, end, steps) -> pd.DataFrame:
    """The first flow of each directed pair in each step."""
    cols = ["job_id", "step", "src", "dst", "start_ns", "end_ns"]
    if len(fs) == 0:
        return pd.DataFrame(columns=cols)
    # groups (step, src, dst) numbered in that order, through the directed
    # pairs present: no sort of the flows
    pair, n_pairs = pair_ids(a, b, int(max(a.max(), b.max())) + 1, directed=True)
    group, _ = rank_keys(fs.astype(np.int64) * n_pairs + pair, (int(fs.max()) + 1) * n_pairs)
    new = _first_of(group, np.asarray(start, np.int64), int(group.max()) + 1)  # the earliest start; ties: the first given
    st = steps.iloc[fs[new]]
    return pd.DataFrame({"job_id": st["job_id"].to_numpy(), "step": st["step"].to_numpy(), "src": a[new], "dst": b[new], "start_ns": start[new], "end_ns": end[new]})


@numba.njit(cache=True, nogil=True)
def _first_of(group, start, n_groups):  # pragma: no cover - compiled
    """Per group, its row of the earliest start (the first such row on a tie)."""
    first = np.full(n_groups, -1, np.int64)
    for i in range(len(group)):
        g = group[i]
        if first[g] < 0 or start[i] < start[first[g]]:
            first[g] = i
    return first
