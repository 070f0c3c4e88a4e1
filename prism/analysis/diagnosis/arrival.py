"""Arrival order: the server that sends last at a job's collectives (a straggler in a data-parallel job).

In a pure data-parallel job (DDP, ZeRO, FSDP, HSDP) every rank waits for a
slow one inside each collective, so the job's steps slow down as a whole
and no stage is slower than its peers (:mod:`.cross_group` needs
pipelines). What the network still shows is who arrives last. Where a
rank sends as soon as it has issued the collective (eager), the slow
server's first send of every collective starts last. Over a rendezvous
(NCCL's network transport: a ring edge moves data once its receiver is in
too) the slow server and its ring predecessor both first send when it
enters, and it and its successor both first receive then: the slow server
is the one late in both.

Per job, the DP flows of each group of servers (the DP rings over the same
servers: a rail-optimised fabric runs one ring per rail, one collective)
are cut into collective bursts, with no step needed (FSDP jobs get none): a
burst closes at the first pause of more than ``min_pause_ns`` after every
server of the group has sent in it (so the wait for a late server does not
cut it). Back-to-back collectives run on without a pause (an early rank
enters the next one as it leaves this one, and its edges to other early
ranks move at once): the flows that start once the first server's last
send of a burst has ended go to the next burst (:func:`_hand_on_at`). In
each complete burst the last arrival (:func:`last_arrival`) is the server
whose first send starts last; where senders tie (within ``tie_ns``), the
one of them whose first receive is also last; by its lead over the
others (a tie in both, as in a 2-server ring: nobody). Where the
receivers' clear-to-sends are on the wire (NCCL's network transport: a
message of tens to a few hundred bytes from each ring edge's receiver to
its sender, as the receiver enters the collective; a DP control message,
:mod:`prism.analysis.control`), a server's first clear-to-send is its
entry and counts as its first send: its data may wait for a ring
neighbour, its clear-to-send waits for no one, so the late member of a
2-server ring is the last sender. The clear-to-sends take no part in
cutting or handing on the bursts (they carry no data): each goes with the
burst of the data it clears, the next on its edge (:func:`_entries`; not
where another clear-to-send comes first, its data unrecorded). A
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
A step whose collectives come in alike rounds between long pauses (a job
that reduces every micro-batch: each backward's end waits for its
reductions) counts each round (:func:`draws`): the ranks leave a round
together, so the next one's laggard is fresh, and a job of few long steps
(5 in view, 8 micro-batches each) can be judged where 5 steps alone
cannot (4^-5 = 1e-3 at best). A job without steps (too few in view, or
none found) whose bursts come in rounds between long pauses (a DDP job's buckets in each backward) counts
rounds the same way (:func:`rounds`); one whose bursts come evenly, each.

Where those draws are too few for who is last (a step one draw, 3 to 5
slowed steps in view), how late is what tells (:func:`lateness_test`,
draws only, never collectives counted one by one): a server 1.4x slower
trails by a share of the compute (seconds at a DDP step's first bucket,
tens of milliseconds in each of FSDP's per-layer collectives), the
jitter's laggard by a fraction of a percent. From some draw on it is
last in 3 or more (half of them, twice the runner-up), each at least 4
times as late as the latest last server of every other draw of the job,
with its mean log lateness significantly above theirs (a z whose spread
is at least a factor 2, at ``alpha`` with Bonferroni over the two
measures, the job's servers and the draws it could start at). Two
measures of a draw's lateness: its largest lead (``peak_ns``: a DDP
step's first bucket carries its whole backward's lateness, its other
buckets only their share) and its median one (FSDP's, each collective
late anew).

Raised as ``slow_group`` naming the server, so scoring and alerts treat it
as the pipeline diagnosis's stragglers. The burst table (``arrivals_``) is
per burst, so the tables of consecutive time slices of a job, concatenated,
diagnose as one (:func:`prism.analysis.slices.analyse_sliced`).

Cost: the bursts are cut in compiled passes over the DP flows, read
through their indices in group-then-start order (a counting sort by
group, since a replay's batches give each job's flows in start order),
with per-server marks for each burst's first send and first receive. The
first version sorted the flows three more times (``np.unique`` on
(burst, server) keys, twice, and an argsort in the hand-on), copied every
flow column into that order and found the groups with a pandas
``drop_duplicates`` and a MultiIndex lookup per flow. On the 13.6M-flow
``large`` replay's batches that took 5 to 6 times as long (9.5-14 s
against 1.7-2.3 s, interleaved on a heavily loaded 2-core machine) and
760 MiB at its peak beyond what the replay held (traced allocations),
against 150 MiB now, for the same table (tests/reference_arrival.py is
that version, property-tested against).
"""
from __future__ import annotations

import numba
import numpy as np
import pandas as pd

from prism.analysis.control import control_messages
from prism.analysis.diagnosis.anomalies import ANOMALY_COLUMNS, empty_anomalies
from prism.common.tails import binomial_at_least, normal_above

__all__ = ["ARRIVAL_COLUMNS", "ArrivalDiagnoser", "draws", "last_arrival", "lateness_test", "per_step", "rounds"]

