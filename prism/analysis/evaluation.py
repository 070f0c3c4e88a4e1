"""Scores against ground truth (used by the demos, tests and benchmarks)."""
from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pandas as pd
from scipy.special import comb

from prism.analysis.parallelism import UNCERTAIN_BELOW

if TYPE_CHECKING:
    from prism.analysis.analyse import Analysis
    from prism.ingest.topology import Topology

__all__ = ["detection_delays", "adjusted_rand_index", "gpu_flow_arrays", "gpu_flow_ends", "score_cluster", "score_stream", "pair_type_truth", "job_name_map", "score_steps", "score_anomalies",
           "TruthReport", "compare_with_truth"]


class GroundTruth(Protocol):
    """The truth frames the scores read: a generated cluster (``synthetic.GeneratedCluster``) or one derived from a trace."""

    jobs: pd.DataFrame  # job_id, ip
    pairs: pd.DataFrame  # job_id, src, dst, type
    steps: pd.DataFrame  # job_id, step, start_ns, end_ns
    faults: pd.DataFrame  # kind, job_id, step, start_ns, end_ns, subject, factor
    meta: dict


class ReplayFindings(Protocol):
    """What :func:`score_cluster` reads of a replay (:class:`prism.offline.replay.ReplayResult`)."""

    @property
    def jobs(self) -> pd.DataFrame | None: ...
    @property
    def pairs(self) -> pd.DataFrame | None: ...
    @property
    def analysis(self) -> Analysis | None: ...


def adjusted_rand_index(labels_true: Iterable[Hashable], labels_pred: Iterable[Hashable]) -> float:
    """Adjusted Rand index of two clusterings of the same items (Hubert & Arabie 1985).

    1.0 for identical partitions (up to renaming), about 0 for random ones.

    >>> adjusted_rand_index(["a", "a", "b"], [1, 1, 2])
    1.0
    """
    t = pd.factorize(pd.Series(list(labels_true)))[0]
    p = pd.factorize(pd.Series(list(labels_pred)))[0]
    if len(t) != len(p):
        raise ValueError("label arrays differ in length")
    n = len(t)
    if n < 2:
        return 1.0
    cont = pd.crosstab(t, p).to_numpy()
    sum_comb = comb(cont, 2).sum()
    a = comb(cont.sum(axis=1), 2).sum()
    b = comb(cont.sum(axis=0), 2).sum()
    expected = a * b / comb(n, 2)
    max_index = (a + b) / 2
    if max_index == expected:
        return 1.0
    return float((sum_comb - expected) / (max_index - expected))


def gpu_flow_arrays(flows: pd.DataFrame, topology: Topology) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(src NIC, dst NIC, start_ns, size) of the flows between two GPU NICs."""
    a, b = topology.nic_index(flows["src"]), topology.nic_index(flows["dst"])
    g = (a >= 0) & (b >= 0)
    return a[g], b[g], flows["start_ns"].to_numpy()[g], flows["size"].to_numpy()[g]


def gpu_flow_ends(flows: pd.DataFrame, topology: Topology) -> np.ndarray:
    """End (ns) of the flows between two GPU NICs, in :func:`gpu_flow_arrays`' order."""
    a, b = topology.nic_index(flows["src"]), topology.nic_index(flows["dst"])
    g = (a >= 0) & (b >= 0)
    return (flows["start_ns"].to_numpy() + flows["duration_ns"].to_numpy())[g]


def pair_type_truth(a: np.ndarray, b: np.ndarray, topology: Topology, truth_pairs: pd.DataFrame) -> np.ndarray:
    """The true type of each pair (NIC indices), from a ``job_id,src,dst,type`` frame.

    Pairs missing from the truth get NaN.
    """
    lo, hi = topology.pair_addresses(a, b)
    return truth_pairs.set_index(["src", "dst"])["type"].reindex(list(zip(lo, hi))).to_numpy()


def job_name_map(pred_jobs: pd.DataFrame, truth_jobs: pd.DataFrame) -> dict:
    """Predicted job id -> truth job name, by the most shared GPU addresses."""
    m = pred_jobs[["job_id", "ip"]].merge(truth_jobs[["job_id", "ip"]], on="ip", suffixes=("", "_true"))
    if m.empty:
        return {}
    best = m.groupby(["job_id", "job_id_true"]).size().reset_index(name="n").sort_values("n").drop_duplicates("job_id", keep="last")
    return dict(zip(best["job_id"], best["job_id_true"]))


