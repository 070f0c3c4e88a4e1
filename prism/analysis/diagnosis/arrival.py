"""Arrival order: the server that sends last at a job's collectives (a straggler in a data-parallel job).

In a pure data-parallel job (DDP, ZeRO, FSDP, HSDP) every rank waits for a
slow one inside each collective, so the job's steps slow down as a whole
and no stage is slower than its peers (:mod:`.cross_group` needs
pipelines). What the network still shows is who arrives last: a rank's
ring sends of a collective start once it has issued the collective, so the
slow server's first flow of every collective starts last, while the
others' start earlier and wait.

Per job, the DP flows of each group of servers (the DP rings over the same
servers: a rail-optimised fabric runs one ring per rail, one collective)
are cut into collective bursts, with no step needed (FSDP jobs get none): a
burst closes at the first pause of more than ``min_pause_ns`` after every
server of the group has sent in it (so the wait for a late server does not
cut it). In each complete burst the server whose first send starts last
"arrives last", by its lead over the runner-up (an exact tie: nobody). A
server is named when, from some burst on, it is last far more often than
chance (``1 / servers`` of the group; "from" where the binomial z of the
bursts from there on peaks): a binomial test at ``alpha``,
Bonferroni-corrected over the job's servers and the bursts it could have
started at; an effect size (last in ``min_share`` of those bursts, at least
``clear_factor`` times as often as the runner-up); and a median lead of at
least ``min_lead_ns`` (far above collector clock offsets of microseconds).

Where the job has steps (any), the test counts steps rather than collectives:
each step's last arrival is the server last in most of its collectives
(:func:`per_step`), since a rank that falls behind stays behind until the
ranks next wait for one another, and a step's collectives are one draw.

Raised as ``slow_group`` naming the server, so scoring and alerts treat it
as the pipeline diagnosis's stragglers. The burst table (``arrivals_``) is
per burst, so the tables of consecutive time slices of a job, concatenated,
diagnose as one (:func:`prism.analysis.slices.analyse_sliced`).
"""
from __future__ import annotations

import numba
import numpy as np
import pandas as pd
from scipy.stats import binom

from prism.analysis.diagnosis.anomalies import ANOMALY_COLUMNS, empty_anomalies

__all__ = ["ARRIVAL_COLUMNS", "ArrivalDiagnoser", "per_step"]

#: one row per complete collective burst: its job, group of servers, start, size (servers), the server whose first
#: send started last ("" on an exact tie) and by how much it trailed the runner-up
ARRIVAL_COLUMNS = ["job_id", "group", "start_ns", "servers", "last", "lead_ns"]


def empty_arrivals() -> pd.DataFrame:
    return pd.DataFrame({"job_id": pd.Series(dtype="object"), "group": pd.Series(dtype="object"), "start_ns": pd.Series(dtype="int64"),
                         "servers": pd.Series(dtype="int64"), "last": pd.Series(dtype="object"), "lead_ns": pd.Series(dtype="int64")})