#: one row per complete collective burst: its job, group of servers, start, size (servers), the server that arrived
#: last (:func:`last_arrival`: its first send started last, or, senders tied, its first receive too; "" on a tie)
#: and by how much it trailed the others
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
    tie_ns : int, default 20_000
        First sends (receives) this close to a burst's last one tie with it.
    round_gap : float, default 8.0
        A job without steps: a pause between bursts this many times their
        median spacing closes a round of collectives (:func:`rounds`).
    late_draws, late_refs : int, default 3, 2
        The lateness test (:func:`lateness_test`): draws a server needs to
        be late in, and other draws to compare them with.
    late_factor : float, default 4.0
        ... each of its late draws at least this many times the latest of the others.
    late_spread : float, default 2.0
        ... the others' lateness taken to vary by at least this factor (one
        standard deviation of its logarithm), however alike they are.
    """

    def __init__(self, min_pause_ns: int = 20_000, alpha: float = 1e-4, min_share: float = 0.5, clear_factor: float = 2.0,
                 min_lead_ns: int = 1_000_000, min_bursts: int = 8, tie_ns: int = 20_000, round_gap: float = 8.0, late_draws: int = 3,
                 late_refs: int = 2, late_factor: float = 4.0, late_spread: float = 2.0):
        self.min_pause_ns = int(min_pause_ns)
        self.alpha = float(alpha)
        self.min_share = float(min_share)
        self.clear_factor = float(clear_factor)
        self.min_lead_ns = int(min_lead_ns)
        self.min_bursts = int(min_bursts)
        self.tie_ns = int(tie_ns)
        self.round_gap = float(round_gap)
        self.late_draws = int(late_draws)
        self.late_refs = int(late_refs)
        self.late_factor = float(late_factor)
        self.late_spread = float(late_spread)

    def fit(self, job: np.ndarray, a: np.ndarray, start: np.ndarray, end: np.ndarray, is_dp: np.ndarray, dp_comp: np.ndarray,
            server_of: np.ndarray, job_names: dict, steps: pd.DataFrame | None = None, b: np.ndarray | None = None,
            size: np.ndarray | None = None) -> "ArrivalDiagnoser":
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
        b : int array, optional
            Destination NIC per flow: with it, a tie for the last send is
            broken by the last receive (:func:`last_arrival`).
        size : int array, optional
            Bytes per flow: with ``b``, a receiver's clear-to-send (a DP
            control message, :func:`prism.analysis.control.control_messages`)
            is its entry into the collective (:func:`_entries`).
        """
        self.arrivals_ = self.bursts(job, a, start, end, is_dp, dp_comp, server_of, job_names, b, size)
        return self.diagnose(self.arrivals_, steps)

    def bursts(self, job, a, start, end, is_dp, dp_comp, server_of, job_names, dst=None, size=None) -> pd.DataFrame:
        """The burst table (:data:`ARRIVAL_COLUMNS`) of the DP flows.

        Compiled passes over the DP flows through their indices (:func:`_groups_in_order`,
        :func:`_cut`, :func:`_hand_on_at`, :func:`_firsts`): no copy of a flow column in
        burst order and no sort where each group's flows come in start order (a
        replay's batches); the tables built per (burst, server), per NIC and per
        group are small. The clear-to-sends (with ``dst`` and ``size``) are
        left out of those passes, and each is then placed with the data it
        cleared (:func:`_entries`: one sort of the DP flows, only where a job
        has them).
        """
        dp = np.flatnonzero(is_dp)
        if len(dp) == 0:
            return empty_arrivals()
        srv_code, srv_names = pd.factorize(pd.Series(np.asarray(server_of)))
        srv_code = np.asarray(srv_code, dtype=np.int64)
        n_srv = len(srv_names)
        comp = np.asarray(dp_comp, dtype=np.int64)
        job, a, start, end = np.asarray(job), np.asarray(a), np.asarray(start, np.int64), np.asarray(end, np.int64)
        ctl = np.zeros(0, np.int64)
        if dst is not None and size is not None:
            # clear-to-sends: no data, so they neither open, close nor hand on a burst; each is its sender's entry
            c = control_messages(np.asarray(size)[dp], pd.factorize(job[dp])[0])
            if c.any() and not c.all():
                ctl, dp = dp[c], dp[~c]
        # one group per job and set of servers: the rails' rings of one collective together
        gid_nic, gid_flow, groups = _server_set_groups(dp, job, a, comp, srv_code)
        size = np.array([s.count(",") + 1 for _, s in groups], dtype=np.int64)  # one per group, not per flow
        idx, gid = _groups_in_order(dp, a, start, gid_nic, gid_flow, len(groups))  # the DP flows by group, then start
        burst, first = _cut(idx, gid, a, srv_code, start, end, size, n_srv, self.min_pause_ns)
        recv = None
        if dst is not None:
            b_nic = np.asarray(dst)
            move = _hand_on_at(burst, idx, gid, a, b_nic, srv_code, start, end, size, n_srv)
            first, recv = _firsts(burst, move, idx, a, b_nic, srv_code, n_srv)
            burst += move
            del move
        # every server's first send of every burst
        at = np.flatnonzero(first)
        f = idx[at]
        b, s, t, g = burst[at], srv_code[a[f]], start[f], gid[at].astype(np.int64)
        if len(ctl) and dst is not None:
            # a server's entry is its first clear-to-send where it sent one (its first data send waits for its ring
            # neighbour; in a 2-server ring both edges move as the later server enters, a tie)
            ekey, et = _entries(ctl, idx, burst, a, np.asarray(dst), start, srv_code, n_srv)
            if len(ekey):
                want = b * n_srv + s
                j = np.minimum(np.searchsorted(ekey, want), len(ekey) - 1)
                t = np.where(ekey[j] == want, np.minimum(t, et[j]), t)
        per = pd.DataFrame({"b": b, "s": s, "t": t, "g": g})
        counts = np.bincount(b, minlength=int(burst.max()) + 1)
        n_in = counts[b]
        # complete bursts only; a group's first and last bursts may be cut by the window's edges
        edge_b = np.zeros(len(counts), dtype=bool)
        gb = pd.DataFrame({"g": g, "b": b}).drop_duplicates()
        edge_b[gb.groupby("g")["b"].min().to_numpy()] = True
        edge_b[gb.groupby("g")["b"].max().to_numpy()] = True
        per = per[(n_in == size[g]) & ~edge_b[b] & (size[g] >= 2)]  # one server alone is last by nothing
        if per.empty:
            return empty_arrivals()
        if recv is not None:  # every server's first receive of every burst, looked up by (burst, server)
            at = np.flatnonzero(recv)
            f = idx[at]
            rkey = burst[at] * n_srv + srv_code[b_nic[f]]
            o = np.argsort(rkey, kind="stable")
            rkey, rt = rkey[o], start[f][o].astype(np.float64)
            want = per["b"].to_numpy() * n_srv + per["s"].to_numpy()
            j = np.minimum(np.searchsorted(rkey, want), max(len(rkey) - 1, 0))
            hit = rkey[j] == want if len(rkey) else np.zeros(len(want), dtype=bool)
            per["r"] = np.where(hit, rt[j] if len(rt) else np.nan, np.nan)
        else:
            per["r"] = np.nan
        last_s, lead = _last(per, self.tie_ns)
        per = per.sort_values(["b", "t"], kind="stable")
        bb = per["b"].to_numpy()
        last = np.flatnonzero(np.r_[bb[1:] != bb[:-1], True])
        ub = bb[last]
        gl = per["g"].to_numpy()[last]
        opened = per.groupby("b")["t"].min().to_numpy()
        job_ids = np.array([job_names.get(j, str(j)) for j, _ in groups], dtype=object)
        names = np.asarray(srv_names, dtype=object)
        group_names = np.array(["|".join(names[int(c)] for c in s.split(",")) for _, s in groups], dtype=object)
        return pd.DataFrame({
            "job_id": job_ids[gl], "group": group_names[gl], "start_ns": opened,
            "servers": size[gl], "last": np.where(last_s[ub] >= 0, names[np.maximum(last_s[ub], 0)], ""), "lead_ns": lead[ub],
        })[ARRIVAL_COLUMNS]

    def diagnose(self, arrivals: pd.DataFrame | None, steps: pd.DataFrame | None = None) -> "ArrivalDiagnoser":
        """The anomalies of a burst table (``arrivals_``), without the flows: :meth:`fit` ends here."""
        self.arrivals_ = arrivals if arrivals is not None else empty_arrivals()
        rows = []
        for job_id, jb in (self.arrivals_.groupby("job_id", sort=True) if len(self.arrivals_) else ()):
            jb = jb.sort_values("start_ns", kind="stable")
            st = None if steps is None or not len(steps) else steps[steps["job_id"] == job_id]
            if st is not None and len(st):  # a job with too few steps to judge is not judged by its collectives either
                d0, d1, split = draws(jb["start_ns"].to_numpy(np.int64), st["start_ns"].to_numpy(np.int64),
                                      st["end_ns"].to_numpy(np.int64), self.round_gap)
                jb, unit = per_step(jb, d0, d1), ("steps and micro-batches" if split else "steps")
            else:
                unit = "collectives"
                r0 = rounds(jb["start_ns"].to_numpy(np.int64), self.round_gap)
                if r0 is not None:  # no steps, but rounds of collectives between long pauses: one draw each
                    jb, unit = per_step(jb, r0[:-1], r0[1:]), "rounds of collectives"
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
            found = self._by_count(jb, idx, mine, chance, n_servers, srv, unit)
            if found is None and unit != "collectives" and "peak_ns" in jb:  # draws that are steps, micro-batches or rounds
                found = self._by_lateness(jb, idx, mine, n_servers, srv, unit)
            if found is None:
                continue
            i0, share, text = found
            at = int(jb["start_ns"].to_numpy()[i0])
            step = -1
            if steps is not None and len(steps):
                st = steps[steps["job_id"] == job_id].sort_values("start_ns")
                j = int(np.searchsorted(st["start_ns"].to_numpy(), at, side="right")) - 1
                if j >= 0:
                    step, at = int(st["step"].to_numpy()[j]), int(st["start_ns"].to_numpy()[j])
            out.append(("slow_group", job_id, step, at, srv, round(share, 4), text))
        return out

    def _by_count(self, jb, idx, mine, chance, n_servers, srv, unit):
        """The rank test: last far more often than chance from some draw on; (first draw's row, share, explanation) or None."""
        last = jb["last"].to_numpy()
        if len(idx) < self.min_bursts:
            return None
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
            return None
        p = float(chance[sub].mean())
        pval = binomial_at_least(k, n, p)
        if pval > self.alpha / (max(n_servers, 1) * len(idx)):
            return None
        others = pd.Series(last[sub][(last[sub] != srv) & (last[sub] != "")]).value_counts()
        runner = int(others.iloc[0]) if len(others) else 0
        if k < self.clear_factor * runner:
            return None
        lead = float(np.median(jb["lead_ns"].to_numpy()[sub][mine[sub]]))
        if lead < self.min_lead_ns:
            return None
        return int(sub[0]), k / n, (f"{srv} sent last at {k} of {n} {unit} (chance {p:.0%}, p={max(pval, 1e-300):.1e}; runner-up {runner}), "
                                    f"by a median {lead / 1e6:.3g} ms: every rank waits for it (data-parallel straggler)")

    def _by_lateness(self, jb, idx, mine, n_servers, srv, unit):
        """The lateness test (:func:`lateness_test`) of the draws of the groups that hold ``srv``: (first draw's row, share, explanation) or None."""
        last = jb["last"].to_numpy()[idx]
        best = None
        for col, what in (("peak_ns", "at its latest"), ("lead_ns", "in its median collective")):
            r = lateness_test(last, jb[col].to_numpy(np.float64)[idx], srv, min_draws=self.late_draws, min_refs=self.late_refs,
                              factor=self.late_factor, floor_ns=self.min_lead_ns, min_share=self.min_share, clear_factor=self.clear_factor,
                              spread=self.late_spread)
            if r is not None and (best is None or r[1] > best[1][1]):
                best = (what, r)
        if best is None:
            return None
        what, (i0, z, k, n, post, ref, n_ref) = best
        pval = normal_above(z)
        if pval > self.alpha / (2 * max(n_servers, 1) * len(idx)):  # two measures, the servers, the draws it could start at
            return None
        return int(idx[i0]), k / n, (f"{srv} sent last at {k} of {n} {unit}, each time {_span(post)} or more behind {what} (the last server of the "
                                     f"{n_ref} others: {_span(ref)} at most; z={z:.1f}, p={max(pval, 1e-300):.1e}): every rank waits for it "
                                     f"(data-parallel straggler)")

    def predict(self) -> pd.DataFrame:
        """Anomaly rows (:data:`prism.analysis.diagnosis.ANOMALY_COLUMNS`)."""
        return self.anomalies_