def score_steps(pred: pd.DataFrame, truth: pd.DataFrame, names: dict, tolerance: float = 0.01, capture_end: int | None = None) -> pd.DataFrame:
    """Per true job: steps found, spurious steps, mean and max duration error.

    A predicted step matches the true step of the same job whose end is
    nearest, if the ends differ by less than ``tolerance`` of its duration.
    With ``capture_end``, steps (true and predicted) ending within one
    median step of the capture's end are not scored: whether such a step
    is whole cannot be told (its next step is not in the capture).
    """
    rows = []
    pred = pred.assign(job=pred["job_id"].map(names))
    for job, t in truth.groupby("job_id"):
        p = pred[pred["job"] == job]
        if capture_end is not None and len(t):
            edge = capture_end - float((t["end_ns"] - t["start_ns"]).median())
            t, p = t[t["end_ns"] <= edge], p[p["end_ns"] <= edge]
        te, tdur = t["end_ns"].to_numpy(), (t["end_ns"] - t["start_ns"]).to_numpy().astype(float)
        pe, pdur = p["end_ns"].to_numpy(), (p["end_ns"] - p["start_ns"]).to_numpy().astype(float)
        if len(te) and len(pe):
            j = np.clip(np.searchsorted(te, pe), 1, len(te)) - 1
            j = np.where((j + 1 < len(te)) & (np.abs(te[np.minimum(j + 1, len(te) - 1)] - pe) < np.abs(te[j] - pe)), j + 1, j)
            ok = np.abs(te[j] - pe) < tolerance * tdur[j]
            err = np.abs(pdur[ok] - tdur[j[ok]]) / tdur[j[ok]]
            found = len(np.unique(j[ok]))
        else:
            ok, err, found = np.zeros(len(pe), bool), np.zeros(0), 0
        rows.append({"job": job, "true_steps": len(te), "found": found, "spurious": int((~ok).sum()),
                     "found_share": found / len(te) if len(te) else 1.0,
                     "mean_err": float(err.mean()) if len(err) else float("nan"), "max_err": float(err.max()) if len(err) else float("nan")})
    return pd.DataFrame(rows)


#: Which anomaly kinds find which injected fault kinds.
FINDS = {"slow_step": {"slow_step"}, "slow_group": {"slow_group"}, "slow_switch": {"slow_switch"}, "slow_nic": {"slow_host"}, "hang": {"hang"}}
#: Injected events that are no fault to find: a restart raises nothing (beyond the hang that may precede it).
NOT_FAULTS = {"restart"}


def _fault_hits(r, pred: pd.DataFrame) -> pd.Series:
    """Which anomalies of ``pred`` (with a ``job`` column of truth names) find fault ``r``."""
    if r["kind"] == "slow_step":
        # the step's start as reported may differ by the collector's timestamp error: 1% of the step
        slack = max(1_000, 0.01 * (r["end_ns"] - r["start_ns"]))
        return (pred["kind"] == "slow_step") & (pred["job"] == r["job_id"]) & (pred["start_ns"] >= r["start_ns"] - slack) & (pred["start_ns"] < r["end_ns"] - slack)
    if r["kind"] == "hang":  # its job, naming the server that never joined, at the collective that never completed
        servers = set(str(r["subject"]).split("|"))
        return ((pred["kind"] == "hang") & (pred["job"] == r["job_id"]) & (pred["start_ns"] >= r["start_ns"] - 1_000_000_000)
                & (pred["start_ns"] <= r["end_ns"]) & pred["subject"].map(lambda s: bool(set(str(s).split("|")) & servers)))
    if r["kind"] == "slow_group":
        servers = set(str(r["subject"]).split("|"))
        return (pred["kind"] == "slow_group") & (pred["job"] == r["job_id"]) & pred["subject"].map(lambda s: bool(set(str(s).split("|")) & servers))
    if r["kind"] == "slow_nic":
        return (pred["kind"] == "slow_host") & (pred["subject"] == r["subject"])
    return pred["kind"].isin(["slow_switch", "slow_link"]) & pred["subject"].map(lambda s: r["subject"] in str(s).split(">")) & (pred["start_ns"] < r["end_ns"])