class ArrivalDiagnoser:
    """Find servers that send last at their job's collectives far more often than chance.

    Parameters
    ----------
    min_pause_ns : int, default 20_000
        A burst closes at a pause longer than this (start minus the end of
        every earlier flow of the group), once all its servers have sent.
    alpha : float, default 1e-4
        Binomial test's level, before the Bonferroni correction over the
        job's servers and candidate start bursts.
    min_share : float, default 0.5
        Effect size: last in at least this share of the bursts.
    clear_factor : float, default 2.0
        ... and at least this many times as often as the runner-up.
    min_lead_ns : int, default 1_000_000
        Median lead over the runner-up, where it was last.
    min_bursts : int, default 8
        Bursts a server needs to be judged.
    """

    def __init__(self, min_pause_ns: int = 20_000, alpha: float = 1e-4, min_share: float = 0.5, clear_factor: float = 2.0,
                 min_lead_ns: int = 1_000_000, min_bursts: int = 8):
        self.min_pause_ns = int(min_pause_ns)
        self.alpha = float(alpha)
        self.min_share = float(min_share)
        self.clear_factor = float(clear_factor)
        self.min_lead_ns = int(min_lead_ns)
        self.min_bursts = int(min_bursts)

    def fit(self, job: np.ndarray, a: np.ndarray, start: np.ndarray, end: np.ndarray, is_dp: np.ndarray, dp_comp: np.ndarray,
            server_of: np.ndarray, job_names: dict, steps: pd.DataFrame | None = None) -> "ArrivalDiagnoser":
        """Cut the DP flows into collective bursts and diagnose them.

        Parameters
        ----------
        job : int array
            Job label per flow (names through ``job_names``).
        a : int array
            Source NIC per flow.
        start, end : int arrays
        is_dp : bool array
            The flow's pair is a DP pair.
        dp_comp : int array
            DP group (component of the DP pairs) per NIC.
        server_of : array
            Server name per NIC.
        steps : DataFrame, optional
            ``job_id, step, start_ns``: to tie an anomaly to the step it began in.
        """
        self.arrivals_ = self.bursts(job, a, start, end, is_dp, dp_comp, server_of, job_names)
        return self.diagnose(self.arrivals_, steps)

    def bursts(self, job, a, start, end, is_dp, dp_comp, server_of, job_names) -> pd.DataFrame:
        """The burst table (:data:`ARRIVAL_COLUMNS`) of the DP flows."""
        dp = np.flatnonzero(is_dp)
        if len(dp) == 0:
            return empty_arrivals()
        srv_code, srv_names = pd.factorize(pd.Series(np.asarray(server_of)))
        srv_code = np.asarray(srv_code, dtype=np.int64)
        comp = np.asarray(dp_comp, dtype=np.int64)
        src = np.asarray(a)[dp]
        fjob, fsrv, fcomp = np.asarray(job)[dp], srv_code[src], comp[src]
        # one group per job and set of servers: the rails' rings of one collective together
        members = pd.DataFrame({"job": fjob, "comp": fcomp, "srv": fsrv}).drop_duplicates()
        sets = members.sort_values("srv").groupby(["job", "comp"])["srv"].agg(lambda s: ",".join(map(str, s)))
        keys = pd.Series(list(zip(sets.index.get_level_values(0), sets.to_numpy())))
        gid_of, groups = pd.factorize(keys)
        comp_gid = pd.Series(gid_of, index=sets.index)
        gid = comp_gid.reindex(pd.MultiIndex.from_arrays([fjob, fcomp])).to_numpy(np.int64)
        size = np.array([s.count(",") + 1 for _, s in groups], dtype=np.int64)  # one per group, not per flow
        fstart, fend = np.asarray(start, np.int64)[dp], np.asarray(end, np.int64)[dp]
        o = np.lexsort((fstart, gid))
        burst, first = _cut(gid[o], fsrv[o], fstart[o], fend[o], size, len(srv_names), self.min_pause_ns)
        # every server's first send of every burst
        b, s, t, g = burst[first], fsrv[o][first], fstart[o][first], gid[o][first]
        per = pd.DataFrame({"b": b, "s": s, "t": t, "g": g})
        counts = np.bincount(b, minlength=int(burst.max()) + 1)
        n_srv = counts[b]
        # complete bursts only; a group's first and last bursts may be cut by the window's edges
        edge_b = np.zeros(len(counts), dtype=bool)
        gb = pd.DataFrame({"g": g, "b": b}).drop_duplicates()
        edge_b[gb.groupby("g")["b"].min().to_numpy()] = True
        edge_b[gb.groupby("g")["b"].max().to_numpy()] = True
        per = per[(n_srv == size[g]) & ~edge_b[b] & (size[g] >= 2)]  # one server alone is last by nothing
        if per.empty:
            return empty_arrivals()
        per = per.sort_values(["b", "t"], kind="stable")
        bb, tt = per["b"].to_numpy(), per["t"].to_numpy()
        last = np.flatnonzero(np.r_[bb[1:] != bb[:-1], True])
        lead = tt[last] - tt[last - 1]  # complete bursts have two or more servers
        gl = per["g"].to_numpy()[last]
        opened = per.groupby("b")["t"].min().to_numpy()
        job_ids = np.array([job_names.get(j, str(j)) for j, _ in groups], dtype=object)
        names = np.asarray(srv_names, dtype=object)
        group_names = np.array(["|".join(names[int(c)] for c in s.split(",")) for _, s in groups], dtype=object)
        return pd.DataFrame({
            "job_id": job_ids[gl], "group": group_names[gl], "start_ns": opened,
            "servers": size[gl], "last": np.where(lead > 0, names[per["s"].to_numpy()[last]], ""), "lead_ns": lead,
        })[ARRIVAL_COLUMNS]

    def diagnose(self, arrivals: pd.DataFrame | None, steps: pd.DataFrame | None = None) -> "ArrivalDiagnoser":
        """The anomalies of a burst table (``arrivals_``), without the flows: :meth:`fit` ends here."""
        self.arrivals_ = arrivals if arrivals is not None else empty_arrivals()
        rows = []
        for job_id, jb in (self.arrivals_.groupby("job_id", sort=True) if len(self.arrivals_) else ()):
            jb = jb.sort_values("start_ns", kind="stable")
            st = None if steps is None or not len(steps) else steps[steps["job_id"] == job_id]
            if st is not None and len(st):  # a job with too few steps to judge is not judged by its collectives either
                jb, unit = per_step(jb, st["start_ns"].to_numpy(np.int64), st["end_ns"].to_numpy(np.int64)), "steps"
            else:
                unit = "collectives"
            rows += self._job(job_id, jb, steps, unit)
        self.anomalies_ = pd.DataFrame(rows, columns=ANOMALY_COLUMNS) if rows else empty_anomalies()
        return self

    def _job(self, job_id, jb: pd.DataFrame, steps: pd.DataFrame | None, unit: str = "collectives") -> list:
        last = jb["last"].to_numpy()
        groups = jb["group"].to_numpy()
        chance = 1.0 / jb["servers"].to_numpy()
        servers = sorted({s for s in last if s})
        n_servers = len({x for g in set(groups) for x in str(g).split("|")})
        out = []
        for srv in servers:
            # the bursts of the groups that hold this server
            mine = last == srv
            held = np.isin(groups, list({g for g in groups[mine]}))
            idx = np.flatnonzero(held)
            if len(idx) < self.min_bursts:
                continue
            # where it began: the burst from which on its wins stand out most (binomial z of the suffix)
            k_suf = np.cumsum(mine[idx][::-1])[::-1]
            p_suf = np.cumsum(chance[idx][::-1])[::-1]  # expected wins
            n_suf = np.arange(len(idx), 0, -1)
            z = (k_suf - p_suf) / np.sqrt(np.maximum(p_suf * (1 - p_suf / n_suf), 1e-9))
            z[n_suf < self.min_bursts] = -np.inf
            i0 = int(np.argmax(z))
            sub = idx[i0:]
            n, k = len(sub), int(mine[sub].sum())
            if n < self.min_bursts or k / n < self.min_share:
                continue
            p = float(chance[sub].mean())
            pval = float(binom.sf(k - 1, n, p))
            if pval > self.alpha / (max(n_servers, 1) * len(idx)):
                continue
            others = pd.Series(last[sub][(last[sub] != srv) & (last[sub] != "")]).value_counts()
            runner = int(others.iloc[0]) if len(others) else 0
            if k < self.clear_factor * runner:
                continue
            lead = float(np.median(jb["lead_ns"].to_numpy()[sub][mine[sub]]))
            if lead < self.min_lead_ns:
                continue
            at = int(jb["start_ns"].to_numpy()[sub[0]])
            step = -1
            if steps is not None and len(steps):
                st = steps[steps["job_id"] == job_id].sort_values("start_ns")
                j = int(np.searchsorted(st["start_ns"].to_numpy(), at, side="right")) - 1
                if j >= 0:
                    step, at = int(st["step"].to_numpy()[j]), int(st["start_ns"].to_numpy()[j])
            out.append(("slow_group", job_id, step, at, srv, round(k / n, 4),
                        f"{srv} sent last at {k} of {n} {unit} (chance {p:.0%}, p={max(pval, 1e-300):.1e}; runner-up {runner}), "
                        f"by a median {lead / 1e6:.3g} ms: every rank waits for it (data-parallel straggler)"))
        return out

    def predict(self) -> pd.DataFrame:
        """Anomaly rows (:data:`prism.analysis.diagnosis.ANOMALY_COLUMNS`)."""
        return self.anomalies_