def _span(ns: float) -> str:
    return f"{ns / 1e9:.3g} s" if ns >= 1e9 else f"{ns / 1e6:.3g} ms"


def lateness_test(last: np.ndarray, late_ns: np.ndarray, srv: str, min_draws: int = 3, min_refs: int = 2, factor: float = 4.0,
                  floor_ns: float = 1e6, min_share: float = 0.5, clear_factor: float = 2.0, spread: float = 2.0):
    """Is ``srv`` last, from some draw on, by far more than any draw's last server is late otherwise? The best such start, or None.

    ``last`` and ``late_ns``: per draw (a step, micro-batch or round, in
    time order), the server last in it ("" on a tie) and by how much. Where
    a step is one draw, 5 slowed steps are too few for any test of who is
    last (4^-5 = 1e-3 at best with 4 servers); how late is what tells a
    slow server from the jitter: a server 1.4x slower comes in a share of
    the compute after the others (seconds in a 45 s step), where the
    jitter's laggard trails by milliseconds. From draw ``i`` on, ``srv``
    must be last in ``min_draws`` draws at least, in ``min_share`` of
    them and ``clear_factor`` times as often as any other server, each
    time by ``floor_ns`` at least; the reference is every other draw with a
    last server (those before ``i``, whoever was last, and those from ``i``
    on that another server was last in), ``min_refs`` at least (and 2, for a deviation). Its late
    draws must each be ``factor`` times as late as the latest of the
    reference (lateness floored at ``floor_ns``, a collector's clock
    offset and more), and their mean log lateness above the reference's by
    a z of (the difference) / (s sqrt(1/k + 1/n)), with s the reference's
    standard deviation but at least ``log(spread)``: few reference draws
    that happen to be alike do not make a small excess significant.

    Returns ``(i, z, k, n, least late of srv's, latest of the reference, n reference)`` for the start of the largest z
    (the latest of equals).

    >>> last = np.array(["a", "b", "c", "b", "b", "b"])
    >>> late = np.array([20e6, 30e6, 25e6, 1.5e9, 1.6e9, 1.4e9])
    >>> i, z, k, n, post, ref, n_ref = lateness_test(last, late, "b")
    >>> (i, k, n, post, ref, n_ref), round(z, 1)
    ((3, 3, 3, 1400000000.0, 30000000.0, 3), 7.3)
    >>> lateness_test(last, np.full(6, 20e6), "b") is None  # as late as the others
    True
    """
    last, late = np.asarray(last), np.asarray(late_ns, np.float64)
    n_draws = len(last)
    if n_draws == 0:
        return None
    # every start at once (a day of 0.3 s steps is ~300k draws: a loop over starts, each scanning the rest, would be
    # quadratic); each quantity of "the draws from i on" is a suffix scan, of "before i" a prefix one
    # (tests/reference_arrival.py keeps the start-by-start loop, and a property test holds the two equal)
    v = np.maximum(late, floor_ns)
    mine, named = last == srv, last != ""
    other = named & ~mine

    def suffix(x: np.ndarray) -> np.ndarray:  # x[i:].sum() for every i
        return np.cumsum(x[::-1])[::-1]

    def before(x: np.ndarray) -> np.ndarray:  # x[:i].sum() for every i
        return np.r_[0, np.cumsum(x)[:-1]]

    k = suffix(mine.astype(np.int64))
    n = n_draws - np.arange(n_draws)
    # the largest count of any other server from i on: a draw's count of its own server from there on, its
    # running maximum from the end (the first draw of a server at or after i carries that server's count)
    own = np.zeros(n_draws, np.int64)
    at = np.flatnonzero(other)
    if len(at):
        own[at] = pd.Series(last[at]).groupby(last[at]).cumcount(ascending=False).to_numpy() + 1
    most_other = np.maximum.accumulate(own[::-1])[::-1]
    post_min = np.minimum.accumulate(np.where(mine, late, np.inf)[::-1])[::-1]
    # the reference: every named draw before i, every other server's from i on
    n_ref = before(named.astype(np.int64)) + suffix(other.astype(np.int64))
    ref_max = np.maximum(np.r_[-np.inf, np.maximum.accumulate(np.where(named, v, -np.inf))[:-1]],
                         np.maximum.accumulate(np.where(other, v, -np.inf)[::-1])[::-1])
    ok = ((k >= min_draws) & (k >= min_share * n) & (k >= clear_factor * most_other) & (post_min >= floor_ns)
          & (n_ref >= max(min_refs, 2)) & (post_min >= factor * ref_max))
    if not ok.any():
        return None
    # log lateness, centred so that sums of squares keep their precision
    lv = np.log(v)
    c = float(lv[named].mean())
    lv -= c
    lp = np.where(mine, lv, 0.0)  # a late draw of srv's is above the floor wherever ``ok``: its log is log(v)
    lr, lr2 = np.where(named, lv, 0.0), np.where(named, lv * lv, 0.0)
    lo, lo2 = np.where(other, lv, 0.0), np.where(other, lv * lv, 0.0)
    s1 = before(lr) + suffix(lo)
    s2 = before(lr2) + suffix(lo2)
    i = np.flatnonzero(ok)
    m = n_ref[i].astype(np.float64)
    var = np.maximum(s2[i] - s1[i] * s1[i] / m, 0.0) / (m - 1)
    s = np.maximum(np.sqrt(var), np.log(spread))
    z = (suffix(lp)[i] / k[i] - s1[i] / m) / (s * np.sqrt(1 / k[i] + 1 / m))
    # the largest z; on a tie, the later start. Ties are real: a start just past another server's draw has the same
    # reference and late draws as one just before it, so the same z up to the order it was summed in
    j = int(np.flatnonzero(z >= z.max() - 1e-9 * abs(z.max()))[-1])
    b = int(i[j])
    return (b, float(z[j]), int(k[b]), int(n[b]), float(post_min[b]), float(ref_max[b]), int(n_ref[b]))