def detection_delays(anomalies: pd.DataFrame, faults: pd.DataFrame, names: dict) -> pd.DataFrame:
    """Per injected fault, the stream time from its start to the first anomaly that finds it.

    ``anomalies`` carries ``detected_ns``: the event time the stream had
    reached when the anomaly appeared (the live demo records it). The
    delay counts from the fault's ``start_ns``, so it includes the affected
    step itself (a step cannot be called slow before it ends), the window
    step and lateness, and the analysis. NaN for a fault not found.
    """
    pred = anomalies.assign(job=anomalies["job_id"].map(names).fillna(""))
    rows = []
    for _, r in faults[~faults["kind"].isin(NOT_FAULTS)].iterrows():
        hit = _fault_hits(r, pred)
        at = pred.loc[hit, "detected_ns"].dropna()
        rows.append({"kind": r["kind"], "job_id": r["job_id"], "subject": r["subject"],
                     "delay_s": (float(at.min()) - float(r["start_ns"])) / 1e9 if len(at) else np.nan})
    return pd.DataFrame(rows, columns=["kind", "job_id", "subject", "delay_s"])


def score_anomalies(pred: pd.DataFrame, faults: pd.DataFrame, names: dict, steps: pd.DataFrame | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Match anomalies with injected faults.

    Returns ``(faults, anomalies)``, each with a ``matched`` column.

    - A ``slow_step`` fault is found by a ``slow_step`` anomaly of its job
      starting within the fault's step.
    - A ``slow_group`` fault is found by a ``slow_group`` anomaly of its job
      naming one of its servers.
    - A ``slow_switch`` fault is found by a ``slow_switch`` anomaly naming it.
    - A ``slow_nic`` fault is found by a ``slow_host`` anomaly naming its server.
    - A ``hang`` is found by a ``hang`` anomaly of its job naming the server
      that never joined. A ``restart`` is no fault: nothing is to be found
      for it, and an anomaly it causes is unexplained.

    An anomaly is explained (not a false positive) if it finds a fault, or is
    an effect of one: a ``regime_change`` of a job starting while a
    ``slow_group`` of that job or a ``slow_switch`` fault begins (within 5
    of the job's median step durations, from ``steps``; 5 s without them),
    or a ``slow_step`` of a job while a ``slow_group`` fault of it lasts.
    A slow NIC slows its job like a straggler: a ``slow_group`` naming its
    server, and the job's ``slow_step`` and ``regime_change`` anomalies while
    it lasts, are its effects; a straggler's own transfers may be slow too:
    a ``slow_host`` naming a server of a ``slow_group`` fault is its effect.
    """
    pred = pred.assign(job=pred["job_id"].map(names).fillna(""))
    f = faults[~faults["kind"].isin(NOT_FAULTS)].copy()
    f["matched"] = False
    explained = np.zeros(len(pred), dtype=bool)
    med_step = {}
    if steps is not None and len(steps):
        med_step = (steps["end_ns"] - steps["start_ns"]).groupby(steps["job_id"].map(names)).median().to_dict()
    for i, r in f.iterrows():
        hit = _fault_hits(r, pred)
        f.at[i, "matched"] = bool(hit.any())
        explained |= hit.to_numpy()
        # effects: the jobs it slows shift to a slower regime when it starts
        if r["kind"] in ("slow_group", "slow_switch"):
            jobs_hit = pred["job"] == r["job_id"] if r["kind"] == "slow_group" else pred["job"] != ""
            lag = pred["job"].map(lambda j: 5 * med_step.get(j, 1e9)).to_numpy()
            near = (pred["start_ns"].to_numpy() >= r["start_ns"] - lag) & (pred["start_ns"].to_numpy() <= r["start_ns"] + lag)
            explained |= (pred["kind"] == "regime_change").to_numpy() & jobs_hit.to_numpy() & near
        during = (pred["start_ns"].to_numpy() >= r["start_ns"] - 1_000) & (pred["start_ns"].to_numpy() <= r["end_ns"])
        if r["kind"] == "slow_group":
            # a straggling worker also makes some of its job's steps slow while it lasts, and its transfers may be slow
            explained |= (pred["kind"] == "slow_step").to_numpy() & (pred["job"] == r["job_id"]).to_numpy() & during
            servers = set(str(r["subject"]).split("|"))
            explained |= (pred["kind"] == "slow_host").to_numpy() & pred["subject"].isin(servers).to_numpy() & during
        if r["kind"] == "slow_nic":
            # a server whose transfers are slow holds its job back like a straggler: its stage lags, its steps slow
            mine = (pred["job"] == r["job_id"]).to_numpy() & during
            explained |= pred["kind"].isin(["slow_step", "regime_change"]).to_numpy() & mine
            names_it = pred["subject"].astype(str).str.split("|").map(set(str(r["subject"]).split("|")).intersection).astype(bool)
            explained |= (pred["kind"] == "slow_group").to_numpy() & mine & names_it.to_numpy()
    return f, pred.assign(matched=explained).drop(columns="job")


def score_cluster(result: ReplayFindings, cluster: GroundTruth) -> dict:
    """One row of the robustness table: a replay result against a generated cluster's truth.

    ``result``: :class:`prism.offline.replay.ReplayResult`; ``cluster``: anything with
    ``jobs, pairs, steps, faults`` truth frames (synthetic or trace-derived).

    Returns ``jobs_ari, pairs, pair_acc, pairs_uncertain, true_steps,
    steps_found, steps_spurious, step_err_mean, faults, faults_found,
    anomalies, anomalies_unexplained`` and per-kind unexplained counts.
    """
    assert result.jobs is not None and result.pairs is not None  # a finished replay has both
    row = {"jobs_ari": _jobs_ari(result.jobs, cluster.jobs)}
    pairs = result.pairs
    t = cluster.pairs.set_index(["src", "dst"])["type"]
    got = pairs.set_index(["src", "dst"])["type"]
    both = t.index.intersection(got.index)
    row["pairs"] = len(t)
    row["pair_acc"] = float((t.loc[both] == got.loc[both]).sum() / max(len(t), 1))
    row["pairs_uncertain"] = int((pairs["confidence"] < UNCERTAIN_BELOW).sum()) if "confidence" in pairs else 0
    an = result.analysis
    if an is not None:
        row.update(_score_found(result.jobs, an.steps, an.anomalies, cluster))
    return row


def score_stream(jobs: pd.DataFrame, steps: pd.DataFrame, anomalies: pd.DataFrame, cluster: GroundTruth) -> dict:
    """:func:`score_cluster` for what the daemon reports: its job map, the steps it counted, the anomalies it raised.

    The same keys but the pair ones (the daemon keeps pair counts, not types).
    """
    return {"jobs_ari": _jobs_ari(jobs, cluster.jobs), **_score_found(jobs, steps, anomalies, cluster)}


def _jobs_ari(jobs: pd.DataFrame, truth_jobs: pd.DataFrame) -> float:
    pred = jobs.set_index("ip")["job_id"].reindex(truth_jobs["ip"]).fillna("?")
    return adjusted_rand_index(truth_jobs["job_id"], pred.to_numpy())


def _score_found(jobs: pd.DataFrame, steps: pd.DataFrame | None, anomalies: pd.DataFrame | None, cluster: GroundTruth) -> dict:
    """The steps and anomalies of one run against the truth (the keys :func:`score_cluster` documents)."""
    row: dict[str, Any] = {}
    names = job_name_map(jobs, cluster.jobs)
    if steps is not None:
        sc = score_steps(steps, cluster.steps, names, capture_end=cluster.meta.get("window_end_ns"))
        found = int(sc["found"].sum())
        row.update(true_steps=int(sc["true_steps"].sum()), steps_found=found, steps_spurious=int(sc["spurious"].sum()),
                   step_err_mean=float((sc["mean_err"].fillna(0) * sc["found"]).sum() / max(found, 1)))
    if anomalies is not None:
        faults, scored = score_anomalies(anomalies, cluster.faults, names, steps)
        row.update(faults=len(faults), faults_found=int(faults["matched"].sum()), anomalies=len(scored),
                   anomalies_unexplained=int((~scored["matched"]).sum()))
        for kind, n in scored.loc[~scored["matched"], "kind"].value_counts().items():
            row[f"false_{kind}"] = int(n)
    return row


@dataclass
class TruthReport:
    """What :func:`compare_with_truth` found: the lines a demo prints, and whether everything matched (its exit status)."""

    lines: list[str]
    ok: bool


def compare_with_truth(cluster: GroundTruth, jobs: pd.DataFrame | None, steps: pd.DataFrame, anomalies: pd.DataFrame, *,
                       pairs: pd.DataFrame | None = None, live: bool = False, delays: bool = False) -> TruthReport:
    """The demos' comparison of what was found with a generated cluster's ground truth.

    ``prism demo --offline`` (a replay: ``pairs`` given, ``live`` False) and
    ``prism demo`` (the daemon: ``live`` True) both report jobs (adjusted
    Rand index), steps, and each injected fault found or missed with the
    anomalies it does not explain; what differs is what each can know:

    - the replay names the truth job of each job found and counts GPUs
      assigned to no true job; it has pair types (``pairs``, checked
      against ``cluster.pairs``) and a step duration error. Its verdict:
      jobs, pairs and faults; steps are reported, not judged.
    - the daemon counts the steps it reported; with ``delays`` (a paced
      stream, whose anomalies carry ``detected_ns``) the time to detect
      each fault. Its verdict: jobs, faults, and at least 95 % of the true
      steps with none spurious.

    Either way every fault must be found and every anomaly explained.
    """
    truth = cluster.jobs
    lines: list[str] = []
    found = jobs.set_index("ip")["job_id"] if jobs is not None and len(jobs) else pd.Series(dtype=object)
    merged = truth.assign(found=found.reindex(truth["ip"]).to_numpy())
    missing = int(merged["found"].isna().sum())
    ari = adjusted_rand_index(merged["job_id"], merged["found"].fillna("<none>"))
    if live:
        jobs_ok = ari == 1.0 and missing == 0
        lines.append(f"jobs {'MATCH' if jobs_ok else 'DIFFER FROM'} the ground truth (adjusted Rand index {ari:.4f})")
    else:
        assert jobs is not None  # a replay always has its job table
        extra = len(set(jobs["ip"]) - set(truth["ip"]))
        truth_names = merged.dropna().groupby("found")["job_id"].agg(lambda s: ",".join(sorted(set(s))))
        for job_id, g in jobs.groupby("job_id"):
            lines.append(f"{job_id} = truth job {truth_names.get(job_id, '?')} ({len(g)} GPUs)")
        jobs_ok = ari == 1.0 and missing == 0 and extra == 0
        lines.append(f"jobs {'MATCH' if jobs_ok else 'DIFFER FROM'} the ground truth: adjusted Rand index {ari:.4f}, {missing} GPUs missed, {extra} extra")
    pairs_ok = True
    if pairs is not None:
        both_sides = pairs.merge(cluster.pairs, on=["src", "dst"], how="outer", suffixes=("", "_truth"), indicator=True)
        both = both_sides[both_sides["_merge"] == "both"]
        correct = int((both["type"] == both["type_truth"]).sum())
        pairs_ok = correct == len(both_sides)
        lines.append(f"DP/PP pair types {'MATCH' if pairs_ok else 'DIFFER FROM'} the ground truth: {correct:,} of {len(both_sides):,} pairs correct")
    names = job_name_map(jobs, truth) if jobs is not None else {}
    sc = score_steps(steps, cluster.steps, names)
    n_found, true_n, spurious = int(sc["found"].sum()), int(sc["true_steps"].sum()), int(sc["spurious"].sum())
    if live:
        lines.append(f"steps: {n_found:,} of {true_n:,} true steps reported ({n_found / max(true_n, 1):.1%}), {spurious} spurious")
    else:
        err = (sc["mean_err"] * sc["found"]).sum() / max(n_found, 1)
        lines.append(f"steps: {n_found:,} of {true_n:,} true steps found ({n_found / max(true_n, 1):.1%}), {spurious} spurious, "
                     f"mean duration error {err:.1e} ({err * 100:.1e} %)")
    faults, scored = score_anomalies(anomalies, cluster.faults, names, steps)
    unexplained = scored[~scored["matched"]]
    r: Any  # a row: the stubs type its fields as any scalar
    for r in faults.itertuples(index=False):
        lines.append(f"injected {r.kind:<11} {r.job_id or r.subject:<12} {'FOUND' if r.matched else 'MISSED'}")
    lines.append(f"anomalies: {len(scored)} reported, {len(scored) - len(unexplained)} explained by injected faults, {len(unexplained)} unexplained")
    if delays:
        d = detection_delays(anomalies, cluster.faults, names)
        found_d = d["delay_s"].dropna()
        if len(found_d):
            each = ", ".join(f"{r.kind} {r.delay_s:.1f} s" for r in d.dropna().itertuples(index=False))
            lines.append(f"time to detect (stream time from a fault's start to its anomaly): {each}; "
                         f"max {found_d.max():.1f} s{'' if found_d.max() <= 15 else ' (over 15 s)'}")
    diag_ok = bool(faults["matched"].all()) and unexplained.empty
    if live:
        steps_ok = n_found >= 0.95 * true_n and spurious == 0
        return TruthReport(lines, jobs_ok and steps_ok and diag_ok)
    return TruthReport(lines, jobs_ok and pairs_ok and diag_ok)
