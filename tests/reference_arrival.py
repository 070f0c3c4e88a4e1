"""The arrival diagnosis's burst table as it was first written: numpy sorts and pandas lookups over the flows.

Kept as the reference the compiled passes of :mod:`prism.analysis.diagnosis.arrival`
are property-tested against (tests/test_properties.py): the same burst
table on random flows. Its two loops (:func:`_cut`, :func:`_tail`) are the
first version's kernels run as plain Python.
"""
import numpy as np
import pandas as pd

from prism.analysis.diagnosis.arrival import ARRIVAL_COLUMNS, ArrivalDiagnoser, _last, empty_arrivals


class ReferenceArrivalDiagnoser(ArrivalDiagnoser):
    def bursts(self, job, a, start, end, is_dp, dp_comp, server_of, job_names, dst=None) -> pd.DataFrame:
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
        if dst is not None:
            fdst = srv_code[np.asarray(dst)[dp]][o]
            burst = _hand_on(burst, gid[o], fsrv[o], fdst, fstart[o], fend[o], size)
            _, at = np.unique(burst * len(srv_names) + fsrv[o], return_index=True)
            first = np.zeros(len(burst), dtype=bool)
            first[at] = True
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
        if dst is not None:  # every server's first receive of every burst (flows are by start within a burst)
            key = burst * len(srv_names) + fdst
            _, at = np.unique(key, return_index=True)
            recv = pd.Series(fstart[o][at], index=pd.MultiIndex.from_arrays([burst[at], fdst[at]]))
            per["r"] = recv.reindex(pd.MultiIndex.from_arrays([per["b"].to_numpy(), per["s"].to_numpy()])).to_numpy(np.float64)
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


def _hand_on(burst, gid, src, dst, start, end, size):
    """Burst numbers with each burst's tail handed on to the next burst of its group.

    A rank that has issued the next collective enters it as soon as it is
    done with this one, and over a rendezvous its ring edges to ranks as
    early move at once, with no pause: those sends would close the burst
    before it, and the late rank's would open the next burst alone. A
    burst's collective is over for a server once its last send has ended
    (not its last receive: the early ranks' clear-to-send for the next
    collective reaches it before it is done); the flows starting once the
    first server is done, between two servers that are no longer sending
    this collective (:func:`_tail`), belong to the next burst of the group
    (flows by group, then start). A rank enters the next collective no
    earlier than it is done with this one, so those are its flows.
    """
    burst = burst.copy()
    if not len(burst):
        return burst
    nb = int(burst.max()) + 1
    key = burst.astype(np.int64) * (int(src.max()) + 1) + src
    o = np.argsort(key, kind="stable")
    k = key[o]
    at = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    last_end = np.maximum.reduceat(np.asarray(end)[o], at)  # per (burst, server): its last send's end
    kb = burst[o][at]
    done = np.full(nb, np.iinfo(np.int64).max)
    np.minimum.at(done, kb, last_end)  # the first server done
    senders = np.bincount(kb, minlength=nb)
    first_of = np.searchsorted(burst, np.arange(nb))  # bursts are contiguous
    ok = senders >= size[gid[np.minimum(first_of, len(burst) - 1)]]
    t_end = np.where(ok, done, np.iinfo(np.int64).max)
    nxt = np.r_[burst[1:], -1]
    last_of = np.r_[burst[1:] != burst[:-1], True]  # a burst's last flow
    same_group_next = np.zeros(nb, dtype=bool)
    li = np.flatnonzero(last_of)
    same_group_next[burst[li]] = (nxt[li] == burst[li] + 1) & (np.r_[gid[1:], -1][li] == gid[li])
    move = _tail(burst, np.asarray(src, np.int64), np.asarray(dst, np.int64), np.asarray(start, np.int64), np.asarray(end, np.int64),
                 t_end, same_group_next, int(max(src.max(), dst.max())) + 1)
    burst[move] += 1
    return burst