def rounds(start_ns: np.ndarray, gap: float = 8.0) -> np.ndarray | None:
    """A job without steps: the starts of its rounds of collectives, and an end (None if its bursts come evenly).

    A DDP job's gradient buckets come close together in each backward, then
    a long pause: a rank the jitter left behind in a backward stays behind
    for all its buckets, so a round's collectives are one draw, as a step's
    are (:func:`per_step`). A round closes at a pause of more than ``gap``
    times the median spacing of the bursts (a job whose collectives come
    evenly, FSDP's layer by layer, has none: each collective is a draw).

    >>> rounds(np.array([0, 10, 20, 30, 1_000, 1_010, 1_020, 2_000]))
    array([   0, 1000, 2000, 2001])
    >>> rounds(np.array([0, 10, 20, 30, 40])) is None
    True
    """
    t = np.unique(np.asarray(start_ns, np.int64))
    if len(t) < 3:
        return None
    d = np.diff(t)
    cut = d > gap * float(np.median(d))
    if not cut.any():
        return None
    return np.r_[t[0], t[1:][cut], t[-1] + 1]


def draws(start_ns: np.ndarray, step_start: np.ndarray, step_end: np.ndarray, gap: float = 8.0,
          alike: float = 2.0) -> tuple[np.ndarray, np.ndarray, bool]:
    """A job with steps: the spans whose collectives are one draw each (starts, ends), and whether a step was split.

    A step is one draw (:func:`per_step`) unless its collectives come in two
    or more alike rounds between long pauses (:func:`rounds`; alike: each
    holding at least ``1 / alike`` of the step's largest round): then each
    is one, a smaller round going with the one before it. Those are the
    micro-batches of a job that reduces every one (DDP without ``no_sync``,
    ZeRO-2): each backward's end waits for its reductions, so every rank
    leaves a round together and the next round's laggard is a fresh draw
    (on the DP matrix's fault-free twins the same server is last in
    consecutive rounds of a step in 127 of 509 pairs, chance 25%, where
    most steps' collectives share one). That is
    what lets a job with few steps (45 s or 3 minutes each, 5 or 6 in view
    after a server turned slow) be judged: per step, 5 of 5 at chance 1/4 is
    p = 1e-3 at best, whatever the test, as a step is the only draw its
    collectives give where nothing else is known. A round unlike the others
    (one collective alone between pauses, as a slowed backward's leaves) is
    no micro-batch: with one alike round left, the step stays one draw.

    >>> t = np.r_[np.arange(0, 40, 10), np.arange(1_000, 1_040, 10), 5_000, np.arange(6_000, 6_040, 10)]
    >>> d0, d1, split = draws(t, np.array([0, 5_000]), np.array([5_000, 10_000]))
    >>> d0.tolist(), d1.tolist(), split  # step 0: two rounds of 4; step 1: 1 and 4, one draw
    ([0, 1000, 5000], [1000, 5000, 10000], True)
    """
    s0, s1 = np.asarray(step_start, np.int64), np.asarray(step_end, np.int64)
    o = np.argsort(s0, kind="stable")
    s0, s1 = s0[o], s1[o]
    t = np.sort(np.asarray(start_ns, np.int64))
    r0 = rounds(t, gap)
    k = np.searchsorted(s0, t, side="right") - 1
    inside = (k >= 0) & (t < s1[np.maximum(k, 0)])
    if r0 is None or not inside.any():
        return s0, s1, False
    t, k = t[inside], k[inside]
    r = np.searchsorted(r0, t, side="right") - 1
    # one segment per (step, round): t is sorted, so a segment is a run of its bursts
    new = np.r_[True, (k[1:] != k[:-1]) | (r[1:] != r[:-1])]
    n = np.bincount(np.cumsum(new) - 1)
    seg_step, first = k[new], t[new]
    hi = np.zeros(len(s0), np.int64)
    np.maximum.at(hi, seg_step, n)
    big = n * alike >= hi[seg_step]  # a round like the step's largest: a micro-batch; a smaller one goes with the one before
    split = np.bincount(seg_step[big], minlength=len(s0)) >= 2
    # a split step's draws start at its start and at each of its micro-batches but the first, and end where the next starts
    lead = np.flatnonzero(big & split[seg_step])
    lead = lead[1:][seg_step[lead][1:] == seg_step[lead][:-1]]  # not the first micro-batch of its step
    cut_step = np.r_[np.arange(len(s0)), seg_step[lead]]
    cut_at = np.r_[s0, first[lead]]
    o = np.lexsort((cut_at, cut_step))
    cut_step, cut_at = cut_step[o], cut_at[o]
    same = np.r_[cut_step[1:] == cut_step[:-1], False]
    ends = np.where(same, np.r_[cut_at[1:], 0], s1[cut_step])
    return cut_at, ends, bool(split.any())