def per_step(bursts: pd.DataFrame, step_start: np.ndarray, step_end: np.ndarray) -> pd.DataFrame:
    """The burst table of one job, one row per group and step: each step's last arrival.

    The collectives of one step are not independent draws: a rank that
    falls behind in a backward (its gradient buckets, each a collective)
    stays behind until the ranks next wait for one another, so a step's
    dozens of collectives share their last server, and counted one by one
    they make a fault-free job's chance laggard look significant. Per
    group and step (bursts starting in ``[step_start, step_end)``), the
    server last in most of its bursts (none on a tie), by the median lead
    of those bursts; bursts outside every step are left out.
    """
    s = np.argsort(step_start, kind="stable")
    s0, s1 = np.asarray(step_start)[s], np.asarray(step_end)[s]
    t = bursts["start_ns"].to_numpy(np.int64)
    k = np.searchsorted(s0, t, side="right") - 1
    inside = (k >= 0) & (t < s1[np.maximum(k, 0)]) & (bursts["last"].to_numpy() != "")
    b = bursts[inside].assign(step=k[inside])
    if b.empty:
        return empty_arrivals()
    wins = b.groupby(["group", "step", "last"], sort=True).agg(n=("lead_ns", "size"), lead_ns=("lead_ns", "median"),
                                                               start_ns=("start_ns", "min"), servers=("servers", "first")).reset_index()
    top = wins.groupby(["group", "step"])["n"].transform("max")
    best = wins[wins["n"] == top]
    tied = best.groupby(["group", "step"])["last"].transform("size") > 1
    best = best.assign(last=np.where(tied, "", best["last"]))
    out = best.groupby(["group", "step"], sort=True).agg(start_ns=("start_ns", "min"), servers=("servers", "first"), last=("last", "first"),
                                                         lead_ns=("lead_ns", "max")).reset_index()
    out["job_id"] = bursts["job_id"].iloc[0]
    out["lead_ns"] = out["lead_ns"].astype(np.int64)
    return out.sort_values("start_ns", kind="stable")[ARRIVAL_COLUMNS].reset_index(drop=True)


@numba.njit(cache=True)
def _cut(gid, srv, start, end, size, n_srv, min_pause):  # pragma: no cover - compiled
    """Per flow (by group, then start): its burst number, and whether it is its server's first send of the burst.

    A burst closes at the first pause of more than ``min_pause`` once every
    one of the group's ``size`` servers has sent in it.
    """
    n = len(gid)
    burst = np.empty(n, np.int64)
    first = np.zeros(n, np.bool_)
    seen = np.full(n_srv, -1, np.int64)
    b = -1
    count = 0
    busy = 0
    for i in range(n):
        g = gid[i]
        if i == 0 or g != gid[i - 1]:
            b += 1
            count = 0
            busy = end[i]
        elif start[i] - busy > min_pause and count >= size[g]:
            b += 1
            count = 0
        if end[i] > busy:
            busy = end[i]
        if seen[srv[i]] != b:
            seen[srv[i]] = b
            count += 1
            first[i] = True
        burst[i] = b
    return burst, first