def _tail(burst, src, dst, start, end, t_end, has_next, n_srv):
    """Per flow (by burst, then start): whether it is in its burst's tail, of the next collective.

    From ``t_end`` on, a flow is the next collective's when neither of its
    ends is still sending this one's (a flow of the burst that stays, not
    ended when it starts): a slow server's messages that run on past the
    others' last (a slow NIC's, or the edges a slow one drags) stay put.
    """
    n = len(burst)
    move = np.zeros(n, np.bool_)
    busy = np.zeros(n_srv, np.int64)
    stamp = np.full(n_srv, -1, np.int64)
    for i in range(n):
        b = burst[i]
        s, d = src[i], dst[i]
        bs = busy[s] if stamp[s] == b else np.int64(-1)
        bd = busy[d] if stamp[d] == b else np.int64(-1)
        if has_next[b] and start[i] >= t_end[b] and start[i] >= bs and start[i] >= bd:
            move[i] = True
            continue
        if stamp[s] != b:
            stamp[s] = b
            busy[s] = end[i]
        elif end[i] > busy[s]:
            busy[s] = end[i]
    return move


def _cut(gid, srv, start, end, size, n_srv, min_pause):
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



def reference_draws(start_ns, step_start, step_end, gap=8.0, alike=2.0):
    """:func:`prism.analysis.diagnosis.arrival.draws` step by step in plain Python: each step's rounds, its alike
    ones (at least ``1 / alike`` of its largest), and its draws."""
    from prism.analysis.diagnosis.arrival import rounds

    order = np.argsort(step_start, kind="stable")
    s0 = [int(x) for x in np.asarray(step_start)[order]]
    s1 = [int(x) for x in np.asarray(step_end)[order]]
    t = sorted(int(x) for x in start_ns)
    r0 = rounds(np.asarray(t, np.int64), gap)
    d0, d1, split = [], [], False
    for a, b in zip(s0, s1):
        # the step's bursts: those for which it is the last step starting at or before them
        mine = [x for x in t if x >= a and x < b and max(i for i, s in enumerate(s0) if s <= x) == s0.index(a)]
        segs = []  # [round, first start, bursts]
        for x in mine:
            r = -1 if r0 is None else int(np.searchsorted(r0, x, side="right")) - 1
            if segs and segs[-1][0] == r:
                segs[-1][2] += 1
            else:
                segs.append([r, x, 1])
        hi = max((n for _, _, n in segs), default=0)
        big = [x for _, x, n in segs if n * alike >= hi]
        if r0 is not None and len(big) >= 2:
            split = True
            cuts = [a] + big[1:]
            d0 += cuts
            d1 += cuts[1:] + [b]
        else:
            d0.append(a)
            d1.append(b)
    return np.asarray(d0, np.int64), np.asarray(d1, np.int64), split


def reference_lateness(last, late_ns, srv, min_draws=3, min_refs=2, factor=4.0, floor_ns=1e6, min_share=0.5, clear_factor=2.0, spread=2.0):
    """:func:`prism.analysis.diagnosis.arrival.lateness_test` start by start in plain Python: at every start, who is last
    from there on, the reference draws, the margin and the z; the largest z (the latest start of equals)."""
    import math
    import statistics

    last, late = [str(x) for x in last], [float(x) for x in late_ns]
    best = None
    for i in range(len(last)):
        after = list(range(i, len(last)))
        wins = [j for j in after if last[j] == srv]
        k, n = len(wins), len(after)
        if k < min_draws or k < min_share * n:
            continue
        counts = {}
        for j in after:
            if last[j] not in ("", srv):
                counts[last[j]] = counts.get(last[j], 0) + 1
        if counts and k < clear_factor * max(counts.values()):
            continue
        if min(late[j] for j in wins) < floor_ns:
            continue
        ref = [max(late[j], floor_ns) for j in range(len(last)) if last[j] != "" and not (j >= i and last[j] == srv)]
        if len(ref) < min_refs or min(late[j] for j in wins) < factor * max(ref):
            continue
        lp = [math.log(late[j]) for j in wins]
        lr = [math.log(x) for x in ref]
        s = max(statistics.stdev(lr), math.log(spread))
        z = (statistics.fmean(lp) - statistics.fmean(lr)) / (s * math.sqrt(1 / k + 1 / len(lr)))
        if best is None or z >= best[1] - 1e-9 * abs(best[1]):  # equal but for the order of summing: the later start
            best = (i, z, k, n, min(late[j] for j in wins), max(ref), len(ref))
    return best