def per_step(bursts: pd.DataFrame, step_start: np.ndarray, step_end: np.ndarray) -> pd.DataFrame:
    """The burst table of one job, one row per group and step: each step's last arrival.

    The collectives of one step are not independent draws: a rank that
    falls behind in a backward (its gradient buckets, each a collective)
    stays behind until the ranks next wait for one another, so a step's
    dozens of collectives share their last server, and counted one by one
    they make a fault-free job's chance laggard look significant. Per
    group and step (bursts starting in ``[step_start, step_end)``), the
    server last in most of its bursts (none on a tie), by the median lead
    of those bursts (``lead_ns``) and at its latest (``peak_ns``, the
    largest: a DDP step's first bucket carries all its backward's lateness,
    the next ones only their share); bursts outside every step are left out.
    """
    s = np.argsort(step_start, kind="stable")
    s0, s1 = np.asarray(step_start)[s], np.asarray(step_end)[s]
    t = bursts["start_ns"].to_numpy(np.int64)
    k = np.searchsorted(s0, t, side="right") - 1
    inside = (k >= 0) & (t < s1[np.maximum(k, 0)]) & (bursts["last"].to_numpy() != "")
    b = bursts[inside].assign(step=k[inside])
    if b.empty:
        return empty_arrivals().assign(peak_ns=pd.Series(dtype="int64"))
    wins = b.groupby(["group", "step", "last"], sort=True).agg(n=("lead_ns", "size"), lead_ns=("lead_ns", "median"), peak_ns=("lead_ns", "max"),
                                                               start_ns=("start_ns", "min"), servers=("servers", "first")).reset_index()
    top = wins.groupby(["group", "step"])["n"].transform("max")
    best = wins[wins["n"] == top]
    tied = best.groupby(["group", "step"])["last"].transform("size") > 1
    best = best.assign(last=np.where(tied, "", best["last"]))
    out = best.groupby(["group", "step"], sort=True).agg(start_ns=("start_ns", "min"), servers=("servers", "first"), last=("last", "first"),
                                                         lead_ns=("lead_ns", "max"), peak_ns=("peak_ns", "max")).reset_index()
    out["job_id"] = bursts["job_id"].iloc[0]
    out["lead_ns"] = out["lead_ns"].astype(np.int64)
    out["peak_ns"] = np.where(out["last"] != "", out["peak_ns"], 0).astype(np.int64)
    return out.sort_values("start_ns", kind="stable")[ARRIVAL_COLUMNS + ["peak_ns"]].reset_index(drop=True)


