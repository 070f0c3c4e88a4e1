"""The switch diagnosis as it was written first, with pandas merges and groupbys.

Kept as the reference the vectorised :class:`prism.analysis.diagnosis.switches.SwitchDiagnoser`
is property-tested against (tests/test_properties.py): same tables, same anomalies.
"""
import numpy as np
import pandas as pd

from prism.analysis.diagnosis import ANOMALY_COLUMNS, empty_anomalies
from prism.analysis.diagnosis.switches import SWITCH_COLUMNS, SwitchBandwidth, SwitchDiagnoser, _tiers


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
        rows, tables = [], []
        for w, tw in t.groupby("window", sort=True):
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
                    rows.append(self._row(kind, worst, int(w) * bw.window_ns, bw.window_ns))
                    if kind == "switch":
                        flagged_sw.add(worst["name"])
                    excluded |= set(inc.loc[inc["name"] == worst["name"], "path"].tolist())
        self.anomalies_ = pd.DataFrame(rows, columns=ANOMALY_COLUMNS) if rows else empty_anomalies()
        cols = SWITCH_COLUMNS
        self.bandwidth_ = pd.concat(tables, ignore_index=True)[cols] if tables else pd.DataFrame(columns=cols)
        return self

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
