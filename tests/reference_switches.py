"""The switch diagnosis as it was written first, with pandas merges and groupbys.

Kept as the reference the vectorised :class:`prism.analysis.diagnosis.switches.SwitchDiagnoser`
is property-tested against (tests/test_properties.py): same tables, same anomalies.
"""
import numpy as np
import pandas as pd

from prism.analysis.diagnosis import ANOMALY_COLUMNS, empty_anomalies
from prism.analysis.diagnosis.switches import _SHOWN, SWITCH_COLUMNS, SwitchBandwidth, SwitchDiagnoser, _tiers


class ReferenceSwitchDiagnoser(SwitchDiagnoser):
    def fit(self, bw: SwitchBandwidth) -> "SwitchDiagnoser":
        t = bw.table()
        names = np.array(bw.switch_names, dtype=object)
        tiers = _tiers(bw.paths, len(names))
        # (path, switch) and (path, link) incidence
        ps = [(p, s) for p, sw in enumerate(bw.paths) for s in sw]
        pl = [(p, f"{names[x]}>{names[y]}", f"{tiers[x]}>{tiers[y]}", x, y) for p, sw in enumerate(bw.paths) for x, y in zip(sw[:-1], sw[1:])]
        inc_s = pd.DataFrame(ps, columns=["path", "unit"]).assign(name=lambda d: names[d["unit"]] if len(d) else [], tier=lambda d: tiers[d["unit"]] if len(d) else [])
        # text columns typed as the switches' are, also when no path has a link (an empty frame is object)
        inc_l = pd.DataFrame(pl, columns=["path", "name", "tier", "x", "y"]).astype({"name": str, "tier": str})
        inc_u = pd.concat([inc_s[["path", "name"]], inc_l[["path", "name"]]], ignore_index=True)
        t = t.assign(hs=self._host_names(bw, t["src"], t["dst"]), hd=self._host_names(bw, t["dst"], t["src"]))
        rows, tables = [], []
        for w, tw in t.groupby("window", sort=True):
            if self.min_host_breadth <= 1.0:
                found, tw = self._hosts_ref(tw, inc_u)
                by_host: dict[str, list[dict]] = {}
                for e in found:
                    by_host.setdefault(e["name"], []).append(e)
                rows += self._host_rows([dict(e, host=2 * k + e["role"]) for k, name in enumerate(sorted(by_host)) for e in by_host[name]],
                                        np.array(sorted(by_host), dtype=object), int(w) * bw.window_ns, bw.window_ns)
            excluded: set[int] = set()
            flagged_sw: set[str] = set()
            for kind, inc in (("switch", inc_s), ("link", inc_l)):
                first = True
                while True:
                    live = tw[~tw["path"].isin(excluded)]
                    stats = self._stats(live, inc)
                    if first:
                        tables.append(stats.assign(window_start_ns=int(w) * bw.window_ns, kind=kind))
                        first = False
                    bad = stats[stats["slow"]]
                    if kind == "link" and len(bad):  # a link of a flagged switch is explained by it
                        ends = bad["name"].str.split(">")
                        bad = bad[[not (set(e) & flagged_sw) for e in ends]]
                    if bad.empty:
                        break
                    # first the candidate still slow on the paths avoiding the others (2), then one with too few such flows
                    # to judge (1), then one healthy there (0); the lowest ratio breaks ties
                    bad = bad.nsmallest(self.MAX_CANDIDATES, "ratio")
                    evidence = []
                    for name in bad["name"]:
                        others = set(inc.loc[inc["name"].isin(set(bad["name"]) - {name}), "path"].tolist())
                        own = self._stats(tw[~tw["path"].isin(excluded | others)], inc)
                        own = own[own["name"] == name]
                        evidence.append(1 if own.empty or not bool(own["judged"].iloc[0]) else 2 if bool(own["slow"].iloc[0]) else 0)
                    worst = bad.assign(evidence=evidence).sort_values(["evidence", "ratio"], ascending=[False, True], kind="stable").iloc[0]
                    # one kind of flow: the unit is shown by its pooled figures (flow kind -2)
                    worst = pd.concat([worst, pd.Series({"flow_kind": -2, **{f"kind_{c}": worst[c] for c in _SHOWN}})])
                    rows.append(self._row(kind, worst, int(w) * bw.window_ns, bw.window_ns))
                    if kind == "switch":
                        flagged_sw.add(worst["name"])
                    excluded |= set(inc.loc[inc["name"] == worst["name"], "path"].tolist())
        self.anomalies_ = pd.DataFrame(rows, columns=ANOMALY_COLUMNS) if rows else empty_anomalies()
        cols = SWITCH_COLUMNS
        self.bandwidth_ = pd.concat(tables, ignore_index=True)[cols] if tables else pd.DataFrame(columns=cols)
        return self

    @staticmethod
    def _host_names(bw: SwitchBandwidth, nic: pd.Series, other: pd.Series | None = None) -> pd.Series:
        """The host (server) of each NIC, or ``nic<i>`` without the servers (or with a NIC they do not list); None for -1."""
        nics = set(nic[nic >= 0]) | (set(other[other >= 0]) if other is not None else set())
        if bw.hosts is not None and nics and max(nics) < len(bw.hosts):
            return nic.map(lambda i: str(bw.hosts[i]) if i >= 0 else None)
        return nic.map(lambda i: f"nic{i}" if i >= 0 else None)

    def _endpoints(self, tw: pd.DataFrame) -> tuple[pd.DataFrame, float, float]:
        """Per (host, role): flows, bytes, busy ns and GB/s; the median and robust spread of the judged ones (NaN if too few)."""
        ends = pd.concat([tw[tw["hs"].notna()].assign(host=lambda d: d["hs"], role=0), tw[tw["hd"].notna()].assign(host=lambda d: d["hd"], role=1)])
        st = ends.groupby(["host", "role"]).agg(flows=("flows", "sum"), bytes=("bytes", "sum"), busy=("busy_ns", "sum")).reset_index()
        st["gbps"] = st["bytes"] / st["busy"].where(st["busy"] > 0)
        st["judged"] = (st["flows"] >= self.min_flows) & st["gbps"].notna()
        if st["judged"].sum() < self.min_peers:
            return st, float("nan"), float("nan")
        med = float(st.loc[st["judged"], "gbps"].median())
        return st, med, max(1.4826 * float((st.loc[st["judged"], "gbps"] - med).abs().median()), self.min_rel_spread * med)

    def _hosts_ref(self, tw: pd.DataFrame, inc_u: pd.DataFrame) -> tuple[list[dict], pd.DataFrame]:
        """Host or link: the slow endpoints (host, role) of a window, and its rows without theirs."""
        found: list[dict] = []
        while not tw.empty and (tw["hs"].notna().any() or tw["hd"].notna().any()):
            st, med_all, _ = self._endpoints(tw)
            if not np.isfinite(med_all):
                break
            st["ratio"] = st["gbps"] / med_all
            first = st[st["judged"] & (st["ratio"] <= self.max_ratio)].sort_values(["ratio", "host", "role"], kind="stable").head(self.MAX_CANDIDATES)
            refs = {}
            for h, role, gbps in zip(first["host"], first["role"], first["gbps"]):
                _, med, spread = self._endpoints(tw[(tw["hs"] != h) & (tw["hd"] != h)])
                if np.isfinite(med) and med > 0 and gbps <= self.max_ratio * med and med - gbps >= self.z * spread:
                    refs[(h, role)] = (med, spread)
            if not refs:
                break
            touches = pd.Series([(x, 0) in refs or (y, 1) in refs for x, y in zip(tw["hs"], tw["hd"])], index=tw.index, dtype=bool)
            best = None
            for (h, role), (med, spread) in refs.items():
                m = tw[~touches].merge(inc_u, on="path")
                per = m.groupby("name").agg(flows=("flows", "sum"), bytes=("bytes", "sum"), busy=("busy_ns", "sum"))
                net_slow = set(per.index[(per["flows"] >= self.min_sender_flows) & (per["busy"] > 0) & (per["bytes"] <= self.max_ratio * med * per["busy"])])
                via_net = tw["path"].isin(set(inc_u.loc[inc_u["name"].isin(net_slow), "path"]))
                # the other candidates that stay slow without this host's flows (its peers look slow through it)
                rest, rest_med, _ = self._endpoints(tw[(tw["hs"] != h) & (tw["hd"] != h)])
                still = {(x, r) for x, r, g, j in zip(rest["host"], rest["role"], rest["gbps"], rest["judged"])
                         if j and np.isfinite(rest_med) and g / rest_med <= self.max_ratio}
                others = (set(refs) - {(h, role)}) & still
                mine = (tw["hs"] == h) if role == 0 else (tw["hd"] == h)
                other_cand = pd.Series([(x, 0) in others or (y, 1) in others for x, y in zip(tw["hs"], tw["hd"])], index=tw.index, dtype=bool)
                clean = tw[mine & ~other_cand & ~via_net]
                flows, nbytes, busy = int(clean["flows"].sum()), int(clean["bytes"].sum()), int(clean["busy_ns"].sum())
                if flows < self.min_flows or busy <= 0:
                    continue
                gbps = nbytes / busy
                ratio, z = gbps / med, (med - gbps) / spread
                if not (ratio <= self.max_ratio and z >= self.z):
                    continue
                u = clean.merge(inc_u, on="path").groupby("name").agg(flows=("flows", "sum"), bytes=("bytes", "sum"), busy=("busy_ns", "sum"))
                u = u[(u["flows"] >= self.min_sender_flows) & (u["busy"] > 0)]
                u_ratio = u["bytes"] / u["busy"] / med
                slow_u = u_ratio[u_ratio <= self.max_ratio]
                if len(u) < self.min_host_units or len(slow_u) < self.min_host_breadth * len(u):
                    continue
                through = tw[~touches & tw["path"].isin(set(inc_u.loc[inc_u["name"].isin(set(u.index)), "path"]))]
                o_busy = int(through["busy_ns"].sum())
                best = {"name": h, "role": role, "flows": flows, "gbps": gbps, "ratio": ratio, "z": z, "units": len(u), "slow_units": len(slow_u),
                        "unit_ratio": float(slow_u.median()) if len(slow_u) else float("nan"), "other_flows": int(through["flows"].sum()),
                        "other_ratio": int(through["bytes"].sum()) / o_busy / med if o_busy > 0 else float("nan"), "median": med}
                break
            if best is None:
                break
            found.append(best)
            tw = tw[(tw["hs"] != best["name"]) if best["role"] == 0 else (tw["hd"] != best["name"])]
        return found, tw

    def _stats(self, live: pd.DataFrame, inc: pd.DataFrame) -> pd.DataFrame:
        m = live.merge(inc[["path", "name", "tier"]], on="path")
        s = m.groupby(["name", "tier"], as_index=False).agg(flows=("flows", "sum"), bytes=("bytes", "sum"), busy_ns=("busy_ns", "sum"))
        # each sender's own view of the switch, for the vote
        per = m[m["src"] >= 0].groupby(["name", "tier", "src"], as_index=False).agg(flows=("flows", "sum"), bytes=("bytes", "sum"), busy_ns=("busy_ns", "sum"))
        per = per[per["flows"] >= self.min_sender_flows]
        per["gbps"] = per["bytes"] / per["busy_ns"].where(per["busy_ns"] > 0)
        s["gbps"] = s["bytes"] / s["busy_ns"].where(s["busy_ns"] > 0)  # bytes per ns = GB/s
        tier_flows = s.groupby("tier")["flows"].transform("median")
        judged = (s["flows"] >= self.min_flows) & (s["flows"] >= self.min_flow_share * tier_flows)
        if not judged.any():  # too little traffic to compare anything
            return s.assign(tier_median_gbps=np.nan, ratio=np.nan, senders=0, slow_senders=0, slow=False, judged=False)
        s["judged"] = judged
        g = s[judged].groupby("tier")["gbps"]
        med = g.median()
        mad = (s.loc[judged, "gbps"] - s.loc[judged, "tier"].map(med)).abs().groupby(s.loc[judged, "tier"]).median()
        peers = g.size()
        s["tier_median_gbps"] = s["tier"].map(med)
        spread = np.maximum(1.4826 * s["tier"].map(mad), self.min_rel_spread * s["tier_median_gbps"])
        s["ratio"] = s["gbps"] / s["tier_median_gbps"]
        z = (s["tier_median_gbps"] - s["gbps"]) / spread
        per["slow"] = per["gbps"].to_numpy(np.float64) <= self.max_ratio * per["tier"].map(med).to_numpy(np.float64) if len(per) else np.zeros(0, bool)
        votes = per.groupby("name").agg(senders=("slow", "size"), slow_senders=("slow", "sum"))
        s["senders"] = s["name"].map(votes["senders"]).fillna(0).astype(np.int64)
        s["slow_senders"] = s["name"].map(votes["slow_senders"]).fillna(0).astype(np.int64)
        voted = (s["senders"] < 2) | (s["slow_senders"] >= self.min_vote * s["senders"])
        s["slow"] = judged & (s["tier"].map(peers).fillna(0) >= self.min_peers) & (s["ratio"] <= self.max_ratio) & (z >= self.z) & voted
        return s