def last_arrival(send: np.ndarray, recv: np.ndarray, tie_ns: int = 0) -> tuple[int, float]:
    """One burst's last arrival from its servers' first send and first receive: (index or -1, lead in ns).

    The server whose first send starts last arrives last. Where two or more
    tie for it (within ``tie_ns``), the one of them that is also last to
    receive: over a rendezvous (a ring edge moves once both its ends are
    in) the late server and its ring predecessor both send first when it
    enters, the late server and its successor both receive first then, and
    the late server is the one late in both. Its lead is over the servers
    outside the tie, in its send and in its receive (the smaller). Nobody (-1) where
    the tie stands (a 2-server ring: both edges start as the later enters).

    >>> last_arrival(np.array([5., 9., 2., 4.]), np.array([np.nan] * 4))  # one last sender
    (1, 4.0)
    >>> last_arrival(np.array([9., 9., 4., 2.]), np.array([2., 9., 9., 4.]))  # a rendezvous: 0 and 1 tie on sends, 1 and 2 on receives
    (1, 5.0)
    >>> last_arrival(np.array([9., 9.]), np.array([9., 9.]))  # two servers: still a tie
    (-1, 0.0)
    """
    send, recv = np.asarray(send, np.float64), np.asarray(recv, np.float64)
    tmax = send.max()
    tied = send >= tmax - tie_ns
    out_s = send[~tied]
    lead_s = float(tmax - out_s.max()) if len(out_s) else 0.0
    if tied.sum() == 1:
        return int(np.flatnonzero(tied)[0]), lead_s
    if not len(out_s) or np.isnan(recv).all():
        return -1, 0.0
    r = np.where(np.isnan(recv), -np.inf, recv)
    rmax = r.max()
    late_r = r >= rmax - tie_ns
    both = np.flatnonzero(tied & late_r)
    out_r = r[~late_r]
    if len(both) != 1 or not len(out_r):
        return -1, 0.0
    k = int(both[0])
    return k, float(min(send[k] - out_s.max(), r[k] - out_r.max()))


def _entries(ctl, idx, burst, a, b, start, srv_code, n_srv) -> tuple[np.ndarray, np.ndarray]:
    """Each server's entry into each burst by its clear-to-sends: (keys ``burst * n_srv + server``, sorted, and the
    earliest start of the clear-to-sends that go with it).

    A receiver clears its ring predecessor to send as it enters a
    collective: the message goes from receiver to sender, and the data it
    clears is the first on the opposite edge (sender to receiver) that
    starts at or after it (the edge's data of the collective before had
    ended: the receiver was done with it). The clear-to-send ``ctl[i]``
    (flow indices, NICs ``a`` -> ``b``) goes with that data flow's burst
    (``burst``, per data flow ``idx``, the bursts after the hand-on). One
    followed on its edge by another clear-to-send before any data is left
    out: the data it cleared was not recorded (a lost record, the
    capture's end), and taken with the next collective's data it would
    date its sender's entry a whole collective early, making the others
    look late. The clear-to-send right before the data is the one of the
    data's collective.

    >>> # data 0 -> 1 at 10 (burst 0) and 50 (burst 1); clear-to-sends 1 -> 0 at 5 (burst 0's) and 40 (burst 1's)
    >>> a, b = np.array([0, 0, 1, 1]), np.array([1, 1, 0, 0]); st = np.array([10, 50, 5, 40])
    >>> _entries(np.array([2, 3]), np.array([0, 1]), np.array([0, 1]), a, b, st, np.array([0, 1]), 2)
    (array([1, 3]), array([ 5, 40]))
    >>> # burst 0's data 0 -> 1 lost: the clear-to-send at 5 is followed by burst 1's at 40, not by data; left out
    >>> _entries(np.array([2, 3]), np.array([1]), np.array([1]), a, b, st, np.array([0, 1]), 2)
    (array([3]), array([40]))
    """
    n_nic = int(max(a[idx].max(), b[idx].max(), a[ctl].max(), b[ctl].max())) + 1
    dkey = a[idx].astype(np.int64) * n_nic + b[idx]
    ckey = b[ctl].astype(np.int64) * n_nic + a[ctl]  # the edge it clears
    key = np.concatenate([dkey, ckey])
    t = np.concatenate([start[idx], start[ctl]])
    data = np.r_[np.ones(len(idx), np.int8), np.zeros(len(ctl), np.int8)]
    o = np.lexsort((data, t, key))  # per edge in time order; a clear-to-send before data that starts with it
    kind = data[o]
    c = np.flatnonzero((kind[:-1] == 0) & (kind[1:] == 1))  # data right after it: no other clear-to-send in between, nor the end
    q = c + 1
    ok = key[o[q]] == key[o[c]]  # on the same edge
    d, k = o[q[ok]], o[c[ok]] - len(idx)
    ek = burst[d] * n_srv + srv_code[a[ctl[k]]]
    et = start[ctl[k]]
    o = np.lexsort((et, ek))
    ek, et = ek[o], et[o]
    first = np.r_[True, ek[1:] != ek[:-1]] if len(ek) else np.zeros(0, dtype=bool)
    return ek[first], et[first]


def _server_set_groups(dp, job, a, comp, srv_code):
    """The DP flows' groups: (group per NIC, or per DP flow; the groups' ``(job, "srv,srv,...")`` keys, numbered).

    A group per job and set of servers (a DP component's servers; the
    rails' rings of one collective share them), found from the distinct
    (job, NIC) pairs. Where each NIC's DP flows are of one job (a replay's:
    a flow's job is its source NIC's) one pass over the flows finds them and
    a NIC's group is every one of its flows' (the first array; the second
    empty); otherwise the pairs come from the flows, and so do the groups.
    """
    n_nic = len(srv_code)
    fast = job.dtype.kind == "i" and a.dtype.kind in "iu"
    if fast:
        nic_job, seen, mixed = _nic_jobs(dp, a, job.astype(np.int64, copy=False), n_nic)
        fast = not mixed
    if fast:
        used = np.flatnonzero(seen)
        ujob, ucomp = nic_job[used].astype(job.dtype), comp[used]
        members = pd.DataFrame({"job": ujob, "comp": ucomp, "srv": srv_code[used]}).drop_duplicates()
    else:
        src = a[dp]
        fjob, fcomp = job[dp], comp[src]
        members = pd.DataFrame({"job": fjob, "comp": fcomp, "srv": srv_code[src]}).drop_duplicates()
    sets = members.sort_values("srv").groupby(["job", "comp"])["srv"].agg(lambda s: ",".join(map(str, s)))
    keys = pd.Series(list(zip(sets.index.get_level_values(0), sets.to_numpy())))
    gid_of, groups = pd.factorize(keys)
    comp_gid = pd.Series(gid_of, index=sets.index)
    if fast:
        gid_nic = np.full(n_nic, -1, np.int64)
        gid_nic[used] = comp_gid.reindex(pd.MultiIndex.from_arrays([ujob, ucomp])).to_numpy(np.int64)
        return gid_nic, np.zeros(0, np.int64), groups
    return np.zeros(0, np.int64), comp_gid.reindex(pd.MultiIndex.from_arrays([fjob, fcomp])).to_numpy(np.int64), groups


def _groups_in_order(dp, a, start, gid_nic, gid_flow, n_groups):
    """The DP flows (indices ``dp``) by group, then start, ties in their order (``np.lexsort``'s): their indices, their groups.

    A counting sort by group where each group's flows come in start order
    (:func:`_by_group`); else a sort.
    """
    idx, gid, ok = _by_group(dp, a, start, gid_nic, gid_flow, n_groups)
    if ok:
        return idx, gid
    g = gid_flow if len(gid_flow) else gid_nic[a[dp]]
    o = np.lexsort((start[dp], g))
    return dp[o], g[o].astype(np.int32)


@numba.njit(cache=True, nogil=True)
def _nic_jobs(dp, a, job, n_nic):  # pragma: no cover - compiled
    """Per NIC, the job of its flows among ``dp`` and whether it has one; and whether some NIC's are of two or more jobs."""
    nic_job = np.full(n_nic, -1, np.int64)
    seen = np.zeros(n_nic, np.bool_)
    for i in dp:
        x = a[i]
        if not seen[x]:
            seen[x] = True
            nic_job[x] = job[i]
        elif nic_job[x] != job[i]:
            return nic_job, seen, True
    return nic_job, seen, False


@numba.njit(cache=True, nogil=True)
def _by_group(dp, a, start, gid_nic, gid_flow, n_groups):  # pragma: no cover - compiled
    """:func:`_groups_in_order` by counting, or False when a group's flows are not in start order.

    A flow's group: ``gid_flow`` (per flow of ``dp``) if given, else its source NIC's in ``gid_nic``.
    """
    n = len(dp)
    offsets = np.zeros(n_groups + 1, np.int64)
    last = np.full(n_groups, np.iinfo(np.int64).min, np.int64)
    for k in range(n):
        i = dp[k]
        g = gid_flow[k] if len(gid_flow) else gid_nic[a[i]]
        if start[i] < last[g]:
            return np.zeros(0, np.int64), np.zeros(0, np.int32), False
        last[g] = start[i]
        offsets[g + 1] += 1
    for g in range(n_groups):
        offsets[g + 1] += offsets[g]
    idx = np.empty(n, np.int64)
    gid = np.empty(n, np.int32)
    for k in range(n):
        i = dp[k]
        g = gid_flow[k] if len(gid_flow) else gid_nic[a[i]]
        p = offsets[g]
        offsets[g] += 1
        idx[p] = i
        gid[p] = g
    return idx, gid, True


def _hand_on(burst, gid, src, dst, start, end, size):
    """Burst numbers with each burst's tail handed on to the next burst of its group (:func:`_hand_on_at`).

    The flows by group, then start: their burst numbers, groups, source and
    destination servers, starts and ends; ``size``: servers per group.
    """
    burst = np.array(burst, dtype=np.int64)
    if not len(burst):
        return burst
    n_srv = int(max(np.max(src), np.max(dst))) + 1
    move = _hand_on_at(burst, np.arange(len(burst)), np.asarray(gid), np.asarray(src), np.asarray(dst), np.arange(n_srv),
                       np.asarray(start, np.int64), np.asarray(end, np.int64), np.asarray(size, np.int64), n_srv)
    return burst + move


@numba.njit(cache=True, nogil=True)
def _hand_on_at(burst, idx, gid, a, b, srv_code, start, end, size, n_srv):  # pragma: no cover - compiled
    """Per flow (flow ``idx[i]``, of burst ``burst[i]`` and group ``gid[i]``; by group, then start): whether it goes to the next burst.

    A rank that has issued the next collective enters it as soon as it is
    done with this one, and over a rendezvous its ring edges to ranks as
    early move at once, with no pause: those sends would close the burst
    before it, and the late rank's would open the next burst alone. A
    burst's collective is over for a server once its last send has ended
    (not its last receive: the early ranks' clear-to-send for the next
    collective reaches it before it is done); the flows starting once the
    first server is done (``t_end``, where every server of the group has
    sent in the burst), between two servers that are no longer sending this
    collective, belong to the next burst of the group. A rank enters the
    next collective no earlier than it is done with this one, so those are
    its flows. A flow of the burst that stays (not ended when one starts)
    keeps its ends busy: a slow server's messages that run on past the
    others' last (a slow NIC's, or the edges a slow one drags) stay put.

    Two passes: each burst's ``t_end`` and whether the group's next burst
    follows it, from each server's last send's end; then the tails.
    Servers: ``srv_code`` of the NICs ``a`` (source), ``b`` (destination).
    """
    n = len(burst)
    move = np.zeros(n, np.bool_)
    if n == 0:
        return move
    never = np.iinfo(np.int64).max
    nb = burst[n - 1] + 1
    t_end = np.full(nb, never, np.int64)
    has_next = np.zeros(nb, np.bool_)
    stamp = np.full(n_srv, -1, np.int64)
    busy = np.zeros(n_srv, np.int64)  # per server: its last send's end in the burst so far
    touched = np.empty(n_srv, np.int64)  # the servers that sent in the burst
    nt = 0
    i0 = 0  # the burst's first flow
    for i in range(n + 1):
        if i == n or (i > 0 and burst[i] != burst[i - 1]):
            bb = burst[i - 1]
            done = never
            for k in range(nt):
                done = min(done, busy[touched[k]])  # the first server done
            if nt >= size[gid[i0]]:
                t_end[bb] = done
            has_next[bb] = i < n and burst[i] == bb + 1 and gid[i] == gid[i - 1]
            nt = 0
            i0 = i
            if i == n:
                break
        f = idx[i]
        s = srv_code[a[f]]
        if stamp[s] != burst[i]:
            stamp[s] = burst[i]
            busy[s] = end[f]
            touched[nt] = s
            nt += 1
        elif end[f] > busy[s]:
            busy[s] = end[f]
    stamp[:] = -1
    for i in range(n):
        bb = burst[i]
        f = idx[i]
        s, d = srv_code[a[f]], srv_code[b[f]]
        bs = busy[s] if stamp[s] == bb else np.int64(-1)
        bd = busy[d] if stamp[d] == bb else np.int64(-1)
        if has_next[bb] and start[f] >= t_end[bb] and start[f] >= bs and start[f] >= bd:
            move[i] = True
            continue
        if stamp[s] != bb:
            stamp[s] = bb
            busy[s] = end[f]
        elif end[f] > busy[s]:
            busy[s] = end[f]
    return move


@numba.njit(cache=True, nogil=True)
def _firsts(burst, move, idx, a, b, srv_code, n_srv):  # pragma: no cover - compiled
    """Per flow (as :func:`_hand_on_at`'s, now of burst ``burst + move``): is it its source server's first send of the burst,
    is it its destination server's first receive.

    A burst's flows are those of its number before the hand-on and the
    tail handed on from the one before, so along the flows a burst number
    is only ever met again while it or the one before is the running
    number: a mark per server and parity of the number tells a first.
    """
    send = np.zeros(len(burst), np.bool_)
    recv = np.zeros(len(burst), np.bool_)
    sent = np.full((2, n_srv), -1, np.int64)
    got = np.full((2, n_srv), -1, np.int64)
    for i in range(len(burst)):
        v = burst[i] + (1 if move[i] else 0)
        p = v & 1
        f = idx[i]
        s, d = srv_code[a[f]], srv_code[b[f]]
        if sent[p, s] != v:
            sent[p, s] = v
            send[i] = True
        if got[p, d] != v:
            got[p, d] = v
            recv[i] = True
    return send, recv



def _last(per: pd.DataFrame, tie_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`last_arrival` of every burst of ``per`` (``b, s, t, r``: burst, server, first send, first receive), by burst number."""
    n = int(per["b"].max()) + 1
    last_s, lead = np.full(n, -1, np.int64), np.zeros(n, np.int64)
    p = per.sort_values(["b", "s"], kind="stable")
    bb, ss = p["b"].to_numpy(), p["s"].to_numpy()
    tt, rr = p["t"].to_numpy(np.float64), p["r"].to_numpy(np.float64)
    cut = np.flatnonzero(np.r_[True, bb[1:] != bb[:-1], True])
    for i, j in zip(cut[:-1], cut[1:]):
        k, ld = last_arrival(tt[i:j], rr[i:j], tie_ns)
        if k >= 0:
            last_s[bb[i]], lead[bb[i]] = ss[i + k], int(ld)
    return last_s, lead

@numba.njit(cache=True, nogil=True)
def _cut(idx, gid, a, srv_code, start, end, size, n_srv, min_pause):  # pragma: no cover - compiled
    """Per flow (flow ``idx[i]`` of group ``gid[i]``; by group, then start): its burst number, and whether it is its
    server's first send of the burst.

    A burst closes at the first pause of more than ``min_pause`` once every
    one of the group's ``size`` servers has sent in it.
    """
    n = len(idx)
    burst = np.empty(n, np.int64)
    first = np.zeros(n, np.bool_)
    seen = np.full(n_srv, -1, np.int64)
    b = -1
    count = 0
    busy = np.int64(0)
    for i in range(n):
        f = idx[i]
        g = gid[i]
        if i == 0 or g != gid[i - 1]:
            b += 1
            count = 0
            busy = end[f]
        elif start[f] - busy > min_pause and count >= size[g]:
            b += 1
            count = 0
        if end[f] > busy:
            busy = end[f]
        s = srv_code[a[f]]
        if seen[s] != b:
            seen[s] = b
            count += 1
            first[i] = True
        burst[i] = b
    return burst, first
